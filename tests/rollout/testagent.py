"""The python: agent the runner's tests run (`--agent python:testagent:run`), copied into each test task's agent/.

Its behaviour is the instruction's first line, `mode: NAME`; every mode but `no-call` first asks the model once
through the proxy with the official openai SDK (HTTPS_PROXY and SSL_CERT_FILE come from the runner/sandbox):
  solve-k01         writes the right answer in samples k = 0, 1 (POLAR_SAMPLE) and a wrong one in k = 2, 3
  solve             the right answer
  fail-after-call   the right answer, then exit 3 (agent_error: verified and rewarded)
  raise-after-call  raises (exit 1, the traceback in agent.stderr)
  hang-after-call   sleeps past any agent timeout (agent_timeout: its one call is a partial trace)
  slow              sleeps (k + 1) × POLAR_TEST_SLOW seconds (default 1.5) after the call, then the right answer
  no-call           the right answer without calling the model (infra_error: no call with token ids)
  stream-gated      writes pids.json (its pid) in the workdir, then streams its one answer (the test holds that
                    stream mid-answer past the agent's timeout), then the right answer
  leave-behind      prints what it finds of earlier samples (processes named polar-leftover, files in /tmp), whether
                    openai was imported before it asked (a warm slot's zygote preloads it), then leaves a detached
                    polar-leftover process and a /tmp file behind, calls, and writes the right answer
  hang-k0           leave-behind, except that k = 0 sleeps past any agent timeout after its call
  spawn-hang        with POLAR_TEST_HANG=1: starts a child and a detached one (in a session of its own), writes
                    pids.json (its pid, theirs, its POLAR_SANDBOX_DIR) in the workdir and sleeps; else the right
                    answer
  base-url          (--connect base-url) prints what it was given (the base URL, any proxy variable), asks once by
                    its base URL, then posts a chat request under the other sample's session (/s/<its session>/ in
                    the path) and prints the status and body it got; then the right answer
Any other instruction (the preflight's canary) is one call and exit 0; with POLAR_TEST_DISTRUST=1 that call trusts
only certifi's CAs (an agent that does not trust the proxy's CA: its TLS handshake fails).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

POLAR_PRELOAD = ("openai",)  # what a warm slot's zygote imports once (rollout/sandbox/warm.py)


def _stat(pid: int) -> list[str]:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _parent_of(pid: int) -> int:
    return int(_stat(pid)[1])


def _start_of(pid: int) -> int:
    """The process's start time in clock ticks since boot: the same number for the same process."""
    return int(_stat(pid)[19])


def ask(distrust: bool = False) -> str:
    import openai

    http_client = None
    if distrust:
        import certifi

        http_client = openai.DefaultHttpxClient(verify=certifi.where())
    client = openai.OpenAI(api_key="sk-polar-dummy", max_retries=0, timeout=60, http_client=http_client)
    reply = client.chat.completions.create(model="polar-test", max_tokens=16,
                                           messages=[{"role": "user", "content": "What is six times seven?"}])
    return reply.choices[0].message.content or ""


def ask_streaming() -> str:
    import openai

    client = openai.OpenAI(api_key="sk-polar-dummy", max_retries=0, timeout=600)
    parts = []
    for event in client.chat.completions.create(model="polar-test", max_tokens=256, stream=True,
                                                messages=[{"role": "user", "content": "What is six times seven?"}]):
        if event.choices and event.choices[0].delta.content:
            parts.append(event.choices[0].delta.content)
    return "".join(parts)


def run(instruction: str, workdir: str, env: dict) -> int | None:
    first = instruction.strip().splitlines()[0] if instruction.strip() else ""
    mode = first.split(":", 1)[1].strip() if first.startswith("mode:") else "canary"
    app = pathlib.Path(workdir)
    k = int(env.get("POLAR_SAMPLE", "0"))
    if mode == "no-call":
        (app / "answer.txt").write_text("42\n")
        return 0
    if mode == "stream-gated":
        (app / "pids.json").write_text(json.dumps({"agent": os.getpid()}))
        ask_streaming()
        (app / "answer.txt").write_text("42\n")
        return 0
    if mode in ("leave-behind", "hang-k0"):
        seen = {"preloaded": "openai" in sys.modules, "tmp": sorted(os.listdir("/tmp")), "leftovers": [],
                "grandparent_start": _start_of(_parent_of(os.getppid()))}
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                if b"polar-leftover" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes():
                    seen["leftovers"].append(int(pid))
            except OSError:
                continue
        print(json.dumps(seen), flush=True)
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "polar-leftover"],
                         start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        pathlib.Path(f"/tmp/polar-leftover-{k}").write_text("left\n")
        ask()
        if mode == "hang-k0" and k == 0:
            time.sleep(600)
        (app / "answer.txt").write_text("42\n")
        return 0
    if mode == "base-url":
        import urllib.error
        import urllib.request
        from urllib.parse import quote

        base = os.environ.get("OPENAI_BASE_URL", "")
        seen = {"base_url": base, "proxies": sorted(v for v in os.environ if v.lower().endswith("_proxy")
                                                     and os.environ[v] and v.lower() != "no_proxy")}
        ask()
        other = env["POLAR_SESSION"].rsplit("/", 2)
        other = f"{other[0]}/{1 - k}/{other[2]}"
        address = base.split("/openai/", 1)[0]
        req = urllib.request.Request(f"{address}/s/{quote(other, safe='')}/openai/v1/chat/completions",
                                     data=json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]})
                                     .encode(), headers={"content-type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                seen["spoof"] = [resp.status, resp.read().decode()]
        except urllib.error.HTTPError as exc:
            seen["spoof"] = [exc.code, exc.read().decode()]
        seen["spoofed"] = other
        print(json.dumps(seen), flush=True)
        (app / "answer.txt").write_text("42\n")
        return 0
    if mode == "canary":
        ask(distrust=os.environ.get("POLAR_TEST_DISTRUST") == "1")
        return 0
    ask()
    if mode == "solve-k01":
        (app / "answer.txt").write_text("42\n" if k < 2 else "41\n")
        return 0
    if mode == "raise-after-call":
        raise RuntimeError("the test agent gives up")
    if mode == "hang-after-call":
        time.sleep(600)
    if mode == "spawn-hang" and os.environ.get("POLAR_TEST_HANG") == "1":
        child = subprocess.Popen(["sleep", "600"])
        detached = subprocess.Popen(["sleep", "600"], start_new_session=True)
        (app / "pids.json").write_text(json.dumps({"agent": os.getpid(), "child": child.pid,
                                                   "detached": detached.pid,
                                                   "control": env.get("POLAR_SANDBOX_DIR")}))
        time.sleep(600)
    if mode == "slow":
        time.sleep((k + 1) * float(os.environ.get("POLAR_TEST_SLOW", "1.5")))
    (app / "answer.txt").write_text("42\n")
    return 3 if mode == "fail-after-call" else None
