"""Claude Code (real CLI) through the proxy: Anthropic Messages, session from proxy credentials."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.e2e.conftest import (SHELL_COMMAND, TOOL_TURNS, check_merge, check_tool_session, process_session,
                                script_tool_session, session_records)
from tests.support.scripted_upstream import Reply

pytestmark = pytest.mark.e2e


def test_1_one_turn_answer(gateway, main_script, agents):
    main_script(Reply(text="Polar answer one."))
    run = agents.run("claude-code", "Say hi.")
    assert run.returncode == 0, run.explain()
    assert "Polar answer one." in run.stdout, run.explain()
    records = session_records(gateway, run.session)
    # The nonessential-traffic switch (run-agent's default) leaves only the main call.
    assert [(r["protocol"], r["host"]) for r in records] == [("anthropic_messages", "api.anthropic.com")]


def test_2_bash_tool_session_merges(gateway, main_script, agents, tmp_path):
    script_tool_session(main_script, "Bash", {"command": SHELL_COMMAND, "description": "Print a number"},
                        "The command printed the number. Done.")
    run = agents.run("claude-code", "Run a shell command and tell me what it printed.")
    assert run.returncode == 0, run.explain()
    assert "The command printed the number. Done." in run.stdout, run.explain()
    check_tool_session(main_script)
    records = session_records(gateway, run.session)
    main = check_merge(process_session(gateway, run.session, tmp_path / "out"), main_script, len(records))
    assert main["n_calls"] == TOOL_TURNS + 1


def test_3_title_side_call_with_nonessential_traffic(gateway, main_script, agents, tmp_path):
    main_script(Reply(text="Polar answer three."))
    # A one-word prompt gets no title; a sentence does.
    run = agents.run("claude-code", "Explain in one sentence what a shell is.", keep_nonessential=True)
    assert run.returncode == 0, run.explain()
    assert "Polar answer three." in run.stdout, run.explain()
    records = session_records(gateway, run.session)
    side = main_script.side_responses()
    assert side, "no title side call was made"
    for r in side:  # the title call asks for JSON; the answer must parse for the CLI to accept it
        body = main_script.request_body(r)
        assert body["response_format"]["type"] == "json_schema" and not body.get("tools")
        assert r.finish_reason == "stop" and isinstance(json.loads(r.content), dict)
    check_merge(process_session(gateway, run.session, tmp_path / "out"), main_script, len(records))


def test_4_run_agent_mints_a_uuid7_session(gateway, main_script, agents):
    main_script(Reply(text="Polar answer four."))
    run = agents.run("claude-code", "Say hi.", mint_session=True)
    assert run.returncode == 0, run.explain()
    assert "Polar answer four." in run.stdout and "polar-session:" not in run.stdout
    assert uuid.UUID(run.session).version == 7, run.stderr
    session_records(gateway, run.session)
