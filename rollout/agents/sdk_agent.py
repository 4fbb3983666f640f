"""An SDK agent for `polar-rollout --agent python:polar.rollout.sdk_agent:run` — the demo's agent.

One two-turn tool session with an official SDK (Anthropic, OpenAI Chat, OpenAI Responses or Google GenAI, by
`POLAR_SDK_PROTOCOL`, else sample k mod 4), through HTTPS_PROXY exactly like any agent: turn 1 forces a call of its
one tool, `write_file(path, content)`, which it runs in the workdir; turn 2 answers with tool calls off (streamed).
What the model writes is what the task's verifier scores. Runs inside the sandbox (standard library + the SDKs).

`python:polar.rollout.sdk_agent:answer` is the one-turn variant for answer tasks (vowel-share, polar-train's CI task):
one streamed, unconstrained call, no tools; the reply's text is written to `answer.txt` in the workdir. Every sampled
token is free text, so even a random policy's samples differ and a group gets a reward spread.

`python:polar.rollout.sdk_agent:steps` is the multi-call variant for families of steps (digit-steps): STEPS calls in
one conversation (OpenAI Chat or Anthropic Messages, by `POLAR_SDK_PROTOCOL`, else sample k mod 2), reply N written to
`noteN.txt` before call N+1 — so the working directory at each call is the state the replies before it left, which
`polar-rollout --turn-states` snapshots and `polar-process --credit turn` credits call by call.
"""

from __future__ import annotations

import json
import os

from polar.records.protocols import PROTOCOLS  # a standard-library leaf, bound into the sandbox beside this file

TOOL_NAME = "write_file"
TOOL_DESC = "Write a text file in the current directory (the task's workdir)."
TOOL_SCHEMA = {"type": "object", "properties": {
    "path": {"type": "string", "description": "file name, relative to the workdir"},
    "content": {"type": "string", "description": "the whole file"}}, "required": ["path", "content"]}
# What a warm slot's zygote imports once (rollout/sandbox/warm.py): the SDKs, imported lazily per protocol otherwise.
POLAR_PRELOAD = ("anthropic", "openai", "google.genai")


