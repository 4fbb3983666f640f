"""The backend stream reader and backend error classification (no sockets)."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from polar.addon.codecs.base import GatewayError
from polar.addon.stream_reader import StreamReader, classify_backend_error, cut_prompt_ids

pytestmark = pytest.mark.unit


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


def test_2_7_sglang_sglext_output_ids_are_one_list_per_choice():
    """SGLang 0.5.23 (protocol.py: `SglExt.output_ids: Optional[List[List[int]]]`) sends the sampled ids as one list
    per choice; the gateway asks for one choice, so the record's completion ids are choice 0's list (a flat list,
    as some servers send, is taken as it is)."""
    chunks = [{"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "matched_stop": 2}]},
              {"choices": [], "sglext": {"input_ids": [1, 2, 3], "output_ids": [[7, 8, 2]]}}]
    raw = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    reader = StreamReader(False)
    reader.feed(raw)
    assert (reader.prompt_token_ids, reader.completion_token_ids) == ([1, 2, 3], [7, 8, 2])
    flat = raw.replace(b"[[7,8,2]]", b"[7,8,2]")
    reader = StreamReader(False)
    reader.feed(flat)
    assert reader.completion_token_ids == [7, 8, 2]


# -- 4. prompt ids kept as the backend's bytes ------------------------------------------------------------------------


def _feed_all(raw: bytes) -> StreamReader:
    reader = StreamReader(keep_logprob_entries=False)
    reader.feed(raw)
    return reader


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**31 - 1), max_size=200))
def test_4_1_a_compact_prompt_array_is_cut_out_as_bytes_and_reads_back_as_the_same_ids(prompt):
    raw = vllm_stream(prompt, [({"content": "hi"}, [7, 8])])
    reader = _feed_all(raw)
    assert reader.prompt_ids_path == "fast"
    assert reader.prompt_ids_ascii == ",".join(map(str, prompt)).encode()
    assert reader.prompt_count() == len(prompt) and reader.completion().prompt_tokens == len(prompt)
    assert reader.prompt_token_ids == prompt  # decoded on first use
    assert reader.completion_token_ids == [7, 8] and reader.completion().content == "hi"


@pytest.mark.parametrize("first_chunk, why", [
    (b'{"id":"c","prompt_token_ids":[1, 2, 3],"choices":[]}', "spaces after the commas"),
    (b'{"id":"c","prompt_token_ids":[[1,2],[3]],"choices":[]}', "nested lists"),
    (b'{"id":"c","prompt_token_ids":[1,2,-3],"choices":[]}', "a sign"),
    (b'{"id":"c","prompt_token_ids":[1,2.0,3],"choices":[]}', "a float"),
])
def test_4_2_anything_but_digits_and_commas_takes_todays_path(first_chunk, why):
    raw = b"data: " + first_chunk + b"\n\n"
    reader = StreamReader(keep_logprob_entries=False)
    reader.feed(raw)
    assert reader.prompt_ids_ascii is None, why
    assert reader.prompt_ids_path == "parsed"
    assert reader.prompt_token_ids == [x for x in orjson.loads(first_chunk)["prompt_token_ids"]]


def test_4_3_the_key_inside_a_string_is_not_an_array_and_a_torn_chunk_is_not_cut():
    sneaky = {"id": "c", "choices": [{"index": 0, "delta": {"content": '"prompt_token_ids":[6,6,6]'},
                                      "finish_reason": None}], "prompt_token_ids": [1, 2]}
    reader = _feed_all(b"data: " + orjson.dumps(sneaky) + b"\n\n")
    assert reader.prompt_token_ids == [1, 2] and reader.content == ['"prompt_token_ids":[6,6,6]']
    assert cut_prompt_ids(b'{"prompt_token_ids":[1,2,3') is None  # no closing bracket: parsed whole, and fails there
    assert cut_prompt_ids(b'{"prompt_token_ids":[]}') == (b'{"prompt_token_ids":null}', b"")
    with pytest.raises(GatewayError, match="malformed JSON"):
        _feed_all(b'data: {"prompt_token_ids":[1,2,3\n\n')  # a torn chunk is malformed JSON: an error, no ids


def test_4_4_sglang_trailing_input_ids_take_the_fast_path_too():
    last = {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "sglext": {"input_ids": [5, 6, 7], "output_ids": [[8, 9]]}}
    reader = _feed_all(b"data: " + orjson.dumps(last) + b"\n\ndata: [DONE]\n\n")
    assert reader.prompt_ids_path == "fast" and reader.prompt_token_ids == [5, 6, 7]
    assert reader.completion_token_ids == [8, 9]
