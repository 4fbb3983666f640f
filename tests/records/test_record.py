"""The record schema, the writer's file rules and the reader's torn-tail reports (docs/records.md)."""

from __future__ import annotations

import json
import os

import msgpack
import pytest

from polar import records as rec

pytestmark = pytest.mark.unit


def make(i=0, **extra):
    r = {"v": 1, "id": rec.uuid7(), "session": f"s{i}", "prompt_token_ids": rec.pack_ids([1, 2, 3 + i]),
         "completion_token_ids": rec.pack_ids([]), "completion_logprobs": rec.pack_floats([])}
    r.update(extra)
    return r


def test_1_1_token_arrays_are_int32_and_float32_little_endian():
    assert rec.pack_ids([1, -2, 2**31 - 1]) == b"\x01\x00\x00\x00\xfe\xff\xff\xff\xff\xff\xff\x7f"
    assert rec.unpack_ids(rec.pack_ids([5, 6])) == [5, 6]
    assert rec.pack_ids(None) is None and rec.pack_ids([]) == b""
    assert rec.unpack_floats(rec.pack_floats([-0.5, 0.0])) == [-0.5, 0.0]


def test_1_2_uuid7_is_version_7_and_time_ordered():
    a = rec.uuid7()
    import time
    time.sleep(0.002)
    b = rec.uuid7()
    assert a[14] == "7" and b[14] == "7" and a < b


def test_1_3_reader_fills_missing_fields_keeps_unknown_ones_and_refuses_newer_versions(tmp_path):
    r = rec.normalize({"v": 1, "id": "x", "future_field": 42})
    assert r["future_field"] == 42 and r["session"] is None and set(rec.FIELDS) <= set(r)
    with pytest.raises(rec.SchemaError, match="newer"):
        rec.normalize({"v": rec.VERSION + 1})
    with pytest.raises(rec.SchemaError):
        rec.normalize({"id": "no version"})


def test_2_1_writer_names_files_per_process_and_renames_on_close(tmp_path):
    w = rec.FlowWriter(str(tmp_path), rotate_mb=64, min_free_mb=0)
    path = w.write(make())
    name = os.path.basename(path)
    assert name.startswith("flows-") and name.endswith(".msgpack.open") and f"-{os.getpid()}-0001" in name
    w.close()
    assert os.listdir(tmp_path) == [name[: -len(".open")]]


def test_2_2_rotation_closes_full_files(tmp_path):
    w = rec.FlowWriter(str(tmp_path), rotate_mb=200 / (1024 * 1024), min_free_mb=0)
    for i in range(10):
        w.write(make(i))
    w.close()
    files = rec.expand_inputs([str(tmp_path)])
    assert len(files) > 1 and all(f.endswith(".msgpack") for f in files)
    records = [r for f in files for _, r in rec.iter_file(f)]
    assert [r["session"] for r in records] == [f"s{i}" for i in range(10)]


def test_2_3_a_short_write_is_cut_back_and_the_writer_moves_to_a_new_file(tmp_path, monkeypatch):
    w = rec.FlowWriter(str(tmp_path), min_free_mb=0)
    first = w.write(make(0))
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, data[:5]))
    with pytest.raises(OSError, match="short write"):
        w.write(make(1))
    monkeypatch.setattr(os, "write", real_write)
    second = w.write(make(2))
    w.close()
    assert os.path.basename(second) != os.path.basename(first)
    scans = []
    sessions = []
    for f in rec.expand_inputs([str(tmp_path)]):
        scan = rec.FileScan(f)
        sessions += [r["session"] for _, r in rec.iter_file(f, scan)]
        scans.append(scan)
    assert sessions == ["s0", "s2"] and all(s.torn_tail is None for s in scans)


def test_2_4_low_disk_space_refuses(tmp_path):
    w = rec.FlowWriter(str(tmp_path), min_free_mb=1e12)
    with pytest.raises(rec.LowDiskSpace):
        w.check_space()
    rec.FlowWriter(str(tmp_path), min_free_mb=0).check_space()


def test_3_1_torn_tail_is_in_progress_in_open_files_and_an_error_in_closed_ones(tmp_path):
    blob = rec.pack(make(0)) + rec.pack(make(1))[:-3]
    for name, in_progress in (("flows-a.msgpack.open", True), ("flows-b.msgpack", False)):
        path = tmp_path / name
        path.write_bytes(blob)
        scan = rec.FileScan(str(path))
        got = list(rec.iter_file(str(path), scan))
        assert len(got) == 1 and got[0][0] == 0
        assert scan.torn_tail is not None and scan.torn_tail.in_progress is in_progress
        assert scan.torn_tail.offset == len(rec.pack(make(0)))


def test_3_2_read_at_offset_and_expand_inputs(tmp_path):
    w = rec.FlowWriter(str(tmp_path / "d"), min_free_mb=0)
    for i in range(3):
        w.write(make(i))
    w.close()
    [path] = rec.expand_inputs([str(tmp_path / "d" / "*.msgpack")])
    offsets = [off for off, _ in rec.iter_file(path)]
    assert rec.read_at(path, offsets[2])["session"] == "s2"
    with pytest.raises(FileNotFoundError):
        rec.expand_inputs([str(tmp_path / "missing")])


