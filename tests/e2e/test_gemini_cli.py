"""Gemini CLI (real CLI) through the proxy: Google GenerateContent, with its router side call (JSON schema)."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import (SHELL_COMMAND, TOOL_TURNS, check_merge, check_tool_session, process_session,
                                script_tool_session, session_records)
from tests.support.scripted_upstream import Reply

pytestmark = pytest.mark.e2e


def _check_router(main_script) -> None:
    side = main_script.side_responses()
    assert side, "no router side call was made"
    for r in side:  # answered with JSON valid for its schema, so the CLI does not retry with backoff
        assert main_script.request_body(r)["response_format"]["type"] == "json_schema"
        assert r.finish_reason == "stop" and isinstance(json.loads(r.content), dict)


def test_1_one_turn_answer(gateway, main_script, agents, tmp_path):
    main_script(Reply(text="Polar answer one."))
    run = agents.run("gemini-cli", "Say hi.")
    assert run.returncode == 0, run.explain()
    assert "Polar answer one." in run.stdout, run.explain()
    records = session_records(gateway, run.session)
    assert {r["protocol"] for r in records} == {"google_generate"}
    _check_router(main_script)
    paths = [r["path"].partition("?")[0].rpartition(":")[2] for r in records]
    assert paths.count("streamGenerateContent") == 1 and paths.count("generateContent") == len(paths) - 1


def test_2_run_shell_command_session_merges(gateway, main_script, agents, tmp_path):
    script_tool_session(main_script, "run_shell_command", {"command": SHELL_COMMAND},
                        "The command printed the number. Done.")
    run = agents.run("gemini-cli", "Run a shell command and tell me what it printed.")
    assert run.returncode == 0, run.explain()
    assert "The command printed the number. Done." in run.stdout, run.explain()
    check_tool_session(main_script)
    _check_router(main_script)
    records = session_records(gateway, run.session)
    main = check_merge(process_session(gateway, run.session, tmp_path / "out"), main_script, len(records))
    assert main["n_calls"] == TOOL_TURNS + 1
