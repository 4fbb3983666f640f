"""polar-rollout serve (docs/contracts.md#polar-rollout-serve): one serve for the module (the scripted upstream, a real
mitmdump proxy, bwrap), python agent tests/rollout/testagent.py; the lifecycle on serves of their own (--sandbox
none, no --agent: a start is the proxy and the canary call).

1.x  ready.json; two requests at once, each a whole polar-rollout RUN holding only its own sessions; bad requests get
     exit 2 and one line, and the serve goes on
2.x  the end: DIR/stop, SIGTERM with a run in flight (130, its agent and the proxy gone), the parent's death, a
     SIGKILL (the proxy ends with it); bad start-up input
3.x  the protocol module: a request's round trip and command line
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from polar.rollout import serve_protocol as sp
from tests.rollout.rollout_support import AGENT, make_task, rollout_env
from tests.support.need import need_sandbox
from tests.support.servers import pid_alive, pid_gone

pytestmark = pytest.mark.integration
START_S = 120  # a serve's start: mitmdump's own start-up and the canary sample, on a loaded 2-core CI machine
RUN_S = 180  # one request of a few one-call samples, processing included, on that machine
END_S = 60  # a serve's end: cancelled runs write their lines, the proxy closes its flow files


def _start(directory: Path, upstream_url: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "polar.rollout.cli", "serve", str(directory), "--upstream",
                             upstream_url, *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=rollout_env(), stdin=subprocess.DEVNULL)


def _ready(directory: Path, proc: subprocess.Popen) -> sp.Ready:
    try:
        return sp.wait_ready(directory, START_S, pid=proc.pid)
    except (sp.ServeEnded, TimeoutError) as exc:
        proc.kill()
        pytest.fail(f"{exc}\n{proc.communicate(timeout=30)[0]}")


def _ended(proc: subprocess.Popen, directory: Path) -> dict:
    try:
        code = proc.wait(END_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the serve did not end:\n{proc.communicate(timeout=30)[0]}")
    doc = sp.ended(directory)
    assert doc is not None and doc["exit"] == code, proc.stdout.read()
    return doc


@pytest.fixture(scope="module")
def served(tmp_path_factory, _upstream_server):
    """(DIR, Ready, task roots) of the module's serve: bwrap, --agent preflighted on task a."""
    need_sandbox("bwrap")
    root = tmp_path_factory.mktemp("serve")
    tasks = {"a": make_task(root / "tasks-a", "six-a", "solve-k01").parent,
             "b": make_task(root / "tasks-b", "six-b", "solve").parent,
             "c": make_task(root / "tasks-c", "six-c", "solve").parent}
    directory = root / "serve"
    proc = _start(directory, _upstream_server.base_url, "--sandbox", "bwrap", "--agent", AGENT,
                  "--preflight-task", str(tasks["a"] / "six-a"), "--parallel", "4")
    ready = _ready(directory, proc)
    yield directory, ready, tasks
    sp.request_stop(directory)
    _ended(proc, directory)
    assert pid_gone(ready.proxy_pid)


def _request(tmp_path: Path, name: str, tasks: Path, samples: int, run_id: str, **kw) -> sp.RolloutRequest:
    return sp.RolloutRequest(out=str(tmp_path / name), tasks=(str(tasks),), agent=AGENT, samples=samples,
                             run_id=run_id, parallel=2, **kw)


def _sessions(run: Path) -> set[str]:
    return set(pl.read_parquet(run / "out" / "sequences.parquet")["session"].to_list())


# ------------------------------------------------------------------------------------------------ 1. serving

def test_1_1_ready_json_names_a_live_proxy_that_refuses_other_hosts_and_the_preflight_that_passed(served):
    from polar.launch import proxy as launch_proxy

    directory, ready, _ = served
    assert ready.pid != os.getpid() and ready.sandbox == "bwrap" and ready.slots == 4
    assert ready.preflight["passed"] is True and ready.preflight["agent"] == AGENT
    assert Path(ready.proxy_json).is_file() and Path(ready.flows) == directory / "flows"
    info = launch_proxy.health(ready.port)
    assert info["ready"] is True and info["other_hosts"] == "refuse"


