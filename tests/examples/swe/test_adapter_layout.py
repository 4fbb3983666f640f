"""Harbor's SWE-bench adapter layout, as `polar-tasks from-swebench` writes it, runs unchanged: three records (three
of examples/swe's tasks, written as SWE-bench publishes them) become tasks whose task.toml names SWE-bench's
per-instance image (`swebench/sweb.eval.x86_64.<id>`); each image's stand-in is built here — the SWE base, a conda
env named testbed as SWE-bench's images have it (/opt/miniconda3), the repository at base_commit in /testbed — and
mapped with --image-map. Through --sandbox docker, in one run: the start state scores 0 (exactly the F2P tests
failing), the gold patch 1, graded by the testbed env's python with base_commit read from the image's own objects
(these tasks carry no bundle), nothing fetched."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from polar.rollout import swebench
from tests.examples.swe.swe_support import SWE, failing, record
from tests.rollout.rollout_support import explain, latest, results, rollout, rollout_env

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
TASKS = ("pagekit", "durations", "moneyfmt")
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


def test_swebench_records_run_as_harbor_adapter_tasks(swe_base, cache_dir, tmp_path, upstream):
    src = tmp_path / "records.jsonl"
    src.write_text("".join(json.dumps({**record(t), "problem_statement": (SWE / t / "instruction.md").read_text()})
                           + "\n" for t in TASKS))
    tasks = tmp_path / "tasks"
    assert swebench.main(["from-swebench", str(src), "--out", str(tasks)]) == 0
    lines = []
    for task in TASKS:
        iid = record(task)["instance_id"]
        local = standin(task, swe_base, tmp_path / task)
        lines.append(f"swebench/sweb.eval.x86_64.{swebench.docker_id(iid)}:latest={local}")
        (tasks / iid / "agent").mkdir()
        shutil.copyfile(HERE / "swe_agent.py", tasks / iid / "agent" / "swe_agent.py")
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
    ids = {t: record(t)["instance_id"] for t in TASKS}
    assert {key: (line["status"], line["reward"]) for key, line in final.items()} == {
        (ids[t], k): ("completed", float(k)) for t in TASKS for k in (0, 1)}, why
    for task in TASKS:
        rec = record(task)
        assert failing(final[(ids[task], 0)]["reward_details"]) == sorted(rec["FAIL_TO_PASS"])
        assert failing(final[(ids[task], 1)]["reward_details"]) == []
        log = (run / "samples" / ids[task] / "1" / "0" / "verifier" / "pytest.log").read_text()
        assert log.startswith("$ /opt/miniconda3/envs/testbed/bin/python3 -I -B -m pytest"), log[:300]
