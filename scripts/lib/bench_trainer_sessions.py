"""scripts/bench_trainer's sessions and accounting: agent sessions of the real CLIs' shapes, written as real flow
records, processed by the real polar-process in both modes, and counted the way a trainer pays for them.

Shapes. The first prompts are the captured CLI request bodies' sizes (../shared/captures, tool task, turn 1: the JSON
body counted with the SmolLM2 tokenizer; only these numbers are kept, none of the text). The captures hold two
turns of a one-line task, so the turn count (10–40) and the growth per turn (a reply of 30–300 tokens, a tool
result of 50–1,000) are assumptions in the range of real agent work; the captures' own turn-2 growth is 130–350.
A session is one main conversation and, now and then, a sub-agent with its own shorter system prompt (a side
chain: its own sequence in prefix_merging).

Tokens follow the toy append-only template of tests/processor/synth.py: a message renders as [ROLE] + content +
[EOT], a prompt ends with [ASSISTANT], a reply is content + [EOT]; so every prompt extends the previous call's
prompt + completion, as in exact mode. Ids stay below the tiny model's vocabulary (3,072) so the same builder feeds
the gradient check. No retries and no re-rendered turns: both modes must then train exactly the same tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

EOT, SYSTEM, USER, ASSISTANT, TOOL = 2, 3, 4, 5, 6
VOCAB = 3072  # the tiny model's (.cache/models/tiny)

# Tool task, turn 1, request body tokens (SmolLM2 tokenizer); turn 2 grew by 129 / 344 / 354 / 172 / 178.
CAPTURED_FIRST_PROMPTS = {"claude-code": 12807, "codex (gpt-5.2-codex)": 10711, "codex (default model)": 19689,
                          "gemini-cli": 9110, "qwen-code": 19015}
MODES = ("per_request", "prefix_merging")
POLAR = {"per_request": 1185, "prefix_merging": 218, "minutes": (189, 35)}  # arXiv 2605.24220's headline


@dataclass(frozen=True)
class Shape:
    """How sessions are drawn. Ranges are inclusive."""

    first_prompts: tuple[int, ...]  # cycled over sessions
    turns: tuple[int, int]
    reply: tuple[int, int]
    tool_result: tuple[int, int]
    sub_agent_share: float = 0.25  # sessions that also run a sub-agent
    sub_prompt: tuple[int, int] = (1500, 3000)
    sub_turns: tuple[int, int] = (2, 6)
    compact_every: int = 0  # > 0: the harness compacts the history every N main turns (a prefix break)


# The real captures' shapes (accounting) and the same scaled down to what the tiny model trains in minutes.
REAL = Shape(tuple(CAPTURED_FIRST_PROMPTS.values()), (10, 40), (30, 300), (50, 1000))
SMALL = Shape((1000, 1250, 1500, 1750, 2000), (10, 10), (20, 120), (20, 250), sub_prompt=(300, 600), sub_turns=(2, 3))


def scaled(shape: Shape, **changes) -> Shape:
    return replace(shape, **changes)


# ---------------------------------------------------------------------------------------------------- sessions

@dataclass
class Call:
    """One model call: its prompt and completion ids, and the conversation (0 = main, 1 = sub-agent) it belongs to."""

    convo: int
    prompt: np.ndarray
    completion: np.ndarray
    finish: str
    logprobs: np.ndarray | None = None


class Conversation:
    """A rendered history that only grows (the template's copy of every reply equals the sampled ids)."""

    def __init__(self, rng: np.random.Generator, system: int):
        self.rng = rng
        self.tokens = [SYSTEM, *self._ids(system), EOT, USER, *self._ids(int(rng.integers(20, 200))), EOT]
        self.first = len(self.tokens)

    def compact(self) -> None:
        """Everything after the first user message replaced by a summary: the next prompt no longer extends the
        previous call's, so prefix_merging starts a new chain (prefix_diverged), as compaction does."""
        self.tokens = [*self.tokens[:self.first], USER, *self._ids(int(self.rng.integers(200, 600))), EOT]

    def _ids(self, n: int) -> list[int]:
        return self.rng.integers(10, VOCAB, size=n).tolist()

    def sample(self, convo: int, reply: tuple[int, int], tool: tuple[int, int], last: bool) -> Call:
        prompt = np.asarray([*self.tokens, ASSISTANT], np.int32)
        completion = np.asarray([*self._ids(int(self.rng.integers(reply[0], reply[1] + 1))), EOT], np.int32)
        result = self._ids(int(self.rng.integers(tool[0], tool[1] + 1)))
        self.tokens += [ASSISTANT, *completion.tolist(), TOOL, *result, EOT]
        return Call(convo, prompt, completion, "stop" if last else "tool_calls")


def session_calls(rng: np.random.Generator, shape: Shape, first_prompt: int) -> list[Call]:
    """One session's calls in time order: the main conversation's turns, a sub-agent's run after one of them."""
    main = Conversation(rng, first_prompt)
    turns = int(rng.integers(shape.turns[0], shape.turns[1] + 1))
    sub_after = int(rng.integers(0, turns)) if rng.random() < shape.sub_agent_share else -1
    calls = []
    for k in range(turns):
        if shape.compact_every and k and k % shape.compact_every == 0:
            main.compact()
        calls.append(main.sample(0, shape.reply, shape.tool_result, last=k == turns - 1))
        if k == sub_after:
            sub = Conversation(rng, int(rng.integers(shape.sub_prompt[0], shape.sub_prompt[1] + 1)))
            n = int(rng.integers(shape.sub_turns[0], shape.sub_turns[1] + 1))
            calls += [sub.sample(1, shape.reply, shape.tool_result, last=j == n - 1) for j in range(n)]
    return calls


def make_sessions(shape: Shape, sessions: int, seed: int) -> dict[str, list[Call]]:
    rng = np.random.default_rng(seed)
    return {f"bench-g{s // 4}-{s % 4}": session_calls(rng, shape, shape.first_prompts[s % len(shape.first_prompts)])
            for s in range(sessions)}


def random_logprobs(sessions: dict[str, list[Call]], seed: int) -> None:
    """Sampler-like logprobs (−1…0) where no model computes them (the accounting needs none)."""
    rng = np.random.default_rng(seed)
    for calls in sessions.values():
        for c in calls:
            c.logprobs = -rng.random(len(c.completion), dtype=np.float32)


# ---------------------------------------------------------------------------------------------------- files

def _record(rec, session: str, call: Call, t: float) -> dict:
    """A flow record as the gateway writes it for a vLLM backend (full prompt ids; a small body: the merge reads
    ids only, the body gives calls.parquet its messages)."""
    body = {"model": "bench", "stream": True, "messages": [{"role": "system", "content": f"{len(call.prompt)} ids"}]}
    return rec.new_record(
        id=rec.uuid7(), session=session, session_source="proxy_auth", conn_id=f"c{call.convo}",
        protocol="openai_chat", host="api.example.com", path="/v1/chat/completions", stream=True,
        t_start=t, t_first_byte=t + 0.1, t_end=t + 0.5, request=b"{}", request_headers=[],
        upstream_request=json.dumps(body).encode(), model_requested="bench", model_served="bench",
        prompt_token_ids=call.prompt.astype("<i4").tobytes(),
        completion_token_ids=call.completion.astype("<i4").tobytes(),
        completion_logprobs=call.logprobs.astype("<f4").tobytes(), finish_reason=call.finish,
        usage={"prompt_tokens": len(call.prompt), "completion_tokens": len(call.completion)}, provider_status=200,
        assistant={"content": "", "reasoning": None, "tool_calls": []},
        sampling={"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs_mode": "raw_logprobs"},
        backend={"kind": "vllm", "version": "0.32.0"}, constrained=False)


def write_run(sessions: dict[str, list[Call]], flows: str, rewards: str) -> None:
    """The sessions as flow files (the real FlowWriter) and rewards.jsonl: rewards 0, 1, 2, 0 … within each group
    of 4, so every group's advantages are non-zero."""
    from polar import records as rec

    os.makedirs(flows, exist_ok=True)
    writer = rec.FlowWriter(flows, rotate_mb=256, min_free_mb=0)
    t = 1_700_000_000.0
    try:
        for name, calls in sessions.items():
            for c in calls:
                t += 1.0
                writer.write(_record(rec, name, c, t))
    finally:
        writer.close()
    with open(rewards, "w") as fh:
        for i, name in enumerate(sessions):
            fh.write(json.dumps({"session": name, "reward": float(i % 3), "group": name.rsplit("-", 1)[0]}) + "\n")


def polar_process(bin_dir: str, flows: str, rewards: str, out: str, mode: str) -> str:
    """OUT/batches of the real polar-process in `mode`; RuntimeError with its stderr on failure."""
    cmd = [os.path.join(bin_dir, "polar-process"), flows, "-o", out, "--mode", mode, "--rewards", rewards,
           "--eot-token-id", str(EOT), "--report-no-text", "-q"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"polar-process --mode {mode} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return os.path.join(out, "batches")


# ---------------------------------------------------------------------------------------------------- accounting

def count(batches_dir: str, budget: int, group_indices: Callable) -> dict:
    """What a trainer pays for one mode's batches: sequences, forward tokens, trainable tokens, Σ L² (attention on
    CPU, no varlen kernel), micro-batches at `budget` in both loader layouts, and per_sequence's padded cost.
    `group_indices` is polar.trainer.loader.group_indices (the loader's own grouping)."""
    import polars as pl

    df = pl.read_parquet(os.path.join(batches_dir, "*.parquet"), columns=["n_tokens", "n_trainable"])
    lengths = df["n_tokens"].to_list()
    sq = np.asarray(lengths, np.float64) ** 2
    padded = padded_sq = 0.0
    per_sequence = group_indices(lengths, budget, "per_sequence")
    for g in per_sequence:  # right-padded to the group's longest row (sorted longest first)
        longest = lengths[g[0]]
        padded += len(g) * longest
        padded_sq += len(g) * float(longest) ** 2
    return {"sequences": len(lengths), "forward_tokens": int(sum(lengths)),
            "trainable_tokens": int(df["n_trainable"].sum()), "sum_l2": float(sq.sum()),
            "longest": int(max(lengths, default=0)), "micro_batches_per_sequence": len(per_sequence),
            "micro_batches_packed": len(group_indices(lengths, budget, "packed")),
            "padded_tokens": int(padded), "padded_sum_l2": padded_sq,
            "padding_waste": 1 - sum(lengths) / padded if padded else 0.0}


def accounting(sessions: dict[str, list[Call]], work: str, bin_dir: str, budget: int,
               group_indices: Callable) -> dict:
    """Both modes over the same flow files: {"per_request": counts, "prefix_merging": counts, "dirs": …}."""
    flows, rewards = os.path.join(work, "flows"), os.path.join(work, "rewards.jsonl")
    write_run(sessions, flows, rewards)
    out = {"dirs": {}}
    for mode in MODES:
        batches = polar_process(bin_dir, flows, rewards, os.path.join(work, mode), mode)
        out["dirs"][mode] = batches
        out[mode] = count(batches, budget, group_indices)
    out["shape"] = describe(sessions)
    return out


def describe(sessions: dict[str, list[Call]]) -> dict:
    main = [[c for c in calls if c.convo == 0] for calls in sessions.values()]
    return {"sessions": len(sessions), "calls": sum(len(c) for c in sessions.values()),
            "first_prompt_mean": float(np.mean([m[0].prompt.size for m in main])),
            "turns": (min(len(m) for m in main), max(len(m) for m in main)),
            "turns_mean": float(np.mean([len(m) for m in main])),
            "last_prompt_mean": float(np.mean([m[-1].prompt.size for m in main])),
            "sub_agents": sum(any(c.convo == 1 for c in calls) for calls in sessions.values())}


def ratios(acc: dict) -> dict:
    """per_request ÷ prefix_merging for every count (the baseline is per_request, measured in the same run)."""
    a, b = acc["per_request"], acc["prefix_merging"]
    return {k: (a[k] / b[k] if b[k] else float("inf")) for k in a if isinstance(a[k], (int, float))}
