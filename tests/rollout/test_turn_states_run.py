"""polar-rollout --turn-states (rollout/turn_states.py) end to end, in one run shared by the checks: a scripted
four-call python: agent (tests/rollout/turnagent.py) in bwrap behind the runner's own proxy, which announces each call
(polar_announce); tasks with a tests/progress.sh scorer. `steps`: call 2's action does half the work, call 4's the
rest; `background`: a writer the agent started in the background lands in the snapshot of the first call after it
wrote; `failing`: a scorer that exits non-zero gives null and session credit. polar-process runs with --credit turn."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from polar.rollout.flowwatch import FlowCounter
from tests.rollout.rollout_support import HERE, explain, latest, results, rewards, rollout
from tests.support.need import need_sandbox

pytestmark = pytest.mark.integration

AGENT = "python:turnagent:run"
VERIFIER = 'if [ -f "$APP/done.txt" ]; then echo 1 > "$LOGS/reward.txt"; else echo 0 > "$LOGS/reward.txt"; fi\n'
SCORERS = {
    "steps": 'echo "$(( ($( [ -f "$APP/half.txt" ] && echo 1 || echo 0) + $( [ -f "$APP/done.txt" ] && echo 1 '
             '|| echo 0)) ))" | awk \'{print $1 / 2}\' > "$LOGS/reward.txt"\n',
    "background": 'if [ -f "$APP/bg.txt" ]; then echo 1 > "$LOGS/reward.txt"; else echo 0 > "$LOGS/reward.txt"; fi\n',
    "failing": 'echo "the scorer broke" >&2\nexit 1\n',
}
HEAD = "#!/usr/bin/env bash\nAPP=${POLAR_APP:-/app}\nLOGS=${POLAR_LOGS:-/logs/verifier}\n"


def _task(root: Path, name: str) -> None:
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "agent").mkdir()
    (task / "environment" / "workdir").mkdir(parents=True)
    (task / "environment" / "workdir" / "README.md").write_text("start state\n")
    (task / "task.toml").write_text('[metadata]\nauthor = "polar tests"\n')
    mode = "background" if name == "background" else "steps"
    (task / "instruction.md").write_text(f"mode: {mode}\nDo the work in four steps.\n")
    (task / "tests" / "test.sh").write_text(HEAD + VERIFIER)
    (task / "tests" / "progress.sh").write_text(HEAD + SCORERS[name])
    shutil.copyfile(HERE / "turnagent.py", task / "agent" / "turnagent.py")


@pytest.fixture(scope="module")
def run(tmp_path_factory, _upstream_server):
    need_sandbox("bwrap")
    _upstream_server.reset()
    root = tmp_path_factory.mktemp("turn-states")
    for name in SCORERS:
        _task(root / "tasks", name)
    out = root / "run"
    proc = rollout(str(root / "tasks"), "--agent", AGENT, "--out", str(out), "--sandbox", "bwrap", "--upstream",
                   _upstream_server.base_url, "--samples", "2", "--parallel", "6", "--run-id", "ts",
                   "--turn-states", "hold", "--skip-preflight", "--process-opt=--credit=turn", timeout=300)
    assert proc.returncode == 0, explain(proc)
    return out


def _calls(out: Path, session: str) -> list[str]:
    recs = FlowCounter(out / "flows").records(session)
    return [r["id"] for r in sorted(recs, key=lambda r: r["t_start"])]


def _scores(line: dict) -> list[float]:
    return [c["score"] for c in line["turn_scores"]["calls"]]


def test_1_snapshots_are_named_by_call_and_scored_as_the_work_went(run):
    final = latest(results(run))
    for k in (0, 1):
        line = final[("steps", k)]
        assert line["status"] == "completed" and line["reward"] == 1.0, line
        calls = _calls(run, line["session"])
        assert len(calls) == 4 and [c["call_id"] for c in line["turn_scores"]["calls"]] == calls
        assert _scores(line) == [0.0, 0.0, 0.5, 0.5] and line["turn_scores"]["final"] == 1.0
        detail = json.loads((run / "samples" / "steps" / str(k) / "0" / "sample.json").read_text())["turn_states"]
        assert detail["mode"] == "hold" and list(detail["calls"]) == calls and detail["boundaries"] == calls
        assert not any(meta["late"] for meta in detail["calls"].values())
    assert not list(run.glob(".work/**/turn-states")) and not (run / "turn-states" / "control-token").exists()


def test_2_with_hold_a_background_writer_s_change_lands_in_the_first_snapshot_after_it(run):
    final = latest(results(run))
    for k in (0, 1):
        line = final[("background", k)]
        assert _scores(line) == [0.0, 0.0, 1.0, 1.0] and line["turn_scores"]["final"] == 1.0, line


def test_3_a_failing_scorer_gives_null_and_session_credit_counted(run):
    final = latest(results(run))
    assert [final[("failing", k)]["turn_scores"] for k in (0, 1)] == [None, None]
    assert final[("failing", 0)]["reward"] == 1.0  # the verifier's reward stands
    by_session = {r["session"]: r for r in rewards(run)}
    assert all("turn_scores" not in by_session[final[("failing", k)]["session"]] for k in (0, 1))
    assert by_session[final[("steps", 0)]["session"]]["turn_scores"] == final[("steps", 0)]["turn_scores"]
    report = json.loads((run / "out" / "report.json").read_text())
    assert (report["rewards"]["turn_credit"], report["rewards"]["turn_fallback"]) == (4, 2)


def test_4_turn_states_refuse_a_run_without_a_sandbox(tmp_path, upstream):
    _task(tmp_path / "tasks", "steps")
    proc = rollout(str(tmp_path / "tasks"), "--agent", AGENT, "--out", str(tmp_path / "run"), "--sandbox", "none",
                   "--upstream", upstream.base_url, "--turn-states", "async")
    assert proc.returncode == 2 and "--turn-states async needs a sandbox" in proc.stderr, explain(proc)
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_4_2_turn_states_refuse_warm_slots(tmp_path, upstream):
    """A warm slot moves the sample's working directory into itself: nothing would be left where the snapshots look."""
    need_sandbox("bwrap")
    _task(tmp_path / "tasks", "steps")
    proc = rollout(str(tmp_path / "tasks"), "--agent", AGENT, "--out", str(tmp_path / "run"), "--sandbox", "bwrap",
                   "--upstream", upstream.base_url, "--turn-states", "hold", "--warm-agents")
    assert proc.returncode == 2 and "pass --no-warm-agents" in proc.stderr, explain(proc)
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()

