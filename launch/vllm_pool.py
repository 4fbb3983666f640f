"""A pool of local vLLM servers (`polar-vllm start --replicas N`): `start_pool`, `stop_pool` (what `vllm.stop` does for
a pool run file) and `replica_health` (what `vllm.status` and `polar-vllm status` read).

A pool (`StartSpec.replicas` N > 1, `start_pool`): N servers of the same spec, each on its own port (free ones, or
`port`, `port`+1, …) with its own log `<run dir>/vllm-<P>.log`. On a GPU build each replica gets one visible CUDA
device (CUDA_VISIBLE_DEVICES=<that device>; more replicas than devices is BadInput; replicas 0, `--replicas auto`,
is one per visible device); on a CPU build they share the CPUs. They start side by side and `start_pool` waits for all
of them; when one exits or is not healthy in time, the others are stopped and the Fail carries that replica's log
tail. Each replica writes its own run file, `<stem>.r<i>.json` beside the pool's (runfiles.replica_run_file), with
its own start arguments (its port and device), then the pool run file (`VllmPoolRunFile`) lists them; its
`base_url` is the comma-separated list of the replicas' base URLs. A healthy pool of the same kind (model, dtype,
dev, replica count, ports) is reused; a pool whose replicas all died restarts serving the weights their run files
name (they must agree); one with some replicas alive is an error (stop it first). `stop` and `status` act on every
replica of a pool run file (`status` is the pool only when every replica is healthy).
Standard library only, as polar.launch.vllm; it stands on vllm_server and vllm_args, beside them."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import threading
import time
from pathlib import Path

from polar.launch import paths
from polar.launch.process import free_port, port_in_use, stop_groups
from polar.launch.runfiles import VllmPoolRunFile, VllmReplica, VllmRunFile, replica_run_file
from polar.launch.vllm_args import BadInput, Fail, StartSpec
from polar.launch.vllm_server import (Log, Stopped, _run_file_of, _spawn, check_parallel, command, healthy,
                                      is_cpu_build, is_server, quiet, read_pool, read_run_file, replica_infos,
                                      resolve_model, restore_weight_version, restored_weights, say, start, tail,
                                      venv_python, warm_up)

def cuda_devices() -> list[str]:
    """The visible CUDA devices: CUDA_VISIBLE_DEVICES when set, else nvidia-smi's indexes; [] without either."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [d.strip() for d in given.split(",") if d.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def replica_devices(replicas: int, venv: Path | None) -> list[str | None]:
    """The device of each replica: None each on a CPU build; one visible CUDA device each on a GPU build."""
    if is_cpu_build(venv):
        if replicas == 0:
            raise BadInput("--replicas auto is one replica per CUDA device, and this vLLM is a CPU build: pass "
                           "--replicas N")
        return [None] * replicas
    devices = cuda_devices()
    if not devices:
        raise BadInput(f"--replicas {replicas or 'auto'}: a GPU build of vLLM gives each replica its own CUDA "
                       f"device, and none is visible (CUDA_VISIBLE_DEVICES, nvidia-smi); pass --replicas 1")
    if replicas > len(devices):
        raise BadInput(f"--replicas {replicas}: one replica per CUDA device, and {len(devices)} are visible "
                       f"({','.join(devices)}); pass --replicas {len(devices)} or fewer")
    return devices[: replicas or len(devices)]


def _pool_ports(first: int | None, n: int) -> list[int]:
    if first is not None:
        ports = [first + i for i in range(n)]
        busy = [p for p in ports if port_in_use(p)]
        if busy or ports[-1] > 65535:
            raise Fail(f"--port {first} with --replicas {n} needs ports {first}-{first + n - 1} free on 127.0.0.1 "
                       f"({', '.join(map(str, busy)) or 'past 65535'} not); pass another --port, or none")
        return ports
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _reuse_pool(pool: VllmPoolRunFile | None, spec: StartSpec, model_dir: Path, n: int,
                log: Log) -> VllmPoolRunFile | None:
    """The pool of the run file when every replica is healthy and of the same kind; None when none of its replicas
    runs; Fail otherwise (some run, or another kind: stop it first)."""
    if pool is None:
        return None
    infos = replica_infos(pool)
    live = [i for i in infos if i is not None and is_server(i.pid)]
    if not live:
        return None
    stop_first = f"run `{command()} stop --run-file {spec.run_file}` first, or pass another --run-file"
    if len(live) < len(infos) or not all(healthy(i.port or 0) for i in live):
        raise Fail(f"{len(live)} of the {len(infos)} replicas of {spec.run_file} run, not all healthy; {stop_first}")
    same = (len(infos) == n and Path(pool.model_dir or "") == model_dir and (pool.dtype or "bfloat16") == spec.dtype
            and pool.dev == spec.dev and spec.port in (None, pool.replicas[0].port))
    if not same:
        raise Fail(f"a pool of {len(infos)} vLLM replicas already runs at {pool.base_url} (model {pool.model}, dtype "
                   f"{pool.dtype}, dev {pool.dev}); {stop_first}")
    log(f"already running ({len(infos)} replicas, model {pool.model})")
    return pool


