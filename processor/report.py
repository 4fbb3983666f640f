"""report.json and a self-contained report.html (inline SVG, no CDN), plus the one-screen summary
(docs/merge-rules.md#outputs).

report.html is the overview rendered here as static HTML (every value escaped) inside the page viewer.py builds
around it: the session explorer, its embedded data and script. The trainer's files (verify.json, train.jsonl) are
rendered into the overview when they are there (`trainer_sections`).

Counting is split from summing: `ReportPartial.of` counts one group wherever an engine runs it, and `ReportBuilder`
adds the groups' shares in the driver's order, so the report is the same for every engine and for groups an
incremental run carries over."""

from __future__ import annotations

import bisect
import html
import math
import os
from collections import Counter
from dataclasses import dataclass, field

import orjson

from polar.processor.eot import occurring
from polar.processor.merge import FLAGS, GroupResult, Note
from polar.processor.normalize import Call
from polar.processor.viewer import ROW_COLS, page

REPORT_VERSION = 1


def _table_row() -> dict:
    return {"calls": 0, "calls_without_completion": 0, "errors": 0, "prompt_tokens": 0, "completion_tokens": 0,
            "sequences": 0, "trainable_tokens": 0}


@dataclass
class ReportPartial:
    """One group's share of the report (`of`), or the sum of shares (`add`): sums, notes and lists that add up group by
    group, so the report is the same whichever worker counted which group. It crosses from an engine's workers to
    the driver, and OUT/state/groups.jsonl keeps it (`to_json` / `from_json`) for the groups a later --incremental
    run carries over."""

    calls: int = 0
    calls_without_completion: int = 0
    calls_null_session: int = 0
    sessions: int = 0
    chains: int = 0
    sequences: int = 0
    calls_in_sequences: int = 0
    tokens_total: int = 0
    tokens_trainable: int = 0
    per_request_total: int = 0
    record_tokens: int = 0  # Σ prompt + completion over every record: the throughput measure
    breaks: list[Note] = field(default_factory=list)
    flag_notes: list[Note] = field(default_factory=list)
    flags: Counter = field(default_factory=Counter)
    break_causes: Counter = field(default_factory=Counter)
    per_protocol: dict[str, dict] = field(default_factory=dict)
    per_model: dict[str, dict] = field(default_factory=dict)
    seq_lengths: list[int] = field(default_factory=list)
    session_ratios: list[tuple[str, int, int]] = field(default_factory=list)  # (session, calls, sequences)
    eot_ids_seen: list[int] = field(default_factory=list)  # watched end-of-turn ids found in the groups' tokens

    @classmethod
    def of(cls, session: str | None, calls: list[Call], res: GroupResult,
           eot_watch: frozenset[int] = frozenset()) -> ReportPartial:
        """Count one group. Per-protocol and per-model rows add up to the totals: a call counts under its own
        protocol and model, a sequence under its first call's (the one whose prompt it starts with).
        eot_watch: `--eot-token-id` ids to look for in the group's tokens (`eot.occurring`)."""
        part = cls(calls=len(calls), calls_null_session=len(calls) if session is None else 0,
                   sessions=0 if session is None else 1, chains=res.n_chains, breaks=list(res.breaks),
                   flag_notes=list(res.flag_notes))
        part._count_calls(calls)
        if eot_watch:
            part.eot_ids_seen = occurring([c for c in calls if c.eligible], eot_watch)
        part._count_sequences(session, calls, res)
        return part

    def _count_calls(self, calls: list[Call]) -> None:
        for c in calls:
            p = len(c.prompt) if c.prompt is not None else 0
            q = len(c.completion) if c.completion is not None else 0
            self.record_tokens += p + q
            if c.eligible:
                self.per_request_total += p + q
            else:
                self.calls_without_completion += 1
            for table, key in ((self.per_protocol, c.protocol), (self.per_model, c.model)):
                row = table.setdefault(str(key), _table_row())
                row["calls"] += 1
                row["calls_without_completion"] += 0 if c.eligible else 1
                row["errors"] += 1 if c.row["error"] is not None else 0
                row["prompt_tokens"] += p
                row["completion_tokens"] += q

    def _count_sequences(self, session: str | None, calls: list[Call], res: GroupResult) -> None:
        protocol_of = {c.id: str(c.protocol) for c in calls}
        n_in = 0
        for s in res.sequences:
            self.sequences += 1
            n_in += len(s.call_ids)
            self.tokens_total += s.n_tokens
            self.tokens_trainable += s.n_trainable
            self.seq_lengths.append(s.n_tokens)
            self.flags.update(s.flags)
            if s.break_cause:
                self.break_causes[s.break_cause] += 1
            for table, key in ((self.per_protocol, protocol_of[s.call_ids[0]]), (self.per_model, str(s.model))):
                row = table.setdefault(key, _table_row())
                row["sequences"] += 1
                row["trainable_tokens"] += s.n_trainable
        self.calls_in_sequences += n_in
        if res.sequences:
            self.session_ratios.append(("(no session)" if session is None else session, n_in, len(res.sequences)))

    def add(self, other: ReportPartial) -> None:
        """Add another share: what counting both groups into one share gives."""
        self.calls += other.calls
        self.calls_without_completion += other.calls_without_completion
        self.calls_null_session += other.calls_null_session
        self.sessions += other.sessions
        self.chains += other.chains
        self.sequences += other.sequences
        self.calls_in_sequences += other.calls_in_sequences
        self.tokens_total += other.tokens_total
        self.tokens_trainable += other.tokens_trainable
        self.per_request_total += other.per_request_total
        self.record_tokens += other.record_tokens
        self.breaks.extend(other.breaks)
        self.flag_notes.extend(other.flag_notes)
        self.flags.update(other.flags)
        self.break_causes.update(other.break_causes)
        _add_rows(self.per_protocol, other.per_protocol)
        _add_rows(self.per_model, other.per_model)
        self.seq_lengths.extend(other.seq_lengths)
        self.session_ratios.extend(other.session_ratios)
        self.eot_ids_seen = sorted({*self.eot_ids_seen, *other.eot_ids_seen})

    def to_json(self) -> dict:
        """As plain JSON values, for state/groups.jsonl (notes and ratios as arrays)."""
        return {
            "calls": self.calls, "calls_without_completion": self.calls_without_completion,
            "calls_null_session": self.calls_null_session, "sessions": self.sessions, "chains": self.chains,
            "sequences": self.sequences, "calls_in_sequences": self.calls_in_sequences,
            "tokens_total": self.tokens_total, "tokens_trainable": self.tokens_trainable,
            "per_request_total": self.per_request_total, "record_tokens": self.record_tokens,
            "breaks": [_note_json(n) for n in self.breaks], "flag_notes": [_note_json(n) for n in self.flag_notes],
            "flags": dict(self.flags), "break_causes": dict(self.break_causes),
            "per_protocol": {k: dict(row) for k, row in self.per_protocol.items()},
            "per_model": {k: dict(row) for k, row in self.per_model.items()},
            "seq_lengths": list(self.seq_lengths), "session_ratios": [list(x) for x in self.session_ratios],
            "eot_ids_seen": list(self.eot_ids_seen),
        }

    @classmethod
    def from_json(cls, doc: dict) -> ReportPartial:
        """The share `to_json` wrote."""
        return cls(
            calls=doc["calls"], calls_without_completion=doc["calls_without_completion"],
            calls_null_session=doc["calls_null_session"], sessions=doc["sessions"], chains=doc["chains"],
            sequences=doc["sequences"], calls_in_sequences=doc["calls_in_sequences"],
            tokens_total=doc["tokens_total"], tokens_trainable=doc["tokens_trainable"],
            per_request_total=doc["per_request_total"], record_tokens=doc["record_tokens"],
            breaks=[Note(*x) for x in doc["breaks"]], flag_notes=[Note(*x) for x in doc["flag_notes"]],
            flags=Counter(doc["flags"]), break_causes=Counter(doc["break_causes"]),
            per_protocol={k: dict(row) for k, row in doc["per_protocol"].items()},
            per_model={k: dict(row) for k, row in doc["per_model"].items()},
            seq_lengths=list(doc["seq_lengths"]), session_ratios=[tuple(x) for x in doc["session_ratios"]],
            eot_ids_seen=list(doc["eot_ids_seen"]),
        )


