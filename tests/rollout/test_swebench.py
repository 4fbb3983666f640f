"""polar-tasks from-swebench (rollout/swebench.py): SWE-bench / SWE-Gym records to tasks in Harbor's layout, and
its refusals, one line each with exit 2 and nothing written.

The tasks it writes run unchanged in Harbor's SWE-bench adapter layout: three records (three of examples/swe's
tasks, written as SWE-bench publishes them) become tasks whose task.toml names SWE-bench's per-instance image
(`swebench/sweb.eval.x86_64.<id>`); each image's stand-in is built here — the SWE base, a conda env named testbed as
SWE-bench's images have it (/opt/miniconda3), the repository at base_commit in /testbed — and mapped with
--image-map. Through --sandbox docker, in one run: the start state scores 0 (exactly the F2P tests failing), the
gold patch 1, graded by the testbed env's python with base_commit read from the image's own objects (these tasks
carry no bundle), nothing fetched."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from polar.rollout import swebench
from tests.rollout.rollout_support import explain, latest, results, rollout, rollout_env
from tests.rollout.swe_support import failing, record, swe_base  # noqa: F401 — swe_base: the fixture


ROOT = Path(__file__).resolve().parents[2]
SWE = ROOT / "examples" / "swe"
BASE = "7db7cf9758b351aeb8bd0b7f8c65e4319f524a20"


def records(*tasks: str, dataset_form: bool = False) -> list[dict]:
    """The example tasks' records as SWE-bench publishes them (problem_statement; with `dataset_form`, the test
    lists JSON-encoded as the published datasets hold them)."""
    out = []
    for task in tasks:
        rec = json.loads((SWE / task / "tests" / "config.json").read_text())
        rec["problem_statement"] = (SWE / task / "instruction.md").read_text()
        if dataset_form:
            rec["FAIL_TO_PASS"], rec["PASS_TO_PASS"] = json.dumps(rec["FAIL_TO_PASS"]), json.dumps(rec["PASS_TO_PASS"])
        out.append(rec)
    return out


def write_jsonl(path: Path, recs: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs))
    return path


def polar_tasks(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polar.rollout.swebench", *args], capture_output=True, text=True)


@pytest.mark.unit
def test_three_records_become_three_tasks(tmp_path):
    recs = records("pagekit", "durations") + records("moneyfmt", dataset_form=True)
    recs[1].pop("patch")  # a record without the gold patch: no solution/
    src = write_jsonl(tmp_path / "records.jsonl", recs)
    proc = polar_tasks("from-swebench", str(src), "--out", str(tmp_path / "tasks"), "--cpus", "2", "--memory-mb",
                       "2048", "--agent-timeout", "600")
    assert proc.returncode == 0 and proc.stdout.strip() == f"wrote 3 task(s) to {tmp_path / 'tasks'}", proc.stderr
    tasks = tmp_path / "tasks"
    assert sorted(p.name for p in tasks.iterdir()) == [
        "polar-swe__durations-1", "polar-swe__moneyfmt-1", "polar-swe__pagekit-1"]
    task = tasks / "polar-swe__pagekit-1"
    toml = tomllib.loads((task / "task.toml").read_text())
    assert toml["environment"] == {"docker_image": "swebench/sweb.eval.x86_64.polar-swe_1776_pagekit-1:latest",
                                   "cpus": 2, "memory_mb": 2048, "storage_mb": 10240}
    assert toml["agent"]["timeout_sec"] == 600 and toml["verifier"]["timeout_sec"] == 900
    assert toml["metadata"]["instance_id"] == "polar-swe__pagekit-1"
    assert (task / "instruction.md").read_text() == (SWE / "pagekit" / "instruction.md").read_text()
    assert (task / "tests" / "grade.py").read_text() == (ROOT / "rollout" / "swe_grade.py").read_text()
    assert (task / "tests" / "test.sh").read_text() == swebench.TEST_SH
    assert (task / "solution" / "solve.sh").read_text() == (SWE / "pagekit" / "solution" / "solve.sh").read_text()
    money = json.loads((tasks / "polar-swe__moneyfmt-1" / "tests" / "config.json").read_text())
    assert money["FAIL_TO_PASS"] == records("moneyfmt")[0]["FAIL_TO_PASS"]  # JSON-encoded lists read as lists
    assert not (tasks / "polar-swe__durations-1" / "solution").exists()
    assert json.loads((task / "tests" / "config.json").read_text())["base_commit"] == BASE


@pytest.mark.unit
def test_image_pattern(tmp_path):
    src = write_jsonl(tmp_path / "r.jsonl", records("pagekit"))
    proc = polar_tasks("from-swebench", str(src), "--out", str(tmp_path / "t"), "--image-pattern",
                       "registry.example:5000/swe/{repo}:{id}")
    assert proc.returncode == 0, proc.stderr
    toml = tomllib.loads((tmp_path / "t" / "polar-swe__pagekit-1" / "task.toml").read_text())
    assert toml["environment"]["docker_image"] == "registry.example:5000/swe/polar-swe/pagekit:polar-swe__pagekit-1"


def _bad(**change) -> dict:
    rec = records("pagekit")[0]
    for key, value in change.items():
        if value is None:
            rec.pop(key)
        else:
            rec[key] = value
    return rec


@pytest.mark.parametrize("lines, extra, expected", [
    ([_bad(problem_statement=None)], (), "line 1: no problem_statement (SWE-bench's record keys"),
    (["{not json"], (), "line 1: not JSON"),
    ([_bad(), _bad()], (), "line 2: instance_id polar-swe__pagekit-1 again (first on line 1)"),
    ([_bad(FAIL_TO_PASS=["test_bump (tests.VersionTests)"])], (), "not a pytest node id"),
    ([_bad(FAIL_TO_PASS=[])], (), "line 1: FAIL_TO_PASS is empty"),
    ([_bad(FAIL_TO_PASS="[not a list")], (), "FAIL_TO_PASS is a string that is not a JSON list"),
    ([_bad(instance_id="../escape")], (), "instance_id '../escape' is not a directory name"),
    ([_bad(base_commit="main")], (), "base_commit 'main' is not a full commit id"),
    ([_bad()], ("--image-pattern", "swe/{name}"), "--image-pattern 'swe/{name}' does not format"),
    ([], (), "no records"),
])
@pytest.mark.unit
def test_bad_records_are_one_line_and_write_nothing(lines, extra, expected, tmp_path):
    src = write_jsonl(tmp_path / "r.jsonl", lines)
    proc = polar_tasks("from-swebench", str(src), "--out", str(tmp_path / "t"), *extra)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("polar-tasks: error: ") and expected in proc.stderr
    assert not (tmp_path / "t").exists()


@pytest.mark.unit
def test_existing_tasks_need_force(tmp_path):
    src = write_jsonl(tmp_path / "r.jsonl", records("pagekit"))
    assert polar_tasks("from-swebench", str(src), "--out", str(tmp_path / "t")).returncode == 0
    stale = tmp_path / "t" / "polar-swe__pagekit-1" / "stale.txt"
    stale.write_text("x")
    proc = polar_tasks("from-swebench", str(src), "--out", str(tmp_path / "t"))
    assert proc.returncode == 2 and "already holds polar-swe__pagekit-1; pass --force" in proc.stderr
    assert polar_tasks("from-swebench", str(src), "--out", str(tmp_path / "t"), "--force").returncode == 0
    assert not stale.exists()


@pytest.mark.unit
def test_missing_file_and_bad_flags(tmp_path):
    proc = polar_tasks("from-swebench", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "t"))
    assert proc.returncode == 2 and "cannot read it" in proc.stderr and proc.stderr.count("\n") == 1
    proc = polar_tasks("from-swebench", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "t"), "--cpuz", "2")
    assert proc.returncode == 2 and "did you mean --cpus?" in proc.stderr


# ---------------------------------------------------------------------------------------------------------------------
# the tasks it writes, run

ADAPTER_TASKS = ("pagekit", "durations", "moneyfmt")
# SWE-bench's images activate the repository's environment with conda; the stand-in's conda knows `activate ENV`
CONDA = """mkdir -p /opt/miniconda3/bin /opt/miniconda3/envs/testbed/bin \\
    && ln -s /usr/local/bin/python3 /opt/miniconda3/envs/testbed/bin/python3 \\
    && printf '%s\\n' 'conda() { [ "$1" = activate ] && export PATH="/opt/miniconda3/envs/$2/bin:$PATH"; }' \\
       > /opt/miniconda3/bin/activate"""


def standin(task: str, swe_base: dict, ctx: Path) -> str:
    """SWE-bench's image for the task, stood in for: the SWE base, conda's testbed env, the repository (committed as
    examples/swe/environment/Dockerfile commits it, so its HEAD is the record's base_commit)."""
    shutil.copytree(SWE / task / "environment" / "repo", ctx / "repo", ignore=shutil.ignore_patterns("__pycache__"))
    commit = re.search(r"^WORKDIR .*", (SWE / "environment" / "Dockerfile").read_text(), re.M | re.S).group(0)
    (ctx / "Dockerfile").write_text(f"FROM {swe_base['image']}\nRUN {CONDA}\n{commit}")
    tag = f"polar-standin/sweb.eval.x86_64.{swebench.docker_id(record(task)['instance_id'])}"
    proc = subprocess.run(["docker", "build", "-q", "--network", "none", "-t", tag, str(ctx)], capture_output=True,
                          text=True, env={**os.environ, "DOCKER_HOST": swe_base["host"]}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return tag


@pytest.mark.integration
def test_swebench_records_run_as_harbor_adapter_tasks(swe_base, cache_dir, tmp_path, upstream):
    src = tmp_path / "records.jsonl"
    src.write_text("".join(json.dumps({**record(t), "problem_statement": (SWE / t / "instruction.md").read_text()})
                           + "\n" for t in ADAPTER_TASKS))
    tasks = tmp_path / "tasks"
    assert swebench.main(["from-swebench", str(src), "--out", str(tasks)]) == 0
    lines = []
    for task in ADAPTER_TASKS:
        iid = record(task)["instance_id"]
        local = standin(task, swe_base, tmp_path / task)
        lines.append(f"swebench/sweb.eval.x86_64.{swebench.docker_id(iid)}:latest={local}")
        (tasks / iid / "agent").mkdir()
        shutil.copyfile(Path(__file__).with_name("swe_agent.py"), tasks / iid / "agent" / "swe_agent.py")
        shutil.copyfile(tasks / iid / "solution" / "solve.sh", tasks / iid / "agent" / "solve.sh")
        assert not (tasks / iid / "tests" / "base.bundle").exists()
    image_map = tmp_path / "image-map.txt"
    image_map.write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    proc = rollout(str(tasks), "--agent", "python:swe_agent:run", "--out", str(run), "--sandbox", "docker",
                   "--upstream", upstream.base_url, "--samples", "2", "--parallel", "3", "--run-id", "swe-adapter",
                   "--agent-timeout", "120", "--skip-preflight", "--no-process", "--image-map", f"@{image_map}",
                   timeout=400, env=rollout_env(DOCKER_HOST=swe_base["host"]))
    final = latest(results(run))
    why = explain(proc) + "".join(f"\n{key}: {line.get('error')}" for key, line in final.items())
    ids = {t: record(t)["instance_id"] for t in ADAPTER_TASKS}
    assert {key: (line["status"], line["reward"]) for key, line in final.items()} == {
        (ids[t], k): ("completed", float(k)) for t in ADAPTER_TASKS for k in (0, 1)}, why
    for task in ADAPTER_TASKS:
        rec = record(task)
        assert failing(final[(ids[task], 0)]["reward_details"]) == sorted(rec["FAIL_TO_PASS"])
        assert failing(final[(ids[task], 1)]["reward_details"]) == []
        log = (run / "samples" / ids[task] / "1" / "0" / "verifier" / "pytest.log").read_text()
        assert log.startswith("$ /opt/miniconda3/envs/testbed/bin/python3 -I -B -m pytest"), log[:300]
