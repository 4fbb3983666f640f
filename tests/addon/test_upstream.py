"""Upstream shaping and the backend stream reader (no sockets)."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from polar.addon.upstream import (BackendInfo, StreamReader, classify_backend_error,
                                  prompt_size_bound, shape)

pytestmark = pytest.mark.unit

VLLM = BackendInfo(kind="vllm", version="0.32.0", model="tiny", max_model_len=4096)


def shaped(chat, **kw):
    args = dict(backend=VLLM, agent_top_logprobs=None, logprobs_mode="raw_logprobs", sampling_override={},
                thinking=None, thinking_kwarg=None, prompt_len=None)
    args.update(kw)
    return shape(chat, **args)


def test_1_1_token_ids_logprobs_stream_usage_and_explicit_sampling():
    s = shaped({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10})
    b = s.body
    assert b["stream"] is True and b["stream_options"] == {"include_usage": True}
    assert b["logprobs"] is True and b["top_logprobs"] == 0 and b["return_token_ids"] is True
    assert (b["temperature"], b["top_p"], b["top_k"]) == (1.0, 1.0, -1)
    assert b["model"] == "tiny" and "return_weight_versions" not in b
    assert s.sampling["logprobs_mode"] == "raw_logprobs" and s.sampling["max_tokens_requested"] == 10


def test_1_2_agent_sampling_is_kept_and_override_wins_and_is_noted():
    s = shaped({"messages": [], "temperature": 0.2, "top_k": 5}, sampling_override={"temperature": 1.6})
    assert s.body["temperature"] == 1.6 and s.body["top_k"] == 5
    assert "sampling_override:temperature=1.6" in s.normalizations
    assert s.sampling["override"] == {"temperature": 1.6}


def test_1_3_empty_tools_and_orphan_tool_choice_are_dropped():
    s = shaped({"messages": [], "tools": [], "tool_choice": "required"})
    assert "tools" not in s.body and "tool_choice" not in s.body
    assert "tool_choice_without_tools_dropped" in s.normalizations


def test_1_4_max_tokens_clamped_to_the_room_left():
    s = shaped({"messages": [], "max_tokens": 64000}, prompt_len=1000)
    assert s.body["max_tokens"] == 3096 and s.sampling["max_tokens_requested"] == 64000


def test_1_5_sglang_gets_headers_not_return_token_ids_and_new_vllm_gets_weight_versions():
    s = shaped({"messages": []}, backend=BackendInfo("sglang", "0.5.23", "m", None))
    assert "return_token_ids" not in s.body and s.headers["x-sglext-return-output-ids"] == "1"
    s = shaped({"messages": []}, backend=BackendInfo("vllm", "0.33.1", "m", None))
    assert s.body["return_weight_versions"] is True


def test_1_6_thinking_maps_only_with_the_kwarg_option():
    assert "chat_template_kwargs" not in shaped({"messages": []}, thinking=True).body
    b = shaped({"messages": []}, thinking=False, thinking_kwarg="enable_thinking").body
    assert b["chat_template_kwargs"] == {"enable_thinking": False}


def test_1_8_prompt_bound_is_an_upper_bound_of_bytes():
    chat = {"messages": [{"role": "user", "content": "x" * 1000}]}
    assert prompt_size_bound(chat) > 1000


def vllm_stream(prompt, pieces, finish="stop", stop_reason=None):
    """A vLLM-shaped SSE stream: pieces = [(delta dict, token ids)]."""
    chunks = [{"id": "c", "object": "chat.completion.chunk", "model": "tiny", "prompt_token_ids": prompt,
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None}]}]
    for i, (delta, ids) in enumerate(pieces):
        last = i == len(pieces) - 1
        chunks.append({"id": "c", "model": "tiny", "choices": [{
            "index": 0, "delta": delta, "token_ids": ids,
            "logprobs": {"content": [{"token": f"t{t}", "logprob": -0.5, "bytes": [], "top_logprobs": []}
                                     for t in ids]},
            "finish_reason": finish if last else None, "stop_reason": stop_reason if last else None}]})
    n = sum(len(ids) for _, ids in pieces)
    chunks.append({"id": "c", "choices": [], "usage": {"prompt_tokens": len(prompt), "completion_tokens": n,
                                                       "total_tokens": len(prompt) + n}})
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=50), max_size=30))
def test_2_1_reader_is_indifferent_to_rechunking(cuts):
    raw = vllm_stream([1, 2, 3], [({"reasoning": "hm"}, [7]), ({"content": "Hel"}, [8, 9]), ({"content": "lo"}, [10]),
                                  ({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                    "function": {"name": "ls", "arguments": ""}}]}, [11]),
                                  ({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1}'}}]}, [12, 13])],
                      finish="tool_calls")
    reader = StreamReader(keep_logprob_entries=False)
    pos = 0
    deltas = []
    for cut in cuts:
        deltas += reader.feed(raw[pos:pos + cut])
        pos += cut
    deltas += reader.feed(raw[pos:])
    c = reader.completion()
    assert reader.done and reader.prompt_token_ids == [1, 2, 3]
    assert reader.completion_token_ids == [7, 8, 9, 10, 11, 12, 13] and reader.logprobs == [-0.5] * 7
    assert c.content == "Hello" and c.reasoning == "hm" and c.finish_reason == "tool_calls"
    assert [(t.id, t.name, t.arguments) for t in c.tool_calls] == [("call_1", "ls", '{"a": 1}')]
    assert (c.prompt_tokens, c.completion_tokens) == (3, 7)
    assert "".join(d.text for d in deltas) == "Hello"


def test_2_2_empty_delta_chunks_still_carry_ids():
    raw = vllm_stream([1], [({}, [5, 6]), ({"content": "x"}, [7])])
    reader = StreamReader(keep_logprob_entries=False)
    reader.feed(raw)
    assert reader.completion_token_ids == [5, 6, 7]


def test_2_3_garbage_and_error_events_raise():
    from polar.addon.codecs.base import GatewayError

    with pytest.raises(GatewayError):
        StreamReader(False).feed(b"data: {not json}\n\n")
    with pytest.raises(GatewayError):
        StreamReader(False).feed(b'data: {"error": {"message": "boom"}}\n\n')


def test_3_1_backend_errors_classify_per_the_design_table():
    ctx = b'{"error":{"message":"This model\'s maximum context length is 4096 tokens. However, you requested 5000"}}'
    assert classify_backend_error(400, ctx).kind == "context_overflow"
    assert classify_backend_error(429, b"").kind == "rate_limited"
    assert classify_backend_error(400, b'{"error":{"message":"bad tool"}}').kind == "bad_request"
    assert classify_backend_error(503, b"").kind == "unavailable"
    assert classify_backend_error(500, b"<html>").kind == "unavailable"


def test_2_4_forced_call_streamed_as_content_becomes_tool_calls():
    raw = vllm_stream([1], [({"content": '[{"name": "ls", '}, [5]), ({"content": '"parameters": {"p": "."}}]'}, [6])],
                      finish="tool_calls")
    reader = StreamReader(False, forced_tool_choice="required", call_id_prefix="call_x")
    deltas = reader.feed(raw)
    assert "".join(d.text for d in deltas) == ""
    calls = [tc for d in deltas for tc in d.tool_calls]
    assert [(c.id, c.name, c.arguments) for c in calls] == [("call_x_0", "ls", '{"p":"."}')]
    c = reader.completion()
    assert c.content == "" and c.tool_calls[0].name == "ls" and reader.forced_from_content


def test_2_5_forced_named_call_and_non_json_text_is_released():
    named = {"type": "function", "function": {"name": "get"}}
    reader = StreamReader(False, forced_tool_choice=named)
    deltas = reader.feed(vllm_stream([1], [({"content": '{"a": 1}'}, [5])], finish="stop"))
    assert [(tc.name, tc.arguments) for d in deltas for tc in d.tool_calls] == [("get", '{"a":1}')]
    reader = StreamReader(False, forced_tool_choice="required")
    deltas = reader.feed(vllm_stream([1], [({"content": "no json"}, [5])], finish="stop"))
    assert "".join(d.text for d in deltas) == "no json" and reader.completion().tool_calls == ()


def test_2_6_forced_call_with_real_tool_deltas_passes_text_through():
    raw = vllm_stream([1], [({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                              "function": {"name": "ls", "arguments": "{}"}}]}, [5])],
                      finish="tool_calls")
    reader = StreamReader(False, forced_tool_choice="required")
    reader.feed(raw)
    assert not reader.forced_from_content and reader.completion().tool_calls[0].id == "c1"