def _note_json(n: Note) -> list:
    return [n.session, n.chain_id, n.call_id, n.cause, n.token_pos]


def _add_rows(table: dict[str, dict], rows: dict[str, dict]) -> None:
    """Add a per-protocol or per-model table's rows into another, column by column."""
    for key, row in rows.items():
        into = table.setdefault(key, dict.fromkeys(row, 0))
        for col, n in row.items():
            into[col] += n


@dataclass
class ReportBuilder:
    """Adds the groups' shares in the driver's order; `build()` gives the report.json document."""

    mode: str
    totals: ReportPartial = field(default_factory=ReportPartial)
    excluded_from_batches: int = 0  # side chains left out of batches/: decided by the driver (--side-chains exclude)

    def add(self, part: ReportPartial) -> None:
        self.totals.add(part)

    def build(self, *, index, eot: dict, rewards, options: dict, outputs: dict, seconds: float,
              warnings: list[str] = ()) -> dict:
        note = lambda n: {"session": n.session, "chain_id": n.chain_id, "call_id": n.call_id, "cause": n.cause,
                          "token_pos": n.token_pos}  # noqa: E731
        t = self.totals
        return {
            "version": REPORT_VERSION,
            "mode": self.mode,
            "inputs": {
                "files": len(index.files),
                "records": len(index.entries),
                "bytes": index.total_bytes,
                "torn_tails": [{"file": t.file, "offset": t.offset, "bytes": t.nbytes, "in_progress": t.in_progress,
                                "message": t.describe()} for t in index.torn_tails],
                "open_files": index.open_files,
            },
            "counts": {
                "calls": t.calls, "calls_without_completion": t.calls_without_completion,
                "sessions": t.sessions, "sessions_null": t.calls_null_session, "chains": t.chains,
                "sequences": t.sequences, "excluded_from_batches": self.excluded_from_batches,
            },
            "merge_ratio": t.calls_in_sequences / t.sequences if t.sequences else None,
            "tokens": {"total": t.tokens_total, "trainable": t.tokens_trainable,
                       "per_request_total": t.per_request_total, "records_total": t.record_tokens},
            "breaks": [note(n) for n in t.breaks],
            "break_causes": dict(t.break_causes),
            "flags": {f: t.flags.get(f, 0) for f in FLAGS},
            "flag_events": [note(n) for n in t.flag_notes],
            "rewards": {"joined": rewards.joined, "missing": rewards.missing,
                        "unmatched_lines": rewards.unmatched_lines, "unmatched_sessions": rewards.unmatched_sessions},
            "warnings": list(warnings),
            "eot": eot,
            "per_protocol": t.per_protocol,
            "per_model": t.per_model,
            "sessions": [{"session": s, "calls": c, "sequences": q, "merge_ratio": c / q}
                         for s, c, q in t.session_ratios],
            "options": options,
            "outputs": outputs,
            "seconds": round(seconds, 3),
            "tokens_per_second": round(t.record_tokens / seconds) if seconds > 0 else None,
        }


