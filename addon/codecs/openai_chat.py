"""OpenAI Chat Completions: api.openai.com and DashScope's compatible mode (Qwen Code).

The agent already speaks the backend's language, so `to_chat` is a validating pass-through: it keeps what the
agent asked, checks every type it relies on, and lists each change it makes in `normalizations`. The Encoder
re-emits the backend's chunks in OpenAI's own shape and never forwards backend-only fields (token ids, prompt
token ids, logprobs the agent did not ask for, vLLM's fingerprint).

Routes: `POST /v1/chat/completions` on api.openai.com and `POST /compatible-mode/v1/chat/completions` on the two
DashScope hosts generate. Other paths on DashScope hosts and on api.openai.com are `not_found`, except
`/v1/responses…`, which belongs to the Responses codec (route returns None).

Session key: Qwen Code sends `metadata.sessionId` in the body (docs/field-notes.md: the agent CLIs).

Sections, in every codec's order (`base.Codec`): constants · route and session key · request (to_chat) ·
response (provider_stop_reason, Encoder) · errors and token counts.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from polar.addon.codecs.base import (
    AgentInputError,
    ChatPlan,
    Completion,
    Delta,
    EncodeContext,
    GatewayError,
    Route,
    SessionKey,
    ToolCallDelta,
)
from polar.addon.codecs.wire import (
    Notes,
    host_name,
    is_int,
    is_number,
    number_between,
    openai_error,
    sse,
)

# ---------------------------------------------------------------------------------------------------------------
# constants
# ---------------------------------------------------------------------------------------------------------------

PROTOCOL = "openai_chat"
STREAM_CONTENT_TYPE = "text/event-stream; charset=utf-8"
JSON_CONTENT_TYPE = "application/json"

OPENAI_HOST = "api.openai.com"
DASHSCOPE_HOSTS = ("dashscope.aliyuncs.com", "dashscope-intl.aliyuncs.com")
_GENERATE_PATHS = {OPENAI_HOST: "/v1/chat/completions"} | {h: "/compatible-mode/v1/chat/completions"
                                                           for h in DASHSCOPE_HOSTS}
_RESPONSES_PREFIX = "/v1/responses"  # the Responses codec's

_ROLES = ("system", "developer", "user", "assistant", "tool")
# Sampling and decoding fields passed on as the agent set them (the gateway fills defaults for the rest).
_PASS_NUMBERS = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "frequency_penalty": (-2.0, 2.0),
    "presence_penalty": (-2.0, 2.0),
    "min_p": (0.0, 1.0),
    "repetition_penalty": (0.0, math.inf),
}
_THINKING_EFFORT_OFF = ("none",)
# Fields that never reach the backend, each with the note recorded when the agent sent it.
_DROPPED_NOTES = {
    "metadata": "dropped_metadata",
    "store": "dropped_store",
    "service_tier": "dropped_service_tier",
    "prompt_cache_key": "dropped_prompt_cache_key",
    "safety_identifier": "dropped_safety_identifier",
    "prediction": "dropped_prediction",
    "web_search_options": "dropped_server_tool:web_search",
    "verbosity": "dropped_verbosity",
}
_HANDLED_FIELDS = frozenset({
    "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "top_k", "seed", "logit_bias", "user",
    "max_tokens", "max_completion_tokens", "stop", "response_format", "n", "logprobs", "top_logprobs", "stream",
    "stream_options", "modalities", "audio", "enable_thinking", "thinking_budget", "reasoning_effort",
    "chat_template_kwargs", "functions", "function_call", *_PASS_NUMBERS,
})
_MESSAGE_FIELDS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content", "reasoning",
                             "refusal", "function_call"})

DONE = b"data: [DONE]\n\n"


# ---------------------------------------------------------------------------------------------------------------
# route and session key
# ---------------------------------------------------------------------------------------------------------------


def route(method: str, host: str, path: str, headers: Any = None) -> Route | None:
    """Chat generation on the provider hosts; any other path there is `not_found` (a fast provider-shaped 404)."""
    host = host_name(host)
    if host not in _GENERATE_PATHS:
        return None
    bare = (path or "/").split("?", 1)[0].split("#", 1)[0]
    if host == OPENAI_HOST and (bare == _RESPONSES_PREFIX or bare.startswith(_RESPONSES_PREFIX + "/")):
        return None
    if bare.rstrip("/") == _GENERATE_PATHS[host] and (method or "").upper() == "POST":
        return Route(protocol=PROTOCOL, kind="generate")
    return Route(protocol=PROTOCOL, kind="not_found")


def session_key(headers: Any, body: dict | None) -> SessionKey | None:
    """Qwen Code's `metadata.sessionId`; nothing else in a chat request names a session."""
    if not isinstance(body, dict):
        return None
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        value = metadata.get("sessionId")
        if isinstance(value, str) and value:
            return SessionKey(source="harness:metadata.sessionId", value=value)
    return None


