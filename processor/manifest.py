"""The run's plan — which files are read, which groups rebuilt — and `--incremental`: the manifest a run leaves in
OUT, and what the next run carries over (docs/merge-rules.md#outputs).

A full run's plan is simple: every file named is read and every group rebuilt (`full_plan`). An incremental run's
(`incremental_plan`) is the rest of this docstring; `Plan.products` gives the driver every group's products in its
order either way, so the driver (pipeline.process) is one sequence for both.

Every run (incremental or not) writes OUT/manifest.json (the closed flow files it read, with sizes and record
counts; the options that decide a merge; the end-of-turn ids it used; sessions left pending) and OUT/state/
(index.parquet: one row per record of those files; groups.jsonl: each group's SFT lines and report share).

A run with `--incremental`:
- reads only closed flow files (`*.msgpack`) that are not in the manifest. A `.open` file is still being written:
  it is skipped (reported in `inputs.open_files`) and read once its writer closes it (renames it to `.msgpack`).
- rebuilds whole every session (and the null-session group) that has a record in a new file, taking its older
  records from the files the manifest lists, plus sessions a previous full run read partly from `.open` files;
- carries every other session's calls rows, sequences and SFT lines over from OUT as they are;
- recomputes rewards and advantages of every sequence from `--rewards` (so every group a new session touches, and
  any change in the rewards file, is reflected), re-packs `batches/` and rewrites sft.jsonl and the report whole.
The outputs equal those of a full run over the same closed files. A closed file that changed size, options that
decide the merge (mode, end-of-turn ids, tokenizers, max batch tokens, side-chain policy, on-mismatch) that differ
from the manifest's, or an OUT with outputs but no manifest are errors (exit 2: rerun with --overwrite). When new
evidence changes the end-of-turn ids the dump implies, every session is rebuilt.
Memory: the carried-over rows are read from OUT's previous calls/sequences files at once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import orjson
import polars as pl

from polar import records as rec
from polar.records import out as out_tables
from polar.processor import rewards as rw
from polar.processor.engine import Engine, GroupProducts, Settings
from polar.processor.load import Index, IndexEntry, InputError
from polar.processor.merge import TrainingSequence
from polar.processor.report_counts import ReportPartial
from polar.processor.writers import OutputError

MANIFEST = "manifest.json"
STATE = "state"
VERSION = 1
# The options that decide a group's merge: a run with others cannot reuse a previous run's merges.
FINGERPRINT = ("mode", "eot_token_ids", "tokenizers", "max_batch_tokens", "side_chains", "on_mismatch",
               "session_prefix", "compaction")
# Fingerprint keys added after a manifest version first shipped, with the value an older manifest means.
_ADDED = {"session_prefix": [], "compaction": "train"}

_INDEX_SCHEMA = {"file": pl.Utf8, "offset": pl.Int64, "length": pl.Int64, "session": pl.Utf8, "t_start": pl.Float64,
                 "id": pl.Utf8, "model_served": pl.Utf8, "finish_reason": pl.Utf8, "stop_reason": pl.Utf8,
                 "last_completion_id": pl.Int64, "has_completion": pl.Boolean}


def _key(path: str) -> str:
    return os.path.realpath(path)


def fingerprint(opts) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in ((k, getattr(opts, k)) for k in FINGERPRINT)}


def eot_ids(eot) -> dict:
    return {m: d["ids"] for m, d in eot.describe().items()}


@dataclass
class Prior:
    """What the previous run left in OUT."""

    out: str
    doc: dict

    @property
    def files(self) -> dict[str, dict]:
        return {f["key"]: f for f in self.doc["files"]}


def load(out: str) -> Prior | None:
    """The previous run's manifest; None for an absent or empty OUT. OutputError when OUT has outputs without one."""
    if not os.path.isdir(out):
        return None
    names = [n for n in os.listdir(out) if not n.startswith(".polar-tmp-")]
    if not names:
        return None
    path = os.path.join(out, MANIFEST)
    if not os.path.isfile(path):
        raise OutputError(f"-o {out}: has outputs but no {MANIFEST}; --incremental continues a run that wrote one "
                          "(rerun once with --overwrite)")
    try:
        with open(path, "rb") as fh:
            doc = orjson.loads(fh.read())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise OutputError(f"{path}: unreadable ({exc}); rerun with --overwrite") from exc
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise OutputError(f"{path}: manifest version {doc.get('version') if isinstance(doc, dict) else '?'} is not "
                          f"{VERSION}; rerun with --overwrite")
    return Prior(out, doc)


