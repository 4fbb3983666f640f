"""processor/main_chain.py: a session's main-chain calls from its records alone (the runner's turn-state boundaries):
the main conversation's calls in order; a side call (a title) and a retried call's discarded answer are not."""

from __future__ import annotations

import random

import pytest

from polar.processor.main_chain import main_chain_calls
from tests.processor.calls import EOT, record
from tests.processor.test_compaction import _records

pytestmark = pytest.mark.unit

SYS = [1, 9, 9, 5]


def test_1_main_calls_in_order_without_side_calls_or_superseded_answers():
    p1, c1 = SYS + [7, 11, EOT, 5], [20, EOT]
    p2, c2 = p1 + c1 + [6, 30, EOT, 5], [21, EOT]
    p3, c3 = p2 + c2 + [6, 31, EOT, 5], [22, EOT]
    recs = [record(p1, c1, t=1.0, cid="m1"), record([3, 3, 5], [40, EOT], t=1.5, cid="title"),
            record(p2, [99, EOT], t=2.0, cid="retried"), record(p2, c2, t=2.5, cid="m2"),
            record(p3, c3, t=3.0, cid="m3")]
    shuffled = recs[:]
    random.Random(0).shuffle(shuffled)
    assert main_chain_calls(shuffled) == ["m1", "m2", "m3"]


def test_2_a_compaction_does_not_end_the_main_chain():
    # rule 12: the calls after a summary continue the session's main chain
    assert main_chain_calls(_records("s")) == ["s-c1", "s-c2", "s-x", "s-b", "s-c"]
