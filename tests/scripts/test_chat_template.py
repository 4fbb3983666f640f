"""The shipped ChatML-with-tools template and the offline tokenizer.

1.x  the template is append-only: the prompt for turn k, plus the assistant's own turn text and <|im_end|>, is a
     prefix of every later prompt (tool calls with string/dict, compact/spaced arguments, reasoning, mid-conversation
     system, parallel calls, tool results, list-of-parts content, thinking on/off).
2.x  rendering details (tools block, argument canonicalisation, generation prompt, errors).
3.x  the tokenizer: special tokens are single ids, round trips, the build is deterministic and stamped.
"""

from __future__ import annotations

import json
import subprocess
import sys

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.chat_template import BUILD_SCRIPT, Tokenizer, render

pytestmark = pytest.mark.unit

TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Run a command",
                                      "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                     "required": ["command"]}}},
    {"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}}}}},
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer()


# ---- strategies ---------------------------------------------------------------------------------------------

text = st.text(alphabet=st.sampled_from(list("abc xyz\n{}\"é→😀.")), min_size=0, max_size=24)
nonempty = text.filter(lambda s: s.strip() != "")
args = st.dictionaries(st.sampled_from(["command", "path", "limit", "flag"]),
                       st.one_of(st.integers(-5, 500), text, st.booleans(), st.none()), max_size=3)


@st.composite
def content(draw):
    if draw(st.booleans()):
        return draw(nonempty)
    parts = draw(st.lists(nonempty, min_size=1, max_size=3))
    return [{"type": "text", "text": p} for p in parts]


@st.composite
def tool_call(draw, i):
    a = draw(args)
    style = draw(st.sampled_from(["dict", "compact", "spaced"]))
    if style == "dict":
        arguments = a
    elif style == "compact":
        arguments = json.dumps(a, separators=(",", ":"), ensure_ascii=False)
    else:
        arguments = json.dumps(a, indent=1)
    name = draw(st.sampled_from(["bash", "read_file"]))
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": arguments}}


@st.composite
def assistant(draw, i):
    m: dict = {"role": "assistant"}
    r = draw(st.sampled_from(["none", "reasoning_content", "reasoning"]))
    if r != "none":
        m[r] = draw(text)
    calls = draw(st.lists(tool_call(i), min_size=0, max_size=3))
    if calls:
        m["tool_calls"] = calls
        m["content"] = draw(st.one_of(st.none(), st.just(""), nonempty))
    else:
        m["content"] = draw(nonempty)
    return m


@st.composite
def conversation(draw):
    msgs: list[dict] = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(nonempty)})
    for i in range(draw(st.integers(1, 4))):
        if draw(st.integers(0, 3)) == 0:
            msgs.append({"role": "system", "content": draw(nonempty)})
        msgs.append({"role": "user", "content": draw(content())})
        a = draw(assistant(i))
        msgs.append(a)
        for c in a.get("tool_calls", []):
            msgs.append({"role": "tool", "tool_call_id": c["id"], "content": draw(content())})
    return msgs


def turn_text(m: dict) -> str:
    """What the model generates for an assistant message (independent of the template)."""
    out = ""
    reasoning = m.get("reasoning_content", m.get("reasoning"))
    body = m.get("content") or ""
    if isinstance(body, list):
        body = "\n".join(p["text"] for p in body)
    if reasoning is not None:
        out += "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n"
        body = body.lstrip("\n")
    calls = m.get("tool_calls") or []
    if calls:
        body = body.rstrip("\n")
    out += body
    for i, c in enumerate(calls):
        a = c["function"]["arguments"]
        a = json.loads(a) if isinstance(a, str) else a
        out += ("\n" if i or body else "") + "<tool_call>\n" + json.dumps(
            {"name": c["function"]["name"], "arguments": a}, ensure_ascii=False) + "\n</tool_call>"
    return out


# ---- 1.x the prefix property ----------------------------------------------------------------------------------

@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversation(), with_tools=st.booleans(), think_a=st.sampled_from([None, True, False]),
       think_b=st.sampled_from([None, True, False]))
def test_1_1_template_is_append_only(conv, with_tools, think_a, think_b):
    tools = TOOLS if with_tools else None
    kw_a = {} if think_a is None else {"enable_thinking": think_a}
    kw_b = {} if think_b is None else {"enable_thinking": think_b}
    full = render(conv, tools, add_generation_prompt=False, **kw_b)
    for k, m in enumerate(conv):
        if m["role"] != "assistant":
            continue
        before = render(conv[:k], tools, add_generation_prompt=True, **kw_a)
        expected = before + turn_text(m) + "<|im_end|>"
        assert full.startswith(expected), (k, expected[len(before):], full[len(before):len(expected) + 20])
        longer = render(conv[: k + 1], tools, add_generation_prompt=True, **kw_b)
        assert longer.startswith(expected)


def test_1_2_thinking_kwarg_changes_nothing():
    conv = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo", "reasoning_content": "think"},
            {"role": "user", "content": "again"}]
    base = render(conv)
    assert render(conv, enable_thinking=False) == base == render(conv, enable_thinking=True)
    assert base.endswith("<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n")


