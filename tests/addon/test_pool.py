"""The replica pool's rules without a network (addon/pool.py): rendezvous choice, spill, least-loaded, round robin,
ejection and readmission, agreement. The same rules against real replicas: tests/integration/test_pool.py.

Scenarios: 1.x choice · 2.x health · 3.x agreement · 4.x the replica list.
"""

from __future__ import annotations

import asyncio
import collections

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.addon.codecs.base import GatewayError
from polar.addon.pool import Identity, Pool, rendezvous_rank, rendezvous_score
from polar.addon.shaping import BackendInfo

URLS = [f"http://127.0.0.1:{8000 + i}/v1" for i in range(4)]


class FakeBackend:
    """What the pool asks a Backend: info(), weight_info(), forget(), and the GET of its periodic probe."""

    def __init__(self, url: str, *, model="m", template="t" * 16, version="1", kind="vllm"):
        self.base_url = url
        self.root_url = url[:-3]
        self.model, self.template, self.version, self.kind = model, template, version, kind
        self.down = False
        self.forgotten = 0
        self.stream_client = None
        self.client = self

    async def info(self) -> BackendInfo:
        if self.down:
            raise GatewayError("unavailable", f"backend {self.base_url} unreachable")
        return BackendInfo(kind=self.kind, version="0.32", model=self.model, max_model_len=4096,
                           template_hash=self.template)

    async def weight_info(self):
        return self.version

    def forget(self) -> None:
        self.forgotten += 1

    async def get(self, url, timeout):
        if self.down == "slow":
            raise httpx.ReadTimeout("")
        if self.down:
            raise httpx.ConnectError("connection refused")
        return _Resp({"weight_version": self.version})

    async def close(self) -> None:
        pass


class _Resp:
    status_code = 200

    def __init__(self, doc):
        self.doc = doc

    def json(self):
        return self.doc


async def _slow_info():
    raise httpx.ReadTimeout("")


def make_pool(urls=URLS, **kwargs) -> tuple[Pool, dict[str, FakeBackend]]:
    backends: dict[str, FakeBackend] = {}

    def make(url):
        backends[url] = FakeBackend(url)
        return backends[url]

    return Pool(list(urls), make, **kwargs), backends


# ------------------------------------------------------------------------------------------------------ 1. choice

@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_1_1_a_session_goes_to_its_highest_score_and_only_its_replicas_leave_with_one(session):
    pool, _ = make_pool()
    home = pool.choose(session)
    assert home.url == rendezvous_rank(session, URLS)[0] == max(URLS, key=lambda u: rendezvous_score(session, u))
    other = next(r for r in pool.replicas if r is not home)
    other.healthy = False  # another replica leaves: this session does not move
    assert pool.choose(session) is home
    home.healthy = False  # its own leaves: it moves to its second choice
    assert pool.choose(session).url == [u for u in rendezvous_rank(session, URLS) if u != other.url][1]


def test_1_2_sessions_spread_over_replicas_and_proxies_agree():
    a, _ = make_pool()
    b, _ = make_pool()
    sessions = [f"s{i}" for i in range(4000)]
    counts = collections.Counter(a.choose(s).url for s in sessions)
    assert all(900 <= counts[u] <= 1100 for u in URLS), counts  # 1000 each, binomial sd ~27
    assert [a.choose(s).url for s in sessions] == [b.choose(s).url for s in sessions]


def test_1_3_a_full_replica_spills_to_the_least_loaded_and_the_session_goes_home_after():
    pool, _ = make_pool(URLS[:3], max_inflight=2)
    home = pool.choose("s")
    home.in_flight = 2
    others = [r for r in pool.replicas if r is not home]
    others[0].in_flight, others[1].in_flight = 1, 0
    assert pool.choose("s") is others[1] and pool.spills == 1
    home.in_flight = 1
    assert pool.choose("s") is home and pool.spills == 1


def test_1_4_calls_without_a_session_go_least_loaded_round_robin_ignores_sessions():
    pool, _ = make_pool(URLS[:3])
    pool.replicas[0].in_flight, pool.replicas[1].in_flight, pool.replicas[2].in_flight = 3, 1, 2
    assert pool.choose(None) is pool.replicas[1]
    rr, _ = make_pool(URLS[:3], policy="round_robin")
    assert len({rr.choose("same").url for _ in range(3)}) == 3


def test_1_5_exclusions_and_no_replica_left():
    pool, _ = make_pool(URLS[:2])
    first = pool.choose("s")
    assert pool.choose("s", exclude=[first]) is not first
    assert pool.choose("s", exclude=pool.replicas) is None
    single, _ = make_pool(URLS[:1])
    assert single.choose("s") is single.replicas[0] and single.choose("s", exclude=single.replicas) is None


# ------------------------------------------------------------------------------------------------------ 2. health

def test_2_1_eject_cuts_in_flight_connections_and_a_single_replica_is_never_ejected():
    pool, backends = make_pool(URLS[:2])
    r = pool.replicas[0]
    cut = []
    r.cuts.add(lambda: cut.append(1))
    pool.eject(r, "connection refused")
    assert not r.healthy and r.ejections == 1 and r.reason == "connection refused" and cut == [1]
    assert backends[r.url].forgotten == 1
    pool.eject(r, "again")  # already out: counted once
    assert r.ejections == 1
    single, _ = make_pool(URLS[:1])
    single.eject(single.replicas[0], "refused")
    assert single.replicas[0].healthy


