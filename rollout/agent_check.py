"""The agent, checked before any sandbox starts (issue 37): one line naming the fix instead of a preflight's traceback
tail or a sandbox's mount error.

- `python:MODULE:FUNC`: MODULE is found (each task's `agent/` folder first, then this interpreter's `sys.path`, as
  polar.rollout.pyagent imports it), its source compiles, and it defines FUNC at its top level — read with `ast`,
  never imported or run on the host. An official SDK it imports (anywhere in it) must be importable here: the
  `[agents]` extra.
- A CLI agent: its binary is in the npm prefix or on PATH.

Fixes name what installs the missing piece where the package runs: a checkout's `scripts/setup` commands, else pip
extras and npm packages (polar.launch.paths.fix). Standard library only.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

from polar.launch import paths
from polar.rollout import clis as agentlib
from polar.rollout.common import UsageError

# The official SDKs a python: agent may import, and the extra that brings them.
SDK_MODULES = {"anthropic": "agents", "openai": "agents", "google.genai": "agents"}
# The npm package of each CLI (scripts/lib/setup_clis.sh pins their versions).
NPM_PACKAGES = {"claude-code": "@anthropic-ai/claude-code", "codex": "@openai/codex",
                "gemini-cli": "@google/gemini-cli", "qwen-code": "@qwen-code/qwen-code",
                "pi": "@mariozechner/pi-coding-agent"}


def check_agent(agent, agent_dirs: list[Path | None], npm_dir: str | os.PathLike | None) -> None:
    """UsageError (one line naming the fix) when the agent cannot run; `agent` is a job.AgentSpec."""
    if agent.kind == "cli":
        check_cli(agent.harness, npm_dir)
    else:
        check_python(agent.target, agent_dirs)


def check_cli(harness: str, npm_dir: str | os.PathLike | None) -> None:
    binary = agentlib.BINARIES[harness]
    if agentlib.find_binary(binary, npm_dir) is not None:
        return
    where = f"{agentlib.npm_bin_dir(str(npm_dir))} nor on PATH" if npm_dir else "on PATH"
    install = paths.fix(checkout="scripts/setup --clis",
                        installed=f"npm install --prefix DIR {NPM_PACKAGES[harness]}, then --npm-dir DIR "
                                  f"(or npm install -g {NPM_PACKAGES[harness]})")
    raise UsageError(f"--agent {harness}: its CLI ({binary}) is not installed (not in {where}); install it: {install}")


def _source_of(module: str, agent_dirs: list[Path | None]) -> str | None:
    """The module's origin (its source file), found as pyagent finds it — the first task agent/ folder that holds
    its top-level name, else sys.path — without importing it (the parents of a dotted name are imported, as they
    would be)."""
    top = module.split(".")[0]
    first = next((str(d) for d in agent_dirs if d is not None
                  and importlib.machinery.PathFinder.find_spec(top, [str(d)]) is not None), None)
    saved = list(sys.path)
    if first:
        sys.path.insert(0, first)
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path[:] = saved
    return spec.origin if spec is not None else None


def check_python(target: str, agent_dirs: list[Path | None], shown: str | None = None) -> None:
    """`shown` is the target the user typed, when `target` is where a module it names took FUNC from."""
    module, _, func = target.partition(":")
    target = shown or target
    origin = _source_of(module, agent_dirs)
    dirs = [str(d) for d in agent_dirs if d is not None]
    if origin is None or origin in ("built-in", "frozen"):
        if origin is not None:
            return  # a built-in module: nothing to read, pyagent imports it
        looked = f"the tasks' agent/ folders ({', '.join(sorted(set(dirs)))}) or " if dirs else ""
        raise UsageError(f"--agent python:{target}: no module {module!r} in {looked}this interpreter's sys.path; "
                         f"put {module.replace('.', '/')}.py in the task's agent/ folder or install it")
    if not origin.endswith(".py"):
        return  # an extension module or a namespace package: nothing to read without importing it
    try:
        source = Path(origin).read_text(encoding="utf-8")
        tree = ast.parse(source, filename=origin)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--agent python:{target}: cannot read {origin} ({exc})") from None
    except SyntaxError as exc:
        raise UsageError(f"--agent python:{target}: {origin}:{exc.lineno}: does not compile ({exc.msg}); fix the "
                         f"module") from None
    head = func.split(".")[0]
    if head not in _top_level_names(tree):
        raise UsageError(f"--agent python:{target}: {origin} defines no {head!r} at its top level; name a function "
                         f"it defines (python:{module}:FUNC)")
    home = _imported_from(tree, head)
    if home is not None and shown is None:  # a name users type that takes FUNC from its home: the home is the agent
        check_python(f"{home}:{func}", agent_dirs, shown=target)
        return
    for sdk, extra in SDK_MODULES.items():
        if _imports(tree, sdk) and not _importable(sdk):
            pip = f"pip install 'polar-gateway[{extra}]'"
            fix = paths.fix(checkout=f"scripts/setup (it installs the [{extra}] extra into .venv), or {pip}",
                            installed=pip)
            raise UsageError(f"--agent python:{target}: it imports {sdk}, which is not installed here: {fix}")


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try)):  # conditional definitions count: they may exist at run time
            names.update(_top_level_names(ast.Module(body=[*node.body, *getattr(node, "orelse", []),
                                                           *[n for h in getattr(node, "handlers", []) for n in h.body]],
                                                     type_ignores=[])))
    return names


def _imported_from(tree: ast.Module, name: str) -> str | None:
    """The module a top-level `from MODULE import name` takes `name` from (absolute imports only), else None."""
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                any((a.asname or a.name) == name and a.name == name for a in node.names):
            return node.module
    return None


def _imports(tree: ast.Module, module: str) -> bool:
    """Whether the module imports `module` (or a submodule, or from it) anywhere, lazily inside functions too."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == module or a.name.startswith(module + ".")
                                                for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            full = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            if any(m == module or m.startswith(module + ".") for m in full):
                return True
    return False


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
