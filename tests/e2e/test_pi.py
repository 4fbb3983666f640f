"""Pi (real CLI) through the proxy on all three provider protocols."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import (SHELL_COMMAND, TOOL_TURNS, check_merge, check_tool_session, process_session,
                                script_tool_session, session_records)
from tests.support.scripted_upstream import Reply

pytestmark = pytest.mark.e2e

PROVIDERS = {
    "anthropic": ("anthropic_messages", "api.anthropic.com"),
    "openai": ("openai_responses", "api.openai.com"),
    "google": ("google_generate", "generativelanguage.googleapis.com"),
}


@pytest.mark.parametrize("provider", list(PROVIDERS))
def test_1_one_turn_answer(gateway, main_script, agents, provider):
    main_script(Reply(text="Polar answer one."))
    run = agents.run("pi", "Say hi.", provider=provider)
    assert run.returncode == 0, run.explain()
    assert "Polar answer one." in run.stdout, run.explain()
    records = session_records(gateway, run.session)
    assert [(r["protocol"], r["host"]) for r in records] == [PROVIDERS[provider]]


@pytest.mark.parametrize("provider", list(PROVIDERS))
def test_2_bash_tool_session_merges(gateway, main_script, agents, tmp_path, provider):
    script_tool_session(main_script, "bash", {"command": SHELL_COMMAND},
                        "The command printed the number. Done.")
    run = agents.run("pi", "Run a shell command and tell me what it printed.", provider=provider)
    assert run.returncode == 0, run.explain()
    assert "The command printed the number. Done." in run.stdout, run.explain()
    check_tool_session(main_script)
    records = session_records(gateway, run.session)
    assert {(r["protocol"], r["host"]) for r in records} == {PROVIDERS[provider]}
    main = check_merge(process_session(gateway, run.session, tmp_path / "out"), main_script, len(records))
    assert main["n_calls"] == TOOL_TURNS + 1
