"""Output files (docs/merge-rules.md#outputs): calls.parquet, sequences.parquet, batches/, sft.jsonl, under temporary
names.

Everything is written into OUT/.polar-tmp-<pid>/ and renamed into OUT at the end, so a failed run leaves OUT as it
was. Frames stream into Polars sinks as sessions go by, so memory stays bounded by the largest session plus a few
chunks, and compression runs beside the processing.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import orjson
import polars as pl
from polars.io.plugins import register_io_source

from polar.processor.merge import TrainingSequence
from polar.records import out as out_tables

# OUT's tables have one home, polar.records.out (their schemas, rules and version stamp); every file written here
# carries the stamp.
SEQUENCES_SCHEMA, CALLS_SCHEMA = out_tables.SEQUENCES.schema, out_tables.CALLS.schema

_CHUNK_BYTES = 32 << 20  # hand a chunk to the sink when its buffered payload passes this


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


def sequences_frame(seqs: list[TrainingSequence]) -> pl.DataFrame:
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
        pl.Series("weight_versions", [s.weight_versions for s in seqs], dtype=SEQUENCES_SCHEMA["weight_versions"]),
        pl.Series("call_spans", [[{"call_id": c, "start": a, "end": b} for c, a, b in s.call_spans] for s in seqs],
                  dtype=SEQUENCES_SCHEMA["call_spans"]),
        _list_series("advantages", [s.advantages for s in seqs], pl.Float32, np.dtype(np.float32)),
    ).select(list(SEQUENCES_SCHEMA))


def calls_frame(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=CALLS_SCHEMA, orient="row") if rows else pl.DataFrame(schema=CALLS_SCHEMA)


class StreamingParquet:
    """One output parquet file written in a single streaming pass.

    Polars' sink runs in a background thread and pulls frames from a bounded queue (a registered IO source), so
    compression and disk writes overlap the processing of the next sessions and at most a few chunks are held."""

    def __init__(self, path: str, to_frame, schema: dict, row_group_rows: int, chunk_bytes: int = _CHUNK_BYTES):
        self.path, self.to_frame, self.schema, self.chunk_bytes = path, to_frame, schema, chunk_bytes
        # Rows here are large (a call's whole conversation, a merged sequence): row groups are counted in rows, so
        # a small count keeps the sink from holding the whole file before its first row group.
        self.row_group_rows = row_group_rows
        self.buffer: list = []
        self.buffered = 0
        self.rows = 0
        self._queue: queue.Queue = queue.Queue(maxsize=2)
        self._error: BaseException | None = None
        lf = register_io_source(io_source=self._source, schema=schema)
        self._thread = threading.Thread(target=self._sink, args=(lf,), name=f"sink-{os.path.basename(path)}",
                                        daemon=True)
        self._thread.start()

    def _source(self, with_columns, predicate, n_rows, batch_size):
        while True:
            frame = self._queue.get()
            if frame is None:
                return
            yield frame

    def _sink(self, lf: pl.LazyFrame) -> None:
        try:
            lf.sink_parquet(self.path, row_group_size=self.row_group_rows, metadata=out_tables.metadata())
        except BaseException as exc:  # reported by add()/finish() in the caller's thread
            self._error = exc

    def _put(self, item) -> None:
        while True:
            if self._error is not None or not self._thread.is_alive():
                raise OSError(f"writing {self.path} failed: {self._error}")
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def add(self, items: list, nbytes: int) -> None:
        self.buffer.extend(items)
        self.buffered += nbytes
        self.rows += len(items)
        if self.buffered >= self.chunk_bytes:
            self._flush()

    def _flush(self) -> None:
        if self.buffer:
            self._put(self.to_frame(self.buffer))
        self.buffer, self.buffered = [], 0

    def finish(self) -> str:
        self._flush()
        self._put(None)
        self._thread.join()
        if self._error is not None:
            raise OSError(f"writing {self.path} failed: {self._error}")
        return self.path

    def abort(self) -> None:
        """Stop the sink thread (the partial file is removed with the temporary directory)."""
        self.buffer = []
        if self._thread.is_alive():
            try:
                self._queue.put(None, timeout=5)
            except queue.Full:
                return
            self._thread.join(timeout=30)


@dataclass
class BatchPacker:
    """Greedy packing in arrival order (the CLI feeds (group, session, first t_start) order): Σ n_tokens ≤ N per
    file; a longer sequence is written alone (already flagged `oversize`), never truncated or dropped."""

    directory: str
    max_tokens: int
    current: list[TrainingSequence] = field(default_factory=list)
    tokens: int = 0
    files: int = 0
    _pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="batches"))
    _pending: list[Future] = field(default_factory=list)

    def add(self, seq: TrainingSequence) -> None:
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
        frame = sequences_frame(self.current)
        path = os.path.join(self.directory, f"batch-{self.files:05d}.parquet")
        # The write releases the GIL: it runs beside the next sessions. At most a few frames wait.
        self._pending = [f for f in self._pending if not f.done() or f.result() is None]
        while len(self._pending) >= 4:
            self._pending.pop(0).result()
        self._pending.append(self._pool.submit(frame.write_parquet, path, metadata=out_tables.metadata()))
        self.files += 1
        self.current, self.tokens = [], 0

    def close(self) -> None:
        """Flush the last batch and wait for every write (re-raising the first failure)."""
        self.flush()
        for f in self._pending:
            f.result()
        self._pool.shutdown()


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

    # manifest.json and state/ are what a later --incremental run continues from (manifest.py).
    FINAL = ("calls.parquet", "sequences.parquet", "batches", "sft.jsonl", "report.json", "report.html", "state",
             "manifest.json")

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
