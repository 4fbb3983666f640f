"""Hand-made calls for the merge tests: exact token layouts, no files."""

from __future__ import annotations

from polar import records as rec
from polar.processor.normalize import Call, to_call

EOT = 2

_clock = [1_700_000_000.0]


def record(prompt, completion, finish="stop", *, model="m", logprobs=True, session="s", stop_reason=None,
           t=None, cid=None, body=None) -> dict:
    _clock[0] += 1.0
    r = {name: None for name in rec.FIELDS}
    r.update({
        "v": 1, "id": cid or rec.uuid7(), "session": session, "t_start": _clock[0] if t is None else t,
        "protocol": "openai_chat", "model_served": model, "finish_reason": finish, "stop_reason": stop_reason,
        "prompt_token_ids": rec.pack_ids(prompt), "completion_token_ids": rec.pack_ids(completion),
        "completion_logprobs": rec.pack_floats([-0.5] * len(completion)) if completion is not None and logprobs
        else None,
        "upstream_request": body or b'{"messages": [], "tools": []}',
        "assistant": {"content": "x", "reasoning": None, "tool_calls": []},
    })
    return r


def call(*args, **kw) -> Call:
    return to_call(record(*args, **kw), "mem", 0)


def eot_for(_model):
    return frozenset({EOT})
