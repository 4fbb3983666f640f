"""Scenarios for `--engine ray` (issue 9 item 1): the same bytes as `--engine local`, sessions partitioned by a stable
hash, records of one session spread over files of several proxies. Ray runs as a local instance (no cluster)."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from polar import records as rec
from polar.processor import cli
from polar.processor.cli import main
from polar.processor.engine import partition_of
from tests.processor.synth import session_records
from tests.support.need import need_module

pytestmark = pytest.mark.unit

# Run-dependent report fields: timing, the options that name the engine, and the engine's own facts.
VOLATILE = ("seconds", "tokens_per_second", "options", "engine")


@pytest.fixture(scope="module")
def ray_local():
    need_module("ray")  # an extra of its own, and in [dev]: scripts/setup installs it, so CI has it
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def write_fleet(directory, records, proxies=("proxyA", "proxyB"), per_file=4):
    """Records dealt round-robin to one FlowWriter per proxy (distinct host names, as N proxies write them)."""
    writers = []
    for host in proxies:
        w = rec.FlowWriter(str(directory), min_free_mb=0)
        w._host = host
        writers.append(w)
    counts = [0] * len(writers)
    for i, r in enumerate(records):
        k = i % len(writers)
        writers[k].write(r)
        counts[k] += 1
        if counts[k] % per_file == 0:
            writers[k].close()
    for w in writers:
        w.close()


@pytest.fixture
def fleet_dump(tmp_path):
    recs = []
    for n, ops in enumerate([["turn", "turn", "side", "retry", "trunc", "turn", "drift", "turn", "compact", "turn"],
                             ["turn", "error", "turn", "nolp", "turn"], ["turn", "abort", "turn"], ["turn"],
                             ["turn", "side", "side", "turn", "turn"], ["turn", "turn"]]):
        recs += session_records(f"s{n}", ops, seed=n, t0=1_700_000_000.0 + n)
    recs += session_records(None, ["turn", "side", "turn"], seed=99)
    recs.sort(key=lambda r: r["t_start"])  # sessions interleave in time, as on a real fleet
    write_fleet(tmp_path / "flows", recs)
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(x) for x in [
        {"session": "s0", "reward": 1.0, "group": "g1"}, {"session": "s1", "reward": 0.0, "group": "g1"},
        {"session": "s2", "reward": 0.5, "group": "g2"}, {"session": "s3", "reward": 2.0, "group": None}]))
    return tmp_path, recs


def files_of(out):
    found = {}
    for root, _, names in os.walk(out):
        for name in names:
            path = os.path.join(root, name)
            found[os.path.relpath(path, out)] = open(path, "rb").read()
    return found


def assert_same_outputs(a, b):
    fa, fb = files_of(a), files_of(b)
    assert sorted(fa) == sorted(fb)
    ra, rb = json.loads(fa.pop("report.json")), json.loads(fb.pop("report.json"))
    for doc in (ra, rb):
        for k in VOLATILE:
            doc.pop(k)
        doc["outputs"].pop("dir")
    assert ra == rb
    ma, mb = json.loads(fa.pop("manifest.json")), json.loads(fb.pop("manifest.json"))
    assert ma == mb
    for name in fa:  # parquet files, batches, sft.jsonl, report.html, state/: byte for byte
        assert fa[name] == fb[name], name


def test_1_1_fleet_dump_spreads_sessions_over_proxies(fleet_dump):
    tmp, recs = fleet_dump
    names = os.listdir(tmp / "flows")
    assert {n.split("-")[2] for n in names} == {"proxyA", "proxyB"}
    where = {}
    for path in rec.expand_inputs([str(tmp / "flows")]):
        for _, r in rec.iter_file(path, raw=True):
            where.setdefault(r["session"], set()).add(os.path.basename(path).split("-")[2])
    assert where["s0"] == {"proxyA", "proxyB"} and where[None] == {"proxyA", "proxyB"}


@pytest.mark.parametrize("extra, partitions", [
    (("--rewards", "{r}"), "3"),
    (("--rewards", "{r}", "--side-chains", "exclude", "--max-batch-tokens", "80"), "16"),
    (("--mode", "per_request"), "1"),
])
def test_1_2_ray_outputs_equal_local_byte_for_byte(ray_local, fleet_dump, extra, partitions):
    tmp, _ = fleet_dump
    extra = [x.replace("{r}", str(tmp / "r.jsonl")) for x in extra]
    assert main([str(tmp / "flows"), "-o", str(tmp / "local"), "-q", "--engine", "local", *extra]) == 0
    assert main([str(tmp / "flows"), "-o", str(tmp / "ray"), "-q", "--engine", "ray", "--ray-partitions",
                 partitions, *extra]) == 0
    assert_same_outputs(tmp / "local", tmp / "ray")
    report = json.loads((tmp / "ray" / "report.json").read_text())
    assert report["engine"]["name"] == "ray" and report["engine"]["workers"]
    assert all(w["peak_rss_mb"] > 0 for w in report["engine"]["workers"])


def test_1_3_ray_incremental_equals_local_incremental(ray_local, fleet_dump):
    tmp, _ = fleet_dump
    flows = sorted(os.listdir(tmp / "flows"))
    part = tmp / "part"
    part.mkdir()
    for name in flows[: len(flows) // 2]:
        os.link(tmp / "flows" / name, part / name)
    for engine in ("local", "ray"):
        assert main([str(part), "-o", str(tmp / engine), "-q", "--engine", engine, "--incremental"]) == 0
    for name in flows[len(flows) // 2:]:
        os.link(tmp / "flows" / name, part / name)
    for engine in ("local", "ray"):
        assert main([str(part), "-o", str(tmp / engine), "-q", "--engine", engine, "--incremental"]) == 0
    assert_same_outputs(tmp / "local", tmp / "ray")


def test_1_4_errors_in_ray_tasks_keep_the_local_message_and_exit_code(ray_local, fleet_dump, capsys):
    tmp, _ = fleet_dump
    r = session_records("s9", ["turn"])[0]
    r["v"] = 99
    rec.FlowWriter(str(tmp / "flows"), min_free_mb=0).write(r)
    assert main([str(tmp / "flows"), "-o", str(tmp / "ray"), "-q", "--engine", "ray"]) == 2
    assert "newer than this reader" in capsys.readouterr().err and not (tmp / "ray").exists()


def test_2_1_partition_is_a_stable_hash_not_pythons_salted_hash():
    assert partition_of("s0", 1) == 0
    expect = int.from_bytes(hashlib.blake2b(b"ss0", digest_size=8).digest(), "big") % 7
    assert partition_of("s0", 7) == expect
    code = ("from polar.processor.engine import partition_of;"
            "print([partition_of(s, 13) for s in ['a', 'b', 'session-42', None, 'ü']])")
    seen = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed},
                           capture_output=True, text=True, check=True).stdout for seed in ("1", "2", "3")}
    assert len(seen) == 1
    spread = {partition_of(f"s{i}", 8) for i in range(200)}
    assert spread == set(range(8))


def test_2_2_without_ray_installed_engine_ray_exits_2_with_the_install_line(fleet_dump, capsys, monkeypatch):
    tmp, _ = fleet_dump
    real = cli.importlib.util.find_spec
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert main([str(tmp / "flows"), "-o", str(tmp / "out"), "-q", "--engine", "ray"]) == 2
    err = capsys.readouterr().err
    assert "not installed" in err and "polar-gateway[ray]" in err and not (tmp / "out").exists()


def test_2_3_local_engine_never_imports_ray(fleet_dump):
    tmp, _ = fleet_dump
    code = ("import sys; from polar.processor.cli import main;"
            f"rc = main([{str(tmp / 'flows')!r}, '-o', {str(tmp / 'o')!r}, '-q']);"
            "print(rc, 'ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", "False"]
