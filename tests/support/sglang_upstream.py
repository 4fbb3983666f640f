"""The scripted upstream in SGLang's wire format, as a thin layer over ScriptedUpstream: a stand-in WRITTEN FROM
SGLang 0.5.23's source (the PyPI wheel's sglang/srt/entrypoints/openai/protocol.py and serving_chat.py, read, not
run), never recorded from a running SGLang (none runs here: it needs a GPU build of torch).

Same script, tokenizer, template, parsers and faults as the vLLM stand-in; only the wire differs:
- `/v1/models` entries are `owned_by: "sglang"`; `/version` answers SGLang's version.
- Streaming: no `prompt_token_ids` / `token_ids` in chunks whatever the body asks; with the request headers
  `x-sglext-return-input-ids: 1` / `x-sglext-return-output-ids: 1` the ids arrive in ONE chunk
  `{"choices": [], "sglext": {"input_ids": [...], "output_ids": [[...]]}}` (SglExt.output_ids is List[List[int]]:
  one list per choice) after the finish chunk and before the usage chunk; the finish reason comes in a chunk of its
  own after the content chunks.
- Non-streaming with `return_token_ids: true`: per-choice `prompt_token_ids` and `response_token_ids`; with the
  headers, the same response-level `sglext`.
- Reasoning is `reasoning_content` (message and delta); the finish chunk carries `matched_stop`, not `stop_reason`;
  no `system_fingerprint`.
- `/tokenize` takes a text `prompt` only (no chat messages): a messages body is a 400, as SGLang's request model
  requires `prompt`.
"""

from __future__ import annotations

import time
from http.server import ThreadingHTTPServer
from typing import Any

from tests.support.scripted_upstream import (
    DEFAULT_MODEL,
    ScriptedUpstream,
    _Disconnect,
    _dumps,
    _Handler,
    _HTTPError,
    _Plan,
)

SGLANG_VERSION = "0.5.23"
INPUT_IDS_HEADER = "x-sglext-return-input-ids"
OUTPUT_IDS_HEADER = "x-sglext-return-output-ids"


class SGLangUpstream(ScriptedUpstream):
    """A scripted SGLang server (see the module docstring for how its wire differs from vLLM's)."""

    def __init__(self, tokenizer=None, *, model: str = DEFAULT_MODEL, version: str = SGLANG_VERSION, **kw: Any):
        kw.setdefault("reasoning_fields", ("reasoning_content",))
        super().__init__(tokenizer, model=model, version=version, **kw)
        self.system_fingerprint = None

    def start(self) -> str:
        if self._server is None:
            self._serve(ThreadingHTTPServer, type("Handler", (_SGLangHandler,), {"upstream": self}), "sglang-upstream")
        return self.base_url


def _sglang_delta(delta: dict) -> dict:
    out = dict(delta)
    if "reasoning" in out:
        out["reasoning_content"] = out.pop("reasoning")
    return out


def _matched_stop(plan: _Plan) -> Any:
    """SGLang's `matched_stop`: the stop string or stop id that ended the turn, the EOS id on a natural end."""
    if plan.stop_reason is not None:
        return plan.stop_reason
    if plan.finish_reason in ("stop", "tool_calls") and plan.ids and plan.ids[-1] in plan.up.tokenizer.eos_ids:
        return plan.ids[-1]
    return None


