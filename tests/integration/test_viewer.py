"""report.html in a real browser: Debian's chromium (/usr/bin/chromium) driven over the DevTools protocol by
Playwright's Python package (`executable_path`, `--no-sandbox`, no browser download). One browser for the module and
one page per report, reused: a processed synthetic dump with every defect and a hostile session, and a generated
5,000-session demo-shaped run (scripts/bench_report's generator).

1.x  the overview renders without a console error and says it holds conversation text
2.x  the session list: data-session on every listed row, filters, sorting and paging change what is shown
3.x  one session: data-sequence per sequence, calls on the time line, breaks, token strips; hostile text runs nothing
4.x  a screenshot of each view is neither blank nor cut off
5.x  the 5,000-session run stays in the size budget and opens
"""

from __future__ import annotations

import base64
import json
import os
import struct

import polars as pl
import pytest

from polar.processor.cli import main
from polar.processor.viewer import ROW_COLS
from tests.processor.test_report_viewer import HOSTILE, MARKER, hostile_dump
from tests.support.scripts import load_script

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    from tests.support.need import SYSTEM, need

    need(None if os.path.exists(CHROMIUM) else f"Debian's chromium is not at {CHROMIUM}", setup=SYSTEM)
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
    yield b
    b.close()
    pw.stop()