def stream_content_type(route: Route) -> str:
    """Every chat stream is SSE."""
    return STREAM_CONTENT_TYPE


# ---------------------------------------------------------------------------------------------------------------
# request: OpenAI chat -> OpenAI chat (validated)
# ---------------------------------------------------------------------------------------------------------------


def _fail(message: str) -> AgentInputError:
    return AgentInputError(message)


def _clean_part(part: Any, where: str, allowed: tuple[str, ...], notes: Notes) -> dict:
    """One content part, with its type checked; Anthropic-style `cache_control` markers are removed (they move
    every turn and mean nothing to the backend)."""
    if not isinstance(part, dict):
        raise _fail(f"{where}: each content part must be an object")
    kind = part.get("type")
    if kind not in allowed:
        raise _fail(f"{where}: content part type {kind!r} is not supported here (expected one of "
                    f"{', '.join(allowed)})")
    out = dict(part)
    if "cache_control" in out:
        del out["cache_control"]
        notes.add("removed_cache_control")
    if kind == "text":
        if not isinstance(out.get("text"), str):
            raise _fail(f"{where}: a text part needs a string 'text'")
    elif kind == "image_url":
        image = out.get("image_url")
        if isinstance(image, str):  # a common client shortcut; the API's shape is an object
            out["image_url"] = {"url": image}
            notes.add("image_url_as_object")
        elif not (isinstance(image, dict) and isinstance(image.get("url"), str)):
            raise _fail(f"{where}: an image_url part needs 'image_url': {{'url': string}}")
    elif kind == "input_audio":
        audio = out.get("input_audio")
        if not (isinstance(audio, dict) and isinstance(audio.get("data"), str)):
            raise _fail(f"{where}: an input_audio part needs 'input_audio': {{'data', 'format'}}")
    elif kind == "refusal":
        if not isinstance(out.get("refusal"), str):
            raise _fail(f"{where}: a refusal part needs a string 'refusal'")
    return out


def _content(value: Any, where: str, allowed: tuple[str, ...], notes: Notes, *, nullable: bool) -> Any:
    if value is None:
        if nullable:
            return None
        raise _fail(f"{where}: 'content' is required")
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return [_clean_part(p, f"{where}.content[{i}]", allowed, notes) for i, p in enumerate(value)]
    raise _fail(f"{where}: 'content' must be a string or a list of content parts")


def _tool_call(tc: Any, where: str, notes: Notes) -> dict:
    if not isinstance(tc, dict):
        raise _fail(f"{where}: each tool call must be an object")
    if tc.get("type", "function") != "function":
        raise _fail(f"{where}: tool call type {tc.get('type')!r} is not supported (only 'function')")
    if not isinstance(tc.get("id"), str) or not tc["id"]:
        raise _fail(f"{where}: a tool call needs a string 'id'")
    fn = tc.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise _fail(f"{where}: a tool call needs 'function': {{'name', 'arguments'}}")
    args = fn.get("arguments", "")
    if args is None:
        args = ""
    if not isinstance(args, str):
        # Some clients echo parsed arguments; the template wants the JSON text.
        try:
            args = orjson.dumps(args).decode()
        except TypeError as exc:
            raise _fail(f"{where}: tool call arguments must be a JSON string") from exc
        notes.add("tool_arguments_serialized")
    return {"id": tc["id"], "type": "function", "function": {"name": fn["name"], "arguments": args}}


