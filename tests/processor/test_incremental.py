"""Scenarios for `polar-process --incremental` (issue 9 item 2, docs/options.md#polar-process): a later run reads only
flow files closed since the manifest in OUT, rebuilds whole the sessions they touch, recomputes rewards and advantages,
re-packs batches/, and ends with the outputs of a full run over the same closed files."""

import json
import os

import polars as pl
import pytest

from polar import records as rec
from polar.processor import engine
from polar.processor.cli import main
from tests.processor.synth import session_records

pytestmark = pytest.mark.unit

VOLATILE = ("seconds", "tokens_per_second", "options", "engine", "incremental")


def write(directory, records, per_file=3, leave_open=False):
    """Records through one FlowWriter (one 'proxy'); leave_open keeps the last file `.open` (writer returned)."""
    w = rec.FlowWriter(str(directory), min_free_mb=0)
    for i, r in enumerate(records):
        w.write(r)
        if (i + 1) % per_file == 0 and not (leave_open and i == len(records) - 1):
            w.close()
    if leave_open:
        return w
    w.close()
    return None


@pytest.fixture
def scenario(tmp_path):
    """s_span: a session whose first turns land before run 1 and the rest after; s_old: untouched after run 1, in
    group g with s_new, which only appears after run 1; s_null: null-session calls on both sides."""
    span = session_records("s_span", ["turn", "turn", "side", "turn", "retry", "turn", "turn", "compact", "turn"],
                           seed=1)
    old = session_records("s_old", ["turn", "turn", "trunc", "turn"], seed=2, t0=1_700_000_100.0)
    new = session_records("s_new", ["turn", "turn"], seed=3, t0=1_700_000_200.0)
    null = session_records(None, ["turn", "side", "turn", "turn"], seed=4, t0=1_700_000_300.0)
    other = session_records("s_other", ["turn", "turn"], seed=5, t0=1_700_000_400.0)
    flows = tmp_path / "flows"
    write(flows, span[:4] + old + null[:2] + other)
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(x) for x in [
        {"session": "s_old", "reward": 1.0, "group": "g"}, {"session": "s_new", "reward": 0.0, "group": "g"},
        {"session": "s_span", "reward": 0.5, "group": "h"}, {"session": "s_other", "reward": 0.2, "group": "h"}]))
    return tmp_path, {"span": span, "old": old, "new": new, "null": null, "other": other}


@pytest.fixture
def spy(monkeypatch):
    """What the local engine indexes and which groups it merges."""
    seen = {"indexed": [], "merged": []}
    real_index, real_group = engine.build_index, engine.group_products

    def index(files, progress=None):
        seen["indexed"].append([os.path.basename(f) for f in files])
        return real_index(files, progress)

    def group(session, records, files, settings):
        seen["merged"].append(session)
        return real_group(session, records, files, settings)

    monkeypatch.setattr(engine, "build_index", index)
    monkeypatch.setattr(engine, "group_products", group)
    return seen


def run(tmp, out="out", *extra, flows="flows"):
    return main([str(tmp / flows), "-o", str(tmp / out), "-q", "--rewards", str(tmp / "r.jsonl"), *extra])


def outputs(out):
    found = {}
    for root, _, names in os.walk(out):
        for name in names:
            path = os.path.join(root, name)
            found[os.path.relpath(path, out)] = open(path, "rb").read()
    report = json.loads(found.pop("report.json"))
    for k in VOLATILE:
        report.pop(k, None)
    report["outputs"].pop("dir")
    manifest = json.loads(found.pop("manifest.json"))
    manifest.pop("last_run")
    return found, report, manifest


def assert_equal_to_full_run(tmp, out="out"):
    """Same files, same bytes, same report as a fresh full run over the closed files there are."""
    closed = [str(tmp / "flows" / n) for n in sorted(os.listdir(tmp / "flows")) if n.endswith(rec.FILE_SUFFIX)]
    assert main([*closed, "-o", str(tmp / "full"), "-q", "--rewards", str(tmp / "r.jsonl"), "--overwrite"]) == 0
    got, want = outputs(tmp / out), outputs(tmp / "full")
    assert sorted(got[0]) == sorted(want[0])
    for name in got[0]:
        assert got[0][name] == want[0][name], name
    assert got[1] == want[1]


