"""polar.trainer.loader (docs/architecture.md#the-trainer-side): micro-batches from batches/*.parquet, per_sequence and
packed.

Scenarios:
1.x layouts: both give the same per-token logprobs on the tiny model (transformers 5.19 builds the block-diagonal
    mask from position resets); masks, π_old and advantages stay on their tokens.
2.x budgets: per_sequence pads within max_tokens; an oversize sequence is alone, whole, with a note.
3.x rows left out: null advantage, null logprobs, calls not sampled at T=1 (masked, counted).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from polar.processor.writers import SEQUENCES_SCHEMA
from polar.trainer import loader
from polar.trainer.recompute import load_model, token_logprobs
from tests.support.need import need

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / ".cache" / "models" / "tiny"
VOCAB = 3072


def _row(k: int, n: int, prompt: int, advantage: float | None = 0.5, logprobs: bool = True,
         calls: list[tuple[str, int, int]] | None = None) -> dict:
    """A sequence of n random ids whose tokens after `prompt` are trainable (one call), logprob −(t mod 7)/10."""
    rng = np.random.default_rng(k)
    mask = np.zeros(n, np.uint8)
    mask[prompt:] = 1
    lps = np.where(mask > 0, -(np.arange(n) % 7) / 10, 0).astype(np.float32)
    spans = calls or [(f"c{k}", prompt, n)]
    return {"sequence_id": f"s{k}", "chain_id": f"s{k}", "session": f"sess{k}", "group": "g", "mode": "prefix_merging",
            "input_ids": rng.integers(1, VOCAB, n).tolist(), "loss_mask": mask.tolist(),
            "logprobs": lps.tolist() if logprobs else None, "call_ids": [c for c, _, _ in spans], "n_calls": len(spans),
            "n_tokens": n, "n_trainable": int(mask.sum()), "prompt_len": prompt, "flags": [], "break_cause": None,
            "model": "tiny", "reward": 1.0, "advantage": advantage, "weight_versions": [],
            "call_spans": [{"call_id": c, "start": s, "end": e} for c, s, e in spans]}


def _write(out: Path, rows: list[dict], calls: list[dict] | None = None) -> Path:
    """OUT/batches/batch-00000.parquet (+ OUT/calls.parquet) with the processor's schema."""
    (out / "batches").mkdir(parents=True)
    schema = {k: v for k, v in SEQUENCES_SCHEMA.items()}
    pl.DataFrame(rows, schema=schema, orient="row").write_parquet(out / "batches" / "batch-00000.parquet")
    if calls is not None:
        pl.DataFrame(calls).write_parquet(out / "calls.parquet")
    return out / "batches"


@pytest.fixture(scope="module")
def tiny():
    need(None if (TINY / "config.json").is_file() else f"no tiny model at {TINY}", setup="scripts/setup --models")
    return load_model(str(TINY))


def _per_sequence_logprobs(model, batches) -> dict[str, tuple[torch.Tensor, ...]]:
    """sequence id → (logprobs, loss mask, π_old, advantages) of its tokens, whatever the layout."""
    out = {}
    with torch.no_grad():
        for mb in batches:
            lp = token_logprobs(model, **mb.model_inputs())
            for sid, (b, s, e) in zip(mb.sequence_ids, mb.segments):
                out[sid] = (lp[b, s:e], mb.loss_mask[b, s:e], mb.old_logprobs[b, s:e], mb.advantages[b, s:e])
    return out


def test_1_1_packed_and_padded_give_identical_logprobs(tmp_path, tiny):
    rows = [_row(k, n, p, advantage=0.1 * k) for k, (n, p) in enumerate([(300, 200), (41, 30), (170, 100), (9, 4)])]
    batches = _write(tmp_path, rows)
    padded = loader.micro_batches(str(batches), 400, "per_sequence")
    packed = loader.micro_batches(str(batches), 400, "packed")
    assert len(packed) < len(padded)  # packing really shares rows here
    a, b = _per_sequence_logprobs(tiny, padded), _per_sequence_logprobs(tiny, packed)
    assert set(a) == set(b) == {r["sequence_id"] for r in rows}
    for sid in a:
        assert torch.equal(a[sid][1], b[sid][1]) and torch.equal(a[sid][2], b[sid][2])
        assert torch.allclose(a[sid][0][1:], b[sid][0][1:], atol=1e-5), sid
    # and a sequence alone in its own forward gives the same numbers: padding and packing change nothing
    alone = torch.tensor([rows[1]["input_ids"]])
    with torch.no_grad():
        ref = token_logprobs(tiny, alone)[0]
    assert torch.allclose(ref[1:], b["s1"][0][1:], atol=1e-5)


