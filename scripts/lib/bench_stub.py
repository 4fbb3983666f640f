"""A fast stub backend for scripts/bench_gateway: vLLM's OpenAI wire format from precomputed bytes.

Serves `GET /v1/models` (one model, with `max_model_len`), `GET /version`, `POST /tokenize` (`count`,
`max_model_len`, `tokens`) and `POST /v1/chat/completions`, JSON or SSE, with vLLM's token-id fields: top-level
`prompt_token_ids` (JSON response / first stream chunk), `choices[0].token_ids` and `choices[0].logprobs.content`
per chunk, a `choices: []` usage chunk, then `data: [DONE]` (docs/field-notes.md: vLLM). Every answer is the same
precomputed completion and the same precomputed prompt ids, whatever was asked: the request body is not parsed (only
`"stream": true` is looked for), so the stub costs a few tens of microseconds per call and the benchmark measures the
proxies, not the backend. Streams are paced when asked: the first chunk after --first-ms (prefill), then one chunk
per token every --chunk-ms (with --pace-marker, only requests whose body holds the marker). HTTP/1.1 keep-alive, Content-Length or chunked bodies; asyncio protocol, one process.

Standard library only (it also runs under LiteLLM's or any other interpreter):
    python scripts/lib/bench_stub.py --port P [--prompt-ids FILE | --prompt-tokens N] [--completion-tokens N]
        [--first-ms F --chunk-ms C] [--max-model-len L]
Prints `stub ready port=P max_model_len=L prompt_tokens=N completion_tokens=M` when listening; `GET /stats` returns
the calls served.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import sys

MODEL = "stub-model"
STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')


def _dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class Canned:
    """Every response body, built once."""

    def __init__(self, prompt_ids: list[int], completion_tokens: int, max_model_len: int, version: str):
        rng = random.Random(7)
        self.prompt_ids = prompt_ids
        self.max_model_len = max_model_len
        words = ["the", " stub", " says", " hello", " token", " world", ",", " and", " then", "."]
        self.pieces = [words[i % len(words)] for i in range(completion_tokens)]
        self.ids = [rng.randrange(100, 150000) for _ in range(completion_tokens)]
        # The EOS id ends a `stop` turn's ids and is not in the text (docs/field-notes.md: vLLM).
        self.ids[-1] = 151645
        self.pieces[-1] = ""
        self.logprobs = [round(-rng.random() * 2, 6) for _ in range(completion_tokens)]
        text = "".join(self.pieces)
        n, m = len(prompt_ids), completion_tokens
        usage = {"prompt_tokens": n, "total_tokens": n + m, "completion_tokens": m}
        created = 1700000000
        fp = f"vllm-{version}-stub"

        def entry(i):
            return {"token": self.pieces[i] or "<|im_end|>", "logprob": self.logprobs[i], "bytes": None,
                    "top_logprobs": []}

        self.json_body = _dumps({
            "id": "chatcmpl-stub", "object": "chat.completion", "created": created, "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "reasoning": None,
                                                 "tool_calls": []},
                         "logprobs": {"content": [entry(i) for i in range(m)]}, "finish_reason": "stop",
                         "stop_reason": None, "token_ids": self.ids}],
            "usage": usage, "prompt_logprobs": None, "prompt_token_ids": prompt_ids, "system_fingerprint": fp,
        })
        head = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": created, "model": MODEL}
        chunks = [dict(head, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""},
                                       "logprobs": None, "finish_reason": None}],
                       prompt_token_ids=prompt_ids, system_fingerprint=fp)]
        for i in range(m):
            last = i == m - 1
            chunks.append(dict(head, choices=[{
                "index": 0, "delta": {"content": self.pieces[i]} if self.pieces[i] else {},
                "logprobs": {"content": [entry(i)]}, "finish_reason": "stop" if last else None,
                "stop_reason": None, "token_ids": [self.ids[i]]}]))
        chunks.append(dict(head, choices=[], usage=usage))
        self.events = [b"data: " + _dumps(c) + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]
        # Unpaced: the whole stream in one write, as a chunked body.
        self.stream_all = b"".join(_chunk(e) for e in self.events) + b"0\r\n\r\n"
        self.models_body = _dumps({"object": "list", "data": [{
            "id": MODEL, "object": "model", "created": created, "owned_by": "vllm", "root": MODEL,
            "parent": None, "max_model_len": max_model_len}]})
        self.version_body = _dumps({"version": version})
        self.tokenize_body = _dumps({"count": n, "max_model_len": max_model_len, "tokens": prompt_ids,
                                     "token_strs": None})


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _head(status: int, ctype: bytes, length: int | None) -> bytes:
    reason = {200: b"OK", 404: b"Not Found"}.get(status, b"Error")
    out = [b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\n" % (status, reason, ctype)]
    out.append(b"content-length: %d\r\n" % length if length is not None else b"transfer-encoding: chunked\r\n")
    out.append(b"\r\n")
    return b"".join(out)


class Stats:
    conns = 0
    calls = 0
    streams = 0
    tokenize = 0


class StubProtocol(asyncio.Protocol):
    def __init__(self, canned: Canned, first_s: float, chunk_s: float, marker: bytes | None):
        self.canned, self.first_s, self.chunk_s, self.marker = canned, first_s, chunk_s, marker
        self.buf = bytearray()
        self.transport = None
        self.busy = False  # a paced stream is being written; later pipelined requests wait in buf

    def connection_made(self, transport):
        Stats.conns += 1
        self.transport = transport

    def data_received(self, data: bytes):
        self.buf += data
        if not self.busy:
            self._process()

    def _process(self):
        while not self.busy:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end])
            length = 0
            m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
            if m:
                length = int(m.group(1))
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4:end + 4 + length])
            del self.buf[:end + 4 + length]
            line = head.split(b"\r\n", 1)[0]
            parts = line.split(b" ")
            method, path = parts[0], parts[1] if len(parts) > 1 else b"/"
            self._answer(method, path.split(b"?", 1)[0], body)

    def _answer(self, method: bytes, path: bytes, body: bytes):
        c, t = self.canned, self.transport
        if path.endswith(b"/chat/completions") and method == b"POST":
            Stats.calls += 1
            if STREAM_TRUE.search(body):
                Stats.streams += 1
                paced = (self.first_s > 0 or self.chunk_s > 0) and (self.marker is None or self.marker in body)
                if not paced:
                    t.write(_head(200, b"text/event-stream", None) + c.stream_all)
                else:
                    self.busy = True
                    asyncio.get_running_loop().create_task(self._paced())
                return
            t.write(_head(200, b"application/json", len(c.json_body)) + c.json_body)
        elif path.endswith(b"/tokenize") and method == b"POST":
            Stats.tokenize += 1
            t.write(_head(200, b"application/json", len(c.tokenize_body)) + c.tokenize_body)
        elif path.endswith(b"/models"):
            t.write(_head(200, b"application/json", len(c.models_body)) + c.models_body)
        elif path.endswith(b"/version"):
            t.write(_head(200, b"application/json", len(c.version_body)) + c.version_body)
        elif path.endswith(b"/stats"):
            doc = _dumps({"conns": Stats.conns, "calls": Stats.calls, "streams": Stats.streams, "tokenize": Stats.tokenize,
                          "pid": os.getpid()})
            t.write(_head(200, b"application/json", len(doc)) + doc)
        elif path.endswith(b"/health"):
            t.write(_head(200, b"application/json", 2) + b"{}")
        else:
            doc = b'{"error":{"message":"not found","type":"NotFoundError","code":404}}'
            t.write(_head(404, b"application/json", len(doc)) + doc)

    async def _paced(self):
        c, t = self.canned, self.transport
        try:
            t.write(_head(200, b"text/event-stream", None))
            await asyncio.sleep(self.first_s)
            for i, event in enumerate(c.events):
                if t.is_closing():
                    return
                if 1 <= i < len(c.events) - 2 and self.chunk_s > 0:
                    await asyncio.sleep(self.chunk_s)
                t.write(_chunk(event))
            t.write(b"0\r\n\r\n")
        finally:
            self.busy = False
        if self.buf:
            self._process()


def load_prompt_ids(args) -> list[int]:
    if args.prompt_ids:
        with open(args.prompt_ids) as fh:
            return [int(x) for x in json.load(fh)]
    rng = random.Random(11)
    return [rng.randrange(0, 150000) for _ in range(args.prompt_tokens)]


async def serve(args) -> None:
    canned = Canned(load_prompt_ids(args), args.completion_tokens, args.max_model_len, args.version)
    loop = asyncio.get_running_loop()
    marker = args.pace_marker.encode() if args.pace_marker else None
    server = await loop.create_server(lambda: StubProtocol(canned, args.first_ms / 1000, args.chunk_ms / 1000, marker),
                                      args.host, args.port, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"stub ready port={port} max_model_len={args.max_model_len} prompt_tokens={len(canned.prompt_ids)} "
          f"completion_tokens={args.completion_tokens}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench_stub.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--prompt-ids", help="JSON list of prompt token ids (the same for every call)")
    ap.add_argument("--prompt-tokens", type=int, default=12000, help="random prompt ids when --prompt-ids is unset")
    ap.add_argument("--completion-tokens", type=int, default=32)
    ap.add_argument("--first-ms", type=float, default=0.0, help="stream: delay before the first chunk (prefill)")
    ap.add_argument("--chunk-ms", type=float, default=0.0, help="stream: delay between token chunks")
    ap.add_argument("--pace-marker", help="pace only streams whose request body contains this string")
    ap.add_argument("--max-model-len", type=int, default=131072)
    ap.add_argument("--version", default="0.11.1")
    args = ap.parse_args(argv)
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