def _message(m: Any, i: int, notes: Notes) -> dict:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise _fail(f"{where}: each message must be an object")
    role = m.get("role")
    if role == "function":
        raise _fail(f"{where}: role 'function' (the deprecated functions API) is not supported; use tools")
    if role not in _ROLES:
        raise _fail(f"{where}: invalid role {role!r} (expected one of {', '.join(_ROLES)})")
    out: dict[str, Any] = {}
    if role in ("system", "developer"):
        # Chat templates know no `developer` role; OpenAI treats it as the system prompt of reasoning models.
        if role == "developer":
            notes.add("developer_as_system")
        out["role"] = "system"
        out["content"] = _content(m.get("content"), where, ("text",), notes, nullable=False)
    elif role == "user":
        out["role"] = "user"
        out["content"] = _content(m.get("content"), where, ("text", "image_url", "input_audio", "video_url",
                                                             "file"), notes, nullable=False)
    elif role == "assistant":
        out["role"] = "assistant"
        out["content"] = _content(m.get("content"), where, ("text", "refusal"), notes, nullable=True)
        reasoning = m.get("reasoning_content")
        if reasoning is None and m.get("reasoning") is not None:
            reasoning = m["reasoning"]  # vLLM ≥ 0.16's name for it, echoed by some clients
            notes.add("reasoning_renamed")
        if reasoning is not None:
            if not isinstance(reasoning, str):
                raise _fail(f"{where}: 'reasoning_content' must be a string")
            out["reasoning_content"] = reasoning
        calls = m.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise _fail(f"{where}: 'tool_calls' must be a list")
            if calls:
                out["tool_calls"] = [_tool_call(tc, f"{where}.tool_calls[{j}]", notes) for j, tc in enumerate(calls)]
        if m.get("function_call") is not None:
            raise _fail(f"{where}: 'function_call' (the deprecated functions API) is not supported; use tool_calls")
        if out["content"] is None and "tool_calls" not in out:
            raise _fail(f"{where}: an assistant message needs 'content' or 'tool_calls'")
        if m.get("refusal") is not None:
            notes.add("dropped_message_field:refusal")
    else:  # tool
        out["role"] = "tool"
        if not isinstance(m.get("tool_call_id"), str) or not m["tool_call_id"]:
            raise _fail(f"{where}: a tool message needs a string 'tool_call_id'")
        out["tool_call_id"] = m["tool_call_id"]
        content = _content(m.get("content"), where, ("text",), notes, nullable=False)
        if isinstance(content, list):
            # Joined with "\n" as vLLM itself joins text parts, so the rendered prompt is unchanged.
            content = "\n".join(p["text"] for p in content)
            notes.add("tool_content_flattened")
        out["content"] = content
    name = m.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise _fail(f"{where}: 'name' must be a string")
        out["name"] = name
    for key, value in m.items():
        if key not in _MESSAGE_FIELDS and value is not None:
            notes.add(f"dropped_message_field:{key}")
    return out


def _tools(value: Any, notes: Notes) -> list[dict]:
    if not isinstance(value, list):
        raise _fail("'tools' must be a list")
    tools = []
    for i, t in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise _fail(f"{where}: each tool must be an object")
        if t.get("type") != "function":
            raise _fail(f"{where}: tool type {t.get('type')!r} is not supported (only 'function')")
        fn = t.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _fail(f"{where}: a function tool needs 'function': {{'name', ...}}")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise _fail(f"{where}: 'function.parameters' must be a JSON schema object")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise _fail(f"{where}: 'function.description' must be a string")
        clean = {k: v for k, v in fn.items() if v is not None}
        tools.append({"type": "function", "function": clean})
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise _fail("'tools': function names must be unique")
    return tools


def _tool_choice(value: Any, tools: list[dict] | None) -> Any:
    """The agent's tool_choice, checked against its tools."""
    if value in ("none", "auto"):
        return value
    if value == "required":
        if not tools:
            raise _fail("'tool_choice': 'required' needs a non-empty 'tools'")
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        fn = value.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise _fail("'tool_choice': a named choice needs 'function': {'name': string}")
        if name not in {t["function"]["name"] for t in tools or ()}:
            raise _fail(f"'tool_choice': function {name!r} is not in 'tools'")
        return {"type": "function", "function": {"name": name}}
    raise _fail("'tool_choice' must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name'}}")


def _response_format(value: Any) -> dict:
    if not isinstance(value, dict):
        raise _fail("'response_format' must be an object")
    kind = value.get("type")
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise _fail("'response_format': json_schema needs 'json_schema': {'name', 'schema'}")
        if spec.get("schema") is not None and not isinstance(spec["schema"], dict):
            raise _fail("'response_format': 'json_schema.schema' must be an object")
        return {"type": "json_schema", "json_schema": spec}
    raise _fail(f"'response_format': type {kind!r} is not supported (text, json_object, json_schema)")