def test_1_1_first_incremental_run_into_an_empty_out_is_a_full_run(scenario, spy):
    tmp, _ = scenario
    assert run(tmp, "out", "--incremental") == 0
    manifest = json.loads((tmp / "out" / "manifest.json").read_text())
    assert sorted(os.path.basename(f["path"]) for f in manifest["files"]) == sorted(os.listdir(tmp / "flows"))
    assert manifest["last_run"]["full_rebuild_reason"] == "no previous run in OUT"
    assert_equal_to_full_run(tmp)


def test_1_2_second_run_reads_only_new_closed_files_and_rebuilds_only_touched_groups(scenario, spy):
    tmp, s = scenario
    assert run(tmp, "out", "--incremental") == 0
    before = set(os.listdir(tmp / "flows"))
    write(tmp / "flows", s["span"][4:] + s["new"] + s["null"][2:])
    new_files = sorted(set(os.listdir(tmp / "flows")) - before)
    spy["indexed"].clear(), spy["merged"].clear()
    assert run(tmp, "out", "--incremental") == 0
    assert spy["indexed"] == [new_files]
    # s_span spans old and new files, s_new is new, the null group got new calls; s_old and s_other are carried.
    assert sorted(spy["merged"], key=str) == sorted(["s_span", "s_new", None], key=str)
    report = json.loads((tmp / "out" / "report.json").read_text())
    assert report["incremental"] == {"new_files": len(new_files), "open_files_skipped": 0, "groups_rebuilt": 3,
                                     "groups_carried": 2, "full_rebuild_reason": None}
    assert_equal_to_full_run(tmp)


def test_1_3_a_session_spanning_old_and_new_files_is_rebuilt_whole(scenario):
    tmp, s = scenario
    assert run(tmp, "out", "--incremental") == 0
    write(tmp / "flows", s["span"][4:])
    assert run(tmp, "out", "--incremental") == 0
    seqs = pl.read_parquet(tmp / "out" / "sequences.parquet").filter(pl.col("session") == "s_span")
    old_ids, new_ids = {r["id"] for r in s["span"][:4]}, {r["id"] for r in s["span"][4:]}
    placed = [c for ids in seqs["call_ids"] for c in ids]
    assert sorted(placed) == sorted(r["id"] for r in s["span"] if r["completion_token_ids"] is not None)
    assert any(set(ids) & old_ids and set(ids) & new_ids for ids in seqs["call_ids"])  # one merged sequence
    assert_equal_to_full_run(tmp)


def test_1_4_every_touched_group_gets_its_advantages_recomputed(scenario, spy):
    tmp, s = scenario
    assert run(tmp, "out", "--incremental") == 0
    adv = lambda: dict(pl.read_parquet(tmp / "out" / "sequences.parquet")  # noqa: E731
                       .filter(~pl.col("flags").list.contains("side_chain"))
                       .group_by("session").agg(pl.col("advantage").unique()).iter_rows())
    assert adv()["s_old"] == [0.0]  # alone in g so far (s_new's reward line is unmatched)
    write(tmp / "flows", s["new"])
    spy["merged"].clear()
    assert run(tmp, "out", "--incremental") == 0
    assert "s_old" not in spy["merged"]  # carried over, yet its group changed
    got = adv()
    assert got["s_old"] == [1.0] and got["s_new"] == [-1.0]
    assert_equal_to_full_run(tmp)


def test_1_5_batches_are_repacked_in_group_order(scenario):
    tmp, s = scenario
    assert run(tmp, "out", "--incremental", "--max-batch-tokens", "120") == 0
    write(tmp / "flows", s["new"] + s["span"][4:])
    assert run(tmp, "out", "--incremental", "--max-batch-tokens", "120") == 0
    frames = [pl.read_parquet(tmp / "out" / "batches" / b) for b in sorted(os.listdir(tmp / "out" / "batches"))]
    seqs = pl.read_parquet(tmp / "out" / "sequences.parquet")
    assert sum(f.height for f in frames) == seqs.height
    groups = [g for f in frames for g in f["group"]]
    assert groups == sorted(groups, key=lambda g: (g is None, g or ""))
    assert main([str(tmp / "flows"), "-o", str(tmp / "full"), "-q", "--rewards", str(tmp / "r.jsonl"),
                 "--max-batch-tokens", "120"]) == 0
    assert sorted(os.listdir(tmp / "out" / "batches")) == sorted(os.listdir(tmp / "full" / "batches"))
    for b in os.listdir(tmp / "full" / "batches"):
        assert (tmp / "out" / "batches" / b).read_bytes() == (tmp / "full" / "batches" / b).read_bytes()


