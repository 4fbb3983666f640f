"""Scenarios for processor/merge.py: docs/merge-rules.md rules 1–4 and 6–9, on hand-made token layouts."""

import json

import numpy as np
import pytest

from polar.processor.merge import MissingEot, ChainAssignment, merge_group, route_calls, route_calls_naive
from tests.processor.calls import EOT, call, eot_for

pytestmark = pytest.mark.unit

P1 = [1, 9, 9, 5]
C1 = [20, 21, EOT]
TAIL1 = [6, 30, EOT, 5]  # tool message + generation prompt
P2 = P1 + [20, 21, EOT] + TAIL1
C2 = [22, EOT]


def merged(calls, **kw):
    kw.setdefault("mode", "prefix_merging")
    kw.setdefault("eot_for", eot_for)
    return merge_group(calls, **kw)


def only(res, **match):
    hits = [s for s in res.sequences if all(getattr(s, k) == v for k, v in match.items())]
    assert len(hits) == 1, hits
    return hits[0]


def test_1_1_chain_merges_into_one_sequence_with_interstitial_at_mask_0():
    a, b = call(P1, C1), call(P2, C2)
    res = merged([a, b])
    (s,) = res.sequences
    assert s.input_ids.tolist() == P1 + C1 + TAIL1 + C2
    assert s.loss_mask.tolist() == [0] * 4 + [1] * 3 + [0] * 4 + [1] * 2
    assert s.logprobs.tolist() == [0.0] * 4 + [-0.5] * 3 + [0.0] * 4 + [-0.5] * 2
    assert s.call_ids == [a.id, b.id] and s.sequence_id == a.id == s.chain_id
    assert s.break_cause is None and s.flags == [] and s.prompt_len == 4
    assert res.breaks == [] and res.placement[b.id] == (a.id, a.id)


def test_1_2_per_request_gives_one_sequence_per_call():
    a, b = call(P1, C1), call(P2, C2)
    res = merged([a, b], mode="per_request")
    assert [s.call_ids for s in res.sequences] == [[a.id], [b.id]]
    assert res.sequences[1].input_ids.tolist() == P2 + C2
    assert {s.chain_id for s in res.sequences} == {a.id}


def test_1_3_retry_supersedes_the_earlier_call_without_a_break():
    a, retry1, retry2 = call(P1, [40, EOT]), call(P1, C1), call(P2, C2)
    res = merged([a, retry1, retry2])
    main = only(res, sequence_id=retry1.id)
    assert main.call_ids == [retry1.id, retry2.id] and main.flags == []
    sup = only(res, sequence_id=a.id)
    assert sup.flags == ["superseded"] and sup.chain_id == retry1.id and sup.input_ids.tolist() == P1 + [40, EOT]
    assert res.breaks == []


def test_1_4_truncated_turn_takes_the_template_eot_at_mask_0():
    a = call(P1, [20, 21], finish="length")
    b = call(P2, C2)
    (s,) = merged([a, b]).sequences
    assert s.input_ids.tolist() == P1 + [20, 21] + [EOT] + TAIL1[:-1] + [5] + C2
    assert s.loss_mask.tolist() == [0] * 4 + [1, 1] + [0] * 5 + [1, 1]
    assert s.flags == ["truncated_turn"]


def test_1_5_turn_without_eot_and_other_finish_is_aborted():
    a = call(P1, [20, 21], finish="stop", stop_reason="</x>")
    (s,) = merged([a, call(P2, C2)]).sequences
    assert "aborted_turn" in s.flags


def test_1_6_no_eot_in_tail_breaks_but_keeps_everything():
    p2 = P1 + [20, 21, 7, 6, 30, 5]  # the template closed the turn with something other than an id in E
    a, b = call(P1, C1), call(p2, C2)
    res = merged([a, b])
    first, second = res.sequences
    assert first.call_ids == [a.id] and second.call_ids == [b.id]
    assert second.break_cause == "no_eot_in_tail" and second.chain_id == a.id
    assert second.input_ids.tolist() == p2 + C2 and second.loss_mask[:len(p2)].sum() == 0
    (br,) = res.breaks
    assert (br.cause, br.call_id, br.token_pos, br.chain_id) == ("no_eot_in_tail", b.id, len(P1), a.id)


