"""Crash safety of the flow files: kill -9 of mitmdump under concurrent streaming load, rotation, a full disk.

Scenarios: 1.x kill -9 under load, repeated (every call the client received in full has its record; torn tails only
in `.open` files, reported by the reader; each restart writes new files and never touches old ones; rotation under
load) · 2.x free space (below polar_min_free_mb → the provider's retryable error and no generation; a write that
fails for lack of space → the agent gets an error, never an unrecorded answer).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import httpx
import pytest

from polar import records as rec
from tests.reliability import PROTOCOLS, stream_ending
from tests.support.gateway import start_gateway
from tests.support.scripted_upstream import Reply
from tests.support.servers import pid_gone, wait_for

pytestmark = pytest.mark.integration

ROUNDS = 3
CLIENTS = 6
ROTATE_MB = 0.02  # ~20 KB files: several rotations per round


def scan_all(flows: str) -> tuple[list[dict], list[rec.FileScan]]:
    records, scans = [], []
    for path in rec.expand_inputs([flows]):
        scan = rec.FileScan(path)
        records.extend(r for _, r in rec.iter_file(path, scan))
        scans.append(scan)
    return records, scans


class Load:
    """CLIENTS threads making streaming calls (the four protocols in turn) through one proxy until stopped.
    `.complete` holds the marker of every call whose response arrived in full."""

    def __init__(self, gw):
        self.gw, self.stop, self.complete, self.broken = gw, threading.Event(), [], 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(CLIENTS)]

    def _run(self, i: int) -> None:
        protos = itertools.cycle(PROTOCOLS[i % 4:] + PROTOCOLS[:i % 4])
        client = self.gw.http_client(session=f"crash-{i}", timeout=10)
        while not self.stop.is_set():
            proto, marker = next(protos), f"marker-{uuid.uuid4().hex}"
            try:
                resp = client.post(proto.url(True), json=proto.body(True, marker))
                ok = resp.status_code == 200 and stream_ending(proto, resp.content) == "ok"
            except httpx.HTTPError:
                ok = False
            with self.lock:
                if ok:
                    self.complete.append(marker)
                else:
                    self.broken += 1
            if not ok:
                client.close()
                client = self.gw.http_client(session=f"crash-{i}", timeout=10)
                time.sleep(0.05)
        client.close()

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(15)


def test_1_1_kill_9_under_streaming_load_loses_no_completed_call(upstream, tmp_path):
    flows = str(tmp_path / "flows")
    completed: list[str] = []
    frozen: dict[str, tuple[int, float]] = {}  # files of killed processes: (size, mtime) right after the kill
    pids = []
    for round_ in range(ROUNDS):
        gw = start_gateway(upstream.base_url, str(tmp_path / f"run{round_}"), flows,
                           sets=[f"polar_rotate_mb={ROTATE_MB}"])
        pid = gw.state["pid"]
        pids.append(pid)
        with Load(gw) as load:
            # Kill while streams are in flight: after enough calls went through, at an arbitrary moment.
            assert wait_for(lambda: len(load.complete) >= 25 + 7 * round_, timeout=30), load.broken
            os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: pid_gone(pid), timeout=10)
        completed.extend(load.complete)
        for path in rec.expand_inputs([flows]):
            if f"-{pid}-" in os.path.basename(path):
                st = os.stat(path)
                frozen[path] = (st.st_size, st.st_mtime)
        print(f"\n[crash] round {round_ + 1}: {len(load.complete)} calls complete, {load.broken} cut by the kill")
    # A clean run after the crashes: it continues in new files and closes them on shutdown.
    gw = start_gateway(upstream.base_url, str(tmp_path / "run-clean"), flows, sets=[f"polar_rotate_mb={ROTATE_MB}"])
    with gw.http_client(session="after-crash") as client:
        resp = client.post(PROTOCOLS[0].url(True), json=PROTOCOLS[0].body(True, "after the crashes"))
    assert resp.status_code == 200 and stream_ending(PROTOCOLS[0], resp.content) == "ok"
    gw.stop()
    pids.append(gw.state["pid"])

    records, scans = scan_all(flows)
    seen = {r["request"] for r in records}
    missing = [m for m in completed if not any(m.encode() in body for body in seen)]
    assert not missing, f"{len(missing)} of {len(completed)} completed calls have no record"
    assert all(r["error"] is None for r in records if any(m.encode() in r["request"] for m in completed[:50]))
    # Torn tails only in `.open` files, and the reader reports them as in progress.
    for scan in scans:
        if scan.torn_tail is not None:
            assert scan.is_open and scan.torn_tail.in_progress, scan.torn_tail.describe()
        assert not scan.errors or scan.is_open, scan.errors
    # Each process wrote only its own files; old files were not touched after their writer died.
    for path, (size, mtime) in frozen.items():
        st = os.stat(path)
        assert (st.st_size, st.st_mtime) == (size, mtime), path
    names = [os.path.basename(p) for p in rec.expand_inputs([flows])]
    for pid in pids:
        assert any(f"-{pid}-" in n for n in names), pid
    # Rotation happened under load (closed files from killed writers), and the clean run left nothing open.
    closed_by_killed = [n for n in names if n.endswith(rec.FILE_SUFFIX) and f"-{pids[-1]}-" not in n]
    assert len(closed_by_killed) >= ROUNDS, names
    assert not any(n.endswith(rec.OPEN_SUFFIX) and f"-{pids[-1]}-" in n for n in names)
    print(f"[crash] {ROUNDS} kills: {len(completed)} completed calls, all recorded; {len(records)} records in "
          f"{len(names)} files; torn tails: {sum(1 for s in scans if s.torn_tail)}")


def test_1_2_the_reader_reports_a_torn_tail(upstream, gateway, tmp_path):
    """A crash mid-write leaves a partial record: in a `.open` file it is 'in progress', in a closed one an error;
    the whole records before it are read either way."""
    with gateway.http_client() as client:
        for _ in range(2):
            client.post(PROTOCOLS[1].url(True), json=PROTOCOLS[1].body(True, "torn"))
    records = gateway.records()[-2:]
    blob = b"".join(rec.pack(r) for r in records)
    for name, in_progress in (("flows-x.msgpack.open", True), ("flows-x.msgpack", False)):
        path = tmp_path / name
        path.write_bytes(blob[:-9])
        scan = rec.FileScan(str(path))
        got = list(rec.iter_file(str(path), scan))
        assert len(got) == 1 and got[0][1]["id"] == records[0]["id"]
        assert scan.torn_tail is not None and scan.torn_tail.in_progress is in_progress
        assert scan.torn_tail.nbytes == len(rec.pack(records[1])) - 9
    cli = subprocess.run([sys.executable, "-m", "polar.records", str(tmp_path / "flows-x.msgpack")],
                         capture_output=True, text=True)
    assert "ERROR: torn tail in a closed file" in cli.stderr


# -- 2. free space ------------------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """An 8 MB tmpfs. Mounting needs root, which CI has: there a failed mount fails the test with its reason; a
    machine without root skips it (tests/support/need.py)."""
    from tests.support.need import need

    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True)
    why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    need(None if proc.returncode == 0 else f"cannot mount an 8 MB tmpfs ({why})", setup="a root shell (CI is root)")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(directory: str, leave_bytes: int) -> str:
    """Write a filler file so that about `leave_bytes` stay free."""
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    path = os.path.join(directory, "filler")
    with open(path, "wb") as fh:
        fh.write(b"\0" * max(free - leave_bytes, 0))
    return path


def test_2_1_below_min_free_space_generations_get_retryable_errors(upstream, small_disk, tmp_path):
    flows, min_free = os.path.join(small_disk, "flows"), 4
    os.makedirs(flows)
    filler = fill(small_disk, 2 * 1024 * 1024)
    with start_gateway(upstream.base_url, str(tmp_path / "run"), flows, sets=[f"polar_min_free_mb={min_free}"]) as gw:
        for proto in PROTOCOLS:
            status, _ = proto.errors["unavailable"]
            with gw.http_client(session="disk") as client:
                resp = client.post(proto.url(True), json=proto.body(True, "no room"))
            assert resp.status_code == status and proto.error_ok(resp.status_code, resp.content), resp.content
            assert b"retry" in resp.content
        assert upstream.chat_requests == []  # no generation ran, so none went unrecorded
        assert "MB free" in gw.log_text()
        os.remove(filler)  # room again: the same gateway serves and records again
        for proto in PROTOCOLS:
            with gw.http_client(session="disk") as client:
                resp = client.post(proto.url(True), json=proto.body(True, "room again"))
            assert resp.status_code == 200 and stream_ending(proto, resp.content) == "ok"
        assert len(gw.records()) == len(PROTOCOLS) and len(upstream.chat_requests) == len(PROTOCOLS)


def test_2_2_a_record_that_cannot_be_written_is_never_a_successful_answer(upstream, small_disk, tmp_path):
    flows = os.path.join(small_disk, "flows")
    os.makedirs(flows)
    with start_gateway(upstream.base_url, str(tmp_path / "run"), flows, sets=["polar_min_free_mb=0"]) as gw:
        fill(small_disk, 0)
        for proto in PROTOCOLS:
            for stream in (True, False):
                upstream.script(Reply(text="an answer that cannot be recorded"))
                with gw.http_client(session="full") as client:
                    try:
                        resp = client.post(proto.url(stream), json=proto.body(stream, "disk is full"))
                    except httpx.RemoteProtocolError:  # the stream was cut: not a complete answer either
                        continue
                if resp.status_code == 200:
                    assert stream and stream_ending(proto, resp.content) == "error", resp.content[-300:]
                else:
                    assert proto.error_ok(resp.status_code, resp.content), resp.content
                    assert resp.status_code == proto.errors["unavailable"][0]
        assert len(upstream.chat_requests) == 2 * len(PROTOCOLS)
        assert rec.expand_inputs([flows]) == [] or all(
            os.path.getsize(p) == 0 for p in rec.expand_inputs([flows]))  # nothing torn left behind
