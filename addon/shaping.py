"""Upstream shaping — the one place that writes the OpenAI chat body sent to vLLM or SGLang (docs/architecture.md,
step 4 of one call): always streamed with usage, token ids and logprobs on, sampling explicit, and `max_tokens` clamped
to the context that is left — here and nowhere else. Exact mode hands `shape` the prompt ids it spliced; it does not
edit the result.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import orjson


# Explicit defaults: vLLM would otherwise apply the model's generation_config (docs/field-notes.md: vLLM).
DEFAULT_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}


@dataclass(frozen=True)
class BackendInfo:
    kind: str  # "vllm" | "sglang"
    version: str | None
    model: str
    max_model_len: int | None
    # the backend's own render of a fixed conversation and text, hashed (`backend.template_hash`): which chat
    # template and tokenizer produced a prompt; None when the backend has no /tokenize
    template_hash: str | None = None

    def at_least(self, version: str) -> bool:
        def parts(v: str) -> tuple[int, ...]:
            return tuple(int(x) for x in re.findall(r"\d+", v)[:3])

        return bool(self.version) and parts(self.version) >= parts(version)


def call_seed(base: int, session: str | None, plan_chat: dict) -> int:
    """The sampler seed of one call under `seed_per_call=base`: a 31-bit hash of the base, the session and the chat
    body the agent sent (sorted keys). The same session sending the same prompt gets the same seed — so a rollout
    whose policy and prompts repeat draws the same tokens — and two samples (two sessions) of one prompt differ."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{base}\0{session or ''}\0".encode())
    h.update(orjson.dumps(plan_chat, option=orjson.OPT_SORT_KEYS))
    return int.from_bytes(h.digest(), "big") & 0x7FFFFFFF


def prompt_size_bound(chat: dict) -> int:
    """A cheap upper bound of the prompt's token count: every token is at least one byte of rendered text, and the
    template adds a bounded amount per message. Used to skip /tokenize when max_tokens cannot overflow."""
    messages = chat.get("messages") or []
    return len(orjson.dumps(messages)) + len(orjson.dumps(chat.get("tools") or [])) + 32 * len(messages) + 512


@dataclass
class Shaped:
    body: dict
    sampling: dict
    normalizations: list[str]
    headers: dict = field(default_factory=dict)


def shape(plan_chat: dict, *, backend: BackendInfo, agent_top_logprobs: int | None, logprobs_mode: str,
          sampling_override: dict, thinking: bool | None, thinking_kwarg: str | None,
          prompt_len: int | None = None, prompt_ids: list[int] | None = None, session: str | None = None) -> Shaped:
    """The exact upstream body for one call. `prompt_len` is the tokenized prompt length when it was needed for the
    max_tokens clamp (else None); `prompt_ids`, exact mode's spliced prompt, is sent as the prompt (and is its
    length); `session` feeds `seed_per_call` (the record's sampling then holds the seed sent)."""
    notes: list[str] = []
    body = dict(plan_chat)
    body["model"] = backend.model
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    tools = body.get("tools")
    if not tools:
        # vLLM rejects `tools: []`, and tool_choice without tools.
        body.pop("tools", None)
        if body.pop("tool_choice", None) not in (None, "none", "auto"):
            notes.append("tool_choice_without_tools_dropped")
    for name, default in DEFAULT_SAMPLING.items():
        if body.get(name) is None:
            body[name] = default
    for name, value in sampling_override.items():
        if name == "seed_per_call":  # the note names the base (one per run), the record's sampling the seed
            notes.append(f"sampling_override:seed_per_call={value}")
            body["seed"] = call_seed(value, session, plan_chat)
            continue
        if body.get(name) != value:
            notes.append(f"sampling_override:{name}={value}")
        body[name] = value
    if thinking is not None and thinking_kwarg:
        kwargs = dict(body.get("chat_template_kwargs") or {})
        kwargs[thinking_kwarg] = bool(thinking)
        body["chat_template_kwargs"] = kwargs
        notes.append(f"thinking_kwarg:{thinking_kwarg}={bool(thinking)}")
    headers: dict = {}
    body["logprobs"] = True
    body["top_logprobs"] = agent_top_logprobs or 0
    if backend.kind == "sglang":
        # SGLang streams ids only through its extension headers (docs/field-notes.md: vLLM).
        headers = {"x-sglext-return-input-ids": "1", "x-sglext-return-output-ids": "1"}
    else:
        body["return_token_ids"] = True
        if backend.at_least("0.33"):
            body["return_weight_versions"] = True
    requested = body.get("max_tokens")
    if prompt_ids is not None:
        # vLLM 0.30+ takes the prompt as ids here and still runs its tool-call and reasoning parsers.
        body["kv_transfer_params"] = {"prompt_token_ids": list(prompt_ids)}
        prompt_len = len(prompt_ids)
    if requested is not None and backend.max_model_len and prompt_len is not None:
        room = backend.max_model_len - prompt_len
        if requested > room:
            body["max_tokens"] = room
            notes.append(f"max_tokens_clamped:{requested}->{room}")
    sampling = {k: body.get(k) for k in ("temperature", "top_p", "top_k", "max_tokens", "stop", "seed", "min_p",
                                          "repetition_penalty", "top_logprobs") if body.get(k) is not None}
    sampling["max_tokens_requested"] = requested
    sampling["logprobs_mode"] = logprobs_mode
    if sampling_override:
        sampling["override"] = dict(sampling_override)
    return Shaped(body, sampling, notes, headers)
