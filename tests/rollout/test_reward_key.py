"""`polar-rollout --reward-key KEY` (rollout/verify.py read_reward): reward.json's KEY is the reward; a reward.json
without it, or only a reward.txt, is an error (the sample's verifier_error), never a 0.

1.x  the key read, with reward.json kept whole as reward_details
2.x  what is an error, and what it says
"""

from __future__ import annotations

import json

import pytest

from polar.rollout.options import options, parser
from polar.rollout.verify import read_reward

pytestmark = pytest.mark.unit

SWE = {"reward": 0, "graded": 0.5, "resolved": False, "f2p_passed": 1, "f2p_total": 2, "p2p_passed": 6,
       "p2p_total": 6}


def write(tmp_path, **files):
    for name, text in files.items():
        (tmp_path / name.replace("_", ".")).write_text(text)
    return tmp_path


def test_1_1_the_key_is_the_reward_and_reward_json_the_details(tmp_path):
    d = write(tmp_path, reward_json=json.dumps(SWE), reward_txt="0\n")
    assert read_reward(d, "graded") == (0.5, SWE, None)
    assert read_reward(d) == (0.0, SWE, None)  # the default key: reward


@pytest.mark.parametrize("files,needle", [
    ({"reward_json": json.dumps({"reward": 1})}, "--reward-key graded: reward.json has no 'graded' key (it has: reward)"),
    ({"reward_txt": "1\n"}, "--reward-key graded: the verifier wrote no reward.json"),
    ({"reward_json": json.dumps({"graded": "half"})}, "reward.json's graded 'half' is not a finite number"),
    ({"reward_json": json.dumps({"graded": True})}, "reward.json's graded True is not a finite number"),
    ({"reward_json": "[0.5]"}, "reward.json has no 'graded' key (it has: list)"),
])
def test_2_1_a_missing_or_bad_key_is_an_error_not_a_zero(tmp_path, files, needle):
    reward, _, error = read_reward(write(tmp_path, **files), "graded")
    assert reward is None and needle in error


def test_2_2_the_flag_is_parsed_and_a_blank_key_refused(capsys):
    args = parser().parse_args(["t", "--agent", "codex", "--out", "r", "--reward-key", "graded", "--pull", "never"])
    o = options(args)
    assert (o.reward_key, o.pull) == ("graded", "never")
    with pytest.raises(SystemExit) as exc:
        parser().parse_args(["t", "--agent", "codex", "--out", "r", "--reward-key", " "])
    assert exc.value.code == 2 and "--reward-key: must name a key of reward.json" in capsys.readouterr().err