# ---------------------------------------------------------------------------------------------------- summary

def named_sessions(names: list[str], total: int) -> str:
    """A bounded list of session ids: `a, b, c` or `a, b, c … (12 in all)`."""
    text = ", ".join(map(repr, names))
    return text + (f" … ({total} in all)" if total > len(names) else "")


def summary(report: dict) -> str:
    """The one-screen summary printed at the end of a run."""
    c, t = report["counts"], report["tokens"]
    ratio = report["merge_ratio"]
    lines = [
        f"polar-process {report['mode']}: {report['inputs']['records']} records in {report['inputs']['files']} files "
        f"({report['inputs']['bytes'] / 1e6:.1f} MB) in {report['seconds']:.2f} s"
        + (f", {report['tokens_per_second'] / 1e6:.1f} M tokens/s" if report.get("tokens_per_second") else ""),
        f"  calls {c['calls']} (without completion {c['calls_without_completion']}, no session "
        f"{c['sessions_null']}), sessions {c['sessions']}, chains {c['chains']}, sequences {c['sequences']}",
        f"  merge ratio {ratio:.2f}" if ratio is not None else "  merge ratio n/a (no sequences)",
        f"  tokens {t['total']} (trainable {t['trainable']}); per_request would send {t['per_request_total']}",
    ]
    if report["break_causes"]:
        lines.append("  breaks: " + ", ".join(f"{k} {v}" for k, v in sorted(report["break_causes"].items())))
    flags = {k: v for k, v in report["flags"].items() if v}
    if flags:
        lines.append("  flags: " + ", ".join(f"{k} {v}" for k, v in flags.items()))
    r = report["rewards"]
    lines.append(f"  rewards: joined {r['joined']}, missing {r['missing']}, unmatched lines {r['unmatched_lines']}"
                 + (f" ({named_sessions(r['unmatched_sessions'], r['unmatched_lines'])})"
                    if r.get("unmatched_sessions") else ""))
    for tail in report["inputs"]["torn_tails"]:
        lines.append(f"  {'note: ' if tail['in_progress'] else ''}{tail['message']}")  # the message says ERROR
    if report["inputs"]["open_files"]:
        lines.append(f"  {len(report['inputs']['open_files'])} file(s) still open (.open): read as in progress")
    lines.append(f"  wrote {report['outputs'].get('dir')}: " + ", ".join(
        f"{k} {v}" for k, v in report["outputs"].items() if k != "dir"))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- html

