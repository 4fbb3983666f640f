"""The run's proxy: the one the runner starts (--upstream, through polar.launch.proxy; a child of this process,
flows in RUN/flows) or a running one (--proxy-json); its readiness probe; stopping it when the run ends."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from polar.launch import ca, paths, runfiles
from polar.launch import proxy as launch_proxy
from polar.launch.runfiles import ProxyRunFile, RunFileError, read_vllm
from polar.rollout.common import UsageError
from polar.rollout.procs import is_our_proxy, stop_process_group
from polar.rollout.reporter import Reporter
from polar.rollout.sandbox import registry


@dataclass
class Proxy:
    port: int
    ca_pem: str
    ca_bundle: str
    flows: str
    own: bool
    pid: int | None = None
    run_dir: str | None = None  # the own proxy's run directory (RUN/proxy)
    info: dict = field(default_factory=dict)

    def describe(self) -> dict:
        return {"own": self.own, "pid": self.pid, "port": self.port, "run_dir": self.run_dir, "flows": self.flows,
                "ca_pem": self.ca_pem, "ca_bundle": self.ca_bundle}


def start_proxy(run_dir: Path, upstream: str, sets: list[str], confdir: str | None = None,
                report: Reporter | None = None) -> Proxy:
    """The runner's own proxy: run file, logs and CA bundle in RUN/proxy, flows in RUN/flows. It is a child of this
    process (in its own process group), so `kill_children` must spare it; it is tied to the calling thread, so a
    SIGKILLed runner or serve leaves no proxy behind (SIGTERM: its open flow files are closed whole)."""
    pdir = run_dir / "proxy"
    try:
        started = launch_proxy.start(upstream, flows=run_dir / "flows", run_dir=pdir, sets=sets, confdir=confdir,
                                     tied=True)
    except launch_proxy.ProxyError as exc:
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        raise UsageError(f"the proxy did not start ({' | '.join(lines[-3:]) or f'exit {exc.code}'})") from None
    for line in started.notes:
        (report or Reporter()).note(line.lstrip("# "))
    s = started.state
    return Proxy(port=s.port, ca_pem=s.ca_pem, ca_bundle=s.ca_bundle, flows=s.flows, own=True, pid=s.pid,
                 run_dir=str(pdir))


def stop_proxy(proxy: Proxy | None) -> None:
    if proxy is None or not proxy.own or proxy.pid is None:
        return
    if is_our_proxy(proxy.pid):
        stop_process_group(proxy.pid)
    if proxy.run_dir:
        runfiles.remove(paths.proxy_run_file(proxy.run_dir))


def external_proxy(path: Path) -> Proxy:
    try:
        state = ProxyRunFile.read(path)
    except RunFileError as exc:
        raise UsageError(f"--proxy-json {path}: not a proxy run file of polar-proxy ({exc})") from None
    if state is None:
        raise UsageError(f"--proxy-json {path}: cannot read it (no such file)")
    if state.port is None or not state.ca_pem or not state.flows:
        raise UsageError(f"--proxy-json {path}: not a proxy run file of polar-proxy (needs port, ca_pem, flows)")
    proxy = Proxy(port=state.port, ca_pem=state.ca_pem, ca_bundle=state.ca_bundle or "", flows=state.flows,
                  own=False, pid=state.pid)
    if not proxy.ca_bundle or not os.path.isfile(proxy.ca_bundle):
        proxy.ca_bundle = ca.bundle(proxy.ca_pem, str(Path(path).parent))
    return proxy


def probe_ready(port: int, timeout: float = 3.0) -> dict | None:
    """The gateway's readiness answer (`http://polar.gateway/ready` through the proxy), or None."""
    return launch_proxy.health(port, timeout)


def describe(proxy: Proxy) -> dict:
    """run.json's `proxy`: where it is, and what its readiness answer said of it."""
    info = proxy.info
    return {**proxy.describe(), "exact": info.get("exact"), "other_hosts": info.get("other_hosts"),
            "version": info.get("version"), "upstream": info.get("upstream")}


def attach(o, run_dir: Path, report: Reporter | None = None, sets: list[str] = ()) -> tuple[Proxy, str | None]:
    """(the run's proxy, the run file it was read from): its own (--upstream), a running one (--proxy-json), or
    the run dir's proxy.json, else an own one on vllm.json's upstream. `o` is the run's Options; `sets`: the runner's
    own --proxy-set items for a proxy it starts (--turn-states' announce endpoint)."""
    boxed = registry.get(o.sandbox).isolated
    upstream, proxy_json = o.upstream, o.proxy_json
    if not upstream and not proxy_json:
        default, vllm = paths.proxy_run_file(), paths.vllm_run_file()
        if default.is_file():
            proxy_json = str(default)
        elif vllm.is_file():
            with contextlib.suppress(RunFileError, AttributeError):
                upstream = read_vllm(vllm).base_url  # a pool's: its replicas' comma-separated base URLs
        if not upstream and not proxy_json:
            raise UsageError("no model backend: pass --upstream URL (an OpenAI /v1 base URL of vLLM or SGLang; "
                             "the runner starts its proxy) or --proxy-json FILE (a running polar-proxy)")
    if upstream:
        from polar.rollout.options import proxy_sets

        proxy = start_proxy(run_dir, upstream, [*proxy_sets(o.proxy_set, o.sandbox), *sets], o.confdir, report)
    else:
        proxy = external_proxy(Path(proxy_json))
    return proxy, proxy_json


def check_ready(proxy: Proxy, boxed: bool, proxy_json: str | None) -> None:
    """The proxy answers ready, and refuses non-provider hosts when the samples are sandboxed; its readiness answer
    lands in `proxy.info` (an external proxy's flow directory as it says)."""
    info = probe_ready(proxy.port)
    if not info or not info.get("ready"):
        why = (info or {}).get("error") or "no readiness answer"
        raise UsageError(f"the proxy on port {proxy.port} is not ready ({why})")
    proxy.info = info
    if boxed and info.get("other_hosts") != "refuse":
        raise UsageError(f"the proxy on port {proxy.port} ({proxy_json}) does not refuse non-provider hosts "
                         f"(readiness says other_hosts: {info.get('other_hosts', 'unknown')!r}); a sandboxed run "
                         f"needs one started with --set polar_other_hosts=refuse, or pass --upstream URL")
    if proxy.own is False and os.path.abspath(proxy.flows) != os.path.abspath(info.get("flows") or proxy.flows):
        proxy.flows = info["flows"]