def test_3_3_inspector_prints_records_and_reports_torn_tails(tmp_path, capsys):
    path = tmp_path / "flows-x.msgpack.open"
    path.write_bytes(rec.pack(make(0)) + b"\x85\xa1")
    assert rec.main([str(path)]) == 0
    out = capsys.readouterr()
    assert '"session": "s0"' in out.out and "3 ids" in out.out and "in progress" in out.err


def test_3_4_garbage_is_reported_not_raised(tmp_path):
    path = tmp_path / "flows-g.msgpack"
    path.write_bytes(rec.pack(make(0)) + msgpack.packb([1, 2]) + b"\xc1\xc1")
    scan = rec.FileScan(str(path))
    list(rec.iter_file(str(path), scan, raw=True))
    assert scan.torn_tail is not None or scan.errors


# -- 4. the inspector and foreign files (issue 13 items 8, 10, 12) ---------------------------------------------------

@pytest.mark.parametrize("arg", ["missing", "empty_dir", "empty_dir/*.msgpack"])
def test_4_1_inspector_on_a_missing_path_or_no_flow_files_is_one_line_and_exit_2(tmp_path, capsys, arg):
    (tmp_path / "empty_dir").mkdir()
    assert rec.main([str(tmp_path / arg)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m polar.records: error: ") and str(tmp_path) in err


FOREIGN = {
    "text": b"hello, not msgpack\n",
    "msgpack_array": msgpack.packb([1, 2, 3]) + b"\xc1",
    "map_without_v": msgpack.packb({"id": "x", "session": "s"}),
    "map_with_text_v": msgpack.packb({"v": "1", "id": "x"}),
    "undecodable_map": b"\x81\xc1",
}


@pytest.mark.parametrize("name", FOREIGN)
def test_4_2_a_file_that_is_not_a_flow_file_has_one_wording(tmp_path, capsys, name):
    path = tmp_path / "flows-x.msgpack"
    path.write_bytes(FOREIGN[name])
    why = rec.sniff(str(path))
    assert why is not None and why.startswith(f"{path}: not a flow file (")
    with pytest.raises(rec.NotAFlowFile, match="not a flow file"):
        list(rec.iter_file(str(path)))
    assert rec.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"python -m polar.records: error: {why}\n"


@pytest.mark.parametrize("blob", [b"", rec.pack(make(0)), rec.pack(make(0))[:7], rec.pack({"v": rec.VERSION + 1})],
                         ids=["empty", "record", "torn_first_record", "newer_version"])
def test_4_3_flow_files_pass_the_sniff(tmp_path, blob):
    """A torn first record is a torn tail and a newer version the reader's 'upgrade' error, not a foreign file."""
    path = tmp_path / "flows-x.msgpack.open"
    path.write_bytes(blob)
    assert rec.sniff(str(path)) is None


def test_4_4_inspector_decodes_prompt_tail_ids_like_prompt_token_ids(tmp_path, capsys):
    parent = make(0, completion_token_ids=rec.pack_ids([4, 5]))
    child = make(1, prompt_token_ids=None, prompt_ref={"id": parent["id"], "len": 4},
                 prompt_tail_ids=rec.pack_ids([7, 8]))
    path = tmp_path / "flows-x.msgpack"
    path.write_bytes(rec.pack(parent) + rec.pack(child))
    assert rec.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert '"prompt_tail_ids": "2 ids: [7, 8]"' in out and '"prompt_token_ids": "6 ids: [1, 2, 3, 4, 7, 8]"' in out
    assert rec.main([str(path), "--full"]) == 0
    full = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert full[1]["prompt_tail_ids"] == [7, 8] and full[1]["prompt_token_ids"] == [1, 2, 3, 4, 7, 8]


# -- 5. building and validating a record -----------------------------------------------------------------------------


def test_5_1_new_record_and_validate():
    r = rec.new_record(id="x", session="s")
    assert set(r) == set(rec.FIELDS) and r["session"] == "s" and r["constrained"] is None
    rec.validate(r)
    with pytest.raises(ValueError, match="not record fields"):
        rec.new_record(sesion="s")
    for bad, match in [(dict(completion_token_ids=rec.pack_ids([1, 2]), completion_logprobs=rec.pack_floats([0.0])),
                        "one logprob"), (dict(completion_logprobs=rec.pack_floats([0.0])), "one logprob"),
                       (dict(prompt_token_ids=b"abc"), "4-byte"), (dict(error={"stage": "oops"}), "stage")]:
        with pytest.raises(ValueError, match=match):
            rec.validate(rec.new_record(**bad))


def test_5_2_weight_version_is_a_string_or_nil():
    assert rec.new_record()["weight_version"] is None
    rec.validate(rec.new_record(weight_version="step-3"))
    for bad in (3, 1.5, ["v1"], b"v1", True):
        with pytest.raises(ValueError, match="weight_version"):
            rec.validate(rec.new_record(weight_version=bad))


@pytest.mark.parametrize("chat,constrained", [
    ({"tool_choice": "required", "tools": [{}]}, True), ({"tool_choice": {"type": "function"}, "tools": [{}]}, True),
    ({"tool_choice": "required"}, False), ({"tool_choice": "required", "tools": []}, False),
    ({"response_format": {"type": "json_schema"}}, True), ({"response_format": {"type": "json_object"}}, False),
    ({"tool_choice": "auto"}, False), ({}, False), (None, False),
])
def test_5_2_is_constrained_is_the_one_rule(chat, constrained):
    assert rec.is_constrained(chat) is constrained

