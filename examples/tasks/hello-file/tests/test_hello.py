"""hello-file: the start state is empty (the task has no environment/), so both tests fail on it."""

import pytest


@pytest.fixture
def text(app):
    return (app / "hello.txt").read_bytes()


def test_says_hello(text):
    assert text.strip() == b"Hello, Polar!"


def test_is_exactly_one_line(text):
    assert text == b"Hello, Polar!\n"
