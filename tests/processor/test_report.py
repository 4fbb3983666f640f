"""Scenarios for processor/report.py and processor/figures.py: report.json's tables and report.html's plots
(docs/merge-rules.md#outputs, issue 13 item 11)."""

import json
import re

import pytest

from polar.processor.cli import main
from polar.processor.figures import integer_bins, length_histogram
from tests.processor.synth import session_records, write_flows

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    recs = session_records("s1", ["turn", "turn", "side", "retry", "trunc", "turn", "compact", "turn", "error"],
                           seed=1)
    recs += session_records("s2", ["turn", "turn", "nolp"], seed=2) + session_records(None, ["turn", "side"], seed=4)
    write_flows(str(tmp / "flows"), recs, per_file=5)
    assert main([str(tmp / "flows"), "-o", str(tmp / "out"), "-q"]) == 0
    return json.loads((tmp / "out" / "report.json").read_text()), (tmp / "out" / "report.html").read_text()


@pytest.mark.parametrize("table", ["per_protocol", "per_model"])
def test_1_1_per_protocol_and_per_model_tables_add_up_to_the_totals(report, table):
    doc, page = report
    rows = doc[table].values()
    assert len(doc["per_protocol"]) > 1  # the synthetic calls use every protocol
    total = lambda col: sum(r[col] for r in rows)  # noqa: E731
    assert total("calls") == doc["counts"]["calls"]
    assert total("calls_without_completion") == doc["counts"]["calls_without_completion"]
    assert total("sequences") == doc["counts"]["sequences"] > 0
    assert total("trainable_tokens") == doc["tokens"]["trainable"] > 0
    assert total("prompt_tokens") + total("completion_tokens") == doc["tokens"]["records_total"]
    # report.html shows the same rows
    title = {"per_protocol": "Per protocol", "per_model": "Per model"}[table]
    section = page.split(f"<h2>{title}</h2>", 1)[1].split("<h2>", 1)[0]
    head = re.findall(r"<th>([^<]*)</th>", section)
    cells = [re.findall(r"<td>([^<]*)</td>", tr) for tr in section.split("<tr>")[2:]]
    assert sum(int(c[head.index("sequences")]) for c in cells) == doc["counts"]["sequences"]


@pytest.mark.parametrize("lengths", [[32, 33, 35, 40, 47, 50, 60, 64], [5, 5, 5], [0, 1, 2, 70_000],
                                     list(range(100, 4000, 37))], ids=["narrow", "one_value", "zero_and_wide", "wide"])
def test_1_2_length_histogram_bins_are_integer_non_overlapping_and_distinct(lengths):
    svg = length_histogram(lengths, "Sequence lengths", "n_tokens")
    labels = re.findall(r"<title>([^<]*)</title>", svg)
    assert len(labels) == len(set(labels)) <= 30
    ranges, counts = [], []
    for label in labels:
        m = re.fullmatch(r"(\d+)(?:–(\d+))?: (\d+)", label)
        assert m, label
        a, b = int(m[1]), int(m[2] or m[1])
        ranges.append((a, b))
        counts.append(int(m[3]))
    assert ranges[0][0] == min(lengths) and ranges[-1][1] == max(lengths)
    assert all(a <= b for a, b in ranges) and all(nxt[0] == prev[1] + 1 for prev, nxt in zip(ranges, ranges[1:]))
    assert sum(counts) == len(lengths)
    assert all(n == sum(a <= v <= b for v in lengths) for (a, b), n in zip(ranges, counts))


def test_1_3_integer_bins_are_log_spaced():
    bins = integer_bins(1, 100_000)
    widths = [b - a + 1 for a, b in bins]
    assert 25 <= len(bins) <= 30 and widths == sorted(widths) and widths[0] == 1 and widths[-1] > 10_000


# -- 2. the section hook: other packages add to the page by element id (issue 22) -------------------------------------

def _slot(page: str) -> str:
    start = page.index('<div id="polar-sections">')
    return page[start:page.index("<h2>Counts</h2>", start)]


def test_2_1_sections_render_into_the_slot_before_counts(report, tmp_path):
    from polar.processor.report import Section, render_html
    from polar.processor.report_doc import read_report

    doc, page = report
    assert _slot(page) == '<div id="polar-sections"></div>'  # no trainer file in OUT: an empty slot
    out = tmp_path / "report.json"
    out.write_text(json.dumps(doc))
    sections = [Section("my-tool", "Mine <&>", "<p>one</p><div><div>nested</div></div>"),
                Section("other", "Other", "<p>two</p>")]
    html = render_html(read_report(out), [], None, sections)
    slot = _slot(html)
    assert slot.index('<div id="my-tool"><h2>Mine &lt;&amp;&gt;</h2><p>one</p>') < slot.index('<div id="other">')
    assert slot.endswith("<p>two</p></div></div>")  # both sections inside the slot, which closes before Counts


def test_2_2_replace_section_replaces_by_id_or_adds_to_the_slot(report):
    from polar.processor.report import Section, remove_section, replace_section

    _, page = report
    first = Section("polar-verify", "Verify", "<div><p>old</p></div>")
    added = replace_section(page, first)
    assert added.count('<div id="polar-verify">') == 1 and "<p>old</p>" in _slot(added)
    again = replace_section(added, Section("polar-verify", "Verify", "<p>new</p>"))
    assert again.count('<div id="polar-verify">') == 1 and "<p>old</p>" not in again and "<p>new</p>" in _slot(again)
    assert replace_section(again, Section("polar-verify", "Verify", "<p>new</p>")) == again  # idempotent
    assert remove_section(again, "polar-verify") == page == remove_section(page, "polar-verify")
    with pytest.raises(ValueError, match="no sections slot"):
        replace_section(page.replace('<div id="polar-sections">', "<div>"), first)


@pytest.mark.parametrize("section_id,body", [("Bad Id", "<p>x</p>"), ("polar-sections", ""), ("ok", "<div><p>x</p>"),
                                             ("ok", "</div>")], ids=["id", "the_slot", "unclosed", "stray_close"])
def test_2_3_a_section_that_could_break_the_page_is_refused(section_id, body):
    from polar.processor.report import Section

    with pytest.raises(ValueError):
        Section(section_id, "title", body)