def test_2_1_open_files_are_not_closed_yet(scenario, spy):
    tmp, s = scenario
    assert run(tmp, "out", "--incremental") == 0
    writer = write(tmp / "flows", s["new"], leave_open=True)
    open_name = os.path.basename(writer.current_path)
    spy["indexed"].clear()
    assert run(tmp, "out", "--incremental") == 0
    assert all(open_name not in x for x in spy["indexed"])
    report = json.loads((tmp / "out" / "report.json").read_text())
    assert report["incremental"]["open_files_skipped"] == 1 and report["inputs"]["open_files"][0].endswith(open_name)
    in_open = {r["id"] for r in s["new"][-(len(s["new"]) % 3 or 3):]}
    calls = set(pl.read_parquet(tmp / "out" / "calls.parquet")["call_id"])
    assert not calls & in_open
    writer.close()  # the proxy rotates or shuts down: the file is closed now
    assert run(tmp, "out", "--incremental") == 0
    calls = pl.read_parquet(tmp / "out" / "calls.parquet")["call_id"]
    assert in_open <= set(calls) and calls.n_unique() == calls.len()
    assert_equal_to_full_run(tmp)


def test_2_2_a_full_run_that_read_open_files_leaves_those_sessions_pending(scenario):
    tmp, s = scenario
    writer = write(tmp / "flows", s["span"][4:], leave_open=True)
    assert run(tmp, "out") == 0  # not incremental: the .open file is read, as in progress
    manifest = json.loads((tmp / "out" / "manifest.json").read_text())
    assert manifest["pending_sessions"] == ["s_span"]
    assert all(not f["path"].endswith(".open") for f in manifest["files"])
    writer.close()
    assert run(tmp, "out", "--incremental") == 0
    calls = pl.read_parquet(tmp / "out" / "calls.parquet")["call_id"]
    assert calls.n_unique() == calls.len()
    assert_equal_to_full_run(tmp)


def test_2_3_nothing_new_changes_nothing(scenario, spy):
    tmp, _ = scenario
    assert run(tmp, "out", "--incremental") == 0
    first = outputs(tmp / "out")
    spy["merged"].clear()
    assert run(tmp, "out", "--incremental") == 0
    assert spy["merged"] == [] and outputs(tmp / "out")[:2] == first[:2]


@pytest.mark.parametrize("change, message", [
    ("options", "options differ"),
    ("no_manifest", "no manifest.json"),
    ("grown", "a closed flow file never changes"),
])
def test_3_1_what_cannot_continue_exits_2(scenario, capsys, change, message):
    tmp, _ = scenario
    assert run(tmp, "out", "--incremental") == 0
    extra = []
    if change == "options":
        extra = ["--mode", "per_request"]
    elif change == "no_manifest":
        os.remove(tmp / "out" / "manifest.json")
    else:
        name = sorted(os.listdir(tmp / "flows"))[0]
        with open(tmp / "flows" / name, "ab") as fh:
            fh.write(b"\x00")
    snapshot = sorted(os.listdir(tmp / "out"))
    assert run(tmp, "out", "--incremental", *extra) == 2
    assert message in capsys.readouterr().err
    assert sorted(os.listdir(tmp / "out")) == snapshot


def test_3_2_new_end_of_turn_evidence_rebuilds_everything(tmp_path, spy):
    # Run 1 has no call of model m2: its end-of-turn ids come with run 2's files and change the table.
    a = session_records("a", ["turn", "turn"], seed=1)
    b = session_records("b", ["turn", "turn"], seed=2, t0=1_700_000_100.0)
    for r in b:
        r["model_served"] = "m2"
    write(tmp_path / "flows", a)
    (tmp_path / "r.jsonl").write_text("")
    assert run(tmp_path, "out", "--incremental") == 0
    write(tmp_path / "flows", b)
    spy["merged"].clear()
    assert run(tmp_path, "out", "--incremental") == 0
    assert sorted(spy["merged"]) == ["a", "b"]
    assert json.loads((tmp_path / "out" / "report.json").read_text())["incremental"]["full_rebuild_reason"] == \
        "the end-of-turn ids changed"
