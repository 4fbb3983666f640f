"""Scenarios for processor/rewards.py: rule 10 and the side-chain policy."""

import pytest

from polar.processor import rewards as rw
from polar.processor.merge import TrainingSequence

pytestmark = pytest.mark.unit


def write(tmp_path, lines):
    p = tmp_path / "r.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def seq(session, side=False):
    import numpy as np
    z = np.zeros(1, dtype=np.int32)
    return TrainingSequence("x", "x", session, "prefix_merging", z, z.astype("uint8"), None, ["x"], 1, [], None, "m",
                            0.0, side_chain=side)


def test_1_1_advantages_use_population_sigma_per_group(tmp_path):
    path = write(tmp_path, ['{"session":"a","reward":1,"group":"g"}', '{"session":"b","reward":0,"group":"g"}',
                            '{"session":"c","reward":3,"group":"h"}', '{"session":"d","reward":2,"group":null}',
                            '{"session":"zz","reward":2,"group":"g"}', ''])
    r = rw.read_rewards(path, {"a", "b", "c", "d", "e"})
    assert r.advantage == {"a": 1.0, "b": -1.0, "c": 0.0, "d": None}
    assert (r.joined, r.missing, r.unmatched_lines) == (4, 1, 1)


def test_1_2_equal_rewards_give_zero_advantage(tmp_path):
    path = write(tmp_path, ['{"session":"a","reward":1,"group":"g"}', '{"session":"b","reward":1,"group":"g"}'])
    assert rw.read_rewards(path, {"a", "b"}).advantage == {"a": 0.0, "b": 0.0}


def test_1_4_mean_norm_only_subtracts_the_group_mean(tmp_path):
    # g: rewards 1, 0, 0, 0 → mean 0.25, σ = sqrt(0.1875) ≈ 0.433: std gives 1.732 / −0.577, mean 0.75 / −0.25
    path = write(tmp_path, ['{"session":"a","reward":1,"group":"g"}', '{"session":"b","reward":0,"group":"g"}',
                            '{"session":"c","reward":0,"group":"g"}', '{"session":"d","reward":0,"group":"g"}',
                            '{"session":"e","reward":1,"group":"h"}', '{"session":"f","reward":1,"group":"h"}'])
    mean = rw.read_rewards(path, set("abcdef"), norm="mean").advantage
    assert mean == {"a": 0.75, "b": -0.25, "c": -0.25, "d": -0.25, "e": 0.0, "f": 0.0}
    std = rw.read_rewards(path, set("abcdef")).advantage
    assert std["a"] == pytest.approx(3 ** 0.5) and std["b"] == pytest.approx(-(3 ** -0.5))
    with pytest.raises(ValueError, match="advantage norm"):
        rw.advantages({"a": (1.0, "g")}, norm="max")


@pytest.mark.parametrize("line", ['{"session":"a","reward":1}\n{"session":"a","reward":2}', '{"session":"a"}',
                                  'not json', '{"session":"a","reward":1,"group":3}'])
def test_1_3_bad_lines_are_errors(tmp_path, line):
    with pytest.raises(rw.RewardsError):
        rw.read_rewards(write(tmp_path, [line]), {"a"})


def test_2_1_side_chain_policy(tmp_path):
    path = write(tmp_path, ['{"session":"a","reward":1,"group":"g"}', '{"session":"b","reward":0,"group":"g"}'])
    r = rw.read_rewards(path, {"a", "b"})
    for policy, want in (("include", (1.0, 1.0)), ("zero", (0.0, 0.0)), ("exclude", (None, None))):
        s = seq("a", side=True)
        rw.apply(s, r, policy)
        assert (s.reward, s.advantage, s.group) == (*want, "g")
    s = seq("nobody")
    rw.apply(s, r, "include")
    assert (s.reward, s.advantage, s.group) == (None, None, None)
