"""The preflight, before any sample: a canary call through the proxy (the backend returns token ids and logprobs),
then a canary sample (the sandbox starts, the agent trusts the proxy's CA and reaches it). Sessions
<run-id>/preflight/0 and /1; a refusal is a UsageError naming what failed."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import ssl
import time
from pathlib import Path
from urllib.parse import quote

from polar import records as rec
from polar.rollout import clis as agentlib
from polar.rollout.common import CANCEL, PREFLIGHT, UsageError, now, tail
from polar.rollout.flowwatch import FlowCounter
from polar.rollout.job import SampleContext, SampleJob
from polar.rollout.proxyctl import Proxy, probe_ready
from polar.rollout.reporter import Reporter
from polar.rollout.sample import run_sample

CANARY_HOST = "api.openai.com"


def canary_call(p: Proxy, session: str) -> None:
    """One call through the proxy on its own: the backend answers it, with token ids and their logprobs."""
    body = json.dumps({"model": "polar-preflight", "messages": [{"role": "user", "content": "Say ok."}],
                       "max_tokens": 8, "stream": False}).encode()
    ctx = ssl.create_default_context(cafile=p.ca_pem)
    auth = base64.b64encode(f"{quote(session, safe='')}:x".encode()).decode()
    conn = http.client.HTTPSConnection("127.0.0.1", p.port, timeout=120, context=ctx)
    t0 = now()
    try:
        conn.set_tunnel(CANARY_HOST, 443, headers={"Proxy-Authorization": f"Basic {auth}"})
        conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json",
                                                            "authorization": f"Bearer {agentlib.DUMMY_KEY}"})
        resp = conn.getresponse()
        answer = resp.read()
    except (OSError, http.client.HTTPException) as exc:
        raise UsageError(f"preflight: the canary call through the proxy on port {p.port} failed ({exc})") from None
    finally:
        conn.close()
    if resp.status != 200:
        msg = answer.decode("utf-8", "replace")
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            msg = json.loads(answer)["error"]["message"]
        raise UsageError(f"preflight: the canary call was answered {resp.status} ({msg[:300]}); is the backend "
                         f"at {p.info.get('upstream')} up?")
    records = FlowCounter(Path(p.flows)).records(session, since=t0 - 5)
    if not records:
        raise UsageError(f"preflight: the canary call left no record in {p.flows} (session {session})")
    r = records[-1]
    ids = rec.token_ids(r, "completion_token_ids")
    lps = rec.unpack_floats(r.get("completion_logprobs"))
    prompt = r.get("prompt_token_ids") or r.get("prompt_tail_ids")
    if not ids or not rec.is_ids(prompt):  # either encoding
        raise UsageError(f"preflight: the backend at {p.info.get('upstream')} returned no token ids (canary "
                         f"record {r.get('id')}); RL needs them: use vLLM ≥ 0.10 or SGLang, and check "
                         f"polar_backend")
    if not lps or len(lps) != len(ids):
        raise UsageError(f"preflight: the backend at {p.info.get('upstream')} returned no logprobs for the "
                         f"sampled tokens (canary record {r.get('id')}); RL needs them")


def canary_sample(ctx: SampleContext, task, run_dir: Path) -> None:
    """A one-turn sample of the agent in its sandbox (no verifier, no results line): it makes a call with token ids."""
    result = run_sample(ctx, SampleJob(task, 0, 0, canary=True))
    session = result.session
    if CANCEL.is_set():
        raise KeyboardInterrupt
    if result.status in ("completed", "agent_error"):
        return
    sdir = run_dir / PREFLIGHT / "sample"
    err = tail(sdir / "agent.stderr", 300)
    if result.status == "infra_error" and (result.error or "").startswith("sandbox:"):
        raise UsageError(f"preflight: the {ctx.sandbox} sandbox did not start ({result.error[9:]})")
    info = probe_ready(ctx.proxy_port) or {}
    failures = (info.get("tls_failures") or {}).get(session)
    if failures:
        raise UsageError(f"preflight: the agent ({ctx.agent.text}) does not trust the proxy's CA: {failures} "
                         f"TLS handshake(s) of session {session} failed (agent.stderr: {err!r})")
    if result.status == "agent_timeout":
        raise UsageError(f"preflight: the canary sample timed out (session {session}; {sdir})")
    raise UsageError(f"preflight: the agent ({ctx.agent.text}) made no call with token ids through the proxy in "
                     f"its canary sample (session {session}, exit {result.agent_exit}; {result.error}; "
                     f"agent.stderr: {err!r})")


def run_preflight(proxy: Proxy, ctx: SampleContext, task, run_dir: Path, report: Reporter) -> dict:
    """The canary call, then the canary sample on `task`; run.json's `preflight` once both passed."""
    t0 = time.monotonic()
    canary_call(proxy, f"{ctx.run_id}/{PREFLIGHT}/0")
    canary_sample(ctx, task, run_dir)
    report.note(f"preflight passed ({time.monotonic() - t0:.1f} s): the backend returns token ids and logprobs, the "
                f"{ctx.sandbox} sandbox starts, the agent reaches the proxy")
    return {"passed": True, "t": now(), "seconds": round(time.monotonic() - t0, 2)}
