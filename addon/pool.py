"""The replica pool: every backend replica `polar_upstream` names, which one serves each call, and which are fit to.

- Choice (`Pool.choose`, pure and synchronous: microseconds, BENCHMARKS.md). Under `polar_replica_policy=sticky` a
  session is pinned by rendezvous (highest-random-weight) hashing of its id with each replica's base URL: every proxy
  of a fleet computes the same ranking without talking to the others, and removing a replica moves only the sessions
  it ranked first. A replica at `polar_replica_max_inflight` spills the call to the least-loaded healthy one (the next
  call of the session goes home again); calls without a session go to the least-loaded. `round_robin` ignores
  sessions (kept to measure what stickiness buys).
- Health (`Pool.watch`, one task per gateway, only for pools of two or more: one replica has nowhere to fail over to,
  and behaves as the single backend always did). A replica that refuses a connection (`eject`, by the call that saw
  it, or by its probe) is ejected, and so is one whose periodic probe fails PROBE_FAILURES_TO_EJECT times in a row; its in-flight backend connections are cut, so a call still
  waiting for its first byte is retried on the next replica and one already streaming gets the protocol's retryable
  error. Ejected replicas are probed back in with exponential backoff. The sessions of a replica that leaves move to
  their second-ranked replica; every other session stays where it was.
- Agreement (`Identity`): replicas must serve the same backend kind, model, weight version and chat template (a hash
  of the backend's own `/tokenize` render of a fixed conversation and text, `template_hash`). The pool's identity is
  the one most healthy replicas share (a tie: the one already served, then the earliest listed), with the weight version a release named taking
  precedence; a replica that differs is ejected and logged, and never served from until it agrees. Checked before the
  first call of a pool, at every probe (the weight version: a replica published apart from the others is caught at
  its next probe), and after every release. Not while held: replicas reload one after another during a publication.
- `polar_upstream=@FILE` (one base URL per line) is re-read when the file changes; replicas that stay keep their state.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import httpx

from .backend import Backend
from .codecs.base import GatewayError
from .options import read_upstream_file

log = logging.getLogger("polar.pool")

PROBE_INTERVAL_S = 1.0  # healthy replicas: one cheap GET each per interval
PROBE_TIMEOUT_S = 5.0  # a probe not answered within this has failed
# A refused connection ejects at once; a probe that times out or answers 5xx only this many times in a row, and only
# while no call of the replica received a byte meanwhile (a starved CPU replica answers a GET late but still streams:
# measured over 3 s per GET with two replicas, six agents and a publication's checks on 2 cores), and never while
# held (a publication pauses and reloads replicas; the release checks them all). A stopped replica is out in ~20 s.
PROBE_FAILURES_TO_EJECT = 3
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0


@dataclass(frozen=True)
class Identity:
    """What replicas of one pool must share."""

    kind: str
    model: str
    weight_version: str | None
    template_hash: str | None

    def differences(self, other: "Identity") -> list[str]:
        return [f"{name} {getattr(self, name)!r} (the pool serves {getattr(other, name)!r})"
                for name in ("kind", "model", "weight_version", "template_hash")
                if getattr(self, name) != getattr(other, name)]


def rendezvous_score(session: str, url: str) -> int:
    """The session's weight for one replica: the same on every proxy and every run (blake2b, not Python's hash)."""
    return int.from_bytes(hashlib.blake2b(f"{session}\0{url}".encode(), digest_size=8).digest(), "big")


def rendezvous_rank(session: str, urls: Iterable[str]) -> list[str]:
    """Replicas in the session's order of preference (highest score first)."""
    return sorted(urls, key=lambda url: rendezvous_score(session, url), reverse=True)


