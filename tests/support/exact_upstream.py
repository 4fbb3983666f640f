"""The scripted upstream plus vLLM 0.30–0.33's tokens-in chat (docs/field-notes.md):
`kv_transfer_params.prompt_token_ids` is used verbatim as the prompt (no template) and echoed, except when messages
carry non-text content (then vLLM renders the messages). `honour_prompt_ids=False` plays a backend that ignores the ids
(the probe must refuse it); `corrupt_echo=True` plays one that uses them but echoes something else (the gateway must
notice)."""

from __future__ import annotations

from tests.support.scripted_upstream import ScriptedUpstream


def _has_media(messages) -> bool:
    for m in messages or []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and any(not (isinstance(p, dict) and p.get("type") == "text") for p in content):
            return True
    return False


class ExactUpstream(ScriptedUpstream):
    def __init__(self, *args, honour_prompt_ids: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.honour_prompt_ids = honour_prompt_ids
        self.corrupt_echo = False

    def prompt_ids(self, body: dict) -> list[int]:
        params = body.get("kv_transfer_params")
        ids = params.get("prompt_token_ids") if isinstance(params, dict) else None
        if self.honour_prompt_ids and ids is not None and not _has_media(body.get("messages")):
            ids = [int(t) for t in ids]
            return ids + [ids[-1]] if self.corrupt_echo and ids else ids
        return super().prompt_ids(body)
