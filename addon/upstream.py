"""Upstream shaping and the backend stream reader — the one place that knows the backend's wire format.

Shaping turns a codec's ChatPlan into the exact OpenAI chat body sent to vLLM or SGLang (DESIGN §4 "Upstream
request"): always streamed with usage, token ids and logprobs on, sampling explicit, max_tokens clamped. The reader
turns the backend's SSE chunks into protocol-free Deltas and accumulates the Completion plus the token data the record
keeps. An exact on-policy mode can replace the prompt here later without touching any codec.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import orjson

from .codecs.base import Completion, Delta, GatewayError, ToolCall, ToolCallDelta

# Explicit defaults: vLLM would otherwise apply the model's generation_config (FIELD-NOTES §1).
DEFAULT_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}


@dataclass(frozen=True)
class BackendInfo:
    kind: str  # "vllm" | "sglang"
    version: str | None
    model: str
    max_model_len: int | None

    def at_least(self, version: str) -> bool:
        def parts(v: str) -> tuple[int, ...]:
            return tuple(int(x) for x in re.findall(r"\d+", v)[:3])

        return bool(self.version) and parts(self.version) >= parts(version)


def parse_sampling_override(text: str | None) -> dict:
    """`temperature=1.6,top_p=1.0` → {"temperature": 1.6, "top_p": 1.0}; raises ValueError on bad entries."""
    out: dict = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in ("temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty"):
            raise ValueError(f"bad sampling override entry {item!r} (use e.g. temperature=1.6,top_p=1.0)")
        out[name] = int(value) if name in ("top_k", "seed") else float(value)
    return out


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
          prompt_len: int | None) -> Shaped:
    """The exact upstream body for one call. `prompt_len` is the tokenized prompt length when it was needed for the
    max_tokens clamp (else None)."""
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
        if body.get(name) != value:
            notes.append(f"sampling_override:{name}={value}")
        body[name] = value
    requested = body.get("max_tokens")
    if requested is not None and backend.max_model_len and prompt_len is not None:
        room = backend.max_model_len - prompt_len
        if requested > room:
            body["max_tokens"] = room
            notes.append(f"max_tokens_clamped:{requested}->{room}")
    if thinking is not None and thinking_kwarg:
        kwargs = dict(body.get("chat_template_kwargs") or {})
        kwargs[thinking_kwarg] = bool(thinking)
        body["chat_template_kwargs"] = kwargs
        notes.append(f"thinking_kwarg:{thinking_kwarg}={bool(thinking)}")
    headers: dict = {}
    body["logprobs"] = True
    body["top_logprobs"] = agent_top_logprobs or 0
    if backend.kind == "sglang":
        # SGLang streams ids only through its extension headers (FIELD-NOTES §1).
        headers = {"x-sglext-return-input-ids": "1", "x-sglext-return-output-ids": "1"}
    else:
        body["return_token_ids"] = True
        if backend.at_least("0.33"):
            body["return_weight_versions"] = True
    sampling = {k: body.get(k) for k in ("temperature", "top_p", "top_k", "max_tokens", "stop", "seed", "min_p",
                                          "repetition_penalty", "top_logprobs") if body.get(k) is not None}
    sampling["max_tokens_requested"] = requested
    sampling["logprobs_mode"] = logprobs_mode
    if sampling_override:
        sampling["override"] = dict(sampling_override)
    return Shaped(body, sampling, notes, headers)


class StreamReader:
    """Accumulates one backend SSE stream. feed(bytes) → the Deltas it completed; the first chunk's prompt ids are
    in .prompt_token_ids as soon as it is read.

    A forced tool call (tool_choice required or named) is guided JSON: `[{"name", "parameters"}]` for required, the
    arguments object for named. Some backend configurations stream that JSON as plain content (vLLM with a reasoning
    parser runs the tool parser only after reasoning ended), so for a forced call the content is held back; if no
    tool-call delta came, the held JSON becomes the tool calls at the finish chunk, else it is released as text."""

    def __init__(self, keep_logprob_entries: bool, forced_tool_choice=None, call_id_prefix: str = "call"):
        self.keep_logprob_entries = keep_logprob_entries
        self.forced = forced_tool_choice if (forced_tool_choice == "required"
                                             or isinstance(forced_tool_choice, dict)) else None
        self.call_id_prefix = call_id_prefix
        self.held: list[str] = []
        self.forced_from_content = False
        self._buf = b""
        self.done = False  # saw [DONE]
        self.chunks = 0
        self.prompt_token_ids: list[int] | None = None
        self.completion_token_ids: list[int] | None = None
        self.logprobs: list[float] | None = None
        self.logprob_entries: list[dict] = []
        self.missing_logprobs = False
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict] = {}
        self.finish_reason: str | None = None
        self.stop_reason = None
        self.usage: dict | None = None
        self.system_fingerprint: str | None = None
        self.model: str | None = None
        self.weight_versions = None

    def feed(self, data: bytes) -> list[Delta]:
        """Parse whole SSE events out of `data`; raise GatewayError on an error event or garbage."""
        if b"\n" not in data:
            self._buf += data
            return []
        # One split per read (not one copy of the rest of the buffer per line): a read may hold a whole stream.
        lines = (self._buf + data).split(b"\n")
        self._buf = lines.pop()
        out: list[Delta] = []
        for line in lines:
            line = line.rstrip(b"\r")
            if not line or line.startswith(b":") or line.startswith(b"event:"):
                continue
            if not line.startswith(b"data:"):
                raise GatewayError("unavailable", f"backend sent a line that is not SSE: {line[:200]!r}")
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            try:
                chunk = orjson.loads(payload)
            except orjson.JSONDecodeError:
                raise GatewayError("unavailable", f"backend sent malformed JSON in its stream: {payload[:200]!r}")
            delta = self._chunk(chunk)
            if delta is not None:
                out.append(delta)
        return out

    def _chunk(self, chunk: dict) -> Delta | None:
        if not isinstance(chunk, dict):
            raise GatewayError("unavailable", "backend stream chunk is not an object")
        if "error" in chunk and not chunk.get("choices"):
            err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            raise GatewayError("unavailable", f"backend stream error: {err.get('message', err)}")
        self.chunks += 1
        if chunk.get("prompt_token_ids") is not None and self.prompt_token_ids is None:
            self.prompt_token_ids = list(chunk["prompt_token_ids"])
        if chunk.get("system_fingerprint"):
            self.system_fingerprint = chunk["system_fingerprint"]
        if chunk.get("model"):
            self.model = chunk["model"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        ext = chunk.get("sglext")
        if isinstance(ext, dict):
            if ext.get("input_ids") is not None:
                self.prompt_token_ids = list(ext["input_ids"])
            if ext.get("output_ids") is not None:
                self.completion_token_ids = list(ext["output_ids"])
        choices = chunk.get("choices") or []
        if not choices:
            return None
        choice = choices[0]
        if choice.get("prompt_token_ids") is not None and self.prompt_token_ids is None:
            self.prompt_token_ids = list(choice["prompt_token_ids"])
        ids = choice.get("token_ids")
        if ids is not None:
            if self.completion_token_ids is None:
                self.completion_token_ids = []
            self.completion_token_ids.extend(ids)
        lp = choice.get("logprobs")
        entries = (lp or {}).get("content") or []
        if entries:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(float(e.get("logprob", 0.0)) for e in entries)
            if self.keep_logprob_entries:
                self.logprob_entries.extend(entries)
        elif ids:
            self.missing_logprobs = True
        if choice.get("weight_versions") is not None:
            self.weight_versions = choice["weight_versions"]
        delta = choice.get("delta") or {}
        text = delta.get("content") or ""
        reasoning = delta.get("reasoning") or delta.get("reasoning_content") or ""
        calls = []
        for tc in delta.get("tool_calls") or []:
            index = int(tc.get("index", 0))
            fn = tc.get("function") or {}
            slot = self.tool_calls.setdefault(index, {"id": None, "name": None, "arguments": []})
            if tc.get("id") and not slot["id"]:
                slot["id"] = tc["id"]
            if fn.get("name") and not slot["name"]:
                slot["name"] = fn["name"]
            args = fn.get("arguments") or ""
            slot["arguments"].append(args)
            calls.append(ToolCallDelta(index, tc.get("id"), fn.get("name"), args))
        finish = choice.get("finish_reason")
        if self.forced is not None and not self.tool_calls and not calls:
            if text:
                self.held.append(text)
                text = ""
            if finish:
                text, calls = self._release_forced()
        elif self.held:
            text = "".join(self.held) + text
            self.held = []
        if text:
            self.content.append(text)
        if reasoning:
            self.reasoning.append(reasoning)
        if finish:
            self.finish_reason = finish
            self.stop_reason = choice.get("stop_reason")
        if not (text or reasoning or calls or finish or entries):
            return None
        return Delta(text=text, reasoning=reasoning, tool_calls=tuple(calls), finish_reason=finish,
                     logprobs=tuple(entries) if self.keep_logprob_entries else ())

    def _release_forced(self) -> tuple[str, list[ToolCallDelta]]:
        """At the finish chunk of a forced call that produced no tool-call deltas: parse the held guided JSON."""
        held, self.held = "".join(self.held), []
        try:
            parsed = orjson.loads(held) if held.strip() else None
        except orjson.JSONDecodeError:
            return held, []
        if self.forced == "required" and isinstance(parsed, list) and parsed and all(
                isinstance(c, dict) and isinstance(c.get("name"), str) for c in parsed):
            pairs = [(c["name"], c.get("parameters", c.get("arguments", {}))) for c in parsed]
        elif isinstance(self.forced, dict) and isinstance(parsed, dict):
            pairs = [(((self.forced.get("function") or {}).get("name")) or "", parsed)]
        else:
            return held, []
        calls = []
        for index, (name, args) in enumerate(pairs):
            arguments = args if isinstance(args, str) else orjson.dumps(args).decode()
            call_id = f"{self.call_id_prefix}_{index}"
            self.tool_calls[index] = {"id": call_id, "name": name, "arguments": [arguments]}
            calls.append(ToolCallDelta(index, call_id, name, arguments))
        self.forced_from_content = True
        return "", calls

    def completion(self) -> Completion:
        calls = tuple(
            ToolCall(slot["id"] or f"call_{i}", slot["name"] or "", "".join(slot["arguments"]))
            for i, slot in sorted(self.tool_calls.items())
        )
        usage = self.usage or {}
        prompt = usage.get("prompt_tokens")
        if prompt is None:
            prompt = len(self.prompt_token_ids or ())
        completion_n = usage.get("completion_tokens")
        if completion_n is None:
            completion_n = len(self.completion_token_ids or ())
        return Completion(
            content="".join(self.content), reasoning="".join(self.reasoning), tool_calls=calls,
            finish_reason=self.finish_reason, stop_reason=self.stop_reason, prompt_tokens=int(prompt),
            completion_tokens=int(completion_n), logprobs=tuple(self.logprob_entries),
        )

    def assistant_message(self) -> dict:
        """The assistant message as the upstream side saw it (record field `assistant`)."""
        c = self.completion()
        return {
            "content": c.content,
            "reasoning": c.reasoning or None,
            "tool_calls": [{"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
                           for t in c.tool_calls],
        }


CONTEXT_PATTERNS = ("maximum context length", "context length", "prompt is too long", "too many tokens",
                    "max_model_len")


def classify_backend_error(status: int, body: bytes) -> GatewayError:
    """A backend HTTP error → the gateway error kind the codecs answer (DESIGN §4 error table)."""
    message = body[:2000].decode("utf-8", "replace")
    try:
        parsed = orjson.loads(body)
        err = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
        if isinstance(err, dict) and err.get("message"):
            message = str(err["message"])
    except orjson.JSONDecodeError:
        pass
    if status == 429:
        return GatewayError("rate_limited", message or "backend rate limit", 429)
    if status in (400, 413, 422) and any(p in message.lower() for p in CONTEXT_PATTERNS):
        return GatewayError("context_overflow", message, 400)
    if 400 <= status < 500 and status not in (401, 403, 404, 408):
        return GatewayError("bad_request", message or f"backend answered {status}", 400)
    # No status override: the provider's own "unavailable" status (529/503) applies to every backend 5xx/401/404
    # (DESIGN §4 table); the backend's status is kept in the record's error map by the caller.
    return GatewayError("unavailable", f"backend answered {status}: {message[:500]}")
