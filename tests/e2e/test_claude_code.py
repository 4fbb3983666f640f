"""Claude Code (real CLI) through the proxy: Anthropic Messages, session from proxy credentials."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import (SHELL_COMMAND, SHELL_OUTPUT, check_merge, process_session, session_records,
                                tool_results_text)
from tests.support.scripted_upstream import Reply

pytestmark = pytest.mark.e2e


def test_1_one_turn_answer(gateway, main_script, agents):
    main_script(Reply(text="Polar answer one."))
    run = agents.run("claude-code", "Say hi.")
    assert run.returncode == 0, run.explain()
    assert "Polar answer one." in run.stdout, run.explain()
    records = session_records(gateway, run.session)
    assert [r["protocol"] for r in records] == ["anthropic_messages"]
    assert records[0]["request_headers"] is not None


def test_2_bash_tool_session_merges(gateway, main_script, agents, tmp_path):
    main_script(Reply(tool_calls=[("Bash", {"command": SHELL_COMMAND, "description": "Print a number"})]),
                Reply(text="The command printed the number. Done."))
    run = agents.run("claude-code", "Run a shell command and tell me what it printed.")
    assert run.returncode == 0, run.explain()
    assert "The command printed the number. Done." in run.stdout, run.explain()
    bodies = main_script.main_requests()
    assert len(bodies) == 2 and SHELL_OUTPUT in tool_results_text(bodies[1])
    records = session_records(gateway, run.session)
    processed = process_session(gateway, run.session, tmp_path / "out")
    main = check_merge(processed, main_script, len(records))
    assert main["n_calls"] == 2


def test_3_title_side_call_with_nonessential_traffic(gateway, main_script, agents, tmp_path):
    main_script(Reply(text="Polar answer three."))
    run = agents.run("claude-code", "Say hi.", keep_nonessential=True)
    assert run.returncode == 0, run.explain()
    assert "Polar answer three." in run.stdout, run.explain()
    records = session_records(gateway, run.session)
    side = [main_script.upstream.responses[i] for i in main_script.side_indices]
    assert side, "no title side call was made"
    assert all(r.finish_reason == "stop" for r in side)
    processed = process_session(gateway, run.session, tmp_path / "out")
    check_merge(processed, main_script, len(records))
