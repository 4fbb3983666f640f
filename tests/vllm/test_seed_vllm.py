"""Per-call sampler seeds (`polar_sampling_override=...,seed_per_call=S`) on a real vLLM (the tiny model, CPU build),
through the real proxy with the OpenAI SDK at temperature 1.0:

1  one session sending one prompt twice draws the same tokens, with the same seed recorded in `sampling.seed`;
2  another session (another sample of the same prompt) gets another seed and other tokens;
3  the same two sessions under `seed=S` (one seed for every call) draw the same tokens: why polar-train seeds per call.
"""

from __future__ import annotations

import pytest

from polar import records as rec
from tests.support.gateway import start_gateway
from tests.support.sdk import openai_sdk
from tests.support.vllm_server import shared_vllm

pytestmark = pytest.mark.vllm

PROMPT = [{"role": "user", "content": "Write a train timetable."}]


def _draw(gw, session: str) -> tuple[list[int], int]:
    client = openai_sdk(gw, session, api_key="sk", timeout=300)
    client.chat.completions.create(model="gpt-4o", messages=PROMPT, max_tokens=16)
    last = [r for r in gw.records() if r["session"] == session][-1]
    return rec.unpack_ids(last["completion_token_ids"]), last["sampling"]["seed"]


def _gateway(tmp_path, override: str):
    server = shared_vllm("tiny")
    return start_gateway(server.base_url, str(tmp_path / "run"), str(tmp_path / "flows"),
                         sets=[f"polar_sampling_override=temperature=1.0,top_p=1.0,top_k=-1,{override}"])


def test_1_2_a_session_draws_again_what_it_drew_and_another_session_differs(tmp_path):
    with _gateway(tmp_path, "seed_per_call=5") as gw:
        first, seed = _draw(gw, "run-task-0")
        again, seed_again = _draw(gw, "run-task-0")
        other, other_seed = _draw(gw, "run-task-1")
    assert len(first) == 16 and seed_again == seed and again == first
    assert other_seed != seed and other != first


def test_3_one_seed_for_every_call_makes_the_samples_copies(tmp_path):
    with _gateway(tmp_path, "seed=5") as gw:
        a, seed_a = _draw(gw, "run-task-0")
        b, seed_b = _draw(gw, "run-task-1")
    assert seed_a == seed_b == 5 and a == b