def test_1_2_two_requests_at_once_are_two_whole_runs_each_with_only_its_own_sessions(served, tmp_path):
    directory, ready, tasks = served
    a = sp.submit(directory, _request(tmp_path, "run-a", tasks["a"], 4, "ra"))
    b = sp.submit(directory, _request(tmp_path, "run-b", tasks["b"], 2, "rb"))
    got = {n: sp.wait(directory, n, RUN_S) for n in (a, b)}
    assert [(r.exit, r.error) for r in got.values()] == [(0, None), (0, None)], [Path(r.log).read_text()
                                                                                  for r in got.values()]
    assert got[a].t_start < got[b].t_end and got[b].t_start < got[a].t_end  # in flight at the same time
    for name, run, run_id, task, k in ((a, "run-a", "ra", "six-a", 4), (b, "run-b", "rb", "six-b", 2)):
        out = tmp_path / run
        assert got[name].out == str(out)
        lines = [json.loads(ln) for ln in (out / "results.jsonl").read_text().splitlines()]
        assert sorted(ln["session"] for ln in lines) == [f"{run_id}/{task}/{i}/0" for i in range(k)]
        assert all(ln["status"] == "completed" and ln["sandbox"] == "bwrap" for ln in lines)
        doc = json.loads((out / "run.json").read_text())
        assert doc["preflight"]["passed"] is True and doc["preflight"]["served_by"] == str(directory)
        assert doc["proxy"]["own"] is False and doc["proxy"]["port"] == ready.port
        assert doc["processed"]["exit"] == 0 and any((out / "out" / "batches").iterdir())
        assert _sessions(out) == {f"{run_id}/{task}/{i}/0" for i in range(k)}
        assert json.loads((out / "summary.json").read_text())["exit_code"] == 0
    seqs = pl.read_parquet(tmp_path / "run-a" / "out" / "sequences.parquet")
    assert {r["session"]: r["advantage"] for r in seqs.iter_rows(named=True)} == {
        f"ra/six-a/{i}/0": (1.0 if i < 2 else -1.0) for i in range(4)}
    assert "no preflight" not in Path(got[a].log).read_text()
    assert pid_gone(ready.pid) is False and pid_gone(ready.proxy_pid) is False  # still serving


@pytest.mark.parametrize("name,body,line", [
    ("bad-1", "{not json", "request bad-1: Expecting property name"),
    ("bad-2", json.dumps({"out": "x", "tasks": ["t"], "colour": "red"}), "request bad-2: unknown field(s) colour"),
    ("bad-3", json.dumps({"tasks": ["t"]}), "request bad-3: missing field(s) out"),
    ("bad-4", json.dumps({"out": "x", "samples": "four"}), "request bad-4: field samples: expected int or null"),
])
def test_1_3_a_malformed_request_gets_exit_2_and_one_line(served, name, body, line):
    directory, _, _ = served
    tmp = directory / sp.REQUESTS / f".{name}.tmp"  # written whole, as a client must: a hidden name, then the rename
    tmp.write_text(body)
    os.replace(tmp, sp.request_path(directory, name))
    got = sp.wait(directory, name, RUN_S)
    assert got.exit == 2 and got.error.startswith(line) and "\n" not in got.error


