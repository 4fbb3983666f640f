"""scripts/measure_learning's campaign bookkeeping, without training (docs/training.md#campaigns-settings-compared-on-
the-same-seeds): bad command lines exit 2 in one line; a DIR holding a campaign is resumed only with the command line
it was started with (a setting under a new name may be added); a resumed campaign whose runs all finished reuses
them — no server, no polar-train — prints every run and writes the table with the seeds that reach the bar and those
whose entropy fell under 1 nat."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "measure_learning"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def _finished(d: Path, setting: str, family: str, seed: int, rewards: list[float], entropy: list[float]) -> None:
    """A run as the script leaves it once polar-train finished: RUN/train.json, RUN/train.jsonl, the result file."""
    run = d / setting / f"{family}-s{seed}"
    run.mkdir(parents=True)
    (run / "train.json").write_text(json.dumps({"lr": 0.01, "mini_batches": 2, "epochs": 8}))
    (run / "train.jsonl").write_text("".join(json.dumps({"step": i + 1, "reward_mean": r, "entropy": e}) + "\n"
                                             for i, (r, e) in enumerate(zip(rewards, entropy))))


@pytest.mark.parametrize("args, needle", [
    ([], "FAMILY[,FAMILY...] SEEDS needed"),
    (["digit-share"], "SEEDS needed"),
    (["nope", "1-2"], "family 'nope'"),
    (["digit-share", "x"], "SEEDS 'x'"),
    (["--setting", "a", "digit-share", "1"], "NAME=ARGS"),
    ([*sum((["--setting", f"s{i}=--lr 0.0{i}"] for i in range(4)), []), "digit-share", "1"], "at most 3"),
    (["--frobnicate", "digit-share", "1"], "unknown option"),
])
def test_bad_command_lines_exit_2_in_one_line(tmp_path, args, needle):
    proc = _run("--dir", str(tmp_path / "c"), *args)
    assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stdout == ""


def test_a_finished_campaign_resumes_from_its_results_without_training(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    (d / "campaign.json").write_text(json.dumps({"dir": str(d), "families": ["digit-share"], "seeds": [1, 2],
                                                 "settings": {"hi": ["--clip-high", "0.28"]}, "control": False,
                                                 "common": []}))
    # seed 1: 0.03 0.03 0.03 … 0.30 0.30 0.30 (rise +0.27); seed 2: flat, its entropy down to 0.5 at step 3
    _finished(d, "hi", "digit-share", 1, [0.03] * 3 + [0.1] * 6 + [0.3] * 3, [7.9] * 12)
    _finished(d, "hi", "digit-share", 2, [0.05] * 12, [7.9, 3.0, 0.5] + [0.9] * 9)
    for seed in (1, 2):
        # the script's own result files, made by its own reader: a finished run's train.jsonl → the result
        code = (f"import runpy, json; m = runpy.run_path({str(SCRIPT)!r}); from pathlib import Path; "
                f"r = m['result_of'](Path({str(d / 'hi' / f'digit-share-s{seed}')!r}), 'digit-share', {seed}, 100); "
                f"Path({str(d / 'hi' / f'digit-share-s{seed}.result.json')!r}).write_text(json.dumps(r))")
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    proc = _run("--dir", str(d), "--resume")
    assert proc.returncode == 0, proc.stderr
    assert "vllm" not in proc.stderr  # nothing to run: no server was started
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| hi |")]
    assert len(rows) == 2 and "+0.270" in rows[0] and "+0.000" in rows[1] and "0.50 (step 3)" in rows[1]
    table = (d / "results.md").read_text()
    assert "`hi` digit-share: 1 of 2 finished seed(s) (of 2) rise by ≥ 0.15" in table
    assert "entropy below 1.0 nats at some step: 2" in table

    # the same DIR: another seed list is refused, a new setting is added to it
    proc = _run("--dir", str(d), "--resume", "digit-share", "1-3")
    assert proc.returncode == 2 and "another command line" in proc.stderr
    proc = _run("--dir", str(d), "digit-share", "1-2")
    assert proc.returncode == 2 and "holds a campaign" in proc.stderr
    proc = _run("--dir", str(d), "--resume", "--setting", "hi=--clip-high 0.3")
    assert proc.returncode == 2 and "another command line" in proc.stderr
    assert json.loads((d / "campaign.json").read_text())["settings"] == {"hi": ["--clip-high", "0.28"]}
