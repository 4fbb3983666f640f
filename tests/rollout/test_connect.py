"""--connect base-url (docs/options.md#base-url-mode): the agent's provider base URL is the sandbox relay's address,
no proxy and no CA; the relay stamps the sample's session on each request as in proxy mode.

1.1  two bwrap samples (the second warm): each agent finds OPENAI_BASE_URL at the relay and no proxy variable, its
     call is recorded under its own session (proxy credentials first, `connect` base_url), and the request it
     sends under the other sample's session (`/s/<that session>/` in its path) gets the protocol's 400 and reaches
     neither the backend nor a record
1.2  the refusals: the CLIs that do not honour a base-URL variable (pi, codex) and a bad value, one line each
"""

from __future__ import annotations

import json

import pytest

from polar import records as rec
from tests.rollout.rollout_support import AGENT, explain, latest, make_task, results, rollout
from tests.support.need import need_sandbox

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_1_1_base_url_samples_are_recorded_under_their_own_session_and_cannot_claim_another(tmp_path, upstream,
                                                                                          warm):
    need_sandbox("bwrap")
    tasks, run = tmp_path / "tasks", tmp_path / "run"
    make_task(tasks, "bu", "base-url")
    proc = rollout(str(tasks), "--agent", AGENT, "--out", str(run), "--sandbox", "bwrap", "--upstream",
                   upstream.base_url, "--parallel", "1", "--skip-preflight", "--no-process", "--samples", "2",
                   "--connect", "base-url", "--run-id", "b1", *(["--warm-agents"] if warm else []),
                   # exact mode (the default) would send its probe call to the upstream too: a third chat request
                   "--proxy-set", "polar_exact=false")
    assert proc.returncode == 0, explain(proc)
    final = latest(results(run))
    flows = [r for path in rec.expand_inputs([str(run / "flows")]) for _, r in rec.iter_file(path)]
    for k in (0, 1):
        line = final[("bu", k)]
        assert (line["status"], line["reward"], line["calls"]) == ("completed", 1.0, 1), line
        out = (run / "samples" / "bu" / str(k) / "0" / "agent.stdout").read_text().strip().splitlines()[-1]
        seen = json.loads(out)
        assert seen["proxies"] == [] and seen["base_url"].startswith("http://127.0.0.1:"), seen
        assert seen["base_url"].endswith("/openai/v1"), seen
        assert seen["spoofed"] == f"b1/bu/{1 - k}/0"
        status, body = seen["spoof"]
        assert status == 400 and json.loads(body)["error"]["type"] == "invalid_request_error", seen
        assert f"b1/bu/{1 - k}/0" in json.loads(body)["error"]["message"]
        mine = [r for r in flows if r["session"] == f"b1/bu/{k}/0"]
        assert [(r["connect"], r["session_source"], r["host"], r["path"]) for r in mine] == [
            ("base_url", "proxy_auth", "api.openai.com", "/v1/chat/completions")], mine
    assert len(flows) == 2 and len(upstream.chat_requests) == 2
    assert all(r.body["messages"] == [{"role": "user", "content": "What is six times seven?"}]
               for r in upstream.chat_requests)


@pytest.mark.parametrize("extra, words", [
    (["--agent", "pi", "--connect", "base-url"], "pi reads its base URL from its models.json"),
    (["--agent", "codex", "--connect", "base-url"], "codex 0.171 sends nothing to OPENAI_BASE_URL"),
    (["--agent", AGENT, "--connect", "tunnel"], "invalid choice"),
])
def test_1_2_connect_refusals(tmp_path, upstream, extra, words):
    tasks = tmp_path / "tasks"
    make_task(tasks, "bu", "base-url")
    proc = rollout(str(tasks), *extra, "--out", str(tmp_path / "run"), "--sandbox", "bwrap", "--upstream",
                   upstream.base_url, "--skip-preflight")
    assert proc.returncode == 2 and words in proc.stderr, explain(proc)
