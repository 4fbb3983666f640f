"""The gateway's options: each declared once (name, mitmproxy type, default, help, what it accepts), parsed together
into one frozen `GatewayOptions`. No mitmproxy import: the addon registers them in `load` and parses them in
`configure`; tests parse plain dicts.

Fail closed (docs/architecture.md, the gateway): a value that does not parse must never leave a provider request to
mitmproxy. Two rules:
- every value is checked here, before the gateway changes any state, and a bad one is one `OptionError` line naming
  the option and what it expects (the gateway then logs it and answers providers with their 503);
- mitmproxy parses `--set` values of options a script declares only when the script registers them, and a value it
  cannot parse there (`polar_exact=yes`, a repeated `--set`) aborts the script's load silently — no addon, so a plain
  proxy that forwards provider requests with their keys. `take_unparseable` runs in `load`, before that parse, and
  moves such values out of mitmproxy's deferred set into errors of our own.
"""

from __future__ import annotations

import difflib
import math
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

from . import hosts as hostlist
from .announce import loopback_url

# seed: one seed for every call (K samples of one prompt are then K copies); seed_per_call: a seed of its own for each
# call, derived from the value, the call's session and its prompt (addon/shaping.py: call_seed), so a rollout is
# reproducible and K samples still differ.
SAMPLING_OVERRIDE_KEYS = {"temperature": float, "top_p": float, "top_k": int, "min_p": float, "seed": int,
                          "seed_per_call": int, "repetition_penalty": float}


class OptionError(ValueError):
    """One option's bad value: `str()` is the one line the proxy logs."""

    def __init__(self, name: str, expects: str, value: Any):
        self.name = name
        super().__init__(f"{name}: expected {expects}, got {value!r}")


class UnknownOption(OptionError):
    """A `polar_*` name no option has (a typo): mitmproxy keeps such a `--set` deferred and says nothing."""

    def __init__(self, name: str):
        self.name = name
        near = difflib.get_close_matches(name, list(BY_NAME), n=1)
        hint = f"did you mean {near[0]}?" if near else "docs/options.md lists the polar options"
        ValueError.__init__(self, f"unknown option {name} ({hint})")


@dataclass(frozen=True)
class Option:
    name: str
    typespec: Any  # what mitmproxy's loader.add_option gets
    default: Any
    help: str
    expects: str  # completes "expected …" in the error line


@dataclass(frozen=True)
class GatewayOptions:
    upstream: str  # as given (one URL, a comma-separated list, or @FILE)
    flows: str
    model: str | None
    hosts: frozenset[tuple[str, int]]
    backend: str
    upstream_api_key: str | None
    connect_timeout: float
    first_byte_timeout: float
    idle_timeout: float
    max_body_bytes: int
    rotate_mb: float
    min_free_mb: float
    logprobs_mode: str
    thinking_kwarg: str | None
    sampling_override: dict
    exact: bool
    exact_cache_bytes: int
    divert: bool
    other_hosts: str = "tunnel"
    base_url: str = "auto"
    control_token: str | None = None  # None: <confdir>/control-token
    hold_timeout: float = 120.0
    upstreams: tuple[str, ...] = ()  # the replicas' base URLs, parsed (empty: `upstream` is the one)
    upstream_file: str | None = None  # @FILE: its absolute path (the pool re-reads it on change)
    replica_policy: str = "sticky"
    replica_max_inflight: int = 0  # 0: no limit
    announce: str | None = None  # a runner's loopback URL told of each arriving call (announce.py); None: off
    announce_hold: float = 0.0  # 0: the call goes on at once; > 0: it waits for the runner's answer this long

    @property
    def replicas(self) -> tuple[str, ...]:
        return self.upstreams or (self.upstream,)


