"""wordfreq-cli: every test runs `python3 wordfreq.py` and fails on the start state's stub (exit 1, no output)."""

import subprocess
import sys

import pytest

TEXT = "the cat and the hat; The CAT sat.\nA cat, a hat, a cat: 2 cats\n"


@pytest.fixture
def wordfreq(app, tmp_path):
    def run(*args, stdin=""):
        return subprocess.run([sys.executable, str(app / "wordfreq.py"), *args], input=stdin, cwd=tmp_path,
                              capture_output=True, text=True, timeout=20)
    return run


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT)
    return path


def test_counts_one_file(wordfreq, text_file):
    done = wordfreq(str(text_file))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "3 cat", "2 a", "2 hat", "2 the", "1 2", "1 A", "1 CAT", "1 The", "1 and", "1 cats", "1 sat"]


def test_ignore_case(wordfreq, text_file):
    for flag in ("-i", "--ignore-case"):
        done = wordfreq(flag, str(text_file))
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[:4] == ["4 cat", "3 a", "3 the", "2 hat"]


def test_top(wordfreq, text_file):
    done = wordfreq("--top", "2", str(text_file))
    assert (done.returncode, done.stdout) == (0, "3 cat\n2 a\n")


def test_bad_top_exits_2(wordfreq, text_file):
    for value in ("0", "-3", "many"):
        done = wordfreq("--top", value, str(text_file))
        assert done.returncode == 2 and done.stdout == "" and done.stderr, value


def test_standard_input(wordfreq):
    assert wordfreq(stdin="b a b\n").stdout == "2 b\n1 a\n"
    assert wordfreq("-", stdin="x y y\n").stdout == "2 y\n1 x\n"


def test_several_files_count_together(wordfreq, tmp_path):
    (tmp_path / "one.txt").write_text("red green\n")
    (tmp_path / "two.txt").write_text("green blue-green\n")
    done = wordfreq("one.txt", "two.txt")
    assert done.stdout == "3 green\n1 blue\n1 red\n"


def test_unreadable_file_exits_1_naming_it(wordfreq, text_file):
    done = wordfreq(str(text_file), "missing.txt")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("wordfreq: missing.txt: ")


def test_no_words_prints_nothing(wordfreq):
    done = wordfreq(stdin="... !!! ---\n")
    assert (done.returncode, done.stdout) == (0, "")
