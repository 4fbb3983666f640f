"""The load generator of scripts/bench_gateway: a raw HTTP/1.1 client (asyncio streams, keep-alive), optionally
through an HTTP proxy with CONNECT + TLS (how an agent with HTTPS_PROXY reaches the provider), in several processes.

Run as its own process so its CPU is its own: `python bench_load.py CONFIG.json` prints one JSON result line.
Config: target {host, port, proxy: {host, port, ports?, user, ca} | null, tls_host}, path, headers, bodies (str
list), conc, procs, warmup (calls per connection, untimed; every connection in every process is open and warm before
the timed part starts), then either count (calls per connection) or duration (seconds from a common start).
proxy.ports (a fleet): connection i, numbered across all processes, goes through ports[i % len(ports)].
Result: n, errors, first_error, lat_ms (whole response), ttfb_ms (first body byte), window_s, cpu_s (user+sys of
this process and its workers).
"""

from __future__ import annotations

import asyncio
import base64
import json
import multiprocessing as mp
import os
import ssl
import sys
import time


class Conn:
    def __init__(self, cfg: dict, idx: int = 0):
        self.cfg = cfg
        self.idx = idx
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        t = self.cfg["target"]
        proxy = t.get("proxy")
        if proxy is None:
            self.reader, self.writer = await asyncio.open_connection(t["host"], t["port"], limit=1 << 22)
            return
        ports = proxy.get("ports") or [proxy["port"]]
        port = ports[self.idx % len(ports)]  # round-robin over a fleet, by global connection number
        self.reader, self.writer = await asyncio.open_connection(proxy["host"], port, limit=1 << 22)
        auth = base64.b64encode(f"{proxy['user']}:x".encode()).decode()
        self.writer.write(f"CONNECT {t['tls_host']}:443 HTTP/1.1\r\nHost: {t['tls_host']}:443\r\n"
                          f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        if b" 200" not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"CONNECT refused: {head[:200]!r}")
        ctx = ssl.create_default_context(cafile=proxy["ca"])
        await self.writer.start_tls(ctx, server_hostname=t["tls_host"])

    async def call(self, body: bytes) -> tuple[int, float, float, bytes]:
        """One request; returns (status, seconds to first body byte, seconds to the end, body)."""
        cfg = self.cfg
        host = cfg["target"].get("tls_host") or f"{cfg['target']['host']}:{cfg['target']['port']}"
        head = [f"POST {cfg['path']} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in cfg["headers"].items()]
        t0 = time.perf_counter()
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        r = self.reader
        status_head = await r.readuntil(b"\r\n\r\n")
        lines = status_head.split(b"\r\n")
        status = int(lines[0].split(b" ")[1])
        length, chunked = None, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        first = None
        parts = []
        if chunked:
            while True:
                size = int((await r.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await r.readuntil(b"\r\n")
                    break
                data = await r.readexactly(size + 2)
                if first is None:
                    first = time.perf_counter()
                parts.append(data[:-2])
        elif length is not None:
            parts.append(await r.readexactly(length))
            first = time.perf_counter()
        else:
            parts.append(await r.read())
            first = time.perf_counter()
        end = time.perf_counter()
        return status, (first or end) - t0, end - t0, b"".join(parts)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def _connection(cfg: dict, bodies: list[bytes], idx: int, ready: asyncio.Event, go: dict, out: dict):
    conn = Conn(cfg, idx)
    await conn.open()
    k = idx
    try:
        for _ in range(cfg.get("warmup", 0)):
            await conn.call(bodies[k % len(bodies)])
            k += 1
    finally:
        go["warm"] += 1
        if go["warm"] == go["conns"]:
            ready.set()
    try:
        while "start_at" not in go:
            await go["started"].wait()
        start_at, end_at = go["start_at"], go["end_at"]
        delay = start_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        done = 0
        while True:
            if end_at is None and done >= cfg["count"]:
                break
            if end_at is not None and time.time() >= end_at:
                break
            status, ttfb, total, body = await conn.call(bodies[k % len(bodies)])
            k += 1
            done += 1
            if end_at is not None and time.time() > end_at:
                break  # finished after the window: not counted
            if status != 200:
                out["errors"] += 1
                if out["first_error"] is None:
                    out["first_error"] = f"{status}: {body[:300]!r}"
                continue
            out["n"] += 1
            out["lat_ms"].append(total * 1000)
            out["ttfb_ms"].append(ttfb * 1000)
    finally:
        conn.close()


async def _worker_main(cfg: dict, conns: int, base: int, sync) -> dict:
    """sync(): blocks until every process has warmed up, then returns the common start time."""
    bodies = [b.encode() for b in cfg["bodies"]]
    out = {"n": 0, "errors": 0, "first_error": None, "lat_ms": [], "ttfb_ms": []}
    ready = asyncio.Event()
    go = {"warm": 0, "conns": conns, "started": asyncio.Event()}
    tasks = [asyncio.ensure_future(_connection(cfg, bodies, base + i, ready, go, out)) for i in range(conns)]
    # Every connection is open and warm before the timed window starts, in every process.
    waiter = asyncio.ensure_future(ready.wait())
    await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    start_at = await asyncio.get_running_loop().run_in_executor(None, sync)
    go["start_at"] = start_at
    go["end_at"] = start_at + cfg["duration"] if cfg.get("duration") else None
    go["started"].set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for res in results:
        if isinstance(res, BaseException):
            out["errors"] += 1
            out["first_error"] = out["first_error"] or repr(res)
    return out


def _worker(cfg: dict, conns: int, base: int, ready_q, start_q, result_q) -> None:
    def sync() -> float:
        ready_q.put(1)
        return start_q.get()

    result_q.put(asyncio.run(_worker_main(cfg, conns, base, sync)))


def run(cfg: dict) -> dict:
    procs = max(1, min(cfg.get("procs", 1), cfg["conc"]))
    shares = [cfg["conc"] // procs + (1 if i < cfg["conc"] % procs else 0) for i in range(procs)]
    t0 = os.times()
    if procs == 1:
        res = [asyncio.run(_worker_main(cfg, shares[0], 0, lambda: time.time() + 0.05))]
    else:
        ctx = mp.get_context("fork")
        ready_q, start_q, result_q = ctx.Queue(), ctx.Queue(), ctx.Queue()
        workers = [ctx.Process(target=_worker, args=(cfg, shares[i], sum(shares[:i]), ready_q, start_q, result_q))
                   for i in range(procs)]
        for w in workers:
            w.start()
        for _ in workers:
            ready_q.get()
        start_at = time.time() + 0.1
        for _ in workers:
            start_q.put(start_at)
        res = [result_q.get() for _ in workers]
        for w in workers:
            w.join()
    t1 = os.times()
    out = {"n": 0, "errors": 0, "first_error": None, "lat_ms": [], "ttfb_ms": []}
    for r in res:
        out["n"] += r["n"]
        out["errors"] += r["errors"]
        out["first_error"] = out["first_error"] or r["first_error"]
        out["lat_ms"] += r["lat_ms"]
        out["ttfb_ms"] += r["ttfb_ms"]
    out["window_s"] = cfg.get("duration")
    out["cpu_s"] = (t1.user - t0.user) + (t1.system - t0.system) + (t1.children_user - t0.children_user) + (
        t1.children_system - t0.children_system)
    return out


def main(argv: list[str]) -> int:
    with open(argv[1]) as fh:
        cfg = json.load(fh)
    print(json.dumps(run(cfg)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