def integer_bins(lo: int, hi: int, n: int = 30) -> list[tuple[int, int]]:
    """At most n bins of whole numbers covering lo..hi, log-spaced (lengths span orders of magnitude): each
    (first, last) inclusive, the next starting at last + 1, so bins never overlap and no two labels are alike."""
    base = max(lo, 1)  # 0 gets a bin of its own
    m = n - 1 if lo < base else n
    edges = {base, hi + 1, *(round(base * ((hi + 1) / base) ** (i / m)) for i in range(1, m))}
    if lo < base:
        edges.add(lo)
    cuts = sorted(e for e in edges if lo <= e <= hi + 1)
    return [(a, b - 1) for a, b in zip(cuts, cuts[1:])]


def _svg_histogram(values: list[int], title: str, xlabel: str, bins: int = 30) -> str:
    """Counts of whole numbers in `integer_bins`; each bar's title is its range and count."""
    w, h, pad = 640, 220, 40
    if not values:
        return f"<p>{html.escape(title)}: no data</p>"
    lo, hi = min(values), max(values)
    ranges = integer_bins(lo, hi, bins)
    starts = [a for a, _ in ranges]
    counts = [0] * len(ranges)
    for v in values:
        counts[bisect.bisect_right(starts, v) - 1] += 1
    top = max(counts)
    bw = (w - 2 * pad) / len(ranges)
    bars = []
    for i, ((a, b), n) in enumerate(zip(ranges, counts)):
        bh = (h - 2 * pad) * n / top if top else 0
        x = pad + i * bw
        label = f"{a}{'' if a == b else f'–{b}'}: {n}"
        bars.append(f'<rect x="{x:.1f}" y="{h - pad - bh:.1f}" width="{max(bw - 1, 1):.1f}" height="{bh:.1f}" '
                    f'fill="#4a7bd0"><title>{html.escape(label)}</title></rect>')
    return (f'<figure><figcaption>{html.escape(title)}</figcaption><svg xmlns="http://www.w3.org/2000/svg" '
            f'width="{w}" height="{h}" role="img">{"".join(bars)}'
            f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#333"/>'
            f'<text x="{pad}" y="{h - pad + 16}" font-size="11">{lo}</text>'
            f'<text x="{w - pad}" y="{h - pad + 16}" font-size="11" text-anchor="end">{hi}</text>'
            f'<text x="{w / 2}" y="{h - 6}" font-size="11" text-anchor="middle">{html.escape(xlabel)}</text>'
            f'<text x="{pad - 4}" y="{pad}" font-size="11" text-anchor="end">{top}</text></svg></figure>')


def _svg_value_histogram(values: list[float], title: str, xlabel: str, bins: int = 20) -> str:
    """Counts of real numbers in equal-width bins (one bin when every value is the same)."""
    w, h, pad = 480, 200, 36
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return f"<p>{html.escape(title)}: no data</p>"
    lo, hi = min(vals), max(vals)
    n = 1 if hi == lo else bins
    width = (hi - lo) / n if n > 1 else 1.0
    counts = [0] * n
    for v in vals:
        counts[min(n - 1, int((v - lo) / width)) if n > 1 else 0] += 1
    top, bw = max(counts), (w - 2 * pad) / n
    bars = []
    for i, c in enumerate(counts):
        a, b = lo + i * width, lo + (i + 1) * width
        label = f"{a:.3g}" if n == 1 else f"{a:.3g}–{b:.3g}"
        bh = (h - 2 * pad) * c / top
        bars.append(f'<rect x="{pad + i * bw:.1f}" y="{h - pad - bh:.1f}" width="{max(bw - 1, 1):.1f}" '
                    f'height="{bh:.1f}" fill="#4a7bd0"><title>{html.escape(label)}: {c}</title></rect>')
    return _figure(title, w, h, "".join(bars) + _axes(w, h, pad, f"{lo:.3g}", f"{hi:.3g}", xlabel, top))


def _axes(w: int, h: int, pad: int, lo: str, hi: str, xlabel: str, top: object) -> str:
    return (f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#333"/>'
            f'<text x="{pad}" y="{h - pad + 16}" font-size="11">{html.escape(lo)}</text>'
            f'<text x="{w - pad}" y="{h - pad + 16}" font-size="11" text-anchor="end">{html.escape(hi)}</text>'
            f'<text x="{w / 2}" y="{h - 6}" font-size="11" text-anchor="middle">{html.escape(xlabel)}</text>'
            f'<text x="{pad - 4}" y="{pad}" font-size="11" text-anchor="end">{top}</text>')


def _figure(title: str, w: int, h: int, body: str) -> str:
    return (f'<figure><figcaption>{html.escape(title)}</figcaption><svg xmlns="http://www.w3.org/2000/svg" '
            f'width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img">{body}</svg></figure>')


