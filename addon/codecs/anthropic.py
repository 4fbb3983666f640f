"""Anthropic Messages (`POST api.anthropic.com/v1/messages`, with or without `?beta=true`) ⇄ OpenAI chat.

Request rules (to_chat), each change listed in `ChatPlan.normalizations`:
- `system` (a string or text blocks) becomes one leading system message; text blocks are joined with a blank line.
  Claude Code's block starting `x-anthropic-billing-header:` changes on every request and is removed
  (`removed_billing_header`). `cache_control` markers carry no meaning for the backend (`ignored_cache_control`).
- `role: "system"` messages inside `messages` (Claude Code sends them) stay in place as system messages.
- User turns: text blocks are joined with a blank line; images (base64 or url) become `image_url` parts, and then the
  content is a part list. `tool_result` blocks become `tool` messages, in their order, before the turn's remaining
  user content (`reordered_tool_results` when some user content preceded them). A result with `is_error: true` is
  prefixed with `Error: ` so the model can still tell (`tool_result_error_prefixed`).
- Assistant turns: text blocks are concatenated as the model produced them; `tool_use` → `tool_calls` (arguments =
  the input as JSON text); `thinking` → `reasoning_content` (the reasoning round trip); `redacted_thinking` cannot be
  restored (`redacted_thinking_dropped`, `reasoning_dropped`). A final assistant turn is a prefill: the backend
  continues it (`continue_final_message`, `assistant_prefill`).
- Custom tools → function tools; Anthropic-defined tools (any `type` other than `custom`: web search, bash, text
  editor, …) run on Anthropic's side or need its trained schemas, so they are dropped (`dropped_server_tool:<name>`),
  and so are their history blocks (`dropped_block:<type>`).
- tool_choice auto/any/tool/none → auto/required/named/none; `disable_parallel_tool_use` → `parallel_tool_calls:
  false`. `output_config.format` (or the beta `output_format`) json_schema → `response_format`. any/tool choice or
  a schema format makes the call `constrained`.
- `thinking` enabled/adaptive/disabled → `plan.extra["thinking"]` True/True/False (the gateway decides whether to
  map it); fields with no backend meaning (`metadata`, `context_management`, `output_config.effort`, `service_tier`,
  `container`, `mcp_servers`, unknown keys) are tolerated and listed as `ignored:<field>`.

Response rules (Encoder): the exact Anthropic SSE sequence — message_start (real input tokens), ping, one
content block per thinking / text / tool_use run with strictly increasing indexes, message_delta (stop reason and
final usage), message_stop. Thinking blocks end with a signature of ours (the SDKs require one). Tool-use ids are the
backend's when they fit Anthropic's id alphabet, else derived from the response id, so they round-trip unchanged.

Sections, in every codec's order (`base.Codec`): constants · route and session key · request (to_chat) ·
response (provider_stop_reason, Encoder) · errors and token counts.
"""

from __future__ import annotations

import base64
import json
import re

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
)
from polar.addon.codecs.wire import Notes, header, host_name, sse
from polar.addon.provider_errors import ANTHROPIC_ERRORS, ANTHROPIC_STATUS_TYPES

# ---------------------------------------------------------------------------------------------------------------
# constants
# ---------------------------------------------------------------------------------------------------------------

PROTOCOL = "anthropic_messages"
STREAM_CONTENT_TYPE = "text/event-stream; charset=utf-8"
JSON_CONTENT_TYPE = "application/json"
HOSTS = frozenset({"api.anthropic.com"})

BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"
TOOL_ERROR_PREFIX = "Error: "
SIGNATURE_MARKER = b"polar-thinking-v1:"
_ID_OK = re.compile(r"^[A-Za-z0-9_-]+$")

