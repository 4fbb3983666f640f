"""Fixtures for the real-CLI end-to-end tests (marker `e2e`).

`agents` runs a real agent CLI through `scripts/run-agent` against the test gateway (the scripted upstream behind
it), in a fresh HOME and working directory per test. `main_script` queues replies for the main conversation only:
the scripted upstream takes replies in order, but CLIs interleave side calls (Claude's title call, Gemini's router,
Qwen's extra calls), so requests are routed by content — a side call gets the upstream's default reply (valid JSON
for a `response_format` json_schema), a main call the next scripted reply. `processed` runs `polar-process` on the
gateway's flows and returns the session's sequences and calls.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from tests.support.gateway import ROOT

NPM_BIN = os.path.join(os.environ.get("POLAR_NPM_DIR") or os.path.join(ROOT, ".cache", "npm"), "node_modules", ".bin")
BINARIES = {"claude-code": "claude", "codex": "codex", "gemini-cli": "gemini", "qwen-code": "qwen", "pi": "pi"}
RUN_AGENT = os.path.join(ROOT, "scripts", "run-agent")
POLAR_PROCESS = os.path.join(os.path.dirname(sys.executable), "polar-process")
# A command whose output is not in its text: seeing "polar-42" in a tool result proves the CLI really ran it (no
# `$(( ))`: Gemini CLI blocks anything that looks like command substitution).
SHELL_COMMAND = "printf 'polar-%d\\n' 42"
SHELL_OUTPUT = "polar-42"
CLI_TIMEOUT = 180
TOOL_TURNS = 3  # tool calls per multi-turn session, then a final answer: 4 main calls that must merge into one


def tool_turn(name: str, arguments: dict):
    """A model turn that thinks, then calls one tool. The reasoning matters: with the qwen3 reasoning parser on,
    vLLM runs the tool parser only once reasoning has ended, so a first-turn call without it streams as text."""
    from tests.support.scripted_upstream import Reply

    return Reply(reasoning="I will run the command.", tool_calls=[(name, arguments)])


def require_cli(harness: str) -> str:
    """The CLI's path; CI installs every CLI (scripts/setup --clis), so there its absence fails the test."""
    from tests.support.need import CLIS, need

    path = os.path.join(NPM_BIN, BINARIES[harness])
    need(None if os.access(path, os.X_OK) else f"{BINARIES[harness]} is not at {path}", setup=CLIS)
    return path


def tool_names(body: dict) -> frozenset[str]:
    return frozenset((t.get("function") or {}).get("name") for t in body.get("tools") or [])


def script_tool_session(script: "RoutedScript", name: str, arguments: dict, final: str) -> None:
    """TOOL_TURNS turns that call the harness's shell tool, then a final text answer."""
    from tests.support.scripted_upstream import Reply

    script(*[tool_turn(name, arguments) for _ in range(TOOL_TURNS)], Reply(text=final))


def check_tool_session(script: "RoutedScript") -> None:
    """The CLI ran the command each time and sent every result back (the output is not in the command's text)."""
    bodies = script.main_requests()
    assert len(bodies) == TOOL_TURNS + 1, len(bodies)
    for k, body in enumerate(bodies[1:], start=1):
        assert tool_results_text(body).count(SHELL_OUTPUT) == k, (k, tool_results_text(body)[-2000:])


class RoutedScript:
    """Replies for main-conversation requests, in order; side calls get the upstream's default reply.

    The main conversation is the first request with tools and no structured output; later requests belong to it
    when they carry the same tool set. Side calls: structured output (Claude's title call, Gemini's router), no
    tools, or another tool set (Qwen's memory extractor runs a read-only sub-agent with 7 tools)."""

    def __init__(self, upstream):
        self.upstream = upstream
        self.queue: list = []
        self.main_indices: list[int] = []  # indices into upstream.responses
        self.side_indices: list[int] = []
        self.main_tools: frozenset[str] | None = None

    def is_side_call(self, body: dict) -> bool:
        if body.get("response_format") or not body.get("tools"):
            return True
        if self.main_tools is None:
            self.main_tools = tool_names(body)
        return tool_names(body) != self.main_tools

    def __call__(self, *replies) -> None:
        for r in replies:
            r.faults()
        with self.upstream._lock:
            self.queue.extend(replies)

    def next_reply(self, body: dict, prompt_ids: list[int]):
        up = self.upstream
        with up._lock:
            index = len(up.responses)  # the response about to be appended for this request
            if self.is_side_call(body):
                self.side_indices.append(index)
                return up._default_reply(body, prompt_ids), False
            self.main_indices.append(index)
            if self.queue:
                return self.queue.pop(0), True
        return up._default_reply(body, prompt_ids), False

    def main_responses(self):
        return [self.upstream.responses[i] for i in self.main_indices]

    def side_responses(self):
        return [self.upstream.responses[i] for i in self.side_indices]

    def request_body(self, response) -> dict:
        return self.upstream.requests[response.request_index].body

    def main_requests(self):
        return [self.upstream.requests[self.upstream.responses[i].request_index].body for i in self.main_indices]


