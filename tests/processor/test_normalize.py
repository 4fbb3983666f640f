"""Scenarios for processor/normalize.py: the calls row comes from upstream_request, never a codec."""

import json

import numpy as np
import orjson
import pytest
from hypothesis import given, settings, strategies as st

from polar import records as rec
from polar.processor.load import InputError
from polar.processor.normalize import AsciiPrompts, to_call
from tests.processor.calls import record

pytestmark = pytest.mark.unit


def test_1_1_row_carries_messages_tools_and_assistant_as_json():
    body = orjson.dumps({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}],
                         "tool_choice": "required"})
    c = to_call(record([1, 2], [3, 2], body=body), "f.msgpack", 7)
    assert json.loads(c.row["messages"]) == [{"role": "user", "content": "hi"}]
    assert json.loads(c.row["tools"]) == [{"type": "function"}] and c.constrained
    assert (c.row["prompt_tokens"], c.row["completion_tokens"], c.row["source_offset"]) == (2, 2, 7)
    assert c.prompt.tolist() == [1, 2] and c.logprobs.tolist() == [-0.5, -0.5]


def test_1_2_missing_ids_make_a_call_ineligible_but_kept():
    c = to_call(record(None, None, finish=None), "f", 0)
    assert not c.eligible and c.row["prompt_tokens"] is None


def test_1_3_logprobs_of_the_wrong_length_count_as_missing():
    r = record([1], [3, 2])
    r["completion_logprobs"] = r["completion_logprobs"][:4]
    assert to_call(r, "f", 0).logprobs is None


def test_1_4_token_field_that_is_not_int32_is_an_input_error():
    r = record([1], [3])
    r["prompt_token_ids"] = b"\x01\x02\x03"
    with pytest.raises(InputError, match="offset 5"):
        to_call(r, "f", 5)


@pytest.mark.parametrize("written, body, expect", [
    (True, {"messages": []}, True),  # the gateway's field wins
    (False, {"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "sh"}}]}, False),
    (None, {"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "sh"}}]}, True),  # an older record: the gateway's rule on its upstream_request
    (None, {"tool_choice": {"type": "function", "function": {"name": "sh"}}, "tools": [{"type": "function", "function": {"name": "sh"}}]}, True),
    (None, {"response_format": {"type": "json_schema", "json_schema": {}}}, True),
    (None, {"response_format": {"type": "json_object"}}, False),  # asks for JSON, constrains no grammar
    (None, {"tool_choice": "auto"}, False),
], ids=["field_true", "field_false", "old_required", "old_named", "old_json_schema", "old_json_object", "old_auto"])
def test_1_5_constrained_is_the_records_field_else_the_gateways_rule(written, body, expect):
    r = record([1], [3, 2], body=orjson.dumps(body))
    r["constrained"] = written
    assert to_call(r, "f", 0).constrained is expect


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(min_value=0, max_value=2**31 - 1), max_size=12), min_size=1, max_size=8),
       st.lists(st.integers(min_value=0, max_value=7), max_size=8))
def test_2_1_ascii_prompts_decoded_past_an_earlier_prompt_equal_whole_decoding(pieces, order):
    """Prompts that extend earlier ones (agent turns), interleaved with unrelated ones, in any order; and the case
    where one prompt's digits are a prefix of another's but not at a comma (1,2 then 1,23)."""
    prompts = [sum(pieces[: k + 1], []) for k in range(len(pieces))]
    prompts += [prompts[i % len(prompts)] for i in order]  # repeats and going back
    prompts += [[1, 2], [1, 23], [12], [], [1, 2, 3]]
    decoder = AsciiPrompts(keep=4)
    for p in prompts:
        ext = rec.ascii_ids(",".join(map(str, p)).encode())
        got = decoder.decode(ext)
        assert got.dtype == np.dtype("<i4") and got.tolist() == p
    with pytest.raises(ValueError):
        decoder.decode(rec.ascii_ids(b"1,2,3,,4"))  # a malformed tail after a known prefix is still refused
