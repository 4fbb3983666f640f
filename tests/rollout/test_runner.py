"""polar-rollout end to end (docs/contracts.md#polar-rollout), `--sandbox none` unless said otherwise: a python: agent
(tests/rollout/testagent.py, the official openai SDK through HTTPS_PROXY) against the scripted upstream behind the
runner's own proxy.

1.x  statuses, results.jsonl / rewards.jsonl exactly, group advantages ±1, RUN's files, the preflight's sessions
     left out of processing; every fault status of the table
2.x  exit codes: no reward (1, with --retry-infra), bad input (2), a sandboxed run on a proxy that tunnels (2)
3.x  kill -9 mid-run then --resume (one latest attempt per sample, no duplicate reward), Ctrl-C (130); kill -9 takes
     an unsandboxed agent's whole tree with it, and the next run sweeps the dead runner's control directory
4.x  the preflight refuses a backend without token ids
5.x  --sandbox bwrap, --engine ray, a --proxy-json proxy
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
import urllib.request
from pathlib import Path

import polars as pl
import pytest

from polar.rollout.flowwatch import FlowCounter
from polar.rollout.ledger import RESULT_FIELDS
from polar.rollout.procs import is_alive, is_our_proxy
from tests.rollout.rollout_support import (AGENT, explain, latest, make_task, results, rewards, rollout, rollout_env,
                                           start_rollout)
from tests.support.need import need_module, need_sandbox

pytestmark = pytest.mark.integration
# 3.2: the hanging agent's own timeout; a run that ends before it was ended by the Ctrl-C, not by its agent
HANG_AGENT_TIMEOUT_S = 120


def _base(tmp_path: Path, upstream, *extra: str) -> list[str]:
    return ["--agent", AGENT, "--out", str(tmp_path / "run"), "--sandbox", "none", "--upstream", upstream.base_url,
            "--parallel", "2", *extra]


def _sequences(run: Path) -> pl.DataFrame:
    return pl.read_parquet(run / "out" / "sequences.parquet")


# ---------------------------------------------------------------------------------------------------- 1. statuses

def test_1_1_a_group_solved_in_k01_and_failed_in_k23_gets_advantages_plus_minus_one(tmp_path, upstream):
    tasks = tmp_path / "tasks"
    make_task(tasks, "six-times-seven", "solve-k01")
    run = tmp_path / "run"
    proc = rollout(str(tasks), *_base(tmp_path, upstream, "--samples", "4", "--run-id", "r1"))
    assert proc.returncode == 0, explain(proc)
    lines = results(run)
    assert len(lines) == 4 and all(list(line) == list(RESULT_FIELDS) for line in lines)
    by_k = {line["k"]: line for line in lines}
    for k, line in by_k.items():
        assert line["session"] == f"r1/six-times-seven/{k}/0" and line["group"] == "r1/six-times-seven"
        assert (line["run_id"], line["task"], line["attempt"], line["agent"], line["sandbox"]) == (
            "r1", "six-times-seven", 0, AGENT, "none")
        assert line["status"] == "completed" and line["agent_exit"] == 0 and line["error"] is None
        assert line["reward"] == (1.0 if k < 2 else 0.0)
        assert line["reward_details"] == {"reward": line["reward"], "answer": "42" if k < 2 else "41"}
        assert line["calls"] == 1 and line["trainable_tokens"] > 0
        assert set(line["timings"]) == {"setup", "agent", "verify", "teardown"} and line["t_end"] >= line["t_start"]
    # rewards.jsonl: exactly the rewarded latest attempts, the reward exactly as in results
    assert rewards(run) == [{"session": f"r1/six-times-seven/{k}/0", "reward": by_k[k]["reward"],
                             "group": "r1/six-times-seven"} for k in range(4)]
    seqs = _sequences(run)
    adv = {row["session"]: row["advantage"] for row in seqs.iter_rows(named=True)}
    assert adv == {f"r1/six-times-seven/{k}/0": (1.0 if k < 2 else -1.0) for k in range(4)}
    report = json.loads((run / "out" / "report.json").read_text())
    assert report["counts"]["sessions"] == 4
    assert report["counts"]["sessions_other_prefix"] == 2  # the preflight's canary call and canary sample
    doc = json.loads((run / "run.json").read_text())
    assert doc["run_id"] == "r1" and doc["preflight"]["passed"] is True and doc["isolation_safe"] is False
    assert doc["tasks"] == ["six-times-seven"] and doc["samples"] == 4 and doc["sandbox"] == "none"
    sample = run / "samples" / "six-times-seven" / "0" / "0"
    assert sorted(p.name for p in sample.iterdir()) == ["agent.stderr", "agent.stdout", "final.diff", "sample.json",
                                                        "verifier", "verifier.log"]
    assert "+++ b/answer.txt" in (sample / "final.diff").read_text() and "+42" in (sample / "final.diff").read_text()
    assert json.loads((sample / "verifier" / "reward.json").read_text())["reward"] == 1.0
    assert json.loads((sample / "sample.json").read_text())["session"] == "r1/six-times-seven/0/0"
    assert "not isolation-safe" in proc.stdout and "completed 4" in proc.stdout
    assert "preflight passed" in proc.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["isolation_safe"] is False and summary["per_task"]["six-times-seven"]["spread"] is True
    assert not list((run / "flows").glob("*.open"))  # the runner's proxy was stopped (files closed) before processing
    # exact mode by default (no --proxy-set): the runner's proxy says so, and every call of the run carries exact
    # mode's report (its record's `exact` map; nil when polar_exact is off; this scripted upstream echoes its own
    # render, so the path it reports is `normal` with fallback mode_refused)
    assert doc["proxy"]["exact"] is True
    from polar.records.flowdir import expand_inputs, iter_files

    calls = [rec for _, _, rec in iter_files(expand_inputs([str(run / "flows")]))
             if str(rec.get("session") or "").startswith("r1/six-times-seven/")]
    assert len(calls) == 4 and all(rec.get("exact") is not None for rec in calls), calls
    # the report shows token text without --vocab: the backend's /v1/models names its tokenizer's directory
    served = json.loads(urllib.request.urlopen(f"{upstream.base_url}/models", timeout=5).read())["data"][0]
    assert f"--vocab={served['id']}={served['root']}" in (run / "process.log").read_text().splitlines()[0]
    assert "token text (--vocab)" in (run / "out" / "report.html").read_text()


def test_1_2_every_fault_gets_its_status_and_reward_rule(tmp_path, upstream):
    tasks = tmp_path / "tasks"
    make_task(tasks, "exits-3", "fail-after-call")
    make_task(tasks, "raises", "raise-after-call")
    make_task(tasks, "hangs", "hang-after-call", agent_timeout=10)  # past the SDK import on a busy machine
    make_task(tasks, "no-call", "no-call")
    make_task(tasks, "verifier-crash", "solve", verifier="crash")
    make_task(tasks, "verifier-hangs", "solve", verifier="hang", verify_timeout=1)
    make_task(tasks, "reward-txt", "solve", verifier="txt")
    run = tmp_path / "run"
    proc = rollout(str(tasks), *_base(tmp_path, upstream, "--samples", "1", "--skip-preflight", "--run-id", "r2"))
    assert proc.returncode == 0, explain(proc)
    got = {line["task"]: line for line in results(run)}
    assert {t: (ln["status"], ln["reward"]) for t, ln in got.items()} == {
        "exits-3": ("agent_error", 1.0),  # verified and rewarded
        "raises": ("agent_error", 0.0),
        "hangs": ("agent_timeout", 0.0),
        "no-call": ("infra_error", None),
        "verifier-crash": ("verifier_error", None),
        "verifier-hangs": ("verifier_timeout", 0.0),
        "reward-txt": ("completed", 1.0),
    }
    assert got["exits-3"]["agent_exit"] == 3 and got["raises"]["agent_exit"] == 1
    stderr = (run / "samples" / "raises" / "0" / "0" / "agent.stderr").read_text()
    assert "Traceback" in stderr and "RuntimeError: the test agent gives up" in stderr
    assert got["hangs"]["agent_exit"] is None and got["hangs"]["calls"] == 1
    assert got["no-call"]["calls"] == 0 and "no call with token ids" in got["no-call"]["error"]
    assert "no reward.json or reward.txt" in got["verifier-crash"]["error"]
    assert "the verifier crashed" in (run / "samples" / "verifier-crash" / "0" / "0" / "verifier.log").read_text()
    assert got["reward-txt"]["reward_details"] is None
    rewarded = {r["session"].split("/")[1]: r["reward"] for r in rewards(run)}
    assert rewarded == {"exits-3": 1.0, "raises": 0.0, "hangs": 0.0, "verifier-hangs": 0.0, "reward-txt": 1.0}
    # the timed-out agent's one call is processed (a partial trace), with its 0.0
    seqs = _sequences(run)
    hangs = seqs.filter(pl.col("session") == "r2/hangs/0/0")
    assert hangs.height == 1 and hangs["reward"][0] == 0.0
    assert set(seqs["session"]) == {f"r2/{t}/0/0" for t in got if t != "no-call"}


def test_1_3_an_agent_killed_mid_answer_is_agent_timeout_once_the_proxy_has_recorded_its_call(tmp_path, upstream):
    """The agent's timeout kills it in the middle of a streamed answer: the proxy writes that call's record (a
    client_abort, its tokens so far) only at its next write to the gone agent, after the sandbox has ended. The
    status comes from the records once written — agent_timeout, 0.0, trained — never from a count that raced them
    (infra_error, "none with token ids")."""
    from tests.support.scripted_upstream import Reply

    tasks = tmp_path / "tasks"
    make_task(tasks, "mid-answer", "stream-gated", agent_timeout=20)  # past the SDK import on a busy machine
    upstream.script(Reply(text="Six times seven is forty-two. " * 8, gate=True))  # parked after its first chunk
    run = tmp_path / "run"
    eot = upstream.tokenizer.token_to_id("<|im_end|>")  # no call of this run stops naturally: no evidence of it
    proc = start_rollout(str(tasks), *_base(tmp_path, upstream, "--samples", "1", "--skip-preflight", "--run-id",
                                            "r13", f"--process-opt=--eot-token-id={eot}"))
    try:
        assert upstream.wait_for_gate(timeout=90), "the agent's streamed call did not reach the upstream"
        found = lambda: list((run / ".work").glob("*/app/pids.json")) if (run / ".work").is_dir() else []
        _wait_for(found, 30, proc)
        pid = json.loads(found()[0].read_text())["agent"]
        _wait_for(lambda: not is_alive(pid), 60, proc)  # killed at its timeout, mid-answer
        time.sleep(1.0)  # the sandbox is gone and the runner has counted: no record of that call yet
        upstream.release()  # the stream goes on; the proxy's next write finds the agent gone: the record
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    [line] = results(run)
    assert (line["status"], line["reward"], line["agent_exit"]) == ("agent_timeout", 0.0, None), line
    assert line["calls"] == 1 and line["trainable_tokens"] > 0
    assert rewards(run) == [{"session": "r13/mid-answer/0/0", "reward": 0.0, "group": "r13/mid-answer"}]
    seqs = _sequences(run).filter(pl.col("session") == "r13/mid-answer/0/0")
    assert seqs.height == 1 and seqs["reward"][0] == 0.0  # its partial answer is trained, with its 0.0


# ---------------------------------------------------------------------------------------------------- 2. exit codes

def test_2_1_no_reward_at_all_exits_1_after_the_infra_retries(tmp_path, upstream):
    tasks = tmp_path / "tasks"
    make_task(tasks, "no-call", "no-call")
    run = tmp_path / "run"
    proc = rollout(str(tasks), *_base(tmp_path, upstream, "--samples", "1", "--skip-preflight", "--retry-infra", "1",
                                      "--run-id", "r3"))
    assert proc.returncode == 1, explain(proc)
    lines = results(run)
    assert [(ln["attempt"], ln["status"]) for ln in lines] == [(0, "infra_error"), (1, "infra_error")]
    assert lines[1]["session"] == "r3/no-call/0/1"
    assert rewards(run) == []
    assert "rewards   none" in proc.stdout


def _cli(argv, capsys) -> tuple[int, str]:
    from polar.rollout import cli

    code = cli.main(argv)
    return code, capsys.readouterr().err


def test_2_2_bad_input_exits_2_with_one_line(tmp_path, capsys):
    tasks = tmp_path / "tasks"
    make_task(tasks, "ok", "solve")
    out = tmp_path / "run"
    base = [str(tasks), "--out", str(out), "--sandbox", "none", "--upstream", "http://127.0.0.1:9/v1"]
    cases = [
        ([*base, "--agent", "cursor"], "unknown agent 'cursor'"),
        ([*base, "--agent", "python:nocolon"], "expected python:MODULE:FUNC"),
        ([*base, "--agent", "codex:openai"], "only pi takes a provider"),
        ([*base, "--agent", AGENT, "--resume"], "has no run.json"),
        ([*base, "--agent", AGENT, "--image", "x"], "--image runs every task in that image: it needs --sandbox"),
        ([*base, "--agent", AGENT, "--proxy-set", "polar_flows=/x"], "writes to RUN/flows"),
        ([str(tmp_path / "missing"), "--out", str(out), "--agent", AGENT, "--sandbox", "none"], "no such file"),
    ]
    for argv, message in cases:
        code, err = _cli(argv, capsys)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (argv, err)
    make_task(tmp_path / "reserved", "preflight", "solve")
    code, err = _cli([str(tmp_path / "reserved"), *base[1:], "--agent", AGENT], capsys)
    assert code == 2 and "reserved" in err
    out.mkdir()
    (out / "something").write_text("x")
    code, err = _cli([*base, "--agent", AGENT], capsys)
    assert code == 2 and "is not empty; pass --resume" in err


def test_2_3_a_sandboxed_run_refuses_a_proxy_that_tunnels_other_hosts(tmp_path, gateway, capsys, monkeypatch):
    from polar.rollout.sandbox import registry

    monkeypatch.setattr(registry, "available", lambda kind: None)  # the check under test comes before any sandbox
    tasks = tmp_path / "tasks"
    make_task(tasks, "ok", "solve")
    code, err = _cli([str(tasks), "--agent", AGENT, "--out", str(tmp_path / "run"), "--sandbox", "bwrap",
                      "--proxy-json", os.path.join(gateway.run_dir, "proxy.json")], capsys)
    assert code == 2 and "other_hosts: 'tunnel'" in err and "polar_other_hosts=refuse" in err


# ---------------------------------------------------------------------------------------------------- 3. resume, Ctrl-C

def _wait_for(predicate, timeout: float, proc=None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"polar-rollout ended early: {proc.returncode}\n{proc.stderr.read()[-3000:]}")
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)


def test_3_1_kill_9_mid_run_then_resume_gives_every_sample_one_latest_attempt(tmp_path, upstream):
    tasks = tmp_path / "tasks"
    make_task(tasks, "slow", "slow")
    run = tmp_path / "run"
    args = [str(tasks), *_base(tmp_path, upstream, "--samples", "2", "--skip-preflight", "--run-id", "r4")]
    proc = start_rollout(*args, env=rollout_env(POLAR_TEST_SLOW="4"))  # k=0 ends first, k=1 is still running
    try:
        _wait_for(lambda: len(results(run)) >= 1, 90, proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    first = results(run)
    old_proxy = json.loads((run / "run.json").read_text())["proxy"]["pid"]
    deadline = time.monotonic() + 30  # the proxy is tied to its runner: SIGTERM at the kill, its flow files closed
    while is_alive(old_proxy) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not is_alive(old_proxy), "the killed runner's proxy is still up"
    other = rollout("--out", str(run), "--resume", "--samples", "3")  # the run's identity must not change
    assert other.returncode == 2 and "--samples 2 → 3" in other.stderr, explain(other)
    done = rollout("--out", str(run), "--resume", "--skip-preflight", env=rollout_env(POLAR_TEST_SLOW="0"))
    assert done.returncode == 0, explain(done)
    assert "stopped the previous attempt's proxy" not in done.stderr  # nothing was left to stop
    lines = results(run)
    assert lines[:len(first)] == first  # appended, never rewritten
    final = latest(lines)
    assert sorted(final) == [("slow", 0), ("slow", 1)]
    assert all(line["status"] == "completed" and line["reward"] == 1.0 for line in final.values())
    for line in lines:  # an attempt in flight at the kill has a line of its own now, and was run again
        if line["status"] == "cancelled":
            assert "found at --resume" in line["error"]
            assert final[(line["task"], line["k"])]["attempt"] > line["attempt"]
    keys = [(ln["task"], ln["k"], ln["attempt"]) for ln in lines]
    assert len(keys) == len(set(keys))
    rw = rewards(run)
    assert sorted(r["session"] for r in rw) == sorted(ln["session"] for ln in final.values())
    assert len({r["session"].rsplit("/", 1)[0] for r in rw}) == len(rw) == 2  # one reward line per sample
    assert [ln["status"] for ln in lines if ln["k"] == 1][:1] == ["cancelled"]  # k=1 was in flight at the kill
    assert not list((run / "flows").glob("*.open"))


def test_3_2_ctrl_c_cancels_cleanly_with_exit_130(tmp_path, upstream):
    tasks = tmp_path / "tasks"
    make_task(tasks, "hangs", "hang-after-call", agent_timeout=HANG_AGENT_TIMEOUT_S)
    run = tmp_path / "run"
    proc = start_rollout(str(tasks), *_base(tmp_path, upstream, "--samples", "1", "--skip-preflight", "--run-id",
                                            "r5"))
    try:
        counter = FlowCounter(run / "flows")
        _wait_for(lambda: counter.counts("r5/hangs/0/0")[1] >= 1, 90, proc)  # it called the model, then hangs
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=HANG_AGENT_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert time.monotonic() - t0 < HANG_AGENT_TIMEOUT_S  # ended by the Ctrl-C: before the agent's own timeout
    [line] = results(run)
    assert (line["status"], line["reward"], line["calls"]) == ("cancelled", None, 1)
    assert "continue with --resume" in err
    doc = json.loads((run / "run.json").read_text())
    assert not is_alive(doc["proxy"]["pid"])  # the proxy was stopped, its files closed
    assert not list((run / "flows").glob("*.open")) and list((run / "flows").glob("*.msgpack"))


def test_3_3_kill_9_of_the_runner_ends_its_unsandboxed_agents_and_resume_sweeps_their_control_dir(tmp_path, upstream):
    """--sandbox none has no namespace to die with: the agent, its child and a child in a session of its own must
    still end with the runner; the dead runner's control directory is left, and the next run removes it."""
    tasks = tmp_path / "tasks"
    make_task(tasks, "spawns", "spawn-hang")
    run = tmp_path / "run"
    tmp = tempfile.mkdtemp(prefix="polar-t-")  # short: the control dir (and its socket) goes here, not /tmp
    try:
        proc = start_rollout(str(tasks), *_base(tmp_path, upstream, "--samples", "1", "--skip-preflight",
                                                "--run-id", "r12"), env=rollout_env(POLAR_TEST_HANG="1", TMPDIR=tmp))
        try:
            found = lambda: list((run / ".work").glob("*/app/pids.json")) if (run / ".work").is_dir() else []
            _wait_for(lambda: found() and found()[0].read_text().endswith("}"), 90, proc)
            pids = json.loads(found()[0].read_text())
            assert all(is_alive(pids[k]) for k in ("agent", "child", "detached")), pids
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
        try:
            _wait_for(lambda: not any(is_alive(pids[k]) for k in ("agent", "child", "detached")), 30)
        finally:
            for k in ("agent", "child", "detached"):  # before the fix they lived on: do not leave them to the machine
                if is_alive(pids[k]):
                    os.kill(pids[k], signal.SIGKILL)
        control = Path(pids["control"] or "/nonexistent")
        assert control.parent == Path(tmp) and (control / "owner.json").is_file()  # a runner killed with -9 leaves it
        done = rollout("--out", str(run), "--resume", "--skip-preflight", env=rollout_env(TMPDIR=tmp))
        assert done.returncode == 0, explain(done)
        assert not control.exists() and "removed 1 sandbox control dir(s) of dead runs" in done.stderr
        assert latest(results(run))[("spawns", 0)]["status"] == "completed"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------- 4. preflight

