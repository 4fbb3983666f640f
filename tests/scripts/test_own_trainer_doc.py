"""docs/own-trainer.md's code names the real API (issue 37): every call its Python blocks make exists with the keyword
arguments they pass, and the row columns it explains are the processor's batch columns. No serve is started."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PAGE = Path(__file__).resolve().parents[2] / "docs" / "own-trainer.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_1_every_call_in_the_python_blocks_exists_with_its_keywords():
    from polar.launch import publish as publish_mod
    from polar.rollout import serve_protocol as sp

    names = {"sp": sp, "publish": publish_mod.publish}
    checked = 0
    for block in _blocks():
        for node in ast.walk(ast.parse(block)):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "sp":
                target = getattr(sp, f.attr)
            elif isinstance(f, ast.Name) and f.id in names:
                target = names[f.id]
            else:
                continue
            params = inspect.signature(target).parameters
            missing = [k.arg for k in node.keywords if k.arg not in params]
            assert missing == [], f"{ast.unparse(f)} takes no {missing}"
            checked += 1
    assert checked >= 5


def test_2_the_row_columns_explained_are_the_batches():
    from polar.processor.writers import SEQUENCES_SCHEMA

    text = PAGE.read_text()
    section = text[text.index("## 3. The rows"):text.index("## 4. Publication")]
    explained = {c for cell in re.findall(r"^\| ([^|]+) \|", section, flags=re.M) for c in re.findall(r"`(\w+)`", cell)}
    assert explained and explained <= set(SEQUENCES_SCHEMA), explained - set(SEQUENCES_SCHEMA)
