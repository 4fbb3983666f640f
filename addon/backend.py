"""The backend connection: one httpx client, the lazily resolved model and backend kind, /tokenize, and the policy
version a vLLM dev-mode server reports (`GET /weight_info`)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable

import httpx
import orjson

from .codecs.base import GatewayError
from .shaping import BackendInfo
from .stream_reader import classify_backend_error

log = logging.getLogger("polar.backend")


class BackendTimeout(GatewayError):
    """The backend did not answer in time (connect or read): the record's stage is backend_timeout."""


class Backend:
    def __init__(self, base_url: str, model: str | None, kind: str, api_key: str | None, connect_timeout: float):
        self.base_url = base_url.rstrip("/")
        self.root_url = self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url
        self.model_option = model
        self.kind_option = kind
        self.headers = {"content-type": "application/json"}
        if api_key:
            self.headers["authorization"] = f"Bearer {api_key}"
        # trust_env=False: the proxy's own HTTPS_PROXY / CA variables must not apply to the backend hop.
        self.client = httpx.AsyncClient(
            trust_env=False, headers=self.headers,
            timeout=httpx.Timeout(connect=connect_timeout, read=None, write=60.0, pool=connect_timeout),
            limits=httpx.Limits(max_connections=4096, max_keepalive_connections=512),
        )
        # The streamed chat call's lean HTTP/1.1 client on plain-http backends (set by the gateway); else httpx.
        self.stream_client = None
        self._info: BackendInfo | None = None
        self._lock = asyncio.Lock()
        # Told the weight version vLLM reports at each probe (the gateway's control state adopts it).
        self.on_weight_version: Callable[[str | None], None] | None = None

    async def close(self) -> None:
        await self.client.aclose()

    def forget(self) -> None:
        """After a connection failure: resolve model and kind again on the next call (the backend may have changed)."""
        self._info = None

    async def info(self) -> BackendInfo:
        if self._info is not None:
            return self._info
        async with self._lock:
            if self._info is None:
                self._info = await self._probe()
        return self._info

    async def _get_json(self, url: str) -> dict | None:
        try:
            resp = await self.client.get(url, timeout=httpx.Timeout(10.0, connect=self.client.timeout.connect))
        except httpx.TimeoutException as exc:
            raise BackendTimeout("unavailable", f"backend {url} timed out: {exc!r}") from exc
        except httpx.HTTPError as exc:
            raise GatewayError("unavailable", f"backend {url} unreachable: {exc!r}") from exc
        if resp.status_code != 200:
            return None
        try:
            return orjson.loads(resp.content)
        except orjson.JSONDecodeError:
            return None

    async def _probe(self) -> BackendInfo:
        models = await self._get_json(f"{self.base_url}/models")
        entries = (models or {}).get("data") or []
        model = self.model_option
        entry = None
        for item in entries:
            if model is None or item.get("id") == model:
                entry = item
                break
        if model is None:
            if entry is None:
                raise GatewayError("unavailable", f"backend {self.base_url}/models lists no model; set polar_model")
            model = entry["id"]
        max_len = (entry or {}).get("max_model_len")
        kind = self.kind_option
        if kind == "auto":
            kind = "sglang" if (entry or {}).get("owned_by") == "sglang" else "vllm"
        version_doc = await self._get_json(f"{self.root_url}/version")
        version = (version_doc or {}).get("version")
        info = BackendInfo(kind=kind, version=version, model=model, max_model_len=max_len,
                           template_hash=await self.template_hash(model))
        weight_version = await self.weight_info() if kind == "vllm" else None
        log.info("polar backend: %s %s model=%s max_model_len=%s weight_version=%s", kind, version, model, max_len,
                 weight_version)
        if self.on_weight_version is not None:
            self.on_weight_version(weight_version)
        return info

    async def template_hash(self, model: str) -> str | None:
        """16 hex digits of sha256 over the backend's own ids for TEMPLATE_PROBE_CHAT (its chat template, generation
        prompt included) and TEMPLATE_PROBE_TEXT (its tokenizer, special tokens off): equal on two replicas only when
        they would render every prompt alike. A backend whose /tokenize takes no messages (SGLang) is hashed on the
        text alone ("text:" marks it); None when there is no /tokenize at all. Never raises."""
        async def ids(body: dict) -> list[int] | None:
            try:
                doc = await self._tokenize(body)
            except (GatewayError, httpx.HTTPError, ValueError):
                return None
            tokens = doc.get("tokens") if isinstance(doc, dict) else None
            return tokens if isinstance(tokens, list) else None

        chat, text = await asyncio.gather(ids(tokenize_request(model, chat=TEMPLATE_PROBE_CHAT)),
                                          ids(tokenize_request(model, text=TEMPLATE_PROBE_TEXT)))
        if text is None:
            return None
        digest = hashlib.sha256(orjson.dumps([chat, text])).hexdigest()[:16]
        return digest if chat is not None else f"text:{digest}"

    async def weight_info(self) -> str | None:
        """The weight version vLLM serves (`GET /weight_info`, mounted only with VLLM_SERVER_DEV_MODE=1); None when
        the endpoint is absent or says nothing usable. Never raises: the version is a label, not a reason to fail."""
        try:
            doc = await self._get_json(f"{self.root_url}/weight_info")
        except GatewayError:
            return None
        version = (doc or {}).get("weight_version") if isinstance(doc, dict) else None
        return str(version) if isinstance(version, (str, int)) and not isinstance(version, bool) else None

    async def _tokenize(self, body: dict) -> dict:
        # Every /tokenize the gateway asks goes through here (the clamp, count_tokens, exact mode's renders).
        try:
            resp = await self.client.post(f"{self.root_url}/tokenize", content=orjson.dumps(body),
                                          timeout=httpx.Timeout(60.0, connect=self.client.timeout.connect))
        except httpx.HTTPError as exc:
            self.forget()
            raise GatewayError("unavailable", f"backend /tokenize unreachable: {exc!r}") from exc
        if resp.status_code != 200:
            raise classify_backend_error(resp.status_code, resp.content)
        return orjson.loads(resp.content)

    async def tokenize(self, chat: dict, model: str) -> int:
        """Prompt length for a chat request, rendered by the backend's own template (vLLM /tokenize)."""
        doc = await self._tokenize(tokenize_request(model, chat=chat))
        return int(doc.get("count", len(doc.get("tokens") or [])))

    async def render(self, chat: dict, model: str, add_generation_prompt: bool = True) -> list[int]:
        """The canonical prompt ids of a chat request (identical to the chat call's own render)."""
        doc = await self._tokenize(tokenize_request(model, chat=chat, add_generation_prompt=add_generation_prompt))
        return list(doc["tokens"])

    async def tokens(self, text: str, model: str) -> list[int]:
        """Plain text's ids, without special tokens."""
        return list((await self._tokenize(tokenize_request(model, text=text)))["tokens"])


