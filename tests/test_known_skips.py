"""tests/known-skips.txt and its check (tests/support/known_skips.py, issue 42), without running the suite:

1.x  the file: every entry parses, names a test file that exists, and a test defined in it; malformed lines are one
     error naming the line
2.x  the check, on made-up outcomes: a skip without an entry, a listed skip whose condition does not hold, a listed
     test that ran although its condition holds — one line each; a listed skip whose condition holds, a test that ran
     with its condition false, and need()'s skip off CI are no problem
3    a need() skip off CI carries the mark the hook leaves to need(); pytest.skip's does not
"""

from __future__ import annotations

import re

import pytest

from tests.support import known_skips as ks
from tests.support.known_skips import NOT_INSTALLED, RAN, SKIPPED, Entry

pytestmark = pytest.mark.unit

ENTRIES = ks.parse("""
# a comment, then an empty line

tests/a.py::test_captures | path-absent:captures | no captures
tests/a.py::test_each[*] | path-absent:captures | no captures: an empty parameter set
tests/b.py::test_opt_in | env-not:POLAR_TEST_X=1 | opt-in
""")


def test_1_1_every_entry_names_a_test_defined_in_an_existing_file():
    entries = ks.load()
    assert entries, "tests/known-skips.txt lists nothing"
    for e in entries:
        path, _, name = e.test.partition("::")
        source = ks.ROOT / path
        assert source.is_file(), f"tests/known-skips.txt:{e.line}: {path} does not exist"
        func = re.split(r"[\[*]", name, maxsplit=1)[0].rsplit("::", 1)[-1]
        assert re.search(rf"^\s*(async )?def {re.escape(func)}\b", source.read_text(), re.MULTILINE), \
            f"tests/known-skips.txt:{e.line}: {path} defines no {func}"


@pytest.mark.parametrize("line, error", [
    ("tests/a.py::test_a | path-absent:x", r":1: expected TEST-ID \| CONDITION \| REASON"),
    ("tests/a.py::test_a | absent:x | why", r":1: unknown condition 'absent:x'"),
    ("tests/a.py::test_a | path-absent: | why", r":1: unknown condition 'path-absent:'"),
    ("tests/a.py::test_a | env-not:POLAR_X | why", r":1: expected env-not:NAME=VALUE"),
    ("tests/a.py::test_a |  | why", r":1: expected TEST-ID"),
])
def test_1_2_a_malformed_line_is_one_error_naming_it(line, error):
    with pytest.raises(ValueError, match=error):
        ks.parse(line)


def test_1_3_a_star_stands_for_any_text_and_brackets_are_plain():
    each = ENTRIES[1]
    assert each.matches("tests/a.py::test_each[x.json]") and each.matches("tests/a.py::test_each[]")
    assert not each.matches("tests/a.py::test_each") and not each.matches("tests/a.py::test_eachX")
    assert Entry("tests/a.py::t[ab]", "path-absent:x", "why", 1).matches("tests/a.py::t[ab]")
    assert not Entry("tests/a.py::t[ab]", "path-absent:x", "why", 1).matches("tests/a.py::ta")


def _check(outcomes, root, env=None):
    return ks.check(ENTRIES, outcomes, env or {}, root)


def test_2_1_a_skip_without_an_entry_fails(tmp_path):
    assert _check({"tests/c.py::test_new": (SKIPPED, "not today")}, tmp_path) == [
        "tests/c.py::test_new skipped (not today) but tests/known-skips.txt has no entry for it"]


def test_2_2_a_listed_skip_whose_condition_does_not_hold_fails(tmp_path):
    (tmp_path / "captures").mkdir()
    assert _check({"tests/a.py::test_each[x]": (SKIPPED, "boom")}, tmp_path) == [
        "tests/a.py::test_each[x] skipped (boom) but its condition path-absent:captures does not hold "
        "(tests/known-skips.txt:5)"]
    assert _check({"tests/b.py::test_opt_in": (SKIPPED, "opt-in")}, tmp_path, env={"POLAR_TEST_X": "1"}) == [
        "tests/b.py::test_opt_in skipped (opt-in) but its condition env-not:POLAR_TEST_X=1 does not hold "
        "(tests/known-skips.txt:6)"]


def test_2_3_a_listed_test_that_ran_although_its_condition_holds_fails(tmp_path):
    assert _check({"tests/b.py::test_opt_in": (RAN, "")}, tmp_path) == [
        "tests/b.py::test_opt_in ran although its condition env-not:POLAR_TEST_X=1 holds (tests/known-skips.txt:6): "
        "a stale entry, or a skip that is gone"]


def test_2_4_what_the_list_allows_is_no_problem(tmp_path):
    assert _check({
        "tests/a.py::test_captures": (SKIPPED, "no captures"),  # listed, and its condition holds
        "tests/a.py::test_each[x]": (SKIPPED, "empty parameter set"),
        "tests/b.py::test_opt_in": (SKIPPED, "opt-in"),
        "tests/c.py::test_plain": (RAN, ""),  # not listed, ran
        "tests/c.py::test_bwrap": (NOT_INSTALLED, "bwrap is not on PATH"),  # need()'s skip off CI
    }, tmp_path) == []
    (tmp_path / "captures").mkdir()
    assert _check({"tests/a.py::test_captures": (RAN, ""), "tests/b.py::test_opt_in": (RAN, "")}, tmp_path,
                  env={"POLAR_TEST_X": "1"}) == []  # conditions false: they run


def test_3_need_marks_its_skip_and_pytest_skip_is_unmarked(monkeypatch):
    from tests.support.need import need, not_installed

    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as need_skip:
        need("no bwrap")
    with pytest.raises(pytest.skip.Exception) as plain_skip:
        pytest.skip("an opt-in")
    assert not_installed(need_skip.value) and not not_installed(plain_skip.value)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        need("no bwrap")
