"""The processor's run: index → per session group: load, normalize, merge, rewards → writers → report.

`process_group` is a pure function of one group's records plus the run's settings: the seam where a distributed
engine (Ray, a later issue) fans sessions out. `process` is the local engine around it.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass, field

import orjson

from polar.processor import eot as eotmod
from polar.processor import rewards as rw
from polar.processor.load import IndexEntry, RecordSource, build_index
from polar.processor.merge import FLAGS, GroupResult, merge_group
from polar.processor.normalize import Call, to_call
from polar.processor.report import ReportBuilder, render_html
from polar.processor.writers import (CALLS_SCHEMA, SEQUENCES_SCHEMA, BatchPacker, OutDir, StreamingParquet, calls_frame,
                                     sequences_frame, sft_line)


@dataclass(frozen=True)
class Options:
    inputs: tuple[str, ...]
    out: str
    mode: str = "prefix_merging"
    eot_token_ids: tuple[int, ...] = ()
    tokenizers: tuple[str, ...] = ()
    rewards: str | None = None
    max_batch_tokens: int = 65536
    sft_min_reward: float | None = None
    side_chains: str = "include"
    on_mismatch: str = "merge"
    overwrite: bool = False


@dataclass(frozen=True)
class Settings:
    """What a group's processing needs besides its records (picklable, for fan-out)."""

    mode: str
    on_mismatch: str
    max_batch_tokens: int
    side_chains: str
    eot: eotmod.EotTable
    rewards: rw.Rewards


@dataclass
class GroupOutput:
    calls: list[Call]
    result: GroupResult
    call_rows: list[dict] = field(default_factory=list)


def process_group(session: str | None, records: list[tuple[IndexEntry, dict]], files: list[str],
                  settings: Settings) -> GroupOutput:
    """One session group (or the null group) → calls rows and sequences with rewards. Pure."""
    calls = [to_call(r, files[e.file], e.offset) for e, r in records]
    res = merge_group(calls, mode=settings.mode, eot_for=settings.eot.get, on_mismatch=settings.on_mismatch,
                      null_group=session is None)
    for seq in res.sequences:
        if seq.n_tokens > settings.max_batch_tokens:
            seq.flags = [f for f in FLAGS if f in {*seq.flags, "oversize"}]
        rw.apply(seq, settings.rewards, settings.side_chains)
    rows = []
    for c in calls:
        sid, cid = res.placement.get(c.id, (None, None))
        rows.append({**c.row, "sequence_id": sid, "chain_id": cid})
    return GroupOutput(calls, res, rows)


class Progress:
    """A plain stderr progress bar, redrawn at most 5× a second."""

    def __init__(self, enabled: bool, stream=None):
        self.enabled, self.last = enabled, 0.0
        self.stream = stream if stream is not None else sys.stderr

    def __call__(self, label: str, done: float, total: float, extra: str = "") -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.last < 0.2 and done < total:
            return
        self.last = now
        frac = done / total if total else 1.0
        bar = "#" * int(frac * 30)
        self.stream.write(f"\r{label:<8}[{bar:<30}] {frac:6.1%} {extra}\033[K")
        self.stream.flush()

    def end(self) -> None:
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _group_order(sessions, rewards: rw.Rewards):
    """(group, session) order, nulls last, so batches keep a GRPO group together."""
    def key(s):
        g = rewards.group_of(s)
        return (g is None, g or "", s is None, s or "")
    return sorted(sessions, key=key)


def process(opts: Options, progress: Progress | None = None) -> dict:
    """Run the whole pipeline; returns the report. Raises InputError / EotError / RewardsError / OutputError."""
    progress = progress or Progress(False)
    t0 = time.perf_counter()
    outdir = OutDir(opts.out, opts.overwrite)
    sinks: list[StreamingParquet] = []
    try:
        index = build_index(opts.inputs, lambda d, t: progress("index", d, t, f"{d / 1e6:.0f}/{t / 1e6:.0f} MB"))
        groups = index.sessions()
        try:
            eot = eotmod.resolve(index.entries, list(opts.eot_token_ids), list(opts.tokenizers))
        except eotmod.EotError:
            if opts.mode == "prefix_merging":
                raise
            eot = eotmod.EotTable()  # per_request needs no E; flags that need it are simply not set
        if opts.mode == "prefix_merging":
            lacking = eotmod.missing(eot, index.entries)
            if lacking:
                raise eotmod.EotError(
                    f"prefix_merging needs the end-of-turn token ids of model(s) {', '.join(map(repr, lacking))} "
                    f"and the dump has no evidence (no completion that stopped naturally); {eotmod.OPTIONS_HINT}")
        rewards = rw.read_rewards(opts.rewards, {s for s in groups if s is not None})
        settings = Settings(opts.mode, opts.on_mismatch, opts.max_batch_tokens, opts.side_chains, eot, rewards)

        calls_out = StreamingParquet(outdir.path("calls.parquet"), calls_frame, CALLS_SCHEMA, 256)
        seqs_out = StreamingParquet(outdir.path("sequences.parquet"), sequences_frame, SEQUENCES_SCHEMA, 128)
        sinks += [calls_out, seqs_out]
        os.makedirs(outdir.path("batches"), exist_ok=True)
        packer = BatchPacker(outdir.path("batches"), opts.max_batch_tokens)
        report = ReportBuilder(opts.mode)
        source = RecordSource(index.files)
        sft_lines = 0
        order = _group_order(groups, rewards)
        n_records = len(index.entries)
        done = 0
        with open(outdir.path("sft.jsonl"), "wb") as sft:
            for session in order:
                entries = groups[session]
                out = process_group(session, source.load(entries), index.files, settings)
                calls_out.add(out.call_rows, sum(len(r["messages"] or "") + 512 for r in out.call_rows))
                seqs_out.add(out.result.sequences, sum(s.n_tokens * 9 for s in out.result.sequences))
                for seq in out.result.sequences:
                    if seq.side_chain and opts.side_chains == "exclude":
                        report.excluded_from_batches += 1
                        continue
                    packer.add(seq)
                for call in out.result.sft_calls:
                    hit = rewards.by_session.get(session) if session is not None else None
                    if opts.sft_min_reward is not None and (hit is None or hit[0] < opts.sft_min_reward):
                        continue
                    line = sft_line(call.messages_json, call.tools_json, call.assistant)
                    if line is not None:
                        sft.write(line)
                        sft_lines += 1
                report.add_group(session, out.calls, out.result)
                done += len(entries)
                progress("merge", done, n_records, f"{done}/{n_records} records")
            packer.close()
        source.close()
        calls_out.finish()
        seqs_out.finish()
        progress.end()
        seconds = time.perf_counter() - t0
        options = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(opts).items()}
        outputs = {"dir": opts.out, "calls": calls_out.rows, "sequences": seqs_out.rows, "batches": packer.files,
                   "sft_lines": sft_lines}
        doc = report.build(index=index, eot=eot.describe(), rewards=rewards, options=options, outputs=outputs,
                           seconds=seconds)
        with open(outdir.path("report.json"), "wb") as fh:
            fh.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        with open(outdir.path("report.html"), "w", encoding="utf-8") as fh:
            fh.write(render_html(doc, report.seq_lengths))
        outdir.commit()
        return doc
    except BaseException:
        for sink in sinks:
            sink.abort()
        outdir.abort()
        raise