def _svg_hbars(items: list[tuple[str, int]], title: str, color: str = "#d07b4a") -> str:
    """One horizontal bar per (name, count), the count written at its end."""
    if not items:
        return f"<p>{html.escape(title)}: none</p>"
    w, row, left = 480, 22, 150
    top = max(v for _, v in items) or 1
    h = row * len(items) + 10
    bars = []
    for i, (name, v) in enumerate(items):
        bw = (w - left - 60) * v / top
        y = 5 + i * row
        bars.append(f'<text x="{left - 6}" y="{y + 15}" font-size="12" text-anchor="end">{html.escape(name)}</text>'
                    f'<rect x="{left}" y="{y + 3}" width="{max(bw, 1 if v else 0):.1f}" height="{row - 6}" '
                    f'fill="{color}"><title>{html.escape(name)}: {v}</title></rect>'
                    f'<text x="{left + bw + 4:.1f}" y="{y + 15}" font-size="12">{v:,}</text>')
    return _figure(title, w, h, "".join(bars))


def _table(rows: dict[str, dict], key: str, total: bool = False) -> str:
    """Rows under their key; total: a last row summing every column (the tables that add up to the totals)."""
    if not rows:
        return "<p>none</p>"
    cols = list(next(iter(rows.values())))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in [key, *cols])
    body = "".join("<tr><td>" + html.escape(k) + "</td>" + "".join(f"<td>{html.escape(str(v[c]))}</td>" for c in cols)
                   + "</tr>" for k, v in sorted(rows.items()))
    foot = ""
    if total:
        sums = [sum(v[c] for v in rows.values() if isinstance(v[c], (int, float))) for c in cols]
        foot = ('<tr class="total"><th scope="row">total</th>'
                + "".join(f'<td class="sum">{n}</td>' for n in sums) + "</tr>")
    return f"<table><tr>{head}</tr>{body}{foot}</table>"


# ---------------------------------------------------------------------------------------------------- overview

def _cards(report: dict) -> str:
    c, t = report["counts"], report["tokens"]
    ratio = report["merge_ratio"]
    flagged = sum(report["flags"].values())
    cards = [("sessions", f"{c['sessions']:,}"), ("calls", f"{c['calls']:,}"), ("sequences", f"{c['sequences']:,}"),
             ("merge ratio", f"{ratio:.2f}" if ratio is not None else "n/a"), ("tokens", f"{t['total']:,}"),
             ("trainable", f"{t['trainable'] / t['total']:.1%}" if t["total"] else "n/a"),
             ("breaks", f"{len(report['breaks']):,}"), ("flags set", f"{flagged:,}"),
             ("rewards joined", f"{report['rewards']['joined']:,}")]
    return '<div class="cards">' + "".join(f"<div class=\"card\"><b>{html.escape(v)}</b><span>{html.escape(k)}</span>"
                                           "</div>" for k, v in cards) + "</div>"


def _key_values(report: dict) -> str:
    c, t = report["counts"], report["tokens"]
    ratio = report["merge_ratio"]
    kv = {
        "mode": report["mode"], "records": report["inputs"]["records"], "files": report["inputs"]["files"],
        "calls": c["calls"], "calls without completion": c["calls_without_completion"],
        "sessions": c["sessions"], "calls without session": c["sessions_null"], "chains": c["chains"],
        "sequences": c["sequences"], "merge ratio": f"{ratio:.2f}" if ratio is not None else "n/a",
        "tokens (sequences)": t["total"], "trainable tokens": t["trainable"],
        "trainable share": f"{t['trainable'] / t['total']:.1%}" if t["total"] else "n/a",
        "tokens per_request would send": t["per_request_total"],
        "saved vs per_request": f"{1 - t['total'] / t['per_request_total']:.1%}" if t["per_request_total"] else "n/a",
        "rewards joined / missing / unmatched lines":
            f"{report['rewards']['joined']} / {report['rewards']['missing']} / {report['rewards']['unmatched_lines']}",
    }
    return "<table>" + "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>"
                               for k, v in kv.items()) + "</table>"


GROUPS_PLOTTED, GROUPS_LISTED = 40, 100


def group_stats(viewer) -> list[dict]:
    """Per reward group (the explorer's rows): sessions, rewards and advantages, in the driver's order."""
    if viewer is None:
        return []
    gi, ri, ai = (ROW_COLS.index(k) for k in ("group", "reward", "advantage"))
    by: dict[int, list] = {}
    for e in viewer.entries:
        if e.row[gi] >= 0:
            by.setdefault(e.row[gi], []).append(e.row)
    out = []
    for g, rows in by.items():
        rs = [r[ri] for r in rows if r[ri] is not None]
        advs = [r[ai] for r in rows if r[ai] is not None]
        mean = math.fsum(rs) / len(rs) if rs else None
        sigma = math.sqrt(math.fsum((r - mean) ** 2 for r in rs) / len(rs)) if rs else None
        out.append({"group": viewer.groups[g], "sessions": len(rows), "rewards": rs, "mean": mean, "sigma": sigma,
                    "adv_min": min(advs) if advs else None, "adv_max": max(advs) if advs else None})
    return out


