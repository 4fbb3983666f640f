"""OpenAI Responses: api.openai.com/v1/responses (SDKs, Pi, Codex with an API key) and
chatgpt.com/backend-api/codex/responses (Codex with a ChatGPT login).

The agent sends a list of typed items; `to_chat` folds them into OpenAI chat messages. One assistant turn is the
run of `reasoning`, assistant `message` and `function_call` / `custom_tool_call` items between two non-assistant
items: it becomes one assistant message (reasoning as `reasoning_content`, text as `content`, calls as
`tool_calls`), which is the shape the Encoder produces, so a turn round-trips unchanged. A `reasoning` or assistant
`message` item that follows text or calls in the same run starts a new assistant message.

Mapping rules (docs/architecture.md, step 3 of one call):
- A freeform `custom` tool becomes a function of the same name with one required string parameter `input`; the
  model's `{"input": …}` arguments are answered as a `custom_tool_call` whose input is that string, streamed as
  `response.custom_tool_call_input.delta` while the JSON string is being decoded.
- Tools in a `namespace` keep their bare name in the `functions` namespace (Codex's default one) and become
  `<namespace>__<name>` elsewhere. Echoed history items with a `namespace` follow the same rule, and a call to a
  namespaced tool is answered with the bare `name` plus `namespace`, the shape the SDK's items carry.
- Reasoning leaves as one `summary_text` part holding the model's whole reasoning (no summarizer exists here), and,
  when the agent includes `reasoning.encrypted_content`, also as our own encoding `polar:v1:<base64 of the text>`.
  Codex does not echo reasoning text back, only `encrypted_content`, so that is the round-trip channel; reasoning
  encrypted by someone else cannot be read and is dropped (noted).
- Server-side tools (web search, file search, …) are dropped and noted; nothing here can run them.
- No state is stored: `previous_response_id`, `conversation`, `item_reference`, stored prompts and file ids are
  the provider's 400.

Routes: `POST` on the two generation paths generates; `POST /v1/responses/input_tokens` counts tokens; a `GET`
with `Upgrade: websocket` on a generation path is `websocket` (the gateway answers 426 and Codex falls back to
HTTPS at once; a 503 would cost it ~6 s: docs/field-notes.md, the agent CLIs). Every other path on chatgpt.com and on
api.openai.com is `not_found`, except `/v1/chat/completions`, which belongs to the chat codec (route returns None).

Compaction (Codex's remote compaction v2, which Codex 0.171 uses with the openai provider): a request whose input
holds a `compaction_trigger` item asks for a summary of the conversation. The gateway generates it like any call
(recorded and trainable: the processor's rule 12 recognises the call), with COMPACTION_PROMPT appended as a user
message and `tool_choice` none, and answers with exactly one `compaction` output item whose `encrypted_content` is
our encoding of the summary text (`polar:v1:`, as for reasoning). A `compaction` item in a later input is that
summary again: it becomes a user message, SUMMARY_PREFIX and the text; one encoded by someone else cannot be read
and is dropped (noted).

Session keys, in order: header `session-id` (Codex), header `session_id` (Pi), body `prompt_cache_key`.

Sections, in every codec's order (`base.Codec`): constants · route and session key · request (to_chat) ·
response (provider_stop_reason, Encoder) · errors and token counts.
"""

from __future__ import annotations

import base64
import binascii
import re
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
    header,
    host_name,
    is_int,
    number_between,
    openai_error,
    sse,
)

# ---------------------------------------------------------------------------------------------------------------
# constants
# ---------------------------------------------------------------------------------------------------------------

PROTOCOL = "openai_responses"
STREAM_CONTENT_TYPE = "text/event-stream; charset=utf-8"
JSON_CONTENT_TYPE = "application/json"

OPENAI_HOST = "api.openai.com"
CHATGPT_HOST = "chatgpt.com"
_GENERATE_PATHS = {OPENAI_HOST: "/v1/responses", CHATGPT_HOST: "/backend-api/codex/responses"}
_COUNT_PATHS = {OPENAI_HOST: "/v1/responses/input_tokens"}
_CHAT_PATH = "/v1/chat/completions"  # the chat codec's

DEFAULT_NAMESPACE = "functions"  # Codex's own namespace: its tools keep their bare names
NAMESPACE_SEP = "__"
ENCRYPTED_PREFIX = "polar:v1:"  # our reasoning encoding, so we know what we can read back

_SERVER_TOOLS = ("web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26",
                 "file_search", "computer_use_preview", "computer_use", "code_interpreter", "image_generation",
                 "mcp", "local_shell", "shell", "apply_patch", "tool_search")
# Stateful features: the gateway keeps no responses, conversations, prompts or files.
_STATEFUL_FIELDS = {
    "previous_response_id": "previous_response_id is not supported: this gateway stores no responses; send the "
                            "whole conversation in `input` (with store: false)",
    "conversation": "conversation is not supported: this gateway stores no conversations; send the whole "
                    "conversation in `input`",
    "prompt": "stored prompt templates (`prompt`) are not supported: send `instructions` and `input` instead",
}
# Fields that never reach the backend and change nothing about the generation: dropped without a note.
_SILENT_FIELDS = ("model", "input", "instructions", "stream", "stream_options", "metadata", "user",
                  "safety_identifier", "client_metadata", "prompt_cache_key", "prompt_cache_retention", "store",
                  "include", "tools", "tool_choice", "parallel_tool_calls", "reasoning", "text", "max_output_tokens",
                  "temperature", "top_p", "top_logprobs", "background")
