"""release-checksums: every test reads SHA256SUMS, which the start state lacks."""

import re

import pytest

# The release's files as the start state ships them (a changed file in release/ fails test_digests_...).
EXPECTED = {
    "release/README.txt": "5fd1873e403f0aab09b113a2d95d0f1e2f4a43bcf1055d71e15ac18ec9074ca7",
    "release/bin/polar-run": "fcd54b9257d85a9d51eec8cbb706d9abde9a48f5d51c12f59f7b8dd8d2bd8641",
    "release/data/empty.dat": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "release/docs/guide.md": "432de0b66e5c4c505c77a41e1cfa6f3422ecb060a7fc8a4bf55e4aa1ef2de096",
    "release/notes/release notes.txt": "19c7bd3d627eac4f91872b5ad08a55d78dd170963fb0c770ee17fa0081dff969",
}
LINE = re.compile(r"([0-9a-f]{64})  (\S.*)")


@pytest.fixture
def text(app):
    return (app / "SHA256SUMS").read_text(encoding="utf-8")


@pytest.fixture
def entries(text):
    return [LINE.fullmatch(line) for line in text.splitlines()]


def test_file_ends_with_a_newline(text):
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_every_line_has_the_sha256sum_format(text, entries):
    assert text.strip(), "SHA256SUMS is empty"
    assert all(entries), [line for line, m in zip(text.splitlines(), entries) if not m]


def test_lists_exactly_the_release_files(entries):
    paths = [m.group(2) for m in entries if m]
    assert sorted(set(paths)) == sorted(EXPECTED) and len(paths) == len(EXPECTED)


def test_digests_match_the_release_files(app, entries):
    import hashlib

    got = {m.group(2): m.group(1) for m in entries if m}
    assert got == EXPECTED
    on_disk = {path: hashlib.sha256((app / path).read_bytes()).hexdigest() for path in EXPECTED}
    assert on_disk == EXPECTED, "a file in release/ was changed"


def test_sorted_by_path_in_byte_order(entries):
    paths = [m.group(2).encode() for m in entries if m]
    assert paths and paths == sorted(paths)
