"""How each of the five agent CLIs is run, unmodified, through the Polar proxy: argv and environment per CLI (the
session as proxy user name, CA trust, a dummy key in the variable it really sends, quiet non-interactive settings).

One copy, two users: `scripts/run-agent` (a person at a shell) and `polar-rollout` (K samples in sandboxes). The
standard library only; session ids are `polar.records.uuid7`, the CA bundle the CLIs trust is `polar.launch.ca`'s.
"""

from __future__ import annotations

import argparse
import os
import shutil
from urllib.parse import quote, urlsplit, urlunsplit

HARNESSES = ("claude-code", "codex", "gemini-cli", "qwen-code", "pi")
BINARIES = {"claude-code": "claude", "codex": "codex", "gemini-cli": "gemini", "qwen-code": "qwen", "pi": "pi"}
# The variable each CLI really sends as its key (Codex ignores OPENAI_API_KEY).
KEY_VARS = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY", "google": "GEMINI_API_KEY"}
DUMMY_KEY = "sk-polar-dummy"
# Variables that would move a CLI off its provider host (then the proxy never sees the call) or swap its auth.
DROP_VARS = ("ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BEDROCK_BASE_URL", "CLAUDE_CODE_USE_BEDROCK",
             "CLAUDE_CODE_USE_VERTEX", "OPENAI_BASE_URL", "OPENAI_API_BASE", "CODEX_BASE_URL",
             "GOOGLE_GEMINI_BASE_URL", "GEMINI_BASE_URL", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_CLOUD_PROJECT",
             "GOOGLE_API_KEY", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy")
# Variables that would move a CLI's state out of the HOME it is given (one HOME per sample).
HOME_VARS = ("NO_PROXY", "no_proxy", "CODEX_HOME", "GEMINI_CLI_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
             "XDG_CACHE_HOME", "XDG_STATE_HOME", "PI_CODING_AGENT_DIR")


def proxy_with_session(url: str, session: str) -> str:
    """The proxy URL with `<session>:x` as credentials (whatever credentials it carried are replaced); the session
    is percent-encoded, so `/`, `@` or `:` in it cannot change what the URL means."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if not parts.hostname or not parts.port:
        raise ValueError(f"--proxy needs host and port, got {url!r}")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = f"{quote(session, safe='')}:x@{host}:{parts.port}"
    return urlunsplit((parts.scheme or "http", netloc, "", "", ""))


def npm_bin_dir(npm_dir: str) -> str:
    return os.path.join(npm_dir, "node_modules", ".bin")


def find_binary(name: str, npm_dir: str | os.PathLike | None) -> str | None:
    """The CLI in `npm_dir`/node_modules/.bin (`polar.launch.paths.npm_dir()`: --npm-dir, $POLAR_NPM_DIR, the
    checkout's), then on PATH."""
    if npm_dir:
        local = os.path.join(npm_bin_dir(str(npm_dir)), name)
        if os.access(local, os.X_OK):
            return local
    return shutil.which(name)


def parse_agent(text: str) -> tuple[str, str | None]:
    """`claude-code`, `pi:openai` → (harness, provider). ValueError names what is accepted."""
    harness, sep, provider = text.partition(":")
    if harness not in HARNESSES:
        near = _nearest_harness(harness)
        hint = f" (did you mean {near}?)" if near else ""
        raise ValueError(f"unknown agent {text!r}{hint}: expected one of {', '.join(HARNESSES)} "
                         f"(pi as pi:anthropic|openai|google), or python:MODULE:FUNC")
    if sep and (harness != "pi" or provider not in KEY_VARS):
        raise ValueError(f"unknown agent {text!r}: only pi takes a provider (pi:anthropic, pi:openai, pi:google)")
    return harness, (provider or None)


def _nearest_harness(name: str) -> str | None:
    """The harness a mistyped agent name most likely meant: one it starts (`claude` → claude-code), or its binary's
    name (`gemini` → gemini-cli), else the closest spelling."""
    import difflib

    lowered = name.lower()
    for harness, binary in BINARIES.items():
        if lowered in (binary, harness.split("-")[0]):
            return harness
    close = difflib.get_close_matches(lowered, HARNESSES, n=1, cutoff=0.6)
    return close[0] if close else None


def cli_args(harness: str, prompt: str, *, provider: str | None = None, model: str | None = None,
             keep_nonessential: bool = False, continue_session: bool = False,
             extra: list[str] | None = None) -> argparse.Namespace:
    """The namespace `build` takes, for callers that are not scripts/run-agent's own parser."""
    return argparse.Namespace(harness=harness, provider=provider, model=model, keep_nonessential=keep_nonessential,
                              prompt=[prompt], continue_session=continue_session, extra=list(extra or []))


def build(args: argparse.Namespace, env: dict[str, str], proxy: str, ca_pem: str, bundle: str,
          session: str) -> tuple[list[str], dict[str, str]]:
    """argv (without the binary) and environment for one CLI run."""
    prompt = " ".join(args.prompt)
    for var in DROP_VARS:
        env.pop(var, None)
    env.update({
        "HTTPS_PROXY": proxy, "https_proxy": proxy,
        # Node's extra CAs add to the built-in store; the SSL_CERT_FILE-style variables replace it, hence the bundle.
        "NODE_EXTRA_CA_CERTS": ca_pem, "SSL_CERT_FILE": bundle, "REQUESTS_CA_BUNDLE": bundle,
        "CODEX_CA_CERTIFICATE": bundle,
        "POLAR_SESSION": session,
    })
    # SSL_CERT_DIR adds to SSL_CERT_FILE for OpenSSL; keep the system directory when there is one, nothing else.
    if os.path.isdir("/etc/ssl/certs"):
        env["SSL_CERT_DIR"] = "/etc/ssl/certs"
    else:
        env.pop("SSL_CERT_DIR", None)
    harness, model = args.harness, args.model
    # getattr: callers that build the namespace themselves (scripts/bench_exact_clis, tests) may leave these out.
    cont, extra = getattr(args, "continue_session", False), list(getattr(args, "extra", None) or [])
    argv: list[str]
    if harness == "claude-code":
        env["ANTHROPIC_API_KEY"] = env.get("POLAR_ANTHROPIC_API_KEY", DUMMY_KEY)
        if getattr(args, "keep_nonessential", False):
            env.pop("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", None)
        else:
            env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] = "1"
        env.setdefault("DISABLE_AUTOUPDATER", "1")
        # Non-interactive: every tool allowed. As root the CLI refuses --dangerously-skip-permissions outside a
        # sandbox, so the permission is given through --allowedTools there.
        argv = [*(["--continue"] if cont else []), "-p", prompt]
        if hasattr(os, "geteuid") and os.geteuid() == 0 and env.get("IS_SANDBOX") != "1":
            argv += ["--allowedTools", "Bash,Edit,Write,Read,Glob,Grep,NotebookEdit,WebFetch,TodoWrite"]
        else:
            argv += ["--dangerously-skip-permissions"]
        if model:
            argv += ["--model", model]
    elif harness == "codex":
        env["CODEX_API_KEY"] = env.get("POLAR_CODEX_API_KEY", DUMMY_KEY)
        # `exec resume --last` continues the newest session of this working directory; it takes no --color.
        argv = ["exec", *(["resume", "--last"] if cont else []), "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox", *([] if cont else ["--color", "never"])]
        if model:
            argv += ["--model", model]
        argv += [prompt]
    elif harness == "gemini-cli":
        env["GEMINI_API_KEY"] = env.get("POLAR_GEMINI_API_KEY", DUMMY_KEY)
        env["GEMINI_CLI_TRUST_WORKSPACE"] = "true"
        argv = [*(["--resume", "latest"] if cont else []), "--yolo", "-p", prompt]
        if model:
            argv += ["--model", model]
    elif harness == "qwen-code":
        env["OPENAI_API_KEY"] = env.get("POLAR_OPENAI_API_KEY", DUMMY_KEY)
        argv = [*(["--continue"] if cont else []), "--auth-type", "openai", "--yolo", "-p", prompt]
        if model:
            argv += ["--model", model]
    else:  # pi
        provider = args.provider or "anthropic"
        env[KEY_VARS[provider]] = env.get(f"POLAR_{KEY_VARS[provider]}", DUMMY_KEY)
        argv = [*(["--continue"] if cont else []), "--provider", provider]
        if model:
            argv += ["--model", model]
        argv += ["-p", prompt]
    return argv + extra, env


# Base-URL mode per CLI (measured with the pinned versions): who honours its base-URL variable, and why the others
# stay on the proxy.
BASE_URL_CLIS = {"claude-code": "ANTHROPIC_BASE_URL", "qwen-code": "OPENAI_BASE_URL"}
BASE_URL_REFUSED = {
    "codex": "codex 0.171 sends nothing to OPENAI_BASE_URL (its base URL is a config.toml model provider)",
    "gemini-cli": "gemini-cli 0.61 turns GOOGLE_GEMINI_BASE_URL into its 'gateway' auth, which it refuses "
                  "non-interactively (\"Invalid auth method selected\")",
    "pi": "pi reads its base URL from its models.json, not from a variable",
}


def base_url_refusal(harness: str) -> str | None:
    """Why `harness` cannot run in base-URL mode (one line naming the fix), or None when it can."""
    why = BASE_URL_REFUSED.get(harness)
    return f"--connect base-url: {why}; use --connect proxy" if why else None


PROXY_AND_CA_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy",
                     "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "CODEX_CA_CERTIFICATE", "SSL_CERT_DIR")


def base_url_env(env: dict[str, str], address: str, session: str | None) -> dict[str, str]:
    """The environment `build` made, turned to base-URL mode: every SDK's and CLI's base-URL variable at the
    gateway's `address` (host:port; the session, if any, in the path), no proxy and no CA variable, loopback
    exempt from any proxy. Pi reads its base URL from its own models.json, not from a variable: it stays on the
    proxy (polar-rollout refuses the pair)."""
    from polar.launch.proxy import NO_PROXY_LOOPBACK, base_url_values

    for name in PROXY_AND_CA_VARS:
        env.pop(name, None)
    env.update(base_url_values(address, session))
    env["NO_PROXY"] = env["no_proxy"] = NO_PROXY_LOOPBACK
    return env
