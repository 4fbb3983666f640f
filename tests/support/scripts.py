"""Load one of the repository's scripts (most have no .py suffix) as a module, to test its functions directly."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from types import ModuleType

from tests.support.gateway import ROOT


def load_script(path: str, name: str) -> ModuleType:
    """A fresh module named `name` from `path` (relative to the repository root), e.g. "scripts/proxy"."""
    loader = importlib.machinery.SourceFileLoader(name, os.path.join(ROOT, path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