@pytest.mark.parametrize("extra,line", [
    ({"extra_args": ("--upstream", "http://127.0.0.1:9/v1")}, "--upstream: the serve's, not a run's"),
    ({"sandbox": "none"}, "--sandbox none: this serve runs --sandbox bwrap"),
    ({"extra_args": ("--samples", "0")}, "argument --samples/-k: must be a positive integer, got 0"),
])
def test_1_4_a_request_the_serve_cannot_run_gets_exit_2_and_the_next_good_one_is_served(served, tmp_path, extra,
                                                                                        line):
    directory, _, tasks = served
    bad = sp.submit(directory, _request(tmp_path, "bad", tasks["c"], 1, "rbad", **extra))
    got = sp.wait(directory, bad, RUN_S)
    assert got.exit == 2 and line in got.error, got
    good = sp.wait(directory, sp.submit(directory, _request(tmp_path, "good", tasks["c"], 1, "rgood")), RUN_S)
    assert good.exit == 0 and _sessions(tmp_path / "good") == {"rgood/six-c/0/0"}


# ------------------------------------------------------------------------------------------------ 2. the end

def test_2_1_the_stop_file_ends_the_serve_and_its_proxy(tmp_path, upstream):
    proc = _start(tmp_path / "s", upstream.base_url, "--sandbox", "none")
    ready = _ready(tmp_path / "s", proc)
    assert ready.preflight["passed"] is True and ready.preflight["agent"] is None
    sp.request_stop(tmp_path / "s")
    doc = _ended(proc, tmp_path / "s")
    assert doc["exit"] == 0 and "asked to stop" in doc["reason"]
    assert pid_gone(ready.proxy_pid) and not (tmp_path / "s" / sp.READY).exists()
    with pytest.raises(sp.ServeEnded, match="asked to stop"):
        sp.wait(tmp_path / "s", sp.submit(tmp_path / "s", sp.RolloutRequest(out=str(tmp_path / "late"))), 30)