# Numbers are str options: mitmproxy's --set cannot parse float options (NotImplementedError at startup).
OPTIONS: tuple[Option, ...] = (
    Option("polar_upstream", str, "http://127.0.0.1:8000/v1",
           "OpenAI-compatible backend base URL ending in /v1 (vLLM or SGLang); several replicas: comma-separated, or "
           "@FILE (one URL per line, re-read when it changes).",
           "an http(s) URL ending in /v1, several comma-separated, or @FILE listing them"),
    Option("polar_flows", str, "./flows", "Directory for flow records.", "a writable directory"),
    Option("polar_model", Optional[str], None, "Model sent upstream; default: the backend's first /v1/models entry.",
           "a model name, or unset for the backend's first model"),
    Option("polar_hosts", Sequence[str], list(hostlist.DEFAULT_HOSTS),
           "Provider hosts to decrypt and answer (exact names, host or host:port).",
           "host or host:port entries (at least one)"),
    Option("polar_backend", str, "auto", "Backend kind: auto|vllm|sglang.", "auto, vllm or sglang"),
    Option("polar_upstream_api_key", Optional[str], None, "API key sent to the backend.",
           "a key of printable characters without spaces"),
    Option("polar_connect_timeout", str, "10", "Backend connect timeout, seconds.", "a positive number of seconds"),
    Option("polar_first_byte_timeout", str, "600", "Backend first-chunk timeout, seconds.",
           "a positive number of seconds"),
    Option("polar_idle_timeout", str, "600", "Longest silence between two backend chunks once streaming, seconds.",
           "a positive number of seconds"),
    Option("polar_max_body_mb", str, "32", "Largest agent request body accepted, MB.", "a positive number of MB"),
    Option("polar_rotate_mb", str, "256", "Rotate flow files at this size, MB.", "a positive number of MB"),
    Option("polar_min_free_mb", str, "512",
           "Refuse new generations (retryable error) below this much free disk, MB (0: off).",
           "a number of MB, 0 or more"),
    Option("polar_logprobs_mode", str, "raw_logprobs",
           "What the backend was started with: raw_logprobs|processed_logprobs.",
           "raw_logprobs or processed_logprobs"),
    Option("polar_thinking_kwarg", Optional[str], None,
           "chat_template_kwargs key for thinking on/off (unset: thinking controls are not mapped).",
           "an identifier such as enable_thinking, or unset"),
    Option("polar_sampling_override", Optional[str], None,
           "Sampling applied to every generation, e.g. temperature=1.6,top_p=1.0 (seed_per_call=S: each call's own"
           " seed, from S, its session and its prompt).",
           "comma-separated name=number entries, names from " + ", ".join(SAMPLING_OVERRIDE_KEYS)),
    Option("polar_exact", bool, False,
           "Exact on-policy mode: splice the sampled ids into the next prompt (vLLM 0.30+).",
           'true or false (or the value omitted, meaning true)'),
    Option("polar_exact_cache_mb", str, "512", "Exact mode: memory bound of the per-session turn cache, MB.",
           "a positive number of MB"),
    Option("polar_divert", bool, True,
           "Serve provider tunnels below mitmproxy's HTTP layer: mitmproxy only does TLS and relays the decrypted "
           "bytes to the gateway's endpoint (false: the request-hook reroute, two HTTP exchanges per call).",
           'true or false (or the value omitted, meaning true)'),
    Option("polar_other_hosts", str, "tunnel",
           "Traffic that is not a provider's: tunnel (relayed raw, undecrypted) or refuse (every CONNECT to a host "
           "outside polar_hosts and every plain-HTTP request but the readiness probe gets 403; sandboxed rollouts).",
           "tunnel or refuse"),
    Option("polar_base_url", str, "auto",
           "Base-URL mode: also answer agents whose provider base URL is this proxy's address "
           "(http://127.0.0.1:P/anthropic, /openai/v1, /google): auto (on when listening on loopback), on or off.",
           "auto, on or off"),
    Option("polar_control_token", Optional[str], None,
           "File holding the token the control endpoints require (x-polar-control-token); created 0600 when absent. "
           "Unset: <confdir>/control-token.",
           "a file path, or unset for <confdir>/control-token"),
    Option("polar_hold_timeout", str, "120",
           "A hold of generation (POST /admin/hold) ends by itself after this many seconds without a release.",
           "a positive number of seconds"),
    Option("polar_announce", Optional[str], None,
           "A rollout runner's loopback URL (http://127.0.0.1:PORT/...) told of every arriving generation call (its "
           "session and call id, with the control token) so it can snapshot the sample's workspace "
           "(polar-rollout --turn-states); unset: off.",
           "an http URL on 127.0.0.1 or [::1] with a port, or unset"),
    Option("polar_announce_hold", str, "0",
           "With polar_announce: 0 = the call goes on at once (async); N > 0 = the call waits for the runner's "
           "answer at most N seconds, then goes on (hold).",
           "a number of seconds, 0 or more"),
    Option("polar_replica_policy", str, "sticky",
           "Several replicas: sticky (a session stays on its replica, chosen by rendezvous hashing of its id) or "
           "round_robin (for comparison).", "sticky or round_robin"),
    Option("polar_replica_max_inflight", str, "0",
           "Several replicas: a replica with this many calls in flight spills new ones to the least-loaded (0: no "
           "limit).", "a whole number, 0 or more"),
)
BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}


# ------------------------------------------------------------------------------------------------------ parsing

def _number(name: str, raw: Any, *, zero_ok: bool = False) -> float:
    option = BY_NAME[name]
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise OptionError(name, option.expects, raw) from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise OptionError(name, option.expects, raw)
    return value


def _choice(name: str, raw: Any, choices: tuple[str, ...]) -> str:
    if raw not in choices:
        raise OptionError(name, BY_NAME[name].expects, raw)
    return raw