def _svg_group_rewards(stats: list[dict]) -> str:
    """Each group's rewards as dots on a vertical range, its mean as a bar; the first GROUPS_PLOTTED groups."""
    shown = [s for s in stats if s["rewards"]][:GROUPS_PLOTTED]
    if not shown:
        return "<p>Reward per group: no rewards joined (pass --rewards FILE)</p>"
    w, h, pad = 720, 220, 40
    lo = min(min(s["rewards"]) for s in shown)
    hi = max(max(s["rewards"]) for s in shown)
    span = (hi - lo) or 1.0
    y = lambda r: h - pad - (h - 2 * pad) * (r - lo) / span  # noqa: E731
    step = (w - 2 * pad) / len(shown)
    parts = []
    for i, s in enumerate(shown):
        x = pad + (i + 0.5) * step
        rs = s["rewards"]
        tip = (f"{s['group']}: {len(rs)} rewarded, mean {s['mean']:.3g}, σ {s['sigma']:.3g}, advantage "
               f"{_fmt(s['adv_min'])}…{_fmt(s['adv_max'])}")
        dots = "".join(f'<circle cx="{x:.1f}" cy="{y(r):.1f}" r="3" fill="#4a7bd0" fill-opacity="0.6"/>' for r in rs)
        parts.append(f'<g><title>{html.escape(tip)}</title>'
                     f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y(min(rs)):.1f}" y2="{y(max(rs)):.1f}" stroke="#9aa3b5"/>'
                     f'{dots}<line x1="{x - step / 3:.1f}" x2="{x + step / 3:.1f}" y1="{y(s["mean"]):.1f}" '
                     f'y2="{y(s["mean"]):.1f}" stroke="#d0493f" stroke-width="2"/></g>')
    axes = _axes(w, h, pad, "", "", f"groups (first {len(shown)} of {len(stats)})", f"{hi:.3g}")
    axes += f'<text x="{pad - 4}" y="{h - pad}" font-size="11" text-anchor="end">{lo:.3g}</text>'
    return _figure("Reward per group (dots: sessions; red: mean)", w, h, "".join(parts) + axes)


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.3g}"


def _rewards_section(stats: list[dict]) -> str:
    if not stats:
        return "<h2>Rewards per group</h2><p>No reward groups (pass --rewards FILE with groups).</p>"
    flat = sum(1 for s in stats if s["sigma"] == 0)
    rows = "".join(f"<tr><td>{html.escape(s['group'])}</td><td>{s['sessions']}</td><td>{len(s['rewards'])}</td>"
                   f"<td>{_fmt(s['mean'])}</td><td>{_fmt(min(s['rewards'], default=None))}</td>"
                   f"<td>{_fmt(max(s['rewards'], default=None))}</td><td>{_fmt(s['sigma'])}</td>"
                   f"<td>{_fmt(s['adv_min'])}</td><td>{_fmt(s['adv_max'])}</td></tr>" for s in stats[:GROUPS_LISTED])
    more = f"<p>First {GROUPS_LISTED} of {len(stats)} groups; the Sessions view filters by group.</p>" \
        if len(stats) > GROUPS_LISTED else ""
    return ("<h2>Rewards per group</h2>"
            f"<p>{len(stats):,} groups; {flat:,} with σ = 0 (every advantage 0: no learning signal).</p>"
            + _svg_group_rewards(stats)
            + _svg_value_histogram([s["sigma"] for s in stats if s["sigma"] is not None],
                                   "Advantage spread: reward σ per group", "σ")
            + "<table><tr><th>group</th><th>sessions</th><th>rewarded</th><th>mean</th><th>min</th><th>max</th>"
              "<th>σ</th><th>advantage min</th><th>advantage max</th></tr>" + rows + "</table>" + more)


def _breaks_table(report: dict, limit: int = 200) -> str:
    breaks = report["breaks"][:limit]
    rows = "".join(
        f"<tr><td>{html.escape(str(b['session']))}</td><td>{html.escape(b['chain_id'])}</td>"
        f"<td>{html.escape(b['call_id'])}</td><td>{html.escape(b['cause'])}</td><td>{b['token_pos']}</td></tr>"
        for b in breaks)
    n = len(report["breaks"])
    return (f"<h2>Breaks ({n}{f', first {limit}' if n > limit else ''})</h2>"
            "<table><tr><th>session</th><th>chain_id</th><th>call_id</th><th>cause</th><th>token_pos</th></tr>"
            f"{rows}</table>")


