"""scripts/lib/bench_stub.py — the benchmark's stub backend speaks vLLM's wire format exactly (docs/field-notes.md,
vLLM).

Its precomputed JSON and SSE answers, read by the gateway's own StreamReader, give back the prompt ids, completion
ids, logprobs and usage it was built with, so the benchmark measures the real gateway path.
"""

from __future__ import annotations

import orjson
import pytest

from polar.addon.stream_reader import StreamReader
from tests.support.scripts import load_script

pytestmark = pytest.mark.unit


def load_stub():
    return load_script("scripts/lib/bench_stub.py", "bench_stub")


def dechunk(body: bytes) -> bytes:
    out, rest = [], body
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return b"".join(out)
        out.append(rest[:size])
        rest = rest[size + 2:]


@pytest.mark.parametrize("split", [1, 7, 1000, 10 ** 9])
def test_1_1_stream_reads_back_as_the_precomputed_tokens(split):
    stub = load_stub()
    canned = stub.Canned(list(range(50, 90)), 12, 4096, "0.11.1")
    stream = dechunk(canned.stream_all)
    reader = StreamReader(keep_logprob_entries=False)
    for i in range(0, len(stream), split):
        reader.feed(stream[i:i + split])
    assert reader.done and reader.finish_reason == "stop"
    assert reader.prompt_token_ids == list(range(50, 90))
    assert reader.completion_token_ids == canned.ids and canned.ids[-1] == 151645
    assert reader.logprobs == pytest.approx(canned.logprobs, abs=1e-6)
    c = reader.completion()
    assert (c.prompt_tokens, c.completion_tokens, c.content) == (40, 12, "".join(canned.pieces))


def test_1_2_json_and_side_endpoints():
    stub = load_stub()
    canned = stub.Canned([1, 2, 3], 4, 4096, "0.11.1")
    doc = orjson.loads(canned.json_body)
    assert doc["prompt_token_ids"] == [1, 2, 3] and doc["choices"][0]["token_ids"] == canned.ids
    assert len(doc["choices"][0]["logprobs"]["content"]) == 4 and doc["usage"]["completion_tokens"] == 4
    assert orjson.loads(canned.models_body)["data"][0]["max_model_len"] == 4096
    assert orjson.loads(canned.tokenize_body) == {"count": 3, "max_model_len": 4096, "tokens": [1, 2, 3],
                                                  "token_strs": None}
