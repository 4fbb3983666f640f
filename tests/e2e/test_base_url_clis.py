"""The CLIs through their own base-URL variable (run-agent --connect base-url: ANTHROPIC_BASE_URL,
OPENAI_BASE_URL, GOOGLE_GEMINI_BASE_URL at the proxy's address, the session in the path; no proxy and no CA
variable): the same three shell-tool turns and final answer as their proxy-path tests, merged into one sequence the
same way, every record `connect` base_url with its session from the path, and the gateway's `served.base_url`
counter grown by at least the records written (a CLI that ignored its base URL could not pass: it has no proxy).
"""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.conftest import (SHELL_COMMAND, TOOL_TURNS, check_merge, check_tool_session, process_session,
                                script_tool_session, session_records)

pytestmark = pytest.mark.e2e

# harness → its shell tool and arguments (as in each CLI's own proxy-path test)
CASES = {
    "claude-code": ("Bash", {"command": SHELL_COMMAND, "description": "Print a number"}),
    "qwen-code": ("run_shell_command", {"command": SHELL_COMMAND}),
}


def served_base_url(gateway) -> int:
    with open(gateway.state["control_token"]) as fh:
        token = fh.read().strip()
    with httpx.Client(trust_env=False, timeout=10) as client:
        state = client.get(gateway.state["control_url"] + "/admin/state", headers={"x-polar-control-token": token})
    return state.json()["served"]["base_url"]


@pytest.mark.parametrize("harness", list(CASES))
def test_1_tool_session_by_base_url_merges(gateway, main_script, agents, tmp_path, harness):
    tool, arguments = CASES[harness]
    script_tool_session(main_script, tool, arguments, "The command printed the number. Done.")
    before = served_base_url(gateway)
    run = agents.run(harness, "Run a shell command and tell me what it printed.", connect="base-url")
    assert run.returncode == 0, run.explain()
    assert "The command printed the number. Done." in run.stdout, run.explain()
    check_tool_session(main_script)
    records = session_records(gateway, run.session, source="path")
    assert {r["connect"] for r in records} == {"base_url"}
    # every model call came by base URL (the counter also counts requests that are no model call: Claude Code's
    # `HEAD /` of its base URL)
    assert served_base_url(gateway) - before >= len(records)
    main = check_merge(process_session(gateway, run.session, tmp_path / "out"), main_script, len(records))
    assert main["n_calls"] == TOOL_TURNS + 1
