"""The processor's run: index → per session group: load, normalize, merge, rewards → writers → report.

`process_group` is a pure function of one group's records plus the run's settings: the seam where an engine fans
sessions out. An engine does two things: the index pass over a list of files, and `group_products` for a list of
groups, answered in the order asked. `LocalEngine` does both in this process; `engine_ray.RayEngine` runs them as
Ray tasks (sessions partitioned by `partition_of`, a stable hash). Whatever the engine, the driver writes every
output in the same order, so the outputs are byte-for-byte the same.

`--incremental` (manifest.py) carries over the products of sessions no new file touches and asks the engine only
for the rest.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dc_fields

import orjson

from polar.addon import record as rec
from polar.processor import eot as eotmod
from polar.processor import rewards as rw
from polar.processor.load import Index, IndexEntry, InputError, RecordSource, build_index
from polar.processor.merge import FLAGS, GroupResult, Note, Sequence_, merge_group
from polar.processor.normalize import Call, to_call
from polar.processor.report import ReportBuilder, named_sessions, render_html
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
    incremental: bool = False
    engine: str = "local"
    ray_address: str | None = None
    ray_partitions: int | None = None
    allow_empty: bool = False


@dataclass(frozen=True)
class Settings:
    """What a group's processing needs besides its records (picklable, for fan-out)."""

    mode: str
    on_mismatch: str
    max_batch_tokens: int
    side_chains: str
    eot: eotmod.EotTable
    rewards: rw.Rewards

    @property
    def eot_watch(self) -> frozenset[int]:
        """Ids the user named with `--eot-token-id`: the report says which never occur in the dump."""
        return self.eot.default if self.eot.default_source == "--eot-token-id" and self.eot.default else frozenset()


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


@dataclass
class GroupProducts:
    """What one group contributes to the outputs, in the driver's write order. Picklable and free of record bytes
    (an engine ships it back from a worker): calls rows, sequences with rewards, its SFT lines before
    `--sft-min-reward`, and its share of the report (`report_partial`)."""

    session: str | None
    call_rows: list[dict]
    sequences: list[Sequence_]
    sft_lines: list[bytes]
    partial: dict


def report_partial(session: str | None, calls: list[Call], res: GroupResult, mode: str,
                   eot_watch: frozenset[int] = frozenset()) -> dict:
    """One group's share of the report: ReportBuilder's sums and lists after this group alone, as plain JSON
    values. `merge_partial` adds shares in the driver's order, giving what add_group over every group gives."""
    rb = ReportBuilder(mode)
    rb.add_group(session, calls, res, eot_watch)
    out: dict = {}
    for f in dc_fields(ReportBuilder):
        if f.name in ("mode", "excluded_from_batches"):
            continue  # the run's mode; exclusion is decided by the driver
        v = getattr(rb, f.name)
        if f.name in ("breaks", "flag_notes"):
            v = [[n.session, n.chain_id, n.call_id, n.cause, n.token_pos] for n in v]
        elif f.name == "session_ratios":
            v = [list(x) for x in v]
        elif isinstance(v, dict):
            v = {k: (dict(x) if isinstance(x, dict) else x) for k, x in v.items()}
        out[f.name] = v
    return out


def merge_partial(rb: ReportBuilder, part: dict) -> None:
    """Add one group's share (`report_partial`) to the run's ReportBuilder."""
    for name, v in part.items():
        cur = getattr(rb, name)
        if name in ("breaks", "flag_notes"):
            cur.extend(Note(*x) for x in v)
        elif name == "session_ratios":
            cur.extend(tuple(x) for x in v)
        elif name in ("flags", "break_causes"):
            cur.update(v)
        elif name in ("per_protocol", "per_model"):
            for key, row in v.items():
                tgt = cur.setdefault(key, dict.fromkeys(row, 0))
                for col, n in row.items():
                    tgt[col] += n
        elif name == "eot_ids_seen":
            cur[:] = sorted({*cur, *v})
        elif isinstance(cur, list):
            cur.extend(v)
        else:
            setattr(rb, name, cur + v)


def group_products(session: str | None, records: list[tuple[IndexEntry, dict]], files: list[str],
                   settings: Settings) -> GroupProducts:
    """process_group, then what the outputs need from it. Pure: the unit an engine runs anywhere."""
    out = process_group(session, records, files, settings)
    lines = []
    for call in out.result.sft_calls:
        line = sft_line(call.messages_json, call.tools_json, call.assistant)
        if line is not None:
            lines.append(line)
    return GroupProducts(session, out.call_rows, out.result.sequences, lines,
                         report_partial(session, out.calls, out.result, settings.mode, settings.eot_watch))


def partition_of(session: str | None, n: int) -> int:
    """The partition (0..n-1) of a session: a stable hash (blake2b), the same in every process and every run,
    unlike Python's salted hash(). The null-session group is one group, so it has one partition."""
    key = b"\x00null" if session is None else b"s" + session.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % n


Work = list[tuple[str | None, list[IndexEntry]]]


class LocalEngine:
    """Both passes in this process, one group at a time: memory is bounded by the largest group."""

    name = "local"

    def index(self, files: list[str], progress: Callable[[int, int], None] | None = None) -> Index:
        return build_index(files, progress) if files else Index(files=[])

    def groups(self, work: Work, files: list[str], settings: Settings) -> Iterator[GroupProducts]:
        """Products of `work`'s groups, in `work`'s order."""
        source = RecordSource(files)
        try:
            for session, entries in work:
                yield group_products(session, source.load(entries), files, settings)
        finally:
            source.close()

    def stats(self) -> dict:
        return {"name": self.name}

    def close(self) -> None:
        pass


