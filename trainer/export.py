"""`polar-export OUT --format verl|slime|prime-rl -o DIR [--keep-mismatched]`: the processor's batches in a trainer's
own row format.

This module imports only the standard library, numpy, polars and orjson: it runs in the base install (the proxy's
`.venv`, no torch). Each format is one entry of FORMATS (its writer — a pure function of a frame of sequences —, the
columns it writes and reads, what it refuses, its help line); `build` returns a chunk's rows plus notes (the rows left
out and why); `main` only reads files, calls them and writes files.

Input. OUT is a `polar-process` output directory. Its `batches/*.parquet` are read in file-name order, rows in file
order; prime-rl also reads `calls.parquet` for each call's temperature.

Output. `DIR/<format>-00000.parquet, …`: one row per sequence, at most `--rows-per-file` rows a file, in input order;
`DIR/manifest.json`: the counts, the rows left out and why, the files and their columns. DIR must be absent or empty.
Files are written under a temporary name and renamed at the end, so a failed export leaves no partial file.

Rows left out (counted under the first reason that applies):
- `null_advantage`: the sequence's advantage is null (no reward, or a reward without a group). Every format.
- `context_mismatch`: the sequence is flagged `context_mismatch` (the prompt the trainer rebuilds is not the one the
  sampler saw: a run in normal mode; polar-rollout runs in exact mode unless `--proxy-set polar_exact=false`). Every
  format, unless `--keep-mismatched` (slime then keeps the row with `remove_sample`).
- `missing_logprobs`: the sequence has no logprobs. verl and prime-rl (their logprob column is a dense tensor; slime
  keeps the row with `remove_sample`).
- `unknown_temperature`: a call of the sequence has no recorded temperature. prime-rl (its `temperatures` would be a
  guess).

Every row also carries `sequence_id` (provenance: the sequences.parquet row it came from). The field maps, each
column named after the framework's own field:

slime (`slime.utils.types.Sample`):
- `tokens` is `input_ids`, as recorded (never re-tokenized).
- `response_length` is `n_tokens − prompt_len`. The response runs from the end of the first call's prompt to the end
  of the sequence; later prompts' new tokens (tool results, user turns) lie inside it at mask 0.
- `loss_mask` is `loss_mask[prompt_len:]`, so its length is `response_length` (slime asserts it).
- `rollout_log_probs` is `logprobs[prompt_len:]`: the sampled logprob at mask 1, 0.0 at mask 0; all 0.0 when the
  sequence has no logprobs (it is then `remove_sample`).
- `reward` is the session's `reward` (a float).
- `rollout_id` is a dense id of `session` (0, 1, … in order of first appearance among the rows written): all the
  sequences of one session share it, so slime's loss reducer counts them as one rollout.
- `index` is the same dense id of `session`: slime's fan-out convention copies the parent sample into its siblings
  and sets `rollout_id = index`.
- `group_index` is a dense id of `group`, in order of first appearance.
- `status` is `truncated` (the value of `Sample.Status.TRUNCATED`) when the sequence is flagged `truncated_turn`,
  else `completed`.
- `remove_sample` is true when the sequence is flagged `context_mismatch` or `missing_logprobs`.

prime-rl (`prime_rl.transports.rollouts.types.TrainingSample`; no prompt/completion split, every list the length of
`token_ids`):
- `token_ids` is `input_ids`.
- `mask` is `loss_mask` as booleans.
- `logprobs` is `logprobs`.
- `temperatures`: each token gets the temperature of the call it belongs to. A call owns its completion span and the
  context tokens before it back to the previous call's span (the first call also owns the first prompt).
- `advantages` is the sequence's `advantages` column (each token's advantage, docs/merge-rules.md rule 11: under
  `polar-process --credit session` the `advantage` on mask-1 tokens and 0.0 elsewhere; a batch file older than the
  column gives that broadcast).

verl (a `DataProto` row before padding; `non_tensor_batch["uid"]` is the GRPO group key):
- The sequence is split at `prompt_len`: `prompts` is `input_ids[:prompt_len]`, `responses` is
  `input_ids[prompt_len:]`, `input_ids` is the whole sequence.
- `response_mask` is `loss_mask[prompt_len:]`.
- `attention_mask` is 1 on every token of `input_ids` (rows are unpadded: a reader left-pads `prompts` and right-pads
  `responses` to its fixed lengths, with 0 there).
- `position_ids` is 0 … n_tokens − 1: what verl's `compute_position_id_with_mask` gives an unpadded row.
- `rollout_log_probs` is `logprobs[prompt_len:]`.
- `advantages` is ours: the response's part of the sequence's `advantages` column (under `--credit session` the
  `advantage` on the response's mask-1 tokens, 0.0 elsewhere; the shape verl's GRPO estimator returns, so the
  trainer's own estimator can be bypassed; under `--credit turn` each call's tokens carry their own).

slime takes one reward per sample: a batch whose per-token advantages are not the broadcast of `advantage`
(`polar-process --credit turn`) is refused in one line (rerun polar-process with `--credit session`).
- `uid` is `group`.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import orjson
import polars as pl

from polar.records import out as out_tables
from polar.trainer.args import OneLineParser

ROWS_PER_FILE = 512  # rows are whole agent sequences (thousands of tokens each): a few hundred make a sensible file
PROVENANCE = ("sequence_id",)
# The sequences columns every format reads: session and group give its dense ids and the manifest's counts.
COMMON = ("sequence_id", "session", "group", "input_ids", "loss_mask", "logprobs", "n_tokens", "advantage", "flags")
REMOVE_FLAGS = ("context_mismatch", "missing_logprobs")


class ExportError(ValueError):
    """Bad input: the CLI prints the message (one line naming the fix) and exits 2."""


# ---------------------------------------------------------------------------------------------------- builders

@dataclass(frozen=True)
class DenseIds:
    """Dense integer ids (0, 1, …) of sessions and groups, in order of first appearance among the rows written."""

    sessions: dict = field(default_factory=dict)
    groups: dict = field(default_factory=dict)

    def extended(self, kept: pl.DataFrame) -> DenseIds:
        """These ids plus the sessions and groups `kept` introduces (a null stays null in the id columns)."""
        sessions, groups = dict(self.sessions), dict(self.groups)
        for column, ids in (("session", sessions), ("group", groups)):
            for value in kept[column].to_list():
                if value is not None:
                    ids.setdefault(value, len(ids))
        return DenseIds(sessions, groups)


@dataclass(frozen=True)
class Built:
    """One chunk's rows in a format, and the notes: the rows left out by reason, the tokens written, and the dense
    ids so far (the next chunk's ids continue them)."""

    rows: pl.DataFrame
    left_out: Counter
    ids: DenseIds
    tokens: int = 0
    trainable: int = 0


def _unknown_temperature(seqs: pl.DataFrame, temperatures: dict[str, float | None]) -> pl.Series:
    """Rows with a call whose temperature nobody recorded (or without call spans: an OUT older than them)."""
    return pl.Series([not spans or any(temperatures.get(s["call_id"]) is None for s in spans)
                      for spans in seqs["call_spans"].to_list()], dtype=pl.Boolean)


def left_out_reasons(fmt: str, seqs: pl.DataFrame, temperatures: dict[str, float | None],
                     keep_mismatched: bool = False) -> pl.Series:
    """Why each sequence row is left out of `fmt` (the first reason that applies), null where it is written."""
    why = pl.when(pl.col("advantage").is_null()).then(pl.lit("null_advantage"))
    if not keep_mismatched:
        why = why.when(pl.col("flags").list.contains("context_mismatch")).then(pl.lit("context_mismatch"))
    refuses = FORMATS[fmt].refuses
    if "missing_logprobs" in refuses:
        why = why.when(pl.col("logprobs").is_null()).then(pl.lit("missing_logprobs"))
    if "unknown_temperature" in refuses:
        why = why.when(pl.lit(_unknown_temperature(seqs, temperatures))).then(pl.lit("unknown_temperature"))
    return seqs.select(why.otherwise(pl.lit(None, pl.Utf8)).alias("left_out"))["left_out"]


def _response(column: str) -> pl.Expr:
    return pl.col(column).list.slice(pl.col("prompt_len"))


def _masked_advantage(mask: pl.Expr) -> pl.Expr:
    """The sequence's advantage on mask-1 tokens, 0.0 on mask-0 tokens."""
    product = mask.cast(pl.List(pl.Float64)) * pl.col("advantage")
    # A mask-0 token under a negative advantage would hold -0.0: written as 0.0.
    plain_zero = pl.when(pl.element() == 0.0).then(pl.lit(0.0)).otherwise(pl.element())
    return product.list.eval(plain_zero).cast(pl.List(pl.Float32))


def _token_advantages(kept: pl.DataFrame, response: bool) -> pl.Expr:
    """The per-token advantages column (its response part for verl); the broadcast where a row has none."""
    mask = _response("loss_mask") if response else pl.col("loss_mask")
    if "advantages" not in kept.columns:
        return _masked_advantage(mask)
    column = _response("advantages") if response else pl.col("advantages")
    return pl.when(pl.col("advantages").is_null()).then(_masked_advantage(mask)).otherwise(column) \
        .cast(pl.List(pl.Float32))


def check_one_advantage_per_sample(kept: pl.DataFrame) -> None:
    """slime's refusal of per-token credit: ExportError when a row's advantages differ from its broadcast."""
    if "advantages" not in kept.columns or not kept.height:
        return
    differs = kept.select((pl.col("advantages").is_not_null()
                           & (pl.col("advantages") != _masked_advantage(pl.col("loss_mask")))).sum()).item()
    if differs:
        raise ExportError(f"{differs} sequence(s) carry per-token advantages (polar-process --credit turn) and slime "
                          "takes one reward per sample; rerun polar-process with --credit session, or export verl or "
                          "prime-rl")


def slime_rows(kept: pl.DataFrame, ids: DenseIds, temperatures: dict[str, float | None]) -> pl.DataFrame:
    """slime `Sample` fields (module docstring)."""
    check_one_advantage_per_sample(kept)
    session_id = pl.col("session").replace_strict(ids.sessions, return_dtype=pl.Int64)
    no_logprobs = _response("loss_mask").list.eval(pl.element() * 0).cast(pl.List(pl.Float32))
    return kept.select(
        pl.col("input_ids").alias("tokens"),
        (pl.col("n_tokens") - pl.col("prompt_len")).cast(pl.Int64).alias("response_length"),
        _response("loss_mask").cast(pl.List(pl.Int32)).alias("loss_mask"),
        pl.when(pl.col("logprobs").is_null()).then(no_logprobs).otherwise(_response("logprobs"))
        .alias("rollout_log_probs"),
        pl.col("reward"),
        session_id.alias("rollout_id"),
        pl.col("group").replace_strict(ids.groups, return_dtype=pl.Int64).alias("group_index"),
        session_id.alias("index"),
        pl.when(pl.col("flags").list.contains("truncated_turn")).then(pl.lit("truncated"))
        .otherwise(pl.lit("completed")).alias("status"),
        pl.any_horizontal(*(pl.col("flags").list.contains(f) for f in REMOVE_FLAGS)).alias("remove_sample"),
        *PROVENANCE,
    )


def token_temperatures(n_tokens: int, spans: list[dict], temperatures: dict[str, float | None]) -> np.ndarray:
    """Each token's sampling temperature: a call owns its completion span and the context tokens before it back to
    the previous call's span; tokens after the last span (none in a merged sequence) belong to the last call."""
    ends = np.array([s["end"] for s in spans], dtype=np.int64)
    owner = np.minimum(np.searchsorted(ends, np.arange(n_tokens), side="right"), len(spans) - 1)
    per_call = np.array([temperatures[s["call_id"]] for s in spans], dtype=np.float32)
    return per_call[owner]


def prime_rl_rows(kept: pl.DataFrame, ids: DenseIds, temperatures: dict[str, float | None]) -> pl.DataFrame:
    """prime-rl `TrainingSample` fields (module docstring)."""
    # As Python lists: a column of equal-length numpy arrays would become an Array, not a List.
    temps = [token_temperatures(n, spans, temperatures).tolist()
             for n, spans in zip(kept["n_tokens"].to_list(), kept["call_spans"].to_list())]
    return kept.select(
        pl.col("input_ids").alias("token_ids"),
        pl.col("loss_mask").cast(pl.List(pl.Boolean)).alias("mask"),
        pl.col("logprobs"),
        pl.Series("temperatures", temps, dtype=pl.List(pl.Float32)),
        _token_advantages(kept, response=False).alias("advantages"),
        *PROVENANCE,
    )


def verl_rows(kept: pl.DataFrame, ids: DenseIds, temperatures: dict[str, float | None]) -> pl.DataFrame:
    """verl `DataProto` fields, unpadded (module docstring)."""
    return kept.select(
        pl.col("input_ids").list.slice(0, pl.col("prompt_len")).alias("prompts"),
        _response("input_ids").alias("responses"),
        pl.col("input_ids"),
        _response("loss_mask").cast(pl.List(pl.Int32)).alias("response_mask"),
        pl.col("loss_mask").list.eval(pl.element() * 0 + 1).cast(pl.List(pl.Int32)).alias("attention_mask"),
        pl.int_ranges(0, pl.col("n_tokens")).alias("position_ids"),
        _response("logprobs").alias("rollout_log_probs"),
        _token_advantages(kept, response=True).alias("advantages"),
        pl.col("group").alias("uid"),
        *PROVENANCE,
    )


# ---------------------------------------------------------------------------------------------------- the formats

@dataclass(frozen=True)
class Format:
    """One trainer's rows: its writer, the columns it writes and reads, what it refuses beyond every format's
    null_advantage and context_mismatch, and its line in --format's help."""

    name: str
    doc: str
    fields: tuple[str, ...]  # the columns written, in file order (PROVENANCE follows them)
    writer: Callable[[pl.DataFrame, DenseIds, dict], pl.DataFrame]  # (rows kept, dense ids, temperatures) → rows
    needs: tuple[str, ...] = ()  # sequences columns read beyond COMMON
    refuses: tuple[str, ...] = ()  # "missing_logprobs", "unknown_temperature"
    optional: tuple[str, ...] = ("advantages",)  # read when the batch has them (OUT version 2)
    temperatures: bool = False  # reads calls.parquet's temperature per call


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("verl", "a DataProto row before padding, uid = group", writer=verl_rows, needs=("prompt_len",),
           refuses=("missing_logprobs",),
           fields=("prompts", "responses", "input_ids", "response_mask", "attention_mask", "position_ids",
                   "rollout_log_probs", "advantages", "uid")),
    Format("slime", "a slime.utils.types.Sample, one reward per sample", writer=slime_rows,
           needs=("prompt_len", "reward"),
           fields=("tokens", "response_length", "loss_mask", "rollout_log_probs", "reward", "rollout_id",
                   "group_index", "index", "status", "remove_sample")),
    Format("prime-rl", "a prime_rl TrainingSample, per-token temperatures and advantages", writer=prime_rl_rows,
           needs=("call_spans",), refuses=("missing_logprobs", "unknown_temperature"), temperatures=True,
           fields=("token_ids", "mask", "logprobs", "temperatures", "advantages")),
)}