def _one_upstream(text: str, raw: Any) -> str:
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in ("http", "https") or not rest.split("/", 1)[0] or not text.rstrip("/").endswith("/v1"):
        raise OptionError("polar_upstream", BY_NAME["polar_upstream"].expects, raw)
    return text


def read_upstream_file(path: str) -> list[str]:
    """The base URLs of a polar_upstream @FILE: one per line; blank lines and # comments skipped."""
    with open(path, encoding="utf-8") as fh:
        urls = [line.split("#", 1)[0].strip() for line in fh]
    urls = [u for u in urls if u]
    if not urls:
        raise ValueError("lists no base URL")
    return urls


def _upstreams(raw: Any) -> tuple[str, tuple[str, ...], str | None]:
    """(the text, the replicas' URLs, the @FILE path or None). Duplicates are refused: a replica listed twice would
    take twice its share of sessions."""
    import os

    text = str(raw).strip()
    path = None
    if text.startswith("@"):
        path = os.path.abspath(os.path.expanduser(text[1:]))
        try:
            items = read_upstream_file(path)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise OptionError("polar_upstream", f"a readable file listing base URLs ({exc})", raw) from None
    else:
        items = [item.strip() for item in text.split(",")]
    urls = tuple(_one_upstream(item, raw) for item in items)
    seen = {u.rstrip("/") for u in urls}
    if len(seen) != len(urls):
        raise OptionError("polar_upstream", "each replica listed once", raw)
    return text, (urls if len(urls) > 1 or path else ()), path


def _name(option: str, raw: Any, allowed: Callable[[str], bool]) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw or not allowed(raw):
        raise OptionError(option, BY_NAME[option].expects, raw)
    return raw


def _hosts(raw: Any) -> frozenset[tuple[str, int]]:
    try:
        parsed = hostlist.parse_hosts(raw or ())
    except ValueError:
        parsed = frozenset()
    if not parsed:
        raise OptionError("polar_hosts", BY_NAME["polar_hosts"].expects, list(raw or ()))
    return parsed


def parse_sampling_override(text: str | None) -> dict:
    """`temperature=1.6,top_p=1.0` → {"temperature": 1.6, "top_p": 1.0}; OptionError names the first bad entry."""
    out: dict = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = (part.strip() for part in item.partition("="))
        kind = SAMPLING_OVERRIDE_KEYS.get(name)
        try:
            number = kind(value) if sep and kind else None
        except ValueError:
            number = None
        if number is None or not math.isfinite(number):
            raise OptionError("polar_sampling_override", BY_NAME["polar_sampling_override"].expects, item)
        out[name] = number
    return out


def _printable(text: str) -> bool:
    return all(c in string.printable and not c.isspace() for c in text)


def parse_options(values: Mapping[str, Any]) -> GatewayOptions:
    """Every gateway option checked and converted; raises OptionError for the first bad one (in OPTIONS order)."""
    v = values
    upstream, upstreams, upstream_file = _upstreams(v["polar_upstream"])
    flows = str(v["polar_flows"])
    if not flows.strip():
        raise OptionError("polar_flows", BY_NAME["polar_flows"].expects, v["polar_flows"])
    model = _name("polar_model", v["polar_model"], lambda s: bool(s.strip()))
    hosts = _hosts(v["polar_hosts"])
    backend = _choice("polar_backend", v["polar_backend"], ("auto", "vllm", "sglang"))
    api_key = _name("polar_upstream_api_key", v["polar_upstream_api_key"], _printable)
    numbers = {name: _number(name, v[name], zero_ok=name == "polar_min_free_mb") for name in (
        "polar_connect_timeout", "polar_first_byte_timeout", "polar_idle_timeout", "polar_max_body_mb",
        "polar_rotate_mb", "polar_min_free_mb")}
    logprobs_mode = _choice("polar_logprobs_mode", v["polar_logprobs_mode"], ("raw_logprobs", "processed_logprobs"))
    thinking_kwarg = _name("polar_thinking_kwarg", v["polar_thinking_kwarg"], str.isidentifier)
    override = parse_sampling_override(v["polar_sampling_override"])
    if not isinstance(v["polar_exact"], bool):
        raise OptionError("polar_exact", BY_NAME["polar_exact"].expects, v["polar_exact"])
    cache_mb = _number("polar_exact_cache_mb", v["polar_exact_cache_mb"])
    if not isinstance(v["polar_divert"], bool):
        raise OptionError("polar_divert", BY_NAME["polar_divert"].expects, v["polar_divert"])
    other_hosts = _choice("polar_other_hosts", v["polar_other_hosts"], ("tunnel", "refuse"))
    base_url = _choice("polar_base_url", v["polar_base_url"], ("auto", "on", "off"))
    control_token = _name("polar_control_token", v["polar_control_token"],
                          lambda s: bool(s.strip()) and s.isprintable() and s == s.strip())
    hold_timeout = _number("polar_hold_timeout", v["polar_hold_timeout"])
    announce = _name("polar_announce", v["polar_announce"], loopback_url)
    announce_hold = _number("polar_announce_hold", v["polar_announce_hold"], zero_ok=True)
    replica_policy = _choice("polar_replica_policy", v["polar_replica_policy"], ("sticky", "round_robin"))
    max_inflight = _number("polar_replica_max_inflight", v["polar_replica_max_inflight"], zero_ok=True)
    if max_inflight != int(max_inflight):
        raise OptionError("polar_replica_max_inflight", BY_NAME["polar_replica_max_inflight"].expects,
                          v["polar_replica_max_inflight"])
    return GatewayOptions(
        upstream=upstream, flows=flows, model=model, hosts=hosts, backend=backend, upstream_api_key=api_key,
        connect_timeout=numbers["polar_connect_timeout"], first_byte_timeout=numbers["polar_first_byte_timeout"],
        idle_timeout=numbers["polar_idle_timeout"],
        max_body_bytes=int(numbers["polar_max_body_mb"] * 1024 * 1024),
        rotate_mb=numbers["polar_rotate_mb"], min_free_mb=numbers["polar_min_free_mb"],
        logprobs_mode=logprobs_mode, thinking_kwarg=thinking_kwarg, sampling_override=override,
        exact=v["polar_exact"], exact_cache_bytes=int(cache_mb * 1024 * 1024), divert=v["polar_divert"],
        other_hosts=other_hosts, base_url=base_url, control_token=control_token, hold_timeout=hold_timeout,
        upstreams=upstreams, upstream_file=upstream_file, replica_policy=replica_policy,
        replica_max_inflight=int(max_inflight), announce=announce, announce_hold=announce_hold,
    )


