"""The README's first command, on the scripted upstream (`scripts/demo --scripted`): polar-rollout runs the SDK agent
on two example tasks × 2 samples in sandboxes (bwrap), then polar-process; the summary shows groups, rewards, advantages,
and at least one group with a reward spread (the scripted upstream's answers differ from sample to sample)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.support.gateway import ROOT

pytestmark = pytest.mark.integration


def test_1_1_the_scripted_demo_runs_end_to_end():
    proc = subprocess.run([os.path.join(ROOT, "scripts", "demo"), "--scripted"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip().startswith("group ")]
    assert len(lines) == 4 and all("reward" in line and "advantage" in line for line in lines), proc.stdout
    assert "completed" in proc.stdout and "merge ratio" in proc.stdout
    assert "sandbox bwrap" in proc.stdout  # CI installs bubblewrap: the demo runs sandboxed, never --sandbox none
    advantages = [line.rsplit("advantage", 1)[1].strip() for line in lines]
    assert any(a not in ("0.0", "None") for a in advantages), proc.stdout  # a group with a reward spread
    spread = re.search(r"groups with a reward spread \(non-zero advantages\): (\d+) of (\d+)", proc.stdout)
    assert spread and int(spread.group(1)) >= 1, proc.stdout
    out = os.path.join(ROOT, ".cache", "run", "demo", "rollout", "out")
    assert all(os.path.exists(os.path.join(out, name)) for name in ("sequences.parquet", "report.html"))
