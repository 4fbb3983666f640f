"""The backend's stream, read: vLLM's (or SGLang's) OpenAI chat SSE chunks → protocol-free Deltas, accumulated into
the Completion plus the token data the record keeps (prompt and completion ids, one logprob per sampled token).
Also the backend's HTTP errors → the gateway's error kinds (the error table in docs/architecture.md).
"""

from __future__ import annotations

import orjson

from polar import records as rec

from .codecs.base import Completion, Delta, GatewayError, ToolCall, ToolCallDelta


# Where a backend puts the prompt's ids: vLLM's first chunk (`prompt_token_ids`), SGLang's last (`sglext.input_ids`)
PROMPT_ID_KEYS = (b'"prompt_token_ids":[', b'"input_ids":[')


def cut_prompt_ids(payload: bytes) -> tuple[bytes, bytes] | None:
    """(the chunk with its prompt-id array replaced by null, the array's ASCII digits) when the chunk's bytes hold
    one such array of digits and single commas; None otherwise (no array, or anything else in it: spaces, a torn
    chunk, nested lists), and then the chunk is parsed whole, as before.

    The key cannot match inside a JSON string (a quote there is escaped), and the gateway only stores these ids: in
    normal mode they need never become Python ints (docs/records.md, ASCII ids)."""
    for key in PROMPT_ID_KEYS:
        i = payload.find(key)
        if i < 0:
            continue
        start = i + len(key)
        end = payload.find(b"]", start)
        if end < 0:
            return None
        digits = payload[start:end]
        if not rec.is_ascii_ids(digits):
            return None
        return payload[:start - 1] + b"null" + payload[end + 1:], digits
    return None


def sglext_output_ids(value: list) -> list[int]:
    """SGLang's `sglext.output_ids`: one list per choice (0.5.23's SglExt declares List[List[int]]); the gateway asks
    for one choice, so choice 0's. A flat list of ids (as some servers send) is taken as it is."""
    if value and isinstance(value[0], list):
        return list(value[0])
    return list(value)