def _processes_naming(path: Path) -> list[int]:
    """Live processes whose command line names `path` (the runner's proxy names its run directory)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(path) in cmdline and int(pid) != os.getpid():
            found.append(int(pid))
    return found


def test_4_1_the_preflight_refuses_a_backend_without_token_ids(tmp_path, upstream):
    from tests.support.scripted_upstream import Reply

    tasks = tmp_path / "tasks"
    make_task(tasks, "ok", "solve")
    upstream.script(Reply(text="ok", fault="no_token_ids"))
    run = tmp_path / "run"
    run.mkdir()  # an empty --out: a run refused before its first sample leaves it empty (issue 37)
    # normal mode: exact mode's probe call would take the one scripted reply
    proc = rollout(str(tasks), *_base(tmp_path, upstream, "--run-id", "r6", "--proxy-set", "polar_exact=false"))
    assert proc.returncode == 2, explain(proc)
    err = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(err) == 1 and "preflight: the backend" in err[0] and "returned no token ids" in err[0]
    assert run.is_dir() and list(run.iterdir()) == []  # no run.json, .lock, flows: the retry needs no --resume
    assert _processes_naming(run) == []  # its proxy was stopped


# ---------------------------------------------------------------------------------------------------- 5. other paths

def test_5_1_bwrap_runs_the_python_agent_sandboxed(tmp_path, upstream):
    need_sandbox("bwrap")
    tasks = tmp_path / "tasks"
    make_task(tasks, "six-times-seven", "solve-k01")
    run = tmp_path / "run"
    args = ["--agent", AGENT, "--out", str(run), "--sandbox", "bwrap", "--upstream", upstream.base_url,
            "--samples", "2", "--parallel", "2", "--run-id", "r7"]
    proc = rollout(str(tasks), *args)
    assert proc.returncode == 0, explain(proc)
    final = latest(results(run))
    assert {k: (ln["status"], ln["reward"]) for (_, k), ln in final.items()} == {0: ("completed", 1.0),
                                                                                 1: ("completed", 1.0)}
    doc = json.loads((run / "run.json").read_text())
    assert doc["isolation_safe"] is True and doc["proxy"]["other_hosts"] == "refuse"
    assert "not isolation-safe" not in proc.stdout


def test_5_2_engine_ray_runs_each_sample_as_a_ray_task(tmp_path, upstream):
    need_module("ray")  # in [dev]: scripts/setup installs it
    tasks = tmp_path / "tasks"
    make_task(tasks, "six-times-seven", "solve-k01")
    run = tmp_path / "run"
    proc = rollout(str(tasks), *_base(tmp_path, upstream, "--samples", "2", "--skip-preflight", "--engine", "ray",
                                      "--run-id", "r8"), timeout=240)
    assert proc.returncode == 0, explain(proc)
    final = latest(results(run))
    assert [final[("six-times-seven", k)]["reward"] for k in (0, 1)] == [1.0, 1.0]
    assert "engine ray" in proc.stderr


def test_5_3_a_running_proxy_through_proxy_json(tmp_path, gateway):
    tasks = tmp_path / "tasks"
    make_task(tasks, "six-times-seven", "solve")
    run = tmp_path / "run"
    proc = rollout(str(tasks), "--agent", AGENT, "--out", str(run), "--sandbox", "none", "--samples", "1",
                   "--proxy-json", os.path.join(gateway.run_dir, "proxy.json"), "--run-id", "r9")
    assert proc.returncode == 0, explain(proc)
    [line] = results(run)
    assert line["status"] == "completed" and line["reward"] == 1.0
    assert not (run / "flows").exists()  # the records are in that proxy's own flow directory
    report = json.loads((run / "out" / "report.json").read_text())
    assert report["counts"]["sessions"] == 1 and report["counts"]["sessions_other_prefix"] >= 2
    assert is_our_proxy(gateway.state["pid"])  # a proxy the runner did not start is left running


def test_4_2_the_preflight_names_an_agent_that_does_not_trust_the_ca(tmp_path, upstream):
    tasks = tmp_path / "tasks"
    make_task(tasks, "ok", "solve")
    run = tmp_path / "run"
    proc = rollout(str(tasks), *_base(tmp_path, upstream, "--run-id", "r10"), env=rollout_env(POLAR_TEST_DISTRUST="1"))
    assert proc.returncode == 2, explain(proc)
    assert "does not trust the proxy's CA" in proc.stderr and "session r10/preflight/1" in proc.stderr
    assert not run.exists()  # --out was absent: a run refused before its first sample removes what it made


def test_5_4_docker_runs_the_python_agent_in_a_container(tmp_path, upstream, dockerd):
    tasks = tmp_path / "tasks"
    make_task(tasks, "six-times-seven", "solve-k01")
    run = tmp_path / "run"
    args = ["--agent", AGENT, "--out", str(run), "--sandbox", "docker", "--upstream", upstream.base_url,
            "--samples", "1", "--skip-preflight", "--run-id", "r11"]
    proc = rollout(str(tasks), *args, env=rollout_env(DOCKER_HOST=dockerd))
    assert proc.returncode == 0, explain(proc)
    [line] = results(run)
    assert (line["status"], line["reward"], line["sandbox"]) == ("completed", 1.0, "docker")
