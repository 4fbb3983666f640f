"""OUT's tables — the second contract, after the flow record: what `polar-process` writes into its output directory
and what every trainer-side reader (the trainer's loader, polar-export, polar-verify, the report, the integrations)
reads back. Each table is a plain Polars schema with its rules; the version is stamped into every parquet file's
key-value metadata (`polar.out_version`).

- `SEQUENCES` (sequences.parquet) and `BATCHES` (batches/batch-NNNNN.parquet: the same rows, packed to a token
  budget): one merged training sequence a row. Rules: `len(input_ids) == len(loss_mask) == len(logprobs)` (logprobs
  may be null: a sequence without them) `== len(advantages)` (null: no advantage) `== n_tokens`; `advantage` and
  `reward` finite or null.
- `CALLS` (calls.parquet): one model call a row. Rule: `call_id` set.

Versions. A file without the stamp was written before tables had one (version 0): its columns are the same as
version 1's, so it is read (a reader that needs a column the file lacks says so in one line). Version 2 adds the
sequences' per-token `advantages`; a reader of a version 0 or 1 file broadcasts the scalar `advantage` over the
trained tokens instead (`has_token_advantages`), which is what version 2 writes under `--credit session`. A file of a newer
version than this reader knows is refused in one line (`OutVersionError`: update polar, or rerun polar-process).

This module imports Polars; nothing else of polar.records imports it (the addon never loads Polars).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import polars as pl

VERSION = 2
TOKEN_ADVANTAGES_SINCE = 2  # the first version whose sequences carry `advantages`
VERSION_KEY = "polar.out_version"


class OutVersionError(ValueError):
    """An OUT table this reader cannot read; str() is one line naming the file and the fix."""


@dataclass(frozen=True)
class Rule:
    """One rule of a table: `holds()` is the boolean expression each row must make true; `says` the rule as a
    sentence."""

    says: str
    holds: Callable[[], pl.Expr]


@dataclass(frozen=True)
class Table:
    name: str  # the file (or, for batches, the directory) under OUT
    schema: dict[str, pl.DataType]
    rules: tuple[Rule, ...] = ()

    def path(self, out: str | os.PathLike) -> str:
        return os.path.join(os.fspath(out), self.name)

    def frame(self, rows=None) -> pl.DataFrame:
        """An empty frame of this table (or `rows`, as dicts, in its schema)."""
        return pl.DataFrame(rows, schema=self.schema, orient="row") if rows else pl.DataFrame(schema=self.schema)

    def problems(self, frame: pl.DataFrame) -> list[str]:
        """One line per rule that some row breaks: the rule and how many rows break it."""
        out = []
        for rule in self.rules:
            if not frame.height or not set(_columns(rule)) <= set(frame.columns):
                continue
            broken = frame.select((~rule.holds().fill_null(False)).sum()).item()
            if broken:
                out.append(f"{self.name}: {broken} row(s) break the rule: {rule.says}")
        return out


def _columns(rule: Rule) -> list[str]:
    return rule.holds().meta.root_names()


def _finite_or_null(column: str) -> Rule:
    return Rule(f"{column} is finite or null",
                lambda: pl.col(column).is_null() | pl.col(column).is_finite())


SEQUENCES_SCHEMA: dict[str, pl.DataType] = {
    "sequence_id": pl.Utf8, "chain_id": pl.Utf8, "session": pl.Utf8, "group": pl.Utf8, "mode": pl.Utf8,
    "input_ids": pl.List(pl.Int32), "loss_mask": pl.List(pl.UInt8), "logprobs": pl.List(pl.Float32),
    "call_ids": pl.List(pl.Utf8), "n_calls": pl.Int32, "n_tokens": pl.Int32, "n_trainable": pl.Int32,
    "prompt_len": pl.Int32, "flags": pl.List(pl.Utf8), "break_cause": pl.Utf8, "model": pl.Utf8,
    "reward": pl.Float64, "advantage": pl.Float64,
    # The trainer's view of the calls (docs/merge-rules.md#outputs): the distinct policy versions that sampled the
    # sequence, in call order, and where each call's completion lies in input_ids ([start, end), end exclusive).
    "weight_versions": pl.List(pl.Utf8),
    "call_spans": pl.List(pl.Struct({"call_id": pl.Utf8, "start": pl.Int64, "end": pl.Int64})),
    # Each token's advantage (docs/merge-rules.md rule 11): 0.0 on untrained tokens; under --credit session the
    # scalar `advantage` on every trained token; null when `advantage` is.
    "advantages": pl.List(pl.Float32),
}

SEQUENCE_RULES = (
    Rule("len(input_ids) == len(loss_mask)",
         lambda: pl.col("input_ids").list.len() == pl.col("loss_mask").list.len()),
    Rule("len(input_ids) == len(logprobs) (logprobs null: none recorded)",
         lambda: pl.col("logprobs").is_null() | (pl.col("input_ids").list.len() == pl.col("logprobs").list.len())),
    Rule("n_tokens == len(input_ids)", lambda: pl.col("n_tokens") == pl.col("input_ids").list.len()),
    Rule("len(input_ids) == len(advantages) (advantages null: no advantage)",
         lambda: pl.col("advantages").is_null() | (pl.col("input_ids").list.len() == pl.col("advantages").list.len())),
    Rule("advantages null exactly where advantage is",
         lambda: pl.col("advantages").is_null() == pl.col("advantage").is_null()),
    _finite_or_null("advantage"),
    _finite_or_null("reward"),
)

CALLS_SCHEMA: dict[str, pl.DataType] = {
    "call_id": pl.Utf8, "session": pl.Utf8, "session_source": pl.Utf8, "conn_id": pl.Utf8, "protocol": pl.Utf8,
    "host": pl.Utf8, "path": pl.Utf8, "model_requested": pl.Utf8, "model_served": pl.Utf8, "stream": pl.Boolean,
    "t_start": pl.Float64, "t_first_byte": pl.Float64, "t_end": pl.Float64, "prompt_tokens": pl.Int32,
    "completion_tokens": pl.Int32, "n_tool_calls": pl.Int32, "finish_reason": pl.Utf8, "stop_reason": pl.Utf8,
    "error": pl.Utf8, "temperature": pl.Float64, "top_p": pl.Float64, "top_k": pl.Int32, "logprobs_mode": pl.Utf8,
    "weight_version": pl.Utf8, "constrained": pl.Boolean, "replica": pl.Utf8, "template_hash": pl.Utf8,
    "messages": pl.Utf8, "tools": pl.Utf8, "assistant": pl.Utf8, "sequence_id": pl.Utf8,
    "chain_id": pl.Utf8, "source_file": pl.Utf8, "source_offset": pl.Int64,
}

SEQUENCES = Table("sequences.parquet", SEQUENCES_SCHEMA, SEQUENCE_RULES)
BATCHES = Table("batches", SEQUENCES_SCHEMA, SEQUENCE_RULES)
CALLS = Table("calls.parquet", CALLS_SCHEMA, (Rule("call_id is set", lambda: pl.col("call_id").is_not_null()),))


# -- the version stamp ---------------------------------------------------------------------------------------------

def metadata() -> dict[str, str]:
    """The key-value metadata every OUT parquet file is written with."""
    return {VERSION_KEY: str(VERSION)}


def version_of(path: str | os.PathLike) -> int:
    """The OUT version a parquet file was written at (0: before files carried one)."""
    value = pl.read_parquet_metadata(path).get(VERSION_KEY)
    try:
        return int(value) if value is not None else 0
    except ValueError:
        raise OutVersionError(f"{path}: OUT version {value!r} is not a number; rerun polar-process") from None


def check_version(path: str | os.PathLike) -> int:
    """The file's version when this reader reads it; OutVersionError (one line) for a newer one."""
    version = version_of(path)
    if version > VERSION:
        raise OutVersionError(f"{path}: written as OUT version {version}, this polar reads up to {VERSION}; update "
                              f"polar, or rerun polar-process with this one")
    return version


def has_token_advantages(path: str | os.PathLike) -> bool:
    """Whether a sequences or batch file carries per-token `advantages` (version 2 on); without them a reader
    broadcasts `advantage` over the trained tokens."""
    return "advantages" in read_schema(path)


def read_schema(path: str | os.PathLike) -> dict[str, pl.DataType]:
    """The file's columns, after its version is checked."""
    check_version(path)
    return dict(pl.read_parquet_schema(path))


def read(path: str | os.PathLike, columns: list[str] | None = None) -> pl.DataFrame:
    """A table file (its version checked); `columns` it lacks are one OutVersionError line naming them."""
    have = read_schema(path)
    if columns is not None:
        lacking = [c for c in columns if c not in have]
        if lacking:
            raise OutVersionError(f"{path}: no column(s) {', '.join(lacking)} (written by an older polar-process); "
                                  f"rerun polar-process")
    return pl.read_parquet(path, columns=columns)


def batch_files(out: str | os.PathLike) -> list[str]:
    """OUT's batch files in file-name order (the processor's packing order); [] without batches/."""
    folder = BATCHES.path(out)
    if not os.path.isdir(folder):
        return []
    return [os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith(".parquet")]
