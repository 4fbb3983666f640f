"""Per-call sampler seeds (`polar_sampling_override=...,seed_per_call=S`) on a real vLLM (the tiny model, CPU build),
through the real proxy with the OpenAI SDK at temperature 1.0:

1  one session sending one prompt twice draws the same tokens, with the same seed recorded in `sampling.seed`;
2  another session (another sample of the same prompt) gets another seed and other tokens;
3  the same two sessions under `seed=S` (one seed for every call) draw the same tokens: why polar-train seeds per call;
4  seeded calls whose prompts are longer than vLLM's default step budget (2,048 tokens, which chunks a prefill) are
   served, twice alike, and the server stays healthy: vLLM 0.32 on CPU kills its engine on the first chunked seeded
   prefill ("CPU Generator does not use offset"), so polar.launch starts a CPU build with whole-prompt prefill.
"""

from __future__ import annotations

import pytest

from polar import records as rec
from polar.launch.vllm import healthy
from tests.support.gateway import start_gateway
from tests.support.sdk import openai_sdk
from tests.support.vllm_server import shared_vllm

pytestmark = pytest.mark.vllm

PROMPT = [{"role": "user", "content": "Write a train timetable."}]


def _draw(gw, session: str, prompt: list[dict] = PROMPT) -> tuple[list[int], int]:
    client = openai_sdk(gw, session, api_key="sk", timeout=300)
    client.chat.completions.create(model="gpt-4o", messages=prompt, max_tokens=16)
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


def test_4_a_seeded_prompt_longer_than_a_prefill_chunk_is_served(tmp_path):
    long_prompt = [{"role": "user", "content": " ".join(f"line {i}: the timetable of train {i % 97}." for i in range(700))}]
    with _gateway(tmp_path, "seed_per_call=5") as gw:
        first, seed = _draw(gw, "run-task-0", long_prompt)
        again, seed_again = _draw(gw, "run-task-0", long_prompt)
        prompt_len = gw.records()[-1]["usage"]["prompt_tokens"]
    assert prompt_len > 2 * 2048, prompt_len  # more than one default chunk: the path that killed the engine
    assert len(first) == 16 and seed_again == seed and again == first
    assert healthy(int(shared_vllm("tiny").base_url.rsplit(":", 1)[1].split("/")[0]))
