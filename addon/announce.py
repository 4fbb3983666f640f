"""Call announcements (`polar_announce`, `polar_announce_hold`): the gateway tells a rollout runner that a session's
call has arrived, so the runner can snapshot the sample's workspace while the agent waits on the model
(`polar-rollout --turn-states`, docs/options.md).

  POST <polar_announce> {"session": S, "call_id": ID, "hold_s": H}     header x-polar-control-token: the gateway's
                                                                        control token (the runner reads the same file)

The URL must be loopback (http://127.0.0.1 or http://[::1]): the announcement names sessions and carries the token.
With `polar_announce_hold` 0 (async) the call goes on at once and the announcement travels beside it; with H > 0
(hold) the call waits for the runner's answer — the snapshot exists — at most H seconds, then goes on (the runner
marks that snapshot late). A runner that is down or answers an error never fails a call: it is logged and counted
(`Announcer.failed`), and the call goes on.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from urllib.parse import urlsplit

import httpx
import orjson

log = logging.getLogger("polar.announce")

TOKEN_HEADER = "x-polar-control-token"


def loopback_url(url: str) -> bool:
    """Whether `url` is plain http on a loopback address with a port (the only announce target allowed)."""
    parts = urlsplit(url)
    try:
        host_ok = ipaddress.ip_address(parts.hostname or "").is_loopback
        port = parts.port
    except ValueError:
        return False
    return parts.scheme == "http" and host_ok and port is not None


class Announcer:
    """One gateway's announcer (one HTTP client, reused across calls)."""

    def __init__(self, url: str, token: str, hold_s: float):
        self.url, self.token, self.hold_s = url, token, hold_s
        self.sent = self.failed = self.late = 0
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(max(hold_s, 5.0)), trust_env=False)
        self._tasks: set[asyncio.Task] = set()

    async def call_arrived(self, session: str | None, call_id: str) -> None:
        """Announce one call; returns when the call may go on (at once, or after the hold)."""
        if session is None:
            return  # no sample to snapshot
        body = orjson.dumps({"session": session, "call_id": call_id, "hold_s": self.hold_s})
        send = asyncio.get_running_loop().create_task(self._send(body, call_id))
        self._tasks.add(send)
        send.add_done_callback(self._tasks.discard)
        if self.hold_s <= 0:
            return
        try:
            await asyncio.wait_for(asyncio.shield(send), self.hold_s)
        except asyncio.TimeoutError:
            self.late += 1
            log.warning("polar announce: call %s went on after %g s without the runner's answer", call_id, self.hold_s)

    async def _send(self, body: bytes, call_id: str) -> None:
        self.sent += 1
        try:
            resp = await self._client.post(self.url, content=body, headers={TOKEN_HEADER: self.token,
                                                                             "content-type": "application/json"})
            if not 200 <= resp.status_code < 300:  # 202: the runner had nothing to snapshot (no sample of it)
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
        except Exception as exc:  # noqa: BLE001 — never the call's failure
            self.failed += 1
            log.warning("polar announce: call %s not announced to %s: %s", call_id, self.url, exc)

    def state(self) -> dict:
        return {"url": self.url, "hold_s": self.hold_s, "sent": self.sent, "failed": self.failed, "late": self.late}

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self._client.aclose()
