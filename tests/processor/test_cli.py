"""Scenarios for `polar-process` end to end: outputs, options, exit codes (docs/options.md#polar-process,
docs/merge-rules.md#outputs)."""

import json
import os

import polars as pl
import pytest

from polar import records as rec
from polar.processor.cli import main
from polar.processor.writers import CALLS_SCHEMA, SEQUENCES_SCHEMA
from tests.processor.synth import EOT, session_records, write_flows

pytestmark = pytest.mark.unit


@pytest.fixture
def dump(tmp_path):
    recs = session_records("s1", ["turn", "turn", "side", "retry", "trunc", "turn", "drift", "turn", "compact",
                                  "turn", "error", "nolp"], seed=1)
    recs += session_records("s2", ["turn", "turn", "turn"], seed=2)
    recs += session_records("s3", ["turn"], seed=3)
    recs += session_records(None, ["turn", "side", "turn"], seed=4)
    write_flows(str(tmp_path / "flows"), recs, per_file=6)
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(x) for x in [
        {"session": "s1", "reward": 1.0, "group": "g"}, {"session": "s2", "reward": 0.0, "group": "g"},
        {"session": "ghost", "reward": 0.5, "group": "g"}]))
    return tmp_path, recs


def run(tmp_path, *extra):
    return main([str(tmp_path / "flows"), "-o", str(tmp_path / "out"), "-q", *extra])


def test_1_1_writes_every_output_with_the_contract_schemas(dump):
    tmp, recs = dump
    assert run(tmp, "--rewards", str(tmp / "r.jsonl")) == 0
    out = tmp / "out"
    assert sorted(os.listdir(out)) == ["batches", "calls.parquet", "manifest.json", "report.html", "report.json",
                                       "sequences.parquet", "sft.jsonl", "state"]
    seqs, calls = pl.read_parquet(out / "sequences.parquet"), pl.read_parquet(out / "calls.parquet")
    assert dict(seqs.schema) == SEQUENCES_SCHEMA and dict(calls.schema) == CALLS_SCHEMA
    assert calls.height == len(recs) and calls["sequence_id"].null_count() == 1  # the failed call
    assert json.loads(calls.filter(pl.col("error").is_not_null())["error"][0])["stage"] == "backend_connect"
    report = json.loads((out / "report.json").read_text())
    assert report["counts"]["calls"] == len(recs) and report["counts"]["calls_without_completion"] == 1
    assert report["merge_ratio"] == seqs["n_calls"].sum() / seqs.height
    assert report["rewards"] == {"joined": 2, "missing": 1, "unmatched_lines": 1, "unmatched_sessions": ["ghost"]}
    assert {b["cause"] for b in report["breaks"]} == {"prefix_diverged"}
    s1 = seqs.filter((pl.col("session") == "s1") & ~pl.col("flags").list.contains("side_chain"))
    assert set(s1["advantage"]) == {1.0}
    sft = [json.loads(x) for x in (out / "sft.jsonl").read_text().splitlines()]
    assert len(sft) == 5  # s1, s2, s3, and the null group's two conversations
    assert all(isinstance(tc["function"]["arguments"], str)
               for line in sft for m in line["messages"] for tc in m.get("tool_calls") or [])
    html = (out / "report.html").read_text()
    assert "<svg" in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert json.loads((out / "manifest.json").read_text())["advantage_norm"] == "std"


def test_1_1b_advantage_norm_mean_is_applied_and_recorded(dump):
    tmp, _ = dump
    assert run(tmp, "--rewards", str(tmp / "r.jsonl"), "--advantage-norm", "mean") == 0
    seqs = pl.read_parquet(tmp / "out" / "sequences.parquet")
    main_chain = ~pl.col("flags").list.contains("side_chain")
    # s1 and s2 (rewards 1.0 and 0.0) form group g: mean 0.5, so ±0.5 (std would give ±1.0)
    assert set(seqs.filter((pl.col("session") == "s1") & main_chain)["advantage"]) == {0.5}
    assert set(seqs.filter((pl.col("session") == "s2") & main_chain)["advantage"]) == {-0.5}
    assert json.loads((tmp / "out" / "manifest.json").read_text())["advantage_norm"] == "mean"