def check_options(prior: Prior, opts) -> None:
    old, new = prior.doc.get("options", {}), fingerprint(opts)
    diffs = [f"--{k.replace('_', '-')} {old.get(k, _ADDED.get(k))!r} → {new[k]!r}" for k in FINGERPRINT
             if old.get(k, _ADDED.get(k)) != new[k]]
    if diffs:
        raise OutputError(f"--incremental: options differ from the run that wrote {prior.out}/{MANIFEST} "
                          f"({'; '.join(diffs)}); rerun with --overwrite")


def previous_run(opts) -> Prior | None:
    """The run `--incremental` continues (None: OUT is absent or empty), its options checked against these."""
    prior = load(opts.out)
    if prior is not None:
        check_options(prior, opts)
    return prior


def _read_index(prior: Prior) -> tuple[list[str], list[IndexEntry]]:
    """The previous runs' index: file paths and entries (file = position in the returned paths)."""
    path = os.path.join(prior.out, STATE, "index.parquet")
    if not os.path.isfile(path):
        raise OutputError(f"{path}: missing; rerun with --overwrite")
    df = pl.read_parquet(path)
    paths = df["file"].unique(maintain_order=True).to_list()
    no = {p: i for i, p in enumerate(paths)}
    entries = [IndexEntry(session=r["session"], t_start=r["t_start"], id=r["id"], file=no[r["file"]],
                          offset=r["offset"], length=r["length"], model_served=r["model_served"],
                          finish_reason=r["finish_reason"], stop_reason=r["stop_reason"],
                          last_completion_id=r["last_completion_id"], has_completion=r["has_completion"])
               for r in df.iter_rows(named=True)]
    return paths, entries


@dataclass
class Plan:
    """What one run reads and rebuilds. A full run (`full_plan`) reads every file named and rebuilds every group. An
    incremental run (`incremental_plan`) reads the closed files the manifest does not list, joined to the manifest's
    index, and rebuilds only the groups those files (or pending sessions) touch; `products` carries the rest over."""

    index: Index
    incremental: bool = False
    prior: Prior | None = None
    new_files: list[str] = field(default_factory=list)
    open_files: list[str] = field(default_factory=list)
    _new_nos: set[int] = field(default_factory=set)  # the new files' positions in index.files

    def full_rebuild_reason(self, eot) -> str | None:
        """Why an incremental run rebuilds every group, when it does."""
        if self.prior is None:
            return "no previous run in OUT"
        if self.prior.doc.get("eot_ids") != eot_ids(eot):
            return "the end-of-turn ids changed"
        return None

    def rebuild(self, groups: dict, eot) -> set:
        """Groups rebuilt whole: every group in a full run; in an incremental one, those with any record in a new
        file, or pending, or all when nothing can be carried."""
        if not self.incremental:
            return set(groups)
        if self.full_rebuild_reason(eot):
            out = set(groups)
        else:
            pending = set(self.prior.doc.get("pending_sessions", []))
            carried = set(self.prior.doc.get("groups", []))
            out = {e.session for e in self.index.entries if e.file in self._new_nos}
            out |= {s for s in groups if s in pending or s not in carried}
        need = {e.file for s in out for e in groups.get(s, ())}
        gone = [self.index.files[f] for f in sorted(need) if not os.path.isfile(self.index.files[f])]
        if gone:
            raise InputError(f"--incremental: sessions to rebuild have records in flow files that are gone: "
                             f"{', '.join(gone[:5])}{' …' if len(gone) > 5 else ''}; restore them or rerun with "
                             "--overwrite on the files there are")
        return out

    def products(self, order: list, groups: dict, rebuild: set, engine: Engine,
                 settings: Settings) -> Iterator[GroupProducts]:
        """Every group's products in `order`: rebuilt groups from the engine; the others carried over from OUT, with
        rewards and advantages applied anew (the rewards file and every group's statistics may have changed)."""
        fresh = engine.groups([(s, groups[s]) for s in order if s in rebuild], self.index.files, settings)
        carried = [s for s in order if s not in rebuild]
        carrier = Carrier(self.prior.out, carried) if carried else None
        try:
            for session in order:
                if session in rebuild:
                    prod = next(fresh)
                    assert prod.session == session, "engine answered out of order"
                else:
                    prod = carrier.get(session)
                    for seq in prod.sequences:
                        rw.apply(seq, settings.rewards, settings.side_chains)
                yield prod
            # Run the engine's iterator to its end (it collects its workers' facts there); it has nothing left.
            if next(fresh, None) is not None:
                raise AssertionError("engine answered more groups than asked")
        finally:
            if carrier is not None:
                carrier.close()

    def describe(self, rebuild: set, n_groups: int, eot) -> dict | None:
        """report.json's `incremental` (None for a full run)."""
        if not self.incremental:
            return None
        return {"new_files": len(self.new_files), "open_files_skipped": len(self.open_files),
                "groups_rebuilt": len(rebuild), "groups_carried": n_groups - len(rebuild),
                "full_rebuild_reason": self.full_rebuild_reason(eot)}

    @property
    def known_files(self) -> dict[str, dict] | None:
        """The previous manifest's files by key: the sizes of files that are gone since."""
        return self.prior.files if self.prior is not None else None


