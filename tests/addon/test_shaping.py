"""Upstream shaping: the exact body sent to the backend (no sockets)."""

from __future__ import annotations

import pytest

from polar.addon.shaping import BackendInfo, prompt_size_bound, shape

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


def test_1_2b_seed_per_call_is_one_seed_per_session_and_prompt_and_is_recorded():
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    over = {"seed_per_call": 7}
    a, again = (shaped(dict(chat), sampling_override=over, session="run/t/0") for _ in range(2))
    other_sample = shaped(dict(chat), sampling_override=over, session="run/t/1")
    next_turn = shaped({"messages": [*chat["messages"], {"role": "assistant", "content": "x"}]},
                       sampling_override=over, session="run/t/0")
    other_base = shaped(dict(chat), sampling_override={"seed_per_call": 8}, session="run/t/0")
    seeds = [s.body["seed"] for s in (a, other_sample, next_turn, other_base)]
    assert again.body["seed"] == a.body["seed"] and len(set(seeds)) == 4, seeds
    assert all(0 <= x < 2 ** 31 for x in seeds) and "seed_per_call" not in a.body
    assert a.sampling["seed"] == a.body["seed"] and a.sampling["override"] == over
    assert a.normalizations == ["sampling_override:seed_per_call=7"]


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
