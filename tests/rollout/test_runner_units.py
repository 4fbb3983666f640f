"""The runner's pieces without a run (no sockets): the reward file rule, rewards.jsonl from results, a torn results
line, final.diff, a dead writer's .open files, the --agent grammar, the python agent wrapper, the CLI argv per agent.

1.x  read_reward: reward.json's `reward` else its only key, else reward.txt; anything else is verifier_error
2.x  results.jsonl → rewards.jsonl (latest attempt per sample, rewarded statuses only); a torn last line
3.x  tree_diff, close_dead_writers
4.x  AgentSpec, python -m polar.rollout.pyagent, the CLI agents' argv (the code scripts/run-agent runs)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from polar import records as rec
from polar.rollout import clis as agents
from polar.rollout.common import UsageError
from polar.rollout.job import AgentSpec
from polar.rollout.ledger import RESULT_FIELDS, Results, rewards_lines
from polar.rollout.procs import close_dead_writers
from polar.rollout.treediff import tree_diff
from polar.rollout.verify import read_reward

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("files,expected", [
    ({"reward.json": '{"reward": 0.5, "tests": 4}'}, (0.5, {"reward": 0.5, "tests": 4}, None)),
    ({"reward.json": '{"score": 1}'}, (1.0, {"score": 1}, None)),
    ({"reward.json": "0.25"}, (0.25, None, None)),
    ({"reward.txt": " 1.0\n"}, (1.0, None, None)),
    ({"reward.json": '{"reward": 1}', "reward.txt": "0"}, (1.0, {"reward": 1}, None)),  # reward.json first
])
def test_1_1_the_reward_file_rule(tmp_path, files, expected):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert read_reward(tmp_path) == expected


@pytest.mark.parametrize("files,why", [
    ({}, "no reward.json or reward.txt"),
    ({"reward.json": "{not json"}, "not JSON"),
    ({"reward.json": '{"a": 1, "b": 2}'}, "no `reward` key"),
    ({"reward.json": '{"reward": "high"}'}, "not a finite number"),
    ({"reward.json": '{"reward": true}'}, "not a finite number"),
    ({"reward.json": '{"reward": NaN}'}, "not a finite number"),
    ({"reward.txt": "inf"}, "not finite"),
    ({"reward.txt": "1.0 0.5"}, "not one number"),
])
def test_1_2_absent_malformed_or_non_finite_is_an_error(tmp_path, files, why):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    reward, _, error = read_reward(tmp_path)
    assert reward is None and why in error


def _line(task, k, attempt, status, reward):
    return {"task": task, "k": k, "attempt": attempt, "status": status, "reward": reward,
            "session": f"r/{task}/{k}/{attempt}", "group": f"r/{task}"}


def test_2_1_rewards_come_from_each_samples_latest_attempt_and_rewarded_statuses_only():
    lines = [_line("a", 0, 0, "infra_error", None), _line("a", 0, 1, "completed", 1.0),
             _line("a", 1, 0, "agent_timeout", 0.0), _line("a", 2, 0, "completed", 1.0),
             _line("a", 2, 1, "cancelled", None), _line("b", 0, 0, "verifier_error", None),
             _line("b", 1, 0, "verifier_timeout", 0.0), _line("b", 2, 0, "agent_error", 0.5)]
    assert rewards_lines(lines) == [
        {"session": "r/a/0/1", "reward": 1.0, "group": "r/a"}, {"session": "r/a/1/0", "reward": 0.0, "group": "r/a"},
        {"session": "r/b/1/0", "reward": 0.0, "group": "r/b"}, {"session": "r/b/2/0", "reward": 0.5, "group": "r/b"}]


def test_2_2_a_torn_last_line_is_reported_ignored_and_cut_before_the_next_append(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(_line("a", 0, 0, "completed", 1.0)) + "\n" + '{"task": "a", "k": 1, "att')
    res = Results(path)
    assert [ln["k"] for ln in res.read()] == [0] and "torn last line" in res.torn
    res.repair()
    res.append(_line("a", 1, 0, "completed", 0.0))
    lines = res.read()
    assert [ln["k"] for ln in lines] == [0, 1] and list(lines[1]) == list(RESULT_FIELDS)
    path.write_text('{"task": "a"}\nnot json\n{"task": "b"}\n')
    with pytest.raises(UsageError, match="line 2 is not a JSON object"):
        Results(path).read()


def test_3_1_final_diff_shows_changed_added_and_removed_files(tmp_path):
    start, final = tmp_path / "start", tmp_path / "final"
    for root in (start, final):
        (root / "pkg").mkdir(parents=True)
    (start / "pkg" / "m.py").write_text("a = 1\nb = 2\n")
    (final / "pkg" / "m.py").write_text("a = 1\nb = 3\n")
    (start / "gone.txt").write_text("bye\n")
    (final / "new.txt").write_text("no newline")
    (start / "same.bin").write_bytes(b"\0\1")
    (final / "same.bin").write_bytes(b"\0\1")
    (final / "blob.bin").write_bytes(b"\0\2")
    diff = tree_diff(start, final)
    assert "--- a/pkg/m.py\n+++ b/pkg/m.py\n" in diff and "-b = 2\n+b = 3\n" in diff
    assert "--- a/gone.txt\n+++ /dev/null\n" in diff and "+no newline\n\\ No newline at end of file\n" in diff
    assert "Binary or large files a/blob.bin and b/blob.bin differ" in diff and "same.bin" not in diff
    assert tree_diff(None, final).count("+++ b/") == 2  # an empty start state


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_3_2_a_dead_writers_open_files_are_closed_at_their_last_whole_record(tmp_path):
    host = rec.local_host()
    writer = rec.FlowWriter(str(tmp_path))
    writer.write(rec.new_record(id="r1", session="s", t_start=1.0))
    path = Path(writer.current_path)
    os.close(writer._fd)  # the writer "dies": its file stays .open
    with open(path, "ab") as fh:
        fh.write(b"\x8a\xa1v")  # a torn record
    dead = path.with_name(path.name.replace(f"-{os.getpid()}-", f"-{_dead_pid()}-"))
    os.replace(path, dead)
    other_host = tmp_path / f"flows-20260101T000000.000000Z-elsewhere-{_dead_pid()}-0001.msgpack.open"
    other_host.write_bytes(b"")
    assert f"-{host}-" in dead.name
    assert close_dead_writers(tmp_path) == [dead.name]
    closed = dead.with_name(dead.name[: -len(".open")])
    assert closed.is_file() and not dead.exists() and other_host.exists()  # another host's writer: not ours
    scan = rec.FileScan(str(closed))
    assert [r["id"] for _, r in rec.iter_file(str(closed), scan)] == ["r1"] and scan.torn_tail is None


@pytest.mark.parametrize("text,kind,harness,provider,target", [
    ("claude-code", "cli", "claude-code", None, None), ("pi:openai", "cli", "pi", "openai", None),
    ("python:agent:run", "python", None, None, "agent:run"), ("python:pkg.mod:Agent.run", "python", None, None,
                                                              "pkg.mod:Agent.run"),
])
def test_4_1_the_agent_grammar(text, kind, harness, provider, target):
    spec = AgentSpec.parse(text)
    assert (spec.kind, spec.harness, spec.provider, spec.target) == (kind, harness, provider, target)


def _pyagent(tmp_path, body: str, env_extra=None) -> subprocess.CompletedProcess:
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir(exist_ok=True)
    (agent_dir / "myagent.py").write_text(body)
    (tmp_path / "instruction.md").write_text("do the thing")
    env = {**os.environ, "POLAR_AGENT_DIR": str(agent_dir), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "polar.rollout.pyagent", "myagent:run", "--instruction-file",
                           str(tmp_path / "instruction.md")], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=60)


def test_4_2_pyagent_calls_func_with_instruction_workdir_env_and_maps_its_result(tmp_path):
    ok = _pyagent(tmp_path, "def run(instruction, workdir, env):\n"
                            "    print(instruction, workdir, env['MARK'])\n", {"MARK": "m1"})
    assert ok.returncode == 0 and ok.stdout.strip() == f"do the thing {tmp_path} m1"
    assert _pyagent(tmp_path, "def run(i, w, e):\n    return 7\n").returncode == 7
    boom = _pyagent(tmp_path, "def run(i, w, e):\n    raise ValueError('nope')\n")
    assert boom.returncode == 1 and "Traceback" in boom.stderr and "ValueError: nope" in boom.stderr
    missing = _pyagent(tmp_path, "x = 1\n")
    assert missing.returncode == 1 and "AttributeError" in missing.stderr


def test_4_3_cli_agents_get_run_agents_argv_and_environment():
    """polar-rollout and scripts/run-agent share rollout/clis.py: the sandboxed claude-code run skips permissions
    (IS_SANDBOX), every CLI gets the proxy, the CA variables and its dummy key."""
    args = agents.cli_args("claude-code", "fix it")
    argv, env = agents.build(args, {"IS_SANDBOX": "1", "ANTHROPIC_BASE_URL": "http://elsewhere"},
                             "http://s:x@127.0.0.1:1", "/home/agent/.polar/ca.pem", "/home/agent/.polar/ca-bundle.pem",
                             "r/t/0/0")
    assert argv == ["-p", "fix it", "--dangerously-skip-permissions"]
    assert env["ANTHROPIC_API_KEY"] == agents.DUMMY_KEY and "ANTHROPIC_BASE_URL" not in env
    assert env["NODE_EXTRA_CA_CERTS"] == "/home/agent/.polar/ca.pem"
    assert env["SSL_CERT_FILE"] == env["CODEX_CA_CERTIFICATE"] == "/home/agent/.polar/ca-bundle.pem"
    assert env["POLAR_SESSION"] == "r/t/0/0" and env["HTTPS_PROXY"] == "http://s:x@127.0.0.1:1"
    argv, env = agents.build(agents.cli_args("pi", "go", provider="google", model="m"), {}, "p", "c", "b", "s")
    assert argv == ["--provider", "google", "--model", "m", "-p", "go"] and env["GEMINI_API_KEY"]
    with pytest.raises(ValueError, match="unknown agent"):
        agents.parse_agent("cursor")


def test_4_4_scripts_run_agent_runs_the_shared_code():
    from tests.support.scripts import load_script

    ra = load_script("scripts/run-agent", "run_agent_shared_under_test")
    assert ra.build.__module__ == "polar.rollout.clis" and ra.build.__code__.co_filename.endswith(
        os.path.join("rollout", "clis.py"))