class _SGLangHandler(_Handler):
    server_version = "uvicorn"

    def do_GET(self) -> None:
        up = self.upstream
        path = self.path.split("?")[0]
        if path == "/v1/models":
            self._record(None)
            return self._send_json(200, {"object": "list", "data": [{
                "id": up.model, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                "root": up.model, "parent": None, "max_model_len": up.max_model_len}]})
        return super().do_GET()

    def _tokenize(self, body: Any) -> None:
        up = self.upstream
        if not isinstance(body, dict) or "prompt" not in body:
            raise _HTTPError(400, "1 validation error for TokenizeRequest\nprompt\n  Field required",
                             "BadRequest", "prompt")
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        ids = [up.tokenizer.encode(p) for p in prompts]
        if isinstance(body["prompt"], list):
            return self._send_json(200, {"tokens": ids, "count": [len(i) for i in ids],
                                         "max_model_len": up.max_model_len})
        self._send_json(200, {"tokens": ids[0], "count": len(ids[0]), "max_model_len": up.max_model_len})

    def _chat_full(self, body, plan: _Plan, faults, rid, created, usage, want_ids, want_lp) -> None:
        up = self.upstream
        if "disconnect_after" in faults:
            raise _Disconnect
        if "garbage" in faults:
            return self._send_json(200, None, raw=b"<html>not json</html>")
        choice = {"index": 0, "message": plan.message(),
                  "logprobs": {"content": plan.logprobs_content(0, len(plan.ids))} if want_lp else None,
                  "finish_reason": plan.finish_reason, "matched_stop": _matched_stop(plan)}
        if want_ids:
            choice["prompt_token_ids"] = list(plan.prompt_ids)
            choice["response_token_ids"] = list(plan.ids)
        resp = {"id": rid, "object": "chat.completion", "created": created, "model": up.model,
                "choices": [choice], "usage": dict(usage, prompt_tokens_details=None), "metadata": None}
        ext = self._sglext(plan)
        if ext:  # serving_chat.py: the sglext headers' ids at response level here too
            resp["sglext"] = ext
        self._send_json(200, resp)

    def _sglext(self, plan: _Plan) -> dict:
        headers = {k.lower(): v for k, v in self.headers.items()}
        ext: dict = {}
        if headers.get(INPUT_IDS_HEADER, "").lower() in ("1", "true"):
            ext["input_ids"] = list(plan.prompt_ids)
        if headers.get(OUTPUT_IDS_HEADER, "").lower() in ("1", "true"):
            ext["output_ids"] = [list(plan.ids)]  # one list per choice
        return ext

    def _chat_stream(self, body, plan: _Plan, faults, rid, created, usage, want_ids, want_lp) -> None:
        up = self.upstream
        headers = {k.lower(): v for k, v in self.headers.items()}
        want_in = headers.get(INPUT_IDS_HEADER, "").lower() in ("1", "true")
        want_out = headers.get(OUTPUT_IDS_HEADER, "").lower() in ("1", "true")
        if "no_token_ids" in faults:
            want_in = want_out = False
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        limit = int(faults["disconnect_after"]) if "disconnect_after" in faults else None
        sent = 0

        def event(obj: Any) -> None:
            nonlocal sent
            if limit is not None and sent >= limit:
                raise _Disconnect
            self._chunk(obj if isinstance(obj, bytes) else b"data: " + _dumps(obj) + b"\n\n")
            sent += 1

        def chunk(choices: list, **extra: Any) -> dict:
            c = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": up.model,
                 "choices": choices, "usage": None}
            c.update(extra)
            return c

        if "garbage" in faults:
            event(b"data: {this is not json\n\n")
            event(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        event(chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None, "matched_stop": None}]))
        for a, b, delta in plan.stream_deltas():
            event(chunk([{"index": 0, "delta": _sglang_delta(delta),
                          "logprobs": {"content": plan.logprobs_content(a, b)} if want_lp else None,
                          "finish_reason": None, "matched_stop": None}]))
        # serving_chat.py: the finish reason in a chunk of its own once the engine is done, then the sglext chunk
        # (choices [], ids at response level; output_ids one list per choice), then the usage chunk
        event(chunk([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": plan.finish_reason,
                      "matched_stop": _matched_stop(plan)}]))
        ext = {}
        if want_in:
            ext["input_ids"] = list(plan.prompt_ids)
        if want_out:
            ext["output_ids"] = [list(plan.ids)]
        if ext:
            event(chunk([], sglext=ext))
        if (body.get("stream_options") or {}).get("include_usage"):
            event(chunk([], usage=usage))
        event(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


__all__ = ["SGLangUpstream", "SGLANG_VERSION", "INPUT_IDS_HEADER", "OUTPUT_IDS_HEADER"]
