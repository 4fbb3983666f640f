"""The demo's agent sessions: for each of the four protocols, a two-turn tool session with the official SDK, going
through the proxy exactly like an agent (HTTPS_PROXY with the session as user name, SSL_CERT_FILE with our CA).

Turn 1 forces a tool call (tool_choice required / any / ANY), the tool runs here, turn 2 answers with tool_choice
none (streamed). Usage: demo_sessions.py PROXY_JSON  (the file scripts/proxy writes)."""

from __future__ import annotations

import json
import os
import sys
import time

TOOL_NAME = "get_time"
TOOL_DESC = "Current UTC time on this machine, as ISO 8601."
TOOL_SCHEMA = {"type": "object", "properties": {"timezone": {"type": "string", "description": "IANA zone"}},
               "required": ["timezone"]}
QUESTION = "What time is it in UTC? Use the tool."


def run_tool(arguments) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            arguments = {}
    return json.dumps({"timezone": (arguments or {}).get("timezone", "UTC"),
                       "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def use_proxy(state: dict, session: str) -> None:
    proxy = f"http://{session}:x@127.0.0.1:{state['port']}"
    for var in ("NO_PROXY", "no_proxy", "SSL_CERT_DIR", "ALL_PROXY", "all_proxy"):
        os.environ.pop(var, None)
    os.environ.update(HTTPS_PROXY=proxy, https_proxy=proxy, SSL_CERT_FILE=state["ca_bundle"])


def anthropic_session() -> str:
    import anthropic

    client = anthropic.Anthropic(api_key="sk-demo-not-a-real-key")
    tools = [{"name": TOOL_NAME, "description": TOOL_DESC, "input_schema": TOOL_SCHEMA}]
    messages = [{"role": "user", "content": QUESTION}]
    first = client.messages.create(model="claude-demo", max_tokens=128, tools=tools, tool_choice={"type": "any"},
                                   messages=messages)
    calls = [b for b in first.content if b.type == "tool_use"]
    call = calls[0]
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": c.id, "content": run_tool(c.input)}
                                              for c in calls]}]
    with client.messages.stream(model="claude-demo", max_tokens=48, tools=tools, tool_choice={"type": "none"},
                                messages=messages) as stream:
        final = stream.get_final_message()
    return f"{len(calls)} call(s), {call.name}({json.dumps(call.input)}) → answer: {''.join(b.text for b in final.content if b.type == 'text')!r}"


def openai_chat_session() -> str:
    import openai

    client = openai.OpenAI(api_key="sk-demo-not-a-real-key")
    tools = [{"type": "function", "function": {"name": TOOL_NAME, "description": TOOL_DESC, "parameters": TOOL_SCHEMA}}]
    messages = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(model="gpt-demo", max_tokens=128, tools=tools, tool_choice="required",
                                           messages=messages)
    msg = first.choices[0].message
    call = msg.tool_calls[0]
    messages.append(msg.model_dump(exclude_none=True))
    messages += [{"role": "tool", "tool_call_id": c.id, "content": run_tool(c.function.arguments)}
                 for c in msg.tool_calls]
    text = []
    for chunk in client.chat.completions.create(model="gpt-demo", max_tokens=48, tools=tools, tool_choice="none",
                                                messages=messages, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
    return f"tool {call.function.name}({call.function.arguments}) → answer: {''.join(text)!r}"


def openai_responses_session() -> str:
    import openai

    client = openai.OpenAI(api_key="sk-demo-not-a-real-key")
    tools = [{"type": "function", "name": TOOL_NAME, "description": TOOL_DESC, "parameters": TOOL_SCHEMA,
              "strict": False}]
    items: list = [{"role": "user", "content": QUESTION}]
    first = client.responses.create(model="gpt-demo", max_output_tokens=128, tools=tools, tool_choice="required",
                                    input=items)
    calls = [item for item in first.output if item.type == "function_call"]
    call = calls[0]
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items += [{"type": "function_call_output", "call_id": c.call_id, "output": run_tool(c.arguments)} for c in calls]
    text, status = [], None
    # Events, not stream.get_final_response(): a max_output_tokens stop ends in response.incomplete, not completed.
    for event in client.responses.create(model="gpt-demo", max_output_tokens=48, tools=tools, tool_choice="none",
                                         input=items, stream=True):
        if event.type == "response.output_text.delta":
            text.append(event.delta)
        elif event.type in ("response.completed", "response.incomplete"):
            status = event.response.status
    return f"tool {call.name}({call.arguments}) → answer ({status}): {''.join(text)!r}"


def google_session() -> str:
    from google import genai
    from google.genai import types

    client = genai.Client(api_key="demo-not-a-real-key")
    tool = types.Tool(function_declarations=[types.FunctionDeclaration(
        name=TOOL_NAME, description=TOOL_DESC, parameters_json_schema=TOOL_SCHEMA)])
    contents = [types.Content(role="user", parts=[types.Part(text=QUESTION)])]
    forced = types.GenerateContentConfig(tools=[tool], max_output_tokens=128, tool_config=types.ToolConfig(
        function_calling_config=types.FunctionCallingConfig(mode="ANY")))
    first = client.models.generate_content(model="gemini-demo", contents=contents, config=forced)
    call = first.function_calls[0]
    contents += [first.candidates[0].content,
                 types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
                     id=c.id, name=c.name, response=json.loads(run_tool(c.args)))) for c in first.function_calls])]
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


def main() -> int:
    with open(sys.argv[1]) as fh:
        state = json.load(fh)
    failures = 0
    for protocol, session_fn in SESSIONS.items():
        session = f"demo-{protocol}"
        use_proxy(state, session)
        t0 = time.time()
        try:
            summary = session_fn()
            print(f"  {protocol:18s} ok  {time.time() - t0:5.1f}s  {summary[:160]}")
        except Exception as exc:  # noqa: BLE001 — report every protocol, then fail
            failures += 1
            print(f"  {protocol:18s} FAILED: {type(exc).__name__}: {str(exc)[:300]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
