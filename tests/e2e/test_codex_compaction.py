"""Codex (real CLI, 0.171) compacts through the gateway: with its auto-compaction limit low, after one tool turn it
sends a Responses request whose input ends in a `compaction_trigger` item (remote compaction v2); the gateway has the
model write the summary and answers with one `compaction` item, which Codex sends back at the head of its next
request. The records hold the summary call like any other; polar-process recognises it by rule 12 (the summary
reappears where the prefix broke) and keeps the calls after it in the session's main chain: `--compaction train`
trains the summary under the session's advantage, `mask` leaves its tokens out."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import process_session, session_records, tool_turn
from tests.support.scripted_upstream import Reply

pytestmark = pytest.mark.e2e

SUMMARY = ("The user asked to list the numbers from one to four hundred. The shell command seq 1 400 ran once and "
           "printed every number; nothing is left to do but to report that the list was printed.")
FINAL = "The numbers were listed."


def test_codex_auto_compaction_is_served_recorded_and_recognised(gateway, main_script, agents, tmp_path):
    code = "const r = await tools.exec_command({cmd: %s}); text(r.output);" % json.dumps("seq 1 400")
    main_script(tool_turn("exec", {"input": code}), Reply(text=SUMMARY), Reply(text=FINAL))
    run = agents.run("codex", "List the numbers from 1 to 400.", cli_args=("-c", "model_auto_compact_token_limit=1500"))
    assert run.returncode == 0 and FINAL in run.stdout, run.explain()
    records = session_records(gateway, run.session)
    assert len(records) == 3, run.explain()
    tool, summary, after = main_script.main_requests()
    assert summary["messages"][-1]["content"].startswith("Summarise the conversation") and summary["tool_choice"] == \
        "none"
    assert "compaction_request" in records[1]["normalizations"]
    assert any(SUMMARY in str(m.get("content")) for m in after["messages"]), after["messages"]

    rewards = tmp_path / "rewards.jsonl"
    rewards.write_text(json.dumps({"session": run.session, "reward": 1.0, "group": None}) + "\n")
    spans = {}
    for mode in ("train", "mask"):
        done = process_session(gateway, run.session, tmp_path / mode, ["--rewards", str(rewards), "--compaction", mode])
        by_call = {span["call_id"]: (seq, span) for seq in done.sequences for span in seq["call_spans"]}
        seq, span = by_call[records[1]["id"]]
        assert "compaction" in seq["flags"], done.sequences
        assert [e["call_id"] for e in done.report["flag_events"] if e["cause"] == "compaction"] == [records[1]["id"]]
        later, _ = by_call[records[2]["id"]]  # the call after the summary: in the output, in the main chain
        assert "side_chain" not in later["flags"] and later["reward"] == 1.0
        spans[mode] = seq["loss_mask"][span["start"]:span["end"]]
    assert set(spans["train"]) == {1} and set(spans["mask"]) == {0}
