"""Codex (real CLI) through the proxy: OpenAI Responses, both request shapes (the default model's code-mode `exec`
freeform tool in `additional_tools`; gpt-5.2-codex's top-level function tools with `exec_command`)."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import (SHELL_COMMAND, TOOL_TURNS, check_merge, check_tool_session, process_session,
                                script_tool_session, session_records)
from tests.support.scripted_upstream import Reply

pytestmark = pytest.mark.e2e


def test_1_one_turn_answer(gateway, main_script, agents):
    main_script(Reply(text="Polar answer one."))
    run = agents.run("codex", "Say hi.")
    assert run.returncode == 0, run.explain()
    assert "Polar answer one." in run.stdout, run.explain()
    records = session_records(gateway, run.session)
    assert [(r["protocol"], r["host"]) for r in records] == [("openai_responses", "api.openai.com")]


def test_2_exec_code_mode_tool_default_model(gateway, main_script, agents, tmp_path):
    code = "const r = await tools.exec_command({cmd: %s}); text(r.output);" % _js(SHELL_COMMAND)
    script_tool_session(main_script, "exec", {"input": code},
                        "The script printed the number. Done.")
    run = agents.run("codex", "Run a shell command and tell me what it printed.")
    assert run.returncode == 0, run.explain()
    assert "The script printed the number. Done." in run.stdout, run.explain()
    check_tool_session(main_script)
    records = session_records(gateway, run.session)
    assert "custom_tool_as_function:exec" in records[0]["normalizations"]  # the default model's shape
    main = check_merge(process_session(gateway, run.session, tmp_path / "out"), main_script, len(records))
    assert main["n_calls"] == TOOL_TURNS + 1


def test_3_exec_command_gpt_5_2_codex(gateway, main_script, agents, tmp_path):
    script_tool_session(main_script, "exec_command", {"cmd": SHELL_COMMAND},
                        "The command printed it. Done.")
    run = agents.run("codex", "Run a shell command and tell me what it printed.", model="gpt-5.2-codex")
    assert run.returncode == 0, run.explain()
    assert "The command printed it. Done." in run.stdout, run.explain()
    check_tool_session(main_script)
    records = session_records(gateway, run.session)
    assert {r["model_requested"] for r in records} == {"gpt-5.2-codex"}
    main = check_merge(process_session(gateway, run.session, tmp_path / "out"), main_script, len(records))
    assert main["n_calls"] == TOOL_TURNS + 1


def _js(s: str) -> str:
    import json

    return json.dumps(s)