def _format(fmt: str) -> Format:
    if fmt not in FORMATS:
        raise ExportError(f"unknown --format {fmt!r}: use one of {', '.join(FORMATS)}")
    return FORMATS[fmt]


def needs(fmt: str) -> tuple[str, ...]:
    """The sequences columns `fmt` reads (a batches/ written by an older polar-process may lack some)."""
    return (*COMMON, *FORMATS[fmt].needs)


def build(fmt: str, seqs: pl.DataFrame, ids: DenseIds, temperatures: dict[str, float | None],
          keep_mismatched: bool = False) -> Built:
    """One chunk of sequences rows in `fmt`: the rows written (the format's fields + PROVENANCE), the rows left out by
    reason, and `ids` extended by the chunk's rows written (dense ids run across chunks)."""
    spec = _format(fmt)
    reasons = left_out_reasons(fmt, seqs, temperatures, keep_mismatched)
    kept = seqs.filter(reasons.is_null())
    ids = ids.extended(kept)
    rows = spec.writer(kept, ids, temperatures)
    return Built(rows, Counter(reasons.drop_nulls().to_list()), ids, int(kept["n_tokens"].sum()),
                 int(kept["loss_mask"].list.sum().sum()))


# ---------------------------------------------------------------------------------------------------- files

def batch_files(out: str) -> list[str]:
    """OUT's batches, in file-name order (the processor's packing order)."""
    if not os.path.isdir(out_tables.BATCHES.path(out)):
        raise ExportError(f"{out}: no batches/ directory; pass the -o directory of a polar-process run")
    return out_tables.batch_files(out)


