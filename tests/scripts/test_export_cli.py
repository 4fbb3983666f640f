"""`polar-export` runs in the base install (the proxy's .venv, no torch): the console script end to end as a
subprocess, on a small processed OUT (docs/trainer-formats.md). The field maps themselves are tested in tests/trainer.

1.x  each format writes its files and manifest
2.x  bad input: exit 2 and one line naming the fix, nothing written
3.x  no torch: the module imports without it
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from polar.processor.cli import main as process
from tests.processor.synth import session_records, write_flows

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
POLAR_EXPORT = ROOT / ".venv" / "bin" / "polar-export"


def polar_export(*args: str) -> subprocess.CompletedProcess:
    if not POLAR_EXPORT.exists():
        pytest.fail(f"{POLAR_EXPORT} is missing: run scripts/setup", pytrace=False)
    return subprocess.run([str(POLAR_EXPORT), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def processed(tmp_path_factory) -> Path:
    """Two rewarded sessions in one group and one without a reward."""
    root = tmp_path_factory.mktemp("cli")
    recs = []
    for i, session in enumerate(("a", "b", "c")):
        recs += session_records(session, ["turn", "turn"], seed=i, t0=1_700_000_000.0 + 100 * i)
    write_flows(str(root / "flows"), recs)
    (root / "rewards.jsonl").write_text('{"session": "a", "reward": 1.0, "group": "g"}\n'
                                        '{"session": "b", "reward": 0.0, "group": "g"}\n')
    assert process([str(root / "flows"), "-o", str(root / "out"), "-q", "--rewards", str(root / "rewards.jsonl")]) == 0
    return root / "out"


@pytest.mark.parametrize("fmt,first_column", [("slime", "tokens"), ("prime-rl", "token_ids"), ("verl", "prompts")])
def test_1_1_each_format_writes_its_rows_and_manifest(fmt, first_column, processed, tmp_path):
    d = tmp_path / "export"
    proc = polar_export(str(processed), "--format", fmt, "-o", str(d))
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["files"] == [f"{fmt}-00000.parquet"]
    assert sorted(os.listdir(d)) == sorted([*manifest["files"], "manifest.json"])
    rows = pl.read_parquet(d / manifest["files"][0])
    sessions = pl.read_parquet(processed / "sequences.parquet").filter(pl.col("sequence_id").is_in(
        rows["sequence_id"].implode()))["session"].to_list()
    assert rows.columns[0] == first_column and rows.height == manifest["rows"] == 2
    assert sorted(sessions) == ["a", "b"] and manifest["left_out"] == {"null_advantage": 1}  # c has no reward
    assert f"2 {fmt} rows" in proc.stdout


@pytest.mark.parametrize("case,fix", [
    ("no_batches", "pass the -o directory of a polar-process run"),
    ("unknown_format", "use one of verl, slime, prime-rl"),
    ("dir_not_empty", "pass a new or empty directory"),
    ("no_format", "--format"),
])
def test_2_1_bad_input_exits_2_with_one_line(case, fix, processed, tmp_path):
    d = tmp_path / "export"
    args = [str(processed), "--format", "slime", "-o", str(d)]
    if case == "no_batches":
        args[0] = str(processed / "batches")  # one level too deep: no batches/ inside
    elif case == "unknown_format":
        args[2] = "openrlhf"
    elif case == "dir_not_empty":
        d.mkdir()
        (d / "old.parquet").write_bytes(b"x")
    else:
        args = [str(processed), "-o", str(d)]
    proc = polar_export(*args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("polar-export: ") and fix in lines[0]
    assert proc.stdout == ""
    assert (sorted(os.listdir(d)) == ["old.parquet"]) if case == "dir_not_empty" else not d.exists()


def test_3_1_the_export_module_imports_no_torch():
    code = "import sys, polar.trainer.export; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