def full_plan(files: list[str], engine: Engine, progress) -> Plan:
    """Every file named is read (`.open` files too, as in progress) and every group rebuilt."""
    return Plan(engine.index(files, progress))


def incremental_plan(prior: Prior | None, files: list[str], engine: Engine, progress) -> Plan:
    """Index the closed files the manifest does not list and join them to the manifest's index. `.open` files wait
    until their writer closes them."""
    closed = [f for f in files if not f.endswith(rec.OPEN_SUFFIX)]
    open_files = [f for f in files if f.endswith(rec.OPEN_SUFFIX)]
    new = _new_files(prior, closed)
    fresh = engine.index(new, progress)
    old_paths, old_entries = _read_index(prior) if prior is not None else ([], [])
    prior_files = prior.doc["files"] if prior is not None else []
    for f in prior_files:
        if f["path"] not in old_paths:
            old_paths.append(f["path"])  # a file without records
    paths = sorted({*old_paths, *fresh.files}, key=lambda p: (os.path.basename(p), p))
    no = {p: i for i, p in enumerate(paths)}
    entries = [_refile(e, no[old_paths[e.file]]) for e in old_entries]
    entries += [_refile(e, no[fresh.files[e.file]]) for e in fresh.entries]
    entries.sort(key=lambda e: (e.file, e.offset))
    scans = list(fresh.scans)
    for f in prior_files:
        tail = f.get("torn_tail")
        scans.append(rec.FileScan(f["path"], records=f["records"], torn_tail=rec.TornTail(
            f["path"], tail["offset"], tail["bytes"], False) if tail else None))
    scans.sort(key=lambda s: no.get(s.path, -1))
    scans += [rec.FileScan(p, is_open=True) for p in open_files]
    total = fresh.total_bytes + sum(f["size"] for f in prior_files)
    index = Index(files=paths, entries=entries, scans=scans, total_bytes=total)
    return Plan(index, True, prior, new, open_files, _new_nos={no[p] for p in fresh.files})


def _new_files(prior: Prior | None, closed: list[str]) -> list[str]:
    """The closed files the manifest does not list; a listed file that changed size is an error."""
    known = prior.files if prior is not None else {}
    new = []
    for f in closed:
        old = known.get(_key(f))
        if old is None:
            new.append(f)
        elif os.path.getsize(f) != old["size"]:
            raise InputError(f"{f}: {old['size']} bytes when last processed, {os.path.getsize(f)} now; a closed flow "
                             "file never changes — rerun with --overwrite")
    return new


def _refile(e: IndexEntry, file_no: int) -> IndexEntry:
    return IndexEntry(e.session, e.t_start, e.id, file_no, e.offset, e.length, e.model_served, e.finish_reason,
                      e.stop_reason, e.last_completion_id, e.has_completion)


# ---------------------------------------------------------------------------------------------------- carry-over

def _arrays(s: pl.Series, dtype) -> list[np.ndarray | None]:
    """A List column as numpy arrays (null rows → None), without a Python object per element."""
    lens = s.list.len()
    flat = s.filter(lens > 0).explode().to_numpy().astype(dtype, copy=False)
    out: list[np.ndarray | None] = []
    pos = 0
    for n in lens.to_list():
        if n is None:
            out.append(None)
        else:
            out.append(flat[pos:pos + n])
            pos += n
    return out


def sequences_from_frame(df: pl.DataFrame) -> list[TrainingSequence]:
    """Rows of sequences.parquet back into TrainingSequences (t_first is not stored: only the merge sorts by it)."""
    ids = _arrays(df["input_ids"], np.int32)
    mask = _arrays(df["loss_mask"], np.uint8)
    lps = _arrays(df["logprobs"], np.float32)
    out = []
    for i, r in enumerate(df.drop("input_ids", "loss_mask", "logprobs").iter_rows(named=True)):
        out.append(TrainingSequence(
            sequence_id=r["sequence_id"], chain_id=r["chain_id"], session=r["session"], mode=r["mode"],
            input_ids=ids[i], loss_mask=mask[i], logprobs=lps[i], call_ids=r["call_ids"], prompt_len=r["prompt_len"],
            flags=r["flags"], break_cause=r["break_cause"], model=r["model"], t_first=float("nan"),
            side_chain="side_chain" in r["flags"], group=r["group"], reward=r["reward"], advantage=r["advantage"],
            # An OUT written before these columns existed has none: empty lists (--overwrite rebuilds them).
            weight_versions=r.get("weight_versions") or [],
            call_spans=[(x["call_id"], x["start"], x["end"]) for x in r.get("call_spans") or []]))
    return out