def read_temperatures(out: str) -> dict[str, float | None]:
    """call_id → temperature from OUT/calls.parquet (prime-rl's per-token temperatures)."""
    path = out_tables.CALLS.path(out)
    if not os.path.isfile(path):
        raise ExportError(f"{path}: not found; prime-rl's temperatures come from it: pass the whole polar-process OUT")
    try:
        calls = out_tables.read(path)
    except out_tables.OutVersionError as exc:
        raise ExportError(str(exc)) from None
    if "temperature" not in calls.columns:
        raise ExportError(f"{path}: no temperature column; rerun polar-process (this version writes it)")
    return dict(zip(calls["call_id"].to_list(), calls["temperature"].to_list()))


def read_batch(path: str, fmt: str) -> pl.DataFrame:
    """One batch file's columns that `fmt` reads (its optional ones where the file has them)."""
    have = out_tables.read_schema(path)
    return out_tables.read(path, columns=[*needs(fmt), *(c for c in FORMATS[fmt].optional if c in have)])


def check_batches(files: list[str], fmt: str) -> None:
    """Every batch file is readable and holds the columns `fmt` needs, before anything is written."""
    for path in files:
        try:
            schema = out_tables.read_schema(path)
        except out_tables.OutVersionError as exc:
            raise ExportError(str(exc)) from None
        except (OSError, pl.exceptions.PolarsError) as exc:
            raise ExportError(f"{path}: unreadable ({str(exc).splitlines()[0]}); rerun polar-process") from exc
        lacking = [c for c in needs(fmt) if c not in schema]
        if lacking:
            raise ExportError(f"{path}: no column(s) {', '.join(lacking)}; rerun polar-process "
                              f"(this version writes them)")


