"""Invariants of issue 5 item 3, with hypothesis on generated sessions (interleaved side calls, compaction
rewrites, retries, truncations, drifted re-renders, missing logprobs, failed calls)."""

import tempfile

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.processor.merge import merge_group, route_calls, route_calls_naive
from polar.processor.normalize import to_call
from polar.processor.pipeline import Options, process
from tests.processor.synth import EOT, OPS, session_records, write_flows

pytestmark = pytest.mark.unit

ops_lists = st.lists(st.sampled_from(OPS), min_size=1, max_size=14)


def eot_for(_m):
    return frozenset({EOT})


def check_cover(calls, res):
    """Each eligible call is in exactly one sequence; the rest in none; mask-1 tokens are the completions."""
    by_id = {c.id: c for c in calls}
    placed = [cid for s in res.sequences for cid in s.call_ids]
    assert sorted(placed) == sorted(c.id for c in calls if c.eligible)
    for s in res.sequences:
        comps = [by_id[c].completion for c in s.call_ids]
        assert len(s.input_ids) == len(s.loss_mask)
        assert s.input_ids[s.loss_mask.astype(bool)].tolist() == np.concatenate(comps).tolist()
        first = by_id[s.call_ids[0]].prompt
        assert s.input_ids[:len(first)].tolist() == first.tolist()
        if s.logprobs is not None:
            lps = [by_id[c].logprobs for c in s.call_ids if len(by_id[c].completion)]
            assert s.logprobs[s.loss_mask.astype(bool)].tolist() == (np.concatenate(lps).tolist() if lps else [])
    return placed


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.lists(st.integers(1, 3), max_size=4), st.booleans()),
                min_size=1, max_size=12), st.booleans())
def test_1_fast_index_gives_exactly_the_naive_rules_result(steps, long_head):
    """Prompts grow as a tree (extend, cut, rewrite, repeat) over a tiny alphabet so ties and equal tips happen."""
    head = list(range(100, 170)) if long_head else []  # ≥ 64 tokens: exercises the index's head buckets
    prompts = [head + [1]]
    for pick, ext, cut in steps:
        base = prompts[pick % len(prompts)]
        p = (base[:max(len(head), len(base) - 1)] if cut else base) + ext
        prompts.append(p)
    as_bytes = [np.array(p, dtype="<i4").tobytes() for p in prompts]
    assert route_calls(as_bytes) == route_calls_naive(prompts)


@settings(max_examples=60, deadline=None)
@given(ops_lists, ops_lists, st.integers(0, 10_000))
def test_2_both_modes_cover_the_same_calls_and_keep_the_invariants(ops, other_ops, seed):
    recs = session_records("s", ops, seed=seed)
    # a second conversation interleaved in time (same session): its calls land between the main agent's
    recs += session_records("s", other_ops, seed=seed + 1, t0=1_700_000_000.25)
    recs.sort(key=lambda r: (r["t_start"], r["id"]))
    calls = [to_call(r, "mem", i) for i, r in enumerate(recs)]
    merged = merge_group(calls, mode="prefix_merging", eot_for=eot_for)
    per_req = merge_group(calls, mode="per_request", eot_for=eot_for)
    assert sorted(check_cover(calls, merged)) == sorted(check_cover(calls, per_req))
    assert len(per_req.sequences) == sum(c.eligible for c in calls)
    assert merged.placement.keys() == per_req.placement.keys()
    assert {k: v[1] for k, v in merged.placement.items()} == {k: v[1] for k, v in per_req.placement.items()}
    # the toy template always closes a turn with EOT: the only breaks are compactions
    assert {b.cause for b in merged.breaks} <= {"prefix_diverged"}
    supersede = sum(1 for s in merged.sequences if "superseded" in s.flags)
    assert supersede == sum(1 for s in per_req.sequences if "superseded" in s.flags)
    assert sum(s.n_trainable for s in merged.sequences) == sum(s.n_trainable for s in per_req.sequences)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops_lists, min_size=1, max_size=4), st.integers(0, 1000))
def test_3_written_sequences_keep_the_invariants(sessions, seed):
    recs = []
    for i, ops in enumerate(sessions):
        recs += session_records(f"s{i}" if i else None, ops, seed=seed + i)
    with tempfile.TemporaryDirectory() as d:
        write_flows(f"{d}/flows", recs, per_file=5)
        # allow_empty: some drawn op lists write no record at all (e.g. only "drift")
        process(Options(inputs=(f"{d}/flows",), out=f"{d}/out", eot_token_ids=(EOT,), allow_empty=True))
        seqs = pl.read_parquet(f"{d}/out/sequences.parquet")
        calls = pl.read_parquet(f"{d}/out/calls.parquet")
    by_id = {r["id"]: r for r in recs}
    assert calls.height == len(recs)
    for row in seqs.iter_rows(named=True):
        ids, mask = row["input_ids"], row["loss_mask"]
        assert len(ids) == len(mask) == row["n_tokens"]
        sampled = [t for t, m in zip(ids, mask) if m]
        want = []
        for cid in row["call_ids"]:
            want += np.frombuffer(by_id[cid]["completion_token_ids"], "<i4").tolist()
        assert sampled == want and row["n_trainable"] == len(want)
        first = np.frombuffer(by_id[row["call_ids"][0]]["prompt_token_ids"], "<i4").tolist()
        assert ids[:len(first)] == first
    placed = calls.filter(pl.col("sequence_id").is_not_null())
    assert placed.height == sum(row["n_calls"] for row in seqs.iter_rows(named=True))
