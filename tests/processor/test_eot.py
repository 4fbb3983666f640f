"""Scenarios for processor/eot.py: rule 5's sources, in order."""

import json

import pytest

from polar.processor import eot
from polar.processor.load import IndexEntry

pytestmark = pytest.mark.unit


def entry(model="m", finish="stop", last=2, stop_reason=None):
    return IndexEntry("s", 0.0, "id", 0, 0, 1, model, finish, stop_reason, last, last is not None)


def test_1_1_option_wins_over_everything():
    t = eot.resolve([entry(last=7)], [5, 6], [])
    assert t.get("m") == {5, 6} and t.get("other") == {5, 6}


def test_1_2_tokenizer_dir_reads_generation_config_and_tokenizer_config(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 8]}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "added_tokens_decoder": {"9": {"content": "<|im_end|>"}}}))
    assert eot.tokenizer_eot(str(tmp_path)) == {7, 8, 9}
    t = eot.resolve([entry()], [], [f"m={tmp_path}"])
    assert t.get("m") == {7, 8, 9} and t.get("x") is None


def test_1_3_evidence_per_model_and_disagreement_is_an_error():
    t = eot.resolve([entry(last=2), entry(finish="length", last=9), entry(stop_reason="</s>", last=9)], [], [])
    assert t.get("m") == {2} and "evidence" in t.source["m"]
    with pytest.raises(eot.EotError, match="disagrees"):
        eot.resolve([entry(last=2), entry(finish="tool_calls", last=3)], [], [])


def test_1_4_missing_names_models_without_a_source():
    t = eot.resolve([entry(finish="length", last=9)], [], [])
    assert eot.missing(t, [entry(finish="length", last=9)]) == ["m"]


def test_1_5_tokenizer_dir_without_eos_is_an_error(tmp_path):
    with pytest.raises(eot.EotError):
        eot.tokenizer_eot(str(tmp_path))