def test_5_a_serve_snapshots_every_runs_samples_and_refuses_another_mode(tmp_path, _upstream_server):
    """polar-rollout serve --turn-states hold (what polar-train's --rollout-opt=--turn-states=hold starts): one
    announce endpoint for every run it serves — two runs one after the other both get their sessions scored (the
    first run's end does not close it) —, a request asking another mode is refused in one line, and the serve's end
    removes its token."""
    from polar.rollout import serve_protocol as sp
    from tests.rollout.test_serve import _ended, _ready, _start

    need_sandbox("bwrap")
    _task(tmp_path / "tasks", "steps")
    directory = tmp_path / "serve"
    proc = _start(directory, _upstream_server.base_url, "--sandbox", "bwrap", "--skip-preflight", "--turn-states",
                  "hold", "--parallel", "2")
    _ready(directory, proc)
    assert sp.Ready.from_json(json.loads((directory / sp.READY).read_text())).turn_states == "hold"
    try:
        for n in (1, 2):
            req = sp.RolloutRequest(out=str(tmp_path / f"run-{n}"), tasks=(str(tmp_path / "tasks"),), agent=AGENT,
                                    samples=1, run_id=f"served-{n}", process_opt=("--credit=turn",))
            got = sp.wait(directory, sp.submit(directory, req), 180)
            assert (got.exit, got.error) == (0, None), Path(got.log).read_text()
            line = latest(results(tmp_path / f"run-{n}"))[("steps", 0)]
            assert _scores(line) == [0.0, 0.0, 0.5, 0.5] and line["turn_scores"]["final"] == 1.0, line
        bad = sp.RolloutRequest(out=str(tmp_path / "run-3"), tasks=(str(tmp_path / "tasks"),), agent=AGENT,
                                extra_args=("--turn-states", "async"))
        got = sp.wait(directory, sp.submit(directory, bad), 60)
        assert got.exit == 2 and "this serve runs --turn-states hold" in got.error, got
    finally:
        sp.request_stop(directory)
        _ended(proc, directory)
    assert not (directory / "turn-states" / "control-token").exists()