def run_tool(workdir: str, arguments) -> str:
    """Write the file (inside the workdir only); the tool's answer as JSON text."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            arguments = {}
    arguments = arguments if isinstance(arguments, dict) else {}
    path = os.path.normpath(os.path.join(workdir, str(arguments.get("path") or "output.txt")))
    if not path.startswith(os.path.abspath(workdir) + os.sep):
        return json.dumps({"error": "path outside the workdir"})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(str(arguments.get("content") or ""))
    return json.dumps({"written": os.path.relpath(path, workdir)})


def anthropic_session(question: str, workdir: str) -> str:
    import anthropic

    client = anthropic.Anthropic(api_key="sk-demo-not-a-real-key")
    tools = [{"name": TOOL_NAME, "description": TOOL_DESC, "input_schema": TOOL_SCHEMA}]
    messages = [{"role": "user", "content": question}]
    first = client.messages.create(model="claude-demo", max_tokens=128, tools=tools, tool_choice={"type": "any"},
                                   messages=messages)
    calls = [b for b in first.content if b.type == "tool_use"]
    call = calls[0]
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": c.id, "content": run_tool(workdir, c.input)}
                                              for c in calls]}]
    with client.messages.stream(model="claude-demo", max_tokens=48, tools=tools, tool_choice={"type": "none"},
                                messages=messages) as stream:
        final = stream.get_final_message()
    return f"{len(calls)} call(s), {call.name}({json.dumps(call.input)}) → answer: {''.join(b.text for b in final.content if b.type == 'text')!r}"


def openai_chat_session(question: str, workdir: str) -> str:
    import openai

    client = openai.OpenAI(api_key="sk-demo-not-a-real-key")
    tools = [{"type": "function", "function": {"name": TOOL_NAME, "description": TOOL_DESC, "parameters": TOOL_SCHEMA}}]
    messages = [{"role": "user", "content": question}]
    first = client.chat.completions.create(model="gpt-demo", max_tokens=128, tools=tools, tool_choice="required",
                                           messages=messages)
    msg = first.choices[0].message
    call = msg.tool_calls[0]
    messages.append(msg.model_dump(exclude_none=True))
    messages += [{"role": "tool", "tool_call_id": c.id, "content": run_tool(workdir, c.function.arguments)}
                 for c in msg.tool_calls]
    text = []
    for chunk in client.chat.completions.create(model="gpt-demo", max_tokens=48, tools=tools, tool_choice="none",
                                                messages=messages, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
    return f"tool {call.function.name}({call.function.arguments}) → answer: {''.join(text)!r}"


def openai_responses_session(question: str, workdir: str) -> str:
    import openai

    client = openai.OpenAI(api_key="sk-demo-not-a-real-key")
    tools = [{"type": "function", "name": TOOL_NAME, "description": TOOL_DESC, "parameters": TOOL_SCHEMA,
              "strict": False}]
    items: list = [{"role": "user", "content": question}]
    first = client.responses.create(model="gpt-demo", max_output_tokens=128, tools=tools, tool_choice="required",
                                    input=items)
    calls = [item for item in first.output if item.type == "function_call"]
    call = calls[0]
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items += [{"type": "function_call_output", "call_id": c.call_id, "output": run_tool(workdir, c.arguments)} for c in calls]
    text, status = [], None
    # Events, not stream.get_final_response(): a max_output_tokens stop ends in response.incomplete, not completed.
    for event in client.responses.create(model="gpt-demo", max_output_tokens=48, tools=tools, tool_choice="none",
                                         input=items, stream=True):
        if event.type == "response.output_text.delta":
            text.append(event.delta)
        elif event.type in ("response.completed", "response.incomplete"):
            status = event.response.status
    return f"tool {call.name}({call.arguments}) → answer ({status}): {''.join(text)!r}"


def google_session(question: str, workdir: str) -> str:
    from google import genai
    from google.genai import types

    client = genai.Client(api_key="demo-not-a-real-key")
    tool = types.Tool(function_declarations=[types.FunctionDeclaration(
        name=TOOL_NAME, description=TOOL_DESC, parameters_json_schema=TOOL_SCHEMA)])
    contents = [types.Content(role="user", parts=[types.Part(text=question)])]
    forced = types.GenerateContentConfig(tools=[tool], max_output_tokens=128, tool_config=types.ToolConfig(
        function_calling_config=types.FunctionCallingConfig(mode="ANY")))
    first = client.models.generate_content(model="gemini-demo", contents=contents, config=forced)
    call = first.function_calls[0]
    contents += [first.candidates[0].content,
                 types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
                     id=c.id, name=c.name, response=json.loads(run_tool(workdir, c.args)))) for c in first.function_calls])]
    none = types.GenerateContentConfig(tools=[tool], max_output_tokens=48, tool_config=types.ToolConfig(
        function_calling_config=types.FunctionCallingConfig(mode="NONE")))
    text = "".join(chunk.text or "" for chunk in client.models.generate_content_stream(
        model="gemini-demo", contents=contents, config=none))
    return f"tool {call.name}({json.dumps(call.args)}) → answer: {text!r}"


SESSIONS = {
    "anthropic_messages": anthropic_session,
    "openai_chat": openai_chat_session,
    "openai_responses": openai_responses_session,
    "google_generate": google_session,
}


ANSWER_FILE = "answer.txt"
ANSWER_MAX_TOKENS = 64


def anthropic_answer(question: str) -> str:
    import anthropic

    client = anthropic.Anthropic(api_key="sk-demo-not-a-real-key")
    with client.messages.stream(model="claude-demo", max_tokens=ANSWER_MAX_TOKENS,
                                messages=[{"role": "user", "content": question}]) as stream:
        final = stream.get_final_message()
    return "".join(b.text for b in final.content if b.type == "text")


def openai_chat_answer(question: str) -> str:
    import openai

    client = openai.OpenAI(api_key="sk-demo-not-a-real-key")
    text = []
    for chunk in client.chat.completions.create(model="gpt-demo", max_tokens=ANSWER_MAX_TOKENS, stream=True,
                                                messages=[{"role": "user", "content": question}]):
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
    return "".join(text)


def openai_responses_answer(question: str) -> str:
    import openai

    client = openai.OpenAI(api_key="sk-demo-not-a-real-key")
    text = []
    for event in client.responses.create(model="gpt-demo", max_output_tokens=ANSWER_MAX_TOKENS, stream=True,
                                         input=[{"role": "user", "content": question}]):
        if event.type == "response.output_text.delta":
            text.append(event.delta)
    return "".join(text)


def google_answer(question: str) -> str:
    from google import genai
    from google.genai import types

    client = genai.Client(api_key="demo-not-a-real-key")
    config = types.GenerateContentConfig(max_output_tokens=ANSWER_MAX_TOKENS)
    return "".join(chunk.text or "" for chunk in client.models.generate_content_stream(
        model="gemini-demo", contents=question, config=config))


ANSWERS = {
    "anthropic_messages": anthropic_answer,
    "openai_chat": openai_chat_answer,
    "openai_responses": openai_responses_answer,
    "google_generate": google_answer,
}


def answer(instruction: str, workdir: str, env: dict[str, str]) -> int:
    """polar-rollout's python: agent entry point for answer tasks: the reply goes to answer.txt."""
    protocol = env.get("POLAR_SDK_PROTOCOL") or PROTOCOLS[int(env.get("POLAR_SAMPLE") or 0) % len(PROTOCOLS)]
    text = ANSWERS[protocol](instruction.strip())
    with open(os.path.join(workdir, ANSWER_FILE), "w", encoding="utf-8") as fh:
        fh.write(text)
    print(f"{protocol}: answer {text[:200]!r}")
    return 0