# Top-level request fields that change nothing the backend sees; tolerated and noted.
_IGNORED_FIELDS = ("metadata", "context_management", "service_tier", "container", "mcp_servers", "inference_geo")
_HANDLED_FIELDS = frozenset({
    "model", "messages", "system", "tools", "tool_choice", "max_tokens", "stop_sequences", "stream", "temperature",
    "top_p", "top_k", "thinking", "output_config", "output_format", *_IGNORED_FIELDS,
})
# History blocks produced by Anthropic-run tools; dropped with the tools themselves.
_SERVER_BLOCKS = frozenset({
    "server_tool_use", "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result",
    "bash_code_execution_tool_result", "text_editor_code_execution_tool_result", "mcp_tool_use", "mcp_tool_result",
    "container_upload", "tool_search_tool_result",
})


# ---------------------------------------------------------------------------------------------------------------
# route and session key
# ---------------------------------------------------------------------------------------------------------------


def route(method: str, host: str, path: str, headers=None) -> Route | None:
    """Requests to api.anthropic.com are ours; only POST /v1/messages and /v1/messages/count_tokens are served,
    every other path is `not_found` (the CLIs' side traffic wants a fast 404)."""
    if host_name(host) not in HOSTS:
        return None
    bare = path.split("?", 1)[0].rstrip("/")
    if method.upper() == "POST" and bare == "/v1/messages":
        return Route(PROTOCOL, "generate")
    if method.upper() == "POST" and bare == "/v1/messages/count_tokens":
        return Route(PROTOCOL, "count_tokens")
    return Route(PROTOCOL, "not_found")


def session_key(headers, body: dict | None) -> SessionKey | None:
    """Claude Code's session: header `X-Claude-Code-Session-Id`, else `session_id` inside the JSON string
    `metadata.user_id` (older versions wrote `…_session_<uuid>` there). Nothing else is a session."""
    value = header(headers, "x-claude-code-session-id")
    if value:
        return SessionKey("harness:x-claude-code-session-id", value)
    meta = body.get("metadata") if isinstance(body, dict) else None
    user_id = meta.get("user_id") if isinstance(meta, dict) else None
    if not isinstance(user_id, str) or not user_id:
        return None
    try:
        parsed = json.loads(user_id)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        sid = parsed.get("session_id")
        return SessionKey("harness:metadata.user_id", sid) if isinstance(sid, str) and sid else None
    match = re.search(r"_session_([0-9A-Za-z-]+)$", user_id)
    return SessionKey("harness:metadata.user_id", match.group(1)) if match else None


def stream_content_type(route: Route) -> str:
    """Every Anthropic stream is SSE."""
    return STREAM_CONTENT_TYPE


# ---------------------------------------------------------------------------------------------------------------
# request: Anthropic Messages -> OpenAI chat
# ---------------------------------------------------------------------------------------------------------------


def _fail(where: str, message: str) -> AgentInputError:
    return AgentInputError(f"{where}: {message}" if where else message)