def render_overview(report: dict, seq_lengths: list[int], viewer=None, trainer: str = "") -> str:
    """The overview: counts, plots and tables, as static HTML (every value escaped)."""
    tails = "".join(f"<li>{html.escape(x['message'])}</li>" for x in report["inputs"]["torn_tails"])
    ratios = [s["merge_ratio"] for s in report["sessions"]]
    return "".join([
        "<h2>Overview</h2>", _cards(report),
        "".join(f"<p class=\"notice\"><strong>warning:</strong> {html.escape(w)}</p>"
                for w in report.get("warnings", [])),
        _svg_value_histogram(ratios, f"Merge ratio per session (calls ÷ sequences; {len(ratios):,} sessions)",
                             "merge ratio"),
        _svg_histogram(seq_lengths, "Sequence lengths (tokens; log-spaced bins)", "n_tokens"),
        _svg_hbars(sorted(report["break_causes"].items(), key=lambda kv: -kv[1]), "Break causes (sequences)",
                   "#d0493f"),
        _svg_hbars([(k, v) for k, v in report["flags"].items()], "Flags (sequences)", "#d08b28"),
        _rewards_section(group_stats(viewer)),
        "<h2>Per protocol</h2>", _table(report["per_protocol"], "protocol", total=True),
        "<h2>Per model</h2>", _table(report["per_model"], "model_served", total=True),
        trainer,
        "<h2>Counts</h2>", _key_values(report),
        "<h2>Break causes</h2>", _table({k: {"count": v} for k, v in report["break_causes"].items()}, "cause"),
        "<h2>Flags</h2>", _table({k: {"sequences": v} for k, v in report["flags"].items()}, "flag"),
        "<h2>End-of-turn sets</h2>", _table({k: {"ids": v["ids"], "source": str(v["source"])}
                                             for k, v in report["eot"].items()}, "model"),
        _breaks_table(report),
        f"<h2>Inputs</h2><p>{report['inputs']['files']} files, {len(report['inputs']['open_files'])} open</p>",
        f"<ul>{tails}</ul>" if tails else "",
    ])


def render_html(report: dict, seq_lengths: list[int], viewer=None, verify: str | None = None,
                train: str | None = None, sequences_sha256: str | None = None) -> str:
    """The self-contained page: the overview, then the session explorer over `viewer` (a viewer.ViewerData), and
    the trainer's verify gaps / train curve when their files are given (`trainer_sections`)."""
    return page(render_overview(report, seq_lengths, viewer, trainer_sections(verify, train, sequences_sha256)),
                viewer)


# ---------------------------------------------------------------------------------------------------- trainer

def _read_verify(path: str) -> list[dict]:
    """verify.parquet (polar-verify: one row per sequence and weight version), or verify.json: a list of
    per-sequence rows or {"sequences": [...]}."""
    if path.endswith(".parquet"):
        import polars as pl  # only when a verify.parquet is there

        return pl.read_parquet(path).to_dicts()
    with open(path, "rb") as fh:
        doc = orjson.loads(fh.read())
    rows = doc.get("sequences") if isinstance(doc, dict) else doc
    if not isinstance(rows, list):
        raise ValueError("expected a list of sequences or {\"sequences\": [...]}")
    return [r for r in rows if isinstance(r, dict)]