class StreamReader:
    """Accumulates one backend SSE stream. feed(bytes) → the Deltas it completed; the first chunk's prompt ids are
    there as soon as it is read: as the backend's ASCII digits in .prompt_ids_ascii when `cut_prompt_ids` took
    them out of the chunk's bytes (.prompt_ids_path "fast"), else parsed ("parsed"); .prompt_token_ids gives them as
    a list either way (decoding the digits on first use: exact mode needs the list, the recorder does not).

    A forced tool call (tool_choice required or named) is guided JSON: `[{"name", "parameters"}]` for required, the
    arguments object for named. Some backend configurations stream that JSON as plain content (vLLM with a reasoning
    parser runs the tool parser only after reasoning ended), so for a forced call the content is held back; if no
    tool-call delta came, the held JSON becomes the tool calls at the finish chunk, else it is released as text."""

    def __init__(self, keep_logprob_entries: bool, forced_tool_choice=None, call_id_prefix: str = "call",
                 deltas: bool = True):
        self.keep_logprob_entries = keep_logprob_entries
        self.deltas = deltas  # False: the caller only wants the totals (a JSON answer), feed() returns no Deltas
        self.forced = forced_tool_choice if (forced_tool_choice == "required"
                                             or isinstance(forced_tool_choice, dict)) else None
        self.call_id_prefix = call_id_prefix
        self.held: list[str] = []
        self.forced_from_content = False
        self._buf = b""
        self.done = False  # saw [DONE]
        self.chunks = 0
        self._prompt_ids: list[int] | None = None
        self.prompt_ids_ascii: bytes | None = None
        self.prompt_ids_path: str | None = None  # "fast" (kept as bytes) or "parsed" (today's path); None: none came
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

    @property
    def prompt_token_ids(self) -> list[int] | None:
        if self._prompt_ids is None and self.prompt_ids_ascii is not None:
            self._prompt_ids = rec.unpack_ids(rec.ascii_ids(self.prompt_ids_ascii))
        return self._prompt_ids

    def prompt_count(self) -> int | None:
        """How many prompt ids came, without decoding them."""
        if self.prompt_ids_ascii is not None:
            return rec.id_count(rec.ascii_ids(self.prompt_ids_ascii))
        return None if self._prompt_ids is None else len(self._prompt_ids)

    def _set_prompt(self, ids) -> None:
        if self.prompt_ids_path is None:
            self._prompt_ids, self.prompt_ids_path = list(ids), "parsed"

    def feed(self, data: bytes) -> list[Delta]:
        """Parse whole SSE events out of `data`; raise GatewayError on an error event or garbage."""
        if b"\n" not in data:
            self._buf += data
            return []
        # One split per read (not one copy of the rest of the buffer per line): a read may hold a whole stream.
        lines = (self._buf + data).split(b"\n") if self._buf else data.split(b"\n")
        self._buf = lines.pop()
        out: list[Delta] = []
        for line in lines:
            if not line.startswith(b"data:"):  # the common case first: every event is one data line
                line = line.rstrip(b"\r")
                if not line or line.startswith(b":") or line.startswith(b"event:"):
                    continue
                raise GatewayError("unavailable", f"backend sent a line that is not SSE: {line[:200]!r}")
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            if self.prompt_ids_path is None:  # until the prompt's ids came: cut them out as bytes if they are here
                cut = cut_prompt_ids(payload)
                if cut is not None:
                    payload, self.prompt_ids_ascii = cut
                    self.prompt_ids_path = "fast"
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
        self._chunk_facts(chunk)
        choices = chunk.get("choices")
        if not choices:
            return None
        choice = choices[0]
        entries = self._token_data(choice)
        delta = choice.get("delta") or {}
        text = delta.get("content") or ""
        reasoning = delta.get("reasoning") or delta.get("reasoning_content") or ""
        calls = self._tool_call_deltas(delta) if "tool_calls" in delta else []
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
            self._finished(choice, finish)
        if not self.deltas or not (text or reasoning or calls or finish or entries):
            return None
        return Delta(text=text, reasoning=reasoning, tool_calls=tuple(calls), finish_reason=finish,
                     logprobs=tuple(entries) if self.keep_logprob_entries else ())

    def _chunk_facts(self, chunk: dict) -> None:
        """What a chunk says outside its choices: prompt ids (vLLM's first chunk), model, usage, SGLang's ids."""
        if chunk.get("prompt_token_ids") is not None:
            self._set_prompt(chunk["prompt_token_ids"])
        if chunk.get("system_fingerprint"):
            self.system_fingerprint = chunk["system_fingerprint"]
        if chunk.get("model"):
            self.model = chunk["model"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        ext = chunk.get("sglext")
        if isinstance(ext, dict):
            if ext.get("input_ids") is not None:
                self._set_prompt(ext["input_ids"])
            if ext.get("output_ids") is not None:
                self.completion_token_ids = sglext_output_ids(ext["output_ids"])

    def _token_data(self, choice: dict) -> list[dict]:
        """The choice's sampled ids and their logprobs (one per id, else `missing_logprobs`); returns the entries."""
        if choice.get("prompt_token_ids") is not None:
            self._set_prompt(choice["prompt_token_ids"])
        ids = choice.get("token_ids")
        if ids is not None:
            if self.completion_token_ids is None:
                self.completion_token_ids = []
            self.completion_token_ids.extend(ids)
        entries = (choice.get("logprobs") or {}).get("content") or []
        if entries:
            if self.logprobs is None:
                self.logprobs = []
            logprobs = self.logprobs
            for e in entries:  # a loop, not a generator: usually one entry per chunk
                logprobs.append(float(e.get("logprob", 0.0)))
            if self.keep_logprob_entries:
                self.logprob_entries.extend(entries)
        elif ids:
            self.missing_logprobs = True
        if choice.get("weight_versions") is not None:
            self.weight_versions = choice["weight_versions"]
        return entries

    def _tool_call_deltas(self, delta: dict) -> list[ToolCallDelta]:
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
        return calls

    def _finished(self, choice: dict, finish: str) -> None:
        self.finish_reason = finish
        self.stop_reason = choice.get("stop_reason")
        if self.stop_reason is None and isinstance(choice.get("matched_stop"), str):
            # SGLang names a matched stop string in `matched_stop` (an int there is EOS or a stop id: not kept, so a
            # null stop_reason still means EOS as with vLLM).
            self.stop_reason = choice["matched_stop"]

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
            prompt = self.prompt_count() or 0
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
    """A backend HTTP error → the gateway error kind the codecs answer (the error table in docs/architecture.md)."""
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
    # (the error table in docs/architecture.md); the backend's status is kept in the record's error map by the caller.
    return GatewayError("unavailable", f"backend answered {status}: {message[:500]}")


# ---------------------------------------------------------------------------------------------------- stream client