STEP_REPLIES = ("1111", "ab", "12ab")  # digit shares 1, 0, ½: the notes' mean after each reply is ⅓, ⅓, ½


def _step_policy(body: dict, prompt_ids: list[int]):
    from tests.support.scripted_upstream import Reply

    done = sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")
    return Reply(text=STEP_REPLIES[min(done, len(STEP_REPLIES) - 1)]), True


def test_6_the_steps_agent_on_digit_steps_is_scored_reply_by_reply(tmp_path, upstream, monkeypatch):
    """examples/tasks/families/digit-steps with python:polar.rollout.sdk_agent:steps (OpenAI Chat for sample 0,
    Anthropic Messages for sample 1): three calls in one conversation, reply N saved as noteN.txt before call N+1, so
    tests/progress.sh at the calls scores 0, ⅓, ⅓ and the final state ½ — the reward."""
    need_sandbox("bwrap")
    monkeypatch.setattr(upstream, "_next_reply", _step_policy, raising=False)
    task = tmp_path / "tasks" / "digit-steps-000"
    shutil.copytree(HERE.parents[1] / "examples" / "tasks" / "families" / "digit-steps" / "train" / task.name, task)
    out = tmp_path / "run"
    proc = rollout(str(task.parent), "--agent", "python:polar.rollout.sdk_agent:steps", "--out", str(out), "--sandbox",
                   "bwrap", "--upstream", upstream.base_url, "--samples", "2", "--parallel", "2", "--run-id", "steps",
                   "--turn-states", "hold", "--skip-preflight", "--process-opt=--credit=turn", timeout=300)
    assert proc.returncode == 0, explain(proc)
    final = latest(results(out))
    for k in (0, 1):
        line = final[(task.name, k)]
        assert line["status"] == "completed" and line["reward"] == 0.5, line
        assert len(_calls(out, line["session"])) == 3
        assert _scores(line) == pytest.approx([0.0, 1 / 3, 1 / 3], abs=1e-6) and line["turn_scores"]["final"] == 0.5
    report = json.loads((out / "out" / "report.json").read_text())
    assert report["rewards"]["turn_credit"] == 2


def test_7_an_image_tasks_states_are_overlay_views_scored_in_its_image(tmp_path, images, cache_dir, upstream):
    """An image task (its WORKDIR from a Dockerfile) in bwrap: where the runner mounts overlays the sample's working
    directory is one, and so is each state the scorer sees (the snapshot laid over the image's WORKDIR as a layer,
    rollout/turn_states.state_view) — scored as the host-view task above, every view unmounted after."""
    from polar.rollout import overlay
    from tests.rollout.rollout_support import rollout_env

    need_sandbox("bwrap")
    _task(tmp_path / "tasks", "steps")
    task = tmp_path / "tasks" / "steps"
    shutil.rmtree(task / "environment" / "workdir")
    (task / "environment" / "Dockerfile").write_text(
        "FROM python:3.12-slim\nWORKDIR /app\nRUN echo 'start state' > /app/README.md\n")
    out = tmp_path / "run"
    proc = rollout(str(tmp_path / "tasks"), "--agent", AGENT, "--out", str(out), "--sandbox", "bwrap", "--upstream",
                   upstream.base_url, "--samples", "1", "--run-id", "ts-image", "--turn-states", "hold",
                   "--skip-preflight", "--no-process", "--image-map", f"@{images['map']}", "--pull", "never",
                   "--build-network", "none", timeout=300, env=rollout_env(DOCKER_HOST=images["host"]))
    assert proc.returncode == 0, explain(proc)
    line = latest(results(out))[("steps", 0)]
    assert line["status"] == "completed" and line["reward"] == 1.0, line
    assert _scores(line) == [0.0, 0.0, 0.5, 0.5] and line["turn_scores"]["final"] == 1.0, line
    sample = json.loads((out / "samples" / "steps" / "0" / "0" / "sample.json").read_text())
    assert sample["workdir_view"] == ("overlay" if overlay.why_no_overlay(str(out / ".work")) is None else "copy")
    assert not list((out / ".work").iterdir()) and not any(
        point.startswith(str(out)) for point, _ in overlay._overlay_mounts())