def _text_of(block: dict, where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise _fail(f"{where}.text", "Input should be a valid string")
    return text


def _blocks(content, where: str) -> list[dict]:
    """Content as a block list (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _fail(where, "Input should be a valid string or a list of content blocks")
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _fail(f"{where}.{i}", "Input should be a content block object with a string `type`")
    return content


def _note_cache(block: dict, notes: Notes) -> None:
    if "cache_control" in block:
        notes.add("ignored_cache_control")


def _image_part(block: dict, where: str) -> dict:
    source = block.get("source")
    if not isinstance(source, dict):
        raise _fail(f"{where}.source", "Field required")
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise _fail(f"{where}.source", "base64 images need string `media_type` and `data`")
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if kind == "url":
        url = source.get("url")
        if not isinstance(url, str):
            raise _fail(f"{where}.source.url", "Input should be a valid string")
        return {"type": "image_url", "image_url": {"url": url}}
    raise _fail(f"{where}.source.type", f"image source type {kind!r} is not supported (use base64 or url)")


def _document_part(block: dict, where: str) -> dict:
    # Plain-text documents are text to the model; PDFs and file ids need Anthropic's own pipeline.
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "text" and isinstance(source.get("data"), str):
        return {"type": "text", "text": source["data"]}
    raise _fail(where, "only plain-text document blocks (source.type 'text') are supported")


def _parts_content(parts: list[dict]) -> str | list[dict]:
    """Text-only parts become one string (blank-line joined); with images, the OpenAI part list."""
    if all(p["type"] == "text" for p in parts):
        return "\n\n".join(p["text"] for p in parts)
    return parts


def _tool_message(block: dict, where: str, notes: Notes) -> dict:
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise _fail(f"{where}.tool_use_id", "Field required")
    raw = block.get("content", "")
    parts: list[dict] = []
    if raw is None or raw == "":
        pass
    elif isinstance(raw, str):
        parts.append({"type": "text", "text": raw})
    else:
        for j, inner in enumerate(_blocks(raw, f"{where}.content")):
            at = f"{where}.content.{j}"
            _note_cache(inner, notes)
            kind = inner["type"]
            if kind == "text":
                parts.append({"type": "text", "text": _text_of(inner, at)})
            elif kind == "image":
                parts.append(_image_part(inner, at))
            elif kind == "document":
                parts.append(_document_part(inner, at))
            else:
                raise _fail(f"{where}.content.{j}.type", f"block type {kind!r} is not allowed in a tool_result")
    if block.get("is_error") is True:
        notes.add("tool_result_error_prefixed")
        if parts and parts[0]["type"] == "text":
            parts[0] = {"type": "text", "text": TOOL_ERROR_PREFIX + parts[0]["text"]}
        else:
            parts.insert(0, {"type": "text", "text": TOOL_ERROR_PREFIX.rstrip()})
    content = _parts_content(parts) if parts else ""
    return {"role": "tool", "tool_call_id": tool_use_id, "content": content}


def _user_messages(content, where: str, notes: Notes) -> list[dict]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tools: list[dict] = []
    parts: list[dict] = []
    for i, block in enumerate(_blocks(content, where)):
        at = f"{where}.{i}"
        _note_cache(block, notes)
        kind = block["type"]
        if kind == "tool_result":
            if parts:
                notes.add("reordered_tool_results")
            tools.append(_tool_message(block, at, notes))
        elif kind == "text":
            parts.append({"type": "text", "text": _text_of(block, at)})
        elif kind == "image":
            parts.append(_image_part(block, at))
        elif kind == "document":
            parts.append(_document_part(block, at))
        elif kind in _SERVER_BLOCKS:
            notes.add(f"dropped_block:{kind}")
        else:
            raise _fail(f"{at}.type", f"block type {kind!r} is not allowed in a user message")
    out = tools
    if parts or not tools:
        out = tools + [{"role": "user", "content": _parts_content(parts) if parts else ""}]
    return out


def _assistant_message(content, where: str, notes: Notes) -> dict:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict] = []
    for i, block in enumerate(_blocks(content, where)):
        at = f"{where}.{i}"
        _note_cache(block, notes)
        kind = block["type"]
        if kind == "text":
            texts.append(_text_of(block, at))
        elif kind == "thinking":
            thinking = block.get("thinking")
            if not isinstance(thinking, str):
                raise _fail(f"{at}.thinking", "Input should be a valid string")
            if thinking:
                reasoning.append(thinking)
            else:  # `display: omitted` echoes a signature without the text: nothing left to restore
                notes.add("reasoning_dropped")
        elif kind == "redacted_thinking":
            notes.add("redacted_thinking_dropped")
            notes.add("reasoning_dropped")
        elif kind == "tool_use":
            call_id, name, args = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(call_id, str) or not call_id:
                raise _fail(f"{at}.id", "Field required")
            if not isinstance(name, str) or not name:
                raise _fail(f"{at}.name", "Field required")
            if not isinstance(args, dict):
                raise _fail(f"{at}.input", "Input should be a valid dictionary")
            # json.dumps' default separators are what vLLM's tool parsers emit, so echoed calls match.
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
        elif kind in _SERVER_BLOCKS:
            notes.add(f"dropped_block:{kind}")
        else:
            raise _fail(f"{at}.type", f"block type {kind!r} is not allowed in an assistant message")
    text = "".join(texts)
    message: dict = {"role": "assistant", "content": text if (text or not calls) else None}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def _system_text(content, where: str, notes: Notes) -> str | None:
    """Blank-line-joined text of a system string or text blocks, the billing header removed; None when empty."""
    texts = []
    for i, block in enumerate(_blocks(content, where)):
        _note_cache(block, notes)
        if block["type"] != "text":
            raise _fail(f"{where}.{i}.type", "system blocks must be text blocks")
        text = _text_of(block, f"{where}.{i}")
        if text.startswith(BILLING_HEADER_PREFIX):
            notes.add("removed_billing_header")
            continue
        texts.append(text)
    return "\n\n".join(texts) if texts else None


def _tools(raw, notes: Notes) -> list[dict]:
    if not isinstance(raw, list):
        raise _fail("tools", "Input should be a valid list")
    out = []
    for i, tool in enumerate(raw):
        where = f"tools.{i}"
        if not isinstance(tool, dict):
            raise _fail(where, "Input should be a valid dictionary")
        _note_cache(tool, notes)
        kind = tool.get("type", "custom")
        name = tool.get("name")
        if kind not in (None, "custom"):
            notes.add(f"dropped_server_tool:{name if isinstance(name, str) else kind}")
            continue
        if not isinstance(name, str) or not name:
            raise _fail(f"{where}.name", "Field required")
        schema = tool.get("input_schema", {"type": "object", "properties": {}})
        if not isinstance(schema, dict):
            raise _fail(f"{where}.input_schema", "Input should be a valid dictionary")
        function = {"name": name, "parameters": schema}
        description = tool.get("description")
        if isinstance(description, str):
            function["description"] = description
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(raw, tool_names: set[str], notes: Notes):
    """The OpenAI tool_choice for Anthropic's."""
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise _fail("tool_choice", "Input should be an object with a `type`")
    if raw.get("disable_parallel_tool_use") is True:
        notes.add("disable_parallel_tool_use")
    kind = raw["type"]
    if kind == "auto":
        return "auto"
    if kind == "none":
        return "none"
    if kind == "any":
        return "required"
    if kind == "tool":
        name = raw.get("name")
        if not isinstance(name, str) or name not in tool_names:
            raise _fail("tool_choice.name", f"tool {name!r} is not among the request's custom tools")
        return {"type": "function", "function": {"name": name}}
    raise _fail("tool_choice.type", f"unknown tool_choice type {kind!r} (auto, any, tool, none)")


def _response_format(fmt, where: str):
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise _fail(where, "only {'type': 'json_schema', 'schema': {...}} is supported")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True}}


