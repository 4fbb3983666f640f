"""Output files (DESIGN §3): calls.parquet, sequences.parquet, batches/, sft.jsonl, under temporary names.

Everything is written into OUT/.polar-tmp-<pid>/ and renamed into OUT at the end, so a failed run leaves OUT as it
was. Frames are flushed in parts as sessions stream through, so memory stays bounded by the largest session plus one
part; several parts are streamed into the final file by Polars at the end.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

import numpy as np
import orjson
import polars as pl

from polar.processor.merge import Sequence_

SEQUENCES_SCHEMA: dict[str, pl.DataType] = {
    "sequence_id": pl.Utf8, "chain_id": pl.Utf8, "session": pl.Utf8, "group": pl.Utf8, "mode": pl.Utf8,
    "input_ids": pl.List(pl.Int32), "loss_mask": pl.List(pl.UInt8), "logprobs": pl.List(pl.Float32),
    "call_ids": pl.List(pl.Utf8), "n_calls": pl.Int32, "n_tokens": pl.Int32, "n_trainable": pl.Int32,
    "prompt_len": pl.Int32, "flags": pl.List(pl.Utf8), "break_cause": pl.Utf8, "model": pl.Utf8,
    "reward": pl.Float64, "advantage": pl.Float64,
}

CALLS_SCHEMA: dict[str, pl.DataType] = {
    "call_id": pl.Utf8, "session": pl.Utf8, "session_source": pl.Utf8, "conn_id": pl.Utf8, "protocol": pl.Utf8,
    "host": pl.Utf8, "path": pl.Utf8, "model_requested": pl.Utf8, "model_served": pl.Utf8, "stream": pl.Boolean,
    "t_start": pl.Float64, "t_first_byte": pl.Float64, "t_end": pl.Float64, "prompt_tokens": pl.Int32,
    "completion_tokens": pl.Int32, "n_tool_calls": pl.Int32, "finish_reason": pl.Utf8, "stop_reason": pl.Utf8,
    "error": pl.Utf8, "messages": pl.Utf8, "tools": pl.Utf8, "assistant": pl.Utf8, "sequence_id": pl.Utf8,
    "chain_id": pl.Utf8, "source_file": pl.Utf8, "source_offset": pl.Int64,
}

_PART_BYTES = 64 << 20  # flush a part when its buffered payload passes this


class OutputError(ValueError):
    """OUT cannot be used (not empty without --overwrite): the CLI exits 2."""


def _list_series(name: str, arrays: list[np.ndarray | None], inner: pl.DataType, empty: np.dtype) -> pl.Series:
    """A List column from numpy arrays; None rows become nulls. (Equal lengths would otherwise become Array.)"""
    filled = [a if a is not None else np.zeros(0, dtype=empty) for a in arrays]
    s = pl.Series(name, filled, dtype=pl.List(inner)) if filled else pl.Series(name, [], dtype=pl.List(inner))
    if s.dtype != pl.List(inner):
        s = s.cast(pl.List(inner))
    if any(a is None for a in arrays):
        s = pl.DataFrame({name: s, "_ok": [a is not None for a in arrays]}).select(
            pl.when(pl.col("_ok")).then(pl.col(name)).otherwise(None).alias(name)).to_series()
    return s


def sequences_frame(seqs: list[Sequence_]) -> pl.DataFrame:
    """The sequences schema for `seqs`, in order."""
    cols = {
        "sequence_id": [s.sequence_id for s in seqs], "chain_id": [s.chain_id for s in seqs],
        "session": [s.session for s in seqs], "group": [s.group for s in seqs], "mode": [s.mode for s in seqs],
    }
    df = pl.DataFrame(cols, schema={k: SEQUENCES_SCHEMA[k] for k in cols})
    return df.with_columns(
        _list_series("input_ids", [s.input_ids for s in seqs], pl.Int32, np.dtype(np.int32)),
        _list_series("loss_mask", [s.loss_mask for s in seqs], pl.UInt8, np.dtype(np.uint8)),
        _list_series("logprobs", [s.logprobs for s in seqs], pl.Float32, np.dtype(np.float32)),
        pl.Series("call_ids", [s.call_ids for s in seqs], dtype=pl.List(pl.Utf8)),
        pl.Series("n_calls", [len(s.call_ids) for s in seqs], dtype=pl.Int32),
        pl.Series("n_tokens", [s.n_tokens for s in seqs], dtype=pl.Int32),
        pl.Series("n_trainable", [s.n_trainable for s in seqs], dtype=pl.Int32),
        pl.Series("prompt_len", [s.prompt_len for s in seqs], dtype=pl.Int32),
        pl.Series("flags", [s.flags for s in seqs], dtype=pl.List(pl.Utf8)),
        pl.Series("break_cause", [s.break_cause for s in seqs], dtype=pl.Utf8),
        pl.Series("model", [s.model for s in seqs], dtype=pl.Utf8),
        pl.Series("reward", [s.reward for s in seqs], dtype=pl.Float64),
        pl.Series("advantage", [s.advantage for s in seqs], dtype=pl.Float64),
    ).select(list(SEQUENCES_SCHEMA))


def calls_frame(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=CALLS_SCHEMA, orient="row") if rows else pl.DataFrame(schema=CALLS_SCHEMA)


class PartedParquet:
    """One output parquet file written in parts: buffered rows are flushed when large, joined at the end."""

    def __init__(self, tmp_dir: str, name: str, to_frame, empty_schema: dict):
        self.tmp_dir, self.name, self.to_frame, self.empty_schema = tmp_dir, name, to_frame, empty_schema
        self.buffer: list = []
        self.buffered = 0
        self.parts: list[str] = []
        self.rows = 0

    def add(self, items: list, nbytes: int) -> None:
        self.buffer.extend(items)
        self.buffered += nbytes
        self.rows += len(items)
        if self.buffered >= _PART_BYTES:
            self._flush_part()

    def _flush_part(self) -> None:
        path = os.path.join(self.tmp_dir, f".{self.name}.part{len(self.parts):05d}.parquet")
        # Compressed even though they are read once more: writing uncompressed text is disk-bound and slower.
        self.to_frame(self.buffer).write_parquet(path)
        self.parts.append(path)
        self.buffer, self.buffered = [], 0

    def finish(self) -> str:
        final = os.path.join(self.tmp_dir, self.name)
        if not self.parts:
            frame = self.to_frame(self.buffer) if self.buffer else pl.DataFrame(schema=self.empty_schema)
            frame.write_parquet(final)
        else:
            if self.buffer:
                self._flush_part()
            pl.scan_parquet(self.parts).sink_parquet(final)
            for p in self.parts:
                os.remove(p)
        self.buffer = []
        return final


@dataclass
class BatchPacker:
    """Greedy packing in arrival order (the CLI feeds (group, session, first t_start) order): Σ n_tokens ≤ N per
    file; a longer sequence is written alone (already flagged `oversize`), never truncated or dropped."""

    directory: str
    max_tokens: int
    current: list[Sequence_] = field(default_factory=list)
    tokens: int = 0
    files: int = 0

    def add(self, seq: Sequence_) -> None:
        n = seq.n_tokens
        if n > self.max_tokens:
            self.flush()
            self.current = [seq]
            self.flush()
            return
        if self.tokens + n > self.max_tokens:
            self.flush()
        self.current.append(seq)
        self.tokens += n

    def flush(self) -> None:
        if not self.current:
            return
        os.makedirs(self.directory, exist_ok=True)
        sequences_frame(self.current).write_parquet(os.path.join(self.directory, f"batch-{self.files:05d}.parquet"))
        self.files += 1
        self.current, self.tokens = [], 0


def _json_arguments(messages: list) -> list:
    """OpenAI chat as the SFT export states it: tool arguments as JSON strings, reasoning as reasoning_content."""
    for m in messages:
        if not isinstance(m, dict):
            continue
        if m.get("role") == "assistant" and "reasoning" in m and "reasoning_content" not in m:
            m["reasoning_content"] = m.pop("reasoning")
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function") if isinstance(tc, dict) else None
            if isinstance(fn, dict) and not isinstance(fn.get("arguments"), str):
                fn["arguments"] = orjson.dumps(fn.get("arguments", {})).decode()
    return messages


def sft_line(messages_json: str | None, tools_json: str | None, assistant: dict | None) -> bytes | None:
    """`{"messages": [...], "tools": [...]}` from a call's upstream messages plus its assistant message."""
    if messages_json is None:
        return None
    messages = orjson.loads(messages_json)
    if not isinstance(messages, list):
        return None
    msg: dict = {"role": "assistant", "content": (assistant or {}).get("content")}
    if (assistant or {}).get("reasoning"):
        msg["reasoning_content"] = assistant["reasoning"]
    if (assistant or {}).get("tool_calls"):
        msg["tool_calls"] = assistant["tool_calls"]
    messages.append(msg)
    tools = orjson.loads(tools_json) if tools_json else []
    return orjson.dumps({"messages": _json_arguments(messages), "tools": tools}) + b"\n"


