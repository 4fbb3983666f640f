"""rollout/agents/: what runs inside a sandbox keeps to its import budget (its __init__ says it: the standard library
and polar.records.protocols at module level, an SDK only inside the function that uses it), and the names users type
(`python -m polar.rollout.pyagent`, `python:polar.rollout.sdk_agent:answer|run`, `polar.rollout.serve_protocol`)
reach the real homes. No sockets."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
WING = ROOT / "rollout" / "agents"

# Run in a fresh interpreter: the project modules and third-party modules loaded by importing `modules`.
LOADED = r"""
import json, sys
before = set(sys.modules)
for name in sys.argv[1:]:
    __import__(name)
new = sorted(set(sys.modules) - before)
print(json.dumps([m for m in new if m.split(".")[0] not in sys.stdlib_module_names]))
"""


def _loaded(*modules: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", LOADED, *modules], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return [m for m in json.loads(proc.stdout) if not m.startswith("__editable__")]  # the editable install's finder


# An interpreter without site-packages (-S: only the standard library) and the files a sandbox gets of polar.
ALONE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
before = set(sys.modules)
import polar.rollout.agents.pyagent, polar.rollout.agents.sdk_agent, polar.rollout.sdk_agent, polar.rollout.pyagent
new = sorted(set(sys.modules) - before)
print(json.dumps([m for m in new if m.split(".")[0] not in sys.stdlib_module_names]))
"""


def test_1_1_the_wing_imports_alone_on_the_standard_library(tmp_path):
    """What a python: agent's sandbox is given of polar (specs.AGENT_FILES), alone on an interpreter without
    site-packages, imports: the wing, the names users type and the protocols' leaf, nothing third-party."""
    from polar.rollout.specs import AGENT_FILES

    for rel, host in AGENT_FILES:
        (tmp_path / "polar" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "polar" / rel).write_bytes(host.read_bytes())
    proc = subprocess.run([sys.executable, "-S", "-c", ALONE, str(tmp_path)], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert sorted(json.loads(proc.stdout)) == [
        "polar", "polar.records", "polar.records.protocols", "polar.rollout", "polar.rollout.agents",
        "polar.rollout.agents.pyagent", "polar.rollout.agents.sdk_agent", "polar.rollout.pyagent",
        "polar.rollout.sdk_agent"]


def test_1_2_the_budget_is_stated_and_the_init_imports_nothing():
    doc = ast.get_docstring(ast.parse((WING / "__init__.py").read_text()))
    assert "Import budget" in doc and "standard library" in doc
    tree = ast.parse((WING / "__init__.py").read_text())
    assert [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))] == []


def test_1_3_an_sdk_is_imported_only_inside_a_function():
    """Module-level imports of the wing's modules are the standard library and polar.records.protocols (an SDK at
    module level would be paid by every python: agent, and break an interpreter without it)."""
    for path in sorted(WING.glob("*.py")):
        top = [n for n in ast.parse(path.read_text()).body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
        names += [n.module for n in top if isinstance(n, ast.ImportFrom) and n.module != "__future__"]
        assert [n for n in names if n.split(".")[0] not in sys.stdlib_module_names
                and n != "polar.records.protocols"] == [], path.name


def test_2_1_the_names_users_type_reach_the_real_homes():
    from polar.rollout import sdk_agent, serve_protocol
    from polar.rollout.agents import sdk_agent as home
    from polar.rollout.serve import protocol

    assert (sdk_agent.answer, sdk_agent.run) == (home.answer, home.run)
    assert serve_protocol is protocol  # one module object: what polar-train imports is the home itself
    proc = subprocess.run([sys.executable, "-m", "polar.rollout.pyagent", "--help"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0 and "MODULE:FUNC" in proc.stdout


def test_2_2_serve_protocol_loads_no_third_party_module():
    """polar.rollout.serve_protocol is importable where only the standard library is (polar-train's .venv-train):
    the serve wing's __init__ imports nothing."""
    loaded = _loaded("polar.rollout.serve_protocol")
    assert sorted(loaded) == ["polar", "polar.rollout", "polar.rollout.serve", "polar.rollout.serve.protocol",
                              "polar.rollout.serve_protocol"]