def _number(body: dict, key: str, kind: type | tuple, lo: float | None = None):
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, kind):
        raise _fail(key, f"Input should be a valid {'integer' if kind is int else 'number'}")
    if lo is not None and value < lo:
        raise _fail(key, f"Input should be greater than or equal to {lo}")
    return value


def _model_and_stream(body: dict, route: Route) -> tuple[str | None, bool]:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _fail("model", "Input should be a valid string")
    if route.kind == "generate" and not model:
        raise _fail("model", "Field required")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _fail("stream", "Input should be a valid boolean")
    return model, stream


def _messages(body: dict, route: Route, notes: Notes) -> tuple[list, list[dict]]:
    """(the agent's messages, the chat messages): the system prompt first, then each turn in order."""
    raw_messages = body.get("messages")
    if raw_messages is None:
        raise _fail("messages", "Field required")
    if not isinstance(raw_messages, list):
        raise _fail("messages", "Input should be a valid list")
    if not raw_messages and route.kind == "generate":
        raise AgentInputError("messages: at least one message is required")

    messages: list[dict] = []
    if body.get("system") is not None:
        system = _system_text(body["system"], "system", notes)
        if system is not None:
            messages.append({"role": "system", "content": system})
    for i, message in enumerate(raw_messages):
        where = f"messages.{i}"
        if not isinstance(message, dict):
            raise _fail(where, "Input should be a valid dictionary")
        role, content = message.get("role"), message.get("content")
        if content is None:
            raise _fail(f"{where}.content", "Field required")
        if role == "user":
            messages.extend(_user_messages(content, f"{where}.content", notes))
        elif role == "assistant":
            messages.append(_assistant_message(content, f"{where}.content", notes))
        elif role == "system":
            text = _system_text(content, f"{where}.content", notes)
            messages.append({"role": "system", "content": text or ""})
        else:
            raise _fail(f"{where}.role", f"Input should be 'user', 'assistant' or 'system', got {role!r}")
    return raw_messages, messages