def file_sha256(path: str) -> str:
    """The content hash polar-verify stamps on verify.parquet (`sequences_sha256`): sha256 of the file's bytes."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _stale(rows: list[dict], sequences_sha256: str | None) -> bool:
    """verify rows that checked another sequences.parquet than the one the report is about."""
    stamps = {r.get("sequences_sha256") for r in rows} - {None}
    return sequences_sha256 is not None and bool(stamps) and stamps != {sequences_sha256}


def _read_train(path: str) -> list[dict]:
    """train.jsonl: one JSON object per optimizer step (polar-train), blank lines skipped."""
    out = []
    with open(path, "rb") as fh:
        for line in fh:
            if line.strip():
                row = orjson.loads(line)
                if isinstance(row, dict):
                    out.append(row)
    return out


def _verify_section(rows: list[dict]) -> str:
    med = [r["median_abs_gap"] for r in rows if isinstance(r.get("median_abs_gap"), (int, float))]
    mx = [r["max_abs_gap"] for r in rows if isinstance(r.get("max_abs_gap"), (int, float))]
    within = [r["share_within"] for r in rows if isinstance(r.get("share_within"), (int, float))]
    checked = sum(r.get("n_checked", 0) for r in rows if isinstance(r.get("n_checked"), int))
    facts = (f"{len(rows):,} sequences, {checked:,} tokens checked; median |gap| (median over sequences) "
             f"{_fmt(sorted(med)[len(med) // 2] if med else None)}, largest |gap| {_fmt(max(mx, default=None))}, "
             f"mean share within tolerance {_fmt(math.fsum(within) / len(within) if within else None)}")
    return (f"<h2>Verify: recomputed vs recorded logprobs</h2><p>{html.escape(facts)}</p>"
            + _svg_value_histogram(med, "Median |logprob gap| per sequence", "nats")
            + _svg_value_histogram(mx, "Largest |logprob gap| per sequence", "nats"))


TRAIN_SERIES = ("reward_mean", "loss", "verify_median_abs_gap", "ratio_mean", "clip_share")


def _svg_curve(steps: list[float], values: list[float], title: str) -> str:
    w, h, pad = 320, 160, 36
    pts = [(s, v) for s, v in zip(steps, values) if isinstance(v, (int, float)) and math.isfinite(v)]
    if not pts:
        return ""
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    fx = lambda s: pad + (w - 2 * pad) * ((s - x0) / (x1 - x0) if x1 > x0 else 0.5)  # noqa: E731
    fy = lambda v: h - pad - (h - 2 * pad) * ((v - y0) / (y1 - y0) if y1 > y0 else 0.5)  # noqa: E731
    line = " ".join(f"{fx(s):.1f},{fy(v):.1f}" for s, v in pts)
    dots = "".join(f'<circle cx="{fx(s):.1f}" cy="{fy(v):.1f}" r="3" fill="#4a7bd0"><title>step {s:g}: {v:.4g}'
                   "</title></circle>" for s, v in pts)
    body = f'<polyline points="{line}" fill="none" stroke="#4a7bd0" stroke-width="1.5"/>{dots}'
    body += _axes(w, h, pad, f"{x0:g}", f"{x1:g}", "step", f"{y1:.3g}")
    body += f'<text x="{pad - 4}" y="{h - pad}" font-size="11" text-anchor="end">{y0:.3g}</text>'
    return _figure(title, w, h, body)


def _train_section(rows: list[dict]) -> str:
    steps = [r.get("step", i + 1) for i, r in enumerate(rows)]
    steps = [s if isinstance(s, (int, float)) else i + 1 for i, s in enumerate(steps)]
    curves = "".join(_svg_curve(steps, [r.get(k) for r in rows], k) for k in TRAIN_SERIES)
    return f"<h2>Training steps</h2><p>{len(rows):,} steps (train.jsonl)</p>" + (curves or "<p>no numeric series</p>")


def trainer_sections(verify: str | None, train: str | None, sequences_sha256: str | None = None) -> str:
    """The trainer's seam: OUT/verify.parquet or verify.json (per-sequence logprob gaps) and RUN/train.jsonl (one
    line per step), rendered when the paths are given and exist; an unreadable file is said, not fatal. Verify rows
    stamped with another `sequences_sha256` than the given one are stale: their section is dropped."""
    out = []
    for path, read, render in ((verify, _read_verify, _verify_section), (train, _read_train, _train_section)):
        if not path or not os.path.isfile(path):
            continue
        try:
            rows = read(path)
        except (OSError, ValueError) as exc:  # orjson.JSONDecodeError is a ValueError
            out.append(f"<p class=\"notice\">{html.escape(os.path.basename(path))}: unreadable ({html.escape(str(exc))})"
                       "</p>")
            continue
        if render is _verify_section and _stale(rows, sequences_sha256):
            continue
        out.append(f'<div id="{VERIFY_SECTION_ID}">{render(rows)}</div>{_VERIFY_END}' if render is _verify_section
                   else render(rows))
    return "".join(out)


VERIFY_SECTION_ID = "polar-verify"
_VERIFY_END = "<!--/polar-verify-->"
_OVERVIEW_OPEN = '<section id="view-overview" class="view">'


def with_verify_section(page_html: str, section: str) -> str:
    """report.html with its verify section replaced by `section` (trainer_sections' output; "" removes it), or
    inserted where render_overview puts the trainer's sections (before Counts) when the page had none. Every value
    in the overview is escaped, so neither marker can occur in it by accident."""
    start = page_html.find(f'<div id="{VERIFY_SECTION_ID}">')
    if start >= 0:
        end = page_html.index(_VERIFY_END, start) + len(_VERIFY_END)
        return page_html[:start] + section + page_html[end:]
    open_at = page_html.find(_OVERVIEW_OPEN)
    if open_at < 0:
        raise ValueError("report.html has no overview section")
    close = page_html.index("</section>", open_at)
    at = page_html.find("<h2>Counts</h2>", open_at, close)
    at = close if at < 0 else at
    return page_html[:at] + section + page_html[at:]
