"""report.json and a self-contained report.html (inline SVG, no CDN), plus the one-screen summary (DESIGN §3).

Counting is split from summing: `ReportPartial.of` counts one group wherever an engine runs it, and `ReportBuilder`
adds the groups' shares in the driver's order, so the report is the same for every engine and for groups an
incremental run carries over."""

from __future__ import annotations

import bisect
import html
from collections import Counter
from dataclasses import dataclass, field

from polar.processor.eot import occurring
from polar.processor.merge import FLAGS, GroupResult, Note
from polar.processor.normalize import Call

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


def _svg_bars(items: list[tuple[str, float]], title: str, ylabel: str) -> str:
    w, h, pad = 640, 220, 40
    if not items:
        return f"<p>{html.escape(title)}: no data</p>"
    top = max(v for _, v in items) or 1.0
    bw = (w - 2 * pad) / len(items)
    bars = []
    for i, (name, v) in enumerate(items):
        bh = (h - 2 * pad) * v / top
        bars.append(f'<rect x="{pad + i * bw:.2f}" y="{h - pad - bh:.1f}" width="{max(bw - 0.5, 0.5):.2f}" '
                    f'height="{bh:.1f}" fill="#d07b4a"><title>{html.escape(name)}: {v:.2f}</title></rect>')
    return (f'<figure><figcaption>{html.escape(title)}</figcaption><svg xmlns="http://www.w3.org/2000/svg" '
            f'width="{w}" height="{h}" role="img">{"".join(bars)}'
            f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#333"/>'
            f'<text x="{pad - 4}" y="{pad}" font-size="11" text-anchor="end">{top:.1f}</text>'
            f'<text x="{w / 2}" y="{h - 6}" font-size="11" text-anchor="middle">{html.escape(ylabel)}</text>'
            f'</svg></figure>')


def _table(rows: dict[str, dict], key: str) -> str:
    if not rows:
        return "<p>none</p>"
    cols = list(next(iter(rows.values())))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in [key, *cols])
    body = "".join("<tr><td>" + html.escape(k) + "</td>" + "".join(f"<td>{v[c]}</td>" for c in cols) + "</tr>"
                   for k, v in sorted(rows.items()))
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(report: dict, seq_lengths: list[int]) -> str:
    """A page a person opens in a browser: counts, ratios, tables, plots, breaks. No external resources."""
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
    sessions = report["sessions"]
    shown = sorted(sessions, key=lambda s: -s["merge_ratio"])[:400]
    breaks = report["breaks"][:500]
    break_rows = "".join(
        f"<tr><td>{html.escape(str(b['session']))}</td><td>{html.escape(b['chain_id'])}</td>"
        f"<td>{html.escape(b['call_id'])}</td><td>{html.escape(b['cause'])}</td><td>{b['token_pos']}</td></tr>"
        for b in breaks)
    tails = "".join(f"<li>{html.escape(x['message'])}</li>" for x in report["inputs"]["torn_tails"])
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>polar-process report</title><style>",
        "body{font:14px system-ui,sans-serif;margin:2em;max-width:72em}table{border-collapse:collapse;margin:.5em 0}",
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}th{background:#eee}td:first-child{text-align:left}",
        "figure{display:inline-block;margin:1em}figcaption{font-weight:600}</style></head><body>",
        "<h1>polar-process report</h1>",
        "".join(f"<p><strong>warning:</strong> {html.escape(w)}</p>" for w in report.get("warnings", [])),
        "<table>",
        "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>" for k, v in kv.items()),
        "</table>",
        _svg_histogram(seq_lengths, "Sequence lengths (tokens; log-spaced bins)", "n_tokens"),
        _svg_bars([(s["session"], s["merge_ratio"]) for s in shown],
                  f"Merge ratio per session (calls ÷ sequences; {len(shown)} of {len(sessions)}, highest first)",
                  "sessions"),
        "<h2>Break causes</h2>", _table({k: {"count": v} for k, v in report["break_causes"].items()}, "cause"),
        "<h2>Flags</h2>", _table({k: {"sequences": v} for k, v in report["flags"].items()}, "flag"),
        "<h2>Per protocol</h2>", _table(report["per_protocol"], "protocol"),
        "<h2>Per model</h2>", _table(report["per_model"], "model_served"),
        "<h2>End-of-turn sets</h2>", _table({k: {"ids": v["ids"], "source": html.escape(str(v["source"]))}
                                             for k, v in report["eot"].items()}, "model"),
        f"<h2>Breaks ({len(report['breaks'])}{', first 500' if len(report['breaks']) > 500 else ''})</h2>",
        "<table><tr><th>session</th><th>chain_id</th><th>call_id</th><th>cause</th><th>token_pos</th></tr>",
        break_rows, "</table>",
        f"<h2>Inputs</h2><p>{report['inputs']['files']} files, {len(report['inputs']['open_files'])} open</p>",
        f"<ul>{tails}</ul>" if tails else "",
        "</body></html>",
    ]
    return "".join(parts)
