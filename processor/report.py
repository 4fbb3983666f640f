"""report.html and the one-screen summary, from report.json's document (report_doc.Report)
(docs/merge-rules.md#outputs).

report.html is the overview rendered here as static HTML (every value escaped) inside the page viewer.py builds
around it: the session explorer, its embedded data and script. The figures are processor/figures.py's.

Other packages add to the page through its public section hook: a `Section` (an element id, a title, its HTML) is
rendered into the overview's sections slot by `render_html(..., sections=[...])`, and `replace_section` puts one
into a page already written, replacing the element with the same id or adding it to the slot. polar-verify adds its
section that way (trainer/verify.py); polar-process renders the trainer's files OUT holds the same way
(trainer_files.py)."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from polar.processor import figures
from polar.processor.report_doc import Report
from polar.processor.viewer import ROW_COLS, page

__all__ = ["SECTIONS_ID", "Section", "group_stats", "named_sessions", "remove_section", "render_html",
           "render_overview", "replace_section", "summary"]

SECTIONS_ID = "polar-sections"  # the overview's slot for the sections other packages add
_SECTION_ID = re.compile(r"[a-z][a-z0-9-]*\Z")
_DIV = re.compile(r"<div\b|</div>")


# ---------------------------------------------------------------------------------------------------- sections

def _element_end(page_html: str, start: int) -> int:
    """Where the <div> opened at `start` closes (the index after its </div>). Every value in the overview is
    escaped, so the only tags are the page's own."""
    depth = 0
    for m in _DIV.finditer(page_html, start):
        depth += 1 if m.group() == "<div" else -1
        if depth == 0:
            return m.end()
    raise ValueError("report.html: a section's <div> is never closed")


@dataclass(frozen=True)
class Section:
    """A part of the overview that another package adds. `id`: its element's id, stable across rewrites
    (lower-case letters, digits and dashes); `title`: its heading (escaped here); `html`: its body, whose values the
    caller has escaped and whose <div>s all close."""

    id: str
    title: str
    html: str

    def __post_init__(self):
        if not _SECTION_ID.match(self.id) or self.id == SECTIONS_ID:
            raise ValueError(f"section id {self.id!r}: lower-case letters, digits and dashes, not {SECTIONS_ID!r}")
        tags = _DIV.findall(self.html)
        if tags.count("<div") != tags.count("</div>"):
            raise ValueError(f"section {self.id!r}: its html must close every <div> it opens")

    def render(self) -> str:
        return f'<div id="{self.id}"><h2>{html.escape(self.title)}</h2>{self.html}</div>'


def _slot(sections: Iterable[Section]) -> str:
    return f'<div id="{SECTIONS_ID}">' + "".join(s.render() for s in sections) + "</div>"


def replace_section(page_html: str, section: Section) -> str:
    """report.html with the element whose id is `section.id` replaced by `section`, or `section` added at the end
    of the sections slot when the page has none. Raises ValueError for a page without a slot (written by a
    polar-process before the hook: process OUT again)."""
    start = page_html.find(f'<div id="{section.id}">')
    if start >= 0:
        return page_html[:start] + section.render() + page_html[_element_end(page_html, start):]
    slot = page_html.find(f'<div id="{SECTIONS_ID}">')
    if slot < 0:
        raise ValueError("report.html has no sections slot (written by an older polar-process: run it again)")
    at = _element_end(page_html, slot) - len("</div>")
    return page_html[:at] + section.render() + page_html[at:]


def remove_section(page_html: str, section_id: str) -> str:
    """report.html without the element whose id is `section_id` (unchanged when there is none)."""
    start = page_html.find(f'<div id="{section_id}">')
    return page_html if start < 0 else page_html[:start] + page_html[_element_end(page_html, start):]


# ---------------------------------------------------------------------------------------------------- summary

def named_sessions(names: list[str], total: int) -> str:
    """A bounded list of session ids: `a, b, c` or `a, b, c … (12 in all)`."""
    text = ", ".join(map(repr, names))
    return text + (f" … ({total} in all)" if total > len(names) else "")


