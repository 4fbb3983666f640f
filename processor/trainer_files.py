"""report.html's sections for the trainer's files in OUT, each a `report.Section` with a stable element id:

- polar-verify's `verify.parquet` (one row per sequence and weight version: the recomputed vs recorded logprob gaps).
  polar-verify adds this section to OUT/report.html itself (`report.replace_section`); polar-process renders it again
  when it rewrites the report over an OUT that holds the file. Rows stamped with another `sequences_sha256` than
  OUT's sequences.parquet checked other sequences: they are stale, and their section is left out.
- a `train.jsonl` (one JSON object per optimizer step): one curve per numeric key, drawn with the figures polar-train's
  own report uses.

A file that cannot be read gets its section all the same, saying so: never a failed report."""

from __future__ import annotations

import hashlib
import html
import math
import os

import orjson
import polars as pl

from polar.processor import figures
from polar.processor.report import Section

__all__ = ["STEPS_SECTION_ID", "VERIFY_SECTION_ID", "file_sha256", "out_sections", "read_steps", "read_verify",
           "stale", "steps_section", "trainer_sections", "verify_section"]

VERIFY_SECTION_ID = "polar-verify"
STEPS_SECTION_ID = "polar-train"
VERIFY_TITLE, STEPS_TITLE = "Verify: recomputed vs recorded logprobs", "Training steps"


def file_sha256(path: str) -> str:
    """The content hash polar-verify stamps on verify.parquet (`sequences_sha256`): sha256 of the file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_verify(path: str) -> list[dict]:
    """verify.parquet's rows."""
    return pl.read_parquet(path).to_dicts()


def read_steps(path: str) -> list[dict]:
    """train.jsonl: one JSON object per optimizer step, blank lines skipped."""
    out = []
    with open(path, "rb") as fh:
        for line in fh:
            if line.strip():
                row = orjson.loads(line)
                if isinstance(row, dict):
                    out.append(row)
    return out


def stale(rows: list[dict], sequences_sha256: str | None) -> bool:
    """verify rows that checked another sequences.parquet than the one the report is about."""
    stamps = {r.get("sequences_sha256") for r in rows} - {None}
    return sequences_sha256 is not None and bool(stamps) and stamps != {sequences_sha256}


def _numbers(rows: list[dict], key: str) -> list[float]:
    return [r[key] for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]


def verify_section(rows: list[dict]) -> Section:
    """The gaps' facts in one sentence and their histograms."""
    med, mx, within = (_numbers(rows, k) for k in ("median_abs_gap", "max_abs_gap", "share_within"))
    checked = sum(r["n_checked"] for r in rows if isinstance(r.get("n_checked"), int))
    fmt = figures.fmt
    facts = (f"{len(rows):,} sequences, {checked:,} tokens checked; median |gap| (median over sequences) "
             f"{fmt(sorted(med)[len(med) // 2] if med else None)}, largest |gap| {fmt(max(mx, default=None))}, "
             f"mean share within tolerance {fmt(math.fsum(within) / len(within) if within else None)}")
    return Section(VERIFY_SECTION_ID, VERIFY_TITLE,
                   f"<p>{html.escape(facts)}</p>"
                   + figures.value_histogram(med, "Median |logprob gap| per sequence", "nats")
                   + figures.value_histogram(mx, "Largest |logprob gap| per sequence", "nats"))


def steps_section(rows: list[dict]) -> Section:
    """One curve per numeric key of the steps (in the order the keys first appear), over `step` (or the line's
    number when a line has none)."""
    steps = [r.get("step") if isinstance(r.get("step"), (int, float)) else i + 1 for i, r in enumerate(rows)]
    keys = list(dict.fromkeys(k for r in rows for k in r if k != "step" and _numbers([r], k)))
    curves = "".join(figures.line_chart(k, [("", [(s, r.get(k)) for s, r in zip(steps, rows)])]) for k in keys)
    return Section(STEPS_SECTION_ID, STEPS_TITLE,
                   f"<p>{len(rows):,} steps (train.jsonl)</p>"
                   + (curves or "<p>no numeric series</p>"))


def out_sections(verify: str | None, steps: str | None, sequences_sha256: str | None = None) -> list[Section]:
    """The sections of the files given that exist: verify.parquet's (unless stale) and train.jsonl's."""
    out = []
    for path, section_id, title, read, render in (
            (verify, VERIFY_SECTION_ID, VERIFY_TITLE, read_verify, verify_section),
            (steps, STEPS_SECTION_ID, STEPS_TITLE, read_steps, steps_section)):
        if not path or not os.path.isfile(path):
            continue
        try:
            rows = read(path)
        except (OSError, ValueError, pl.exceptions.PolarsError) as exc:  # orjson's JSONDecodeError is a ValueError
            out.append(Section(section_id, title, f'<p class="notice">{html.escape(os.path.basename(path))}: '
                                                  f"unreadable ({html.escape(str(exc))})</p>"))
            continue
        if render is verify_section and stale(rows, sequences_sha256):
            continue
        out.append(render(rows))
    return out


def trainer_sections(verify: str | None, train: str | None, sequences_sha256: str | None = None) -> str:
    """`out_sections` rendered, as they stand in the page ("" when there is none)."""
    return "".join(s.render() for s in out_sections(verify, train, sequences_sha256))
