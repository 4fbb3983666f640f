"""Qwen Code (real CLI, `--auth-type openai`) through the proxy: OpenAI Chat to its DashScope default host."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import (SHELL_COMMAND, TOOL_TURNS, check_merge, check_tool_session, process_session,
                                script_tool_session, session_records)
from polar.records import token_ids
from tests.support.scripted_upstream import Reply

pytestmark = pytest.mark.e2e


def test_1_one_turn_answer_and_memory_extractor(gateway, main_script, agents, tmp_path):
    main_script(Reply(text="Polar answer one."))
    run = agents.run("qwen-code", "Say hi.")
    assert run.returncode == 0, run.explain()
    assert "Polar answer one." in run.stdout, run.explain()
    records = session_records(gateway, run.session)
    assert {(r["protocol"], r["host"]) for r in records} == {("openai_chat", "dashscope.aliyuncs.com")}
    # After a completed main turn Qwen runs its memory extractor: a sub-agent with its own read-only tool set, same
    # session, same proxy credentials. A plain answer ends it.
    side = main_script.side_responses()
    assert len(side) == 1 and len(records) == 2
    body = main_script.request_body(side[0])
    assert "Managed memory directory" in str(body["messages"][-1]["content"])
    assert side[0].finish_reason == "stop" and not side[0].tool_calls
    processed = process_session(gateway, run.session, tmp_path / "out")
    main_ids = [r["id"] for r in records if r["completion_token_ids"] is not None
                and token_ids(r, "completion_token_ids") == main_script.main_responses()[0].completion_ids]
    picked = [s for s in processed.sequences if "side_chain" not in s["flags"]]
    assert len(picked) == 1
    if picked[0]["call_ids"] != main_ids:
        # Two one-call chains: docs/merge-rules.md rule 9 breaks the tie on trainable tokens, so an extractor answer
        # longer than the main answer is the main chain by contract. Check that it is exactly that tie-break.
        [main_seq] = [s for s in processed.sequences if s["call_ids"] == main_ids]
        assert main_seq["n_calls"] == picked[0]["n_calls"] == 1
        assert picked[0]["n_trainable"] >= main_seq["n_trainable"]
        return
    check_merge(processed, main_script, len(records))


def test_2_run_shell_command_session_merges(gateway, main_script, agents, tmp_path):
    script_tool_session(main_script, "run_shell_command", {"command": SHELL_COMMAND},
                        "The command printed the number. Done.")
    run = agents.run("qwen-code", "Run a shell command and tell me what it printed.")
    assert run.returncode == 0, run.explain()
    assert "The command printed the number. Done." in run.stdout, run.explain()
    check_tool_session(main_script)
    records = session_records(gateway, run.session)
    main = check_merge(process_session(gateway, run.session, tmp_path / "out"), main_script, len(records))
    assert main["n_calls"] == TOOL_TURNS + 1
