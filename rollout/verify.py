"""The verifier: the task's tests/test.sh in a sandbox of its own, on a fresh copy of the agent's final /app, and the
reward file rule (reward.json's `reward`, else its only key, else reward.txt's one float).

In an image task the verifier's sandbox is the same image, after the agent: the agent's final working directory (a
copy) at the image's WORKDIR, /tests (copied in only now: the agent never saw them) and /logs/verifier, the image's
environment. How this differs from Harbor, which runs test.sh in the agent's own container: the rest of the image is
read-only for the agent here, so the only state the agent leaves is its working directory (and nothing it wrote to
/tmp or HOME reaches the verifier).

No sandbox has a network; the verifier's proxy variables point at a tripwire (rollout/sandbox/run.py). A verifier that
tried the network (a connection to the tripwire, or a resolver or connect failure in its log) ends as
`verifier_error` naming the network — whatever reward it wrote, since a test that could not fetch what it needs says
nothing of the agent's work.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

from polar.rollout.common import CANCEL, Cancelled, tail
from polar.rollout import overlay
from polar.rollout.job import SampleContext, SampleJob
from polar.rollout.sandbox import base as sb
from polar.rollout.sandbox import registry
from polar.rollout.sandbox.run import run_sandboxed
from polar.rollout.specs import verifier_spec

# what resolvers and clients print when there is no network (pip, uv, curl, apt, python, node)
NETWORK_FAILURE = re.compile(r"Temporary failure in name resolution|Could not resolve host|Name or service not known|"
                             r"Network is unreachable|getaddrinfo (?:ENOTFOUND|EAI_AGAIN)|nodename nor servname|"
                             r"Failed to establish a new connection|dns error|failed to lookup address",
                             re.IGNORECASE)


def read_reward(verifier_dir: Path, key: str = "reward") -> tuple[float | None, Any, str | None]:
    """(reward, reward_details, error): reward.json's `reward` (else its only key), else reward.txt's one float.
    Another `key` (--reward-key) is reward.json's value of that key, and nothing else: a reward.json without it, or
    only a reward.txt, is an error (a 0 would train on what the grader did not say)."""
    j, t = verifier_dir / "reward.json", verifier_dir / "reward.txt"
    if key != "reward":
        return _read_key(j, key)
    if j.is_file():
        try:
            doc = json.loads(j.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            return None, None, f"reward.json is not JSON ({exc})"
        value: Any = doc
        if isinstance(doc, dict):
            if "reward" in doc:
                value = doc["reward"]
            elif len(doc) == 1:
                value = next(iter(doc.values()))
            else:
                return None, doc, f"reward.json has no `reward` key and {len(doc)} keys (expected one)"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None, doc if isinstance(doc, dict) else None, f"reward.json's reward {value!r} is not a finite number"
        return float(value), doc if isinstance(doc, dict) else None, None
    if t.is_file():
        try:
            text = t.read_text(encoding="utf-8").strip()
            value = float(text)
        except (OSError, ValueError):
            return None, None, f"reward.txt holds {t.read_text(errors='replace').strip()[:80]!r}, not one number"
        if not math.isfinite(value):
            return None, None, f"reward.txt's reward {text!r} is not finite"
        return value, None, None
    return None, None, "the verifier wrote no reward.json or reward.txt in /logs/verifier"


def _read_key(path: Path, key: str) -> tuple[float | None, Any, str | None]:
    """--reward-key KEY: reward.json's value of KEY, a finite number."""
    if not path.is_file():
        return None, None, f"--reward-key {key}: the verifier wrote no reward.json in /logs/verifier"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return None, None, f"reward.json is not JSON ({exc})"
    if not isinstance(doc, dict) or key not in doc:
        keys = ", ".join(sorted(doc)) if isinstance(doc, dict) else type(doc).__name__
        return None, doc if isinstance(doc, dict) else None, (f"--reward-key {key}: reward.json has no {key!r} key "
                                                              f"(it has: {keys})")
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None, doc, f"--reward-key {key}: reward.json's {key} {value!r} is not a finite number"
    return float(value), doc, None


def run_verifier(ctx: SampleContext, job: SampleJob, result: dict, detail: dict, sample_dir: Path, work: Path, app: Path,
                 lap: Callable[[str], None]) -> None:
    """The verifier on a fresh view of the final /app (an overlay on the agent's overlay, else a copy); sets
    status/reward/reward_details (the status table)."""
    vapp, vhome = work / "verify-app", work / "verify-home"
    stacked = overlay.is_view(app)
    if stacked:  # the agent's view is the sandbox uid's throughout (its start state's and the agent's own files)
        overlay.mount_view([app], work, vapp.name)
    else:
        shutil.copytree(app, vapp, symlinks=True)
    vhome.mkdir()
    vdir = sample_dir / "verifier"
    if vdir.exists():
        shutil.rmtree(vdir)
    vdir.mkdir()
    if registry.get(ctx.sandbox).isolated:
        if os.geteuid() == 0:
            os.chown(vdir, sb.UID, sb.GID)  # /logs/verifier is written by uid 1000 inside
        else:
            os.chmod(vdir, 0o777)
    spec, argv, timeout = verifier_spec(ctx, job, vapp, vhome, vdir)
    if stacked:
        spec = dataclasses.replace(spec, app_owned=True)
    lap("setup")
    log = sample_dir / "verifier.log"
    try:
        res = run_sandboxed(spec, argv, stdout=log, stderr=sample_dir / ".verifier.stderr", timeout=timeout)
    finally:
        lap("verify")
        _join_logs(log, sample_dir / ".verifier.stderr")
    if CANCEL.is_set():
        raise Cancelled()
    detail["verifier"] = {"argv": argv, "exit_code": res.exit_code, "timed_out": res.timed_out,
                          "wall_s": round(res.wall_s, 3), "timeout_s": timeout, "memory_limit": res.memory_limit,
                          "network_attempts": res.proxy_connections}
    network = _network_used(res.proxy_connections, log)
    if network is not None:
        result["status"], result["reward"] = "verifier_error", None
        result["error"] = (f"the verifier needs the network ({network}), and sandboxes have none: install what "
                           f"tests/test.sh fetches in the image (its Dockerfile) instead")
        return
    if res.timed_out:
        result["status"], result["reward"] = "verifier_timeout", 0.0
        result["error"] = f"the verifier did not finish within {timeout:g} s"
        return
    reward, details, error = read_reward(vdir, ctx.reward_key)
    result["reward_details"] = details
    if error is not None:
        result["status"], result["reward"] = "verifier_error", None
        result["error"] = f"{error} (verifier exit {res.exit_code}; verifier.log: {tail(log, 300)!r})"
        return
    result["reward"] = reward


def _network_used(attempts: int, log: Path) -> str | None:
    """How the verifier tried the network, or None."""
    if attempts:
        return f"{attempts} connection(s) through its proxy variables"
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    found = NETWORK_FAILURE.search(text)
    return f"its log says {found.group(0)!r}" if found else None


def _join_logs(log: Path, err: Path) -> None:
    """verifier.log: the verifier's stdout then its stderr (the sandbox writes them to two files)."""
    with contextlib.suppress(OSError):
        if err.is_file():
            data = err.read_bytes()
            if data:
                with open(log, "ab") as fh:
                    fh.write(b"\n--- stderr\n" + data)
            err.unlink()
