"""polar-rollout's mistakes caught before any sandbox or proxy starts (issue 37): each is one line on stderr naming
the fix, exit 2, and `--out` is left as it was (absent here). The python: agent's module is read, never run: a module
whose top level would write a file shows it was not imported.

1.x  python: agents — not found, does not compile, lacks the function, an SDK of a missing extra
2.x  CLI agents — not installed; a mistyped name gets "did you mean"
3.x  the fix names what this install has: a checkout's scripts, else pip extras / npm packages
"""

from __future__ import annotations

import pytest

from polar.rollout import agent_check, cli
from tests.rollout.rollout_support import make_task

pytestmark = pytest.mark.unit

# Never reached: every case must stop before the proxy starts.
UPSTREAM = "http://127.0.0.1:9/v1"


def _refused(tmp_path, capsys, agent: str, *extra: str) -> str:
    tasks = tmp_path / "tasks"
    if not tasks.exists():
        make_task(tasks, "ok", "solve")
    run = tmp_path / "run"
    code = cli.main([str(tasks), "--agent", agent, "--out", str(run), "--sandbox", "none", "--upstream", UPSTREAM,
                     *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("polar-rollout: error: "), err
    assert not run.exists()  # --out as it was
    return err[0]


def _agent_module(tmp_path, name: str, source: str) -> None:
    agent_dir = tmp_path / "tasks" / "ok" / "agent"
    if not agent_dir.exists():
        make_task(tmp_path / "tasks", "ok", "solve")
    sentinel = tmp_path / "imported"
    (agent_dir / f"{name}.py").write_text(f"open({str(sentinel)!r}, 'w').close()\n" + source)


def test_1_1_a_module_that_cannot_be_found(tmp_path, capsys):
    line = _refused(tmp_path, capsys, "python:no_such_agent_mod:run")
    assert "no module 'no_such_agent_mod'" in line and "agent/ folder" in line


def test_1_2_a_module_that_does_not_compile_is_named_with_its_line(tmp_path, capsys):
    _agent_module(tmp_path, "broken", "def run(instruction, workdir, env):\n    return (\n")
    line = _refused(tmp_path, capsys, "python:broken:run")
    assert "broken.py:" in line and "does not compile" in line and "fix the module" in line
    assert not (tmp_path / "imported").exists()  # read, not run


def test_1_3_a_module_without_the_function(tmp_path, capsys):
    _agent_module(tmp_path, "nofunc", "def solve(instruction, workdir, env):\n    return 0\n")
    line = _refused(tmp_path, capsys, "python:nofunc:run")
    assert "defines no 'run' at its top level" in line and "python:nofunc:FUNC" in line
    assert not (tmp_path / "imported").exists()


def test_1_4_an_sdk_of_a_missing_extra_names_the_pip_line(tmp_path, capsys, monkeypatch):
    # The SDKs are installed in this venv: the check's look-up answers "absent" for anthropic only. The real
    # absence is tests/scripts/test_wheel.py's (a wheel installed without [agents]).
    real = agent_check._importable
    monkeypatch.setattr(agent_check, "_importable", lambda m: m != "anthropic" and real(m))
    monkeypatch.setattr(agent_check.paths, "checkout_root", lambda: None)  # as a wheel install
    line = _refused(tmp_path, capsys, "python:polar.rollout.sdk_agent:answer")
    assert "it imports anthropic, which is not installed here: pip install 'polar-gateway[agents]'" in line


def test_1_5_a_good_module_passes_without_being_run(tmp_path):
    _agent_module(tmp_path, "fine", "import os\n\ndef run(instruction, workdir, env):\n    return 0\n")
    agent_check.check_python("fine:run", [tmp_path / "tasks" / "ok" / "agent"])
    agent_check.check_python("polar.rollout.sdk_agent:answer", [None])
    assert not (tmp_path / "imported").exists()


def test_2_1_a_cli_that_is_not_installed_names_the_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    line = _refused(tmp_path, capsys, "codex", "--npm-dir", str(tmp_path / "npm"))
    assert "--agent codex: its CLI (codex) is not installed" in line and "scripts/setup --clis" in line


@pytest.mark.parametrize("typo,meant", [("claude", "claude-code"), ("gemini", "gemini-cli"), ("codx", "codex")])
def test_2_2_a_mistyped_agent_name_gets_did_you_mean(typo, meant, tmp_path, capsys):
    line = _refused(tmp_path, capsys, typo)
    assert f"unknown agent '{typo}' (did you mean {meant}?)" in line


def test_3_1_outside_a_checkout_the_cli_fix_is_npm(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setattr(agent_check.paths, "checkout_root", lambda: None)
    with pytest.raises(agent_check.UsageError) as exc:
        agent_check.check_cli("claude-code", None)
    assert "npm install" in str(exc.value) and "@anthropic-ai/claude-code" in str(exc.value)
    assert "scripts/" not in str(exc.value)
