"""The official SDK clients pointed at a test gateway the way an agent's are: provider base URL untouched, requests
through the proxy (the session as proxy user name), only our CA trusted, no retries. `proxy` overrides the proxy URL
(e.g. another password); extra keywords go to the SDK's constructor."""

from __future__ import annotations

import anthropic
import openai
from google import genai
from google.genai import types as gtypes

from tests.support.gateway import proxy_client, proxy_sdk_client

OPENAI_V1 = "https://api.openai.com/v1"


def anthropic_sdk(gateway, session: str | None = "test-session", *, api_key: str = "sk-test",
                  proxy: str | None = None, timeout: float = 60, **kw) -> anthropic.Anthropic:
    http = proxy_sdk_client(proxy or gateway.proxy_url(session), gateway.ca_pem, timeout=timeout)
    return anthropic.Anthropic(api_key=api_key, max_retries=0, http_client=http, **kw)


def openai_sdk(gateway, session: str | None = "test-session", *, api_key: str = "sk-test", base_url: str = OPENAI_V1,
               proxy: str | None = None, timeout: float = 60, **kw) -> openai.OpenAI:
    http = proxy_sdk_client(proxy or gateway.proxy_url(session), gateway.ca_pem, timeout=timeout)
    return openai.OpenAI(api_key=api_key, base_url=base_url, max_retries=0, http_client=http, **kw)


def genai_sdk(gateway, session: str | None = "test-session", *, api_key: str = "AIza-test", proxy: str | None = None,
              timeout: float = 60, headers: dict | None = None) -> genai.Client:
    http = proxy_client(proxy or gateway.proxy_url(session), gateway.ca_pem, timeout=timeout)
    return genai.Client(api_key=api_key, http_options=gtypes.HttpOptions(headers=headers, httpx_client=http))