_INCLUDE_ENCRYPTED = "reasoning.encrypted_content"
_INCLUDE_LOGPROBS = "message.output_text.logprobs"
_NOTED_ITEMS = ("configuration_update",)  # Codex's turn settings; nothing for the model to see
# Remote compaction v2 (module docstring): the instruction the model summarises under, and the head of the user
# message a summary comes back as.
COMPACTION_PROMPT = ("Summarise the conversation so far for whoever continues it: the task, what has been done and "
                     "learned, the state of the files, and what remains to do. Reply with the summary only.")
SUMMARY_PREFIX = "Summary of the conversation so far (the context was compacted):\n"
_MESSAGE_ROLES = ("user", "assistant", "system", "developer")


# ---------------------------------------------------------------------------------------------------------------
# route and session key
# ---------------------------------------------------------------------------------------------------------------


def route(method: str, host: str, path: str, headers: Any = None) -> Route | None:
    """Responses generation (and its websocket upgrade, and token counting) on the provider hosts; any other path
    there is `not_found` (a fast provider-shaped 404)."""
    host = host_name(host)
    if host not in _GENERATE_PATHS:
        return None
    bare = (path or "/").split("?", 1)[0].split("#", 1)[0]
    if host == OPENAI_HOST and bare.rstrip("/") == _CHAT_PATH:
        return None
    method = (method or "").upper()
    bare = bare.rstrip("/") or "/"
    if bare == _GENERATE_PATHS[host]:
        if method == "POST":
            return Route(protocol=PROTOCOL, kind="generate")
        upgrade = (header(headers, "upgrade") or "").lower()
        if method == "GET" and "websocket" in upgrade:
            return Route(protocol=PROTOCOL, kind="websocket")
    elif bare == _COUNT_PATHS.get(host) and method == "POST":
        return Route(protocol=PROTOCOL, kind="count_tokens", stream=False)
    return Route(protocol=PROTOCOL, kind="not_found")


def session_key(headers: Any, body: dict | None) -> SessionKey | None:
    """Codex's `session-id` header, Pi's `session_id` header, else the body's `prompt_cache_key`."""
    for name in ("session-id", "session_id"):
        value = header(headers, name)
        if value:
            return SessionKey(source=f"harness:{name}", value=value)
    if isinstance(body, dict):
        key = body.get("prompt_cache_key")
        if isinstance(key, str) and key:
            return SessionKey(source="harness:prompt_cache_key", value=key)
    return None


def stream_content_type(route: Route) -> str:
    """Every Responses stream is SSE."""
    return STREAM_CONTENT_TYPE


# ---------------------------------------------------------------------------------------------------------------
# request: Responses -> OpenAI chat
# ---------------------------------------------------------------------------------------------------------------


def _fail(message: str) -> AgentInputError:
    return AgentInputError(message)


def chat_tool_name(name: str, namespace: str | None) -> str:
    """The backend's name for a tool: bare in Codex's `functions` namespace or none, else `<namespace>__<name>`."""
    if namespace and namespace != DEFAULT_NAMESPACE:
        return f"{namespace}{NAMESPACE_SEP}{name}"
    return name


def encode_reasoning(text: str) -> str:
    """Our `encrypted_content`: readable only by us, and exact."""
    return ENCRYPTED_PREFIX + base64.b64encode(text.encode()).decode()