@pytest.fixture
def main_script(upstream, monkeypatch) -> RoutedScript:
    routed = RoutedScript(upstream)
    # An instance attribute shadows ScriptedUpstream._next_reply for this test only (helper A's file is untouched).
    monkeypatch.setattr(upstream, "_next_reply", routed.next_reply, raising=False)
    return routed


@dataclass
class AgentRun:
    harness: str
    session: str
    returncode: int
    stdout: str
    stderr: str
    cwd: str
    argv: list[str] = field(default_factory=list)

    def explain(self) -> str:
        return (f"{' '.join(self.argv)}\nrc={self.returncode}\n--- stdout\n{self.stdout[-4000:]}\n"
                f"--- stderr\n{self.stderr[-4000:]}")


class Agents:
    def __init__(self, gateway, tmp_path):
        self.gateway = gateway
        self.tmp_path = tmp_path
        self.n = 0

    def run(self, harness: str, prompt: str, *, session: str | None = None, provider: str | None = None,
            model: str | None = None, keep_nonessential: bool = False, timeout: float = CLI_TIMEOUT,
            mint_session: bool = False, connect: str = "proxy", cli_args: tuple[str, ...] = ()) -> AgentRun:
        """One CLI run; `mint_session` leaves the session to run-agent (read back from its stderr line);
        `connect="base-url"`: the CLI's base-URL variable instead of the proxy (run-agent --connect); `cli_args`:
        the CLI's own arguments (run-agent's second `--`)."""
        require_cli(harness)
        self.n += 1
        home = self.tmp_path / f"home{self.n}"
        cwd = self.tmp_path / f"work{self.n}"
        home.mkdir()
        cwd.mkdir()
        session = session or f"e2e-{harness}-{provider or 'default'}-{os.urandom(4).hex()}"
        argv = [sys.executable, RUN_AGENT, harness, *([] if mint_session else ["--session", session]),
                "--proxy", f"http://127.0.0.1:{self.gateway.port}", "--ca", self.gateway.ca_pem, "--cwd", str(cwd)]
        if provider:
            argv += ["--provider", provider]
        if model:
            argv += ["--model", model]
        if keep_nonessential:
            argv += ["--keep-nonessential"]
        if connect != "proxy":
            argv += ["--connect", connect]
        argv += ["--", prompt, *(["--", *cli_args] if cli_args else [])]
        env = {k: v for k, v in os.environ.items()
               if k not in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "CODEX_HOME", "GEMINI_CLI_HOME", "XDG_CONFIG_HOME",
                            "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME", "PI_CODING_AGENT_DIR")}
        env.update({"HOME": str(home), "TERM": "dumb", "NO_COLOR": "1", "CI": "1"})
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL)
        if mint_session:
            minted = [ln.split(":", 1)[1].strip() for ln in proc.stderr.splitlines() if ln.startswith("polar-session:")]
            session = minted[0] if minted else ""
        return AgentRun(harness, session, proc.returncode, proc.stdout, proc.stderr, str(cwd), argv)


@pytest.fixture
def agents(gateway, tmp_path) -> Agents:
    return Agents(gateway, tmp_path)


@dataclass
class Processed:
    sequences: list[dict]  # this session's rows of `sequences`
    calls: list[dict]  # this session's rows of `calls`
    report: dict


def process_session(gateway, session: str, out_dir, extra: list[str] | tuple = ()) -> Processed:
    """polar-process over every flow file of the test gateway; only this session's rows are returned."""
    import polars as pl

    if not os.access(POLAR_PROCESS, os.X_OK):
        pytest.fail("polar-process is not installed in the venv (run scripts/setup)")
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    proc = subprocess.run([POLAR_PROCESS, gateway.flows_dir, "-o", str(out_dir), "--no-progress", "-q", *extra],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"polar-process failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    seqs = pl.read_parquet(os.path.join(out_dir, "sequences.parquet")) if os.path.exists(
        os.path.join(out_dir, "sequences.parquet")) else None
    calls = pl.read_parquet(os.path.join(out_dir, "calls.parquet"))
    with open(os.path.join(out_dir, "report.json")) as fh:
        report = json.load(fh)
    return Processed(
        sequences=seqs.filter(pl.col("session") == session).sort("sequence_id").to_dicts() if seqs is not None else [],
        calls=calls.filter(pl.col("session") == session).sort("t_start").to_dicts(),
        report=report)


def session_records(gateway, session: str, source: str = "proxy_auth") -> list[dict]:
    """This test's records; every one must carry the run's session, attributed by proxy credentials (or by
    `source`: "path" for a base-URL run)."""
    records = gateway.records()
    assert records, "no flow record was written"
    for r in records:
        assert (r["session"], r["session_source"]) == (session, source), \
            f"record {r['id']} {r['path']}: session {r['session']!r} from {r['session_source']!r}"
        assert r["error"] is None, f"record {r['id']} {r['path']}: error {r['error']}"
        assert r["completion_token_ids"] is not None and r["completion_logprobs"] is not None, r["id"]
        assert r["prompt_token_ids"] is not None or r.get("prompt_ref"), r["id"]  # full or compact (docs/records.md)
        assert r["finish_reason"] is not None and r["usage"], r["id"]
    return records