def make_engine(opts: Options):
    if opts.engine == "ray":
        from polar.processor.engine_ray import RayEngine  # Ray stays optional: imported only when asked for
        return RayEngine(opts.ray_address, opts.ray_partitions)
    if opts.engine != "local":
        raise ValueError(f"unknown engine {opts.engine!r}")
    return LocalEngine()


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


def _expand(inputs) -> list[str]:
    try:
        return rec.expand_inputs(inputs)
    except FileNotFoundError as exc:
        raise InputError(str(exc)) from exc


def _no_records(inputs, index: Index) -> str:
    """Exit 2's message when nothing readable was found: an empty directory or a typo in a glob must not look
    like a successful run."""
    where = " ".join(inputs)
    if not index.files:
        found = f"no flow files (*{rec.FILE_SUFFIX}, *{rec.OPEN_SUFFIX}) in {where}"
    else:
        tails = index.torn_tails
        found = (f"no readable flow record in the {len(index.files)} flow file(s) of {where}"
                 + (f" ({tails[0].describe()}{' …' if len(tails) > 1 else ''})" if tails else ""))
    return f"{found}; check the path, or pass --allow-empty to accept a run without records"


def _warnings(settings: Settings, report: ReportBuilder, rewards: rw.Rewards, index: Index) -> list[str]:
    """What the run could do but the user should look at: one sentence each, in report.json and on stderr."""
    out = []
    if settings.eot_watch and report.calls > report.calls_without_completion:
        w = eotmod.never_seen_warning(settings.eot_watch, report.eot_ids_seen, index.entries)
        if w:
            out.append(w)
    if rewards.unmatched_lines:
        out.append(f"--rewards: {rewards.unmatched_lines} line(s) name sessions that are not in the dump: "
                   f"{named_sessions(rewards.unmatched_sessions, rewards.unmatched_lines)}; check their session ids")
    return out


def process(opts: Options, progress: Progress | None = None) -> dict:
    """Run the whole pipeline; returns the report. Raises InputError / EotError / RewardsError / OutputError."""
    from polar.processor import manifest as mf

    progress = progress or Progress(False)
    t0 = time.perf_counter()
    prior = mf.load(opts.out) if opts.incremental else None
    if prior is not None:
        mf.check_options(prior, opts)
    outdir = OutDir(opts.out, opts.overwrite or opts.incremental)
    sinks: list[StreamingParquet] = []
    engine = None
    try:
        engine = make_engine(opts)
        files = _expand(opts.inputs)
        on_index = lambda d, t: progress("index", d, t, f"{d / 1e6:.0f}/{t / 1e6:.0f} MB")  # noqa: E731
        if opts.incremental:
            # Only files closed since the manifest are read; `.open` files wait until their writer closes them.
            plan = mf.plan(prior, files, engine, on_index)
            index = plan.index
        else:
            plan = None
            index = engine.index(files, on_index)
        if not index.entries and not opts.allow_empty:
            raise InputError(_no_records(opts.inputs, index))
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
        order = _group_order(groups, rewards)
        rebuild = plan.rebuild(groups, eot) if plan is not None else None
        work = [(s, groups[s]) for s in order if rebuild is None or s in rebuild]
        fresh = engine.groups(work, index.files, settings)
        carrier = plan.carrier(opts.out, [s for s in order if s not in rebuild]) if plan is not None else None
        state = mf.StateWriter(outdir.path("state"))
        sft_lines = 0
        n_records = len(index.entries)
        done = 0
        with open(outdir.path("sft.jsonl"), "wb") as sft:
            for session in order:
                if carrier is None or session in rebuild:
                    prod = next(fresh)
                    assert prod.session == session, "engine answered out of order"
                else:
                    # Untouched since the last run: its merge is carried over; rewards and advantages are not
                    # (the rewards file and every group's statistics may have changed), so they are applied anew.
                    prod = carrier.get(session)
                    for seq in prod.sequences:
                        rw.apply(seq, rewards, opts.side_chains)
                calls_out.add(prod.call_rows, sum(len(r["messages"] or "") + 512 for r in prod.call_rows))
                seqs_out.add(prod.sequences, sum(s.n_tokens * 9 for s in prod.sequences))
                for seq in prod.sequences:
                    if seq.side_chain and opts.side_chains == "exclude":
                        report.excluded_from_batches += 1
                        continue
                    packer.add(seq)
                hit = rewards.by_session.get(session) if session is not None else None
                if opts.sft_min_reward is None or (hit is not None and hit[0] >= opts.sft_min_reward):
                    for line in prod.sft_lines:
                        sft.write(line)
                        sft_lines += 1
                merge_partial(report, prod.partial)
                state.add(prod)
                done += len(groups[session])
                progress("merge", done, n_records, f"{done}/{n_records} records")
            packer.close()
        # Run the engine's iterator to its end (it collects its workers' facts there); it has nothing left to give.
        if next(fresh, None) is not None:
            raise AssertionError("engine answered more groups than asked")
        if carrier is not None:
            carrier.close()
        calls_out.finish()
        seqs_out.finish()
        progress.end()
        seconds = time.perf_counter() - t0
        options = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(opts).items()}
        outputs = {"dir": opts.out, "calls": calls_out.rows, "sequences": seqs_out.rows, "batches": packer.files,
                   "sft_lines": sft_lines}
        doc = report.build(index=index, eot=eot.describe(), rewards=rewards, options=options, outputs=outputs,
                           seconds=seconds, warnings=_warnings(settings, report, rewards, index))
        doc["engine"] = engine.stats()
        if plan is not None:
            doc["incremental"] = plan.describe(rebuild, len(order))
        state.finish(index, eot, opts, doc.get("incremental"),
                     plan.prior.files if plan is not None and plan.prior is not None else None)
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
    finally:
        if engine is not None:
            engine.close()