def summary(report: Report) -> str:
    """The one-screen summary printed at the end of a run."""
    c, t, i, r = report.counts, report.tokens, report.inputs, report.rewards
    lines = [
        f"polar-process {report.mode}: {i.records} records in {i.files} files ({i.bytes / 1e6:.1f} MB) in "
        f"{report.seconds:.2f} s"
        + (f", {report.tokens_per_second / 1e6:.1f} M tokens/s" if report.tokens_per_second else ""),
        f"  calls {c.calls} (without completion {c.calls_without_completion}, no session {c.sessions_null}), "
        f"sessions {c.sessions}, chains {c.chains}, sequences {c.sequences}",
        f"  merge ratio {report.merge_ratio:.2f}" if report.merge_ratio is not None
        else "  merge ratio n/a (no sequences)",
        f"  tokens {t.total} (trainable {t.trainable}); per_request would send {t.per_request_total}",
    ]
    if report.break_causes:
        lines.append("  breaks: " + ", ".join(f"{k} {v}" for k, v in sorted(report.break_causes.items())))
    flags = {k: v for k, v in report.flags.items() if v}
    if flags:
        lines.append("  flags: " + ", ".join(f"{k} {v}" for k, v in flags.items()))
    lines.append(f"  rewards: joined {r.joined}, missing {r.missing}, unmatched lines {r.unmatched_lines}"
                 + (f" ({named_sessions(r.unmatched_sessions, r.unmatched_lines)})" if r.unmatched_sessions else ""))
    for tail in i.torn_tails:
        lines.append(f"  {'note: ' if tail.in_progress else ''}{tail.message}")  # the message says ERROR
    if i.open_files:
        lines.append(f"  {len(i.open_files)} file(s) still open (.open): read as in progress")
    lines.append(f"  wrote {report.outputs.get('dir')}: " + ", ".join(
        f"{k} {v}" for k, v in report.outputs.items() if k != "dir"))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- tables

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


def _cards(report: Report) -> str:
    c, t = report.counts, report.tokens
    ratio = report.merge_ratio
    cards = [("sessions", f"{c.sessions:,}"), ("calls", f"{c.calls:,}"), ("sequences", f"{c.sequences:,}"),
             ("merge ratio", f"{ratio:.2f}" if ratio is not None else "n/a"), ("tokens", f"{t.total:,}"),
             ("trainable", f"{t.trainable / t.total:.1%}" if t.total else "n/a"),
             ("breaks", f"{len(report.breaks):,}"), ("flags set", f"{sum(report.flags.values()):,}"),
             ("rewards joined", f"{report.rewards.joined:,}")]
    return '<div class="cards">' + "".join(f"<div class=\"card\"><b>{html.escape(v)}</b><span>{html.escape(k)}</span>"
                                           "</div>" for k, v in cards) + "</div>"


def _key_values(report: Report) -> str:
    c, t, r = report.counts, report.tokens, report.rewards
    ratio = report.merge_ratio
    kv = {
        "mode": report.mode, "records": report.inputs.records, "files": report.inputs.files,
        "calls": c.calls, "calls without completion": c.calls_without_completion,
        "sessions": c.sessions, "calls without session": c.sessions_null, "chains": c.chains,
        "sequences": c.sequences, "merge ratio": f"{ratio:.2f}" if ratio is not None else "n/a",
        "tokens (sequences)": t.total, "trainable tokens": t.trainable,
        "trainable share": f"{t.trainable / t.total:.1%}" if t.total else "n/a",
        "tokens per_request would send": t.per_request_total,
        "saved vs per_request": f"{1 - t.total / t.per_request_total:.1%}" if t.per_request_total else "n/a",
        "rewards joined / missing / unmatched lines": f"{r.joined} / {r.missing} / {r.unmatched_lines}",
    }
    return "<table>" + "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>"
                               for k, v in kv.items()) + "</table>"


def _breaks_table(report: Report, limit: int = 200) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(str(b.session))}</td><td>{html.escape(b.chain_id)}</td>"
        f"<td>{html.escape(b.call_id)}</td><td>{html.escape(b.cause)}</td><td>{b.token_pos}</td></tr>"
        for b in report.breaks[:limit])
    n = len(report.breaks)
    return (f"<h2>Breaks ({n}{f', first {limit}' if n > limit else ''})</h2>"
            "<table><tr><th>session</th><th>chain_id</th><th>call_id</th><th>cause</th><th>token_pos</th></tr>"
            f"{rows}</table>")


# ---------------------------------------------------------------------------------------------------- rewards

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


def _group_rewards(stats: list[dict]) -> str:
    """Each group's rewards as dots on a vertical range, its mean as a bar; the first GROUPS_PLOTTED groups."""
    shown = [s for s in stats if s["rewards"]][:GROUPS_PLOTTED]
    if not shown:
        return "<p>Reward per group: no rewards joined (pass --rewards FILE)</p>"
    fmt = figures.fmt
    columns = [(f"{s['group']}: {len(s['rewards'])} rewarded, mean {s['mean']:.3g}, σ {s['sigma']:.3g}, advantage "
                f"{fmt(s['adv_min'])}…{fmt(s['adv_max'])}", s["rewards"], s["mean"]) for s in shown]
    return figures.dot_columns(columns, "Reward per group (dots: sessions; red: mean)",
                               f"groups (first {len(shown)} of {len(stats)})")


