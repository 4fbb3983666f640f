"""Google GenerateContent (Gemini API) ⇄ OpenAI chat.

Endpoints on generativelanguage.googleapis.com, API versions v1, v1beta and v1alpha:
`models/{model}:generateContent` (JSON), `:streamGenerateContent?alt=sse` (SSE, events `data: {…}\\r\\n\\r\\n`),
`:streamGenerateContent` without `alt=sse` (one JSON array written element by element: `[{…}\\n,\\r\\n{…}\\n]`,
Route.sse=False) and `:countTokens`. The model comes from the URL. Every other path on the host is not_found.

Reasoning round trip: Google clients keep only `thoughtSignature` reliably (Gemini CLI drops thought parts from its
history but keeps the signature on function calls), so our signature carries the reasoning text and the backend's
exact argument texts: base64 of `polar:v1:` + JSON {"r": reasoning, "a": [arguments...]}. It must be valid base64
(the google-genai SDK types it as bytes). Echoed back, it restores `reasoning_content` and byte-exact tool-call
arguments on the upstream assistant message. Foreign signatures and the CLI's placeholder are ignored and noted.

Function calls are emitted whole (Google has no argument deltas), in the closing event, once the backend's stream
has ended and every call's arguments are known to be complete.

Sections, in every codec's order (`base.Codec`): constants · route and session key · request (to_chat) ·
response (provider_stop_reason, Encoder) · errors and token counts.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from urllib.parse import parse_qsl, unquote, urlsplit

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
from polar.addon.codecs.wire import Notes, host_name
from polar.addon.provider_errors import GOOGLE_ERRORS, GOOGLE_STATUS_NAMES

# ---------------------------------------------------------------------------------------------------------------
# constants
# ---------------------------------------------------------------------------------------------------------------

PROTOCOL = "google_generate"
STREAM_CONTENT_TYPE = "text/event-stream"
JSON_CONTENT_TYPE = "application/json; charset=UTF-8"

HOST = "generativelanguage.googleapis.com"
_PATH = re.compile(r"^/(v1|v1beta|v1alpha)/models/([^/:]+):(generateContent|streamGenerateContent|countTokens)$")

SIGNATURE_PREFIX = b"polar:v1:"
CLI_PLACEHOLDER_SIGNATURE = "skip_thought_signature_validator"
RAW_ARGUMENTS_KEY = "__raw_arguments__"  # functionCall.args must be an object: invalid JSON text is kept under it
_SERVER_TOOLS = ("googleSearch", "googleSearchRetrieval", "codeExecution", "urlContext", "computerUse",
                 "fileSearch", "googleMaps", "retrieval", "enterpriseWebSearch", "mcpServers")

# Google's Schema type names, and the JSON Schema keywords to_json_schema walks.
_TYPES = {"TYPE_UNSPECIFIED", "STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL"}
_INT_KEYS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties")
_SUB_SCHEMA = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
               "additionalItems", "unevaluatedItems", "unevaluatedProperties")
_SUB_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUB_MAP = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")

# Values that are the agent's own data, never Google field names: copied verbatim.
_VERBATIM = {"args", "response", "parametersJsonSchema", "responseJsonSchema", "labels", "default", "example",
             "enum", "required", "propertyOrdering", "allowedFunctionNames", "stopSequences"}

# Backend finish_reason → Google's finishReason (function calls finish with STOP, like Gemini).
_FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP", "abort": "OTHER", "error": "OTHER"}


# ---------------------------------------------------------------------------------------------------------------
# route and session key
# ---------------------------------------------------------------------------------------------------------------


def route(method: str, host: str, path: str, headers=None) -> Route | None:
    """Google requests are decided by host and path; `path` may carry the query string (alt=sse, key=...)."""
    if host_name(host) != HOST:
        return None
    parts = urlsplit(path)
    m = _PATH.match(parts.path)
    if method.upper() != "POST" or m is None:
        return Route(PROTOCOL, "not_found")
    model, verb = unquote(m.group(2)), m.group(3)
    if verb == "countTokens":
        return Route(PROTOCOL, "count_tokens", stream=False, model=model)
    if verb == "generateContent":
        return Route(PROTOCOL, "generate", stream=False, model=model)
    query = dict(parse_qsl(parts.query))
    alt = query.get("alt", query.get("$alt", "json")).lower()
    return Route(PROTOCOL, "generate", stream=True, model=model, sse=alt == "sse")


def session_key(headers, body) -> SessionKey | None:
    """Gemini CLI and Pi send no per-session key (x-gemini-api-privileged-user-id is an installation id)."""
    return None


def stream_content_type(route: Route) -> str:
    """The content type of a streaming answer: SSE with alt=sse, else the JSON array stream."""
    return STREAM_CONTENT_TYPE if route.sse else JSON_CONTENT_TYPE


# ---------------------------------------------------------------------------------------------------------------
# request: GenerateContent -> OpenAI chat
# ---------------------------------------------------------------------------------------------------------------


def encode_signature(reasoning: str, arguments: list[str]) -> str:
    """Our thoughtSignature: base64 of `polar:v1:` + compact JSON of the reasoning and raw argument texts."""
    payload = orjson.dumps({"r": reasoning, "a": arguments})
    return base64.b64encode(SIGNATURE_PREFIX + payload).decode()


def decode_signature(sig) -> dict | None:
    """Our payload from a signature (standard or URL-safe base64, padding optional), else None."""
    if not isinstance(sig, str) or not sig:
        return None
    padded = sig + "=" * (-len(sig) % 4)
    for decode in (base64.b64decode, base64.urlsafe_b64decode):
        try:
            raw = decode(padded)
        except (binascii.Error, ValueError):
            continue
        if raw.startswith(SIGNATURE_PREFIX):
            try:
                obj = orjson.loads(raw[len(SIGNATURE_PREFIX):])
            except orjson.JSONDecodeError:
                return None
            return obj if isinstance(obj, dict) else None
    return None


def to_json_schema(schema, notes: set[str]):
    """Google's OpenAPI-style Schema (or a JSON Schema with upper-case type names) → JSON Schema.

    Type names are lower-cased, `nullable: true` becomes a "null" type, int64 limits sent as strings become
    integers, `propertyOrdering` (Google-only) is removed. Walks keywords structurally, so a property named "type"
    is never touched."""
    if not isinstance(schema, dict):
        return schema
    out: dict = {}
    for key, value in schema.items():
        if key == "type":
            if isinstance(value, str) and value.upper() in _TYPES and value != value.lower():
                notes.add("schema_types_lowercased")
                value = value.lower()
            elif isinstance(value, list):
                low = [v.lower() if isinstance(v, str) and v.upper() in _TYPES else v for v in value]
                if low != value:
                    notes.add("schema_types_lowercased")
                value = low
            if value == "type_unspecified":
                continue
            out[key] = value
        elif key in _SUB_SCHEMA and isinstance(value, dict):
            out[key] = to_json_schema(value, notes)
        elif key in _SUB_LIST and isinstance(value, list):
            out[key] = [to_json_schema(v, notes) for v in value]
        elif key == "items" and isinstance(value, list):
            out[key] = [to_json_schema(v, notes) for v in value]
        elif key in _SUB_MAP and isinstance(value, dict):
            out[key] = {k: to_json_schema(v, notes) for k, v in value.items()}
        elif key in _INT_KEYS and isinstance(value, str) and value.isdigit():
            notes.add("schema_int64_strings_converted")
            out[key] = int(value)
        elif key == "propertyOrdering":
            notes.add("schema_property_ordering_dropped")
        elif key == "nullable":
            continue  # folded into "type" below
        else:
            out[key] = value
    if schema.get("nullable") is True:
        notes.add("schema_nullable_converted")
        t = out.get("type")
        if isinstance(t, str) and t != "null":
            out["type"] = [t, "null"]
        elif isinstance(t, list) and "null" not in t:
            out["type"] = [*t, "null"]
        elif t is None:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


def _camel(key: str) -> str:
    if "_" not in key or key.startswith("_") or key != key.lower():
        return key
    head, *rest = key.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def proto_json(obj):
    """Google parses request JSON as proto3 JSON, which accepts snake_case field names as well as lowerCamelCase
    (google-genai for Python sends e.g. `thinkingConfig: {"include_thoughts": true}` and `max_length` in schemas).
    Field names become lowerCamelCase; property names in `properties` and free-form values stay as sent."""
    if isinstance(obj, list):
        return [proto_json(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    out = {}
    for key, value in obj.items():
        key = _camel(key)
        if key in _VERBATIM:
            out[key] = value
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: proto_json(schema) for name, schema in value.items()}
        else:
            out[key] = proto_json(value)
    return out


def _dumps(obj) -> str:
    # vLLM's tool parsers serialize arguments with json.dumps(..., ensure_ascii=False): re-serialize the same way.
    return json.dumps(obj, ensure_ascii=False)


def _text_of(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        parts = content.get("parts") or []
    elif isinstance(content, list):
        parts = content
    else:
        raise AgentInputError(f"{where} must be a Content object")
    if not isinstance(parts, list):
        raise AgentInputError(f"{where}.parts must be a list")
    texts = []
    for p in parts:
        if not isinstance(p, dict) or not isinstance(p.get("text", ""), str):
            raise AgentInputError(f"{where}: only text parts are supported")
        if "text" in p:
            texts.append(p["text"])
    return "\n".join(texts)


def _media_part(mime: str, url: str, inline: bool) -> dict:
    kind = mime.split("/")[0]
    if kind == "image":
        return {"type": "image_url", "image_url": {"url": url}}
    if kind == "video":
        return {"type": "video_url", "video_url": {"url": url}}
    if kind == "audio" and inline and mime.split("/")[-1] in ("wav", "x-wav", "mp3", "mpeg"):
        fmt = "wav" if "wav" in mime else "mp3"
        return {"type": "input_audio", "input_audio": {"data": url.split(",", 1)[1], "format": fmt}}
    raise AgentInputError(f"unsupported media type {mime!r} in {'inlineData' if inline else 'fileData'}")


class _History:
    """Turns `contents` into OpenAI chat messages, matching function responses to the calls they answer."""

    def __init__(self, notes: Notes):
        self.notes = notes
        self.messages: list[dict] = []
        self.open_calls: list[tuple[str, str]] = []  # (id, name) of the last model turn's unanswered calls

    def note(self, n: str) -> None:
        self.notes.add(n)

    def user_turn(self, parts: list, turn: int) -> None:
        content: list[dict] = []
        tools: list[dict] = []
        for i, p in enumerate(parts):
            if "functionResponse" in p:
                if content:
                    self.note("user_parts_moved_after_tool_results")  # tool messages must directly follow the calls
                tools.append(self._tool_message(p["functionResponse"], turn, i))
            elif "text" in p:
                if not isinstance(p["text"], str):
                    raise AgentInputError(f"contents[{turn}].parts[{i}].text must be a string")
                if p.get("thought"):
                    self.note("user_thought_part_as_text")
                content.append({"type": "text", "text": p["text"]})
            elif "inlineData" in p:
                d = p["inlineData"] or {}
                mime, data = d.get("mimeType"), d.get("data")
                if not isinstance(mime, str) or not isinstance(data, str):
                    raise AgentInputError(f"contents[{turn}].parts[{i}].inlineData needs mimeType and data")
                if mime.startswith("text/"):
                    try:
                        text = base64.b64decode(data).decode()
                    except (binascii.Error, ValueError, UnicodeDecodeError) as exc:
                        raise AgentInputError(f"contents[{turn}].parts[{i}].inlineData is not base64 text") from exc
                    self.note("inline_text_decoded")
                    content.append({"type": "text", "text": text})
                else:
                    content.append(_media_part(mime, f"data:{mime};base64,{data}", True))
            elif "fileData" in p:
                d = p["fileData"] or {}
                mime, uri = d.get("mimeType") or "", d.get("fileUri")
                if not isinstance(uri, str):
                    raise AgentInputError(f"contents[{turn}].parts[{i}].fileData needs fileUri")
                self.note("file_data_passed_as_url")
                content.append(_media_part(mime, uri, False))
            elif "functionCall" in p:
                raise AgentInputError(f"contents[{turn}]: functionCall parts belong to role 'model'")
            else:
                self._unknown(p)
        self.messages.extend(tools)
        if content and self.open_calls:
            # Responses may be split over consecutive turns, but nothing else may come between a call and its answer.
            raise AgentInputError(f"contents[{turn}]: functionCall {self.open_calls[0][1]!r} has no functionResponse")
        if content:
            if all(c["type"] == "text" for c in content):
                text = "".join(c["text"] for c in content) if len(content) == 1 else None
                self.messages.append({"role": "user", "content": text if text is not None else content})
            else:
                self.messages.append({"role": "user", "content": content})
        elif not tools:
            raise AgentInputError(f"contents[{turn}] has no usable parts")

    def _tool_message(self, fr: dict, turn: int, i: int) -> dict:
        if not isinstance(fr, dict) or not isinstance(fr.get("name"), str):
            raise AgentInputError(f"contents[{turn}].parts[{i}].functionResponse needs a name")
        name, fid = fr["name"], fr.get("id")
        call_id = None
        if fid:
            for k, (cid, _) in enumerate(self.open_calls):
                if cid == fid:
                    call_id = self.open_calls.pop(k)[0]
                    break
        if call_id is None:
            for k, (cid, cname) in enumerate(self.open_calls):
                if cname == name:
                    call_id = self.open_calls.pop(k)[0]
                    break
        if call_id is None:
            raise AgentInputError(f"contents[{turn}].parts[{i}]: functionResponse {name!r} answers no functionCall "
                                  "of the previous model turn")
        response = fr.get("response", {})
        if fr.get("parts"):
            self.note("function_response_parts_dropped")
        return {"role": "tool", "tool_call_id": call_id, "content": _dumps(response)}

    def model_turn(self, parts: list, turn: int) -> None:
        if self.open_calls:
            raise AgentInputError(f"contents[{turn}]: functionCall {self.open_calls[0][1]!r} has no functionResponse")
        reasoning: list[str] = []
        text: list[str] = []
        calls: list[dict] = []
        payload = None
        for i, p in enumerate(parts):
            sig = p.get("thoughtSignature")
            if sig is not None:
                decoded = decode_signature(sig)
                if decoded is not None:
                    payload = payload or decoded
                elif sig == CLI_PLACEHOLDER_SIGNATURE:
                    self.note("thought_signature_placeholder_ignored")
                else:
                    self.note("foreign_thought_signature_ignored")
            if "functionCall" in p:
                fc = p["functionCall"] or {}
                if not isinstance(fc, dict) or not isinstance(fc.get("name"), str):
                    raise AgentInputError(f"contents[{turn}].parts[{i}].functionCall needs a name")
                args = fc.get("args", {})
                if not isinstance(args, dict):
                    raise AgentInputError(f"contents[{turn}].parts[{i}].functionCall.args must be an object")
                cid = fc.get("id") or f"call_{turn}_{i}"  # stable across turns: position in the history
                calls.append({"id": cid, "type": "function", "function": {"name": fc["name"], "args": args}})
            elif "text" in p and not isinstance(p["text"], str):
                raise AgentInputError(f"contents[{turn}].parts[{i}].text must be a string")
            elif p.get("thought") and "text" in p:
                reasoning.append(p["text"])
            elif "text" in p:
                text.append(p["text"])
            elif p.get("thought"):
                continue  # a signature-only thought part
            elif "functionResponse" in p:
                raise AgentInputError(f"contents[{turn}]: functionResponse parts belong to role 'user'")
            else:
                self._unknown(p)
        msg: dict = {"role": "assistant", "content": "".join(text) or None}
        raw_args = payload.get("a") if payload else None
        if payload and isinstance(payload.get("r"), str) and payload["r"]:
            msg["reasoning_content"] = payload["r"]  # exact text; thought parts may be summaries or absent
        elif reasoning:
            msg["reasoning_content"] = "".join(reasoning)
        if calls:
            out = []
            for k, c in enumerate(calls):
                args = c["function"]["args"]
                arguments = None
                if isinstance(raw_args, list) and k < len(raw_args) and isinstance(raw_args[k], str):
                    try:
                        same = orjson.loads(raw_args[k]) == args
                    except orjson.JSONDecodeError:
                        same = args == {RAW_ARGUMENTS_KEY: raw_args[k]}
                    if same:
                        arguments = raw_args[k]  # the backend's exact text: keeps the token prefix intact
                if arguments is None:
                    if set(args) == {RAW_ARGUMENTS_KEY} and isinstance(args[RAW_ARGUMENTS_KEY], str):
                        arguments = args[RAW_ARGUMENTS_KEY]
                    else:
                        arguments = _dumps(args)
                out.append({"id": c["id"], "type": "function",
                            "function": {"name": c["function"]["name"], "arguments": arguments}})
            msg["tool_calls"] = out
            self.open_calls = [(c["id"], c["function"]["name"]) for c in out]
        if calls and payload is None:
            # We sign every function-call turn we answer: no signature means the client dropped it (or the history
            # came from elsewhere), so neither the reasoning nor the exact argument text could be restored.
            self.note("reasoning_dropped")
        if msg["content"] is None and "tool_calls" not in msg:
            msg["content"] = ""
        self.messages.append(msg)

    def _unknown(self, p: dict) -> None:
        keys = [k for k in p if k not in ("thoughtSignature", "thought", "partMetadata", "videoMetadata")]
        self.note(f"dropped_part:{keys[0] if keys else 'empty'}")


def _tools(body: dict, notes: Notes, schema_notes: set[str]) -> list[dict]:
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise AgentInputError("tools must be a list")
    out: list[dict] = []
    for t in tools:
        if not isinstance(t, dict):
            raise AgentInputError("each tool must be an object")
        for key, value in t.items():
            if key == "functionDeclarations":
                if not isinstance(value, (list, type(None))):
                    raise AgentInputError("functionDeclarations must be a list")
                for fd in value or []:
                    if not isinstance(fd, dict) or not isinstance(fd.get("name"), str) or not fd["name"]:
                        raise AgentInputError("each functionDeclaration needs a name")
                    if "parametersJsonSchema" in fd:
                        params = to_json_schema(fd["parametersJsonSchema"], schema_notes)
                    elif "parameters" in fd:
                        params = to_json_schema(fd["parameters"], schema_notes)
                    else:
                        params = {"type": "object", "properties": {}}
                    fn = {"name": fd["name"]}
                    if fd.get("description"):
                        fn["description"] = fd["description"]
                    fn["parameters"] = params
                    out.append({"type": "function", "function": fn})
            elif key in _SERVER_TOOLS or isinstance(value, dict):
                notes.add(f"dropped_server_tool:{key}")
            else:
                raise AgentInputError(f"unknown tool field {key!r}")
    return out


def _tool_choice(body: dict, tools: list[dict], notes: Notes):
    cfg = (body.get("toolConfig") or {}).get("functionCallingConfig") or {}
    mode = str(cfg.get("mode", "MODE_UNSPECIFIED")).upper()
    allowed = cfg.get("allowedFunctionNames") or []
    names = {t["function"]["name"] for t in tools}
    for n in allowed:
        if n not in names:
            raise AgentInputError(f"allowedFunctionNames names an undeclared function {n!r}")
    if mode in ("MODE_UNSPECIFIED", "AUTO"):
        if allowed:
            notes.add("allowed_function_names_ignored")  # Google honours them only with mode ANY
        return "auto" if mode == "AUTO" else None
    if mode == "NONE":
        return "none"
    if mode == "ANY":
        if len(allowed) == 1:
            return {"type": "function", "function": {"name": allowed[0]}}
        if len(allowed) > 1 and set(allowed) != names:
            notes.add("allowed_function_names_widened")  # OpenAI chat cannot name a subset
        return "required"
    if mode == "VALIDATED":
        notes.add("tool_mode_validated_as_auto")
        return "auto"
    raise AgentInputError(f"unknown functionCallingConfig.mode {cfg.get('mode')!r}")


def _thinking(gc: dict) -> tuple[bool | None, bool]:
    tc = gc.get("thinkingConfig")
    if not isinstance(tc, dict):
        return None, False
    include = bool(tc.get("includeThoughts"))
    budget, level = tc.get("thinkingBudget"), tc.get("thinkingLevel")
    if budget is not None:
        return (budget != 0), include
    if isinstance(level, str) and level.upper() not in ("", "THINKING_LEVEL_UNSPECIFIED"):
        return level.upper() != "MINIMAL", include
    return (True if include else None), include


def _messages(body: dict, route: Route, notes: Notes) -> list[dict]:
    """systemInstruction, then `contents` turn by turn, as chat messages; every functionCall must be answered."""
    messages: list[dict] = []
    system = body.get("systemInstruction")
    if system is not None:
        text = _text_of(system, "systemInstruction")
        messages.append({"role": "system", "content": text})

    contents = body.get("contents")
    if contents is None and route.kind == "count_tokens":
        contents = []
    if not isinstance(contents, list) or (not contents and route.kind != "count_tokens"):
        raise AgentInputError("contents must be a non-empty list")
    history = _History(notes)
    for turn, c in enumerate(contents):
        if not isinstance(c, dict) or not isinstance(c.get("parts"), list):
            raise AgentInputError(f"contents[{turn}] must be a Content with parts")
        role = c.get("role") or "user"
        if any(not isinstance(p, dict) for p in c["parts"]):
            raise AgentInputError(f"contents[{turn}].parts must be objects")
        if role == "model":
            history.model_turn(c["parts"], turn)
        elif role in ("user", "function"):
            history.user_turn(c["parts"], turn)
        else:
            raise AgentInputError(f"contents[{turn}].role must be 'user' or 'model', not {role!r}")
    if history.open_calls and route.kind != "count_tokens":
        raise AgentInputError(f"functionCall {history.open_calls[0][1]!r} has no functionResponse")
    messages.extend(history.messages)
    return messages


def _generation_config(gc: dict, chat: dict, notes: Notes, schema_notes: set[str]) -> None:
    """generationConfig's sampling, stop and response format into `chat`; whether a JSON schema constrains it."""
    for src, dst in (("temperature", "temperature"), ("topP", "top_p"), ("topK", "top_k"),
                     ("maxOutputTokens", "max_tokens"), ("seed", "seed"), ("presencePenalty", "presence_penalty"),
                     ("frequencyPenalty", "frequency_penalty")):
        if gc.get(src) is not None:
            chat[dst] = gc[src]
    if gc.get("stopSequences"):
        chat["stop"] = list(gc["stopSequences"])
    if (gc.get("candidateCount") or 1) > 1:
        raise AgentInputError("candidateCount > 1 is not supported: this gateway generates one candidate")
    mime = gc.get("responseMimeType")
    schema = gc.get("responseJsonSchema", gc.get("responseSchema"))
    if mime == "application/json":
        if schema is not None:
            chat["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "response", "schema": to_json_schema(schema, schema_notes), "strict": True}}
        else:
            chat["response_format"] = {"type": "json_object"}
    elif mime not in (None, "text/plain"):
        notes.add(f"response_mime_type_ignored:{mime}")
    elif schema is not None:
        raise AgentInputError("responseSchema requires responseMimeType 'application/json'")
    if gc.get("responseLogprobs") or gc.get("logprobs"):
        notes.add("logprobs_ignored")
    for ignored in ("responseModalities", "speechConfig", "mediaResolution", "imageConfig"):
        if ignored in gc and gc[ignored] not in (None, [], ["TEXT"]):
            notes.add(f"ignored:{ignored}")


def to_chat(body: dict, route: Route) -> ChatPlan:
    """A GenerateContentRequest (or a countTokens body) → OpenAI chat. Raises AgentInputError (→ 400)."""
    if not isinstance(body, dict):
        raise AgentInputError("request body must be a JSON object")
    body = proto_json(body)
    if route.kind == "count_tokens" and isinstance(body.get("generateContentRequest"), dict):
        body = body["generateContentRequest"]
    if body.get("cachedContent"):
        raise AgentInputError("cachedContent is not supported by this gateway")
    notes = Notes()
    schema_notes: set[str] = set()  # recorded after every other note, sorted

    chat: dict = {"messages": _messages(body, route, notes)}
    tools = _tools(body, notes, schema_notes)
    if tools:
        chat["tools"] = tools
    choice = _tool_choice(body, tools, notes)
    if choice is not None and tools:
        chat["tool_choice"] = choice

    gc = body.get("generationConfig") or {}
    if not isinstance(gc, dict):
        raise AgentInputError("generationConfig must be an object")
    _generation_config(gc, chat, notes, schema_notes)
    if body.get("safetySettings"):
        notes.add("ignored:safetySettings")
    thinking, include_thoughts = _thinking(gc)
    for note in sorted(schema_notes):
        notes.add(note)

    return ChatPlan(chat=chat, stream=bool(route.stream), model_requested=route.model,
                    normalizations=notes.items,
                    extra={"thinking": thinking, "include_thoughts": include_thoughts})


# ---------------------------------------------------------------------------------------------------------------
# response: chat stream -> GenerateContentResponse events (SSE or JSON array), the JSON body
# ---------------------------------------------------------------------------------------------------------------


def provider_stop_reason(c: Completion, plan: ChatPlan | None = None) -> str:
    """Google's finishReason for a backend finish (function calls finish with STOP, like Gemini)."""
    if c.finish_reason is None:
        return "STOP"
    return _FINISH.get(c.finish_reason, "OTHER")


def _args_object(raw: str, notes: list[str]) -> dict:
    try:
        obj = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError:
        obj = None
    if isinstance(obj, dict):
        return obj
    notes.append("invalid_tool_arguments_kept_raw")
    return {RAW_ARGUMENTS_KEY: raw}


class Encoder:
    """Backend chat stream → GenerateContentResponse events (SSE, or elements of one JSON array)."""

    def __init__(self, ctx: EncodeContext):
        self.ctx = ctx
        self.sse = ctx.route.sse
        self.include_thoughts = bool(ctx.plan.extra.get("include_thoughts"))
        self.notes: list[str] = []  # what the encoder had to change (e.g. invalid tool arguments), for the record
        self._elements = 0  # JSON array elements written
        self._opened = False
        self._closed = False

    # -- framing ---------------------------------------------------------------------------------------------

    def _frame(self, obj: dict) -> bytes:
        data = orjson.dumps(obj)
        if self.sse:
            return b"data: " + data + b"\r\n\r\n"
        head = b"" if self._opened else b"["
        self._opened = True
        sep = b",\r\n" if self._elements else b""
        self._elements += 1
        return head + sep + data + b"\n"

    def _chunk(self, parts: list[dict], **candidate) -> dict:
        cand = {"content": {"parts": parts, "role": "model"}, **candidate, "index": 0}
        return {"candidates": [cand], "modelVersion": self.ctx.model, "responseId": self.ctx.response_id}

    def _usage(self, c: Completion) -> dict:
        # The backend does not split reasoning from answer tokens: candidatesTokenCount holds all of them.
        return {"promptTokenCount": c.prompt_tokens, "candidatesTokenCount": c.completion_tokens,
                "totalTokenCount": c.prompt_tokens + c.completion_tokens}

    def _final_parts(self, c: Completion) -> list[dict]:
        parts: list[dict] = []
        calls = list(c.tool_calls)
        if calls:
            sig = encode_signature(c.reasoning, [t.arguments for t in calls])
            for k, t in enumerate(calls):
                part: dict = {"functionCall": {"id": t.id, "name": t.name, "args": _args_object(t.arguments,
                                                                                                   self.notes)}}
                if k == 0:
                    part["thoughtSignature"] = sig
                parts.append(part)
        elif c.reasoning:
            parts.append({"text": "", "thoughtSignature": encode_signature(c.reasoning, [])})
        return parts

    # -- streaming -------------------------------------------------------------------------------------------

    def start(self) -> list[bytes]:
        """Nothing: Gemini's first event already carries content."""
        return []

    def delta(self, d: Delta) -> list[bytes]:
        parts: list[dict] = []
        if d.reasoning and self.include_thoughts:
            parts.append({"text": d.reasoning, "thought": True})
        if d.text:
            parts.append({"text": d.text})
        return [self._frame(self._chunk(parts))] if parts else []

    def finish(self, c: Completion) -> list[bytes]:
        """The closing event: whole function calls, the signature, finishReason and usage."""
        event = self._chunk(self._final_parts(c), finishReason=provider_stop_reason(c))
        event["usageMetadata"] = self._usage(c)
        out = [self._frame(event)]
        if not self.sse:
            out.append(b"]")
        self._closed = True
        return out

    def error(self, e: GatewayError) -> list[bytes]:
        """A mid-stream failure: a final `{"error": …}` event (the SDKs raise APIError on it)."""
        _, body = error_response(e)
        out = [self._frame(orjson.loads(body))]
        if not self.sse:
            out.append(b"]")
        self._closed = True
        return out

    # -- non-streaming ---------------------------------------------------------------------------------------

    def response(self, c: Completion) -> dict:
        parts: list[dict] = []
        if c.reasoning and self.include_thoughts:
            parts.append({"text": c.reasoning, "thought": True})
        if c.content:
            parts.append({"text": c.content})
        parts.extend(self._final_parts(c))
        body = self._chunk(parts, finishReason=provider_stop_reason(c))
        body["usageMetadata"] = self._usage(c)
        return body


# ---------------------------------------------------------------------------------------------------------------
# errors and token counts
# ---------------------------------------------------------------------------------------------------------------


def error_response(e: GatewayError) -> tuple[int, bytes]:
    """Google's error body {"error": {code, message, status}}; a 413 becomes 400 as Google answers oversize bodies."""
    code, status = GOOGLE_ERRORS.get(e.kind, (500, "INTERNAL"))
    if e.status is not None:
        code = 400 if e.status == 413 else e.status
        status = GOOGLE_STATUS_NAMES.get(code, "INTERNAL" if code >= 500 else "FAILED_PRECONDITION")
    return code, orjson.dumps({"error": {"code": code, "message": e.message, "status": status}})


def count_tokens_response(n: int, route: Route) -> dict:
    return {"totalTokens": n}