# ------------------------------------------------------------------------------------------- mitmproxy's deferral

def take_unparseable(optmanager, names) -> dict[str, OptionError]:
    """Remove from mitmproxy's deferred `--set` values those of `names` that mitmproxy's own parser would reject when
    the script registers them (which would abort the script's load without a word); return the error for each.

    Uses mitmproxy 12's `OptManager.deferred` and `_parse_setval`; if those ever change shape, every deferred value of
    ours counts as unparseable — the gateway then fails closed instead of silently loading nothing."""
    errors: dict[str, OptionError] = {}
    deferred = getattr(optmanager, "deferred", None)
    if not isinstance(deferred, dict):
        return errors
    for name in [n for n in deferred if n in names]:
        raw = deferred[name]
        strings = getattr(raw, "val", None)
        if not isinstance(strings, list):
            continue  # a typed value set from Python, checked by mitmproxy's type check where it is set
        try:
            optmanager._parse_setval(optmanager._options[name], strings)
        except Exception:  # noqa: BLE001 — whatever mitmproxy would raise there is fatal to the load
            del deferred[name]
            shown = strings[0] if len(strings) == 1 else strings
            expects = BY_NAME[name].expects if name in BY_NAME else "a valid value"
            if len(strings) > 1 and BY_NAME.get(name) and BY_NAME[name].typespec is not Sequence[str]:
                expects = "one value (--set given more than once)"
            errors[name] = OptionError(name, expects, shown)
    return errors


def unknown_options(names) -> dict[str, OptionError]:
    """The `polar_*` names among `names` (mitmproxy's deferred `--set` names) that are no option of ours."""
    return {n: UnknownOption(n) for n in names if isinstance(n, str) and n.startswith("polar_") and n not in BY_NAME}


def check_sets(sets: Sequence[str]) -> OptionError | None:
    """The first error the gateway would refuse `--set` items with, found without starting it: unknown `polar_*`
    names, values mitmproxy cannot parse (`polar_exact=yes`), then `parse_options`. Other items are mitmproxy's.
    Without mitmproxy (a launcher-only install) only the names are checked; the gateway checks the rest."""
    ours = [s for s in sets if s.partition("=")[0].startswith("polar_")]
    unknown = unknown_options(s.partition("=")[0] for s in ours)
    if unknown:
        return next(iter(unknown.values()))
    try:
        from mitmproxy import optmanager
    except ImportError:
        return None
    manager = optmanager.OptManager()
    manager.set(*ours, defer=True)  # as mitmdump does before the script registers the options
    for option in OPTIONS:
        manager.add_option(option.name, option.typespec, option.default, option.help)
    errors = take_unparseable(manager, BY_NAME)
    if errors:
        return next(iter(errors.values()))
    manager.process_deferred()
    try:
        parse_options({name: getattr(manager, name) for name in BY_NAME})
    except OptionError as exc:
        return exc
    return None
