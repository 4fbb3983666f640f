"""The processor's run, one sequence: plan → end-of-turn ids → rewards → group products → outputs → report.

The plan (manifest.py) says which files are read and which groups are rebuilt: a full run reads every file and
rebuilds every group; `--incremental` reads only the closed files its manifest does not list and carries the other
groups' products over from OUT. Either way `Plan.products` yields every group's products in one fixed (group,
session) order: rebuilt ones from the engine (engine.py: `LocalEngine`, or engine_ray.py), so the driver writes
the same bytes whatever the engine, and an incremental run the same as a full run over the same closed files.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass, replace

from polar import records as rec
from polar.processor import credit as cr
from polar.processor import eot as eotmod
from polar.processor import manifest as mf
from polar.processor import rewards as rw
from polar.processor.engine import Engine, GroupProducts, LocalEngine, Settings
from polar.processor.load import Index, InputError
from polar.processor.report import named_sessions, render_html
from polar.processor.report_counts import ReportBuilder
from polar.processor.report_doc import Report, write_report_json
from polar.processor.trainer_files import file_sha256, out_sections
from polar.processor.viewer import ViewerBuilder, Vocabs
from polar.processor.writers import (CALLS_SCHEMA, SEQUENCES_SCHEMA, BatchPacker, OutDir, StreamingParquet, calls_frame,
                                     sequences_frame)


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
    session_prefix: tuple[str, ...] = ()  # keep sessions starting with one of these (empty: every session)
    report_max_mb: float = 50.0  # report.html's size bound: token strips are left out past it (viewer.py)
    report_no_text: bool = False  # report.html without conversation text
    vocab: tuple[str, ...] = ()  # [MODEL=]DIR: token text in report.html only (never the end-of-turn set)
    allow_unjoined: bool = False  # a --rewards file none of whose lines joins a session is accepted (else an error)
    advantage_norm: str = "std"  # rewards.ADVANTAGE_NORMS: divide by the group's σ, or only subtract its mean
    credit: str = "session"  # credit.CREDITS: the session's advantage on every trained token, or plus turn terms
    turn_gamma: float = cr.DEFAULT_TURN_GAMMA  # --credit turn: later calls' progress smeared back by γ per call
    compaction: str = "train"  # compaction.COMPACTIONS: a compaction call's tokens trained, or masked (rule 12)


def process(opts: Options, progress: Progress | None = None) -> Report:
    """Run the whole pipeline; returns report.json's document. Raises InputError / EotError / RewardsError /
    OutputError."""
    progress = progress or Progress(False)
    t0 = time.perf_counter()
    vocabs = Vocabs.read(opts.vocab)  # a bad --vocab stops the run before OUT is touched
    prior = mf.previous_run(opts) if opts.incremental else None
    outdir = OutDir(opts.out, opts.overwrite or opts.incremental)
    engine: Engine | None = None
    outputs: _RunOutputs | None = None
    try:
        engine = make_engine(opts)
        files = _expand(opts.inputs)
        on_index = lambda d, t: progress("index", d, t, f"{d / 1e6:.0f}/{t / 1e6:.0f} MB")  # noqa: E731
        plan = (mf.incremental_plan(prior, files, engine, on_index) if opts.incremental
                else mf.full_plan(files, engine, on_index))
        index = plan.index
        if not index.entries and not opts.allow_empty:
            raise InputError(_no_records(opts.inputs, index))
        groups, other = _keep_prefixed(index.sessions(), opts.session_prefix)
        eot = _end_of_turn(opts, index if not opts.session_prefix else replace(
            index, entries=[e for entries in groups.values() for e in entries]))
        rewards = rw.read_rewards(opts.rewards, {s for s in groups if s is not None}, opts.advantage_norm)
        if opts.rewards and not opts.allow_unjoined:
            rw.check_joined(opts.rewards, rewards, groups)
        if opts.credit == "turn":
            rewards.turn = cr.turn_terms(rewards.turn_scores, {s: g for s, (_, g) in rewards.by_session.items()},
                                         opts.turn_gamma, opts.advantage_norm)
        settings = Settings(opts.mode, opts.on_mismatch, opts.max_batch_tokens, opts.side_chains, eot, rewards,
                            opts.compaction)
        order = _group_order(groups, rewards)
        rebuild = plan.rebuild(groups, eot)

        outputs = _RunOutputs(outdir, opts, rewards, vocabs)
        done, n_records = 0, len(index.entries)
        for prod in plan.products(order, groups, rebuild, engine, settings):
            outputs.add(prod)
            done += len(groups[prod.session])
            progress("merge", done, n_records, f"{done}/{n_records} records")
        outputs.finish()
        progress.end()

        report = outputs.report.build(
            index=index, eot=eot.describe(), rewards=rewards, options=_as_json(opts), outputs=outputs.counts(),
            seconds=time.perf_counter() - t0, warnings=_warnings(settings, outputs.report, rewards, index),
            engine=engine.stats(), other_prefix=other if opts.session_prefix else None,
            incremental=plan.describe(rebuild, len(order), eot) if opts.incremental else None)
        outputs.state.finish(index, eot, opts, report.incremental, plan.known_files)
        _write_report(outdir, report, outputs, opts.out)
        outdir.commit()
        return report
    except BaseException:
        if outputs is not None:
            outputs.abort()
        outdir.abort()
        raise
    finally:
        if engine is not None:
            engine.close()


class _RunOutputs:
    """Every output file of one run but the report, fed one group's products at a time in the driver's order:
    calls.parquet, sequences.parquet, batches/, sft.jsonl, state/; and the report's sums."""

    def __init__(self, outdir: OutDir, opts: Options, rewards: rw.Rewards, vocabs: Vocabs):
        self.dir, self.opts, self.rewards = opts.out, opts, rewards
        self.sinks: list[StreamingParquet] = []
        self.sft = self.state = None
        try:
            self.calls = StreamingParquet(outdir.path("calls.parquet"), calls_frame, CALLS_SCHEMA, 256)
            self.sinks.append(self.calls)
            self.sequences = StreamingParquet(outdir.path("sequences.parquet"), sequences_frame, SEQUENCES_SCHEMA, 128)
            self.sinks.append(self.sequences)
            os.makedirs(outdir.path("batches"), exist_ok=True)
            self.packer = BatchPacker(outdir.path("batches"), opts.max_batch_tokens)
            self.report = ReportBuilder(opts.mode)
            self.viewer = ViewerBuilder(rewards, vocabs, not opts.report_no_text, opts.report_max_mb)
            self.state = mf.StateWriter(outdir.path("state"))
            self.sft = open(outdir.path("sft.jsonl"), "wb")
        except BaseException:
            self.abort()
            raise
        self.sft_lines = 0

    def add(self, prod: GroupProducts) -> None:
        self.calls.add(prod.call_rows, sum(len(r["messages"] or "") + 512 for r in prod.call_rows))
        self.sequences.add(prod.sequences, sum(s.n_tokens * 9 for s in prod.sequences))
        for seq in prod.sequences:
            if seq.side_chain and "compaction" not in seq.flags and self.opts.side_chains == "exclude":
                self.report.excluded_from_batches += 1
                continue
            self.packer.add(seq)
        if self._keeps_sft(prod.session):
            self.sft.writelines(rw.with_carried(prod.sft_lines, self.rewards, prod.session))
            self.sft_lines += len(prod.sft_lines)
        self.report.add(prod.report)
        self.viewer.add(prod)
        self.state.add(prod)

    def _keeps_sft(self, session: str | None) -> bool:
        """`--sft-min-reward X`: only sessions rewarded ≥ X; without it, every session."""
        if self.opts.sft_min_reward is None:
            return True
        hit = self.rewards.by_session.get(session) if session is not None else None
        return hit is not None and hit[0] >= self.opts.sft_min_reward

    def finish(self) -> None:
        self.packer.close()
        self.sft.close()
        self.calls.finish()
        self.sequences.finish()

    def counts(self) -> dict:
        """report.json's `outputs`."""
        return {"dir": self.dir, "calls": self.calls.rows, "sequences": self.sequences.rows,
                "batches": self.packer.files, "sft_lines": self.sft_lines}

    def abort(self) -> None:
        """Stop the sinks and close the files (the temporary directory goes with OutDir.abort)."""
        for sink in self.sinks:
            sink.abort()
        for fh in (self.sft, self.state.fh if self.state is not None else None):
            if fh is not None:
                fh.close()