class Carrier:
    """Products of sessions carried over from OUT's previous outputs, by session."""

    def __init__(self, out: str, sessions: list):
        want = set(sessions)
        self.groups: dict = {}
        path = os.path.join(out, STATE, "groups.jsonl")
        try:
            with open(path, "rb") as fh:
                for line in fh:
                    g = orjson.loads(line)
                    if g["session"] in want:
                        self.groups[g["session"]] = g
        except OSError as exc:
            raise OutputError(f"{path}: unreadable ({exc}); rerun with --overwrite") from exc
        keep = pl.col("session").is_in([s for s in want if s is not None])
        if None in want:
            keep = keep | pl.col("session").is_null()
        try:
            seqs, calls = out_tables.read(out_tables.SEQUENCES.path(out)), out_tables.read(out_tables.CALLS.path(out))
        except out_tables.OutVersionError as exc:
            raise OutputError(f"{exc}; or rerun with --overwrite") from None
        self.seqs = self._split(seqs.filter(keep))
        self.calls = self._split(calls.filter(keep))

    @staticmethod
    def _split(df: pl.DataFrame) -> dict:
        return {k[0]: v for k, v in df.partition_by("session", as_dict=True, maintain_order=True).items()}

    def get(self, session) -> GroupProducts:
        g = self.groups.pop(session, None)
        if g is None:
            raise OutputError(f"--incremental: {session!r} is not in OUT's state; rerun with --overwrite")
        seqs = self.seqs.pop(session, None)
        calls = self.calls.pop(session, None)
        return GroupProducts(
            session, calls.to_dicts() if calls is not None else [],
            sequences_from_frame(seqs) if seqs is not None else [],
            [line.encode() for line in g["sft"]], ReportPartial.from_json(g["partial"]))

    def close(self) -> None:
        self.groups.clear()
        self.seqs.clear()
        self.calls.clear()


# ---------------------------------------------------------------------------------------------------- writing

class StateWriter:
    """OUT/state/ and OUT/manifest.json of this run, written under the run's temporary directory."""

    def __init__(self, state_dir: str):
        self.dir = state_dir
        os.makedirs(state_dir, exist_ok=True)
        self.fh = open(os.path.join(state_dir, "groups.jsonl"), "wb")
        self.sessions: list = []

    def add(self, prod: GroupProducts) -> None:
        self.sessions.append(prod.session)
        self.fh.write(orjson.dumps({"session": prod.session, "sft": [x.decode() for x in prod.sft_lines],
                                    "partial": prod.report.to_json()}) + b"\n")

    def finish(self, index: Index, eot, opts, last_run: dict | None, known: dict | None = None) -> None:
        """Write index.parquet and the manifest. known: the previous manifest's files by key (sizes of files that
        are gone since)."""
        self.fh.close()
        is_open = [p.endswith(rec.OPEN_SUFFIX) for p in index.files]
        closed = [e for e in index.entries if not is_open[e.file]]
        pending = sorted({e.session for e in index.entries if is_open[e.file]}, key=lambda s: (s is None, s or ""))
        pending_set = set(pending)
        cols = {k: [] for k in _INDEX_SCHEMA}
        for e in closed:
            cols["file"].append(index.files[e.file])
            for k in ("offset", "length", "session", "t_start", "id", "model_served", "finish_reason", "stop_reason",
                      "last_completion_id", "has_completion"):
                cols[k].append(getattr(e, k))
        pl.DataFrame(cols, schema=_INDEX_SCHEMA).write_parquet(os.path.join(self.dir, "index.parquet"))
        scans = {s.path: s for s in index.scans}
        files = []
        for p, op in zip(index.files, is_open):
            if op:
                continue
            scan = scans.get(p)
            tail = scan.torn_tail if scan is not None else None
            files.append({"path": p, "key": _key(p), "size": os.path.getsize(p) if os.path.exists(p)
                          else (known or {})[_key(p)]["size"],
                          "records": scan.records if scan is not None else 0,
                          "torn_tail": {"offset": tail.offset, "bytes": tail.nbytes} if tail else None})
        doc = {"version": VERSION, "options": fingerprint(opts), "eot_ids": eot_ids(eot), "files": files,
               "groups": [s for s in self.sessions if s not in pending_set], "pending_sessions": pending,
               "last_run": last_run,
               # recorded, not compared: every advantage is recomputed
               "advantage_norm": opts.advantage_norm, "credit": opts.credit, "turn_gamma": opts.turn_gamma}
        with open(os.path.join(os.path.dirname(self.dir), MANIFEST), "wb") as fh:
            fh.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