def _wait_all_healthy(procs: list[subprocess.Popen], ports: list[int], logs: list[Path], timeout: float) -> None:
    """Every replica healthy, or Fail with the first failing one's log tail after stopping them all."""
    deadline = time.monotonic() + timeout
    pending = set(range(len(procs)))
    n = len(procs)

    def fail(i: int, why: str) -> Fail:
        stop_groups([p.pid for p in procs], 15)
        return Fail(f"replica {i} of {n} (port {ports[i]}) {why}; stopped all {n} replicas. Log tail ({logs[i]}):\n"
                    f"{tail(logs[i])}")

    try:
        while pending:
            for i in sorted(pending):
                code = procs[i].poll()
                if code is not None:
                    raise fail(i, f"exited with code {code} before becoming healthy")
                if healthy(ports[i]):
                    pending.discard(i)
            if pending and time.monotonic() > deadline:
                raise fail(min(pending), f"was not healthy after {timeout:.0f} s")
            if pending:
                time.sleep(0.5)
    except KeyboardInterrupt:
        stop_groups([p.pid for p in procs], 15)
        raise


def replica_cores(replicas: int, cores: list[int]) -> list[str]:
    """Each CPU replica's own cores for its engine's threads (VLLM_CPU_OMP_THREADS_BIND), the cores split evenly:
    vLLM's `auto` binds every replica's engine to the same first core (and reserves the next), so two replicas on one
    machine took turns on one core while the other idled — the stalls of a CPU pool under load. With fewer cores
    than replicas, replicas share them round-robin."""
    cores = sorted(cores)
    if len(cores) < replicas:
        return [str(cores[i % len(cores)]) for i in range(replicas)]
    out = []
    for i in range(replicas):
        mine = cores[i * len(cores) // replicas:(i + 1) * len(cores) // replicas]
        out.append(f"{mine[0]}-{mine[-1]}" if len(mine) > 1 else str(mine[0]))
    return out


def start_pool(spec: StartSpec, log: Log = say) -> VllmPoolRunFile | VllmRunFile:
    """Start (or find running) the pool `spec` describes (`spec.replicas` servers, 0: one per visible CUDA device):
    the pool run file, written once every replica answers /health. A count that comes to one is one server."""
    if spec.device is not None and spec.replicas != 1:
        raise BadInput("--device is the device of one server; a pool gives each replica one of the visible CUDA "
                       "devices: limit them with CUDA_VISIBLE_DEVICES instead")
    name, model_dir, preset = resolve_model(spec.model, spec.models_dir)
    name = spec.name or name
    py = venv_python(spec.vllm_venv)
    check_parallel(spec, py)
    devices = replica_devices(spec.replicas, py.parent.parent)
    n = len(devices)
    if n == 1:
        return start(dataclasses.replace(spec, replicas=1, device=devices[0]), log)
    single = read_run_file(spec.run_file)
    if single is not None and is_server(single.pid):
        raise Fail(f"a vLLM already runs at {single.base_url} from {spec.run_file} (one server); run "
                   f"`{command()} stop --run-file {spec.run_file}` first, or pass another --run-file")
    reused = _reuse_pool(read_pool(spec.run_file), spec, model_dir, n, log)
    if reused is not None:
        return reused
    ports = _pool_ports(spec.port, n)
    run_files = [replica_run_file(spec.run_file, i) for i in range(n)]
    # Each replica's run file of a pool that died names the weights it served: all serve them again (they agree,
    # since publication reloads every replica or none).
    served = [restored_weights(read_run_file(rf), model_dir, dtype=spec.dtype, dev=spec.dev, port=None,
                               run_file=rf, log=quiet) for rf in run_files]
    if len(set(served)) > 1:
        listed = ", ".join(f"{rf.name}: {w} ({v})" for rf, (w, v) in zip(run_files, served))
        raise Fail(f"the replicas of {spec.run_file} that died served different weights ({listed}); remove their run "
                   f"files to start from {model_dir}")
    weights_dir, weight_version = served[0]
    if weight_version is not None:
        log(f"serving the reloaded weights {weights_dir} (weight_version {weight_version}) again, as the run files "
            f"of the replicas that died say")
    specs = [dataclasses.replace(spec, replicas=1, port=port, device=device, run_file=rf)
             for port, device, rf in zip(ports, devices, run_files)]
    t0 = time.monotonic()
    # All at once: on CPU they contend for the cores, still sooner than one after the other.
    started = []
    cores = replica_cores(n, list(os.sched_getaffinity(0))) if devices[0] is None else [None] * n
    try:
        for i, s in enumerate(specs):
            on = f" on CUDA device {s.device}" if s.device is not None else f" on CPU core(s) {cores[i]}"
            log(f"starting replica {i} of {n}: {name} ({model_dir}) on port {s.port}{on}; log: "
                f"{paths.default_run_dir() / f'vllm-{s.port}.log'}")
            started.append(_spawn(py, s, name, model_dir, weights_dir, int(s.port), preset, s.device, cores[i]))
    except BaseException:
        stop_groups([p.pid for p, _ in started], 15)
        raise
    procs, logs = [p for p, _ in started], [lp for _, lp in started]
    _wait_all_healthy(procs, ports, logs, spec.timeout)

    def settle(port: int) -> None:
        if weight_version is not None:
            restore_weight_version(port, weight_version, log)
        warm_up(port, name)

    warmers = [threading.Thread(target=settle, args=(port,), daemon=True) for port in ports]
    for t in warmers:
        t.start()
    for t in warmers:
        t.join()
    replicas = []
    for s, proc, log_path in zip(specs, procs, logs):
        info = _run_file_of(proc, int(s.port), s, name, model_dir, weights_dir, weight_version, preset, log_path, py)
        info.write(s.run_file)
        replicas.append(VllmReplica(run_file=str(s.run_file), port=s.port, base_url=info.base_url, device=s.device))
    pool = VllmPoolRunFile(replicas=tuple(replicas), model=name, model_dir=str(model_dir), dtype=spec.dtype,
                           dev=spec.dev, start_args=tuple(dataclasses.replace(spec, replicas=n).to_args()))
    pool.write(spec.run_file)
    log(f"{n} replicas ready after {time.monotonic() - t0:.1f} s (pids {', '.join(str(p.pid) for p in procs)})")
    return pool


def stop_pool(run_file: Path, pool: VllmPoolRunFile, timeout: float, log: Log) -> Stopped:
    found = []
    for replica, info in zip(pool.replicas, replica_infos(pool)):
        pid = info.pid if info is not None else None
        if is_server(pid):
            log(f"stopping replica pid {pid} (port {replica.port})")
            found.append(Stopped("stopped", pid, replica.port))
        else:
            log(f"replica pid {pid} (port {replica.port}) is gone")
            found.append(Stopped("stale", pid, replica.port))
    for pgid in stop_groups([s.pid for s in found if s.state == "stopped" and s.pid], timeout):
        log(f"process group {pgid} still alive after {timeout:.0f} s; sent SIGKILL")
    for path in pool.run_files:
        path.unlink(missing_ok=True)
    run_file.unlink(missing_ok=True)
    state = "stopped" if any(s.state == "stopped" for s in found) else "stale"
    return Stopped(state, replicas=tuple(found))


def replica_health(pool: VllmPoolRunFile) -> list[tuple[VllmReplica, VllmRunFile | None, bool]]:
    """(entry, its own run file, whether its server is ours and healthy) for each replica of the pool."""
    out = []
    for replica, info in zip(pool.replicas, replica_infos(pool)):
        ok = info is not None and is_server(info.pid) and healthy(info.port or 0)
        out.append((replica, info, ok))
    return out