def decode_reasoning(blob: str) -> str | None:
    """The reasoning text of one of our `encrypted_content` values; None when someone else encrypted it."""
    if not blob.startswith(ENCRYPTED_PREFIX):
        return None
    try:
        return base64.b64decode(blob[len(ENCRYPTED_PREFIX):], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise _fail("a reasoning item's encrypted_content is corrupt (it was produced by this gateway)") from exc


class _Tools:
    """The agent's tools as chat function tools, with the way back from each chat name."""

    def __init__(self, notes: Notes):
        self.notes = notes
        self.chat: list[dict] = []
        self.names: dict[str, list] = {}  # chat name -> [namespace or None, bare name, "function" | "custom"]

    def add_all(self, tools: Any, where: str, namespace: str | None = None) -> None:
        if not isinstance(tools, list):
            raise _fail(f"{where} must be a list of tools")
        for i, tool in enumerate(tools):
            self.add(tool, f"{where}[{i}]", namespace)

    def add(self, tool: Any, where: str, namespace: str | None) -> None:
        if not isinstance(tool, dict):
            raise _fail(f"{where}: each tool must be an object")
        kind = tool.get("type")
        if kind == "namespace":
            if namespace is not None:
                raise _fail(f"{where}: namespaces cannot be nested")
            ns = tool.get("name")
            if not isinstance(ns, str) or not ns:
                raise _fail(f"{where}: a namespace needs a string 'name'")
            if ns != DEFAULT_NAMESPACE:
                self.notes.add(f"namespaced_tools:{ns}")
            self.add_all(tool.get("tools"), f"{where}.tools", ns)
            return
        if kind in ("function", "custom"):
            name = tool.get("name")
            if not isinstance(name, str) or not name:
                raise _fail(f"{where}: a {kind} tool needs a string 'name'")
            fn: dict[str, Any] = {"name": chat_tool_name(name, namespace)}
            description = tool.get("description")
            if description is not None and not isinstance(description, str):
                raise _fail(f"{where}: 'description' must be a string")
            if description:
                fn["description"] = description
            if kind == "function":
                params = tool.get("parameters")
                if params is None:
                    params = {"type": "object", "properties": {}}
                if not isinstance(params, dict):
                    raise _fail(f"{where}: 'parameters' must be a JSON schema object")
                fn["parameters"] = params
            else:
                fmt = tool.get("format")
                if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
                    # A lark/regex grammar constrains the real model's input; vLLM gets a plain string.
                    self.notes.add(f"custom_tool_grammar_unenforced:{fn['name']}")
                fn["parameters"] = {
                    "type": "object",
                    "properties": {"input": {"type": "string", "description": "The raw input of this tool."}},
                    "required": ["input"],
                    "additionalProperties": False,
                }
                self.notes.add(f"custom_tool_as_function:{fn['name']}")
            entry = {"type": "function", "function": fn}
            chat_name = fn["name"]
            if chat_name in self.names:
                if any(t == entry for t in self.chat):
                    self.notes.add(f"duplicate_tool_dropped:{chat_name}")
                    return
                raise _fail(f"{where}: two different tools are both named {chat_name!r}")
            self.names[chat_name] = [namespace, name, kind]
            self.chat.append(entry)
            return
        if kind in _SERVER_TOOLS or (isinstance(kind, str) and kind.startswith("web_search")):
            self.notes.add(f"dropped_server_tool:{kind}")
            return
        raise _fail(f"{where}: tool type {kind!r} is not supported")


def _text_of(parts: list, where: str) -> str:
    out = []
    for i, part in enumerate(parts):
        if not isinstance(part, dict) or not isinstance(part.get("text"), str):
            raise _fail(f"{where}[{i}]: expected a text part with a string 'text'")
        out.append(part["text"])
    return "".join(out)


def _image_part(part: dict, where: str) -> dict:
    url = part.get("image_url")
    if not isinstance(url, str) or not url:
        if part.get("file_id"):
            raise _fail(f"{where}: input_image with a file_id is not supported (no file storage); send image_url")
        raise _fail(f"{where}: input_image needs a string 'image_url'")
    image: dict[str, Any] = {"url": url}
    if isinstance(part.get("detail"), str):
        image["detail"] = part["detail"]
    return {"type": "image_url", "image_url": image}


def _parts(content: Any, where: str, *, images: bool) -> str | list:
    """Responses content (a string or typed parts) as chat content: a string when it is only text, else parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _fail(f"{where}: 'content' must be a string or a list of content parts")
    out: list[dict] = []
    for i, part in enumerate(content):
        pw = f"{where}[{i}]"
        if not isinstance(part, dict):
            raise _fail(f"{pw}: each content part must be an object")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            if not isinstance(part.get("text"), str):
                raise _fail(f"{pw}: a {kind} part needs a string 'text'")
            out.append({"type": "text", "text": part["text"]})
        elif kind == "refusal":
            if not isinstance(part.get("refusal"), str):
                raise _fail(f"{pw}: a refusal part needs a string 'refusal'")
            out.append({"type": "text", "text": part["refusal"]})
        elif kind == "input_image":
            if not images:
                raise _fail(f"{pw}: input_image is only supported in user messages and tool outputs")
            out.append(_image_part(part, pw))
        elif kind in ("input_file", "input_audio"):
            raise _fail(f"{pw}: {kind} parts are not supported by this gateway")
        else:
            raise _fail(f"{pw}: content part type {kind!r} is not supported")
    if all(p["type"] == "text" for p in out):
        # Concatenated, not a parts list: the backend would join parts with newlines the agent never sent.
        return "".join(p["text"] for p in out)
    return out


def _tool_output(item: dict, where: str) -> str | list:
    output = item.get("output")
    if isinstance(output, dict) and isinstance(output.get("content"), str):  # older Codex: {content, success}
        return output["content"]
    if output is None:
        raise _fail(f"{where}: 'output' is required")
    return _parts(output, f"{where}.output", images=True)


class _Folder:
    """Folds Responses input items into chat messages (see the module docstring for the turn rule)."""

    def __init__(self, tools: _Tools, notes: Notes):
        self.tools = tools
        self.notes = notes
        self.messages: list[dict] = []
        self.turn: dict | None = None  # the assistant message being assembled
        self.compaction = False  # the input asked for a summary (a compaction_trigger item)

    def flush(self) -> None:
        if self.turn is not None:
            if self.turn.get("content") is None and not self.turn.get("tool_calls"):
                self.turn["content"] = ""
            self.messages.append(self.turn)
            self.turn = None

    def _assistant(self, *, fresh_after_output: bool) -> dict:
        """The open assistant turn; a new one when `fresh_after_output` and this one already has text or calls."""
        if self.turn is not None and fresh_after_output and (self.turn.get("content") or
                                                             self.turn.get("tool_calls")):
            self.flush()
        if self.turn is None:
            self.turn = {"role": "assistant", "content": None}
        return self.turn

    def message(self, item: dict, where: str) -> None:
        role = item.get("role")
        if role not in _MESSAGE_ROLES:
            raise _fail(f"{where}: message role {role!r} is not supported (expected one of "
                        f"{', '.join(_MESSAGE_ROLES)})")
        if "content" not in item:
            raise _fail(f"{where}: a message needs 'content'")
        if role == "assistant":
            content = _parts(item["content"], f"{where}.content", images=False)
            turn = self._assistant(fresh_after_output=True)
            turn["content"] = content
            return
        self.flush()
        if role == "developer":
            role = "system"
            self.notes.add("developer_as_system")
        self.messages.append({"role": role, "content": _parts(item["content"], f"{where}.content",
                                                               images=role == "user")})

    def call(self, item: dict, where: str, custom: bool) -> None:
        name, call_id = item.get("name"), item.get("call_id")
        if not isinstance(name, str) or not name:
            raise _fail(f"{where}: a {item['type']} needs a string 'name'")
        if not isinstance(call_id, str) or not call_id:
            raise _fail(f"{where}: a {item['type']} needs a string 'call_id'")
        namespace = item.get("namespace")
        if namespace is not None and not isinstance(namespace, str):
            raise _fail(f"{where}: 'namespace' must be a string")
        if custom:
            value = item.get("input")
            if not isinstance(value, str):
                raise _fail(f"{where}: a custom_tool_call needs a string 'input'")
            arguments = orjson.dumps({"input": value}).decode()
        else:
            arguments = item.get("arguments")
            if arguments is None:
                arguments = ""
            if not isinstance(arguments, str):
                raise _fail(f"{where}: function_call 'arguments' must be a JSON string")
        turn = self._assistant(fresh_after_output=False)
        turn.setdefault("tool_calls", []).append({
            "id": call_id, "type": "function",
            "function": {"name": chat_tool_name(name, namespace), "arguments": arguments}})

    def output(self, item: dict, where: str) -> None:
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            raise _fail(f"{where}: a {item['type']} needs a string 'call_id'")
        self.flush()
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": _tool_output(item, where)})

    def reasoning(self, item: dict, where: str) -> None:
        text: str | None = None
        blob = item.get("encrypted_content")
        if isinstance(blob, str) and blob:
            text = decode_reasoning(blob)
            if text is None:
                self.notes.add("foreign_reasoning_dropped")
                return
        if text is None:
            # No encoding of ours: the visible text (our summary is the whole reasoning), raw content first.
            for key in ("content", "summary"):
                parts = item.get(key)
                if isinstance(parts, list) and parts:
                    text = _text_of(parts, f"{where}.{key}")
                    break
        if not text:
            self.notes.add("reasoning_dropped")
            return
        turn = self._assistant(fresh_after_output=True)
        turn["reasoning_content"] = (turn.get("reasoning_content") or "") + text

    def summary(self, item: dict) -> None:
        """A `compaction` item: our summary back as a user message; someone else's cannot be read (noted)."""
        blob = item.get("encrypted_content")
        text = decode_reasoning(blob) if isinstance(blob, str) and blob else None
        if not text:
            self.notes.add("foreign_compaction_dropped")
            return
        self.flush()
        self.messages.append({"role": "user", "content": SUMMARY_PREFIX + text})

    def item(self, item: Any, where: str) -> None:
        if not isinstance(item, dict):
            raise _fail(f"{where}: each input item must be an object")
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"  # the easy-input shape {role, content}
        if kind == "message":
            self.message(item, where)
        elif kind in ("function_call", "custom_tool_call"):
            self.call(item, where, custom=kind == "custom_tool_call")
        elif kind in ("function_call_output", "custom_tool_call_output"):
            self.output(item, where)
        elif kind == "reasoning":
            self.reasoning(item, where)
        elif kind == "additional_tools":
            # Codex (default model) puts its tools in the input instead of the top-level `tools`.
            self.tools.add_all(item.get("tools"), f"{where}.tools")
            self.notes.add("additional_tools_as_tools")
        elif kind == "item_reference":
            raise _fail(f"{where}: item_reference is not supported: this gateway stores no items; send the item")
        elif kind == "compaction_trigger":
            self.compaction = True
            self.notes.add("compaction_request")
        elif kind == "compaction":
            self.summary(item)
        elif kind in _NOTED_ITEMS:
            self.notes.add(f"ignored_item:{kind}")
        else:
            self.notes.add(f"dropped_item:{kind}")


def _tool_choice(choice: Any, tools: _Tools) -> Any:
    """The chat tool_choice, checked against the tools (allowed_tools filters them)."""
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind in ("function", "custom"):
            name = choice.get("name")
            if not isinstance(name, str) or not name:
                raise _fail(f"tool_choice: a {kind} choice needs a string 'name'")
            chat_name = chat_tool_name(name, choice.get("namespace"))
            if chat_name not in tools.names:
                raise _fail(f"tool_choice names {name!r}, which is not among the tools")
            return {"type": "function", "function": {"name": chat_name}}
        if kind == "allowed_tools":
            mode = choice.get("mode", "auto")
            allowed = set()
            for t in choice.get("tools") or []:
                if isinstance(t, dict) and isinstance(t.get("name"), str):
                    allowed.add(chat_tool_name(t["name"], t.get("namespace")))
            tools.chat = [t for t in tools.chat if t["function"]["name"] in allowed]
            tools.notes.add("allowed_tools_filtered")
            if mode not in ("auto", "required"):
                raise _fail("tool_choice.mode must be 'auto' or 'required'")
            return mode
        if kind in _SERVER_TOOLS or (isinstance(kind, str) and kind.startswith("web_search")):
            raise _fail(f"tool_choice {kind!r} forces a server-side tool, which this gateway cannot run")
    raise _fail(f"tool_choice {choice!r} is not supported")


def _response_format(text: Any, notes: Notes) -> dict | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise _fail("'text' must be an object")
    if text.get("verbosity") is not None:
        notes.add("dropped_text_verbosity")
    fmt = text.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if not isinstance(fmt, dict):
        raise _fail("text.format must be an object")
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise _fail("text.format json_schema needs a 'schema' object")
        schema = {"name": fmt.get("name") or "response", "schema": fmt["schema"]}
        for key in ("strict", "description"):
            if fmt.get(key) is not None:
                schema[key] = fmt[key]
        return {"type": "json_schema", "json_schema": schema}
    raise _fail(f"text.format type {fmt.get('type')!r} is not supported")


def _thinking(reasoning: Any) -> tuple[bool | None, dict | None]:
    """The agent's thinking intent (True/False/None) and the reasoning settings to echo."""
    if reasoning is None:
        return None, None
    if not isinstance(reasoning, dict):
        raise _fail("'reasoning' must be an object")
    effort = reasoning.get("effort")
    echo = {"effort": effort, "summary": reasoning.get("summary")}
    if effort is None:
        return None, echo
    return effort != "none", echo


def _refuse_stateful(body: dict) -> None:
    """Stored responses, conversations, prompts and background runs need state this gateway does not keep."""
    for key, message in _STATEFUL_FIELDS.items():
        if body.get(key) not in (None, ""):
            raise _fail(message)
    if body.get("background"):
        raise _fail("background responses are not supported: this gateway stores no responses")


def _fold_input(body: dict, tools: _Tools, folder: _Folder) -> None:
    """instructions, the agent's tools and its `input` items into `folder.messages` and `tools`."""
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _fail("'instructions' must be a string")
        if instructions:
            folder.messages.append({"role": "system", "content": instructions})
    if body.get("tools") is not None:
        tools.add_all(body["tools"], "tools")
    items = body.get("input")
    if isinstance(items, str):
        folder.messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        for i, item in enumerate(items):
            folder.item(item, f"input[{i}]")
        folder.flush()
    elif items is not None:
        raise _fail("'input' must be a string or a list of input items")
    if not folder.messages:
        raise _fail("the request has no input: send `input` (a string or a list of items)")


def _tool_fields(body: dict, tools: _Tools, chat: dict, notes: Notes) -> None:
    """tools, tool_choice and parallel_tool_calls into `chat`."""
    choice = _tool_choice(body.get("tool_choice"), tools)
    if tools.chat:
        chat["tools"] = tools.chat
        if choice is not None:
            chat["tool_choice"] = choice
    elif choice is not None and choice != "none":
        notes.add("dropped_tool_choice_without_tools")
    if body.get("parallel_tool_calls") is not None:
        if not isinstance(body["parallel_tool_calls"], bool):
            raise _fail("'parallel_tool_calls' must be a boolean")
        if tools.chat:
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]