def _thinking(body: dict, notes: Notes) -> bool | None:
    """The agent's thinking intent from vendor fields; the gateway decides whether it reaches the template."""
    intent: bool | None = None
    if "enable_thinking" in body and body["enable_thinking"] is not None:  # DashScope
        if not isinstance(body["enable_thinking"], bool):
            raise _fail("'enable_thinking' must be a boolean")
        intent = body["enable_thinking"]
        notes.add("thinking_control:enable_thinking")
    if body.get("thinking_budget") is not None:  # DashScope; a budget the backend cannot enforce
        notes.add("dropped_thinking_budget")
    if body.get("reasoning_effort") is not None:  # OpenAI reasoning models
        effort = body["reasoning_effort"]
        if not isinstance(effort, str):
            raise _fail("'reasoning_effort' must be a string")
        if intent is None:
            intent = effort not in _THINKING_EFFORT_OFF
        notes.add("thinking_control:reasoning_effort")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:  # a vLLM-aware client; only the thinking switch is honoured, through the gateway
        if not isinstance(kwargs, dict):
            raise _fail("'chat_template_kwargs' must be an object")
        if intent is None and isinstance(kwargs.get("enable_thinking"), bool):
            intent = kwargs["enable_thinking"]
        notes.add("dropped_chat_template_kwargs")
    return intent


def _tool_fields(body: dict, chat: dict, notes: Notes) -> None:
    """tools, tool_choice and parallel_tool_calls into `chat`."""
    if body.get("functions") is not None or body.get("function_call") is not None:
        raise _fail("'functions'/'function_call' (the deprecated functions API) are not supported; use tools")
    tools = None
    if body.get("tools") is not None:
        tools = _tools(body["tools"], notes)
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"], tools)
    if body.get("parallel_tool_calls") is not None:
        if not isinstance(body["parallel_tool_calls"], bool):
            raise _fail("'parallel_tool_calls' must be a boolean")
        chat["parallel_tool_calls"] = body["parallel_tool_calls"]


def _sampling(body: dict, chat: dict) -> None:
    """The sampling and decoding fields the agent set, checked, into `chat`."""
    for key, (lo, hi) in _PASS_NUMBERS.items():
        value = number_between(body, key, lo, hi)
        if value is not None:
            chat[key] = value
    if body.get("top_k") is not None:
        if not is_int(body["top_k"]) or (body["top_k"] < 1 and body["top_k"] != -1):
            raise _fail("'top_k' must be a positive integer or -1")
        chat["top_k"] = body["top_k"]
    if body.get("seed") is not None:
        if not is_int(body["seed"]):
            raise _fail("'seed' must be an integer")
        chat["seed"] = body["seed"]
    if body.get("logit_bias") is not None:
        bias = body["logit_bias"]
        if not isinstance(bias, dict) or not all(is_number(v) and -100 <= v <= 100 for v in bias.values()):
            raise _fail("'logit_bias' must map token ids to numbers between -100 and 100")
        chat["logit_bias"] = bias
    if body.get("user") is not None:
        if not isinstance(body["user"], str):
            raise _fail("'user' must be a string")
        chat["user"] = body["user"]


def _limits(body: dict, chat: dict, notes: Notes) -> None:
    """max_tokens (or max_completion_tokens) and stop into `chat`."""
    max_tokens = body.get("max_tokens")
    if body.get("max_completion_tokens") is not None:
        max_tokens = body["max_completion_tokens"]  # the newer name wins, as on OpenAI
        notes.add("max_completion_tokens_as_max_tokens")
    if max_tokens is not None:
        if not is_int(max_tokens) or max_tokens < 1:
            raise _fail("'max_tokens'/'max_completion_tokens' must be a positive integer")
        chat["max_tokens"] = max_tokens

    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise _fail("'stop' must be a string or a list of non-empty strings")
        if stop:
            chat["stop"] = stop