def chunks(files: list[str], fmt: str, rows_per_file: int) -> Iterator[pl.DataFrame]:
    """The sequences of `files` in order, in frames of at most `rows_per_file` rows."""
    pending: list[pl.DataFrame] = []
    held = 0
    for path in files:
        frame = read_batch(path, fmt)
        while frame.height:
            take = frame.head(rows_per_file - held)
            frame = frame.slice(take.height)
            pending.append(take)
            held += take.height
            if held == rows_per_file:
                yield pl.concat(pending, how="diagonal_relaxed")
                pending, held = [], 0
    if pending:
        yield pl.concat(pending, how="diagonal_relaxed")


def check_dir(directory: str) -> None:
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ExportError(f"-o {directory}: exists and is not a directory; pass a new or empty directory")
    if os.path.isdir(directory) and os.listdir(directory):
        raise ExportError(f"-o {directory}: directory is not empty; pass a new or empty directory")


def export(out: str, fmt: str, directory: str, rows_per_file: int = ROWS_PER_FILE,
           keep_mismatched: bool = False) -> dict:
    """The whole export; returns the manifest. Raises ExportError on bad input (before DIR is touched)."""
    spec = _format(fmt)
    if rows_per_file < 1:
        raise ExportError(f"--rows-per-file {rows_per_file}: pass a positive number of rows")
    files = batch_files(out)
    check_dir(directory)
    check_batches(files, fmt)
    temperatures = read_temperatures(out) if spec.temperatures else {}
    created = not os.path.exists(directory)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".polar-export-tmp-{os.getpid()}")
    os.makedirs(tmp)
    try:
        manifest = _write(files, fmt, tmp, rows_per_file, temperatures, keep_mismatched)
        manifest["source"] = os.path.abspath(out)
        with open(os.path.join(tmp, "manifest.json"), "wb") as fh:
            fh.write(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
        for name in [*manifest["files"], "manifest.json"]:
            os.replace(os.path.join(tmp, name), os.path.join(directory, name))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if created and not os.listdir(directory):
            os.rmdir(directory)
        raise
    shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _write(files: list[str], fmt: str, tmp: str, rows_per_file: int, temperatures: dict,
           keep_mismatched: bool = False) -> dict:
    """Build every chunk and write the rows in files of exactly `rows_per_file` rows (the last one: the rest);
    the manifest's counts."""
    ids, left_out = DenseIds(), Counter()
    written: list[str] = []
    pending: list[pl.DataFrame] = []
    rows_read = rows = tokens = trainable = 0

    def flush(frames: list[pl.DataFrame]) -> None:
        name = f"{fmt}-{len(written):05d}.parquet"
        pl.concat(frames).write_parquet(os.path.join(tmp, name))
        written.append(name)

    for seqs in chunks(files, fmt, rows_per_file):
        rows_read += seqs.height
        built = build(fmt, seqs, ids, temperatures, keep_mismatched)
        ids = built.ids
        left_out.update(built.left_out)
        rows, tokens, trainable = rows + built.rows.height, tokens + built.tokens, trainable + built.trainable
        pending.append(built.rows)
        held = pl.concat(pending)
        while held.height >= rows_per_file:
            flush([held.head(rows_per_file)])
            held = held.slice(rows_per_file)
        pending = [held]
    if pending and pending[0].height:
        flush(pending)
    return {"format": fmt, "rows": rows, "rows_read": rows_read, "left_out": dict(sorted(left_out.items())),
            "tokens": tokens, "trainable_tokens": trainable, "sessions": len(ids.sessions), "groups": len(ids.groups),
            "batch_files": len(files), "rows_per_file": rows_per_file, "keep_mismatched": keep_mismatched,
            "files": written,
            "columns": [*FORMATS[fmt].fields, *PROVENANCE]}


# ---------------------------------------------------------------------------------------------------- CLI

def parser() -> OneLineParser:
    p = OneLineParser(prog="polar-export", raises=ExportError,
                      description="Write a polar-process OUT's batches in a trainer's row format.")
    p.add_argument("out", metavar="OUT", help="a polar-process output directory (holds batches/)")
    p.add_argument("--format", required=True,
                   help="one of " + "; ".join(f"{f.name}: {f.doc}" for f in FORMATS.values()))
    p.add_argument("-o", dest="directory", required=True, metavar="DIR", help="a new or empty directory")
    p.add_argument("--rows-per-file", type=int, default=ROWS_PER_FILE, help=f"rows per file ({ROWS_PER_FILE})")
    p.add_argument("--keep-mismatched", action="store_true",
                   help="keep sequences flagged context_mismatch (default: left out and counted: their prompt is not "
                        "the one the sampler saw; polar-rollout's exact mode avoids them)")
    p.add_argument("-q", "--quiet", action="store_true", help="no summary line")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    try:
        args = p.parse_args(argv)
        manifest = export(args.out, args.format, args.directory, args.rows_per_file, args.keep_mismatched)
    except ExportError as exc:
        print(f"polar-export: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        left = ", ".join(f"{n} {why}" for why, n in manifest["left_out"].items()) or "none"
        print(f"polar-export: {manifest['rows']} {args.format} rows in {len(manifest['files'])} file(s) under "
              f"{args.directory}; left out: {left}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
