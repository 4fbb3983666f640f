import pytest

from slugkit import slugify


def test_explicit_separator():
    assert slugify("Hello, World!", separator="-") == "hello-world"
    assert slugify("Hello, World!", separator=".") == "hello.world"


def test_stopwords_are_left_out():
    assert slugify("The Art of War", separator="-", stopwords=frozenset({"the", "of"})) == "art-war"


def test_max_length_drops_whole_words():
    assert slugify("one two three four", separator="-", max_length=9) == "one-two"
    assert slugify("incomprehensibilities", separator="-", max_length=6) == "incomp"


def test_separator_must_be_punctuation():
    with pytest.raises(ValueError):
        slugify("a b", separator="x")