def test_1_2_masks_logprobs_and_advantages_stay_on_their_tokens(tmp_path):
    rows = [_row(0, 50, 20, advantage=-0.75), _row(1, 30, 10, advantage=2.0)]
    batches = _write(tmp_path, rows)
    for layout in loader.LAYOUTS:
        got = {}
        for mb in loader.micro_batches(str(batches), 100, layout):
            assert mb.sessions == [f"sess{sid[1:]}" for sid in mb.sequence_ids]  # each segment's session
            for sid, (b, s, e) in zip(mb.sequence_ids, mb.segments):
                got[sid] = (mb.input_ids[b, s:e], mb.loss_mask[b, s:e], mb.old_logprobs[b, s:e], mb.advantages[b, s:e],
                            mb.position_ids[b, s:e])
        for r in rows:
            ids, mask, old, adv, pos = got[r["sequence_id"]]
            assert ids.tolist() == r["input_ids"]
            assert mask.tolist() == [float(m) for m in r["loss_mask"]]
            assert torch.allclose(old, torch.tensor(r["logprobs"]))
            assert adv.tolist() == [r["advantage"] * m for m in r["loss_mask"]]
            assert pos.tolist() == list(range(r["n_tokens"]))  # restart per sequence in packed rows too


def _advantages_of(batches) -> dict[str, list[float]]:
    out = {}
    for mb in loader.micro_batches(str(batches), 100, "packed"):
        for sid, (b, s, e) in zip(mb.sequence_ids, mb.segments):
            out[sid] = mb.advantages[b, s:e].tolist()
    return out


def test_1_4_the_per_token_advantages_column_is_what_the_tensor_holds(tmp_path):
    # --credit turn: the first call's tokens carry 0.5 + 0.25, the second's 0.5 − 1.0 (rule 11's terms)
    row = _row(0, 12, 4, advantage=0.5, calls=[("c0", 4, 8), ("c1", 8, 12)])
    row["advantages"] = [0.0] * 4 + [0.75] * 4 + [-0.5] * 4
    got = _advantages_of(_write(tmp_path / "turn", [row]))["s0"]
    assert got == [0.0] * 4 + [0.75] * 4 + [-0.5] * 4


def test_1_5_a_file_without_the_column_broadcasts_the_scalar_as_credit_session_writes_it(tmp_path):
    rows = [_row(0, 40, 15, advantage=-0.3), _row(1, 25, 5, advantage=1 / 3)]
    for r in rows:  # what polar-process --credit session writes: float32(advantage) on trained tokens, 0.0 elsewhere
        r["advantages"] = np.where(np.array(r["loss_mask"]) == 1, np.float32(r["advantage"]), 0).astype(
            np.float32).tolist()
    with_column = _advantages_of(_write(tmp_path / "v2", rows))
    old = tmp_path / "v1" / "batches"
    old.mkdir(parents=True)
    schema = {k: v for k, v in SEQUENCES_SCHEMA.items() if k != "advantages"}  # OUT version 1: no column
    pl.DataFrame([{k: r[k] for k in schema} for r in rows], schema=schema, orient="row").write_parquet(
        old / "batch-00000.parquet")
    without = _advantages_of(old)
    assert with_column == without  # bit for bit: both float32 tensors of the same values
    assert without["s0"][20] == float(np.float32(-0.3)) and without["s0"][3] == 0.0


def test_1_6_a_null_advantages_row_beside_others_keeps_each_rows_own(tmp_path):
    """A step where one group had no reward spread: its rows' advantages are null beside rows that have them (what
    an lr-0 control's step 1 hit: the null lengths made the split points floats)."""
    df = pl.DataFrame({"advantages": [[0.5, 0.5], None, [-1.0, 0.0, -1.0]]},
                      schema={"advantages": pl.List(pl.Float32)})
    got = loader.token_advantages(df)
    assert [None if a is None else a.tolist() for a in got] == [[0.5, 0.5], None, [-1.0, 0.0, -1.0]]
    assert loader.token_advantages(df[1:2]) == [None]


def test_1_3_token_zero_is_never_trainable(tmp_path):
    row = _row(0, 10, 0)  # a (malformed) row whose first token is marked trainable
    mb = next(iter(loader.micro_batches(str(_write(tmp_path, [row])), 100, "packed")))
    assert mb.loss_mask[0, 0] == 0 and mb.loss_mask[0, 1:].sum() == 9