def _agent_logprobs(body: dict) -> int | None:
    """The top-k the agent asked logprobs for itself (0 for chosen tokens only); None when it did not ask. `n` is
    checked first: one generation per call."""
    n = body.get("n")
    if n is not None and (not is_int(n) or n < 1):
        raise _fail("'n' must be a positive integer")
    if n is not None and n > 1:
        raise _fail("'n' > 1 is not supported: the gateway records one generation per call")

    logprobs = body.get("logprobs")
    top_logprobs = body.get("top_logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise _fail("'logprobs' must be a boolean")
    if top_logprobs is not None:
        if not is_int(top_logprobs) or not 0 <= top_logprobs <= 20:
            raise _fail("'top_logprobs' must be an integer between 0 and 20")
        if not logprobs:
            raise _fail("'logprobs' must be true when 'top_logprobs' is set")
    return (top_logprobs or 0) if logprobs else None


def _stream(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage), checked; then the output modalities, which must be text only."""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _fail("'stream' must be a boolean")
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise _fail("'stream_options' must be an object")
        if not stream:
            raise _fail("'stream_options' is only allowed when 'stream' is true")
        usage = options.get("include_usage")
        if usage is not None and not isinstance(usage, bool):
            raise _fail("'stream_options.include_usage' must be a boolean")
        include_usage = bool(usage)

    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise _fail("only the 'text' output modality is supported")
    if body.get("audio") is not None:
        raise _fail("audio output is not supported")
    return stream, include_usage


def to_chat(body: Any, route: Route | None = None) -> ChatPlan:
    """The agent's chat request, validated; raises AgentInputError (the provider's 400) on bad input."""
    if not isinstance(body, dict):
        raise _fail("the request body must be a JSON object")
    notes = Notes()
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _fail("'model' must be a string")

    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _fail("'messages' must be a non-empty list")
    chat: dict[str, Any] = {"messages": [_message(m, i, notes) for i, m in enumerate(messages)]}
    _tool_fields(body, chat, notes)
    _sampling(body, chat)
    _limits(body, chat, notes)
    if body.get("response_format") is not None:
        chat["response_format"] = _response_format(body["response_format"])
    agent_top_logprobs = _agent_logprobs(body)
    stream, include_usage = _stream(body)
    thinking = _thinking(body, notes)
    for key, value in body.items():
        if key in _HANDLED_FIELDS or value is None:
            continue
        notes.add(_DROPPED_NOTES.get(key, f"dropped_field:{key}"))

    return ChatPlan(
        chat=chat,
        stream=stream,
        model_requested=model,
        normalizations=tuple(notes.items),
        agent_top_logprobs=agent_top_logprobs,
        extra={"include_usage": include_usage, "thinking": thinking},
    )


# ---------------------------------------------------------------------------------------------------------------
# response: chat stream -> chat.completion.chunk events, chat.completion body
# ---------------------------------------------------------------------------------------------------------------


def provider_stop_reason(c: Completion, plan: ChatPlan | None = None) -> str:
    """OpenAI's finish_reason is vLLM's own (stop, length, tool_calls); a missing one is a plain stop, and so is
    `tool_calls` when no call was parsed (vLLM can stream a forced call as plain content): an agent told
    `tool_calls` looks for calls that are not there."""
    if c.finish_reason == "tool_calls" and not c.tool_calls:
        return "stop"
    return c.finish_reason or "stop"


def _logprob_entry(entry: dict, k: int) -> dict:
    """An OpenAI logprobs.content entry with only the API's keys (no token ids), cut to the agent's top-k."""
    tops = entry.get("top_logprobs") or []
    return {
        "token": entry.get("token", ""),
        "logprob": entry.get("logprob", 0.0),
        "bytes": entry.get("bytes"),
        "top_logprobs": [{"token": t.get("token", ""), "logprob": t.get("logprob", 0.0), "bytes": t.get("bytes")}
                         for t in tops[:k]],
    }


def _usage(c: Completion) -> dict:
    return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens}


class Encoder:
    """Backend chat chunks re-emitted as OpenAI `chat.completion.chunk` events, or one `chat.completion` body."""

    def __init__(self, ctx: EncodeContext):
        self.ctx = ctx
        rid = ctx.response_id
        self.id = rid if rid.startswith("chatcmpl-") else f"chatcmpl-{rid}"
        self.top_k = ctx.plan.agent_top_logprobs
        self.include_usage = bool(ctx.plan.extra.get("include_usage"))
        self.started = False
        self.tool_started: set[int] = set()
        self.finish_reason: str | None = None
        self.notes: list[str] = []  # nothing to note while re-emitting chat chunks

    # -- streaming -------------------------------------------------------------------------------------------

    def _chunk(self, delta: dict, *, finish_reason: str | None = None, logprobs: tuple[dict, ...] = ()) -> bytes:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        if self.top_k is not None and logprobs:
            choice["logprobs"] = {"content": [_logprob_entry(e, self.top_k) for e in logprobs], "refusal": None}
        return sse(None, orjson.dumps({"id": self.id, "object": "chat.completion.chunk", "created": self.ctx.created,
                                       "model": self.ctx.model, "choices": [choice]}))

    def start(self) -> list[bytes]:
        """The role chunk, once."""
        if self.started:
            return []
        self.started = True
        return [self._chunk({"role": "assistant", "content": ""})]

    def _tool_delta(self, t: ToolCallDelta) -> dict:
        out: dict[str, Any] = {"index": t.index}
        if t.index not in self.tool_started:
            self.tool_started.add(t.index)
            out["id"] = t.id or f"call_{self.id.removeprefix('chatcmpl-')}_{t.index}"
            out["type"] = "function"
            out["function"] = {"name": t.name or "", "arguments": t.arguments}
        else:
            out["function"] = {"arguments": t.arguments}
        return out

    def delta(self, d: Delta) -> list[bytes]:
        """One backend chunk's reasoning, text, tool-call pieces and (if asked) logprobs. The finish reason is
        remembered and sent by finish(), after the gateway has written the record."""
        out = self.start()
        if d.finish_reason is not None:
            self.finish_reason = d.finish_reason
        body: dict[str, Any] = {}
        if d.reasoning:
            body["reasoning_content"] = d.reasoning
        if d.text:
            body["content"] = d.text
        if d.tool_calls:
            body["tool_calls"] = [self._tool_delta(t) for t in d.tool_calls]
        has_logprobs = self.top_k is not None and bool(d.logprobs)
        if body or has_logprobs:
            out.append(self._chunk(body, logprobs=d.logprobs))
        return out

    def finish(self, c: Completion) -> list[bytes]:
        """The finish chunk, the usage chunk when the agent asked include_usage, then [DONE]."""
        out = self.start()
        reason = provider_stop_reason(c) if c.finish_reason else (self.finish_reason or "stop")
        out.append(self._chunk({}, finish_reason=reason))
        if self.include_usage:
            out.append(sse(None, orjson.dumps({"id": self.id, "object": "chat.completion.chunk",
                                               "created": self.ctx.created, "model": self.ctx.model, "choices": [],
                                               "usage": _usage(c)})))
        out.append(DONE)
        return out

    def error(self, e: GatewayError) -> list[bytes]:
        """OpenAI's mid-stream error: one `data: {"error": …}` event and no [DONE]."""
        return [sse(None, orjson.dumps({"error": openai_error(e, "messages")[1]}))]

    # -- non-streaming ---------------------------------------------------------------------------------------

    def response(self, c: Completion) -> dict:
        """The whole `chat.completion` body."""
        message: dict[str, Any] = {"role": "assistant", "content": c.content, "refusal": None}
        if c.reasoning:
            message["reasoning_content"] = c.reasoning
        if c.tool_calls:
            message["tool_calls"] = [
                {"id": tc.id or f"call_{self.id.removeprefix('chatcmpl-')}_{i}", "type": "function",
                 "function": {"name": tc.name, "arguments": tc.arguments}}
                for i, tc in enumerate(c.tool_calls)]
            if not c.content:
                message["content"] = None
        logprobs = None
        if self.top_k is not None:
            logprobs = {"content": [_logprob_entry(e, self.top_k) for e in c.logprobs], "refusal": None}
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.ctx.created,
            "model": self.ctx.model,
            "choices": [{"index": 0, "message": message, "logprobs": logprobs,
                         "finish_reason": provider_stop_reason(c)}],
            "usage": _usage(c),
        }


# ---------------------------------------------------------------------------------------------------------------
# errors and token counts
# ---------------------------------------------------------------------------------------------------------------


def error_response(e: GatewayError) -> tuple[int, bytes]:
    """A failure before response headers, as OpenAI's error JSON (the error table in docs/architecture.md)."""
    status, error = openai_error(e, "messages")
    return status, orjson.dumps({"error": error})


def count_tokens_response(n: int, route: Route | None = None) -> dict:
    """Chat Completions has no token-count endpoint (route never yields one); answered in the Responses shape."""
    return {"object": "response.input_tokens", "input_tokens": n}
