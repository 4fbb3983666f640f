"""polar.launch.runfiles: the run files round-trip through their typed objects, keep the contract's keys (the first
proxy at the top level, all of them under `proxies`), are written atomically, and reading says what is wrong."""

from __future__ import annotations

import json

import pytest

from polar.launch import paths
from polar.launch.runfiles import ProxyEntry, ProxyRunFile, RunFileError, VllmRunFile, remove

pytestmark = pytest.mark.unit

FLEET = ProxyRunFile(
    proxies=(ProxyEntry(pid=101, port=4001, log="/r/proxy-4001.log", control_url="http://127.0.0.1:5001",
                        control_token="/c/control-token"),
             ProxyEntry(pid=102, port=4002, log="/r/proxy-4002.log", control_url="http://127.0.0.1:5002",
                        control_token="/c/control-token")),
    listen_host="127.0.0.1", upstream="http://127.0.0.1:8000/v1", flows="/f", ca_pem="/c/mitmproxy-ca-cert.pem",
    ca_bundle="/r/ca-bundle-0123456789abcdef.pem", confdir="/c")


def test_1_1_a_fleet_round_trips_and_keeps_the_contract_keys(tmp_path):
    path = paths.proxy_run_file(tmp_path)
    FLEET.write(path)
    assert ProxyRunFile.read(path) == FLEET
    doc = json.loads(path.read_text())
    assert set(doc) == {"pid", "port", "log", "control_url", "control_token", "listen_host", "upstream", "flows",
                        "ca_pem", "ca_bundle", "confdir", "proxies"}
    assert (doc["pid"], doc["port"]) == (101, 4001)  # single-proxy readers find proxy 0 at the top level
    assert [p["port"] for p in doc["proxies"]] == [4001, 4002]
    assert [p.name for p in tmp_path.iterdir()] == ["proxy.json"]  # no temporary left behind


def test_1_2_a_single_proxy_file_without_a_list_reads_as_one_proxy(tmp_path):
    path = tmp_path / "proxy.json"
    path.write_text(json.dumps({"pid": 7, "port": 8, "ca_pem": "c", "ca_bundle": "b"}))
    state = ProxyRunFile.read(path)
    assert state.proxies == (ProxyEntry(pid=7, port=8),) and (state.pid, state.port) == (7, 8)
    assert (state.ca_pem, state.ca_bundle, state.flows, state.listen_host) == ("c", "b", None, "127.0.0.1")


@pytest.mark.parametrize("text,needle", [
    ("{not json", "proxy.json"),
    ("[1, 2]", "not a proxy run file"),
    ('{"pid": "7", "port": 8}', "pid must be an integer"),
    ('{"pid": 7, "port": 8, "proxies": {"a": 1}}', "proxies must be a list"),
])
def test_1_3_what_is_not_a_run_file_says_so(tmp_path, text, needle):
    path = tmp_path / "proxy.json"
    path.write_text(text)
    with pytest.raises(RunFileError, match=needle):
        ProxyRunFile.read(path)


def test_1_4_no_file_is_none_and_remove_says_whether_there_was_one(tmp_path):
    with pytest.raises(RunFileError, match="at least one proxy"):
        ProxyRunFile(proxies=())
    path = tmp_path / "proxy.json"
    assert ProxyRunFile.read(path) is None and VllmRunFile.read(tmp_path / "vllm.json") is None
    FLEET.write(path)
    assert remove(path) is True and remove(path) is False


def test_1_5_a_rewrite_replaces_the_file_whole(tmp_path):
    path = tmp_path / "run" / "proxy.json"  # the directory is made
    FLEET.write(path)
    one = FLEET.replace(proxies=FLEET.proxies[:1])
    one.write(path)
    assert ProxyRunFile.read(path) == one and len(json.loads(path.read_text())["proxies"]) == 1


def test_2_1_a_vllm_run_file_round_trips(tmp_path):
    info = VllmRunFile(pid=5, port=8001, base_url="http://127.0.0.1:8001/v1", model="tiny", model_dir="/m/tiny",
                       max_model_len=4096, logprobs_mode="processed_logprobs", dtype="bfloat16", dev=True,
                       weights_dir="/w/step-1", weight_version="step-1", start_args=("--model", "tiny"),
                       log="/r/vllm.log", venv="/v")
    path = paths.vllm_run_file(tmp_path)
    info.write(path)
    assert VllmRunFile.read(path) == info
    assert json.loads(path.read_text())["start_args"] == ["--model", "tiny"]
