"""The Polar proxy's lifecycle: start one proxy (mitmdump with the addon) or a fleet, stop it, ask how it is, and
the environment an agent needs to use it. Functions return data and raise `ProxyError`; polar-proxy
(launch/proxy_cli.py) prints.

start: every process on its own port (free ones, or PORT, PORT+1, …) and in its own process group, one CA (the
confdir) and one flow directory (each process names its own files, so they never share one); it waits until each
addon answers its readiness probe, then writes the run file (`ProxyRunFile`) and the CA bundle. A bare
{"ready": false} is an addon whose endpoint has not started yet (wait, up to the timeout); only an answer that names
an error (the fail-closed addon, a gateway refusing an option) is final. start refuses while the run file names a
live proxy (a second start would orphan it: stop reaches only the run file's pids); a run file whose pids are all
dead is stale and overwritten.

mitmdump is the one given, else the one beside this interpreter, else the checkout's .venv, else PATH's; the addon
script is the installed package's (`polar.addon`), never a path into a checkout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

from polar.launch import ca, paths
from polar.launch.process import PROXY_MARKER, ending_with_this_thread, free_port, is_ours, stop_groups
from polar.launch.runfiles import ProxyEntry, ProxyRunFile, RunFileError

READY_URL = "http://polar.gateway/ready"
# The gateway's own backend hop never goes through a proxy (HTTPS_PROXY may point at this very gateway).
PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
# Started in this process: kept so they are reaped, and so a caller can tell them from other children.
_STARTED: dict[int, subprocess.Popen] = {}


class ProxyError(Exception):
    """What stops a command: the lines to show and the exit status (2: a command line that cannot work, 1: it was
    tried and failed)."""

    def __init__(self, lines: str | Sequence[str], code: int = 1):
        self.lines = [lines] if isinstance(lines, str) else list(lines)
        self.code = code
        super().__init__("\n".join(self.lines))


class AlreadyRunning(ProxyError):
    """start on a run directory whose run file names a live proxy."""

    def __init__(self, path: Path, entry: ProxyEntry):
        self.path, self.entry = path, entry
        run_dir = shlex.quote(str(path.parent))
        super().__init__(f"error: a proxy already runs from {path} (pid {entry.pid}, port {entry.port}); run "
                         f"`{command()} stop --run-dir {run_dir}` first, or pass another --run-dir", code=2)


def command() -> str:
    """How a user reaches these commands here: the checkout's script, or the console script of an install."""
    return "scripts/proxy" if paths.checkout_root() is not None else "polar-proxy"


# ------------------------------------------------------------------------------------------------ where things are

def find_mitmdump(given: str | None = None) -> str:
    """The mitmdump to run: `given` (--mitmdump, $POLAR_MITMDUMP), else beside this interpreter, else the
    checkout's .venv, else PATH's; ProxyError (exit 2) names the fix."""
    given = given or os.environ.get("POLAR_MITMDUMP")
    if given:
        if os.access(given, os.X_OK) and os.path.isfile(given):
            return given
        raise ProxyError(f"error: --mitmdump {given}: not an executable file", code=2)
    root = paths.checkout_root()
    candidates = [os.path.join(os.path.dirname(sys.executable), "mitmdump")]
    if root is not None:
        candidates.append(str(root / ".venv" / "bin" / "mitmdump"))
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    found = shutil.which("mitmdump")
    if found:
        return found
    fix = "run scripts/setup first" if root is not None else "install polar-gateway[proxy] into this environment"
    raise ProxyError(f"error: mitmdump not found (beside {sys.executable} or on PATH); {fix}, or pass --mitmdump "
                     f"PATH", code=2)


def addon_script() -> str:
    """The mitmproxy script of the installed package (polar/addon/polar_addon.py)."""
    spec = importlib.util.find_spec("polar.addon")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, "polar_addon.py")
        if os.path.isfile(path):
            return path
    raise ProxyError("error: the installed polar package has no addon/polar_addon.py; reinstall polar-gateway")


def resolve_confdir(given: str | None = None) -> Path:
    """The CA directory (`paths.confdir`: --confdir, $POLAR_CONFDIR, the checkout's certs/, else the user's)."""
    return paths.confdir(given).resolve()


