"""--warm-agents (rollout/sandbox/warm.py): python: agents in bwrap run as forks of one pre-imported interpreter per slot,
against the scripted upstream behind the runner's own proxy (tests/rollout/testagent.py's leave-behind mode).

1.1  one slot runs every sample: the agent finds openai imported and the same zygote each time; nothing a sample
     left behind (a detached process, a /tmp file) is there for the next, every call is under its own sample's
     session, and nothing is left on the host after the run; the same task cold finds openai not imported
1.2  a sample past its timeout ends its slot (agent_timeout); the next sample of the same task (the same slot key)
     gets a new slot, with nothing of the killed one left, and completes
1.3  --warm-agents outside bwrap or for a CLI agent is refused with one line (exit 2)
1.4  a runner killed with -9 mid-sample: its slot's sandbox dies with it, and the sweep (the next run's first step)
     removes the slot's directory
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from polar.rollout.sandbox import control
from polar.rollout.sandbox import base as sb
from tests.rollout.rollout_support import AGENT, explain, latest, make_task, results, rollout, start_rollout
from tests.support.need import need_sandbox

pytestmark = pytest.mark.integration
# 1.4: how long the runner may take to start its proxy and the slot (bwrap, an interpreter, openai's import) under
# load, and its slot to die after the kill; only a machine too loaded to run the suite reaches it
RUNNER_WAIT_S = 120


def _seen(run: Path, task: str, k: int) -> dict:
    out = (run / "samples" / task / str(k) / "0" / "agent.stdout").read_text().splitlines()
    return json.loads(out[-1])


def _leftovers_on_host() -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if b"polar-leftover" in (p / "cmdline").read_bytes():
                    pids.append(int(p.name))
            except OSError:
                continue
    return pids


def _args(tmp_path: Path, upstream, run: Path, *extra: str) -> list[str]:
    return ["--agent", AGENT, "--out", str(run), "--sandbox", "bwrap", "--upstream", upstream.base_url,
            "--parallel", "1", "--skip-preflight", *extra]


def test_1_1_one_slot_runs_every_sample_and_no_sample_sees_the_last_ones_leftovers(tmp_path, upstream):
    need_sandbox("bwrap")
    tasks = tmp_path / "tasks"
    make_task(tasks, "leave", "leave-behind")
    run = tmp_path / "run"
    proc = rollout(str(tasks), *_args(tmp_path, upstream, run, "--samples", "3", "--warm-agents", "--run-id", "w1"))
    assert proc.returncode == 0, explain(proc)
    final = latest(results(run))
    for k in range(3):
        line = final[("leave", k)]
        assert (line["status"], line["reward"], line["calls"]) == ("completed", 1.0, 1), line
        assert line["session"] == f"w1/leave/{k}/0"
        detail = json.loads((run / "samples" / "leave" / str(k) / "0" / "sample.json").read_text())
        assert detail["agent"]["warm"] is True
    seen = [_seen(run, "leave", k) for k in range(3)]
    assert all(s["preloaded"] for s in seen), seen
    assert len({s["grandparent_start"] for s in seen}) == 1, seen  # one zygote forked every sample
    assert [(s["tmp"], s["leftovers"]) for s in seen] == [([], [])] * 3, seen
    assert _leftovers_on_host() == []
    # cold, the same agent imports openai itself
    cold = tmp_path / "cold"
    proc = rollout(str(tasks), *_args(tmp_path, upstream, cold, "--samples", "1", "--run-id", "c1"))
    assert proc.returncode == 0, explain(proc)
    assert _seen(cold, "leave", 0)["preloaded"] is False
    assert _leftovers_on_host() == []


def test_1_2_a_timed_out_sample_ends_its_slot_and_the_next_one_gets_a_new_slot(tmp_path, upstream):
    need_sandbox("bwrap")
    tasks = tmp_path / "tasks"
    make_task(tasks, "hang", "hang-k0", agent_timeout=5)
    run = tmp_path / "run"
    proc = rollout(str(tasks), *_args(tmp_path, upstream, run, "--samples", "2", "--warm-agents", "--run-id", "w2"),
                   timeout=180)
    assert proc.returncode == 0, explain(proc)
    final = latest(results(run))
    assert (final[("hang", 0)]["status"], final[("hang", 0)]["calls"]) == ("agent_timeout", 1)
    line = final[("hang", 1)]
    assert (line["status"], line["reward"], line["calls"]) == ("completed", 1.0, 1)
    first, second = _seen(run, "hang", 0), _seen(run, "hang", 1)
    assert first["preloaded"] and second["preloaded"]
    assert first["grandparent_start"] != second["grandparent_start"]  # another zygote
    assert (second["tmp"], second["leftovers"]) == ([], [])
    assert _leftovers_on_host() == []


@pytest.mark.parametrize("extra, agent", [(["--sandbox", "none"], AGENT), (["--sandbox", "bwrap"], "pi")])
def test_1_3_warm_agents_is_for_python_agents_in_bwrap_only(tmp_path, upstream, extra, agent):
    tasks = tmp_path / "tasks"
    make_task(tasks, "leave", "leave-behind")
    proc = rollout(str(tasks), "--agent", agent, "--out", str(tmp_path / "run"), "--upstream", upstream.base_url,
                   "--warm-agents", *extra)
    assert proc.returncode == 2, explain(proc)
    assert "--warm-agents applies to python: agents in --sandbox bwrap only" in proc.stderr


def _slot_dirs_of(pid: int) -> list[Path]:
    out = []
    for base in sorted({control._control_base(), "/tmp"}):
        for d in Path(base).glob(f"{control.CONTROL_PREFIX}warm-*"):
            try:
                if json.loads((d / control.OWNER_FILE).read_text())["pid"] == pid:
                    out.append(d)
            except (OSError, ValueError, KeyError):
                continue
    return out


def test_1_4_a_killed_runner_leaves_no_slot_running_and_the_sweep_removes_its_directory(tmp_path, upstream):
    need_sandbox("bwrap")
    tasks = tmp_path / "tasks"
    make_task(tasks, "hang", "hang-k0")
    run = tmp_path / "run"
    proc = start_rollout(str(tasks), *_args(tmp_path, upstream, run, "--samples", "1", "--warm-agents",
                                            "--run-id", "w4"))
    try:
        deadline = time.monotonic() + RUNNER_WAIT_S
        while not _seen_hanging(proc.pid) and proc.poll() is None:  # the agent has called and hangs
            assert time.monotonic() < deadline, "the sample never started"
            time.sleep(0.1)
        dirs = _slot_dirs_of(proc.pid)
        assert len(dirs) == 1
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    deadline = time.monotonic() + RUNNER_WAIT_S
    while _leftovers_on_host():  # the slot's sandbox dies with the runner (bwrap --die-with-parent)
        assert time.monotonic() < deadline, _leftovers_on_host()
        time.sleep(0.1)
    removed, _ = control.sweep_stale_controls()
    assert removed >= 1 and not dirs[0].exists()


def _seen_hanging(runner: int) -> bool:
    """The hanging sample's agent has printed what it saw (before its call and its sleep): it is mid-sample."""
    outs = [d / "io" / "1.stdout" for d in _slot_dirs_of(runner)]
    return any(p.exists() and p.read_text().strip() for p in outs)