STEPS = 3
STEP_PROTOCOLS = ("openai_chat", "anthropic_messages")
NEXT_STEP = "Next note."


def openai_chat_turn(messages: list[dict]) -> str:
    import openai

    client = openai.OpenAI(api_key="sk-demo-not-a-real-key")
    reply = client.chat.completions.create(model="gpt-demo", max_tokens=ANSWER_MAX_TOKENS, messages=messages)
    return reply.choices[0].message.content or ""


def anthropic_turn(messages: list[dict]) -> str:
    import anthropic

    client = anthropic.Anthropic(api_key="sk-demo-not-a-real-key")
    reply = client.messages.create(model="claude-demo", max_tokens=ANSWER_MAX_TOKENS, messages=messages)
    return "".join(b.text for b in reply.content if b.type == "text")


TURNS = {"openai_chat": openai_chat_turn, "anthropic_messages": anthropic_turn}


def steps(instruction: str, workdir: str, env: dict[str, str]) -> int:
    """polar-rollout's python: agent entry point for families of steps: STEPS calls in one conversation, reply N to
    noteN.txt before the next call (an empty reply is an empty note: the conversation goes on with it)."""
    protocol = env.get("POLAR_SDK_PROTOCOL") or STEP_PROTOCOLS[int(env.get("POLAR_SAMPLE") or 0) % len(STEP_PROTOCOLS)]
    if protocol not in TURNS:
        raise SystemExit(f"steps: POLAR_SDK_PROTOCOL {protocol} is not one of {', '.join(TURNS)}")
    messages = [{"role": "user", "content": instruction.strip()}]
    for n in range(1, STEPS + 1):
        text = TURNS[protocol](messages)
        with open(os.path.join(workdir, f"note{n}.txt"), "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"{protocol}: note {n} {text[:120]!r}")
        # Anthropic refuses an empty assistant turn: a space stands for an empty reply in the history
        messages += [{"role": "assistant", "content": text or " "}, {"role": "user", "content": NEXT_STEP}]
    return 0


def run(instruction: str, workdir: str, env: dict[str, str]) -> int:
    """polar-rollout's python: agent entry point."""
    protocol = env.get("POLAR_SDK_PROTOCOL") or PROTOCOLS[int(env.get("POLAR_SAMPLE") or 0) % len(PROTOCOLS)]
    question = f"{instruction.strip()}\n\nUse the {TOOL_NAME} tool."
    print(f"{protocol}: {SESSIONS[protocol](question, os.path.abspath(workdir))[:300]}")
    return 0
