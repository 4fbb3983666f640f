"""A scripted stand-in for vLLM's OpenAI server: exact wire format, real tokenizer and chat template.

Use it where a test needs exact model output, fault injection or benchmark isolation::

    with ScriptedUpstream() as up:                      # base URL in up.base_url (".../v1")
        up.script(Reply(text="Hi"), Reply(tool_calls=[("bash", {"command": "ls"})]))
        ...                                             # replies are consumed one per chat request
        up.responses[-1].completion_ids                 # the truth the gateway must record

Semantics (vLLM 0.32 with `--enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3`):
- The prompt is the chat template applied to messages + tools (`chat_template_kwargs` passed through);
  `/tokenize` returns the same ids. A reply's text is tokenized; `Reply(ids=...)` emits exact ids instead.
- A natural end appends the EOS id (`<|im_end|>`) to the ids, never to the text. `max_tokens` cuts without
  EOS (finish `length`); a request `stop` string cuts the text, keeps the ids that produced it, and sets
  `stop_reason`; a `stop_token_ids` hit keeps the id and sets `stop_reason` to it.
- Reasoning (`<think>…</think>`) and tool calls (`<tool_call>{json}</tool_call>`) are parsed from the text like
  vLLM's qwen3 and hermes parsers, streaming and not, including vLLM's own stream/non-stream differences:
  with tools and the reasoning parser on, a stream runs the tool parser only after reasoning has ended — in the
  output (`</think>`), or already in the prompt (the last think tag in the prompt ids is `</think>`, which our
  template produces whenever history carries reasoning). Until then text streams as content, so a reply with
  tool calls and no reasoning streams its `<tool_call>` text as content on a first turn. Pass
  `reasoning_parser=None` for a server started without a reasoning parser (pure hermes behaviour).
- `tool_choice` "required" / named: the text is what the grammar forces (`[{"name", "parameters"}]` / the
  arguments object); finish `tool_calls` / `stop`, as vLLM.
Faults (`Reply(fault=...)`, a string or a list): "status:<code>", "status:<code>-nobody",
"disconnect_after:N" (N data events, then the connection drops), "garbage", "slow_first_byte:S",
"no_token_ids", "no_logprobs", "hang" (never answers until stop()/reset()).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable, Sequence

from tests.support.chat_template import Tokenizer
from tests.support.servers import LoopbackHTTPServer, read_request_body

VLLM_VERSION = "0.32.0"
DEFAULT_MODEL = "polar-tiny"
DEFAULT_TEXT = "This is a scripted answer."
# `vary=True`: default replies take these in turn — texts whose share of vowels differs (0.4, 0.7, 0.0, 1.0) and
# file names, so K samples of one task score differently under a graded verifier (the demo's reward spread).
VARIED_TEXTS = ("Hello, Polar!\n", "a quiet idea\n", "rhythm\n", "aeiou\n")
VARIED_PATHS = ("hello.txt", "answer.txt", "notes.txt")
_FAULT_KINDS = ("status", "disconnect_after", "garbage", "slow_first_byte", "no_token_ids", "no_logprobs", "hang")


@dataclass(frozen=True)
class Reply:
    """One scripted model turn. `tool_calls` is a sequence of (name, arguments-dict)."""

    text: str = ""
    reasoning: str | None = None
    tool_calls: Sequence[tuple[str, dict]] = ()
    ids: Sequence[int] | None = None
    finish: str | None = None
    chunk_tokens: int = 1
    gate: bool = False
    fault: str | Sequence[str] | None = None
    logprobs: Sequence[float] | None = None

    def faults(self) -> dict[str, str]:
        items = [self.fault] if isinstance(self.fault, str) else list(self.fault or ())
        out: dict[str, str] = {}
        for item in items:
            kind, _, arg = item.partition(":")
            if kind not in _FAULT_KINDS:
                raise ValueError(f"unknown fault {item!r}")
            out[kind] = arg
        return out


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or None


@dataclass
class RecordedResponse:
    """What the upstream answered to one chat request (the truth a recording must match)."""

    request_index: int
    stream: bool
    status: int
    prompt_token_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    usage: dict | None = None
    text: str = ""
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict] = field(default_factory=list)
    faults: dict[str, str] = field(default_factory=dict)
    error: dict | None = None


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, type_: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}


def _dumps(obj: Any) -> bytes:
    # pydantic's model_dump_json / FastAPI's JSONResponse: compact, UTF-8.
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def minimal_json(schema: Any) -> Any:
    """A small value that satisfies a JSON schema: required keys only, strings "ls", numbers 1."""
    if not isinstance(schema, dict):
        return {}
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return minimal_json(schema[key][0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if str(k).lower() != "null"), kind[0] if kind else None)
    kind = str(kind).lower() if kind is not None else ("object" if "properties" in schema else None)
    if kind == "object" or kind is None:
        props = schema.get("properties") or {}
        return {k: minimal_json(props.get(k, {"type": "string"})) for k in schema.get("required") or []}
    if kind == "string":
        return "ls"
    if kind in ("integer", "number"):
        return max(1, schema.get("minimum", 1)) if kind == "integer" else 1
    if kind == "boolean":
        return True
    if kind == "array":
        n = schema.get("minItems", 0)
        return [minimal_json(schema.get("items", {"type": "string"})) for _ in range(n)]
    if kind == "null":
        return None
    return {}


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # the stdlib's 5 drops connections under bursts of concurrent calls (soak, fuzz)


class ScriptedUpstream(LoopbackHTTPServer):
    """A vLLM-compatible OpenAI server in a background thread, answering from a script."""

    def __init__(self, tokenizer: Tokenizer | str | None = None, *, model: str = DEFAULT_MODEL,
                 max_model_len: int = 65536, host: str = "127.0.0.1", port: int = 0,
                 reasoning_parser: str | None = "qwen3", version: str = VLLM_VERSION,
                 reasoning_fields: Sequence[str] = ("reasoning",), gate_timeout: float = 30.0,
                 logprob_seed: int = 0, vary: bool = False):
        self.tokenizer = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer(tokenizer)
        self.model = model
        self.max_model_len = max_model_len
        self.reasoning_parser = reasoning_parser
        self.version = version
        self.reasoning_fields = tuple(reasoning_fields)
        self.gate_timeout = gate_timeout
        self.logprob_seed = logprob_seed
        self.vary = vary  # default replies differ from call to call (VARIED_TEXTS), so a group gets a reward spread
        self._varied = 0
        self.system_fingerprint = f"vllm-{version}-scripted"
        self.weight_version_label = "0"  # the version string of the spans a ≥ 0.33 stand-in sends
        self._host, self._port = host, port
        self._lock = threading.RLock()
        self._queue: list[Reply] = []
        self.requests: list[RecordedRequest] = []
        self.responses: list[RecordedResponse] = []
        self._gate = threading.Semaphore(0)
        self._gate_waiting = 0
        self._gate_cond = threading.Condition(self._lock)
        self._hang = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        tok = self.tokenizer
        self._think_start, self._think_end = tok.token_to_id("<think>"), tok.token_to_id("</think>")

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> str:
        """Start serving; returns the OpenAI base URL `http://127.0.0.1:<port>/v1`."""
        if self._server is None:
            self._serve(_Server, type("Handler", (_Handler,), {"upstream": self}), "scripted-upstream")
        return self.base_url

    def stop(self) -> None:
        self._hang.set()
        with self._gate_cond:
            self.release(self._gate_waiting)
        self._shutdown()
        self._hang = threading.Event()

    # ---- scripting -----------------------------------------------------------------------------------------
    def script(self, *replies: Reply) -> None:
        """Queue replies; each chat request consumes the next one (the default reply when empty)."""
        for r in replies:
            r.faults()  # validate early
        with self._lock:
            self._queue.extend(replies)

    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def release(self, n: int = 1) -> None:
        """Let `n` gated streams continue past their first content chunk."""
        for _ in range(n):
            self._gate.release()

    def wait_for_gate(self, timeout: float = 5.0) -> bool:
        """Block until a gated stream is parked at its gate."""
        with self._gate_cond:
            return self._gate_cond.wait_for(lambda: self._gate_waiting > 0, timeout)

    def reset(self) -> None:
        """Clear the queue, the logs and any hanging or gated request."""
        with self._lock:
            self._queue.clear()
            self.requests.clear()
            self.responses.clear()
        self._hang.set()
        self._hang = threading.Event()
        while self._gate.acquire(blocking=False):
            pass

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/chat/completions")]

    # ---- request handling (called from handler threads) -------------------------------------------------------
    def _record(self, req: RecordedRequest) -> int:
        with self._lock:
            self.requests.append(req)
            return len(self.requests) - 1

    def _next_reply(self, body: dict, prompt_ids: list[int]) -> tuple[Reply, bool]:
        with self._lock:
            if self._queue:
                return self._queue.pop(0), True
        return self._default_reply(body, prompt_ids), False

    def _default_reply(self, body: dict, prompt_ids: list[int]) -> Reply:
        tools = body.get("tools") or []
        choice = body.get("tool_choice")
        # A thinking model thinks before a forced call; it also keeps streams of forced calls parseable.
        think = "Calling the tool." if self._reasoning_open(prompt_ids) else None
        if tools and (choice == "required" or isinstance(choice, dict)):
            name = choice["function"]["name"] if isinstance(choice, dict) else tools[0]["function"]["name"]
            tool = next(t for t in tools if t["function"]["name"] == name)
            arguments = minimal_json(tool["function"].get("parameters"))
            return Reply(reasoning=think, tool_calls=[(name, self._varied_arguments(arguments) if self.vary
                                                       else arguments)])
        fmt = body.get("response_format") or {}
        if fmt.get("type") == "json_schema":
            schema = (fmt.get("json_schema") or {}).get("schema") or {}
            return Reply(text=json.dumps(minimal_json(schema), ensure_ascii=False))
        if fmt.get("type") == "json_object":
            return Reply(text="{}")
        return Reply(text=self._varied_text() if self.vary else DEFAULT_TEXT)

    def _varied_text(self) -> str:
        """The next of VARIED_TEXTS, in turn (one counter for the server: concurrent samples get different ones)."""
        with self._lock:
            self._varied += 1
            return VARIED_TEXTS[(self._varied - 1) % len(VARIED_TEXTS)]

    def _varied_arguments(self, arguments: dict) -> dict:
        """A forced call's minimal arguments with every string replaced: a `path` by a file name, the rest by the
        next varied text (the same turn for all of a call's strings)."""
        text = self._varied_text()
        return {k: (VARIED_PATHS[VARIED_TEXTS.index(text) % len(VARIED_PATHS)] if k == "path" else text)
                if isinstance(v, str) else v for k, v in arguments.items()}

    def _reasoning_open(self, prompt_ids: Sequence[int]) -> bool:
        """False when the prompt already ended reasoning (vLLM's is_reasoning_end on the prompt ids)."""
        if not self.reasoning_parser:
            return False
        for t in reversed(prompt_ids):
            if t == self._think_start:
                return True
            if t == self._think_end:
                return False
        return True

    def validate_chat(self, body: Any) -> None:
        if not isinstance(body, dict):
            raise _HTTPError(400, "Request body must be a JSON object.")
        if body.get("model") not in (None, self.model):
            raise _HTTPError(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError", "model")
        if not isinstance(body.get("messages"), list):
            raise _HTTPError(400, "Field required: messages", param="messages")
        tools = body.get("tools")
        if tools is not None and not tools:
            raise _HTTPError(400, "`tools` must not be an empty list; omit it instead.", param="tools")
        choice = body.get("tool_choice")
        if choice is not None and choice != "none" and not tools:
            raise _HTTPError(400, "When using `tool_choice`, `tools` must be set.", param="tool_choice")
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            if name not in [t.get("function", {}).get("name") for t in tools or []]:
                raise _HTTPError(400, f"Tool '{name}' has not been passed in `tools`.", param="tool_choice")
        if (body.get("n") or 1) != 1:
            raise _HTTPError(400, "The scripted upstream serves n=1 only.", param="n")

    def prompt_ids(self, body: dict) -> list[int]:
        kwargs = dict(body.get("chat_template_kwargs") or {})
        try:
            return self.tokenizer.apply_chat_template(
                body["messages"], body.get("tools") or None, body.get("add_generation_prompt", True), **kwargs)
        except Exception as e:  # jinja2.TemplateError, invalid tool-call JSON
            raise _HTTPError(400, str(e)) from e

    def check_context(self, body: dict, prompt_len: int) -> int:
        """vLLM's context check; returns the effective max_tokens."""
        L = self.max_model_len
        name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        requested = body.get(name)
        if requested is not None and requested > L:
            raise _HTTPError(400, f"{name}={requested}cannot be greater than max_model_len=max_total_tokens={L}. "
                                  f"Please request fewer output tokens. (parameter={name}, value={requested})",
                             param=name)
        m = requested or 0
        if prompt_len > L - m or prompt_len >= L:
            seen = min(prompt_len, L - m + 1)
            raise _HTTPError(
                400,
                f"This model's maximum context length is {L} tokens. However, you requested {m} output tokens "
                f"and your prompt contains at least {seen} input tokens, for a total of at least {seen + m} "
                f"tokens. Please reduce the length of the input prompt or the number of requested output tokens. "
                f"(parameter=input_tokens, value={seen})",
                param="input_tokens")
        return requested if requested is not None else L - prompt_len

    def plan(self, body: dict, reply: Reply, prompt_ids: list[int], max_tokens: int, request_index: int) -> "_Plan":
        return _Plan(self, body, reply, prompt_ids, max_tokens, request_index)


# ---- the completion: ids, text, parsed message, stream deltas ------------------------------------------------

def _mode(body: dict) -> str:
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not tools or choice == "none":
        return "plain"
    if choice == "required":
        return "required"
    if isinstance(choice, dict):
        return "named"
    return "auto"


_HERMES_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


class _Plan:
    """Everything vLLM would compute for one chat request, from the script."""

    def __init__(self, up: ScriptedUpstream, body: dict, reply: Reply, prompt_ids: list[int], max_tokens: int,
                 request_index: int):
        self.up, self.body, self.reply, self.prompt_ids = up, body, reply, prompt_ids
        tok = up.tokenizer
        self.mode = _mode(body)
        self.named = body["tool_choice"]["function"]["name"] if self.mode == "named" else None
        # Hermes turns skip_special_tokens off when tools are in play.
        self.skip_special = not (body.get("tools") and body.get("tool_choice") != "none") and body.get(
            "skip_special_tokens", True)
        ids, natural_eos = self._planned_ids(reply)
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        stop_ids = set(body.get("stop_token_ids") or [])
        finish, stop_reason, cut_text = None, None, None
        out: list[int] = []
        for i, t in enumerate(ids):
            if len(out) >= max_tokens:
                finish = "length"
                break
            out.append(t)
            if natural_eos and i == len(ids) - 1:
                finish = "stop"
                break
            if t in stop_ids:
                finish, stop_reason = "stop", t
                break
            if stops:
                text = tok.decode(out, skip_special_tokens=self.skip_special)
                hits = [(text.find(s), s) for s in stops if s and s in text]
                if hits:
                    pos, s = min(hits)
                    finish, stop_reason, cut_text = "stop", s, text[:pos]
                    break
        else:
            finish = finish or ("length" if not natural_eos else "stop")
        if reply.finish is not None and finish != "length":
            finish = reply.finish
        self.ids = out
        self.finish = finish
        self.stop_reason = stop_reason
        eos_end = bool(out) and out[-1] in tok.eos_ids and stop_reason is None and finish == "stop"
        self.text_ids = out[:-1] if (eos_end or (stop_reason is not None and isinstance(stop_reason, int))) else out
        self.text = cut_text if cut_text is not None else tok.decode(self.text_ids, skip_special_tokens=self.skip_special)
        self.logprobs = self._logprobs(request_index)
        self.reasoning, self.content, self.tool_calls, self.finish_reason = self._parse()

    # -- ids
    def _planned_ids(self, reply: Reply) -> tuple[list[int], bool]:
        tok = self.up.tokenizer
        if reply.ids is not None:
            ids = list(reply.ids)
            return ids, bool(ids) and ids[-1] in tok.eos_ids and reply.finish in (None, "stop", "tool_calls")
        text = ""
        calls = list(reply.tool_calls)
        forced = bool(calls) and self.mode in ("required", "named")
        if reply.reasoning is not None:
            # Under a forced tool choice the grammar takes over right after </think>.
            text += "<think>\n" + reply.reasoning.strip("\n") + "\n</think>" + ("" if forced else "\n\n")
        if calls and self.mode == "required":
            text += "[" + ", ".join(json.dumps({"name": n, "parameters": a}, ensure_ascii=False) for n, a in calls) + "]"
        elif calls and self.mode == "named":
            text += json.dumps(calls[0][1], ensure_ascii=False)
        else:
            text += reply.text.rstrip("\n") if calls else reply.text
            for i, (name, args) in enumerate(calls):
                if i or reply.text.rstrip("\n"):
                    text += "\n"
                text += "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>"
        natural = reply.finish in (None, "stop", "tool_calls")
        return tok.encode(text) + ([tok.eos_id] if natural else []), natural

    def _logprobs(self, request_index: int) -> list[float]:
        if self.reply.logprobs is not None:
            lps = [float(x) for x in self.reply.logprobs]
            if len(lps) != len(self.ids):
                raise ValueError(f"Reply.logprobs has {len(lps)} values for {len(self.ids)} ids")
            return lps
        rng = random.Random(f"{self.up.logprob_seed}:{request_index}")
        return [-rng.uniform(1e-4, 4.0) for _ in self.ids]

    def logprobs_content(self, start: int, end: int) -> list[dict]:
        tok = self.up.tokenizer
        k = self.body.get("top_logprobs") or 0
        out = []
        for i in range(start, end):
            tid, lp = self.ids[i], self.logprobs[i]
            s = tok.token_str(tid)
            entry = {"token": s, "logprob": max(lp, -9999.0), "bytes": list(s.encode("utf-8"))}
            top = []
            if k:
                rng = random.Random(f"top:{tid}:{i}")
                cands = [(tid, lp)]
                alt = tid
                while len(cands) < k:
                    alt = (alt * 31 + 7) % tok.vocab_size
                    if alt not in [c for c, _ in cands]:
                        cands.append((alt, lp - rng.uniform(0.05, 3.0)))
                for cid, clp in sorted(cands, key=lambda c: -c[1]):
                    cs = tok.token_str(cid)
                    top.append({"token": cs, "logprob": max(clp, -9999.0), "bytes": list(cs.encode("utf-8"))})
            entry["top_logprobs"] = top
            out.append(entry)
        return out

    # -- non-streaming parse (qwen3 extract_reasoning, then the tool parser on the content)
    def _parse(self) -> tuple[str | None, str | None, list[dict], str]:
        text, reasoning, content = self.text, None, self.text
        if self.up.reasoning_parser and "<think>" in text and "</think>" in text:
            rest = text.partition("<think>")[2]
            reasoning, _, after = rest.partition("</think>")
            content = after or None
        calls: list[dict] = []
        finish = self.finish
        if self.mode == "auto" and content and "<tool_call>" in content:
            try:
                parsed = []
                for m in _HERMES_RE.findall(content):
                    obj = json.loads(m[0] if m[0] else m[1])
                    parsed.append((obj["name"], json.dumps(obj.get("arguments", {}), ensure_ascii=False)))
                calls = [self._call(n, a) for n, a in parsed]
                content = content[: content.find("<tool_call>")] or None
            except (ValueError, KeyError, TypeError):
                calls = []
        elif self.mode == "required":
            try:
                items = json.loads(content or "")
                calls = [self._call(c["name"], json.dumps(c.get("parameters", {}), ensure_ascii=False)) for c in items]
                content = ""
            except (ValueError, KeyError, TypeError):
                calls = []
        elif self.mode == "named":
            calls = [self._call(self.named, content or "")]
            content = ""
        if calls and self.mode in ("auto", "required") and finish == "stop":
            finish = "tool_calls"
        return reasoning, content, calls, finish

    @staticmethod
    def _call(name: str, arguments: str) -> dict:
        return {"id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
                "function": {"name": name, "arguments": arguments}}

    def message(self) -> dict:
        msg = {"role": "assistant", "content": self.content, "refusal": None, "annotations": None, "audio": None,
               "function_call": None, "tool_calls": self.tool_calls}
        for f in self.up.reasoning_fields:
            msg[f] = self.reasoning
        return msg

    # -- streaming: chunks of ids with the delta vLLM would send for each
    def stream_deltas(self) -> list[tuple[int, int, dict]]:
        """[(start, end, delta)] over self.ids, one per chunk of `chunk_tokens` ids."""
        tok = self.up.tokenizer
        n = max(1, self.reply.chunk_tokens)
        bounds = [(i, min(i + n, len(self.ids))) for i in range(0, len(self.ids), n)]
        final = self.text
        visible_prev = ""
        emul = _StreamEmulator(self)
        out = []
        for k, (a, b) in enumerate(bounds):
            last = k == len(bounds) - 1
            upto = min(b, len(self.text_ids))
            vis = tok.decode(self.text_ids[:upto], skip_special_tokens=self.skip_special)
            if not last:
                vis = vis.rstrip("\ufffd")  # the detokenizer holds back an incomplete UTF-8 sequence
            vis = final if last else vis[: len(final)]
            if not vis.startswith(visible_prev):
                vis = visible_prev
            delta_text = vis[len(visible_prev):]
            delta = emul.step(self.ids[a:b], delta_text, last)
            visible_prev = vis
            out.append((a, b, delta))
        return out


class _StreamEmulator:
    """vLLM's chat stream generator for one choice: reasoning parser, then the tool parser."""

    def __init__(self, plan: _Plan):
        self.p = plan
        up = plan.up
        self.start_id, self.end_id = up._think_start, up._think_end
        self.reasoning_on = bool(up.reasoning_parser)
        self.prev_ids: list[int] = []
        self.text = ""  # visible text so far
        self.reasoning_end = False
        self.first = True
        self.tool_from: int | None = None if (self.reasoning_on and plan.mode != "plain") else 0
        self.calls_sent: dict[int, int] = {}  # call index -> chars of arguments sent
        self.names_sent: set[int] = set()
        self.pending_content = ""
        self.segments: list[dict] | None = None

    def _think(self, prev_ids: list[int], delta_ids: list[int], delta_text: str) -> dict | None:
        s, e = self.start_id, self.end_id
        if len(delta_ids) == 1 and delta_ids[0] in (s, e):
            return None
        if s in prev_ids:
            if e in delta_ids:
                i = delta_text.find("</think>")
                rest = delta_text[i + len("</think>"):]
                return {"reasoning": delta_text[:i], "content": rest or None}
            if e in prev_ids:
                return {"content": delta_text}
            return {"reasoning": delta_text}
        if s in delta_ids:
            if e in delta_ids:
                i, j = delta_text.find("<think>"), delta_text.find("</think>")
                rest = delta_text[j + len("</think>"):]
                return {"reasoning": delta_text[i + len("<think>"):j], "content": rest or None}
            return {"reasoning": delta_text}
        return {"content": delta_text}

    @staticmethod
    def _ends(ids: Sequence[int], s: int, e: int) -> bool:
        for t in reversed(ids):
            if t == s:
                return False
            if t == e:
                return True
        return False

    def step(self, delta_ids: list[int], delta_text: str, last: bool) -> dict:
        p = self.p
        prev_ids, prev_text = self.prev_ids, self.text
        self.prev_ids = prev_ids + list(delta_ids)
        self.text = prev_text + delta_text
        msg: dict | None
        if p.mode == "plain":
            msg = self._think(prev_ids, delta_ids, delta_text) if self.reasoning_on else {"content": delta_text}
        else:
            msg = None
            if self.tool_from is None:
                if self.first and not p.up._reasoning_open(p.prompt_ids):
                    self.tool_from = len(prev_text)
                else:
                    msg = self._think(prev_ids, delta_ids, delta_text)
                    if self._ends(delta_ids, self.start_id, self.end_id):
                        j = self.text.rfind("</think>")
                        self.tool_from = j + len("</think>") if j >= 0 else len(self.text)
            if self.tool_from is not None:
                msg = self._tools(last)
        self.first = False
        return msg if msg is not None else {}

    # -- tool parsers over the text after reasoning ended
    def _segments(self) -> list[dict]:
        """Calls found in the final tool text: spans of the name and of the arguments, absolute positions."""
        if self.segments is not None:
            return self.segments
        base, full = self.tool_from or 0, self.p.text
        text = full[base:]
        segs: list[dict] = []
        calls = self.p.tool_calls
        if self.p.mode == "auto":
            k = 0
            for m in re.finditer(r"<tool_call>(.*?)(</tool_call>|$)", text, re.DOTALL):
                if k >= len(calls):
                    break
                body_start = m.start(1)
                nm = re.search(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"', m.group(1))
                am = re.search(r'"arguments"\s*:\s*', m.group(1))
                name_end = base + body_start + (nm.end() if nm else len(m.group(1)))
                args_start = base + body_start + (am.end() if am else len(m.group(1)))
                segs.append({"start": base + m.start(), "end": base + m.end(), "name_end": name_end,
                             "args_start": args_start, "args_end": base + m.end(1),
                             "args": calls[k]["function"]["arguments"], "call": calls[k]})
                k += 1
        elif self.p.mode == "required":
            pos = 0
            for c in calls:
                nm = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"').search(text, pos)
                am = re.compile(r'"parameters"\s*:\s*').search(text, nm.end() if nm else pos)
                if not nm or not am:
                    break
                raw = c["function"]["arguments"]
                end = am.end() + len(raw)
                segs.append({"start": base + nm.start(), "end": base + end + 1, "name_end": base + am.end(),
                             "args_start": base + am.end(), "args_end": base + end, "args": raw, "call": c,
                             "with_args": True})
                pos = end
        elif self.p.mode == "named" and calls:
            segs.append({"start": base, "end": len(full), "name_end": base, "args_start": base,
                         "args_end": len(full), "args": text, "call": calls[0], "with_args": True, "raw": True})
        self.segments = segs
        return segs

    def _tools(self, last: bool) -> dict | None:
        p = self.p
        if p.mode == "auto" and not p.tool_calls:
            # No parsable call: hermes streams text as content (a cut-off call too).
            return self._content_between(len(self.text))
        segs = self._segments()
        hi = len(self.text)
        content = ""
        if p.mode == "auto":
            content = self._content_outside(segs, hi)
        tool_delta = None
        for idx, s in enumerate(segs):
            if idx not in self.names_sent:
                if hi >= s["name_end"] or last:
                    self.names_sent.add(idx)
                    self.calls_sent[idx] = 0
                    fn: dict = {"name": s["call"]["function"]["name"]}
                    if s.get("with_args"):
                        sent = self._args_target(s, hi, last)
                        fn["arguments"] = s["args"][:sent]
                        self.calls_sent[idx] = sent
                    tool_delta = {"index": idx, "id": s["call"]["id"], "type": "function", "function": fn}
                    break
                break
            target = self._args_target(s, hi, last)
            if target > self.calls_sent[idx]:
                piece = s["args"][self.calls_sent[idx]:target]
                self.calls_sent[idx] = target
                tool_delta = {"index": idx, "function": {"arguments": piece}}
                if not last:
                    break
                # at the finish, vLLM sends whatever is left of the last call in the finish chunk
        msg: dict = {}
        if tool_delta is not None:
            msg["tool_calls"] = [tool_delta]
        if content and tool_delta is None:
            msg["content"] = content
        elif content:
            self.pending_content += content
        if last and self.pending_content and "content" not in msg:
            msg["content"] = self.pending_content
            self.pending_content = ""
        return msg or None

    def _args_target(self, s: dict, hi: int, last: bool) -> int:
        total = len(s["args"])
        if last or hi >= s["end"]:
            return total
        span = max(1, s["args_end"] - s["args_start"])
        if s.get("raw"):
            return max(0, min(total, hi - s["args_start"]))
        frac = (hi - s["args_start"]) / span
        # hermes holds the last characters back until the call closes
        return max(0, min(total - 1, int(total * frac) - 1))

    _content_pos = 0

    def _content_between(self, hi: int) -> dict | None:
        lo = max(self._content_pos, self.tool_from or 0)
        piece = self.text[lo:hi]
        self._content_pos = max(self._content_pos, hi)
        if self.pending_content:
            piece, self.pending_content = self.pending_content + piece, ""
        return {"content": piece} if piece else None

    def _content_outside(self, segs: list[dict], hi: int) -> str:
        lo = max(self._content_pos, self.tool_from or 0)
        out = []
        pos = lo
        for s in segs:
            if s["end"] <= pos:
                continue
            if s["start"] >= hi:
                break
            if s["start"] > pos:
                out.append(self.text[pos:min(s["start"], hi)])
            pos = max(pos, s["end"])
        if pos < hi:
            out.append(self.text[pos:hi])
        self._content_pos = max(self._content_pos, hi)
        return "".join(out)


# ---- HTTP -----------------------------------------------------------------------------------------------------

class _Disconnect(Exception):
    pass


class _Handler(BaseHTTPRequestHandler):
    upstream: ScriptedUpstream
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # -- plumbing
    def _read_body(self) -> bytes:
        return read_request_body(self)

    def _send_json(self, status: int, obj: Any, raw: bytes | None = None) -> None:
        data = raw if raw is not None else _dumps(obj)
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _record(self, body: Any) -> int:
        headers = {k.lower(): v for k, v in self.headers.items()}
        return self.upstream._record(RecordedRequest(self.command, self.path.split("?")[0], headers, body))

    # -- routes
    def do_GET(self) -> None:
        up = self.upstream
        path = self.path.split("?")[0]
        self._record(None)
        if path == "/health":
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()
        elif path == "/version":
            self._send_json(200, {"version": up.version})
        elif path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [{
                "id": up.model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                "root": str(up.tokenizer.path), "parent": None, "max_model_len": up.max_model_len,
                "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                                "created": int(time.time()), "allow_create_engine": False,
                                "allow_sampling": True, "allow_logprobs": True, "allow_search_indices": False,
                                "allow_view": True, "allow_fine_tuning": False, "organization": "*",
                                "group": None, "is_blocking": False}]}]})
        else:
            self._send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        up = self.upstream
        path = self.path.split("?")[0]
        raw = self._read_body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
            self._record(None)
            return self._send_json(400, _HTTPError(400, "Request body is not valid JSON.").body())
        index = self._record(body)
        try:
            if path == "/tokenize":
                return self._tokenize(body)
            if path == "/detokenize":
                return self._send_json(200, {"prompt": up.tokenizer.decode(body.get("tokens") or [])})
            if path == "/v1/chat/completions":
                return self._chat(body, index)
            return self._send_json(404, {"detail": "Not Found"})
        except _HTTPError as e:
            return self._send_json(e.status, e.body())
        except _Disconnect:
            self.close_connection = True

    def _tokenize(self, body: Any) -> None:
        up = self.upstream
        if not isinstance(body, dict):
            raise _HTTPError(400, "Request body must be a JSON object.")
        if "messages" in body:
            ids = up.prompt_ids(body)
        elif "prompt" in body:
            ids = up.tokenizer.encode(body["prompt"])
        else:
            raise _HTTPError(400, "Either `prompt` or `messages` is required.")
        strs = [up.tokenizer.id_to_token(i) for i in ids] if body.get("return_token_strs") else None
        self._send_json(200, {"count": len(ids), "max_model_len": up.max_model_len, "tokens": ids,
                              "token_strs": strs})

    def _chat(self, body: Any, index: int) -> None:
        up = self.upstream
        up.validate_chat(body)
        prompt = up.prompt_ids(body)
        max_tokens = up.check_context(body, len(prompt))
        reply, _ = up._next_reply(body, prompt)
        faults = reply.faults()
        stream = bool(body.get("stream"))
        rec = RecordedResponse(request_index=index, stream=stream, status=200, prompt_token_ids=prompt,
                               faults=faults)
        with up._lock:
            up.responses.append(rec)
        hang = up._hang
        if "hang" in faults:
            hang.wait()
            rec.status = 0
            raise _Disconnect
        if "slow_first_byte" in faults:
            hang.wait(float(faults["slow_first_byte"] or 1.0))
        if "status" in faults:
            code, _, nobody = faults["status"].partition("-")
            rec.status = int(code)
            if nobody:
                return self._send_json(rec.status, None, raw=b"")
            types = {400: "BadRequestError", 404: "NotFoundError", 429: "TooManyRequestsError",
                     500: "InternalServerError", 503: "ServiceUnavailableError"}
            err = _HTTPError(rec.status, f"scripted fault: status {rec.status}", types.get(rec.status, "Error"))
            rec.error = err.body()
            return self._send_json(rec.status, err.body())
        plan = up.plan(body, reply, prompt, max_tokens, index)
        usage = {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(plan.ids),
                 "completion_tokens": len(plan.ids)}
        rec.completion_ids, rec.logprobs = list(plan.ids), list(plan.logprobs)
        rec.finish_reason, rec.stop_reason, rec.usage = plan.finish_reason, plan.stop_reason, usage
        rec.text, rec.content, rec.reasoning, rec.tool_calls = plan.text, plan.content, plan.reasoning, plan.tool_calls
        want_ids = bool(body.get("return_token_ids")) and "no_token_ids" not in faults
        want_lp = bool(body.get("logprobs")) and "no_logprobs" not in faults
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if not stream:
            return self._chat_full(body, plan, faults, rid, created, usage, want_ids, want_lp)
        return self._chat_stream(body, plan, faults, rid, created, usage, want_ids, want_lp)

    def _weight_versions(self, body: dict, n_ids: int) -> list[dict] | None:
        """vLLM ≥ 0.33 with `return_weight_versions`: per choice, spans of the sampled ids and the weight version
        that sampled them, `[{"version", "start", "end"}]` (the shape vLLM's own test of weight-version delivery
        expects: SPAN_JSON = [{"version": "v7", "start": 0, "end": 1}]), on the full choice or the terminal chunk's."""
        new = tuple(int(x) for x in self.upstream.version.split(".")[:2]) >= (0, 33)
        if body.get("return_weight_versions") and new:
            return [{"version": self.upstream.weight_version_label, "start": 0, "end": n_ids}]
        return None

    def _chat_full(self, body, plan: _Plan, faults, rid, created, usage, want_ids, want_lp) -> None:
        up = self.upstream
        if "disconnect_after" in faults:
            raise _Disconnect
        if "garbage" in faults:
            return self._send_json(200, None, raw=b"<html>not json</html>")
        choice = {"index": 0, "message": plan.message(),
                  "logprobs": {"content": plan.logprobs_content(0, len(plan.ids))} if want_lp else None,
                  "finish_reason": plan.finish_reason, "stop_reason": plan.stop_reason,
                  "token_ids": list(plan.ids) if want_ids else None}
        wv = self._weight_versions(body, len(plan.ids))
        if wv is not None:
            choice["weight_versions"] = wv
        resp = {"id": rid, "object": "chat.completion", "created": created, "model": up.model,
                "choices": [choice], "service_tier": None, "system_fingerprint": up.system_fingerprint,
                "usage": dict(usage, prompt_tokens_details=None), "prompt_logprobs": None,
                "prompt_token_ids": list(plan.prompt_ids) if want_ids else None, "kv_transfer_params": None}
        self._send_json(200, resp)

    def _chat_stream(self, body, plan: _Plan, faults, rid, created, usage, want_ids, want_lp) -> None:
        up = self.upstream
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        limit = int(faults["disconnect_after"]) if "disconnect_after" in faults else None
        sent = 0

        def event(obj: Any) -> None:
            nonlocal sent
            if limit is not None and sent >= limit:
                raise _Disconnect
            data = obj if isinstance(obj, bytes) else b"data: " + _dumps(obj) + b"\n\n"
            self._chunk(data)
            sent += 1

        def chunk(choices: list, **extra: Any) -> dict:
            c = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": up.model,
                 "system_fingerprint": up.system_fingerprint, "choices": choices}
            c.update(extra)
            return c

        if "garbage" in faults:
            event(b"data: {this is not json\n\n")
            event(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        event(chunk([first], **({"prompt_token_ids": list(plan.prompt_ids)} if want_ids else {})))
        deltas = plan.stream_deltas()
        wv = self._weight_versions(body, len(plan.ids))
        for k, (a, b, delta) in enumerate(deltas):
            last = k == len(deltas) - 1
            ch: dict = {"index": 0, "delta": delta,
                        "logprobs": {"content": plan.logprobs_content(a, b)} if want_lp else None,
                        "finish_reason": plan.finish_reason if last else None}
            if last:
                ch["stop_reason"] = plan.stop_reason
            if want_ids:
                ch["token_ids"] = list(plan.ids[a:b])
            if last and wv is not None:
                ch["weight_versions"] = wv
            event(chunk([ch]))
            if k == 0 and plan.reply.gate:
                with up._gate_cond:
                    up._gate_waiting += 1
                    up._gate_cond.notify_all()
                try:
                    up._gate.acquire(timeout=up.gate_timeout)
                finally:
                    with up._gate_cond:
                        up._gate_waiting -= 1
        if not deltas:  # zero tokens (max_tokens=0 is rejected by vLLM; an empty ids script still finishes)
            event(chunk([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": plan.finish_reason,
                          "stop_reason": plan.stop_reason, **({"token_ids": []} if want_ids else {})}]))
        opts = body.get("stream_options") or {}
        if opts.get("include_usage"):
            event(chunk([], usage=usage))
        event(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Serve the scripted vLLM stand-in (default replies only).")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder (default: .cache/models/tokenizer)")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--max-model-len", type=int, default=65536)
    ap.add_argument("--no-reasoning-parser", action="store_true")
    ap.add_argument("--vary", action="store_true", help="default replies differ from call to call (a reward spread)")
    args = ap.parse_args(list(argv) if argv is not None else None)
    up = ScriptedUpstream(args.tokenizer, model=args.model, max_model_len=args.max_model_len, host=args.host,
                          port=args.port, reasoning_parser=None if args.no_reasoning_parser else "qwen3",
                          vary=args.vary)
    print(up.start(), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        up.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