def _sampling(body: dict, chat: dict) -> None:
    """temperature, top_p and max_output_tokens, checked, into `chat`."""
    for key, (low, high) in (("temperature", (0.0, 2.0)), ("top_p", (0.0, 1.0))):
        value = number_between(body, key, low, high)
        if value is not None:
            chat[key] = value
    max_out = body.get("max_output_tokens")
    if max_out is not None:
        if not is_int(max_out) or max_out < 1:
            raise _fail("'max_output_tokens' must be a positive integer")
        chat["max_tokens"] = max_out


def _include(body: dict, notes: Notes) -> tuple[list, int | None]:
    """(the `include` list, the top-k the agent asked logprobs for, None when it did not ask)."""
    include = body.get("include") or []
    if not isinstance(include, list):
        raise _fail("'include' must be a list")
    top_logprobs = body.get("top_logprobs")
    if top_logprobs is not None and (not isinstance(top_logprobs, int) or not 0 <= top_logprobs <= 20):
        raise _fail("'top_logprobs' must be an integer between 0 and 20")
    agent_top_logprobs = None
    if _INCLUDE_LOGPROBS in include or top_logprobs is not None:
        agent_top_logprobs = top_logprobs or 0
    for entry in include:
        if entry not in (_INCLUDE_ENCRYPTED, _INCLUDE_LOGPROBS):
            notes.add(f"dropped_include:{entry}")
    return include, agent_top_logprobs


