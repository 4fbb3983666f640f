"""The recorder owns the record: every field present, written once, `seal` refuses to let a lost record pass as a
success (no sockets)."""

from __future__ import annotations

import pytest

from polar import records as rec
from polar.addon.codecs.base import GatewayError
from polar.addon.recorder import Recorder, RecordLost

pytestmark = pytest.mark.unit


class _Writer:
    def __init__(self, fail: bool = False):
        self.records, self.fail = [], fail

    def write(self, record: dict) -> str:
        if self.fail:
            raise OSError("disk full")
        self.records.append(dict(record))
        return "f"


def test_1_1_a_new_record_has_every_field_and_seal_writes_it_once():
    w = _Writer()
    r = Recorder(w, id="a", protocol="openai_chat")
    assert set(r.record) == set(rec.FIELDS) and r.record["v"] == rec.VERSION and r.record["normalizations"] == []
    r.note("x")
    r.seal()
    r.seal()
    r.close()
    assert len(w.records) == 1 and w.records[0]["normalizations"] == ["x"] and w.records[0]["t_end"] is not None


def test_1_2_only_record_fields_can_be_set():
    r = Recorder(_Writer(), id="a")
    with pytest.raises(ValueError):
        r.set(sesion="typo")
    with pytest.raises(ValueError):
        Recorder(_Writer(), ident="a")


def test_1_3_a_lost_record_raises_at_seal_so_no_success_is_sent():
    r = Recorder(_Writer(fail=True), id="a")
    with pytest.raises(RecordLost, match="disk full"):
        r.seal()
    r.close()  # the call's end: nothing more to do, nothing raised


def test_1_4_the_first_error_stays():
    r = Recorder(_Writer(), id="a")
    r.error("backend_connect", GatewayError("unavailable", "down"), None)
    r.error("client_abort", GatewayError("unavailable", "gone"), None)
    assert r.has_error and r.record["error"]["stage"] == "backend_connect"


def test_1_5_an_invalid_record_is_not_written():
    w = _Writer()
    r = Recorder(w, id="a", completion_token_ids=rec.pack_ids([1, 2]), completion_logprobs=rec.pack_floats([0.1]))
    with pytest.raises(RecordLost, match="one logprob per completion token"):
        r.seal()
    assert w.records == []
