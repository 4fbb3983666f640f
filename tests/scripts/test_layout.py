"""The code's shape, as issue 14 set it (no sockets): short functions, declared seams instead of probing, each
contract table written once."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAX_FUNCTION_LINES = 80


def _functions(folder: str):
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(ROOT), node


@pytest.mark.parametrize("folder", ["addon", "processor"])
def test_1_1_no_function_over_80_lines(folder):
    long = [f"{p}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)" for p, n in _functions(folder)
            if n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


def test_1_2_the_driver_never_probes_a_codec():
    driver = (ROOT / "addon" / "call.py").read_text()
    assert not re.search(r"\b(hasattr|getattr)\(\s*(self\.)?(codec|encoder)", driver)


@pytest.mark.parametrize("needle,home", [
    ('"unavailable": (503, "server_error", "service_unavailable")', "addon/provider_errors.py"),
    ('body["max_tokens"] = room', "addon/shaping.py"),
    ('/tokenize"', "addon/backend.py"),
    ('"v", "id", "session", "session_source"', "addon/record.py"),
])
def test_1_3_each_contract_is_written_once(needle, home):
    where = [str(p.relative_to(ROOT)) for folder in ("addon", "processor") for p in (ROOT / folder).rglob("*.py")
             if needle in p.read_text()]
    assert where == [home]