def tool_results_text(body: dict) -> str:
    """All tool-result text the CLI sent back (chat `tool` messages, as the gateway translated them)."""
    out = []
    for m in body.get("messages") or []:
        if m.get("role") == "tool":
            c = m.get("content")
            out.append(c if isinstance(c, str) else json.dumps(c))
    return "\n".join(out)


def _text(content) -> str:
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return content or ""


def explained_mismatches(script: RoutedScript, eos: int | None = None) -> list[int]:
    """Main turns whose re-rendering in the next prompt differs from the sampled ids (the processor's rule 7), each
    checked against the one cause seen with these CLIs: once the prompt holds `</think>` (history with reasoning),
    vLLM's streaming chat skips its reasoning parser (`is_reasoning_end(prompt_token_ids)`), so the model's
    `<think>…</think>` reaches the agent as text, the agent echoes it as text, and the template re-renders that
    content stripped (`</think>\n\n<tool_call>` sampled, `</think>\n<tool_call>` rendered). Returns the turns."""
    up = script.upstream
    eos = up.tokenizer.token_to_id("<|im_end|>") if eos is None else eos
    mains = script.main_responses()
    bodies = script.main_requests()
    out = []
    for j, (a, b) in enumerate(zip(mains, mains[1:])):
        tail = b.prompt_token_ids[len(a.prompt_token_ids):]
        assert b.prompt_token_ids[:len(a.prompt_token_ids)] == a.prompt_token_ids, f"turn {j + 1}: prefix diverged"
        body = a.completion_ids[:-1] if a.completion_ids and a.completion_ids[-1] == eos else a.completion_ids
        if eos in tail and tail[:tail.index(eos)] == body:
            continue
        echoed = [m for m in bodies[j + 1]["messages"] if m.get("role") == "assistant"][-1]
        assert "<think>" in _text(echoed.get("content")) and a.reasoning, \
            f"turn {j}: unexplained mismatch; echoed {echoed}"
        out.append(j)
    return out


def check_merge(processed: Processed, script: RoutedScript, n_records: int) -> dict:
    """The main conversation is one sequence (no break), side calls sit in their own side chains, and the token
    invariants hold against what the upstream really sent. Returns the main sequence."""
    import numpy as np

    seqs = processed.sequences
    assert sum(s["n_calls"] for s in seqs) == n_records == len(processed.calls), \
        f"{len(seqs)} sequences hold {sum(s['n_calls'] for s in seqs)} calls; {n_records} records"
    main = [s for s in seqs if "side_chain" not in s["flags"]]
    side = [s for s in seqs if "side_chain" in s["flags"]]
    mains = script.main_responses()
    assert len(main) == 1, [(s["n_calls"], s["flags"], s["break_cause"]) for s in seqs]
    m = main[0]
    assert m["n_calls"] == len(mains), (m["n_calls"], len(mains), [(s["n_calls"], s["flags"]) for s in seqs])
    assert m["break_cause"] is None, m["break_cause"]
    mismatches = explained_mismatches(script)
    assert ("context_mismatch" in m["flags"]) == bool(mismatches), (m["flags"], mismatches)
    assert set(m["flags"]) <= {"context_mismatch"}, m["flags"]
    assert sum(s["n_calls"] for s in side) == len(script.side_indices)
    breaks = [b for b in processed.report.get("breaks", []) if b.get("session") == m["session"]]
    assert not breaks, breaks
    # Token invariants against the upstream's truth.
    ids = np.asarray(m["input_ids"])
    mask = np.asarray(m["loss_mask"]).astype(bool)
    assert len(ids) == len(mask) == m["n_tokens"]
    first = mains[0].prompt_token_ids
    assert m["prompt_len"] == len(first) and ids[:len(first)].tolist() == first and not mask[:len(first)].any()
    comps = [t for r in mains for t in r.completion_ids]
    assert ids[mask].tolist() == comps and m["n_trainable"] == len(comps)
    assert m["logprobs"] is not None and len(m["logprobs"]) == len(ids)
    lps = np.asarray(m["logprobs"], dtype=np.float32)
    assert np.allclose(lps[mask], np.asarray([x for r in mains for x in r.logprobs], dtype=np.float32))
    assert not lps[~mask].any()
    # The merged sequence covers the whole last prompt (plus what was sampled after it).
    last = mains[-1].prompt_token_ids
    assert len(ids) >= len(last)
    if os.environ.get("POLAR_E2E_MEASURE"):  # merge ratio per session, for the README table
        with open(os.environ["POLAR_E2E_MEASURE"], "a") as fh:
            fh.write(json.dumps({"session": m["session"], "calls": n_records, "sequences": len(seqs),
                                 "main_calls": m["n_calls"], "side_calls": len(script.side_indices),
                                 "mismatched_turns": mismatches,
                                 "tokens": sum(s["n_tokens"] for s in seqs)}) + "\n")
    return m
