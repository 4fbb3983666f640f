import json, pytest
from tests.e2e.conftest import *
from tests.support.scripted_upstream import Reply
import os
H = os.environ["J_H"]; P = os.environ.get("J_P")
@pytest.mark.e2e
def test_dbg(gateway, main_script, agents):
    calls = json.loads(os.environ["J_CALLS"])
    main_script(*[Reply(reasoning="I will run it.", tool_calls=[tuple(c)]) for c in calls], Reply(text="Final polar answer."))
    run = agents.run(H, "Run a shell command and tell me what it printed.", provider=P, model=os.environ.get("J_M"))
    print(run.explain())
    for i, r in enumerate(main_script.upstream.requests):
        b = r.body
        if not b or "messages" not in b or not r.path.endswith("/chat/completions"): continue
        print("=== req", i, r.headers.get("user-agent"), b.get("chat_template_kwargs"), "side" if is_side_call(b) else "main", "tools", len(b.get("tools") or []), "rf", bool(b.get("response_format")))
        for m in b["messages"][-4:]:
            print("   ", m.get("role"), json.dumps({k: v for k, v in m.items() if k != "role"})[:400])
    for r in gateway.records():
        print(r["path"], r["session"], r["session_source"], r["error"], r["normalizations"])