def _prefill(raw_messages: list, chat: dict, notes: Notes) -> None:
    """A final assistant turn is continued (prefill), or dropped when it asks for nothing."""
    messages = chat["messages"]
    last = raw_messages[-1] if raw_messages else None
    if isinstance(last, dict) and last.get("role") == "assistant" and not messages[-1].get("tool_calls"):
        if messages[-1]["content"] or messages[-1].get("reasoning_content"):
            # Anthropic continues a final assistant turn (prefill); vLLM does the same with these two flags.
            chat["continue_final_message"] = True
            chat["add_generation_prompt"] = False
            notes.add("assistant_prefill")
        else:
            messages.pop()  # an empty prefill asks for nothing: a plain generation
            notes.add("dropped_empty_prefill")


def _tool_fields(body: dict, chat: dict, notes: Notes) -> None:
    """tools, tool_choice and parallel_tool_calls into `chat`."""
    tools = _tools(body["tools"], notes) if body.get("tools") is not None else []
    if body.get("tools") is not None:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        names = {t["function"]["name"] for t in tools}
        chat["tool_choice"] = _tool_choice(body["tool_choice"], names, notes)
        if body["tool_choice"].get("disable_parallel_tool_use") is True:
            chat["parallel_tool_calls"] = False


def _sampling(body: dict, route: Route, chat: dict) -> None:
    """max_tokens (required to generate), temperature, top_p, top_k and stop_sequences into `chat`."""
    max_tokens = _number(body, "max_tokens", int, 1)
    if max_tokens is None and route.kind == "generate":
        raise _fail("max_tokens", "Field required")
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    for key, kind, lo in (("temperature", (int, float), 0), ("top_p", (int, float), 0), ("top_k", int, 0)):
        value = _number(body, key, kind, lo)
        if value is not None:
            chat[key] = value
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _fail("stop_sequences", "Input should be a list of strings")
        if stops:
            chat["stop"] = list(stops)


def _thinking(body: dict) -> dict:
    """The plan's `extra`: the agent's thinking intent (None when it said nothing) and its budget."""
    thinking = body.get("thinking")
    extra: dict = {"thinking": None}
    if thinking is not None:
        if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "adaptive", "disabled"):
            raise _fail("thinking.type", "Input should be 'enabled', 'adaptive' or 'disabled'")
        extra["thinking"] = thinking["type"] != "disabled"
        budget = thinking.get("budget_tokens")
        if isinstance(budget, int) and not isinstance(budget, bool):
            extra["thinking_budget_tokens"] = budget
    return extra


def _output_format(body: dict, notes: Notes) -> dict | None:
    """`output_config.format`, or the beta `output_format` (it wins), as a chat response_format."""
    output_config = body.get("output_config")
    response_format = None
    if output_config is not None:
        if not isinstance(output_config, dict):
            raise _fail("output_config", "Input should be a valid dictionary")
        response_format = _response_format(output_config.get("format"), "output_config.format")
        for key in output_config:
            if key != "format":
                notes.add(f"ignored:output_config.{key}")
    if body.get("output_format") is not None:
        response_format = _response_format(body["output_format"], "output_format")
    return response_format


