"""polar-verify OUT --model [VERSION=]DIR... (docs/architecture.md#the-trainer-side): do the recorded logprobs match the
policy's?

Every trainable token of OUT/sequences.parquet is recomputed with transformers (polar.trainer.recompute: the stored
ids, logits at t−1 for token t, raw log-softmax) under the checkpoint of the weight version that
sampled its call, and compared with the recorded logprob.
- `--model VERSION=DIR` is the checkpoint of one weight version; a DIR without `VERSION=` serves every version that
  has none of its own (and calls whose version is unknown). A token whose version has no DIR is skipped and counted.
- Tokens of constrained calls (tool_choice required/named, JSON schema: vLLM's logprobs are after the grammar mask)
  are counted apart (`n_constrained`), never compared. Tokens of calls not sampled at T=1/top_p=1/top_k=-1 under
  raw_logprobs, and of rows without logprobs, are skipped and counted (`n_skipped`).
- Sequences flagged context_mismatch or missing_logprobs are expected to disagree: they are reported apart
  (`flagged`), and the bound is judged on the others (on all tokens when every sequence is flagged).

Writes OUT/verify.parquet (one row per sequence and weight version; VERIFY_SCHEMA, stamped with the sha256 of the
sequences.parquet it checked) and rewrites OUT/report.json (`verify`) and OUT/report.html (its verify section)
atomically. Exit 0: the median |gap| is within --max-median; 1: it is over; 2: bad input (one line names the fix).
torch is imported only after the arguments are checked, so the console script in an environment without it says
which one to use instead of a traceback.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from polar.records import out as out_tables
from polar.records.files import write_atomic
from polar.trainer import has_trainer_env, needs_trainer_env
from polar.trainer.args import OneLineParser

NEEDS_TRAIN = needs_trainer_env("polar-verify")
VERIFY_SCHEMA: dict[str, pl.DataType] = {
    "sequence_id": pl.Utf8, "weight_version": pl.Utf8, "n_checked": pl.Int32, "n_constrained": pl.Int32,
    "n_skipped": pl.Int32, "median_abs_gap": pl.Float64, "max_abs_gap": pl.Float64, "share_within": pl.Float64,
    "kl_k3": pl.Float64, "verify_flags": pl.List(pl.Utf8), "sequences_sha256": pl.Utf8,
}
EXPECTED_TO_DISAGREE = ("context_mismatch", "missing_logprobs")
CARRIED_FLAGS = (*EXPECTED_TO_DISAGREE, "mixed_weight_versions", "constrained_decoding")
MICRO_BATCH_TOKENS = 8192
ANY_VERSION = "*"  # the key of a DIR given without VERSION=


class BadInput(ValueError):
    """Exit 2: the message is the one line that names the fix."""


# ---------------------------------------------------------------------------------------------------- arguments

def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="polar-verify", description=__doc__.split("\n\n")[0],
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("out", metavar="OUT", help="a polar-process output directory (sequences.parquet, calls.parquet)")
    p.add_argument("--model", action="extend", nargs="+", required=True, metavar="[VERSION=]DIR",
                   help="HF checkpoint that served weight version VERSION (several, or repeated); without VERSION=, "
                        "every version that has no DIR of its own")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="recompute dtype")
    p.add_argument("--tolerance", type=float, default=0.01, help="|gap| in nats counted as within (share_within)")
    p.add_argument("--max-median", type=float, default=0.1, help="bound on the median |gap| (0 = off)")
    p.add_argument("--sample", type=int, default=None, metavar="N", help="check N sequences drawn at random "
                   "(seed 0) instead of all")
    return p


def parse_models(values: list[str]) -> dict[str, str]:
    """{version or ANY_VERSION: DIR}; a repeated version or an unloadable DIR is bad input."""
    from polar.trainer.recompute import model_problem  # no torch at import

    out: dict[str, str] = {}
    for v in values:
        version, sep, path = v.partition("=") if "=" in v and not os.path.isdir(v) else ("", "", v)
        key = version if sep else ANY_VERSION
        if sep and not version:
            raise BadInput(f"--model {v!r}: empty VERSION (write VERSION=DIR, or DIR alone)")
        if key in out:
            raise BadInput(f"--model: version {key!r} given twice (one DIR per version)")
        problem = model_problem(path)
        if problem:
            raise BadInput(f"--model {v}: {problem}")
        out[key] = path
    return out


def check_args(args) -> None:
    if not (args.tolerance > 0):
        raise BadInput(f"--tolerance {args.tolerance}: must be > 0")
    if args.max_median < 0:
        raise BadInput(f"--max-median {args.max_median}: must be ≥ 0 (0 = off)")
    if args.sample is not None and args.sample < 1:
        raise BadInput(f"--sample {args.sample}: must be ≥ 1")
    path = os.path.join(args.out, "sequences.parquet")
    if not os.path.isfile(path):
        raise BadInput(f"{args.out}: no sequences.parquet (pass a polar-process output directory)")
    try:
        have = out_tables.read_schema(path)
    except out_tables.OutVersionError as exc:
        raise BadInput(str(exc)) from None
    lacking = [c for c in ("sequence_id", "input_ids", "loss_mask", "logprobs", "call_ids", "flags") if c not in have]
    if lacking:
        raise BadInput(f"{path}: lacks column(s) {', '.join(lacking)} (re-run polar-process)")


# ---------------------------------------------------------------------------------------------------- the plan

@dataclass
class Part:
    """The tokens of one sequence sampled under one weight version."""

    sequence_id: str
    version: str | None
    check: np.ndarray  # bool per token: recompute and compare
    n_constrained: int = 0
    n_skipped: int = 0
    flags: set[str] = field(default_factory=set)
    gaps: np.ndarray | None = None  # recomputed − recorded, on `check`
    shifted: np.ndarray | None = None  # recorded[t] vs recomputed[t + 1], on check[t] & check[t + 1]


def _token_calls(row: dict, mask: np.ndarray, calls: dict, n_calls: int) -> tuple[np.ndarray, list, bool]:
    """Per token the index into the row's call list (−1: not a completion token), the list, and whether the spans
    were known (unknown: every trainable token is given to the row's calls together, as index −2)."""
    from polar.trainer.loader import completion_spans

    owner = np.full(len(mask), -1, dtype=np.int64)
    spans = completion_spans(row, mask, calls)
    if spans is None:
        owner[mask > 0] = -2
        return owner, list(row.get("call_ids") or [])[:n_calls], False
    ids = [c for c, _, _ in spans]
    for k, (_, s, e) in enumerate(spans):
        owner[s:e] = k
    return owner, ids, True


def _call_facts(call_ids: list, calls: dict, row_flags: list) -> list[tuple[str | None, bool, str | None]]:
    """(weight_version, constrained, off-policy sampling reason) per call; a call calls.parquet lacks is taken as
    unconstrained only when the row is not flagged constrained_decoding."""
    out = []
    for c in call_ids:
        info = calls.get(c)
        if info is None:
            out.append((None, "constrained_decoding" in row_flags, None))
            continue
        constrained = info.constrained if info.constrained is not None else "constrained_decoding" in row_flags
        out.append((info.weight_version, bool(constrained), info.off_policy_sampling))
    return out


def plan_row(row: dict, mask: np.ndarray, has_logprobs: bool, calls: dict, models: dict) -> list[Part]:
    """The parts of one sequence: per weight version its tokens to check, constrained and skipped."""
    flags = set(row.get("flags") or []) & set(CARRIED_FLAGS)
    trainable = mask > 0
    trainable[:1] = False
    owner, ids, known = _token_calls(row, trainable.astype(np.uint8), calls, len(row.get("call_ids") or []))
    facts = _call_facts(ids, calls, row.get("flags") or [])
    if not known:
        flags.add("spans_unknown")
        versions = {f[0] for f in facts}
        merged = (versions.pop() if len(versions) == 1 else None, any(f[1] for f in facts),
                  next((f[2] for f in facts if f[2]), None))
        facts, owner = [merged], np.where(owner == -2, 0, owner)
    by_version: dict[str | None, list[int]] = {}
    for k, f in enumerate(facts):
        by_version.setdefault(f[0], []).append(k)
    parts = []
    for version, ks in by_version.items() or {None: []}.items():
        mine = trainable & np.isin(owner, ks)
        constrained = mine & np.isin(owner, [k for k in ks if facts[k][1]])
        off = mine & ~constrained & np.isin(owner, [k for k in ks if facts[k][2]])
        check = mine & ~constrained & ~off
        p = Part(row["sequence_id"], version, check, int(constrained.sum()), int(off.sum()), set(flags))
        if off.any():
            p.flags.add("sampling_not_pinned")
        if check.any() and not has_logprobs:
            p.n_skipped, p.check = p.n_skipped + int(check.sum()), np.zeros_like(check)
        elif check.any() and model_for(version, models) is None:
            p.n_skipped, p.check = p.n_skipped + int(check.sum()), np.zeros_like(check)
            p.flags.add("no_model")
        parts.append(p)
    return parts


def model_for(version: str | None, models: dict[str, str]) -> str | None:
    return models.get(version) if version in models else models.get(ANY_VERSION)


# ---------------------------------------------------------------------------------------------------- recompute

def recompute(parts: list[Part], arrays: dict, models: dict[str, str], dtype: str, loaded: dict | None = None) -> None:
    """Fill each part's gaps: one model load per DIR (`loaded` maps a DIR to a model already in memory — polar-train
    passes its own, so the check costs no second load), per-sequence padded micro-batches under no_grad."""
    import torch
    from polar.trainer.loader import MicroBatches, Selection, SequenceTokens
    from polar.trainer.recompute import load_model, token_logprobs

    by_dir: dict[str, list[Part]] = {}
    for p in parts:
        if p.check.any():
            by_dir.setdefault(model_for(p.version, models), []).append(p)
    for model_dir, todo in by_dir.items():
        model = (loaded or {}).get(model_dir)
        if model is None:
            model = load_model(model_dir, dtype)
        seqs = [SequenceTokens(str(k), arrays[p.sequence_id][0], p.check.astype(np.float32),
                               arrays[p.sequence_id][1]) for k, p in enumerate(todo)]
        with torch.no_grad():
            for mb in MicroBatches(Selection(seqs, {}, []), MICRO_BATCH_TOKENS, "per_sequence"):
                lp = token_logprobs(model, **mb.model_inputs())
                for key, (b, s, e) in zip(mb.sequence_ids, mb.segments):
                    p = todo[int(key)]
                    new, old = lp[b, s:e].numpy().astype(np.float64), arrays[p.sequence_id][1].astype(np.float64)
                    p.gaps = (new - old)[p.check]
                    both = p.check[:-1] & p.check[1:]
                    p.shifted = np.abs(old[:-1] - new[1:])[both]
        del model


# ---------------------------------------------------------------------------------------------------- results

def _stats(gaps: np.ndarray, tolerance: float) -> dict:
    if not len(gaps):
        return {"tokens": 0, "median_abs_gap": None, "mean_abs_gap": None, "p95_abs_gap": None, "max_abs_gap": None,
                "share_within": None, "kl_k3": None}
    a = np.abs(gaps)
    return {"tokens": len(a), "median_abs_gap": float(np.median(a)), "mean_abs_gap": float(a.mean()),
            "p95_abs_gap": float(np.quantile(a, 0.95)), "max_abs_gap": float(a.max()),
            "share_within": float((a <= tolerance).mean()), "kl_k3": float(np.mean(np.expm1(gaps) - gaps))}


def verify_frame(parts: list[Part], tolerance: float, digest: str) -> pl.DataFrame:
    rows = []
    for p in parts:
        st = _stats(p.gaps if p.gaps is not None else np.zeros(0), tolerance)
        flags = set(p.flags)
        if st["max_abs_gap"] is not None and st["max_abs_gap"] > tolerance:
            flags.add("over_tolerance")
        rows.append({"sequence_id": p.sequence_id, "weight_version": p.version, "n_checked": st["tokens"],
                     "n_constrained": p.n_constrained, "n_skipped": p.n_skipped,
                     "median_abs_gap": st["median_abs_gap"], "max_abs_gap": st["max_abs_gap"],
                     "share_within": st["share_within"], "kl_k3": st["kl_k3"], "verify_flags": sorted(flags),
                     "sequences_sha256": digest})
    return pl.DataFrame(rows, schema=VERIFY_SCHEMA, orient="row") if rows else pl.DataFrame(schema=VERIFY_SCHEMA)


def _gaps(parts: list[Part], attr: str = "gaps") -> np.ndarray:
    arrays = [getattr(p, attr) for p in parts if getattr(p, attr) is not None]
    return np.concatenate(arrays) if arrays else np.zeros(0)


def summarize(parts: list[Part], args, models: dict, digest: str, total_rows: int) -> dict:
    """report.json's `verify`: the bound's verdict and the counts behind it."""
    flagged = [p for p in parts if p.flags & set(EXPECTED_TO_DISAGREE)]
    clean = [p for p in parts if not p.flags & set(EXPECTED_TO_DISAGREE)]
    judged = clean if len(_gaps(clean)) else parts
    verdict = _stats(_gaps(judged), args.tolerance)
    over = bool(args.max_median and verdict["median_abs_gap"] is not None
                and verdict["median_abs_gap"] > args.max_median)
    versions = sorted({p.version for p in parts if p.version is not None})
    return {
        "sequences_sha256": digest, "models": models, "dtype": args.dtype, "tolerance": args.tolerance,
        "max_median": args.max_median, "sample": args.sample,
        "sequences": {"total": total_rows, "checked": len({p.sequence_id for p in parts}),
                      "flagged": len({p.sequence_id for p in flagged})},
        "tokens": {"checked": sum(int(p.check.sum()) for p in parts),
                   "constrained": sum(p.n_constrained for p in parts),
                   "skipped": sum(p.n_skipped for p in parts),
                   "skipped_no_model": sum(p.n_skipped for p in parts if "no_model" in p.flags),
                   "skipped_sampling": sum(p.n_skipped for p in parts if "sampling_not_pinned" in p.flags)},
        "judged_on": "unflagged" if judged is clean else "all",
        "unflagged": _stats(_gaps(clean), args.tolerance), "flagged": _stats(_gaps(flagged), args.tolerance),
        "per_version": {v: _stats(_gaps([p for p in parts if p.version == v]), args.tolerance) for v in versions},
        "shift_control_median": (float(np.median(_gaps(judged, "shifted"))) if len(_gaps(judged, "shifted"))
                                 else None),
        "median_abs_gap": verdict["median_abs_gap"], "share_within": verdict["share_within"],
        "max_abs_gap": verdict["max_abs_gap"], "kl_k3": verdict["kl_k3"],
        "within_bounds": not over, "exit": 1 if over else 0,
    }


# ---------------------------------------------------------------------------------------------------- outputs

def write_outputs(out: str, frame: pl.DataFrame, summary: dict) -> list[str]:
    """verify.parquet, then report.json's `verify` and report.html's section (each replaced atomically); returns
    notes for whatever could not be updated."""
    from polar.processor.report import replace_section
    from polar.processor.report_doc import ReportError, add_verify
    from polar.processor.trainer_files import verify_section

    notes = []
    path = os.path.join(out, "verify.parquet")
    buf = io.BytesIO()
    frame.write_parquet(buf)
    write_atomic(path, buf.getvalue())
    report_json = os.path.join(out, "report.json")
    if os.path.isfile(report_json):
        try:
            add_verify(report_json, summary)
        except (OSError, ReportError) as exc:
            notes.append(f"{exc}: its verify key is not written")
    else:
        notes.append(f"{report_json} is missing: no report to add the verify section to")
    report_html = os.path.join(out, "report.html")
    if os.path.isfile(report_html):
        with open(report_html, encoding="utf-8") as fh:
            page = fh.read()
        try:
            write_atomic(report_html, replace_section(page, verify_section(frame.to_dicts())).encode())
        except ValueError as exc:
            notes.append(f"{report_html}: {exc}")
    return notes


def summary_line(s: dict) -> str:
    fmt = lambda x: "n/a" if x is None else f"{x:.3g}"
    t = s["tokens"]
    return (f"polar-verify: {'within bounds' if s['within_bounds'] else 'BOUND EXCEEDED'}: median |gap| "
            f"{fmt(s['median_abs_gap'])} (bound {s['max_median'] or 'off'}), {fmt(s['share_within'])} within "
            f"{s['tolerance']:g} nats, max {fmt(s['max_abs_gap'])}, k3 {fmt(s['kl_k3'])} over "
            f"{'the unflagged' if s['judged_on'] == 'unflagged' else 'all'} sequences; tokens checked {t['checked']}, "
            f"constrained {t['constrained']}, skipped {t['skipped']} "
            f"(no model {t['skipped_no_model']}, sampling {t['skipped_sampling']}); flagged sequences "
            f"{s['sequences']['flagged']} (median {fmt(s['flagged']['median_abs_gap'])}); shift-by-one control "
            f"median {fmt(s['shift_control_median'])}")


# ---------------------------------------------------------------------------------------------------- main

def run(args, loaded: dict | None = None, say=print, nothing_ok: bool = False) -> int:
    """Check, recompute, write; the exit code. `loaded`: {DIR: model in memory} (see recompute); `say` gets the
    summary line; `nothing_ok`: no token to check (every one of a version without a DIR) is a summary with nothing
    checked, not bad input (polar-train, whose stale samples are left to a standalone polar-verify)."""
    from polar.processor.trainer_files import file_sha256
    from polar.trainer.loader import read_calls, row_arrays

    check_args(args)
    models = parse_models(args.model)
    path = os.path.join(args.out, "sequences.parquet")
    digest = file_sha256(path)
    df = out_tables.read(path)
    total = len(df)
    if args.sample is not None and args.sample < total:
        df = df.select(pl.all().gather(sorted(random.Random(0).sample(range(total), args.sample))))
    calls = read_calls(args.out)
    ids, masks, lps = row_arrays(df) if len(df) else ([], [], [])
    arrays, parts = {}, []
    for i, row in enumerate(df.drop("input_ids", "loss_mask", "logprobs").iter_rows(named=True)):
        arrays[row["sequence_id"]] = (ids[i], lps[i])
        parts.extend(plan_row(row, masks[i], lps[i] is not None, calls, models))
    if not nothing_ok and not any(p.check.any() for p in parts):
        lacking = sorted({str(p.version) for p in parts if "no_model" in p.flags})
        raise BadInput("no token to check" + (f": no --model for weight version(s) {', '.join(lacking)} (pass "
                                              "--model VERSION=DIR)" if lacking else f" in {path}"))
    recompute(parts, arrays, models, args.dtype, loaded)
    summary = summarize(parts, args, models, digest, total)
    for note in write_outputs(args.out, verify_frame(parts, args.tolerance, digest), summary):
        print(f"polar-verify: note: {note}", file=sys.stderr)
    say(summary_line(summary))
    return summary["exit"]


def main(argv: list[str] | None = None) -> int:
    if not has_trainer_env():
        print(NEEDS_TRAIN, file=sys.stderr)
        return 2
    args = parser().parse_args(argv)
    started = time.perf_counter()
    try:
        code = run(args)
    except BadInput as exc:
        print(f"polar-verify: {exc}", file=sys.stderr)
        return 2
    print(f"polar-verify: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