class Report:
    """One processed run, its report open in one page whose console errors are collected."""

    def __init__(self, browser, out, width: int = 1280):
        self.out = out
        self.path = os.path.join(out, "report.html")
        self.seqs = pl.read_parquet(os.path.join(out, "sequences.parquet"))
        self.calls = pl.read_parquet(os.path.join(out, "calls.parquet"))
        self.errors: list[str] = []
        self.page = browser.new_page(viewport={"width": width, "height": 900})
        self.page.on("console", lambda m: self.errors.append(f"{m.type}: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.goto("")

    def goto(self, hash_: str) -> None:
        self.page.goto(f"file://{os.path.abspath(self.path)}#{hash_}")
        self.page.wait_for_function("window.__polarRendered !== undefined")

    def show(self, hash_: str, selector: str) -> None:
        self.page.evaluate("h => { location.hash = h; }", hash_)
        self.page.wait_for_selector(selector)

    def listed(self) -> list[str]:
        return self.page.eval_on_selector_all("#view-sessions tr[data-session]",
                                              "rows => rows.map(r => r.getAttribute('data-session'))")

    def column(self, col: str) -> list[str]:
        return self.page.eval_on_selector_all(f"#view-sessions tbody td.{col}", "cells => cells.map(c => c.textContent)")

    def count(self) -> str:
        return self.page.text_content("#session-count")

    def open(self, session: str) -> None:
        """Open a listed session by clicking its row's link (the name compared as an attribute value, not a selector)."""
        self.page.evaluate("""name => [...document.querySelectorAll('#view-sessions tr[data-session]')]
            .find(r => r.getAttribute('data-session') === name).querySelector('a').click()""", session)
        self.page.wait_for_selector("#view-session [data-sequence]")


@pytest.fixture(scope="module")
def small(browser, tmp_path_factory, tokenizer_dir):
    tmp = tmp_path_factory.mktemp("viewer-small")
    dump = hostile_dump(tmp)
    assert main([dump["flows"], "-o", str(tmp / "out"), "-q", "--rewards", dump["rewards"],
                 "--vocab", tokenizer_dir]) == 0
    report = Report(browser, str(tmp / "out"))
    yield report
    report.page.close()


@pytest.fixture(scope="module")
def big(browser, tmp_path_factory, tokenizer_dir):
    tmp = tmp_path_factory.mktemp("viewer-5000")
    bench = load_script("scripts/bench_report", "bench_report")
    run = bench.demo_shaped(str(tmp), 5000, seed=1, tokenizer_dir=tokenizer_dir)
    assert main([run["flows"], "-o", str(tmp / "out"), "-q", "--rewards", run["rewards"],
                 "--vocab", tokenizer_dir]) == 0
    report = Report(browser, str(tmp / "out"))
    yield report
    report.page.close()


# ---------------------------------------------------------------------------------------------------- 1.x

def test_1_1_the_overview_renders_without_console_errors(small):
    small.goto("")
    assert small.page.is_visible("#view-overview") and not small.page.is_visible("#view-sessions")
    assert "contains conversation text" in small.page.text_content("#text-notice")
    assert small.page.locator("#view-overview svg").count() >= 5
    per_protocol = small.page.locator("#view-overview h2:text-is('Per protocol') + table tr.total td").first
    assert int(per_protocol.text_content()) == small.calls.height
    assert small.errors == []


# ---------------------------------------------------------------------------------------------------- 2.x

def test_2_1_every_listed_session_row_carries_data_session(small):
    small.show("#sessions", "#view-sessions tr[data-session]")
    listed = small.listed()
    sessions = {s if s is not None else "" for s in small.calls["session"].to_list()}
    assert sorted(listed) == sorted(sessions) and HOSTILE in listed and "" in listed
    assert small.count() == f"{len(sessions)} of {len(sessions)} sessions"
    assert small.errors == []


def test_2_4_each_flag_badge_explains_itself_on_hover_and_in_the_legend(small):
    """Issue 37: a chip's title and the legend say what its flag means and what to do about it."""
    small.show("#sessions", "#view-sessions tr[data-session]")
    flags = sorted({f for fs in small.seqs["flags"].to_list() for f in fs})
    assert "context_mismatch" in flags
    titles = small.page.eval_on_selector_all("#view-sessions tbody .chip", "cs => cs.map(c => c.title)")
    mismatch = [t for t in titles if t.startswith("context_mismatch: ")]
    assert mismatch and "exact mode" in mismatch[0], titles[:3]
    terms = small.page.eval_on_selector_all("#flag-legend dt", "ds => ds.map(d => d.textContent)")
    helps = small.page.eval_on_selector_all("#flag-legend dd", "ds => ds.map(d => d.textContent)")
    assert len(terms) == len(helps) >= len(flags) and all(len(h) > 20 for h in helps), list(zip(terms, helps))
    assert small.errors == []


def test_2_2_filters_change_what_is_shown(big):
    big.show("#sessions", "#view-sessions tr[data-session]")
    assert big.count() == "5,000 of 5,000 sessions" and len(big.listed()) == 50
    flagged = set(big.seqs.filter(pl.col("flags").list.contains("context_mismatch"))["session"].to_list())
    big.page.select_option("select[name=flag]", "context_mismatch")
    assert big.count() == f"{len(flagged)} of 5,000 sessions" and set(big.listed()) <= flagged
    big.page.select_option("select[name=flag]", "")
    broken = set(big.seqs.filter(pl.col("break_cause") == "model_changed")["session"].to_list())
    big.page.select_option("select[name=cause]", "model_changed")
    assert big.count() == f"{len(broken)} of 5,000 sessions" and set(big.listed()) <= broken
    big.page.select_option("select[name=cause]", "")
    big.page.select_option("select[name=protocol]", "openai_chat")
    assert big.count() == "1,250 of 5,000 sessions" and set(big.column("protocols")) == {"openai_chat"}
    big.page.fill("input[name=group]", "task-0007")
    assert set(big.column("group")) == {"task-0007"} and 0 < len(big.listed()) <= 1
    big.page.fill("input[name=group]", "")
    big.page.select_option("select[name=protocol]", "")
    big.page.fill("input[name=rmin]", "1")
    assert set(big.column("reward")) == {"1"} and "of 5,000" in big.count()
    big.page.fill("input[name=rmin]", "")
    assert big.count() == "5,000 of 5,000 sessions"
    assert big.errors == []


def test_2_3_paging_and_sorting_change_what_is_shown(big):
    big.show("#sessions", "#view-sessions tr[data-session]")
    first = big.listed()
    big.page.click("button[data-page=next]")
    second = big.listed()
    assert len(second) == 50 and not set(first) & set(second)
    assert big.page.text_content(".page-no").strip() == "page 2 of 100"
    assert "page=2" in big.page.evaluate("location.hash")
    big.page.click("#view-sessions th[data-col=tokens]")  # ascending, back to page 1
    big.page.click("#view-sessions th[data-col=tokens]")  # descending
    tokens = [int(t.replace(",", "")) for t in big.column("tokens")]
    assert tokens == sorted(tokens, reverse=True) and tokens[0] == big.seqs.group_by("session").agg(
        pl.col("n_tokens").sum())["n_tokens"].max()
    big.show("#sessions", "#view-sessions tr[data-session]")
    assert big.errors == []


# ---------------------------------------------------------------------------------------------------- 3.x

def test_3_1_one_session_shows_its_calls_chains_and_sequences(small):
    small.show("#sessions", "#view-sessions tr[data-session]")
    small.open("s1")
    page = small.page
    seqs = small.seqs.filter(pl.col("session") == "s1")
    calls = small.calls.filter(pl.col("session") == "s1")
    shown = page.eval_on_selector_all("#view-session [data-sequence]", "els => els.map(e => e.dataset.sequence)")
    assert sorted(shown) == sorted(seqs["sequence_id"].to_list())
    assert page.locator("#view-session svg.timeline g.call").count() == calls.height
    assert page.locator("#view-session svg.timeline g.call.err").count() == calls["error"].is_not_null().sum() > 0
    assert "prefix_diverged at token" in page.text_content("#view-session ol.chains")
    for row in seqs.iter_rows(named=True):  # every trainable token is in its strip, with its mask
        strip = page.locator(f"#view-session [data-sequence='{row['sequence_id']}'] .strip")
        assert strip.locator(".t.m1").count() == row["n_trainable"]
        assert strip.locator(".t").count() < row["n_tokens"] or row["n_tokens"] <= 2 * 64
    assert page.locator("#view-session .mark.brk").count() >= 1  # where the break happened
    assert small.errors == []


def test_3_2_a_hostile_session_name_and_message_run_no_script(small):
    small.show("#sessions", "#view-sessions tr[data-session]")
    small.open(HOSTILE)
    page = small.page
    page.eval_on_selector_all("#view-session details", "ds => ds.forEach(d => { d.open = true; })")
    assert page.text_content("#view-session h2.session-name") == HOSTILE
    assert page.get_attribute("#view-session h2.session-name", "data-session") == HOSTILE
    texts = page.eval_on_selector_all("#view-session .msg pre", "ps => ps.map(p => p.textContent)")
    assert any(HOSTILE in t and MARKER in t for t in texts)
    assert page.evaluate("window.__pwned") is None
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    assert page.evaluate("document.querySelectorAll('script').length") == page.evaluate(
        "document.querySelectorAll('script[type=\"application/json\"]').length + 1")  # only the page's own
    assert small.errors == []


# ---------------------------------------------------------------------------------------------------- 4.x

STATS_JS = """async b64 => {
  const img = new Image();
  img.src = "data:image/png;base64," + b64;
  await img.decode();
  const w = 200, h = Math.max(1, Math.round(img.height * w / img.width));
  const c = document.createElement("canvas");
  c.width = w; c.height = h;
  const ctx = c.getContext("2d");
  ctx.drawImage(img, 0, 0, w, h);
  const d = ctx.getImageData(0, 0, w, h).data;
  let s = 0, s2 = 0;
  for (let i = 0; i < d.length; i += 4) { const y = 0.3 * d[i] + 0.59 * d[i + 1] + 0.11 * d[i + 2]; s += y; s2 += y * y; }
  const n = d.length / 4, mean = s / n;
  return {sd: Math.sqrt(s2 / n - mean * mean)};
}"""


@pytest.mark.parametrize("view, hash_, ready", [
    ("overview", "#overview", "#view-overview svg"),
    ("sessions", "#sessions", "#view-sessions tr[data-session]"),
    ("session", "#session/0", "#view-session [data-sequence]"),
])
def test_4_1_a_screenshot_of_each_view_is_neither_blank_nor_cut_off(small, browser, tmp_path, view, hash_, ready):
    small.show(hash_, ready)
    page = small.page
    png = page.screenshot(full_page=True)
    (tmp_path / f"{view}.png").write_bytes(png)
    width, height = struct.unpack(">II", png[16:24])  # the PNG header's size
    doc = page.evaluate("""v => ({h: document.documentElement.scrollHeight, w: document.documentElement.scrollWidth,
        bottom: document.getElementById('view-' + v).getBoundingClientRect().bottom + scrollY,
        inner: Math.max(0, ...[...document.querySelectorAll('#view-' + v + ' .scroll')]
          .map(s => s.scrollWidth - s.clientWidth))})""", view)
    assert height >= doc["h"] >= doc["bottom"] and width >= doc["w"] == 1280  # the whole page, nothing beside it
    assert doc["inner"] <= 1  # no table scrolled out of sight at 1280 px
    blank = browser.new_page()
    try:
        stats = blank.evaluate(STATS_JS, base64.b64encode(png).decode())
    finally:
        blank.close()
    assert stats["sd"] > 8, f"{view} screenshot looks blank (luminance σ {stats['sd']:.1f})"
    assert small.errors == []


# ---------------------------------------------------------------------------------------------------- 5.x

def test_5_1_the_5000_session_run_stays_in_budget_and_opens(big):
    assert os.path.getsize(big.path) <= 50_000_000
    big.goto("")
    assert big.page.evaluate("typeof window.__polarRendered") == "number"
    idx = json.loads(big.page.text_content("#polar-index"))
    assert len(idx["rows"]) == 5000 and idx["strips"]["left_out"] == 0 and len(ROW_COLS) == len(idx["cols"])
    big.show("#sessions?page=100", "#view-sessions tr[data-session]")
    assert big.page.text_content(".page-no").strip() == "page 100 of 100"
    last = big.listed()[-1]
    big.open(last)
    assert big.page.locator("#view-session [data-sequence]").count() == big.seqs.filter(
        pl.col("session") == last).height
    assert big.errors == []