def test_1_7_context_mismatch_merges_by_default_and_splits_on_request():
    p2 = P1 + [20, 99, EOT] + TAIL1  # the template re-rendered the sampled turn differently
    a, b = call(P1, C1), call(p2, C2)
    (s,) = merged([a, b]).sequences
    assert s.flags == ["context_mismatch"] and s.input_ids.tolist() == P1 + C1 + TAIL1 + C2
    res = merged([a, b], on_mismatch="split")
    assert [x.break_cause for x in res.sequences] == [None, "context_mismatch"]
    assert res.breaks[0].token_pos == len(P1)


def test_1_8_compaction_is_prefix_diverged_and_counts_with_the_chain_it_left():
    a, b = call(P1, C1), call(P2, C2)
    compacted = P2[:len(P1) + 3] + [4, 77, EOT, 5]  # keeps the first exchange, then a summary
    c = call(compacted, [50, EOT])
    side = call([1, 8, 5], [60, EOT])
    side2 = call([1, 8, 5, 60, EOT, 6, 1, EOT, 5], [61, EOT])
    side3 = call([1, 8, 5, 60, EOT, 6, 1, EOT, 5, 61, EOT, 6, 2, EOT, 5], [62, EOT])
    res = merged([a, b, side, side2, side3, c])
    (br,) = res.breaks
    assert (br.cause, br.chain_id, br.call_id, br.token_pos) == ("prefix_diverged", a.id, c.id, len(P1) + 3)
    assert only(res, sequence_id=c.id).break_cause == "prefix_diverged"
    # the main lineage is a's chain plus c's chain (3 calls) over the side agent (3 calls): a tie; neither offers
    # tools, so the longer first prompt (a's) decides
    assert {s.sequence_id for s in res.sequences if "side_chain" not in s.flags} == {a.id, c.id}
    assert [x.id for x in res.sft_calls] == [c.id]


def test_1_9_side_chain_is_flagged_and_main_chain_has_most_calls():
    a, side, b = call(P1, C1), call([1, 8, 5], [60, EOT]), call(P2, C2)
    res = merged([a, side, b])
    assert only(res, sequence_id=side.id).flags == ["side_chain"]
    assert only(res, sequence_id=a.id).flags == []


def test_1_10_null_group_treats_every_chain_as_main():
    a, side = call(P1, C1, session=None), call([1, 8, 5], [60, EOT], session=None)
    res = merged([a, side], null_group=True)
    assert all("side_chain" not in s.flags for s in res.sequences) and len(res.sft_calls) == 2


def test_1_11_missing_logprobs_nulls_the_row():
    (s,) = merged([call(P1, C1), call(P2, C2, logprobs=False)]).sequences
    assert s.logprobs is None and "missing_logprobs" in s.flags


def test_1_12_calls_without_ids_stay_out_of_sequences():
    err = call(P1, None, finish=None)
    res = merged([err, call(P1, C1)])
    assert err.id not in res.placement and len(res.sequences) == 1


def test_1_13_model_change_starts_a_new_sequence():
    res = merged([call(P1, C1), call(P2, C2, model="other")])
    assert [s.break_cause for s in res.sequences] == [None, "model_changed"]


def test_1_14_prefix_merging_without_eot_set_raises():
    with pytest.raises(MissingEot):
        merge_group([call(P1, C1), call(P2, C2)], mode="prefix_merging", eot_for=lambda m: None)


def test_2_1_routing_ties_go_to_the_tip_that_started_last():
    prompts = [[1, 2], [1, 3], [1, 2, 3]]  # both tips have length 2, only [1,2] is a prefix
    as_bytes = [np.array(p, dtype="<i4").tobytes() for p in prompts]
    assert route_calls(as_bytes) == route_calls_naive(prompts) == [
        ChainAssignment("open", 0), ChainAssignment("open", 1), ChainAssignment("join", 0)]


