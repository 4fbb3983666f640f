"""Synthetic agent sessions written as real flow files (FlowWriter), for the processor's tests.

A toy append-only chat template: every message renders as [ROLE] + content ids + [EOT], and a prompt ends with the
generation prompt [ASSISTANT]. A turn's completion is its content ids + [EOT] when it stops naturally, or content
ids alone when truncated (finish `length`) or aborted. So the next prompt's tail after the previous prompt is the
template's copy of the sampled turn, its EOT, the interstitial (tool result) and the generation prompt.

Scenarios are scripted as op lists, so hypothesis can draw and shrink them:
  turn        the main agent samples a turn (stop / tool_calls)
  trunc       a turn cut at max_tokens (finish length, no EOT)
  abort       a turn without EOT and finish stop (a stop string)
  retry       the same prompt is sent again (resample): the earlier call is superseded
  side        a sub-agent call with its own system prompt, interleaved
  compact     the harness rewrites history after the first prompt (compaction): a prefix_diverged break
  drift       the next prompt re-renders the previous turn differently: context_mismatch
  nolp        the turn's logprobs are missing
  error       a call that failed before any token (no ids): in calls.parquet only
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import orjson

from polar import records as rec

EOT = 2
SYSTEM, USER, ASSISTANT, TOOL = 3, 4, 5, 6
OPS = ("turn", "trunc", "abort", "retry", "side", "compact", "drift", "nolp", "error")


def _content(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 500) for _ in range(n)]


@dataclass
class Convo:
    """One conversation's rendered token history and its OpenAI messages."""

    tokens: list[int]
    messages: list[dict]
    first_len: int = 0
    keep: tuple[int, int] | None = None  # history a compaction keeps: through the first turn

    def add(self, role_tok: int, role: str, content: list[int], **extra) -> None:
        self.tokens += [role_tok, *content, EOT]
        self.messages.append({"role": role, "content": " ".join(map(str, content)), **extra})

    def prompt(self) -> list[int]:
        return [*self.tokens, ASSISTANT]


@dataclass
class SessionScript:
    """Generates the records of one session."""

    session: str | None
    rng: random.Random
    model: str = "toy-model"
    t: float = 1_700_000_000.0
    records: list[dict] = field(default_factory=list)
    sys_len: int = 6

    def __post_init__(self):
        self.main = self._new_convo(system=_content(self.rng, self.sys_len))
        self.pending_drift = False

    def _new_convo(self, system: list[int]) -> Convo:
        c = Convo([], [])
        c.add(SYSTEM, "system", system)
        c.add(USER, "user", _content(self.rng, self.rng.randrange(2, 6)))
        c.first_len = len(c.prompt())
        return c

    def _record(self, convo: Convo, completion: list[int] | None, finish: str | None, *, logprobs: bool = True,
                error: dict | None = None, tool_calls: list | None = None) -> dict:
        self.t += self.rng.choice((0.5, 1.0, 1.5))
        prompt = convo.prompt() if error is None else None
        body = {"model": self.model, "messages": convo.messages, "stream": True,
                "tools": [{"type": "function", "function": {"name": "sh", "parameters": {"type": "object"}}}]}
        r = {name: None for name in rec.FIELDS}
        r.update({
            "v": 1, "id": rec.uuid7(), "session": self.session,
            "session_source": "proxy_auth" if self.session else "none", "conn_id": f"c{self.rng.randrange(9)}",
            "protocol": self.rng.choice(rec.PROTOCOLS), "host": "api.example.com", "path": "/v1/x", "stream": True,
            "t_start": self.t, "t_first_byte": self.t + 0.1, "t_end": self.t + 0.2, "request": b"{}",
            "request_headers": [["authorization", rec.REDACTED]], "upstream_request": orjson.dumps(body),
            "model_requested": self.model, "model_served": self.model,
            "prompt_token_ids": rec.pack_ids(prompt), "completion_token_ids": rec.pack_ids(completion),
            "completion_logprobs": rec.pack_floats([-0.01 * (i + 1) for i in range(len(completion))])
            if completion is not None and logprobs else None,
            "finish_reason": finish, "usage": {"prompt_tokens": len(prompt or []),
                                               "completion_tokens": len(completion or [])},
            "provider_status": 200 if error is None else 529,
            "assistant": {"content": " ".join(map(str, completion or [])), "reasoning": None,
                          "tool_calls": tool_calls or []} if completion is not None else None,
            "sampling": {"temperature": 1.0}, "backend": {"kind": "vllm", "version": "0.11"},
            "normalizations": [], "error": error,
        })
        self.records.append(r)
        return r

    def turn(self, kind: str = "turn", convo: Convo | None = None) -> None:
        convo = convo or self.main
        content = _content(self.rng, self.rng.randrange(1, 6))
        if kind == "trunc":
            completion, finish = content, "length"
        elif kind == "abort":
            completion, finish = content, "stop"
        else:
            completion, finish = [*content, EOT], self.rng.choice(("stop", "tool_calls"))
        calls = [{"id": "t1", "type": "function", "function": {"name": "sh", "arguments": {"cmd": "ls"}}}]
        rec_ = self._record(convo, completion, finish, logprobs=kind != "nolp",
                            tool_calls=calls if finish == "tool_calls" else None)
        if kind == "abort":
            rec_["stop_reason"] = "</stop>"
        rendered = content
        if self.pending_drift and convo is self.main:
            rendered = [*content[:-1], content[-1] + 1]  # the template re-renders the turn differently
            self.pending_drift = False
        convo.add(ASSISTANT, "assistant", rendered)
        convo.add(TOOL, "tool", _content(self.rng, self.rng.randrange(1, 5)), tool_call_id="t1")
        if convo.keep is None:
            convo.keep = (len(convo.tokens), len(convo.messages))

    def run(self, ops: list[str]) -> list[dict]:
        side: Convo | None = None
        for op in ops:
            if op in ("turn", "trunc", "abort", "nolp"):
                self.turn(op)
            elif op == "retry":
                # The same prompt again: the previous call's answer is discarded by the harness.
                last = self.main.prompt()
                self._record(self.main, [*_content(self.rng, 2), EOT], "stop")
                assert self.main.prompt() == last
                self.turn("turn")
            elif op == "side":
                side = side or self._new_convo(system=_content(self.rng, self.sys_len + 1))
                self.turn("turn", side)
            elif op == "compact":
                # Keep the first exchange, replace everything after it with a summary.
                keep = self.main.keep or (self.main.first_len - 1, 2)
                self.main.tokens = self.main.tokens[:keep[0]]
                self.main.messages = self.main.messages[:keep[1]]
                self.main.add(USER, "user", [499, *_content(self.rng, 3)])
                self.turn("turn")
            elif op == "drift":
                self.pending_drift = True
            elif op == "error":
                self._record(self.main, None, None, error={"stage": "backend_connect", "status": 529,
                                                           "type": "overloaded_error", "message": "down"})
        return self.records


def write_flows(directory: str, records: list[dict], per_file: int = 0) -> list[str]:
    """Write records with the real FlowWriter; per_file > 0 rotates after that many records."""
    writer = rec.FlowWriter(directory, min_free_mb=0)
    paths = []
    for i, r in enumerate(records):
        paths.append(writer.write(r))
        if per_file and (i + 1) % per_file == 0:
            writer.close()
    writer.close()
    return sorted({p[: -len(".open")] if p.endswith(".open") else p for p in paths})


def session_records(session: str | None, ops: list[str], seed: int = 0, t0: float = 1_700_000_000.0) -> list[dict]:
    return SessionScript(session, random.Random(seed), t=t0).run(ops)