# What `template_hash` renders: every role, a tool call and its result, non-ASCII text.
TEMPLATE_PROBE_CHAT = {
    "messages": [
        {"role": "system", "content": "You are the Polar template probe."},
        {"role": "user", "content": "List the files, then say done."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_probe", "type": "function", "function": {"name": "ls", "arguments": "{\"path\": \".\"}"}}]},
        {"role": "tool", "tool_call_id": "call_probe", "content": "a.py\nb.py"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "Merci — 谢谢 🙂"},
    ],
    "tools": [{"type": "function", "function": {"name": "ls", "description": "List a directory.", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}],
}
TEMPLATE_PROBE_TEXT = "Polar tokenizer probe: naïve café, 東京, 🙂, 0123456789, <tag>\tx = y**2;\n"


def tokenize_request(model: str, *, chat: dict | None = None, text: str | None = None,
                     add_generation_prompt: bool = True) -> dict:
    """The /tokenize body: a chat request's messages with its tools and template settings, or plain text."""
    if text is not None:
        return {"model": model, "prompt": text, "add_special_tokens": False}
    chat = chat or {}
    body = {"model": model, "messages": chat.get("messages") or [], "add_generation_prompt": add_generation_prompt}
    for key in ("tools", "chat_template_kwargs"):
        if chat.get(key):
            body[key] = chat[key]
    return body