def make_engine(opts: Options) -> Engine:
    if opts.engine == "ray":
        from polar.processor.engine_ray import RayEngine  # Ray is an optional dependency: imported only when asked
        return RayEngine(opts.ray_address, opts.ray_partitions)
    if opts.engine != "local":
        raise ValueError(f"unknown engine {opts.engine!r}")
    return LocalEngine()


def _end_of_turn(opts: Options, index: Index) -> eotmod.EotTable:
    """Rule 5's end-of-turn sets. prefix_merging needs one for every model in the dump; per_request needs none
    (the flags that need E are simply not set without it)."""
    try:
        eot = eotmod.resolve(index.entries, list(opts.eot_token_ids), list(opts.tokenizers))
    except eotmod.EotError:
        if opts.mode == "prefix_merging":
            raise
        return eotmod.EotTable()
    if opts.mode == "prefix_merging":
        lacking = eotmod.missing(eot, index.entries)
        if lacking:
            raise eotmod.EotError(
                f"prefix_merging needs the end-of-turn token ids of model(s) {', '.join(map(repr, lacking))} "
                f"and the dump has no evidence (no completion that stopped naturally); {eotmod.OPTIONS_HINT}")
    return eot


def _as_json(opts: Options) -> dict:
    """report.json's `options`: every option as given."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(opts).items()}


def _write_report(outdir: OutDir, report: Report, outputs: _RunOutputs, out: str) -> None:
    """report.json, then report.html: the overview, the session explorer, and the sections of the trainer's files
    OUT holds — polar-verify's verify.parquet (only when its rows checked this run's sequences.parquet) and a
    train.jsonl (trainer_files.py)."""
    write_report_json(outdir.path("report.json"), report)
    sequences = outdir.path("sequences.parquet")
    sections = out_sections(os.path.join(out, "verify.parquet"), os.path.join(out, "train.jsonl"),
                            file_sha256(sequences) if os.path.isfile(sequences) else None)
    page = render_html(report, outputs.report.totals.seq_lengths, outputs.viewer.finish(), sections)
    with open(outdir.path("report.html"), "w", encoding="utf-8") as fh:
        fh.write(page)


def _keep_prefixed(groups: dict, prefixes: tuple[str, ...]) -> tuple[dict, tuple[int, int]]:
    """`--session-prefix`: the sessions starting with one of `prefixes` (all of them when there is none), and
    (sessions, records) left out — the null-session group counts as one session."""
    if not prefixes:
        return groups, (0, 0)
    kept = {s: e for s, e in groups.items() if s is not None and s.startswith(prefixes)}
    left = [e for s, e in groups.items() if s not in kept]
    return kept, (len(left), sum(map(len, left)))


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
    totals = report.totals
    if settings.eot_watch and totals.calls > totals.calls_without_completion:
        w = eotmod.never_seen_warning(settings.eot_watch, totals.eot_ids_seen, index.entries)
        if w:
            out.append(w)
    if rewards.unmatched_lines:
        out.append(f"--rewards: {rewards.unmatched_lines} line(s) name sessions that are not in the dump: "
                   f"{named_sessions(rewards.unmatched_sessions, rewards.unmatched_lines)}; check their session ids")
    return out



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