def test_2_1_per_sequence_is_length_sorted_and_within_budget(tmp_path):
    lengths = [30, 100, 60, 90, 20, 55]
    batches = _write(tmp_path, [_row(k, n, n // 2) for k, n in enumerate(lengths)])
    mbs = loader.micro_batches(str(batches), 200, "per_sequence")
    seen = []
    for mb in mbs:
        b, width = mb.input_ids.shape
        assert b * width <= 200
        assert mb.attention_mask.sum().item() == mb.n_tokens
        seen += [e - s for _, s, e in mb.segments]
    assert seen == sorted(lengths, reverse=True)
    assert mbs.counts["tokens_forward"] == sum(lengths)


def test_2_2_an_oversize_sequence_is_alone_and_whole_with_a_note(tmp_path):
    batches = _write(tmp_path, [_row(0, 500, 100), _row(1, 40, 20), _row(2, 30, 10)])
    for layout in loader.LAYOUTS:
        mbs = loader.micro_batches(str(batches), 128, layout)
        sizes = [[e - s for _, s, e in mb.segments] for mb in mbs]
        assert [500] in sizes and sum(map(sum, sizes)) == 570
        assert mbs.counts["oversize"] == 1
        assert any("s0 has 500 tokens > max_tokens 128" in n for n in mbs.notes)


def test_3_1_rows_without_advantage_or_logprobs_are_left_out_and_counted(tmp_path):
    rows = [_row(0, 40, 20), _row(1, 40, 20, advantage=None), _row(2, 40, 20, logprobs=False)]
    mbs = loader.micro_batches(str(_write(tmp_path, rows)), 1000, "per_sequence")
    assert [sid for mb in mbs for sid in mb.sequence_ids] == ["s0"]
    assert mbs.counts["left_out_null_advantage"] == 1 and mbs.counts["left_out_missing_logprobs"] == 1
    assert len(mbs.notes) == 2


def test_3_2_calls_not_sampled_at_t1_are_masked_out_and_counted(tmp_path):
    row = _row(0, 60, 10, calls=[("a", 10, 30), ("b", 40, 60)])
    row["loss_mask"] = [0] * 10 + [1] * 20 + [0] * 10 + [1] * 20  # two completions, a tool result between
    calls = [{"call_id": "a", "completion_tokens": 20, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
              "logprobs_mode": "raw_logprobs", "constrained": False},
             {"call_id": "b", "completion_tokens": 20, "temperature": 0.7, "top_p": 1.0, "top_k": -1,
              "logprobs_mode": "raw_logprobs", "constrained": False}]
    mbs = loader.micro_batches(str(_write(tmp_path, [row], calls)), 1000, "packed")
    mb = next(iter(mbs))
    assert mb.loss_mask[0, 10:30].sum() == 20 and mb.loss_mask[0, 40:60].sum() == 0
    assert mbs.counts["sampling_calls_left_out"] == 1 and mbs.counts["sampling_tokens_left_out"] == 20
    assert mbs.counts["tokens_trainable"] == 20


def test_3_3_spans_from_the_mask_when_sequences_have_no_call_spans(tmp_path):
    row = _row(0, 60, 10, calls=[("a", 10, 30), ("b", 40, 60)])
    row["loss_mask"] = [0] * 10 + [1] * 20 + [0] * 10 + [1] * 20
    row["call_spans"] = None
    spans = loader.completion_spans(row, np.array(row["loss_mask"]), {
        "a": loader.CallInfo("a", completion_tokens=20), "b": loader.CallInfo("b", completion_tokens=20)})
    assert spans == [("a", 10, 30), ("b", 40, 60)]
    assert loader.completion_spans(row, np.array(row["loss_mask"]), {
        "a": loader.CallInfo("a", completion_tokens=25), "b": loader.CallInfo("b", completion_tokens=15)}) is None


def _version(v: str | None) -> int | None:
    return int(v.split("-")[1]) if v and v.startswith("step-") else None


def test_4_1_rows_staler_than_the_limit_are_left_out_and_counted(tmp_path):
    """Staleness = the current version − the oldest version among a row's calls: s0 sampled by step-0003 (0 behind
    step-0003), s1 with one call by step-0001 (2 behind), s2 by step-0002 (1), s3's call has no version (unknown)."""
    rows = [_row(0, 40, 20), _row(1, 40, 20, calls=[("c1", 20, 30), ("c1b", 30, 40)]), _row(2, 40, 20),
            _row(3, 40, 20)]
    calls = [{"call_id": c, "completion_tokens": n, "weight_version": v, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
              "logprobs_mode": "raw_logprobs", "constrained": False}
             for c, n, v in (("c0", 20, "step-0003"), ("c1", 10, "step-0003"), ("c1b", 10, "step-0001"),
                             ("c2", 20, "step-0002"), ("c3", 20, None))]
    rule = loader.Staleness(current=3, index=_version, limit=1)
    mbs = loader.micro_batches(str(_write(tmp_path, rows, calls)), 1000, "per_sequence", staleness=rule)
    kept = {s.sequence_id: s.staleness for g in mbs.groups for s in g}
    assert kept == {"s0": 0, "s2": 1, "s3": None}
    assert mbs.counts["left_out_stale"] == 1 and mbs.counts["staleness_unknown"] == 1
    by_id = {}
    for mb in mbs:
        for sid, (b, s, e) in zip(mb.sequence_ids, mb.segments):
            by_id[sid] = set(mb.staleness[b, s:e].tolist())
    assert by_id == {"s0": {0}, "s2": {1}, "s3": {-1}}
    unlimited = loader.micro_batches(str(_write(tmp_path / "all", rows, calls)), 1000, "per_sequence",
                                     staleness=loader.Staleness(current=3, index=_version))
    assert sorted(s.staleness if s.staleness is not None else -1 for g in unlimited.groups for s in g) == [-1, 0, 1, 2]
    assert unlimited.counts["left_out_stale"] == 0
