"""BENCHMARKS.md says every number in it comes from a script in this repository (issue 42): each `scripts/bench_*` it
names exists and answers `--help` with exit 0 (quickly: a benchmark's --help starts nothing), and the figures no
script makes stay out (no column of the retired polar-fast configuration, whose script is gone)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support.gateway import ROOT

pytestmark = pytest.mark.unit

DOC = Path(ROOT) / "BENCHMARKS.md"


def _named() -> list[str]:
    return sorted(set(re.findall(r"\bscripts/bench_[A-Za-z0-9_]+", DOC.read_text())))


def test_1_the_doc_names_benchmarks():
    assert len(_named()) >= 5, _named()


@pytest.mark.parametrize("script", _named())
def test_2_each_named_benchmark_exists_and_answers_help(script):
    path = Path(ROOT) / script
    assert path.is_file(), f"BENCHMARKS.md names {script}, which is not in the tree"
    proc = subprocess.run([str(path), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{script} --help: exit {proc.returncode}\n{proc.stderr[-2000:]}"
    assert "usage" in (proc.stdout + proc.stderr).lower(), proc.stdout[-2000:]


def test_3_no_column_of_the_retired_configuration():
    headers = [line for line in DOC.read_text().splitlines() if line.startswith("| measure")]
    assert headers and not [h for h in headers if "polar-fast" in h], "polar-fast has no script in the tree"