def _echo(body: dict, reasoning_echo: dict | None) -> dict:
    """The request settings a Response object repeats back to the agent."""
    instructions = body.get("instructions")
    return {
        "instructions": instructions if isinstance(instructions, str) else None,
        "max_output_tokens": body.get("max_output_tokens"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "tool_choice": body.get("tool_choice", "auto"),
        "reasoning": reasoning_echo,
        "store": body.get("store", True),
        "text": body.get("text") if isinstance(body.get("text"), dict) else {"format": {"type": "text"}},
        "prompt_cache_key": body.get("prompt_cache_key"),
        "metadata": body.get("metadata") if isinstance(body.get("metadata"), dict) else {},
        "truncation": body.get("truncation") or "disabled",
    }


def to_chat(body: dict, route: Route | None = None) -> ChatPlan:
    """A Responses request as an OpenAI chat request; raises AgentInputError (the provider's 400) on bad input."""
    if not isinstance(body, dict):
        raise _fail("the request body must be a JSON object")
    _refuse_stateful(body)
    notes = Notes()
    tools = _Tools(notes)
    folder = _Folder(tools, notes)
    _fold_input(body, tools, folder)

    folder.flush()
    if folder.compaction:  # a summary, not a turn: the instruction last, and no tool call to answer with
        folder.messages.append({"role": "user", "content": COMPACTION_PROMPT})
    chat: dict[str, Any] = {"messages": folder.messages}
    _tool_fields(body, tools, chat, notes)
    if folder.compaction and chat.get("tools"):
        chat["tool_choice"] = "none"
    _sampling(body, chat)
    response_format = _response_format(body.get("text"), notes)
    if response_format is not None:
        chat["response_format"] = response_format
    include, agent_top_logprobs = _include(body, notes)
    thinking, reasoning_echo = _thinking(body.get("reasoning"))
    if body.get("truncation") not in (None, "disabled"):
        notes.add("dropped_truncation")  # "auto" would cut the context; the gateway answers overflow with a 400
    for key in body:
        if key not in _SILENT_FIELDS and key not in ("truncation",) and key not in _STATEFUL_FIELDS:
            notes.add(f"dropped_field:{key}")

    model = body.get("model")
    extra = {
        "thinking": thinking,
        "reasoning_effort": (reasoning_echo or {}).get("effort"),
        "tool_names": tools.names,
        "encrypted_reasoning": _INCLUDE_ENCRYPTED in include,
        "echo": _echo(body, reasoning_echo),
        "compaction": folder.compaction,
    }
    return ChatPlan(chat=chat, stream=bool(body.get("stream")), model_requested=model if isinstance(model, str)
                    else None, normalizations=tuple(notes.items), agent_top_logprobs=agent_top_logprobs,
                    extra=extra)


# ---------------------------------------------------------------------------------------------------------------
# response: chat stream -> Responses events, Response object
# ---------------------------------------------------------------------------------------------------------------


def provider_stop_reason(c: Completion, plan: ChatPlan | None = None) -> str:
    """What the agent was told: the response status, with the reason when incomplete."""
    return "incomplete:max_output_tokens" if c.finish_reason == "length" else "completed"


def _usage(c: Completion) -> dict:
    # The backend does not split reasoning from answer tokens, so reasoning_tokens is 0, not a guess.
    return {"input_tokens": c.prompt_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": c.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": c.prompt_tokens + c.completion_tokens}


def _logprobs(entries: tuple[dict, ...] | list[dict], k: int | None) -> list[dict]:
    """OpenAI chat logprob entries in the Responses shape (no token ids), cut to the agent's top-k."""
    if k is None:
        return []
    out = []
    for e in entries:
        tops = [{"token": t.get("token", ""), "bytes": t.get("bytes") or [], "logprob": t.get("logprob", 0.0)}
                for t in (e.get("top_logprobs") or [])[:k]]
        out.append({"token": e.get("token", ""), "bytes": e.get("bytes") or [], "logprob": e.get("logprob", 0.0),
                    "top_logprobs": tops})
    return out


class _CustomInput:
    """Decodes the `input` string of `{"input": "…"}` arguments while they stream, so a custom tool call's input
    reaches the agent as it is generated. Arguments of any other shape are only decoded at the end."""

    _HEAD = re.compile(r'\s*\{\s*"input"\s*:\s*"')
    _ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}

    def __init__(self) -> None:
        self.raw = ""
        self.pos: int | None = None  # where undecoded string characters start; None until the head is seen
        self.closed = False  # the string's closing quote was reached
        self.off = False  # not the simple shape: wait for the end
        self.sent = ""  # the decoded input the agent has received

    def feed(self, fragment: str) -> str:
        self.raw += fragment
        if self.off or self.closed:
            return ""
        if self.pos is None:
            m = self._HEAD.match(self.raw)
            if m is None:
                if not self._could_match(self.raw):
                    self.off = True
                return ""
            self.pos = m.end()
        out, i, raw = [], self.pos, self.raw
        while i < len(raw):
            ch = raw[i]
            if ch == '"':
                self.closed = True
                i += 1
                break
            if ch != "\\":
                out.append(ch)
                i += 1
                continue
            if i + 1 >= len(raw):
                break
            esc = raw[i + 1]
            if esc in self._ESCAPES:
                out.append(self._ESCAPES[esc])
                i += 2
                continue
            if esc != "u":
                self.off = True
                break
            if i + 6 > len(raw):
                break
            try:
                code = int(raw[i + 2:i + 6], 16)
            except ValueError:
                self.off = True
                break
            if 0xD800 <= code < 0xDC00:  # a surrogate pair needs its second half
                if i + 12 > len(raw):
                    break
                if raw[i + 6:i + 8] == "\\u":
                    try:
                        low = int(raw[i + 8:i + 12], 16)
                    except ValueError:
                        low = -1
                    if 0xDC00 <= low < 0xE000:
                        out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                        i += 12
                        continue
                self.off = True
                break
            out.append(chr(code))
            i += 6
        self.pos = i
        text = "".join(out)
        self.sent += text
        return text

    def _could_match(self, raw: str) -> bool:
        """The head may still appear once more text arrives."""
        probe = raw.lstrip()
        target = '{"input":"'
        compact = re.sub(r"\s+", "", probe)
        return target.startswith(compact) or compact.startswith(target)

    def final(self) -> str:
        """The whole input: the decoded JSON value when the arguments are `{"input": string}`, else what was
        streamed (a cut-off or broken string), else the raw arguments as the model wrote them."""
        try:
            value = orjson.loads(self.raw)
        except orjson.JSONDecodeError:
            value = None
        if isinstance(value, dict) and isinstance(value.get("input"), str):
            return value["input"]
        if self.pos is not None:
            # Cut off (length) or broken mid-string: what was streamed, plus any undecodable rest verbatim.
            return self.sent + (self.raw[self.pos:] if self.off else "")
        return self.raw


