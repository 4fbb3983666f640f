"""The image's own root writable for the agent through a layer of the sample's own (issue 39), under --sandbox docker
(the container's layer over `polar-owned:<id>`, the image with its directories handed to uid 1000) and bwrap (an
overlay view of the exported root, where the runner mounts overlays): what agents do outside their working directory
works — a tool in /usr/local/bin, `pip install` into the image's site-packages, a file in /etc replaced — while the
runtime mounted from the host stays read-only; the next sample starts from the image again, and so does the
verifier (only the working directory carries over: its test.sh scores 1 only on a pristine root).

The agent is tests/rollout/rootprobe.py; K = 2 samples one after the other, so the second would see the first's."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from polar.rollout import overlay
from tests.rollout.rollout_support import HERE, explain, latest, results, rollout, rollout_env
from tests.support.need import need_sandbox

pytestmark = pytest.mark.integration

TASK_TOML = """version = "1.0"

[environment]
docker_image = "python:3.12-slim"
"""
TEST_SH = """#!/bin/bash
# 1 only when nothing the agent did outside its working directory is here: grading starts from the image again
if [ -e /usr/local/bin/polar-probe-tool ] || python3 -c "import polarprobe" 2>/dev/null \\
        || grep -q polar-probe /etc/debian_version; then
    echo 0 > /logs/verifier/reward.txt
else
    echo 1 > /logs/verifier/reward.txt
fi
"""


def probe_task(root: Path) -> Path:
    task = root / "tasks" / "root-probe"
    (task / "tests").mkdir(parents=True)
    (task / "agent").mkdir()
    shutil.copyfile(HERE / "rootprobe.py", task / "agent" / "rootprobe.py")
    (task / "task.toml").write_text(TASK_TOML)
    (task / "instruction.md").write_text("Install your tools and report.\n")
    (task / "tests" / "test.sh").write_text(TEST_SH)
    return task.parent


def probes(run: Path) -> list[dict]:
    out = []
    for k in (0, 1):
        log = (run / "samples" / "root-probe" / str(k) / "0" / "agent.stdout").read_text()
        out.append(json.loads(next(line[6:] for line in log.splitlines() if line.startswith("PROBE "))))
    return out


@pytest.mark.parametrize("box", ["docker", "bwrap"])
def test_1_1_the_agents_root_is_its_own_layer_and_grading_starts_from_the_image(box, images, cache_dir, tmp_path,
                                                                                 upstream):
    if box == "bwrap":
        need_sandbox("bwrap")
    run = tmp_path / "run"
    proc = rollout(str(probe_task(tmp_path)), "--agent", "python:rootprobe:run", "--out", str(run), "--sandbox", box,
                   "--upstream", upstream.base_url, "--samples", "2", "--parallel", "1", "--run-id", f"root-{box}",
                   "--agent-timeout", "120", "--skip-preflight", "--no-process", "--image-map", f"@{images['map']}",
                   "--pull", "never", timeout=400, env=rollout_env(DOCKER_HOST=images["host"]))
    why = explain(proc)
    assert proc.returncode == 0, why
    writable = box == "docker" or overlay.why_no_overlay(str(run / ".work")) is None
    samples = [json.loads((run / "samples" / "root-probe" / str(k) / "0" / "sample.json").read_text())
               for k in (0, 1)]
    assert [s["root_view"] for s in samples] == [
        "container" if box == "docker" else "overlay" if writable else "read-only"] * 2, why
    # the verifier's root is the image's again: 1 on both samples though each installed into its own
    assert {k: (ln["status"], ln["reward"]) for (_, k), ln in latest(results(run)).items()} == {
        0: ("completed", 1.0), 1: ("completed", 1.0)}, why
    for probe in probes(run):
        assert probe["uid"] == 1000 and not probe["tool_at_start"] and not probe["module_at_start"], probe
        assert probe["runtime_write"] in ("EROFS", "EACCES"), probe  # what is mounted from the host stays read-only
        if not writable:  # bwrap where no overlay mounts: the image's root read-only, as the run said
            assert probe["tool"] in ("EROFS", "EACCES") and probe["pip_exit"] != 0, probe
            continue
        assert probe["tool"] == "polar-probe-ok", probe
        assert probe["pip_exit"] == 0, probe
        assert probe["module"].startswith("/usr/local/lib/python3.12/site-packages/polarprobe/"), probe
        # the image's files keep their owner: replaced (as sed -i and pip do), never written in place
        assert probe["etc_sed"] is True and probe["etc_in_place"] == "EACCES", probe
    assert not list((run / ".work").iterdir())  # every layer gone with its sample
    env = json.loads((run / "run.json").read_text())["environments"]["root-probe"]
    if box == "bwrap":  # the export the next run binds is untouched
        rootfs = cache_dir / "rootfs" / env["image_id"].split(":")[-1][:32]
        assert rootfs.is_dir() and not (rootfs / "usr/local/bin/polar-probe-tool").exists()
        assert "polar-probe" not in (rootfs / "etc/debian_version").read_text()
    else:  # the image the agent's containers ran, made once and labelled with the image it came from
        got = subprocess.run(["docker", "image", "inspect", "--format",
                              '{{index .Config.Labels "org.polar.owned.from"}}',
                              f"polar-owned:{env['image_id'].split(':')[-1][:32]}"], capture_output=True, text=True,
                             env=rollout_env(DOCKER_HOST=images["host"]), timeout=30)
        assert got.stdout.strip() == env["image_id"], got.stderr
