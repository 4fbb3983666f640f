"""Where things live: the checkout the package runs from (if any), and the defaults that come from it — the run
directory, the CA directory (confdir), the agent CLIs' npm prefix, the flow directory.

A checkout gives every default; an installed wheel has none of it, so each default there comes from a flag or an
environment variable, and `missing(...)` says which in one line. Standard library only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# The folders of the checkout that map into the package (pyproject's package-dir).
_PACKAGE_FOLDERS = ("addon", "launch", "records", "rollout")

PROXY_RUN_FILE = "proxy.json"
VLLM_RUN_FILE = "vllm.json"


def checkout_root() -> Path | None:
    """The repository root when the package runs from a checkout (an editable install or the source tree), else
    None: a pyproject.toml naming polar-gateway beside the package's own folders."""
    root = Path(__file__).resolve().parent.parent
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return None
    if not re.search(r'^name\s*=\s*"polar-gateway"', text, re.M):
        return None
    return root if all((root / name).is_dir() for name in _PACKAGE_FOLDERS) else None


def _user_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "polar"


def default_run_dir() -> Path:
    """Run files, logs and the CA bundle: $POLAR_RUN_DIR, else the checkout's .cache/run, else ~/.cache/polar/run."""
    if os.environ.get("POLAR_RUN_DIR"):
        return Path(os.environ["POLAR_RUN_DIR"]).expanduser()
    root = checkout_root()
    return root / ".cache" / "run" if root else _user_cache() / "run"


def proxy_run_file(directory: str | os.PathLike | None = None) -> Path:
    """The proxy run file of `directory` (default: `default_run_dir()`)."""
    return Path(directory if directory is not None else default_run_dir()) / PROXY_RUN_FILE


def vllm_run_file(directory: str | os.PathLike | None = None) -> Path:
    """The vLLM run file of `directory` (default: `default_run_dir()`)."""
    return Path(directory if directory is not None else default_run_dir()) / VLLM_RUN_FILE


def user_confdir() -> Path:
    """An installed package's CA directory: $XDG_DATA_HOME/polar, else ~/.local/share/polar (made 0700 with its CA
    when the first proxy starts, as mitmproxy keeps ~/.mitmproxy)."""
    data = os.environ.get("XDG_DATA_HOME")
    return (Path(data).expanduser() if data and os.path.isabs(os.path.expanduser(data))
            else Path.home() / ".local" / "share") / "polar"


def confdir(given: str | None = None) -> Path:
    """The CA directory: `given` (--confdir), else $POLAR_CONFDIR, else the checkout's certs/, else the user's
    (`user_confdir`)."""
    value = given or os.environ.get("POLAR_CONFDIR")
    if value:
        return Path(value).expanduser()
    root = checkout_root()
    return root / "certs" if root else user_confdir()


def npm_dir(given: str | None = None) -> Path | None:
    """The agent CLIs' npm prefix: `given` (--npm-dir), else $POLAR_NPM_DIR, else the checkout's .cache/npm."""
    value = given or os.environ.get("POLAR_NPM_DIR")
    if value:
        return Path(value).expanduser()
    root = checkout_root()
    return root / ".cache" / "npm" if root else None


def images_dir() -> Path:
    """Image exports and the sandbox runtime (rollout/images/environments.py, rollout/images/runtime.py): $POLAR_IMAGES_DIR, else the
    checkout's .cache/images, else ~/.cache/polar/images."""
    if os.environ.get("POLAR_IMAGES_DIR"):
        return Path(os.environ["POLAR_IMAGES_DIR"]).expanduser()
    root = checkout_root()
    return root / ".cache" / "images" if root else _user_cache() / "images"


def flows_dir() -> Path:
    """The proxy's default flow directory: the checkout's flows/, else ./flows."""
    root = checkout_root()
    return root / "flows" if root else Path.cwd() / "flows"


# What a wheel install lacks, and where it can come from instead: (what, flag, environment variable).
NEEDS = {
    "npm_dir": ("the agent CLIs' npm prefix (DIR/node_modules/.bin)", "--npm-dir DIR", "POLAR_NPM_DIR"),
}


def fix(checkout: str, installed: str) -> str:
    """The fix an error names: `checkout` (its scripts) when the package runs from a checkout, else `installed` (pip
    extras, flags): a wheel has no scripts/."""
    return checkout if checkout_root() is not None else installed


def missing(name: str) -> str:
    """One line: what is missing outside a checkout and which flag or variable gives it."""
    what, flag, var = NEEDS[name]
    return f"no checkout to take {what} from: pass {flag} or set {var}"
