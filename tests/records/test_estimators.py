"""pass@k, the resolved rate and its bootstrap interval (polar.records.estimators) against tables computed by hand.

1.x  pass@k of one task: 1 − C(n−c, k) / C(n, k), every k ≤ n
2.x  a run's pass@k: the mean over the tasks with n ≥ k
3.x  the bootstrap over tasks: exact percentiles of small resampling distributions
4.x  the summary's block: unrewarded samples left out of n and counted; resolved from reward.json or reward 1
"""

from __future__ import annotations

import pytest

from polar.records import estimators as est

pytestmark = pytest.mark.unit


# (n, c) → pass@1 … pass@n, by hand: e.g. n=5, c=1, k=2: 1 − C(4,2)/C(5,2) = 1 − 6/10
PASS_TABLE = {
    (5, 0): [0.0, 0.0, 0.0, 0.0, 0.0],
    (5, 1): [0.2, 0.4, 0.6, 0.8, 1.0],
    (5, 2): [0.4, 0.7, 0.9, 1.0, 1.0],
    (4, 2): [0.5, 5 / 6, 1.0, 1.0],
    (3, 3): [1.0, 1.0, 1.0],
    (1, 0): [0.0],
}


@pytest.mark.parametrize("n,c", list(PASS_TABLE))
def test_1_1_pass_at_k_matches_the_table(n, c):
    got = est.task_pass_at(n, c, top_k=10)
    assert list(got) == [str(k) for k in range(1, n + 1)]  # every k ≤ n, none above
    assert list(got.values()) == pytest.approx(PASS_TABLE[(n, c)])


def test_1_2_a_larger_case_by_hand():
    # n=10, c=3, k=5: 1 − C(7,5)/C(10,5) = 1 − 21/252 = 11/12
    assert est.pass_at_k(10, 3, 5) == pytest.approx(11 / 12)


@pytest.mark.parametrize("n,c,k", [(3, 4, 1), (3, 1, 0), (3, 1, 4), (2, -1, 1)])
def test_1_3_impossible_counts_are_refused(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        est.pass_at_k(n, c, k)


def test_2_1_a_runs_pass_at_k_averages_the_tasks_that_have_k_samples():
    # A: n=4, c=2 → 1/2, 5/6, 1, 1; B: n=2, c=0 → 0, 0
    got = est.pass_at({"A": (4, 2), "B": (2, 0)}, top_k=5)
    assert got == pytest.approx({"1": 0.25, "2": 5 / 12, "3": 1.0, "4": 1.0, "5": None})
    assert got["5"] is None


# rates of the tasks → the 95 % interval. Under resampling the mean of T tasks is (successes among T draws) / T:
# [0, 0, 0, 1]: X ~ Bin(4, 1/4); P(X=0) = .316 → low 0; P(X≥3) = 13/256 = .051 > .025 > P(X=4) = .004 → high 3/4.
# ten tasks, one solved: X ~ Bin(10, .1); P(X≥3) = .070 > .025 > P(X≥4) = .013 → high .3.
CI_TABLE = [
    ([0.3], (0.3, 0.3)),
    ([1.0, 1.0, 1.0], (1.0, 1.0)),
    ([0.0, 1.0], (0.0, 1.0)),
    ([0.0, 0.0, 0.0, 1.0], (0.0, 0.75)),
    ([0.0] * 9 + [1.0], (0.0, 0.3)),
]


@pytest.mark.parametrize("rates,expected", CI_TABLE)
def test_3_1_the_bootstrap_interval_matches_the_table(rates, expected):
    assert est.bootstrap_ci(rates) == pytest.approx(expected)


def test_3_2_the_interval_is_reproducible_and_none_without_tasks():
    rates = [0.1, 0.5, 0.9, 0.0, 1.0, 0.25]
    assert est.bootstrap_ci(rates) == est.bootstrap_ci(list(rates))
    assert est.bootstrap_ci([]) is None


@pytest.mark.parametrize("reward,details,expected", [
    (1.0, None, True),
    (0.5, None, False),
    (0.0, {"reward": 0, "resolved": False, "graded": 0.5}, False),
    (1.0, {"reward": 1, "resolved": False}, False),  # reward.json's word wins over the number trained on
    (0.5, {"graded": 0.5, "resolved": True}, True),
    (1.0, {"resolved": "yes"}, True),  # not a bool: the reward decides
])
def test_4_1_resolved_is_reward_jsons_word_else_reward_one(reward, details, expected):
    assert est.is_resolved(reward, details) is expected


def test_4_2_the_block_leaves_unrewarded_samples_out_of_n_and_counts_them():
    doc = est.evaluation({"a": [True, False, None, True], "b": [None, None]}, top_k=2)
    # a: n=3, c=2 → pass@1 2/3, pass@2 1 − C(1,2)/C(3,2) = 1; b has no counted sample
    assert doc["per_task"]["a"] == {"n": 3, "resolved": 2, "unrewarded": 1, "resolved_rate": pytest.approx(2 / 3),
                                    "pass_at": {"1": pytest.approx(2 / 3), "2": 1.0}}
    assert doc["per_task"]["b"] == {"n": 0, "resolved": 0, "unrewarded": 2, "resolved_rate": None, "pass_at": {}}
    assert doc["unrewarded"] == 3 and doc["tasks_counted"] == 1
    assert doc["resolved_rate"] == pytest.approx(2 / 3) and doc["pass_at"] == pytest.approx({"1": 2 / 3, "2": 1.0})
    assert doc["resolved_ci95"] == pytest.approx([2 / 3, 2 / 3])


def test_4_3_no_counted_sample_gives_nulls():
    doc = est.evaluation({"a": [None]}, top_k=3)
    assert doc["resolved_rate"] is None and doc["resolved_ci95"] is None
    assert doc["pass_at"] == {"1": None, "2": None, "3": None}
