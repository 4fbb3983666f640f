from slugkit import safe_filename
from slugkit.filenames import split_extension


def test_extension_is_kept_and_lowered():
    assert safe_filename("Report: Q3/2024.PDF") == "report-q3-2024.pdf"


def test_no_extension():
    assert split_extension("Version 2.0 final") == ("Version 2.0 final", "")
    assert safe_filename("...") == "file"


def test_reserved_names():
    assert safe_filename("CON.txt") == "con-file.txt"


def test_length_includes_the_extension():
    assert len(safe_filename("a very long title " * 10 + ".txt", max_length=20)) <= 20