def test_1_2_batches_pack_in_group_order_and_never_truncate(dump):
    tmp, _ = dump
    assert run(tmp, "--rewards", str(tmp / "r.jsonl"), "--max-batch-tokens", "80") == 0
    seqs = pl.read_parquet(tmp / "out" / "sequences.parquet")
    batches = sorted(os.listdir(tmp / "out" / "batches"))
    frames = [pl.read_parquet(tmp / "out" / "batches" / b) for b in batches]
    assert sum(f.height for f in frames) == seqs.height
    for f in frames:
        assert f["n_tokens"].sum() <= 80 or (f.height == 1 and "oversize" in f["flags"][0])
    groups = [g for f in frames for g in f["group"]]
    assert groups == sorted(groups, key=lambda g: (g is None, g or ""))


def test_1_3_side_chains_exclude_leaves_them_out_of_batches(dump):
    tmp, _ = dump
    assert run(tmp, "--rewards", str(tmp / "r.jsonl"), "--side-chains", "exclude") == 0
    seqs = pl.read_parquet(tmp / "out" / "sequences.parquet")
    side = seqs.filter(pl.col("flags").list.contains("side_chain"))
    assert side.height and side["reward"].null_count() == side.height
    packed = pl.concat([pl.read_parquet(tmp / "out" / "batches" / b) for b in os.listdir(tmp / "out" / "batches")])
    assert packed.height == seqs.height - side.height
    report = json.loads((tmp / "out" / "report.json").read_text())
    assert report["counts"]["excluded_from_batches"] == side.height


def test_1_4_sft_min_reward_keeps_rewarded_sessions_only(dump):
    tmp, _ = dump
    assert run(tmp, "--rewards", str(tmp / "r.jsonl"), "--sft-min-reward", "0.5") == 0
    assert len((tmp / "out" / "sft.jsonl").read_text().splitlines()) == 1


def test_1_5_per_request_covers_the_same_calls(dump):
    tmp, _ = dump
    assert run(tmp) == 0
    merged = pl.read_parquet(tmp / "out" / "sequences.parquet")
    assert run(tmp, "--mode", "per_request", "--overwrite") == 0
    per = pl.read_parquet(tmp / "out" / "sequences.parquet")
    assert sorted(merged["call_ids"].explode()) == sorted(per["call_ids"].explode())
    assert json.loads((tmp / "out" / "report.json").read_text())["merge_ratio"] == 1.0


@pytest.mark.parametrize("extra, message", [
    (("--ray-address", "auto"), "need --engine ray"),
    (("--incremental", "--overwrite"), "exclude each other"),
])
def test_2_1_inconsistent_options_exit_2(dump, capsys, extra, message):
    tmp, _ = dump
    assert run(tmp, *extra) == 2 and message in capsys.readouterr().err


def test_2_2_non_empty_out_needs_overwrite(dump, capsys):
    tmp, _ = dump
    (tmp / "out").mkdir()
    (tmp / "out" / "keep").write_text("x")
    assert run(tmp) == 2 and "--overwrite" in capsys.readouterr().err
    assert os.listdir(tmp / "out") == ["keep"]
    assert run(tmp, "--overwrite") == 0 and (tmp / "out" / "sequences.parquet").exists()


def test_2_3_no_eot_source_exits_2_naming_the_options(tmp_path, capsys):
    recs = session_records("s", ["trunc", "trunc"])
    write_flows(str(tmp_path / "flows"), recs)
    assert run(tmp_path) == 2
    err = capsys.readouterr().err
    assert "--eot-token-id" in err and "--tokenizer" in err and not (tmp_path / "out").exists()
    assert run(tmp_path, "--eot-token-id", str(EOT)) == 0


def test_2_4_bad_rewards_and_newer_versions_exit_2(dump, capsys):
    tmp, _ = dump
    (tmp / "bad.jsonl").write_text('{"session":"s1","reward":1}\n{"session":"s1","reward":2}\n')
    assert run(tmp, "--rewards", str(tmp / "bad.jsonl")) == 2 and "duplicate" in capsys.readouterr().err
    r = session_records("s9", ["turn"])[0]
    r["v"] = 99
    write_flows(str(tmp / "flows"), [r])
    assert run(tmp) == 2 and "newer than this reader" in capsys.readouterr().err


def test_2_5_summary_and_progress(dump, capsys):
    tmp, _ = dump
    assert main([str(tmp / "flows"), "-o", str(tmp / "out"), "--progress"]) == 0
    cap = capsys.readouterr()
    assert "merge ratio" in cap.out and "merge" in cap.err and "\r" in cap.err


