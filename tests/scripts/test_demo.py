"""The README's first command, `scripts/demo`: polar-rollout runs the SDK agent on two example tasks × 2 samples in
sandboxes (bwrap), then polar-process; the summary shows groups, rewards, advantages, and at least one group with a
reward spread.

1.1  on the scripted upstream (`scripts/demo --scripted`: its answers differ from sample to sample)
1.2  verbatim, as the README's first line shows it (issue 42): a real vLLM serving SmolLM2-135M on the CPU, the
     graded vowel-share group's two samples scoring apart, so its advantages are ±1 — what the README says it prints
     (the demo seeds every call, so each run draws the same samples; unseeded, 1 run in 4 had no spread)
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.support.gateway import ROOT
from tests.support.need import need_sandbox

pytestmark = pytest.mark.integration


def _demo(*args: str) -> subprocess.CompletedProcess:
    need_sandbox("bwrap")  # the README's demo is sandboxed; without bwrap it would fall back to --sandbox none
    proc = subprocess.run([os.path.join(ROOT, "scripts", "demo"), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_1_1_the_scripted_demo_runs_end_to_end():
    proc = _demo("--scripted")
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


def test_1_2_the_readmes_first_command_verbatim_with_a_real_vllm():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    first = re.search(r"```bash\n(.*?)\n", readme).group(1)
    assert first.split("#")[0].split() == ["scripts/demo"], first  # what this test runs, word for word
    proc = _demo()
    out = proc.stdout
    assert "starting vLLM with SmolLM2-135M-Instruct" in out and "--sandbox bwrap" in out, out
    lines = [line.split() for line in out.splitlines() if line.strip().startswith("group ")]
    # group G  sample K: STATUS reward R  advantage A
    got = {(w[1].rsplit("/", 1)[-1], w[3].rstrip(":")): (w[4], w[6], w[8]) for w in lines}  # RUN-ID/TASK
    assert sorted(got) == [("hello-file", "0"), ("hello-file", "1"), ("vowel-share", "0"), ("vowel-share", "1")], out
    assert all(status == "completed" and reward != "None" for status, reward, _ in got.values()), out
    vowel = [got["vowel-share", k] for k in ("0", "1")]
    assert vowel[0][1] != vowel[1][1] and sorted(float(a) for _, _, a in vowel) == [-1.0, 1.0], out  # the spread
    assert re.search(r"groups with a reward spread \(non-zero advantages\): [12] of 2", out), out
