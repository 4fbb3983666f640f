"""Exact mode's probe: learn the chat template's end-of-turn id from a few `/tokenize` renders, then require one
1-token chat call with deliberately non-canonical prompt ids to echo them unchanged (`ExactMode.probe` caches the
result per backend)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx
import orjson

from .stream_reader import StreamReader

PROBE_TEXT = "Polar probe"


@dataclass
class ProbeResult:
    ok: bool
    eot: int | None = None
    message: str = ""


def _find(hay: list[int], needle: list[int]) -> int:
    for i in range(len(hay) - len(needle) + 1):
        if hay[i:i + len(needle)] == needle:
            return i
    return -1


def end_of_turn(one: list[int], three: list[int], word: list[int]) -> int | None:
    """The template's end-of-turn id from renders of [user W] and [user W, assistant W, user W] (no generation
    prompt): the first id after W that occurs exactly twice more in the longer render (once per added message)."""
    at = _find(one, word)
    if at < 0:
        return None
    for t in one[at + len(word):]:
        if three.count(t) - one.count(t) == 2:
            return t
    return None


async def _run_probe(backend, info) -> ProbeResult:
    if info.kind != "vllm":
        return ProbeResult(False, message=f"backend kind {info.kind!r}: prompt token ids on chat need vLLM ≥ 0.30")
    model = info.model
    user = {"role": "user", "content": PROBE_TEXT}
    gate = asyncio.Semaphore(4)  # a few at a time: small servers have small listen backlogs

    async def limited(coro):
        async with gate:
            return await coro

    one, three, canonical, word, *chars = await asyncio.gather(*map(limited, (
        backend.render({"messages": [user]}, model, add_generation_prompt=False),
        backend.render({"messages": [user, {"role": "assistant", "content": PROBE_TEXT}, user]}, model,
                       add_generation_prompt=False),
        backend.render({"messages": [user]}, model),
        backend.tokens(PROBE_TEXT, model),
        *(backend.tokens(ch, model) for ch in PROBE_TEXT))))
    eot = end_of_turn(one, three, word)
    if eot is None:
        return ProbeResult(False, message="the chat template has no end-of-turn token the probe could identify "
                                          "(exact splicing counts end-of-turn ids)")
    at = _find(canonical, word)
    split = [t for ids in chars for t in ids]  # one token per character: not how the tokenizer splits the word
    if at < 0 or split == word:
        return ProbeResult(False, message="could not build non-canonical probe ids for this tokenizer")
    ids = canonical[:at] + split + canonical[at + len(word):]
    body = {"model": model, "messages": [user], "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": 1, "logprobs": True, "top_logprobs": 0, "return_token_ids": True, "temperature": 1.0,
            "kv_transfer_params": {"prompt_token_ids": ids}}
    reader = StreamReader(keep_logprob_entries=False)
    async with backend.client.stream("POST", backend.base_url + "/chat/completions", content=orjson.dumps(body),
                                     timeout=httpx.Timeout(120.0, connect=backend.client.timeout.connect)) as resp:
        if resp.status_code != 200:
            text = (await resp.aread())[:300]
            if resp.status_code >= 500:
                raise RuntimeError(f"probe call answered {resp.status_code}: {text!r}")
            return ProbeResult(False, message=f"the backend rejected kv_transfer_params.prompt_token_ids "
                                              f"({resp.status_code}: {text!r})")
        async for data in resp.aiter_raw():
            reader.feed(data)
    echoed = reader.prompt_token_ids
    if echoed != ids:
        got = "no prompt ids" if echoed is None else f"{len(echoed)} ids" + (
            " (its own render)" if echoed == canonical else "")
        return ProbeResult(False, message=f"the backend did not use the prompt token ids it was sent (sent {len(ids)} "
                                          f"non-canonical ids, echoed {got}); needs vLLM 0.30–0.33 "
                                          "kv_transfer_params.prompt_token_ids on /v1/chat/completions")
    return ProbeResult(True, eot=eot, message="ok")