# -- 3. fail closed, say what was wrong (issue 13 items 8, 10) -------------------------------------------------------

def test_3_1_help_describes_every_option_and_its_default(capsys):
    from polar.processor.cli import parser

    actions = [a for a in parser()._actions if a.dest != "help"]
    # Required arguments say so; every other option names its default.
    undocumented = [a.dest for a in actions if not a.help or ("required" if a.required else "default") not in a.help]
    assert not undocumented
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and all(a.option_strings[-1] in out for a in actions if a.option_strings)


@pytest.mark.parametrize("inputs", [["flows"], ["flows/*.msgpack"], ["flows", "flows/torn.msgpack"]],
                         ids=["empty_dir", "glob_matching_nothing", "only_a_torn_record"])
def test_3_2_no_readable_record_exits_2_unless_allow_empty(tmp_path, capsys, inputs):
    (tmp_path / "flows").mkdir()
    if "flows/torn.msgpack" in inputs:
        (tmp_path / "flows" / "torn.msgpack").write_bytes(rec.pack(session_records("s", ["turn"])[0])[:40])
    args = [*(str(tmp_path / i) for i in inputs), "-o", str(tmp_path / "out"), "-q"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--allow-empty" in err and not (tmp_path / "out").exists()
    assert main([*args, "--allow-empty"]) == 0
    assert json.loads((tmp_path / "out" / "report.json").read_text())["counts"]["calls"] == 0


def test_3_3_a_file_that_is_not_a_flow_file_exits_2_in_the_inspectors_wording(dump, capsys):
    tmp, _ = dump
    junk = tmp / "flows" / "flows-junk.msgpack"
    junk.write_bytes(b"hello, not msgpack\n")
    for allow in ((), ("--allow-empty",)):
        assert run(tmp, *allow) == 2
        assert capsys.readouterr().err == f"polar-process: error: {rec.sniff(str(junk))}\n"
    assert rec.main([str(junk)]) == 2 and rec.sniff(str(junk)) in capsys.readouterr().err


def test_3_4_an_eot_token_id_that_never_occurs_is_a_warning(dump, capsys):
    tmp, _ = dump
    assert run(tmp, "--eot-token-id", "9999", "--eot-token-id", str(EOT)) == 0
    err = capsys.readouterr().err
    assert "polar-process: warning: --eot-token-id 9999 never occurs in the dump" in err
    assert f"end with {EOT} (" in err  # the dump's own evidence, named
    report = json.loads((tmp / "out" / "report.json").read_text())
    assert [w for w in report["warnings"] if "9999" in w]
    assert "--eot-token-id 9999 never occurs" in (tmp / "out" / "report.html").read_text()
    assert run(tmp, "--eot-token-id", str(EOT), "--overwrite") == 0
    assert "warning" not in capsys.readouterr().err


def test_3_5_unmatched_reward_lines_are_named_first_ten(dump, capsys):
    tmp, _ = dump
    ghosts = [f"ghost-{i:02d}" for i in range(12)]
    (tmp / "r.jsonl").write_text("\n".join(json.dumps({"session": s, "reward": 1.0, "group": "g"})
                                           for s in ["s1", *ghosts]))
    assert main([str(tmp / "flows"), "-o", str(tmp / "out"), "--rewards", str(tmp / "r.jsonl")]) == 0
    cap = capsys.readouterr()
    named = ", ".join(repr(s) for s in ghosts[:10])
    assert f"--rewards: 12 line(s) name sessions that are not in the dump: {named} … (12 in all)" in cap.err
    assert f"unmatched lines 12 ({named} … (12 in all))" in cap.out
    rewards = json.loads((tmp / "out" / "report.json").read_text())["rewards"]
    assert rewards["unmatched_lines"] == 12 and rewards["unmatched_sessions"] == ghosts[:10]


def test_4_1_session_prefix_keeps_matching_sessions_and_counts_the_rest(dump):
    tmp, recs = dump
    assert run(tmp, "--session-prefix", "s1", "--session-prefix", "s3", "--rewards", str(tmp / "r.jsonl")) == 0
    out = tmp / "out"
    seqs, calls = pl.read_parquet(out / "sequences.parquet"), pl.read_parquet(out / "calls.parquet")
    assert set(seqs["session"]) == set(calls["session"]) == {"s1", "s3"}
    report = json.loads((out / "report.json").read_text())
    n_other = sum(1 for r in recs if r["session"] not in ("s1", "s3"))
    assert report["counts"]["sessions_other_prefix"] == 2  # s2 and the null-session group
    assert report["counts"]["calls_other_prefix"] == n_other
    assert report["counts"]["calls"] == len(recs) - n_other and report["inputs"]["records"] == len(recs)
    assert report["rewards"]["joined"] == 1 and sorted(report["rewards"]["unmatched_sessions"]) == ["ghost", "s2"]
    assert len((out / "sft.jsonl").read_text().splitlines()) == 2  # s1 and s3
    # Without the option every session is kept and nothing is counted as another prefix.
    assert run(tmp, "--overwrite") == 0
    report = json.loads((out / "report.json").read_text())
    assert "sessions_other_prefix" not in report["counts"] and report["counts"]["calls"] == len(recs)


def test_4_2_incremental_must_keep_the_session_prefix(dump, capsys):
    tmp, _ = dump
    assert run(tmp, "--session-prefix", "s1") == 0
    assert run(tmp, "--incremental", "--session-prefix", "s1") == 0
    capsys.readouterr()
    assert run(tmp, "--incremental", "--session-prefix", "s2") == 2
    assert "--session-prefix ['s1'] → ['s2']" in capsys.readouterr().err


def _ascii(r: dict) -> dict:
    """The record as a v3 gateway writes it on the fast path: the prompt as the backend's ASCII digits."""
    p = r.get("prompt_token_ids")
    if isinstance(p, bytes):
        r = dict(r, prompt_token_ids=rec.ascii_ids(",".join(map(str, rec.unpack_ids(p))).encode()))
    return r


def test_1_6_ascii_prompts_give_the_same_outputs_as_int32_prompts(dump):
    tmp_path, recs = dump
    assert run(tmp_path) == 0
    write_flows(str(tmp_path / "flows-ascii"), [_ascii(r) for r in recs], per_file=6)
    assert main([str(tmp_path / "flows-ascii"), "-o", str(tmp_path / "out-ascii"), "-q"]) == 0
    def parquet(d):
        return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs
                      if f.endswith(".parquet") and not r.startswith(str(d / "state")))  # state: file offsets
    files = parquet(tmp_path / "out")
    assert "calls.parquet" in files and any(f.startswith("batches") for f in files)
    assert files == parquet(tmp_path / "out-ascii")
    for name in files:
        a, b = (pl.read_parquet(tmp_path / d / name) for d in ("out", "out-ascii"))
        where = [c for c in a.columns if c in ("source_file", "source_offset")]  # the dumps' own file names and sizes
        assert a.drop(where).equals(b.drop(where)), name
    assert (tmp_path / "out" / "sft.jsonl").read_bytes() == (tmp_path / "out-ascii" / "sft.jsonl").read_bytes()
    # the report counts the fast path's calls
    counts = [json.loads((tmp_path / d / "report.json").read_text())["counts"] for d in ("out", "out-ascii")]
    with_prompt = sum(isinstance(r.get("prompt_token_ids"), bytes) for r in recs)
    assert with_prompt > 0 and (counts[0]["calls_prompt_ascii"], counts[1]["calls_prompt_ascii"]) == (0, with_prompt)


def test_3_6_rewards_that_join_no_session_exit_2_unless_allow_unjoined(dump, capsys):
    """Issue 37: a --rewards file none of whose lines joins a session (ids of another run) is one line, exit 2, and
    OUT is not written; --allow-unjoined processes without rewards."""
    tmp, _ = dump
    (tmp / "other.jsonl").write_text("\n".join(json.dumps({"session": f"other-run/t/{k}/0", "reward": 1.0,
                                                           "group": "other-run/t"}) for k in range(3)))
    assert main([str(tmp / "flows"), "-o", str(tmp / "out"), "--rewards", str(tmp / "other.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("polar-process: error: --rewards ") and "--allow-unjoined" in err[0]
    assert "none of its 3 line(s) joins a session" in err[0] and "'other-run/t/0/0'" in err[0]
    assert not (tmp / "out").exists() or not os.listdir(tmp / "out")
    assert run(tmp, "--rewards", str(tmp / "other.jsonl"), "--allow-unjoined") == 0
    rewards = json.loads((tmp / "out" / "report.json").read_text())["rewards"]
    assert rewards["joined"] == 0 and rewards["unmatched_lines"] == 3