def test_2_2_exact_tip_replaces_before_extension():
    prompts = [[1], [1, 2], [1, 2], [1]]
    as_bytes = [np.array(p, dtype="<i4").tobytes() for p in prompts]
    expect = [ChainAssignment("open", 0), ChainAssignment("join", 0), ChainAssignment("replace", 0, replaced=1),
              ChainAssignment("open", 1, diverged_from=0, diverged_pos=1)]
    assert route_calls(as_bytes) == route_calls_naive(prompts) == expect


# -- 9. rule 9's tie-break (issue 13 item 13) ----------------------------------------------------------------------

def body(n_tools: int, messages=()) -> bytes:
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "parameters": {"type": "object"}}}
             for i in range(n_tools)]
    return json.dumps({"messages": list(messages), "tools": tools}).encode()


def one_call_chain(lead: int, tools: int, prompt_len: int, completion_len: int, t: float, messages=()):
    """A chain of one call; `lead` keeps its prompt from being a prefix of another chain's."""
    return call([1, lead, *[9] * (prompt_len - 3), 5], [*[20] * (completion_len - 1), EOT], t=t,
                body=body(tools, messages))


# Two one-call chains in one session, as Qwen Code's one turn + its memory extractor: (tools, prompt length,
# completion length, start) of the agent's call and of the other call, and which one rule 9 makes main.
TIE_BREAKS = {
    "most_tools_wins_over_more_trainable_tokens": ((11, 10, 2, 1.0), (0, 10, 60, 2.0), "agent"),
    "most_tools_wins_over_a_longer_first_prompt": ((11, 10, 2, 1.0), (0, 90, 60, 2.0), "agent"),
    "most_tools_wins_over_an_earlier_start": ((11, 10, 2, 2.0), (2, 90, 60, 1.0), "agent"),
    "same_tools_longest_first_prompt": ((3, 10, 2, 1.0), (3, 11, 2, 2.0), "other"),
    "same_tools_and_prompt_earliest_start": ((3, 10, 50, 2.0), (3, 10, 2, 1.0), "other"),
}


@pytest.mark.parametrize("name", TIE_BREAKS)
def test_9_1_main_chain_ties_go_to_most_tools_then_longest_first_prompt_then_earliest_start(name):
    agent_spec, other_spec, want = TIE_BREAKS[name]
    agent, other = one_call_chain(40, *agent_spec), one_call_chain(41, *other_spec)
    res = merged(sorted([agent, other], key=lambda c: c.t_start))
    main_call = agent if want == "agent" else other
    assert res.n_chains == 2
    assert [s.sequence_id for s in res.sequences if "side_chain" not in s.flags] == [main_call.id]
    assert [c.id for c in res.sft_calls] == [main_call.id]


def test_9_2_qwen_code_one_turn_with_memory_extractor_picks_the_agents_chain():
    """The agent's request as Qwen Code sent it (../shared/captures, read here, never copied), then a memory
    extractor over the same conversation: no tools, a longer prompt, a longer answer."""
    from tests.support.captures import capture_files

    files = [f for f in capture_files("qwen-code") if "turn1" in f]
    if not files:
        pytest.skip("no Qwen Code capture in ../shared/captures")
    with open(files[0], encoding="utf-8") as fh:
        agent_body = json.load(fh)["body"]
    assert len(agent_body["tools"]) > 0
    extractor_body = {"model": agent_body.get("model"), "stream": True,
                      "messages": [*agent_body["messages"], {"role": "user", "content": "Extract memories as JSON."}]}
    agent = call([1, 40, *[9] * 30, 5], [20, 21, EOT], t=1.0, body=json.dumps(agent_body).encode())
    extractor = call([1, 41, *[9] * 60, 5], [*[30] * 80, EOT], t=2.0, body=json.dumps(extractor_body).encode())
    res = merged([agent, extractor])
    assert only(res, sequence_id=extractor.id).flags == ["side_chain"]
    assert only(res, sequence_id=agent.id).flags == [] and [c.id for c in res.sft_calls] == [agent.id]
    assert agent.n_tools == len(agent_body["tools"]) and extractor.n_tools == 0