# ------------------------------------------------------------------------------------------------ readiness

def probe(port: int, timeout: float = 2.0) -> dict | None:
    """The addon's readiness answer through the proxy on `port`: {"ready": true, ...}; {"ready": false} while its
    endpoint is not started; {"ready": false, "error": ...} from a fail-closed addon or a gateway refusing an
    option (an error status's JSON body included). None: no JSON (not listening yet, mitmproxy alone, gone)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{port}"}))
    try:
        with opener.open(READY_URL, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            return json.loads(exc.read())
        except ValueError:
            return None
    except Exception:  # noqa: BLE001 — refused, reset, timed out: no answer yet
        return None


def is_fatal(info: dict) -> bool:
    """Not ready AND saying why: final. A bare not-ready is a start-up in progress (the endpoint starts in the
    addon's `running` hook, after the proxy already listens and answers the probe)."""
    return not info.get("ready") and (bool(info.get("error")) or info.get("fail_closed") is True)


def wait_ready(procs: Sequence, ports: Sequence[int], timeout: float, probe=probe) -> list[dict | None]:
    """Each proxy's final readiness answer (ready, or fatal); None for one that exited or was still not ready at
    the deadline. `procs` need only `poll()`."""
    deadline = time.monotonic() + timeout
    infos: list[dict | None] = [None] * len(procs)
    while True:
        for i, (proc, port) in enumerate(zip(procs, ports)):
            if infos[i] is None and proc.poll() is None:
                info = probe(port)
                if info is not None and (info.get("ready") or is_fatal(info)):
                    infos[i] = info
        if all(x is not None or p.poll() is not None for x, p in zip(infos, procs)) or time.monotonic() > deadline:
            return infos
        time.sleep(0.1)


def _url_error(url: str, where: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{where} must be an http(s) URL ending in /v1, e.g. http://127.0.0.1:8000/v1 (got {url!r})"
    if not parts.path.rstrip("/").endswith("/v1"):
        fixed = url.rstrip("/") + "/v1"
        return f"{where} must be an OpenAI base URL ending in /v1: did you mean {fixed}? (got {url!r})"
    return None


def upstream_urls(upstream: str) -> tuple[list[str], str | None]:
    """(the base URLs `upstream` names, one line naming the fix or None). `upstream` is one OpenAI base URL, several
    comma-separated (a pool of replicas), or `@FILE`: a file with one URL per line (blank lines and `#` comments
    ignored) that must exist and list at least one. Every URL is http(s) and ends in /v1; a URL listed twice is
    refused (the gateway would count one replica twice)."""
    if upstream.startswith("@"):
        from polar.addon.options import read_upstream_file  # the gateway's own reading of the file (no mitmproxy)

        path = upstream[1:]
        try:
            urls = read_upstream_file(path)
        except (OSError, UnicodeDecodeError) as exc:
            return [], f"--upstream @{path}: cannot read the replica list ({getattr(exc, 'strerror', None) or exc}); " \
                       f"pass @FILE of an existing file with one base URL per line"
        except ValueError:
            return [], f"--upstream @{path}: the file lists no base URL; write one per line (e.g. " \
                       f"http://127.0.0.1:8000/v1)"
        where = f"every line of --upstream @{path}"
    else:
        urls = [u.strip() for u in upstream.split(",")]
        if len(urls) > 1 and not all(urls):
            return [], f"--upstream has an empty entry: list base URLs separated by single commas (got {upstream!r})"
        where = "--upstream" if len(urls) == 1 else "every --upstream entry"
    seen: set[str] = set()
    for url in urls:
        bad = _url_error(url, where)
        if bad:
            return [], bad
        key = url.rstrip("/")
        if key in seen:
            return [], f"--upstream lists {url} twice; name each replica once"
        seen.add(key)
    return urls, None


def upstream_error(upstream: str) -> str | None:
    """One line naming the fix when `upstream` is not an OpenAI base URL, a comma-separated list of them, or @FILE
    of them (`upstream_urls`); the addon would refuse it only after start-up, buried in its log."""
    return upstream_urls(upstream)[1]


def check_upstream(upstream: str, timeout: float = 2.0) -> str | None:
    """A warning when a backend does not answer GET /models: the proxy is useful once it does (vLLM may still be
    loading), so this never stops start. Any HTTP status is an answer (e.g. 401 without polar_upstream_api_key).
    For a list (comma-separated or @FILE) every replica is asked, side by side; one line names those that do not
    answer."""
    urls, bad = upstream_urls(upstream)
    if bad or not urls:
        return None
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    silent: dict[str, str] = {}

    def ask(url: str) -> None:
        try:
            with opener.open(url.rstrip("/") + "/models", timeout=timeout) as resp:
                resp.read(1)
        except urllib.error.HTTPError:
            return
        except Exception as exc:  # noqa: BLE001 — refused, timed out, DNS: all mean "does not answer"
            silent[url] = str(getattr(exc, "reason", exc))

    askers = [threading.Thread(target=ask, args=(u,), daemon=True) for u in urls]
    for t in askers:
        t.start()
    for t in askers:
        t.join(timeout + 1)
    if not silent:
        return None
    if len(urls) == 1:
        url, reason = next(iter(silent.items()))
        return (f"warning: upstream {url} does not answer (GET /models: {reason}); the proxy starts anyway, "
                f"model calls fail until it does")
    listed = ", ".join(f"{u} ({r})" for u, r in silent.items())
    return (f"warning: {len(silent)} of {len(urls)} upstream replicas do not answer GET /models: {listed}; the proxy "
            f"starts anyway, their calls go to the other replicas or fail until they do")


def absolute_upstream(upstream: str) -> str:
    """`@FILE` made absolute (the proxy runs in another working directory); anything else as it is."""
    return "@" + os.path.abspath(upstream[1:]) if upstream.startswith("@") else upstream


def set_error(sets: Sequence[str]) -> str | None:
    """The first `--set` item the gateway would refuse (an unknown polar_* name, a value its type does not take,
    a polar_* value that does not parse), as the gateway's own line; None when all would do."""
    try:
        from polar.addon.options import check_sets
    except ImportError:  # a launcher without the addon package: the gateway itself refuses them
        return None
    bad = check_sets(sets)
    return str(bad) if bad is not None else None


def option_error(upstream: str, count: int, port: int, timeout: float, sets: Sequence[str] = ()) -> str | None:
    """The first option that cannot work, as one line naming the fix; None when all can."""
    bad = upstream_error(upstream) or set_error(sets)
    if bad is None and count < 1:
        bad = "--count must be at least 1"
    if bad is None and not 0 <= port <= 65535 - (count - 1):
        bad = f"--port must be 0 (a free port) or a port that leaves room for --count {count} (got {port})"
    if bad is None and not timeout > 0:
        bad = f"--timeout must be a positive number of seconds (got {timeout:g})"
    return bad


# ------------------------------------------------------------------------------------------------ run file, env

def read_state(run_dir: str | os.PathLike) -> ProxyRunFile | None:
    """The run file of `run_dir`; None when there is none or it is not one (start treats both as stale)."""
    try:
        return ProxyRunFile.read(paths.proxy_run_file(run_dir))
    except RunFileError:
        return None


def live_proxies(state: ProxyRunFile | Mapping | None) -> list[ProxyEntry]:
    """The run file's proxies that still run (and are ours); none means the file is stale."""
    if state is None:
        return []
    if not isinstance(state, ProxyRunFile):
        state = ProxyRunFile.from_dict(dict(state))
    return [p for p in state.proxies if is_ours(p.pid, PROXY_MARKER)]


# Base-URL mode: each SDK's and CLI's base-URL variable, and the gateway's address for its protocol family
# (Anthropic SDK, Claude Code; OpenAI SDK, Codex, Qwen Code; google-genai, Gemini CLI).
BASE_URL_VARS = {"ANTHROPIC_BASE_URL": "/anthropic", "OPENAI_BASE_URL": "/openai/v1",
                 "GOOGLE_GEMINI_BASE_URL": "/google"}
NO_PROXY_LOOPBACK = "127.0.0.1,localhost,::1"


def base_url_values(address: str, session: str | None) -> dict[str, str]:
    """{variable: base URL} for an agent reaching the gateway at `address` (host:port) by base URL; the session,
    percent-encoded, in the path prefix `/s/<session>`."""
    prefix = f"/s/{quote(session, safe='')}" if session else ""
    return {name: f"http://{address}{prefix}{suffix}" for name, suffix in BASE_URL_VARS.items()}


def base_url_env_lines(state: ProxyRunFile | Mapping, session: str | None, proxy: int = 0) -> list[str]:
    """The lines for an agent that sets a base URL instead of a proxy (`env --base-url`): the base-URL variables,
    the proxy variables unset and loopback exempt from any proxy (no CA: plain HTTP on loopback)."""
    port = state.proxies[proxy].port if isinstance(state, ProxyRunFile) else state["port"]
    lines = [f"export {name}={shlex.quote(value)}" for name, value in base_url_values(f"127.0.0.1:{port}",
                                                                                       session).items()]
    return [*lines, "unset HTTPS_PROXY https_proxy", f"export NO_PROXY={NO_PROXY_LOOPBACK} "
                                                     f"no_proxy={NO_PROXY_LOOPBACK}"]


def env_lines(state: ProxyRunFile | Mapping, session: str, proxy: int = 0) -> list[str]:
    """The `export` lines for an agent using proxy `proxy` of `state` (a run file, or a mapping with port, ca_pem
    and ca_bundle), shell-quoted. The session is the proxy user name, percent-encoded so `@`, `:` or `/` in it
    cannot change what the URL means."""
    if isinstance(state, ProxyRunFile):
        port, ca_pem, bundle = state.proxies[proxy].port, state.ca_pem, state.ca_bundle
    else:
        port, ca_pem, bundle = state["port"], state["ca_pem"], state["ca_bundle"]
    url = f"http://{quote(session, safe='')}:x@127.0.0.1:{port}"
    # NODE_EXTRA_CA_CERTS adds to Node's store; SSL_CERT_FILE and REQUESTS_CA_BUNDLE replace theirs (the bundle).
    values = [("HTTPS_PROXY", url), ("https_proxy", url), ("NODE_EXTRA_CA_CERTS", ca_pem),
              ("SSL_CERT_FILE", bundle), ("REQUESTS_CA_BUNDLE", bundle), ("CODEX_CA_CERTIFICATE", ca_pem)]
    return [f"export {name}={shlex.quote(str(value))}" for name, value in values]


def env(run_dir: str | os.PathLike, proxy: int = 0) -> ProxyRunFile:
    """The run file of a live proxy `proxy`, for `env_lines`; ProxyError when there is none or it is gone."""
    path = paths.proxy_run_file(os.path.abspath(run_dir))
    state = read_state(path.parent)
    if state is None:
        raise ProxyError(f"error: no proxy running (no {path}); start one with `{command()} start`")
    if not 0 <= proxy < len(state.proxies):
        raise ProxyError(f"error: --proxy {proxy}: the fleet has proxies 0…{len(state.proxies) - 1}", code=2)
    p = state.proxies[proxy]
    if not is_ours(p.pid, PROXY_MARKER):
        raise ProxyError(f"error: proxy {proxy} of {path} (pid {p.pid}, port {p.port}) is not running; start one "
                         f"with `{command()} start`")
    return state


# ------------------------------------------------------------------------------------------------ start

@dataclass(frozen=True)
class Started:
    """A running proxy (or fleet): its run file, where that is, and the lines to show (warnings, notes)."""

    state: ProxyRunFile
    path: Path
    notes: list[str] = field(default_factory=list)


def launch(mitmdump: str, script: str, confdir: Path, run_dir: Path, port: int, *, listen_host: str, upstream: str,
           flows: str, sets: Sequence[str] = (), env: Mapping[str, str] | None = None,
           tied: bool = False) -> tuple[subprocess.Popen, str]:
    """One mitmdump with the addon on `port`, in its own process group, its output in run_dir/proxy-PORT.log.
    `tied`: it gets SIGTERM when the starting thread ends (a killed runner leaves no proxy behind)."""
    log_path = str(run_dir / f"proxy-{port}.log")
    cmd = [mitmdump, "--set", "flow_detail=0", "-s", script, "--listen-host", listen_host, "--listen-port",
           str(port), "--set", f"confdir={confdir}", "--set", f"polar_upstream={upstream}", "--set",
           f"polar_flows={flows}", "--set", "termlog_verbosity=info"]
    for item in sets:
        cmd += ["--set", item]
    child_env = {k: v for k, v in (os.environ if env is None else env).items() if k not in PROXY_VARS}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=child_env,
                                cwd=str(paths.checkout_root() or run_dir), start_new_session=True,
                                preexec_fn=ending_with_this_thread() if tied else None)
    _STARTED[proc.pid] = proc
    return proc, log_path


def started_pids() -> set[int]:
    """The proxies this process started and that may still run (e.g. to spare them when killing other children)."""
    return {pid for pid, proc in _STARTED.items() if proc.poll() is None}


# The gateway's line when it refuses an option at start-up (addon/configuration.py), after which mitmdump exits.
START_REFUSAL = re.compile(r"polar gateway: (.+); the proxy exits \(a bad option at start-up\)")


def _failures(procs, ports, infos, timeout: float, allow_fail_closed: bool) -> tuple[list[str], list[str], int]:
    """(warnings, errors, how many errors are option refusals) from the readiness answers; a kept fail-closed proxy's
    answer is marked ready."""
    warnings, errors, refusals = [], [], 0
    for (proc, log_path), port, info in zip(procs, ports, infos):
        if info is not None and not info.get("ready"):
            reason = f"\n{info['reason']}" if info.get("reason") else ""
            line = f"proxy on port {port}: {info.get('error') or 'failed closed'} (log {log_path}){reason}"
            if allow_fail_closed:
                warnings.append(f"warning: {line}")
                info["ready"] = True
            else:
                errors.append(f"error: {line}")
        elif not info:
            with open(log_path, "rb") as fh:
                tail = fh.read()[-3000:].decode("utf-8", "replace")
            code = proc.poll()
            refused = START_REFUSAL.search(tail) if code is not None else None
            if refused:  # the gateway refused an option at start-up and mitmdump exited: its one line says which
                errors.append(f"error: {refused.group(1)} (log {log_path})")
                refusals += 1
                continue
            why = f"exited with code {code}" if code is not None else f"was not ready after {timeout:g} s"
            errors.append(f"error: the proxy on port {port} {why} (log {log_path}):\n{tail}")
    return warnings, errors, refusals


def _ports(first: int, count: int) -> list[int]:
    ports: list[int] = []
    for i in range(count):
        port = first + i if first else free_port()
        while port in ports:
            port = free_port()
        ports.append(port)
    return ports


def start(upstream: str, *, flows: str | os.PathLike | None = None, run_dir: str | os.PathLike | None = None,
          count: int = 1, port: int = 0, listen_host: str = "127.0.0.1", sets: Sequence[str] = (),
          timeout: float = 30.0, allow_fail_closed: bool = False, confdir: str | None = None,
          mitmdump: str | None = None, env: Mapping[str, str] | None = None, tied: bool = False) -> Started:
    """Start `count` proxies in front of `upstream` (an OpenAI /v1 base URL) and write the run file of `run_dir`;
    ProxyError when nothing could start (its lines say why; every process started is stopped again). `tied`: the
    proxies end with the calling thread (a runner's own proxy); polar-proxy's detached ones are not."""
    # Options first: nothing is launched, nothing written, for a command line that cannot work.
    bad = option_error(upstream, count, port, timeout, sets)
    if bad:
        raise ProxyError(f"error: {bad}", code=2)
    upstream = absolute_upstream(upstream)
    binary, script, certs = find_mitmdump(mitmdump), addon_script(), resolve_confdir(confdir)
    run_dir = Path(os.path.abspath(run_dir if run_dir is not None else paths.default_run_dir()))
    flows = os.path.abspath(flows if flows is not None else paths.flows_dir())
    path = paths.proxy_run_file(run_dir)
    running = live_proxies(read_state(run_dir))
    if running:
        raise AlreadyRunning(path, running[0])
    notes: list[str] = []
    try:
        if ca.ensure_ca(str(certs), python=os.path.join(os.path.dirname(binary), "python")):
            notes.append(f"# a new CA in {certs} (agents trust it through the printed variables)")
    except (OSError, RuntimeError) as exc:
        raise ProxyError(f"error: {exc}", code=2) from None
    run_dir.mkdir(parents=True, exist_ok=True)
    ports = _ports(port, count)
    # Asked while the proxies start (mitmdump takes longer than the 2 s this may wait): no added latency.
    warning: list[str | None] = [None]
    checker = threading.Thread(target=lambda: warning.__setitem__(0, check_upstream(upstream)), daemon=True)
    checker.start()
    # All processes start at once (mitmdump's start-up is CPU-bound; they overlap), then each must answer ready.
    procs = [launch(binary, script, certs, run_dir, p, listen_host=listen_host, upstream=upstream, flows=flows,
                    sets=sets, env=env, tied=tied) for p in ports]
    infos = wait_ready([proc for proc, _ in procs], ports, timeout)
    checker.join(3)
    notes += [warning[0]] if warning[0] else []
    warnings, errors, refusals = _failures(procs, ports, infos, timeout, allow_fail_closed)
    if errors:
        stop_groups([proc.pid for proc, _ in procs if proc.poll() is None])
        # Only refused options: a command line that cannot work (2), told in their lines alone.
        raise ProxyError(errors if refusals == len(errors) else notes + warnings + errors,
                         code=2 if refusals == len(errors) else 1)
    ca_pem = ca.ca_cert(str(certs))
    # Each proxy's control endpoints (hold/release around a weight reload), from its readiness answer: their own
    # loopback port, and the file holding the token they require.
    entries = tuple(ProxyEntry(pid=proc.pid, port=p, log=log_path, control_url=(info or {}).get("control_url"),
                               control_token=(info or {}).get("control_token"))
                    for (proc, log_path), p, info in zip(procs, ports, infos))
    state = ProxyRunFile(proxies=entries, listen_host=listen_host, upstream=upstream, flows=flows, ca_pem=ca_pem,
                         ca_bundle=ca.bundle(ca_pem, str(run_dir)), confdir=str(certs))
    state.write(path)
    return Started(state, path, notes + warnings)


# ------------------------------------------------------------------------------------------------ stop, status

@dataclass(frozen=True)
class Stopped:
    """What stop found: the run file (None: there was none) and, per proxy, whether it was running."""

    path: Path
    proxies: list[tuple[ProxyEntry, bool]] = field(default_factory=list)
    found: bool = True


def stop(run_dir: str | os.PathLike | None = None, timeout: float = 5.0) -> Stopped:
    """SIGTERM every live proxy of the run file at once (each closes and renames its flow files), SIGKILL what is
    left after `timeout`, remove the run file. Only our own live proxies get a signal: a stale run file's pid may
    belong to someone else by now. ProxyError when the file is not a run file."""
    path = paths.proxy_run_file(os.path.abspath(run_dir if run_dir is not None else paths.default_run_dir()))
    if not path.is_file():
        return Stopped(path, found=False)
    try:
        state = ProxyRunFile.read(path)
    except RunFileError:
        state = None
    if state is None:
        raise ProxyError(f"error: {path} is not a run file of {command()}; remove it by hand")
    live = live_proxies(state)
    stop_groups([p.pid for p in live], timeout)
    for p in live:
        _STARTED.pop(p.pid, None)
    path.unlink(missing_ok=True)
    return Stopped(path, [(p, p in live) for p in state.proxies])


def status(run_dir: str | os.PathLike | None = None) -> tuple[Path, ProxyRunFile | None, list[dict]]:
    """The run file and, per proxy, {"proxy": K, "pid", "port", "running", "ready"} (`ready`: its readiness
    answer says so). The run file is None when there is none (or it is not one)."""
    path = paths.proxy_run_file(os.path.abspath(run_dir if run_dir is not None else paths.default_run_dir()))
    state = read_state(path.parent)
    rows = []
    for k, p in enumerate(state.proxies if state else ()):
        running = is_ours(p.pid, PROXY_MARKER)
        info = probe(p.port) if running and p.port else None
        rows.append({"proxy": k, "pid": p.pid, "port": p.port, "running": running,
                     "ready": bool(info and info.get("ready")), "control_url": p.control_url})
    return path, state, rows


def health(port: int, timeout: float = 2.0) -> dict | None:
    """The readiness answer of the proxy on `port` (see `probe`)."""
    return probe(port, timeout)
