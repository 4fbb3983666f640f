"""ASCII ids (record v3): prompt ids kept as the backend's digits in a msgpack ExtType, and every reader of them
(docs/records.md, Token ids)."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from polar import records as rec
from polar.processor.normalize import ids_view

pytestmark = pytest.mark.unit


def make(i=0, **extra):
    r = {"v": rec.VERSION, "id": rec.uuid7(), "session": "s", "prompt_token_ids": rec.pack_ids([1, 2, 3 + i]),
         "completion_token_ids": rec.pack_ids([]), "completion_logprobs": rec.pack_floats([])}
    r.update(extra)
    return r


# -- 1. the encoding and its readers --------------------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**31 - 1), max_size=300))
def test_1_1_ascii_ids_read_back_as_the_same_ids_through_every_reader(ids):
    ext = rec.ascii_ids(",".join(map(str, ids)).encode())
    assert rec.unpack_ids(ext) == ids and rec.id_count(ext) == len(ids)
    assert rec.ids_blob(ext) == rec.pack_ids(ids)
    assert ids_view(ext).tolist() == ids and ids_view(ext).dtype == np.dtype("<i4")
    r = rec.new_record(id=rec.uuid7(), prompt_token_ids=ext, completion_token_ids=rec.pack_ids([1]),
                       completion_logprobs=rec.pack_floats([-0.1]))
    rec.validate(r)
    back = rec.normalize(msgpack.unpackb(rec.pack(r), raw=False))
    assert back["prompt_token_ids"] == ext and rec.unpack_ids(back["prompt_token_ids"]) == ids


def test_1_2_on_disk_they_are_an_ext_never_bin_so_a_reader_of_int32_blobs_cannot_misread_them():
    packed = msgpack.packb(rec.ascii_ids(b"1,22,333"), use_bin_type=True)
    assert packed[0] in (0xC7, 0xC8, 0xC9) or 0xD4 <= packed[0] <= 0xD8  # ext family
    assert msgpack.unpackb(packed) == msgpack.ExtType(rec.ASCII_IDS, b"1,22,333")
    assert rec.VERSION >= 3 and rec.version_problem(rec.VERSION + 1) is not None


@pytest.mark.parametrize("digits", [b"1,,2", b",1", b"1,", b"1, 2", b"1;2", b"-1", b"1.0", b"x", b"[1]"])
def test_1_3_malformed_ascii_ids_are_refused_by_every_reader_never_read_wrong(digits):
    ext = rec.ascii_ids(digits)
    assert not rec.is_ascii_ids(digits)
    for read in (rec.unpack_ids, rec.ids_blob, ids_view):
        with pytest.raises(ValueError):
            read(ext)
    r = rec.new_record(id="x", prompt_token_ids=ext)
    with pytest.raises(ValueError, match="ASCII ids"):
        rec.validate(r)


def test_1_4_an_id_past_int32_or_an_unknown_ext_is_an_error():
    for value in (rec.ascii_ids(b"1,2147483648"), msgpack.ExtType(9, b"1,2")):
        for read in (rec.unpack_ids, rec.ids_blob, ids_view):
            with pytest.raises(ValueError):
                read(value)
    assert rec.unpack_ids(rec.ascii_ids(b"2147483647,0")) == [2**31 - 1, 0]
    # only the prompt's fields may be ASCII
    with pytest.raises(ValueError, match="4-byte"):
        rec.validate(rec.new_record(id="x", completion_token_ids=rec.ascii_ids(b"1")))


# -- 2. compact prompts ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("parent_ascii, tail_ascii", [(True, False), (False, True), (True, True), (False, False)])
def test_2_1_a_compact_child_resolves_whatever_the_encodings_of_its_parent_and_tail(parent_ascii, tail_ascii):
    def enc(ids, ascii):
        return rec.ascii_ids(",".join(map(str, ids)).encode()) if ascii else rec.pack_ids(ids)
    parent = make(0, prompt_token_ids=enc([1, 2, 3], parent_ascii), completion_token_ids=rec.pack_ids([4, 5]))
    child = make(1, prompt_token_ids=None, prompt_ref={"id": parent["id"], "len": 4},
                 prompt_tail_ids=enc([9, 10], tail_ascii))
    resolver = rec.PromptResolver()
    resolver.resolve(parent)
    resolver.resolve(child)
    assert rec.unpack_ids(child["prompt_token_ids"]) == [1, 2, 3, 4, 9, 10] and resolver.unresolved == []
    bad = make(2, prompt_token_ids=None, prompt_ref={"id": parent["id"], "len": 4},
               prompt_tail_ids=rec.ascii_ids(b"9,,10"))
    resolver.resolve(bad)
    assert bad["prompt_token_ids"] is None and resolver.unresolved == [bad["id"]]  # undecodable: unresolved
