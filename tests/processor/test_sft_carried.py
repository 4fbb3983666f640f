"""A reward line's `patch` and `resolved` ride into sft.jsonl's rows (processor/rewards.py CARRIED): polar-rollout
writes them for SWE tasks, and `--sft-min-reward 1` keeps exactly the resolved sessions, each with its patch."""

import json

import pytest

from polar.processor.cli import main
from tests.processor.synth import session_records, write_flows

pytestmark = pytest.mark.unit

PATCH = "diff --git a/pkg/a.py b/pkg/a.py\n--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"


@pytest.fixture
def dump(tmp_path):
    recs = session_records("s1", ["turn", "turn"], seed=1) + session_records("s2", ["turn"], seed=2)
    recs += session_records("s3", ["turn"], seed=3)
    write_flows(str(tmp_path / "flows"), recs, per_file=6)
    return tmp_path


def process(tmp, lines, *extra):
    (tmp / "r.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return main([str(tmp / "flows"), "-o", str(tmp / "out"), "-q", "--rewards", str(tmp / "r.jsonl"), "--overwrite",
                 *extra])


def rows(tmp):
    return [json.loads(x) for x in (tmp / "out" / "sft.jsonl").read_text().splitlines()]


def test_1_1_sft_min_reward_1_keeps_the_resolved_sessions_each_with_its_patch(dump):
    lines = [{"session": "s1", "reward": 1.0, "group": "g", "patch": PATCH, "resolved": True},
             {"session": "s2", "reward": 0.0, "group": "g", "patch": "diff --git a/b b/b\n", "resolved": False},
             {"session": "s3", "reward": 1.0, "group": "g", "patch": "", "resolved": True}]
    assert process(dump, lines, "--sft-min-reward", "1") == 0
    kept = rows(dump)
    assert [(r["patch"], r["resolved"]) for r in kept] == [(PATCH, True), ("", True)]
    assert all(r["messages"] and "tools" in r for r in kept)


def test_1_2_lines_without_them_give_rows_without_them(dump):
    assert process(dump, [{"session": "s1", "reward": 1.0, "group": "g"},
                          {"session": "s2", "reward": 0.0, "group": "g", "patch": None, "resolved": None}]) == 0
    assert rows(dump) and all(set(r) == {"messages", "tools"} for r in rows(dump))


@pytest.mark.parametrize("bad", [{"patch": 3}, {"resolved": "yes"}, {"resolved": 1}])
def test_1_3_a_carried_key_of_another_type_is_a_bad_rewards_file(dump, bad, capsys):
    assert process(dump, [{"session": "s1", "reward": 1.0, "group": "g", **bad}]) == 2
    assert "r.jsonl:1:" in capsys.readouterr().err