def test_1_3_compact_and_spaced_arguments_render_the_same():
    def conv(arguments):
        return [{"role": "user", "content": "go"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "1", "type": "function", "function": {"name": "bash", "arguments": arguments}}]}]
    a = {"command": "ls -la", "n": 2, "path": "é"}
    renders = {render(conv(x), TOOLS, add_generation_prompt=False)
               for x in (a, json.dumps(a), json.dumps(a, separators=(",", ":")), json.dumps(a, indent=2))}
    assert len(renders) == 1
    assert '{"name": "bash", "arguments": {"command": "ls -la", "n": 2, "path": "é"}}' in renders.pop()


# ---- 2.x rendering details ------------------------------------------------------------------------------------

def test_2_1_tools_block_in_first_system_turn():
    out = render([{"role": "system", "content": "Be nice."}, {"role": "user", "content": "hi"}], TOOLS)
    assert out.startswith("<|im_start|>system\nBe nice.\n\n# Tools\n")
    assert '\n{"type": "function", "function": {"name": "read_file", "parameters": {' in out
    assert out.count("<|im_start|>system") == 1
    no_sys = render([{"role": "user", "content": "hi"}], TOOLS)
    assert no_sys.startswith("<|im_start|>system\n# Tools\n")


def test_2_2_tool_null_description_is_omitted():
    tools = [{"type": "function", "function": {"name": "x", "description": None, "parameters": None}}]
    out = render([{"role": "user", "content": "hi"}], tools)
    assert '{"type": "function", "function": {"name": "x", "parameters": {}}}' in out


def test_2_3_generation_prompt_is_exactly_the_assistant_header():
    conv = [{"role": "user", "content": "hi"}]
    assert render(conv) == render(conv, add_generation_prompt=False) + "<|im_start|>assistant\n"


def test_2_4_consecutive_tool_results_share_one_user_turn():
    conv = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "bash", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "one"},
            {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "two"}]}]
    out = render(conv, TOOLS)
    assert out.endswith("<|im_start|>user\n<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n"
                        "</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_2_5_text_parts_join_with_newlines_and_images_render_a_placeholder():
    conv = [{"role": "user", "content": [{"type": "text", "text": "see "},
                                         {"type": "image_url", "image_url": {"url": "data:x"}}]}]
    assert "<|im_start|>user\nsee \n[image]<|im_end|>" in render(conv)
    # vLLM detects this template as "string" format and joins text parts with "\n" before rendering: same prompt.
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert render(parts) == render([{"role": "user", "content": "a\nb"}])


def test_2_6_mid_conversation_system_stays_in_place():
    conv = [{"role": "system", "content": "A"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"}, {"role": "system", "content": "B"},
            {"role": "developer", "content": "C"}, {"role": "user", "content": "again"}]
    out = render(conv, TOOLS)
    assert ("<|im_start|>assistant\nyo<|im_end|>\n<|im_start|>system\nB<|im_end|>\n<|im_start|>system\nC<|im_end|>\n"
            "<|im_start|>user\nagain<|im_end|>\n") in out


@pytest.mark.parametrize("conv, error", [
    ([{"role": "wizard", "content": "x"}], jinja2.TemplateError),
    ([{"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "bash", "arguments": "{not json"}}]}], ValueError),
])
def test_2_7_bad_input_raises(conv, error):
    with pytest.raises(error):
        render(conv)


# ---- 3.x the tokenizer ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("special", ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                                     "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"])
def test_3_1_special_tokens_encode_to_single_ids(tok, special):
    ids = tok.encode(f"a{special}b")
    assert tok.token_to_id(special) in ids
    assert tok.encode(special) == [tok.token_to_id(special)]


@settings(max_examples=50, deadline=None)
@given(s=st.text(max_size=200))
def test_3_2_encode_decode_round_trip(tok, s):
    assert tok.decode(tok.encode(s)) == s


def test_3_3_eos_and_special_flags(tok):
    assert tok.eos_id == tok.token_to_id("<|im_end|>")
    assert tok.eos_id in tok.eos_ids
    assert tok.token_to_id("<|im_start|>") in tok.special_ids
    # reasoning and tool tags survive skip_special_tokens, as vLLM's parsers need them in text
    ids = tok.encode("<|im_start|><think>x</think><tool_call>{}</tool_call><|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "<think>x</think><tool_call>{}</tool_call>"
    assert 2000 <= tok.vocab_size <= 4096


def test_3_4_chat_template_ids_match_text(tok):
    conv = [{"role": "user", "content": "list files"}]
    ids = tok.apply_chat_template(conv, TOOLS)
    assert tok.decode(ids) == render(conv, TOOLS)
    header = tok.encode("<|im_start|>assistant\n")
    assert ids[-len(header):] == header and header[0] == tok.token_to_id("<|im_start|>")


def test_3_5_build_is_deterministic_and_stamped(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        subprocess.run([sys.executable, str(BUILD_SCRIPT), str(out)], check=True, capture_output=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    before = (a / "tokenizer.json").stat().st_mtime_ns
    done = subprocess.run([sys.executable, str(BUILD_SCRIPT), str(a)], check=True, capture_output=True, text=True)
    assert done.stdout == "" and (a / "tokenizer.json").stat().st_mtime_ns == before
    config = json.loads((a / "tokenizer_config.json").read_text())
    assert config["chat_template"] == (BUILD_SCRIPT.parent / "chatml_tools.jinja").read_text()
    assert config["eos_token"] == "<|im_end|>"
