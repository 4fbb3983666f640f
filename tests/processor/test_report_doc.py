"""Scenarios for processor/report_doc.py: report.json as a typed contract (docs/merge-rules.md#outputs,
docs/contracts.md).

1.x  what polar-process writes reads back whole: the same keys, in the same order, the same bytes; typed fields
2.x  the reader refuses what is not a report, and keeps the keys it does not know
3.x  add_verify: polar-verify's key, every other one left as it was
"""

from __future__ import annotations

import json

import orjson
import pytest

from polar.processor.cli import main
from polar.processor.report_doc import (Counts, Event, Report, ReportError, SessionRatio, add_verify, read_report,
                                        write_report_json)
from tests.processor.test_report_viewer import hostile_dump

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def outs(tmp_path_factory):
    """Two OUTs of one dump: a plain run, and one with --session-prefix (its optional counts)."""
    tmp = tmp_path_factory.mktemp("report_doc")
    dump = hostile_dump(tmp)
    base = [dump["flows"], "-q", "--rewards", dump["rewards"]]
    assert main([*base, "-o", str(tmp / "plain")]) == 0
    assert main([*base, "-o", str(tmp / "prefix"), "--session-prefix", "s"]) == 0
    return {"plain": tmp / "plain", "prefix": tmp / "prefix"}


@pytest.mark.parametrize("which", ["plain", "prefix"])
def test_1_1_the_report_polar_process_wrote_reads_back_whole(outs, which, tmp_path):
    path = outs[which] / "report.json"
    doc = json.loads(path.read_text())
    report = read_report(path)
    assert report.to_json() == doc and list(report.to_json()) == list(doc)  # every key, in the same order
    assert list(report.to_json()["counts"]) == list(doc["counts"])
    write_report_json(tmp_path / "again.json", report)
    assert (tmp_path / "again.json").read_bytes() == path.read_bytes()
    assert ("sessions_other_prefix" in doc["counts"]) == (which == "prefix")


def test_1_2_fields_are_typed_records(outs):
    doc = json.loads((outs["plain"] / "report.json").read_text())
    report = read_report(outs["plain"] / "report.json")
    assert isinstance(report.counts, Counts) and report.counts.calls == doc["counts"]["calls"] > 0
    assert report.counts.sessions_other_prefix is None
    assert report.breaks and all(isinstance(b, Event) for b in report.breaks)
    assert [b.cause for b in report.breaks] == [b["cause"] for b in doc["breaks"]]
    assert all(isinstance(s, SessionRatio) for s in report.sessions) and len(report.sessions) == len(doc["sessions"])
    assert report.tokens.trainable == doc["tokens"]["trainable"] and report.merge_ratio == doc["merge_ratio"]
    assert report.engine == doc["engine"] and report.verify is None
    prefixed = read_report(outs["prefix"] / "report.json")
    assert prefixed.counts.sessions_other_prefix == 2  # the hostile session and the null-session group


@pytest.mark.parametrize("change,says", [
    (lambda d: d.pop("counts"), "no 'counts'"),
    (lambda d: d["counts"].pop("calls"), "report.json.counts: no 'calls'"),
    (lambda d: d.update(version=2), "version 2"),
    (lambda d: d.update(breaks=[1]), "report.json.breaks[0]: expected an object"),
], ids=["no_counts", "no_calls", "version", "bad_break"])
def test_2_1_what_is_not_a_report_is_refused_with_one_line(outs, change, says):
    doc = json.loads((outs["plain"] / "report.json").read_text())
    change(doc)
    with pytest.raises(ReportError, match=says.replace("[", r"\[").replace("]", r"\]")):
        Report.from_json(doc)


def test_2_2_keys_this_version_does_not_know_are_kept(outs, tmp_path):
    doc = json.loads((outs["plain"] / "report.json").read_text())
    doc["newer_tool"] = {"x": 1}
    report = Report.from_json(doc)
    assert report.extra == {"newer_tool": {"x": 1}} and report.to_json() == doc
    (tmp_path / "report.json").write_text("{not json")
    with pytest.raises(ReportError, match="not JSON"):
        read_report(tmp_path / "report.json")


def test_3_1_add_verify_sets_verify_and_leaves_every_other_key(outs, tmp_path):
    path = tmp_path / "report.json"
    path.write_bytes((outs["plain"] / "report.json").read_bytes())
    before = orjson.loads(path.read_bytes())
    summary = {"median_abs_gap": 0.001, "within_bounds": True, "tokens": {"checked": 12}}
    add_verify(path, summary)
    after = orjson.loads(path.read_bytes())
    assert after == {**before, "verify": summary} and list(after)[-1] == "verify"
    assert read_report(path).verify == summary
    add_verify(path, {"median_abs_gap": 0.5})  # a second run replaces it
    assert read_report(path).verify == {"median_abs_gap": 0.5}
    other = tmp_path / "other.json"
    other.write_text('{"a": 1}')
    with pytest.raises(ReportError):
        add_verify(other, summary)
    assert other.read_text() == '{"a": 1}'  # not a report: left alone