def _rewards_section(stats: list[dict]) -> str:
    if not stats:
        return "<h2>Rewards per group</h2><p>No reward groups (pass --rewards FILE with groups).</p>"
    fmt = figures.fmt
    flat = sum(1 for s in stats if s["sigma"] == 0)
    rows = "".join(f"<tr><td>{html.escape(s['group'])}</td><td>{s['sessions']}</td><td>{len(s['rewards'])}</td>"
                   f"<td>{fmt(s['mean'])}</td><td>{fmt(min(s['rewards'], default=None))}</td>"
                   f"<td>{fmt(max(s['rewards'], default=None))}</td><td>{fmt(s['sigma'])}</td>"
                   f"<td>{fmt(s['adv_min'])}</td><td>{fmt(s['adv_max'])}</td></tr>" for s in stats[:GROUPS_LISTED])
    more = f"<p>First {GROUPS_LISTED} of {len(stats)} groups; the Sessions view filters by group.</p>" \
        if len(stats) > GROUPS_LISTED else ""
    return ("<h2>Rewards per group</h2>"
            f"<p>{len(stats):,} groups; {flat:,} with σ = 0 (every advantage 0: no learning signal).</p>"
            + _group_rewards(stats)
            + figures.value_histogram([s["sigma"] for s in stats if s["sigma"] is not None],
                                      "Advantage spread: reward σ per group", "σ")
            + "<table><tr><th>group</th><th>sessions</th><th>rewarded</th><th>mean</th><th>min</th><th>max</th>"
              "<th>σ</th><th>advantage min</th><th>advantage max</th></tr>" + rows + "</table>" + more)


# ---------------------------------------------------------------------------------------------------- the page

def render_overview(report: Report, seq_lengths: list[int], viewer=None, sections: Iterable[Section] = ()) -> str:
    """The overview: counts, plots and tables, as static HTML (every value escaped); the sections slot after the
    per-model table."""
    tails = "".join(f"<li>{html.escape(x.message)}</li>" for x in report.inputs.torn_tails)
    ratios = [s.merge_ratio for s in report.sessions]
    return "".join([
        "<h2>Overview</h2>", _cards(report),
        "".join(f"<p class=\"notice\"><strong>warning:</strong> {html.escape(w)}</p>" for w in report.warnings),
        figures.value_histogram(ratios, f"Merge ratio per session (calls ÷ sequences; {len(ratios):,} sessions)",
                                "merge ratio"),
        figures.length_histogram(seq_lengths, "Sequence lengths (tokens; log-spaced bins)", "n_tokens"),
        figures.hbars(sorted(report.break_causes.items(), key=lambda kv: -kv[1]), "Break causes (sequences)",
                      figures.RED),
        figures.hbars(list(report.flags.items()), "Flags (sequences)", "#d08b28"),
        _rewards_section(group_stats(viewer)),
        "<h2>Per protocol</h2>", _table(report.per_protocol, "protocol", total=True),
        "<h2>Per model</h2>", _table(report.per_model, "model_served", total=True),
        "<h2>Per replica</h2>", _table(report.per_replica, "replica", total=True),
        _slot(sections),
        "<h2>Counts</h2>", _key_values(report),
        "<h2>Break causes</h2>", _table({k: {"count": v} for k, v in report.break_causes.items()}, "cause"),
        "<h2>Flags</h2>", _table({k: {"sequences": v} for k, v in report.flags.items()}, "flag"),
        "<h2>End-of-turn sets</h2>", _table({k: {"ids": v["ids"], "source": str(v["source"])}
                                             for k, v in report.eot.items()}, "model"),
        _breaks_table(report),
        f"<h2>Inputs</h2><p>{report.inputs.files} files, {len(report.inputs.open_files)} open</p>",
        f"<ul>{tails}</ul>" if tails else "",
    ])


def render_html(report: Report, seq_lengths: list[int], viewer=None, sections: Iterable[Section] = ()) -> str:
    """The self-contained page: the overview with `sections` in its slot, then the session explorer over `viewer`
    (a viewer.ViewerData)."""
    return page(render_overview(report, seq_lengths, viewer, sections), viewer)
