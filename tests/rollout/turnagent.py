"""The python: agent of the turn-state tests (`--agent python:turnagent:run`), copied into each test task's agent/:
four calls of one conversation through the proxy (the official openai SDK), acting between them.

  steps        after call 2 writes half.txt, after call 4 done.txt: call 2's action does half the work, call 4's the
               rest (the states at calls 1-4 hold 0, 0, ½, ½ of it; the final state all)
  background   after call 1 starts a writer in the background that writes bg.txt a second later, makes call 2 at
               once, waits two seconds, then calls 3 and 4, and writes done.txt
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import time


def run(instruction: str, workdir: str, env: dict) -> int:
    import openai

    app = pathlib.Path(workdir)
    mode = instruction.strip().splitlines()[0].split(":", 1)[1].strip()
    client = openai.OpenAI(api_key="sk-polar-dummy", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": instruction}]
    for call in range(1, 5):
        if mode == "background" and call == 3:
            time.sleep(2.0)
        reply = client.chat.completions.create(model="polar-test", max_tokens=16, messages=messages)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                     {"role": "user", "content": f"Step {call} is done; go on."}]
        if mode == "steps" and call == 2:
            (app / "half.txt").write_text("half\n")
        if mode == "background" and call == 1:
            subprocess.Popen([sys.executable, "-c", "import pathlib, sys, time; time.sleep(1.0); "
                              "pathlib.Path(sys.argv[1]).write_text('bg\\n')", str(app / "bg.txt")])
    (app / "done.txt").write_text("done\n")
    return 0
