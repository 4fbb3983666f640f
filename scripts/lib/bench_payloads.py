"""Request bodies for scripts/bench_gateway: the captured agent bodies with every text replaced by filler.

The structure, sizes, tool schemas and field layout of the real Claude Code requests are kept; every prose string
(system text, message text, tool descriptions, tool inputs and results, thinking) becomes pseudo-words of the same
length, so no prompt text is used. Without ../shared/captures a generated body of similar size (~48 KB, 9 tools) is
used instead. The direct run sends the OpenAI chat body our own codec and shaping produce for the same request.
"""

from __future__ import annotations

import copy
import json
import os
import random

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CAPTURES = os.path.normpath(os.path.join(ROOT, "..", "shared", "captures", "claude-code"))
PACE_MARKER = "polar-bench-pace"  # in a body: the stub paces this stream (kept by every translation)
PROSE_KEYS = {"text", "description", "content", "thinking", "signature", "title"}
SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "en", "or", "da", "pe", "qu", "il", "ba", "zo"]


def filler(n: int, seed: int) -> str:
    """n characters of pseudo-words (deterministic per seed)."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n:
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4)))
        sep = "\n" if rng.random() < 0.05 else ("." if rng.random() < 0.05 else " ")
        out.append(word + sep)
        size += len(word) + 1
    return "".join(out)[:n]


def _scrub(node, seed: list[int], under_input: bool = False, key: str | None = None):
    """Replace prose strings: values of PROSE_KEYS and every string inside a tool call's `input`."""
    if isinstance(node, dict):
        return {k: _scrub(v, seed, under_input or k == "input", k) for k, v in node.items()}
    if isinstance(node, list):
        return [_scrub(v, seed, under_input, key) for v in node]
    if isinstance(node, str) and (key in PROSE_KEYS or key == "system" or under_input):
        seed[0] += 1
        return filler(len(node), seed[0])
    return node


def _generated_body() -> dict:
    tools = [{"name": f"tool_{i}", "description": filler(3000, 100 + i),
              "input_schema": {"type": "object", "properties": {"path": {"type": "string",
                                                                          "description": filler(200, 200 + i)}},
                               "required": ["path"]}} for i in range(9)]
    return {"model": "claude-opus-4-8", "max_tokens": 64000, "stream": True,
            "system": [{"type": "text", "text": filler(14000, 1)}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": filler(4000, 2)}]}], "tools": tools}


def small_bodies() -> tuple[list[dict], str]:
    """A one-message request (~300 bytes): the per-call fixed cost, without the size of real agent prompts."""
    body = {"model": "claude-opus-4-8", "max_tokens": 1024, "stream": False,
            "messages": [{"role": "user", "content": filler(200, 5)}]}
    return [body], "small: one ~300-byte single-message body (no tools)"


def anthropic_bodies() -> tuple[list[dict], str]:
    """Scrubbed Claude Code request bodies, and where they came from."""
    bodies = []
    if os.path.isdir(CAPTURES):
        for name in sorted(os.listdir(CAPTURES)):
            if name.endswith(".json"):
                with open(os.path.join(CAPTURES, name)) as fh:
                    doc = json.load(fh)
                body = doc["body"] if isinstance(doc["body"], dict) else json.loads(doc["body"])
                bodies.append(_scrub(body, [len(bodies) * 100000]))
    if bodies:
        return bodies, f"{CAPTURES} ({len(bodies)} Claude Code bodies, text replaced by same-length filler)"
    return [_generated_body()], "generated (no ../shared/captures): one ~48 KB body, 9 tools"


def variant(body: dict, *, stream: bool, max_tokens: int | None = None, paced: bool = False) -> dict:
    """The same request as a JSON or streaming call; `paced` puts the pacing marker in the last user text."""
    out = copy.deepcopy(body)
    out["stream"] = stream
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    if paced:
        msgs = out["messages"]
        content = msgs[-1]["content"]
        if isinstance(content, str):
            msgs[-1]["content"] = PACE_MARKER + " " + content
        else:
            blocks = [b for b in content if b.get("type") == "text"] or [None]
            if blocks[0] is None:
                content.append({"type": "text", "text": PACE_MARKER})
            else:
                blocks[0]["text"] = PACE_MARKER + " " + blocks[0]["text"]
    return out


def upstream_chat(body: dict, model: str, max_model_len: int, stream: bool) -> dict:
    """What our gateway sends upstream for `body` (codec + shaping), as the direct run's request."""
    from polar.addon.codecs import anthropic
    from polar.addon.shaping import BackendInfo, shape

    route = anthropic.route("POST", "api.anthropic.com", "/v1/messages", [])
    plan = anthropic.to_chat(body, route)
    info = BackendInfo(kind="vllm", version="0.11.1", model=model, max_model_len=max_model_len)
    shaped = shape(plan.chat, backend=info, agent_top_logprobs=plan.agent_top_logprobs,
                   logprobs_mode="raw_logprobs", sampling_override={}, thinking=plan.extra.get("thinking"),
                   thinking_kwarg=None, prompt_len=None)
    chat = shaped.body
    if not stream:
        chat["stream"] = False
        chat.pop("stream_options", None)
    return chat


def prompt_ids(body: dict, tokenizer_json: str | None) -> list[int]:
    """Prompt ids for the stub: ~4 characters of upstream chat text per token (what real prompts average), drawn from
    a real BPE over the filler when one is available (filler tokenizes denser than prose), else random ids."""
    chat = upstream_chat(body, "stub-model", 1 << 20, True)
    text = json.dumps(chat["messages"], ensure_ascii=False) + json.dumps(chat.get("tools") or [], ensure_ascii=False)
    target = len(text) // 4
    if tokenizer_json and os.path.isfile(tokenizer_json):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(tokenizer_json)
        ids = tok.encode(text).ids
        seed = 0
        while len(ids) < target:
            seed += 1
            ids += tok.encode(filler(20000, 10_000 + seed)).ids
        return ids[:target]
    rng = random.Random(3)
    return [rng.randrange(0, 150000) for _ in range(target)]
