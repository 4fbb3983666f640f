"""The shipped ChatML-with-tools template and tokenizer, rendered exactly as transformers and vLLM do.

`render()` prepares messages the way vLLM does before templating (JSON-string tool-call arguments are parsed
into objects) and renders with a Jinja environment configured like transformers' `_compile_jinja_template`
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, a `tojson` that does not escape
HTML or non-ASCII, `raise_exception`, `strftime_now`). `Tokenizer` wraps a built tokenizer folder with
`tokenizers` only (no transformers needed).
"""

from __future__ import annotations

import copy
import json
import os
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_PATH = ROOT / "scripts" / "models" / "chatml_tools.jinja"
BUILD_SCRIPT = ROOT / "scripts" / "models" / "build_tokenizer.py"
DEFAULT_TOKENIZER_DIR = ROOT / ".cache" / "models" / "tokenizer"


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # transformers overrides Jinja's tojson: no HTML escaping, non-ASCII kept.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=8)
def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template with transformers' environment."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def template_source() -> str:
    return TEMPLATE_PATH.read_text(encoding="utf-8")


def prepare_messages(messages: list[dict]) -> list[dict]:
    """What vLLM hands the template: a deep copy with JSON-string tool-call arguments parsed to objects.

    Invalid JSON arguments raise ValueError (vLLM answers such a request with 400)."""
    out = copy.deepcopy(list(messages))
    for m in out:
        if m.get("role") != "assistant" or not m.get("tool_calls"):
            continue
        for call in m["tool_calls"]:
            fn = call.get("function", call)
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    fn["arguments"] = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError as e:
                    raise ValueError(f"tool call arguments are not valid JSON: {e}") from e
    return out


def render(messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True,
           template: str | None = None, **kwargs: Any) -> str:
    """Render `messages` (and `tools`) to the prompt text; extra kwargs are template variables."""
    compiled = compile_template(template if template is not None else template_source())
    return compiled.render(messages=prepare_messages(messages), tools=tools or None, documents=None,
                           add_generation_prompt=add_generation_prompt, **kwargs)


def ensure_tokenizer_dir(path: str | os.PathLike | None = None) -> Path:
    """The tokenizer folder; built (seconds, stamped) when missing or stale."""
    out = Path(path) if path is not None else Path(os.environ.get("POLAR_TOKENIZER_DIR", DEFAULT_TOKENIZER_DIR))
    import runpy  # the build script is not a package module

    mod = runpy.run_path(str(BUILD_SCRIPT), run_name="polar_build_tokenizer")
    if mod["main"]([str(out)]) != 0:
        raise RuntimeError(f"building the tokenizer in {out} failed")
    return out


class Tokenizer:
    """A built tokenizer folder: encode/decode with special tokens recognised, and the chat template."""

    def __init__(self, path: str | os.PathLike | None = None):
        from tokenizers import Tokenizer as _Tok

        self.path = Path(path) if path is not None else ensure_tokenizer_dir()
        self._tok = _Tok.from_file(str(self.path / "tokenizer.json"))
        config = json.loads((self.path / "tokenizer_config.json").read_text(encoding="utf-8"))
        self.chat_template: str = config["chat_template"]
        self.eos_token: str = config["eos_token"]
        self.eos_id: int = self._tok.token_to_id(self.eos_token)
        self.pad_id: int = self._tok.token_to_id(config["pad_token"])
        gen = json.loads((self.path / "generation_config.json").read_text(encoding="utf-8"))
        eos = gen.get("eos_token_id", self.eos_id)
        self.eos_ids: tuple[int, ...] = tuple(eos) if isinstance(eos, list) else (eos,)
        self.special_ids: frozenset[int] = frozenset(
            int(i) for i, t in config["added_tokens_decoder"].items() if t["special"])
        self.vocab_size: int = self._tok.get_vocab_size()

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special and added tokens written in the text become their single ids."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_str(self, token_id: int) -> str:
        """One token as text, the way vLLM shows it in logprobs (a partial UTF-8 sequence becomes U+FFFD)."""
        return self._tok.decode([token_id], skip_special_tokens=False)

    def render(self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True,
               **kwargs: Any) -> str:
        return render(messages, tools, add_generation_prompt, template=self.chat_template, **kwargs)

    def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None,
                            add_generation_prompt: bool = True, **kwargs: Any) -> list[int]:
        """Prompt token ids, as vLLM computes them for a chat request."""
        return self.encode(self.render(messages, tools, add_generation_prompt, **kwargs))