def test_2_2_sigterm_cancels_the_run_in_flight_and_ends_its_agent_and_the_proxy(tmp_path, upstream):
    directory = tmp_path / "s"
    task_root = make_task(tmp_path / "tasks", "hang", "hang-after-call", agent_timeout=600).parent
    proc = _start(directory, upstream.base_url, "--sandbox", "none")
    ready = _ready(directory, proc)
    name = sp.submit(directory, sp.RolloutRequest(out=str(tmp_path / "run"), tasks=(str(task_root),), agent=AGENT,
                                                  samples=1, run_id="rh"))
    deadline = time.monotonic() + RUN_S
    agents: list[int] = []
    sample = tmp_path / "run" / "samples" / "hang" / "0" / "0"  # past the run's preflight (its first agent)
    while not agents and time.monotonic() < deadline:  # the sample's agent has started (polled, not asserted)
        time.sleep(0.1)
        agents = _children_of(proc.pid, exclude=ready.proxy_pid) if (sample / "agent.stdout").exists() else []
    assert agents, "the run's agent never started"
    proc.send_signal(signal.SIGTERM)
    doc = _ended(proc, directory)
    assert doc["exit"] == 0 and doc["reason"] == "SIGTERM received"
    got = sp.poll(directory, name)
    assert got.exit == 130 and got.error.startswith("cancelled: the serve is ending (SIGTERM received)")
    lines = [json.loads(ln) for ln in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert [ln["status"] for ln in lines] == ["cancelled"]
    assert pid_gone(ready.proxy_pid) and all(pid_gone(pid) for pid in agents)


def _children_of(pid: int, exclude: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and int(entry) != exclude:
                out.append(int(entry))
    return out


def test_2_3_the_parents_death_ends_the_serve_and_its_proxy(tmp_path, upstream):
    parent = subprocess.Popen(["sleep", "600"])
    proc = _start(tmp_path / "s", upstream.base_url, "--sandbox", "none", "--parent-pid", str(parent.pid))
    ready = _ready(tmp_path / "s", proc)
    parent.kill()
    parent.wait()
    doc = _ended(proc, tmp_path / "s")
    assert doc["exit"] == 0 and doc["reason"] == f"its parent (pid {parent.pid}) is gone"
    assert pid_gone(ready.proxy_pid)


def test_2_6_a_sigkilled_serve_leaves_no_proxy_behind(tmp_path, upstream):
    proc = _start(tmp_path / "s", upstream.base_url, "--sandbox", "none")
    ready = _ready(tmp_path / "s", proc)
    assert pid_alive(ready.proxy_pid)
    proc.kill()  # no handler runs: only the proxy's tie to the serve can end it
    proc.wait()
    deadline = time.monotonic() + END_S
    while pid_alive(ready.proxy_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert pid_gone(ready.proxy_pid)
    finally:
        if pid_alive(ready.proxy_pid):
            os.killpg(ready.proxy_pid, signal.SIGKILL)


@pytest.mark.parametrize("args,line", [
    ([], "--upstream URL is required"),
    (["--upstream", "http://127.0.0.1:9/v1", "--parent-pid", "999999999"], "--parent-pid 999999999: no such process"),
    (["--upstream", "http://127.0.0.1:9/v1", "--proxy-set", "nonsense"], "--proxy-set 'nonsense': expected NAME=VALUE"),
])
def test_2_4_bad_start_up_input_is_one_line_and_exit_2(tmp_path, args, line):
    proc = subprocess.run([sys.executable, "-m", "polar.rollout.cli", "serve", str(tmp_path / "s"), "--sandbox",
                           "none", *args], capture_output=True, text=True,
                          env=rollout_env(), timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and line in proc.stderr
    assert [ln for ln in proc.stderr.splitlines() if ln.strip()] == [proc.stderr.strip()]


# ------------------------------------------------------------------------------------------------ 3. the protocol

def test_3_1_a_request_round_trips_and_is_polar_rollouts_command_line():
    req = sp.RolloutRequest(out="RUN", tasks=("t1", "t2"), agent="pi", samples=8, run_id="x", resume=True,
                            agent_timeout=30.0, process_opt=("--tokenizer=M",), extra_args=("--retry-infra", "1"))
    assert sp.RolloutRequest.from_json(json.loads(json.dumps(req.to_json()))) == req
    assert req.argv() == ["t1", "t2", "--agent", "pi", "--out", "RUN", "--samples", "8", "--run-id", "x",
                          "--agent-timeout", "30.0", "--resume", "--process-opt=--tokenizer=M", "--retry-infra", "1"]


def test_2_5_skip_preflight_is_the_canary_call_alone_for_every_agent(tmp_path, upstream):
    """--skip-preflight: ready.json's preflight passed on the canary call alone; a run of the agent gets that one
    (no canary sample of its own: no preflight session in its run)."""
    task = make_task(tmp_path / "tasks", "six-s", "solve").parent
    proc = _start(tmp_path / "s", upstream.base_url, "--sandbox", "none", "--agent", AGENT, "--skip-preflight")
    ready = _ready(tmp_path / "s", proc)
    try:
        assert ready.preflight["passed"] is True and ready.preflight["canary_sample"].startswith("skipped")
        name = sp.submit(tmp_path / "s", _request(tmp_path, "run", task, 2, "skip-run"))
        answer = sp.wait(tmp_path / "s", name, RUN_S)
        assert answer.exit == 0, answer
        doc = json.loads((tmp_path / "run" / "run.json").read_text())
        assert doc["preflight"]["canary_sample"].startswith("skipped") and doc["preflight"]["served_by"]
        assert not (tmp_path / "run" / "preflight").exists()
    finally:
        sp.request_stop(tmp_path / "s")
        _ended(proc, tmp_path / "s")


def test_3_2_the_serve_takes_every_flag_its_clients_route_to_it():
    """serve_protocol.SERVE_FLAGS (what polar-train passes to the serve rather than to a run) are the serve's own
    flags; the switches take no value."""
    from polar.rollout.serve import server as serve

    flags = {opt: action for action in serve.parser()._actions for opt in action.option_strings}
    assert set(sp.SERVE_FLAGS) <= set(flags)
    assert {f for f in sp.SERVE_FLAGS if flags[f].nargs == 0} == set(sp.SERVE_SWITCHES)