def to_chat(body, route: Route) -> ChatPlan:
    """An Anthropic Messages request as an OpenAI chat request (module docstring: the rules)."""
    if not isinstance(body, dict):
        raise AgentInputError("request body must be a JSON object")
    notes = Notes()
    model, stream = _model_and_stream(body, route)
    raw_messages, messages = _messages(body, route, notes)
    chat: dict = {"messages": messages}
    _prefill(raw_messages, chat, notes)
    _tool_fields(body, chat, notes)
    _sampling(body, route, chat)
    extra = _thinking(body)
    response_format = _output_format(body, notes)
    if response_format is not None:
        chat["response_format"] = response_format
    for key in body:
        if key not in _HANDLED_FIELDS or (key in _IGNORED_FIELDS and body[key] is not None):
            notes.add(f"ignored:{key}")
    return ChatPlan(chat=chat, stream=stream, model_requested=model, normalizations=tuple(notes.items),
                    extra=extra)


# ---------------------------------------------------------------------------------------------------------------
# response: chat stream -> Anthropic SSE events, Message body
# ---------------------------------------------------------------------------------------------------------------


def _stop(c: Completion, plan: ChatPlan | None = None) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) told to the agent."""
    if c.finish_reason == "tool_calls" or c.tool_calls:
        return "tool_use", None
    if c.finish_reason == "length":
        return "max_tokens", None
    if isinstance(c.stop_reason, str):
        # vLLM reports a matched stop string only for the request's own `stop` list.
        stops = (plan.chat.get("stop") or ()) if plan is not None else None
        if stops is None or c.stop_reason in stops:
            return "stop_sequence", c.stop_reason
    return "end_turn", None


def provider_stop_reason(c: Completion, plan: ChatPlan | None = None) -> str:
    """The Anthropic stop_reason for a backend completion: end_turn, max_tokens, stop_sequence or tool_use."""
    return _stop(c, plan)[0]


def _event(kind: str, payload: dict) -> bytes:
    return sse(kind, orjson.dumps({"type": kind, **payload}))


def _usage(input_tokens: int, output_tokens: int) -> dict:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def _tool_input(arguments: str) -> dict:
    """The model's argument text as the tool_use `input` object; text that is not a JSON object gives {}."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class Encoder:
    """OpenAI chat deltas → Anthropic SSE events, and the non-streaming Message body."""

    def __init__(self, ctx: EncodeContext):
        self.ctx = ctx
        rid = ctx.response_id
        self.message_id = rid if rid.startswith("msg_") else f"msg_{rid}"
        self.signature = base64.b64encode(SIGNATURE_MARKER + rid.encode()).decode()
        self.started = False
        self.next_index = 0
        self.open: tuple[str, int] | None = None  # (kind, backend tool index or -1), for the open block
        self.tool_blocks: dict[int, int] = {}  # backend tool index → block index
        self.notes: list[str] = []  # nothing to note while encoding Anthropic events

    def _tool_id(self, call_id: str | None, index: int) -> str:
        if call_id and _ID_OK.match(call_id):
            return call_id
        return f"toolu_{re.sub(r'[^A-Za-z0-9_-]', '_', self.ctx.response_id)}_{index}"

    # -- streaming -------------------------------------------------------------------------------------------

    def start(self) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        message = {"id": self.message_id, "type": "message", "role": "assistant", "model": self.ctx.model,
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": _usage(self.ctx.prompt_tokens or 0, 0)}
        return [_event("message_start", {"message": message}), _event("ping", {})]

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        out = []
        if self.open[0] == "thinking":
            out.append(_event("content_block_delta", {
                "index": self.next_index - 1, "delta": {"type": "signature_delta", "signature": self.signature}}))
        out.append(_event("content_block_stop", {"index": self.next_index - 1}))
        self.open = None
        return out

    def _open(self, kind: str, block: dict, tool_index: int = -1) -> list[bytes]:
        out = self._close()
        self.open = (kind, tool_index)
        out.append(_event("content_block_start", {"index": self.next_index, "content_block": block}))
        self.next_index += 1
        return out

    def delta(self, d: Delta) -> list[bytes]:
        out = self.start()
        if d.reasoning:
            if self.open is None or self.open[0] != "thinking":
                out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(_event("content_block_delta", {
                "index": self.next_index - 1, "delta": {"type": "thinking_delta", "thinking": d.reasoning}}))
        if d.text:
            if self.open is None or self.open[0] != "text":
                out += self._open("text", {"type": "text", "text": ""})
            out.append(_event("content_block_delta", {
                "index": self.next_index - 1, "delta": {"type": "text_delta", "text": d.text}}))
        for tc in d.tool_calls:
            if tc.index not in self.tool_blocks:
                out += self._open("tool_use", {"type": "tool_use", "id": self._tool_id(tc.id, tc.index),
                                               "name": tc.name or "", "input": {}}, tc.index)
                self.tool_blocks[tc.index] = self.next_index - 1
            if tc.arguments:
                # vLLM streams one call after another; a late fragment still goes to its own block's index.
                out.append(_event("content_block_delta", {
                    "index": self.tool_blocks[tc.index],
                    "delta": {"type": "input_json_delta", "partial_json": tc.arguments}}))
        return out

    def finish(self, c: Completion) -> list[bytes]:
        out = self.start() + self._close()
        stop_reason, stop_sequence = _stop(c, self.ctx.plan)
        out.append(_event("message_delta", {
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": {"input_tokens": c.prompt_tokens, "output_tokens": c.completion_tokens}}))
        out.append(_event("message_stop", {}))
        return out

    def error(self, e: GatewayError) -> list[bytes]:
        """A mid-stream failure: Anthropic's `error` event (the SDK raises it as an API error)."""
        _, kind = _error_status_type(e)
        return [sse("error", orjson.dumps({"type": "error", "error": {"type": kind, "message": _error_message(e)}}))]

    # -- non-streaming ---------------------------------------------------------------------------------------

    def response(self, c: Completion) -> dict:
        content: list[dict] = []
        if c.reasoning:
            content.append({"type": "thinking", "thinking": c.reasoning, "signature": self.signature})
        if c.content:
            content.append({"type": "text", "text": c.content})
        for i, call in enumerate(c.tool_calls):
            content.append({"type": "tool_use", "id": self._tool_id(call.id, i), "name": call.name,
                            "input": _tool_input(call.arguments)})
        stop_reason, stop_sequence = _stop(c, self.ctx.plan)
        return {"id": self.message_id, "type": "message", "role": "assistant", "model": self.ctx.model,
                "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
                "usage": _usage(c.prompt_tokens, c.completion_tokens)}


# ---------------------------------------------------------------------------------------------------------------
# errors and token counts
# ---------------------------------------------------------------------------------------------------------------


def _error_status_type(e: GatewayError) -> tuple[int, str]:
    status, kind = ANTHROPIC_ERRORS.get(e.kind, (529, "overloaded_error"))
    # A backend 4xx is passed on as such; any backend 5xx is Anthropic's 529 (the error table in docs/architecture.md).
    if e.status is not None and 400 <= e.status < 500 and e.status != status:
        return e.status, ANTHROPIC_STATUS_TYPES.get(e.status, "api_error")
    return status, kind


def _error_message(e: GatewayError) -> str:
    # Claude Code compacts its context when the message starts with "prompt is too long".
    if e.kind == "context_overflow" and not e.message.startswith("prompt is too long"):
        return f"prompt is too long: {e.message}"
    return e.message


def error_response(e: GatewayError) -> tuple[int, bytes]:
    """A failure before response headers: (status, Anthropic error JSON), per the error table in
    docs/architecture.md."""
    status, kind = _error_status_type(e)
    return status, orjson.dumps({"type": "error", "error": {"type": kind, "message": _error_message(e)}})


def count_tokens_response(n: int, route: Route | None = None) -> dict:
    return {"input_tokens": n}
