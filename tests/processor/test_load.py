"""Scenarios for processor/load.py: index pass, torn tails, open files, versions, unknown fields."""

import os

import msgpack
import pytest

from polar import records as rec
from polar.processor.load import InputError, RecordSource, build_index
from tests.processor.synth import session_records, write_flows

pytestmark = pytest.mark.unit


def test_1_1_index_reads_every_file_in_name_order_and_groups_sessions(tmp_path):
    recs = session_records("a", ["turn", "turn", "side"]) + session_records(None, ["turn"], seed=3)
    files = write_flows(str(tmp_path), recs, per_file=2)
    index = build_index([str(tmp_path)])
    assert index.files == files and len(index.entries) == len(recs)
    groups = index.sessions()
    assert set(groups) == {"a", None} and len(groups["a"]) == 3
    src = RecordSource(index.files)
    loaded = src.load(groups["a"])
    assert [r["id"] for _, r in loaded] == [r["id"] for r in recs[:3]]
    src.close()


def test_1_2_torn_tail_in_closed_file_is_an_error_reported_in_open_file_in_progress(tmp_path):
    recs = session_records("a", ["turn", "turn"])
    (path,) = write_flows(str(tmp_path), recs)
    with open(path, "ab") as fh:
        fh.write(rec.pack(recs[0])[:10])
    open_path = path.replace(".msgpack", "-b.msgpack.open")
    with open(open_path, "wb") as fh:
        fh.write(rec.pack(recs[1])[:-3])
    index = build_index([str(tmp_path)])
    tails = {os.path.basename(t.file): t for t in index.torn_tails}
    assert len(index.entries) == 2
    assert not tails[os.path.basename(path)].in_progress and tails[os.path.basename(open_path)].in_progress
    assert index.open_files == [open_path]


def test_1_3_newer_schema_version_is_a_clear_error(tmp_path):
    r = session_records("a", ["turn"])[0]
    r["v"] = rec.VERSION + 1
    write_flows(str(tmp_path), [r])
    with pytest.raises(InputError, match="newer than this reader"):
        build_index([str(tmp_path)])


def test_1_4_unknown_fields_are_tolerated_and_missing_fields_filled(tmp_path):
    r = session_records("a", ["turn"])[0]
    r["future_field"] = {"x": 1}
    del r["weight_versions"]
    write_flows(str(tmp_path), [r])
    index = build_index([str(tmp_path)])
    got = RecordSource(index.files).read(index.entries[0])
    assert got["future_field"] == {"x": 1} and got["weight_versions"] is None


def test_1_5_missing_input_is_an_error(tmp_path):
    with pytest.raises(InputError):
        build_index([str(tmp_path / "nope")])


def test_1_6_garbage_after_records_is_a_reported_torn_tail(tmp_path):
    (path,) = write_flows(str(tmp_path), session_records("a", ["turn"]))
    with open(path, "ab") as fh:
        fh.write(msgpack.packb([1, 2, 3]) + b"\xc1\xc1")
    index = build_index([path])
    assert len(index.entries) == 1 and index.torn_tails[0].offset == index.entries[0].length


@pytest.mark.parametrize("blob", [msgpack.packb([1, 2, 3]) + b"\xc1\xc1", b"hello, not msgpack\n",
                                  msgpack.packb({"id": "no version"}), msgpack.packb({"v": "1"})],
                         ids=["msgpack_array", "text", "map_without_v", "map_with_text_v"])
def test_1_7_a_file_that_is_not_a_flow_file_is_an_error_in_the_record_readers_wording(tmp_path, blob):
    p = tmp_path / "flows-x.msgpack"
    p.write_bytes(blob)
    with pytest.raises(InputError) as exc:
        build_index([str(p)])
    assert str(exc.value) == rec.sniff(str(p)) and "not a flow file" in str(exc.value)


def test_9_1_integer_stop_reason_is_indexed_as_text(tmp_path):
    """vLLM reports a matched stop token id as an int stop_reason; the Utf8 index columns must take it."""
    from polar import records as rec
    from polar.processor import cli

    w = rec.FlowWriter(str(tmp_path / "flows"), min_free_mb=0)
    w.write({"v": 1, "id": rec.uuid7(), "session": "s", "t_start": 1.0, "protocol": "openai_chat",
             "prompt_token_ids": rec.pack_ids([1, 2]), "completion_token_ids": rec.pack_ids([5, 9]),
             "completion_logprobs": rec.pack_floats([-0.1, -0.2]), "finish_reason": "stop", "stop_reason": 9,
             "upstream_request": b'{"messages": [{"role": "user", "content": "hi"}]}',
             "assistant": {"content": "x", "reasoning": None, "tool_calls": []}})
    w.close()
    assert cli.main([str(tmp_path / "flows"), "-o", str(tmp_path / "out"), "--eot-token-id", "2",
                     "--no-progress"]) == 0
    import polars as pl
    calls = pl.read_parquet(tmp_path / "out" / "calls.parquet")
    assert calls["stop_reason"].to_list() == ["9"]
