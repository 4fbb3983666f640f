"""Record → Call: the calls frame row plus the token arrays the merge needs (docs/merge-rules.md: calls.parquet, rule
1).

Normalizes from each record's `upstream_request`, which is already OpenAI chat (what the model saw), so no
protocol codec is needed. Token arrays are zero-copy numpy views on the record's int32/float32 LE bytes; a prompt
in ASCII ids (docs/records.md) is decoded vectorised, once, into int32.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import msgpack
import numpy as np
import orjson

from polar import records as rec
from polar.processor.load import InputError

_I32 = np.dtype("<i4")
_F32 = np.dtype("<f4")
_I32_MAX = 2**31 - 1


@dataclass(slots=True)
class Call:
    """One model call, as the processor sees it."""

    id: str
    session: str | None
    t_start: float
    model: str | None  # model_served
    finish_reason: str | None
    stop_reason: str | None
    prompt: np.ndarray | None  # int32; None = the backend gave none
    completion: np.ndarray | None
    logprobs: np.ndarray | None  # float32, same length as completion, else None
    prompt_bytes: bytes | None  # the raw prompt bytes: exact equality and prefix tests are memcmp on these
    constrained: bool
    row: dict  # the calls.parquet row (without sequence_id / chain_id)
    messages_json: str | None
    tools_json: str | None
    assistant: dict | None
    protocol: str | None
    n_tools: int = 0  # tools the upstream request offered (rule 9's first tie-break)
    weight_version: str | None = None  # the policy version that served the call (record field, docs/records.md)
    prompt_ascii: bool = False  # the record's prompt was ASCII ids (the gateway's fast path)
    replica: str | None = None  # the backend replica that served the call (record field `replica`; nil before v4)

    @property
    def eligible(self) -> bool:
        """Rule 1: only calls with non-null prompt and completion token ids enter sequences."""
        return self.prompt is not None and self.completion is not None


def ids_view(blob: bytes | msgpack.ExtType | None) -> np.ndarray | None:
    if blob is None:
        return None
    if isinstance(blob, msgpack.ExtType):
        return ascii_ids_array(blob)
    if len(blob) % 4:
        raise ValueError(f"token id field of {len(blob)} bytes is not a whole number of int32 values")
    return np.frombuffer(blob, dtype=_I32)


def ascii_ids_array(ext: msgpack.ExtType) -> np.ndarray:
    """ASCII ids (ExtType records.ASCII_IDS) → int32, by numpy's C parser; ValueError on anything that is not
    digits joined by single commas, or an id past int32 (never a wrong id)."""
    if ext.code != rec.ASCII_IDS:
        raise ValueError(f"token id field is msgpack ExtType {ext.code}, not ASCII ids")
    digits = ext.data
    if not digits:
        return np.empty(0, dtype=_I32)
    if not rec.is_ascii_ids(digits):
        raise ValueError("ASCII token ids hold something other than digits and single commas")
    wide = np.fromstring(digits, dtype=np.int64, sep=",")
    if len(wide) != digits.count(b",") + 1 or int(wide.max()) > _I32_MAX:
        raise ValueError("ASCII token ids could not all be read as int32")
    return wide.astype(_I32)


_COMMA = ord(",")


class AsciiPrompts:
    """Decodes one group's ASCII prompts, each only past the earlier prompt of the group it extends: an agent's
    prompt N+1 starts with prompt N (and its reply), so decoding every prompt whole would parse the shared prefix
    once per turn. The newest earlier prompt whose digits are a prefix of this one's at a comma is reused (a
    memcmp; a prompt that is no prefix differs within its first bytes), and only the rest is parsed."""

    def __init__(self, keep: int = 16):
        self.seen: deque[tuple[bytes, np.ndarray]] = deque(maxlen=keep)

    def decode(self, ext: msgpack.ExtType) -> np.ndarray:
        digits = ext.data
        arr = None
        if ext.code == rec.ASCII_IDS:
            for prev, prev_arr in reversed(self.seen):
                n = len(prev)
                if 0 < n <= len(digits) and (n == len(digits) or digits[n] == _COMMA) and digits.startswith(prev):
                    if n == len(digits):
                        arr = prev_arr
                    else:
                        arr = np.concatenate([prev_arr, ascii_ids_array(msgpack.ExtType(ext.code, digits[n + 1:]))])
                    break
        if arr is None:
            arr = ascii_ids_array(ext)
        # one copy per prompt: the int32 bytes the merge compares (Call.prompt_bytes), the array a view on them
        if not isinstance(arr.base, bytes):
            arr = np.frombuffer(arr.tobytes(), "<i4")
        self.seen.append((digits, arr))
        return arr


def floats_view(blob: bytes | None) -> np.ndarray | None:
    if blob is None or len(blob) % 4:
        return None
    return np.frombuffer(blob, dtype=_F32)


def _constrained(r: dict, body: dict) -> bool:
    """The record's `constrained` when the gateway wrote it; older records lack it, and the gateway's own rule
    (`record.is_constrained`) is applied to what it sent upstream."""
    written = r.get("constrained")
    return written if isinstance(written, bool) else rec.is_constrained(body)


def _int_or_none(x: object) -> int | None:
    return int(x) if isinstance(x, int) and not isinstance(x, bool) else None


def _str_or_none(x: object) -> str | None:
    return x if isinstance(x, str) else None


def _float_or_none(x: object) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _trainer_columns(r: dict, body: dict) -> dict:
    """The calls columns a trainer needs to judge a call's logprobs: the sampling values sent to the backend (the
    record's `sampling` map is exactly what was sent; records without it fall back to the upstream body itself),
    the logprobs mode the record reports for the backend, and the policy version that served the call. Unknown →
    null, never a default: a trainer must not assume T=1 for a call whose temperature nobody recorded."""
    sampling = r.get("sampling") if isinstance(r.get("sampling"), dict) else {}
    backend = r.get("backend") if isinstance(r.get("backend"), dict) else {}

    def sent(name: str) -> object:
        return sampling[name] if sampling.get(name) is not None else body.get(name)

    return {
        "temperature": _float_or_none(sent("temperature")),
        "top_p": _float_or_none(sent("top_p")),
        "top_k": _int_or_none(sent("top_k")),
        "logprobs_mode": _str_or_none(sampling.get("logprobs_mode")) or _str_or_none(backend.get("logprobs_mode")),
        "weight_version": _str_or_none(r.get("weight_version")),
        # logprobs after a grammar mask: a trainer leaves these calls' tokens out of ratios and checks
        "constrained": _constrained(r, body),
    }


def to_call(r: dict, source_file: str, source_offset: int, ascii_prompts: AsciiPrompts | None = None) -> Call:
    """Build a Call from one normalized record. Never raises on odd field values: they become nulls.
    `ascii_prompts`: the group's decoder of ASCII prompts (decodes only what earlier prompts did not cover)."""
    body: dict = {}
    raw = r.get("upstream_request")
    if isinstance(raw, (bytes, str)) and raw:
        try:
            parsed = orjson.loads(raw)
            body = parsed if isinstance(parsed, dict) else {}
        except orjson.JSONDecodeError:
            body = {}
    messages = body.get("messages")
    tools = body.get("tools")
    messages_json = orjson.dumps(messages).decode() if messages is not None else None
    tools_json = orjson.dumps(tools if tools is not None else []).decode() if body else None
    assistant = r.get("assistant") if isinstance(r.get("assistant"), dict) else None
    prompt_v = r.get("prompt_token_ids")
    prompt_v = prompt_v if isinstance(prompt_v, (bytes, msgpack.ExtType)) else None
    comp_b = r.get("completion_token_ids") if isinstance(r.get("completion_token_ids"), bytes) else None
    try:
        prompt = (ascii_prompts.decode(prompt_v) if ascii_prompts is not None and isinstance(prompt_v, msgpack.ExtType)
                  else ids_view(prompt_v))
        completion = ids_view(comp_b)
    except ValueError as exc:
        raise InputError(f"{source_file} offset {source_offset}: {exc}") from exc
    if isinstance(prompt_v, bytes) or prompt is None:
        prompt_b = prompt_v
    elif isinstance(prompt.base, bytes) and len(prompt.base) == prompt.nbytes:  # AsciiPrompts' array: on its bytes
        prompt_b = prompt.base
    else:  # decoded ASCII ids: keep one copy, the bytes the merge compares, and view the array on them
        prompt_b = prompt.tobytes()
        prompt = np.frombuffer(prompt_b, "<i4")
    logprobs = floats_view(r.get("completion_logprobs") if isinstance(r.get("completion_logprobs"), bytes) else None)
    if logprobs is not None and (completion is None or len(logprobs) != len(completion)):
        logprobs = None  # one logprob per generated token, or none at all
    usage = r.get("usage") if isinstance(r.get("usage"), dict) else {}
    tool_calls = assistant.get("tool_calls") if assistant else None
    error = r.get("error")
    row = {
        "call_id": str(r.get("id")),
        "session": _str_or_none(r.get("session")),
        "session_source": _str_or_none(r.get("session_source")),
        "conn_id": _str_or_none(r.get("conn_id")),
        "protocol": _str_or_none(r.get("protocol")),
        "host": _str_or_none(r.get("host")),
        "path": _str_or_none(r.get("path")),
        "model_requested": _str_or_none(r.get("model_requested")),
        "model_served": _str_or_none(r.get("model_served")),
        "stream": r.get("stream") if isinstance(r.get("stream"), bool) else None,
        "t_start": _float_or_none(r.get("t_start")),
        "t_first_byte": _float_or_none(r.get("t_first_byte")),
        "t_end": _float_or_none(r.get("t_end")),
        "prompt_tokens": len(prompt) if prompt is not None else _int_or_none(usage.get("prompt_tokens")),
        "completion_tokens": len(completion) if completion is not None
        else _int_or_none(usage.get("completion_tokens")),
        "n_tool_calls": len(tool_calls) if isinstance(tool_calls, list) else (0 if assistant else None),
        "finish_reason": _str_or_none(r.get("finish_reason")),
        "stop_reason": None if r.get("stop_reason") is None else str(r.get("stop_reason")),
        "error": orjson.dumps(error, default=str).decode() if error is not None else None,
        **_trainer_columns(r, body),
        "replica": _str_or_none(r.get("replica")),
        "template_hash": _str_or_none(r.get("template_hash")),
        "messages": messages_json,
        "tools": tools_json,
        "assistant": orjson.dumps(assistant, default=str).decode() if assistant is not None else None,
        "source_file": source_file,
        "source_offset": source_offset,
    }
    return Call(
        id=row["call_id"], session=row["session"], t_start=row["t_start"] if row["t_start"] is not None else 0.0,
        model=row["model_served"], finish_reason=row["finish_reason"], stop_reason=row["stop_reason"],
        prompt=prompt, completion=completion, logprobs=logprobs, prompt_bytes=prompt_b,
        constrained=row["constrained"], row=row, messages_json=messages_json, tools_json=tools_json,
        assistant=assistant, protocol=row["protocol"], n_tools=len(tools) if isinstance(tools, list) else 0,
        weight_version=row["weight_version"], prompt_ascii=isinstance(prompt_v, msgpack.ExtType),
        replica=row["replica"],
    )