class OutDir:
    """OUT and its temporary sibling. OUT must be absent or empty unless overwrite."""

    FINAL = ("calls.parquet", "sequences.parquet", "batches", "sft.jsonl", "report.json", "report.html")

    def __init__(self, out: str, overwrite: bool):
        self.out = out
        if os.path.exists(out) and not os.path.isdir(out):
            raise OutputError(f"-o {out}: exists and is not a directory")
        if os.path.isdir(out) and os.listdir(out) and not overwrite:
            raise OutputError(f"-o {out}: directory is not empty (pass --overwrite to replace its outputs)")
        self.created = not os.path.exists(out)
        os.makedirs(out, exist_ok=True)
        self.tmp = os.path.join(out, f".polar-tmp-{os.getpid()}")
        shutil.rmtree(self.tmp, ignore_errors=True)
        os.makedirs(self.tmp)

    def path(self, name: str) -> str:
        return os.path.join(self.tmp, name)

    def commit(self) -> None:
        """Rename every finished output into OUT (replacing older ones), then drop the temporary directory."""
        for name in self.FINAL:
            src, dst = os.path.join(self.tmp, name), os.path.join(self.out, name)
            if not os.path.exists(src):
                continue
            if os.path.isdir(dst):
                old = os.path.join(self.tmp, f".old-{name}")
                os.replace(dst, old)
            os.replace(src, dst)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def abort(self) -> None:
        """Leave OUT as it was: drop the temporary directory, and OUT itself when this run created it."""
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.created:
            try:
                os.rmdir(self.out)
            except OSError:
                pass