class Replica:
    """One backend replica: its client, load and health."""

    def __init__(self, backend: Backend, index: int):
        self.url = backend.base_url
        self.backend = backend
        self.index = index  # its place in polar_upstream (ties go to the earliest)
        self.in_flight = 0
        self.served = 0
        self.healthy = True
        self.verified = False  # its identity checked against the pool's (pools of two or more)
        self.reason: str | None = None  # why it is ejected
        self.ejections = 0
        self.backoff = BACKOFF_FIRST_S
        self.next_probe = 0.0
        self.identity: Identity | None = None
        self.probe_failures = 0  # periodic probes failed in a row
        self.last_data = 0.0  # monotonic time a call last received bytes from it (evidence of life between probes)
        self.cuts: set[Callable[[], None]] = set()  # in-flight calls' backend connections, cut on ejection

    def state(self) -> dict:
        ident = self.identity
        return {"url": self.url, "healthy": self.healthy, "in_flight": self.in_flight, "served": self.served,
                "ejections": self.ejections, "reason": self.reason,
                "weight_version": ident.weight_version if ident else None,
                "template_hash": ident.template_hash if ident else None}


class Pool:
    """Every replica of polar_upstream. One per gateway; replaced when the backend options change."""

    def __init__(self, urls: list[str], make_backend: Callable[[str], Backend], *, policy: str = "sticky",
                 max_inflight: int = 0, source: str | None = None,
                 released_version: Callable[[], str | None] = lambda: None, held: Callable[[], bool] = lambda: False):
        self.make_backend = make_backend
        self.policy = policy
        self.max_inflight = max_inflight  # 0: no limit
        self.source = source  # the @FILE path, re-read on change
        self._source_stamp = _stamp(source) if source else None
        self.released_version = released_version
        self.held = held
        self.replicas = [Replica(make_backend(url), i) for i, url in enumerate(urls)]
        self.spills = 0
        self.retries = 0
        self._rr = 0
        self.identity: Identity | None = None
        self._verified = asyncio.Event() if len(self.replicas) > 1 else None
        self._check_lock: asyncio.Lock | None = None
        self._first_check: asyncio.Task | None = None
        self._watch: asyncio.Task | None = None
        self._closed = False

    @property
    def single(self) -> Replica | None:
        return self.replicas[0] if len(self.replicas) == 1 else None

    # ------------------------------------------------------------------------------------------ choice

    def choose(self, session: str | None, exclude: Iterable[Replica] = ()) -> Replica | None:
        """The replica for a call of `session` (None: no session), among the healthy ones not in `exclude`; None when
        none is left."""
        if len(self.replicas) == 1:
            only = self.replicas[0]
            return None if only in exclude else only
        excluded = set(exclude)
        up = [r for r in self.replicas if r.healthy and r not in excluded]
        if not up:
            return None
        if self.policy == "round_robin":
            self._rr += 1
            return up[self._rr % len(up)]
        if session is None:
            return min(up, key=lambda r: (r.in_flight, r.index))
        home = max(up, key=lambda r: rendezvous_score(session, r.url))
        if self.max_inflight and home.in_flight >= self.max_inflight:
            spill = min(up, key=lambda r: (r.in_flight, r.index))
            if spill is not home:
                self.spills += 1
                return spill
        return home

    async def ready(self) -> None:
        """Before a pool's first call: every replica probed and checked once (a mismatch is never served from)."""
        if self._verified is None or self._verified.is_set():
            return
        self.start()
        if self._first_check is None or self._first_check.done() and not self._verified.is_set():
            self._first_check = asyncio.get_running_loop().create_task(self.check())
        await asyncio.shield(self._first_check)  # one check for every call that arrives before it ends

    # ------------------------------------------------------------------------------------------ health

    def eject(self, replica: Replica, reason: str) -> None:
        """Take a replica out (a refused connection, a failed probe, a mismatch); its live backend connections are
        cut. A single replica is never ejected: there is nothing to fail over to."""
        if len(self.replicas) == 1 or not replica.healthy:
            if not replica.healthy:
                replica.reason = reason
            return
        replica.healthy = False
        replica.reason = reason
        replica.ejections += 1
        replica.backoff = BACKOFF_FIRST_S
        replica.next_probe = time.monotonic() + replica.backoff
        replica.backend.forget()
        log.warning("polar pool: replica %s ejected: %s (%d in flight cut)", replica.url, reason, len(replica.cuts))
        for cut in list(replica.cuts):
            cut()

    def _admit(self, replica: Replica) -> None:
        if not replica.healthy:
            log.info("polar pool: replica %s back in after %d probe(s)", replica.url, replica.ejections)
        replica.healthy, replica.reason = True, None
        replica.backoff = BACKOFF_FIRST_S
        replica.probe_failures = 0

    async def _identity(self, replica: Replica) -> Identity:
        info = await replica.backend.info()
        version = await replica.backend.weight_info() if info.kind == "vllm" else None
        replica.identity = Identity(info.kind, info.model, version, info.template_hash)
        return replica.identity

    async def check(self, replicas: list[Replica] | None = None) -> None:
        """Probe `replicas` (all: every replica) afresh, then judge every known identity against the pool's."""
        if self._check_lock is None:
            self._check_lock = asyncio.Lock()
        async with self._check_lock:
            targets = self.replicas if replicas is None else replicas
            for r in targets:
                r.backend.forget()
            results = await asyncio.gather(*(self._identity(r) for r in targets), return_exceptions=True)
            answered = set()
            for r, result in zip(targets, results):
                if not isinstance(result, BaseException):
                    answered.add(r)
                elif r.healthy and r.verified and not isinstance(result, httpx.ConnectError):
                    # checked before (a release's re-check): one slow answer is a failed probe, not an ejection; it
                    # keeps serving, judged when a probe next hears from it
                    self._probe_failed(r, result, float("inf"))
                else:
                    r.identity = None
                    self.eject(r, f"probe failed: {_reason(result)}")
            self._judge(answered, only=answered)
            if self._verified is not None:
                self._verified.set()

    def _judge(self, answered: set[Replica] = frozenset(), only: set[Replica] | None = None) -> None:
        """Every replica in service or just probed with success (`answered`) against the pool's identity; with
        `only`, the vote counts every known replica but only those are ejected or admitted."""
        known = [r for r in self.replicas if r.identity is not None and (r.healthy or r in answered)]
        if not known:
            return
        released = self.released_version()
        votes: dict[Identity, list[Replica]] = {}
        for r in known:
            votes.setdefault(r.identity, []).append(r)
        if released is not None:
            preferred = {i: rs for i, rs in votes.items() if i.weight_version == released} or votes
        else:
            preferred = votes
        # most replicas; a tie: the identity already served, then the earliest listed
        pool = max(preferred, key=lambda i: (len(preferred[i]), i == self.identity,
                                             -min(r.index for r in preferred[i])))
        if pool != self.identity:
            log.info("polar pool: serving %s", pool)
        self.identity = pool
        for r in known:
            if only is not None and r not in only:
                continue
            diff = r.identity.differences(pool)
            if diff:
                if r.healthy:
                    log.error("polar pool: replica %s disagrees with the pool: %s", r.url, "; ".join(diff))
                self.eject(r, "mismatch: " + "; ".join(diff))
            else:
                r.verified = True
                self._admit(r)

    async def after_release(self) -> None:
        """A publication ended: every replica probed again (ejected ones too) and judged against the new version."""
        if len(self.replicas) > 1:
            await self.check()

    def start(self) -> None:
        if self._watch is None and len(self.replicas) > 1 and not self._closed:
            self._watch = asyncio.get_running_loop().create_task(self._watch_loop())

    async def _watch_loop(self) -> None:
        while not self._closed:
            try:
                await self._probe_round()
            except Exception:  # noqa: BLE001 — the watcher must outlive any one bad answer
                log.exception("polar pool: probe round failed")
            await asyncio.sleep(PROBE_INTERVAL_S)

    async def _probe_round(self) -> None:
        self._reread_source()
        now = time.monotonic()
        due = [r for r in self.replicas if not r.healthy and r.next_probe <= now]
        if due:
            await self.check(due)
            for r in due:
                if not r.healthy:
                    r.backoff = min(r.backoff * 2, BACKOFF_MAX_S)
                    r.next_probe = time.monotonic() + r.backoff
        live = [r for r in self.replicas if r.healthy]
        sent = time.monotonic()
        results = await asyncio.gather(*(self._alive(r) for r in live), return_exceptions=True)
        changed, answered = False, set()
        for r, result in zip(live, results):
            if isinstance(result, BaseException):
                self._probe_failed(r, result, sent)
                continue
            r.probe_failures = 0
            answered.add(r)
            if r.identity is not None and result != r.identity.weight_version:
                r.identity = Identity(r.identity.kind, r.identity.model, result, r.identity.template_hash)
                changed = True
        if changed and not self.held():
            self._judge(only=answered)  # a replica whose probe failed is not judged on what it said before

    def _probe_failed(self, r: Replica, exc: BaseException, sent: float) -> None:
        """A failed probe of a replica in service: refused → out; else counted, unless held or a call of the replica
        received bytes since the probe was sent."""
        if isinstance(exc, httpx.ConnectError):
            self.eject(r, f"probe failed: {_reason(exc)}")
            return
        if self.held() or r.last_data >= sent:
            r.probe_failures = 0
            return
        r.probe_failures += 1
        if r.probe_failures >= PROBE_FAILURES_TO_EJECT:
            self.eject(r, f"probe failed: {_reason(exc)} ({r.probe_failures} in a row)")

    async def _alive(self, r: Replica) -> str | None:
        """One cheap probe: the served weight version for vLLM (any answer of the server will do), else /models."""
        b = r.backend
        url = f"{b.root_url}/weight_info" if r.identity is None or r.identity.kind == "vllm" else f"{b.base_url}/models"
        resp = await b.client.get(url, timeout=PROBE_TIMEOUT_S)
        if resp.status_code >= 500:
            raise GatewayError("unavailable", f"{url} answered {resp.status_code}")
        if url.endswith("/weight_info") and resp.status_code == 200:
            try:
                version = resp.json().get("weight_version")
            except ValueError:
                return None
            return str(version) if isinstance(version, (str, int)) and not isinstance(version, bool) else None
        return r.identity.weight_version if r.identity else None

    # ------------------------------------------------------------------------------------------ the replica list

    def _reread_source(self) -> None:
        if not self.source:
            return
        stamp = _stamp(self.source)
        if stamp == self._source_stamp:
            return
        self._source_stamp = stamp
        try:
            urls = read_upstream_file(self.source)
        except (OSError, ValueError) as exc:
            log.error("polar pool: %s: %s; the replicas stay as they were", self.source, exc)
            return
        self.update(urls)

    def update(self, urls: list[str]) -> None:
        """A new replica list: replicas that stay keep their state, new ones are checked before serving, gone ones
        close once their calls end."""
        by_url = {r.url: r for r in self.replicas}
        fresh = []
        for i, url in enumerate(urls):
            r = by_url.pop(url.rstrip("/"), None)
            if r is None:
                r = Replica(self.make_backend(url), i)
                r.healthy, r.reason, r.next_probe = False, "new: not probed yet", 0.0
            r.index = i
            fresh.append(r)
        log.info("polar pool: replicas now %s", ", ".join(r.url for r in fresh))
        self.replicas = fresh
        for gone in by_url.values():
            asyncio.get_running_loop().create_task(_close_when_idle(gone))
        if len(fresh) > 1:
            if self._verified is None:
                self._verified = asyncio.Event()
            self.start()

    # ------------------------------------------------------------------------------------------ state, close

    def state(self) -> dict:
        return {"policy": self.policy, "max_inflight": self.max_inflight, "spills": self.spills,
                "retries": self.retries, "ejections": sum(r.ejections for r in self.replicas),
                "template_hash": self.identity.template_hash if self.identity else None,
                "replicas": [r.state() for r in self.replicas]}

    async def close(self) -> None:
        self._closed = True
        if self._watch is not None:
            self._watch.cancel()
        for r in self.replicas:
            await _close_backend(r.backend)


def _reason(exc: BaseException) -> str:
    return exc.message if isinstance(exc, GatewayError) else repr(exc)


def _stamp(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


async def _close_backend(backend: Backend) -> None:
    if backend.stream_client is not None:
        await backend.stream_client.aclose()
    await backend.close()


async def _close_when_idle(replica: Replica) -> None:
    while replica.in_flight:
        await asyncio.sleep(0.5)
    await _close_backend(replica.backend)
