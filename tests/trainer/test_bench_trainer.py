"""scripts/bench_trainer's accounting (scripts/lib/bench_trainer_sessions.py) on a small shape, no timing: the real
polar-process in both modes over the same flow records.

Scenarios:
1.1 each completion is trained once in both modes: equal trainable tokens, and as many as the sessions sampled.
1.2 prefix_merging sends fewer sequences, forward tokens, Σ L² and micro-batches than per_request.
1.3 a compaction breaks the chain: more prefix_merging sequences than main conversations, trainable tokens still equal.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest
from polar.trainer.loader import group_indices

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
BIN = os.path.dirname(sys.executable)  # this venv's polar-process
sys.path.insert(0, str(ROOT / "scripts" / "lib"))  # as scripts/bench_trainer imports it (dataclasses need a module)
sl = importlib.import_module("bench_trainer_sessions")
SHAPE = sl.scaled(sl.REAL, first_prompts=(600, 900), turns=(4, 6), reply=(5, 30), tool_result=(5, 60),
                  sub_prompt=(100, 200), sub_turns=(2, 2), sub_agent_share=0.5)


def _accounting(tmp_path, shape) -> tuple[dict, dict]:
    sessions = sl.make_sessions(shape, 4, seed=3)
    sl.random_logprobs(sessions, seed=4)
    return sessions, sl.accounting(sessions, str(tmp_path), BIN, 2048, group_indices)


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    return _accounting(tmp_path_factory.mktemp("bench"), SHAPE)


def test_1_1_equal_trainable_tokens(captured):
    sessions, acc = captured
    sampled = sum(len(c.completion) for calls in sessions.values() for c in calls)
    assert acc["per_request"]["trainable_tokens"] == acc["prefix_merging"]["trainable_tokens"] == sampled


def test_1_2_prefix_merging_costs_less(captured):
    sessions, acc = captured
    a, b = acc["per_request"], acc["prefix_merging"]
    assert a["sequences"] == sum(len(c) for c in sessions.values())  # one per call
    assert b["sequences"] == sum(len({c.convo for c in calls}) for calls in sessions.values())  # one per chain
    for key in ("forward_tokens", "sum_l2", "micro_batches_per_sequence", "micro_batches_packed"):
        assert a[key] > b[key], key
    assert sl.ratios(acc)["trainable_tokens"] == 1


def test_1_3_a_compaction_breaks_the_chain(tmp_path):
    sessions, acc = _accounting(tmp_path, sl.scaled(SHAPE, compact_every=2, sub_agent_share=0.0))
    assert acc["prefix_merging"]["sequences"] > len(sessions)
    assert acc["per_request"]["trainable_tokens"] == acc["prefix_merging"]["trainable_tokens"] > 0
    assert acc["per_request"]["sequences"] > acc["prefix_merging"]["sequences"]
