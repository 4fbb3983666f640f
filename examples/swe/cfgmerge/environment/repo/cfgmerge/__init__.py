"""cfgmerge: layered configuration — defaults, then a profile, then environment overrides, merged deeply."""

from cfgmerge.dotted import get_path, set_path
from cfgmerge.layers import Layers, env_overrides
from cfgmerge.merge import deep_merge

__all__ = ["Layers", "deep_merge", "env_overrides", "get_path", "set_path"]
__version__ = "1.1.0"
