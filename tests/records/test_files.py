"""polar.records.files: a file is replaced whole or not at all (no sockets)."""

from __future__ import annotations

import json
import os

import pytest

from polar.records.files import write_atomic, write_json_atomic

pytestmark = pytest.mark.unit


def test_1_1_the_file_is_replaced_and_no_temporary_stays(tmp_path):
    path = tmp_path / "f.json"
    path.write_text("old")
    write_json_atomic(path, {"a": 1})
    write_atomic(tmp_path / "g", "text", mode=0o600)
    assert json.loads(path.read_text()) == {"a": 1} and path.read_text().endswith("}\n")
    assert (tmp_path / "g").read_text() == "text" and (tmp_path / "g").stat().st_mode & 0o777 == 0o600
    assert sorted(os.listdir(tmp_path)) == ["f.json", "g"]


def test_1_2_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "f.json"
    path.write_text("old")
    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": object()})  # json refuses before anything is written
    with pytest.raises(TypeError):
        write_atomic(path, 42)  # type: ignore[arg-type]
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["f.json"]