class Encoder:
    """Backend chat chunks re-emitted as the full Responses event sequence, or one Response object."""

    def __init__(self, ctx: EncodeContext):
        self.ctx = ctx
        rid = ctx.response_id
        self.id = rid if rid.startswith("resp_") else f"resp_{rid}"
        self._sid = self.id[len("resp_"):]
        extra = ctx.plan.extra
        self.tool_names: dict[str, list] = extra.get("tool_names") or {}
        self.encrypted = bool(extra.get("encrypted_reasoning"))
        self.echo: dict = extra.get("echo") or {}
        self.top_k = ctx.plan.agent_top_logprobs
        self.seq = 0
        self.started = False
        self.ended = False
        self.items: list[dict] = []  # output items in output_index order, each with private "_" state
        self.open_text: dict | None = None  # the open reasoning or message item
        self.tools: dict[int, dict] = {}  # backend tool index -> item
        self.pending_tools: dict[int, dict] = {}  # backend tool index -> {"id", "args"} until a name arrives
        self.notes: list[str] = []  # nothing to note while encoding Responses events
        self.compaction = bool(extra.get("compaction"))  # answer with one compaction item (module docstring)

    # -- shapes ----------------------------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(kind, orjson.dumps(data))

    def _response(self, status: str, output: list[dict], usage: dict | None = None,
                  error: dict | None = None, incomplete: str | None = None) -> dict:
        echo = self.echo
        return {
            "id": self.id, "object": "response", "created_at": self.ctx.created, "status": status,
            "background": False, "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": echo.get("instructions"), "max_output_tokens": echo.get("max_output_tokens"),
            "model": self.ctx.model, "output": output,
            "parallel_tool_calls": echo.get("parallel_tool_calls", True), "previous_response_id": None,
            "prompt_cache_key": echo.get("prompt_cache_key"),
            "reasoning": echo.get("reasoning") or {"effort": None, "summary": None},
            "store": echo.get("store", True), "temperature": echo.get("temperature"),
            "text": echo.get("text") or {"format": {"type": "text"}},
            "tool_choice": echo.get("tool_choice", "auto"),
            # The agent's tool definitions are not echoed: Codex's run to ~70 KB and every client has them.
            "tools": [], "top_p": echo.get("top_p"), "truncation": echo.get("truncation", "disabled"),
            "usage": usage, "user": None, "metadata": echo.get("metadata") or {},
        }

    @staticmethod
    def _public(item: dict, status: str | None = None) -> dict:
        out = {k: v for k, v in item.items() if not k.startswith("_")}
        if status is not None and "status" in out:
            out["status"] = status
        return out

    def _new_item(self, kind: str, **fields: Any) -> dict:
        prefix = {"message": "msg", "reasoning": "rs", "function_call": "fc", "custom_tool_call": "ctc"}[kind]
        item = {"id": f"{prefix}_{self._sid}_{len(self.items)}", "type": kind, **fields,
                "_index": len(self.items), "_done": False}
        self.items.append(item)
        return item

    def _call_item(self, index: int, call_id: str | None, name: str) -> dict:
        call_id = call_id or f"call_{self._sid}_{index}"
        namespace, bare, kind = self.tool_names.get(name) or [None, name, "function"]
        fields: dict[str, Any] = {"call_id": call_id, "name": bare}
        if namespace and namespace != DEFAULT_NAMESPACE:
            fields["namespace"] = namespace
        if kind == "custom":
            item = self._new_item("custom_tool_call", status="in_progress", input="", **fields)
            item["_custom"] = _CustomInput()
        else:
            item = self._new_item("function_call", status="in_progress", arguments="", **fields)
        return item

    # -- streaming -------------------------------------------------------------------------------------------

    def start(self) -> list[bytes]:
        """response.created and response.in_progress, once."""
        if self.started:
            return []
        self.started = True
        snapshot = self._response("in_progress", [])
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]

    def _open(self, item: dict) -> list[bytes]:
        out = [self._event("response.output_item.added", output_index=item["_index"],
                           item=self._public(item))]
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self._event("response.content_part.added", item_id=item["id"], output_index=item["_index"],
                                   content_index=0, part=part))
        elif item["type"] == "reasoning":
            out.append(self._event("response.reasoning_summary_part.added", item_id=item["id"],
                                   output_index=item["_index"], summary_index=0,
                                   part={"type": "summary_text", "text": ""}))
        return out

    def _close(self, item: dict, status: str) -> list[bytes]:
        if item["_done"]:
            return []
        item["_done"] = True
        if item is self.open_text:
            self.open_text = None
        idx, iid, out = item["_index"], item["id"], []
        if item["type"] == "message":
            text = item["_text"]
            logprobs = item["_logprobs"]
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
            out.append(self._event("response.output_text.done", item_id=iid, output_index=idx, content_index=0,
                                   text=text, logprobs=logprobs))
            out.append(self._event("response.content_part.done", item_id=iid, output_index=idx, content_index=0,
                                   part=part))
            item["content"] = [part]
        elif item["type"] == "reasoning":
            text = item["_text"]
            out.append(self._event("response.reasoning_summary_text.done", item_id=iid, output_index=idx,
                                   summary_index=0, text=text))
            out.append(self._event("response.reasoning_summary_part.done", item_id=iid, output_index=idx,
                                   summary_index=0, part={"type": "summary_text", "text": text}))
            item["summary"] = [{"type": "summary_text", "text": text}]
            if self.encrypted:
                item["encrypted_content"] = encode_reasoning(text)
        elif item["type"] == "function_call":
            out.append(self._event("response.function_call_arguments.done", item_id=iid, output_index=idx,
                                   arguments=item["arguments"]))
        else:
            custom: _CustomInput = item["_custom"]
            final = custom.final()
            if final.startswith(custom.sent) and len(final) > len(custom.sent):
                rest = final[len(custom.sent):]
                custom.sent = final
                out.append(self._event("response.custom_tool_call_input.delta", item_id=iid, output_index=idx,
                                       delta=rest))
            item["input"] = final
            out.append(self._event("response.custom_tool_call_input.done", item_id=iid, output_index=idx,
                                   input=final))
        if "status" in item:
            item["status"] = status
        out.append(self._event("response.output_item.done", output_index=idx, item=self._public(item)))
        return out

    def _text(self, kind: str, text: str, logprobs: tuple[dict, ...]) -> list[bytes]:
        out: list[bytes] = []
        item = self.open_text
        if item is None or item["type"] != kind:
            if item is not None:
                out += self._close(item, "completed")
            if kind == "message":
                item = self._new_item("message", status="in_progress", content=[], role="assistant")
                item["_text"], item["_logprobs"] = "", []
            else:
                item = self._new_item("reasoning", summary=[])
                item["_text"] = ""
            self.open_text = item
            out += self._open(item)
        item["_text"] += text
        if kind == "message":
            lp = _logprobs(logprobs, self.top_k)
            item["_logprobs"] += lp
            out.append(self._event("response.output_text.delta", item_id=item["id"], output_index=item["_index"],
                                   content_index=0, delta=text, logprobs=lp))
        else:
            out.append(self._event("response.reasoning_summary_text.delta", item_id=item["id"],
                                   output_index=item["_index"], summary_index=0, delta=text))
        return out

    def _tool(self, t: ToolCallDelta, *, nameless: bool = False) -> list[bytes]:
        out: list[bytes] = []
        item = self.tools.get(t.index)
        if item is None:
            pending = self.pending_tools.setdefault(t.index, {"id": None, "args": ""})
            pending["id"] = pending["id"] or t.id
            pending["args"] += t.arguments
            if not t.name and not nameless:
                return out  # a name must come first: the item cannot be announced without one
            del self.pending_tools[t.index]
            if self.open_text is not None:
                out += self._close(self.open_text, "completed")
            item = self.tools[t.index] = self._call_item(t.index, pending["id"], t.name or "")
            out += self._open(item)
            fragment = pending["args"]
        else:
            fragment = t.arguments
        if not fragment:
            return out
        if item["type"] == "function_call":
            item["arguments"] += fragment
            out.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                   output_index=item["_index"], delta=fragment))
        else:
            decoded = item["_custom"].feed(fragment)
            if decoded:
                out.append(self._event("response.custom_tool_call_input.delta", item_id=item["id"],
                                       output_index=item["_index"], delta=decoded))
        return out

    def delta(self, d: Delta) -> list[bytes]:
        """Events for one backend chunk: reasoning summary, output text, tool call argument/input deltas."""
        if self.ended:
            return []
        out = self.start()
        if self.compaction:  # the summary leaves whole, as one compaction item, at the end
            return out
        if d.reasoning:
            out += self._text("reasoning", d.reasoning, ())
        if d.text:
            out += self._text("message", d.text, d.logprobs)
        for t in d.tool_calls:
            out += self._tool(t)
        return out

    def _close_all(self, status: str) -> list[bytes]:
        out: list[bytes] = []
        for index in sorted(self.pending_tools):  # a call whose name never came: announce it as the model gave it
            out += self._tool(ToolCallDelta(index=index), nameless=True)
        for item in self.items:
            if not item["_done"]:
                out += self._close(item, status)
        return out

    def finish(self, c: Completion) -> list[bytes]:
        """Close every item, then response.completed (or response.incomplete when the token budget ran out)."""
        if self.ended:
            return []
        out = self.start()
        if self.compaction:
            self.ended = True
            item = self._compaction_item(c)
            out.append(self._event("response.output_item.added", output_index=0, item=item))
            out.append(self._event("response.output_item.done", output_index=0, item=item))
            out.append(self._event("response.completed", response=self._response("completed", [item], _usage(c))))
            return out
        truncated = c.finish_reason == "length"
        out += self._close_all("incomplete" if truncated else "completed")
        self.ended = True
        output = [self._public(i) for i in self.items]
        if truncated:
            response = self._response("incomplete", output, _usage(c), incomplete="max_output_tokens")
            out.append(self._event("response.incomplete", response=response))
        else:
            out.append(self._event("response.completed", response=self._response("completed", output, _usage(c))))
        return out

    def error(self, e: GatewayError) -> list[bytes]:
        """A mid-stream failure: response.failed, with the items so far marked incomplete."""
        if self.ended:
            return []
        out = self.start()
        self.ended = True
        code = {"rate_limited": "rate_limit_exceeded", "context_overflow": "context_length_exceeded"}.get(
            e.kind, "server_error")
        output = [self._public(i, "incomplete") for i in self.items]
        response = self._response("failed", output, error={"code": code, "message": e.message})
        out.append(self._event("response.failed", response=response))
        return out

    # -- non-streaming ---------------------------------------------------------------------------------------

    @staticmethod
    def _compaction_item(c: Completion) -> dict:
        """The one output item of a compaction request: the summary (the answer's text; its reasoning when it wrote
        none), encoded. A summary cut by the token budget is still the summary there is: the response completes."""
        return {"type": "compaction", "encrypted_content": encode_reasoning((c.content or c.reasoning or "").strip())}

    def response(self, c: Completion) -> dict:
        """The whole Response object for a non-streaming agent, built from the assembled completion."""
        if self.compaction:
            return self._response("completed", [self._compaction_item(c)], _usage(c))
        truncated = c.finish_reason == "length"
        status = "incomplete" if truncated else "completed"
        self.items, self.tools, self.open_text = [], {}, None
        if c.reasoning:
            item = self._new_item("reasoning", summary=[{"type": "summary_text", "text": c.reasoning}])
            if self.encrypted:
                item["encrypted_content"] = encode_reasoning(c.reasoning)
        if c.content:
            part = {"type": "output_text", "text": c.content, "annotations": [],
                    "logprobs": _logprobs(c.logprobs, self.top_k)}
            self._new_item("message", status=status, content=[part], role="assistant")
        for i, call in enumerate(c.tool_calls):
            item = self._call_item(i, call.id, call.name)
            item["status"] = status
            if item["type"] == "custom_tool_call":
                item["_custom"].feed(call.arguments)
                item["input"] = item["_custom"].final()
            else:
                item["arguments"] = call.arguments
        output = [self._public(i) for i in self.items]
        return self._response(status, output, _usage(c), incomplete="max_output_tokens" if truncated else None)


# ---------------------------------------------------------------------------------------------------------------
# errors and token counts
# ---------------------------------------------------------------------------------------------------------------


def error_response(e: GatewayError) -> tuple[int, bytes]:
    """A failure before response headers, as OpenAI's error JSON (the error table in docs/architecture.md)."""
    status, error = openai_error(e, "input")
    return status, orjson.dumps({"error": error})


def count_tokens_response(n: int, route: Route | None = None) -> dict:
    """`POST /v1/responses/input_tokens`: the prompt's token count."""
    return {"object": "response.input_tokens", "input_tokens": n}