def test_2_2_a_refused_probe_ejects_at_once_a_slow_one_after_three_in_a_row_and_a_later_one_brings_it_back():
    async def scenario():
        pool, backends = make_pool(URLS[:2])
        await pool.check()
        assert all(r.healthy for r in pool.replicas)
        r = pool.replicas[0]
        backends[URLS[0]].down = "slow"  # a busy CPU replica: two slow probes, then an answer, then two more
        for down in ("slow", "slow", False, "slow", "slow"):
            backends[URLS[0]].down = down
            await pool._probe_round()
            assert r.healthy
        await pool._probe_round()  # the third in a row
        assert not r.healthy and r.reason == "probe failed: ReadTimeout('') (3 in a row)"
        backends[URLS[0]].down = False
        r.next_probe = 0
        await pool._probe_round()
        assert r.healthy
        backends[URLS[0]].down = True  # refused: at once
        await pool._probe_round()
        assert not r.healthy and r.reason.startswith("probe failed")
        backends[URLS[0]].down = False
        r.next_probe = 0
        await pool._probe_round()
        assert r.healthy
        backends[URLS[0]].down = "slow"  # slow probes, but its calls still receive bytes: alive
        for _ in range(5):
            r.last_data = float("inf")
            await pool._probe_round()
        assert r.healthy and r.probe_failures == 0
        backends[URLS[0]].down = False
        r.next_probe = 0
        await pool._probe_round()
        assert r.healthy and r.reason is None and r.ejections == 2  # the two ejections above

    asyncio.run(scenario())


# ------------------------------------------------------------------------------------------------------ 3. agreement

@pytest.mark.parametrize("field, value", [("model", "other"), ("template", "u" * 16), ("version", "2"),
                                          ("kind", "sglang")])
def test_3_1_a_replica_that_differs_is_ejected_and_never_chosen(field, value):
    async def scenario():
        pool, backends = make_pool(URLS[:3])
        setattr(backends[URLS[2]], field, value)
        await pool.ready()
        bad = pool.replicas[2]
        assert not bad.healthy and bad.reason.startswith("mismatch")
        assert pool.identity == Identity("vllm", "m", "1", "t" * 16)
        assert all(pool.choose(f"s{i}") is not bad for i in range(200))
        setattr(backends[URLS[2]], field, getattr(FakeBackend(""), field))  # it is fixed: probed back in
        bad.next_probe = 0
        await pool._probe_round()
        assert bad.healthy

    asyncio.run(scenario())


def test_3_2_a_released_version_wins_over_the_majority_and_a_probe_sees_a_replica_published_apart():
    async def scenario():
        released = [None]
        pool, backends = make_pool(URLS[:3], released_version=lambda: released[0])
        await pool.check()
        backends[URLS[1]].version = "2"  # published alone, outside a release
        await pool._probe_round()
        assert not pool.replicas[1].healthy and "weight_version '2'" in pool.replicas[1].reason
        for b in backends.values():
            b.version = "3"
        backends[URLS[2]].version = "2"
        released[0] = "3"
        await pool.after_release()
        assert [r.healthy for r in pool.replicas] == [True, True, False]
        assert pool.identity.weight_version == "3"

    asyncio.run(scenario())


def test_3_3_no_judging_and_no_ejection_for_slow_probes_while_held():
    async def scenario():
        held, released = [False], [None]
        pool, backends = make_pool(URLS[:2], held=lambda: held[0], released_version=lambda: released[0])
        await pool.check()
        held[0] = True
        backends[URLS[0]].version = "2"  # mid-publication: replicas reload one after another
        backends[URLS[1]].down = "slow"  # paused by the publication
        for _ in range(4):
            await pool._probe_round()
        assert all(r.healthy for r in pool.replicas)
        held[0], released[0] = False, "2"
        backends[URLS[1]].version = "2"
        slow = backends[URLS[1]].info
        backends[URLS[1]].info = _slow_info  # the release's re-check: replica 1 does not answer in time
        await pool.after_release()
        assert all(r.healthy for r in pool.replicas) and pool.identity.weight_version == "2"
        assert pool.replicas[1].probe_failures == 1  # counted, not ejected: it was verified before
        backends[URLS[1]].info, backends[URLS[1]].down = slow, False
        await pool._probe_round()  # it answers "2": judged, agrees
        assert all(r.healthy for r in pool.replicas) and pool.replicas[1].probe_failures == 0

    asyncio.run(scenario())


# ------------------------------------------------------------------------------------------------------ 4. the list

def test_4_1_an_updated_list_keeps_the_replicas_that_stay_and_checks_new_ones():
    async def scenario():
        pool, backends = make_pool(URLS[:2])
        await pool.check()
        kept = pool.replicas[1]
        kept.served = 5
        pool.update([URLS[1], URLS[2]])
        assert pool.replicas[0] is kept and kept.served == 5 and kept.index == 0
        new = pool.replicas[1]
        assert not new.healthy and pool.choose("s") is kept  # never served before its check
        await pool._probe_round()
        assert new.healthy
        await pool.close()

    asyncio.run(scenario())


def test_4_2_an_upstream_file_is_re_read_when_it_changes(tmp_path):
    async def scenario():
        listing = tmp_path / "replicas.txt"
        listing.write_text(f"# the pool\n{URLS[0]}\n\n{URLS[1]}\n")
        pool, backends = make_pool(URLS[:2], source=str(listing))
        await pool.check()
        await pool._probe_round()  # unchanged: the same replicas
        assert [r.url for r in pool.replicas] == URLS[:2]
        listing.write_text(f"{URLS[1]}\n{URLS[2]}  # a new one\n")
        await pool._probe_round()  # re-read, then the new replica probed and checked
        assert [r.url for r in pool.replicas] == [URLS[1], URLS[2]] and all(r.healthy for r in pool.replicas)
        listing.write_text("# nothing left\n")  # a broken listing keeps the replicas as they were
        await pool._probe_round()
        assert [r.url for r in pool.replicas] == [URLS[1], URLS[2]]
        await pool.close()

    asyncio.run(scenario())
