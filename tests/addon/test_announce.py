"""polar.addon.announce: the gateway tells a runner of each arriving call (async: beside the call; hold: the call
waits for the answer, bounded) over loopback with the control token; a runner that is down never fails a call. A real
loopback HTTP server stands in for the runner."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from polar.addon.announce import Announcer, loopback_url
from polar.addon.options import OptionError, parse_options, OPTIONS

pytestmark = pytest.mark.unit

# The runner stand-in answers after RUNNER_S; a hold bounded at BOUND_S ends before that answer.
RUNNER_S = 0.3  # the stand-in runner's answer time
BOUND_S = 0.1  # a hold bounded below the runner's answer time


class Runner:
    """A loopback HTTP/1.1 server that answers 200 after `delay` seconds and keeps what it got."""

    def __init__(self, delay: float = 0.0):
        self.delay, self.got, self.answered_at, self.server = delay, [], [], None

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/turn-states/call"
        return self

    async def __aexit__(self, *exc):
        self.server.close()

    async def _serve(self, reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        await asyncio.sleep(self.delay)
        self.got.append((lines[0], headers, json.loads(body)))
        self.answered_at.append(time.monotonic())
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()


@pytest.mark.parametrize("url,ok", [("http://127.0.0.1:9/x", True), ("http://[::1]:9/", True),
                                    ("http://10.0.0.1:9/x", False), ("https://127.0.0.1:9/x", False),
                                    ("http://localhost:9/x", False), ("http://127.0.0.1/x", False)])
def test_1_only_a_loopback_http_url_with_a_port(url, ok):
    assert loopback_url(url) is ok
    values = {o.name: o.default for o in OPTIONS}
    values["polar_announce"] = url
    if ok:
        assert parse_options(values).announce == url
    else:
        with pytest.raises(OptionError, match="polar_announce"):
            parse_options(values)


def test_2_async_goes_on_at_once_and_the_runner_gets_session_call_and_token():
    async def main():
        async with Runner(delay=RUNNER_S) as runner:
            ann = Announcer(runner.url, "tok", 0.0)
            await ann.call_arrived("run/task/0/0", "call-1")
            went_on = time.monotonic()
            await asyncio.sleep(2 * RUNNER_S)
            await ann.close()
            return went_on, runner.answered_at, runner.got, ann.state()
    went_on, answered_at, got, state = asyncio.run(main())
    assert went_on < answered_at[0]  # the call went on before the runner answered
    (line, headers, body), = got
    assert line.startswith("POST /turn-states/call ") and headers["x-polar-control-token"] == "tok"
    assert body == {"session": "run/task/0/0", "call_id": "call-1", "hold_s": 0.0}
    assert state["sent"] == 1 and state["failed"] == 0


def test_3_hold_waits_for_the_answer_and_no_longer_than_its_bound():
    async def main():
        async with Runner(delay=RUNNER_S) as runner:
            ann = Announcer(runner.url, "tok", 2.0)
            t0 = time.monotonic()
            await ann.call_arrived("s", "c1")
            waited = time.monotonic() - t0
            answered = runner.answered_at[0] - t0
            short = Announcer(runner.url, "tok", BOUND_S)
            t1 = time.monotonic()
            await short.call_arrived("s", "c2")
            bounded = time.monotonic() - t1
            gave_up = time.monotonic()
            await asyncio.sleep(2 * RUNNER_S)
            await ann.close()
            await short.close()
            return waited, answered, bounded, gave_up, runner.answered_at[1], short.state()
    waited, answered, bounded, gave_up, second_answer, state = asyncio.run(main())
    assert waited >= answered  # the call went on only once the runner had answered
    assert bounded >= BOUND_S and gave_up < second_answer and state["late"] == 1  # bounded: on before the answer


def test_4_a_runner_that_is_down_never_fails_the_call():
    async def main():
        ann = Announcer("http://127.0.0.1:9/x", "tok", 1.0)  # the discard port: nothing listens
        await ann.call_arrived("s", "c1")
        await ann.call_arrived(None, "c2")  # no session: nothing to announce
        await ann.close()
        return ann.state()
    state = asyncio.run(main())
    assert state["sent"] == 1 and state["failed"] == 1
