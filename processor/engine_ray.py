"""`--engine ray`: the index pass and the per-session merge as Ray tasks (docs/architecture.md#scale-out).

- Index: one task per flow file (`load.scan_file`); the driver joins the answers in file order, so the index is the
  local engine's.
- Merge: sessions are partitioned by `engine.partition_of` (a stable hash); each partition is one streaming task
  that loads its sessions' records with positioned reads (a session's records may sit in files written by several
  proxies) and yields one `GroupProducts` per session, in the driver's order. The driver takes them in its global
  (group, session) order and writes exactly what the local engine writes, so the outputs are byte-for-byte equal.
  A worker holds one session at a time; finished products wait in Ray's object store (which spills to disk).
- Flow files must be readable at the same paths on every node (a shared filesystem) when ADDR is a cluster.
This is the only module that imports ray.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable, Iterator

import ray

from polar.processor.engine import GroupProducts, Settings, Work, group_products, partition_of
from polar.processor.load import Index, InputError, RecordSource, scan_file


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


@ray.remote
def _scan(files: list[str], file_no: int):
    idx = Index(files=files)
    scan_file(files[file_no], file_no, idx)
    return idx.entries, idx.scans[0], idx.total_bytes


@ray.remote(num_returns="streaming")
def _merge_partition(part: Work, files: list[str], settings: Settings):
    """One partition's groups, in the order given; then one last item: this worker's pid and peak RSS."""
    source = RecordSource(files)
    try:
        for session, entries in part:
            yield group_products(session, source.load(entries), files, settings)
    finally:
        source.close()
    yield {"pid": os.getpid(), "peak_rss": _peak_rss(), "groups": len(part)}


def _get(ref):
    """ray.get, re-raising a task's own exception (InputError, MissingEot, …) as itself, so the CLI's messages and
    exit codes are the local engine's."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, Exception):
            raise cause from None
        raise


class RayEngine:
    """The `engine.Engine` seam on Ray: the index pass one task per file, the merge one streaming task per partition."""

    name = "ray"

    def __init__(self, address: str | None = None, partitions: int | None = None):
        self.owned = not ray.is_initialized()
        if self.owned:
            # No address: Ray's own rule ($RAY_ADDRESS, else a new local instance on this machine).
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        self.cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.partitions = partitions or 4 * self.cpus
        self.workers: list[dict] = []
        self._gens: dict = {}

    def index(self, files: list[str], progress: Callable[[int, int], None] | None = None) -> Index:
        """The index pass, one task per file; the same Index the local pass builds."""
        if not files:
            return Index(files=[])
        files = list(files)
        try:
            sizes = {i: os.path.getsize(p) for i, p in enumerate(files)}
        except FileNotFoundError as exc:
            raise InputError(str(exc)) from exc
        fref = ray.put(files)
        refs = [_scan.remote(fref, i) for i in range(len(files))]
        pending, done_bytes, total = {r: i for i, r in enumerate(refs)}, 0, sum(sizes.values())
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for r in ready:
                done_bytes += sizes[pending.pop(r)]
            if progress is not None:
                progress(done_bytes, total)
        index = Index(files=files)
        for r in refs:
            entries, scan, nbytes = _get(r)
            index.entries.extend(entries)
            index.scans.append(scan)
            index.total_bytes += nbytes
        return index

    def groups(self, work: Work, files: list[str], settings: Settings) -> Iterator[GroupProducts]:
        """Products of `work`'s groups in `work`'s order; every partition runs as soon as a CPU is free."""
        if not work:
            return
        parts: dict[int, Work] = {}
        for session, entries in work:
            parts.setdefault(partition_of(session, self.partitions), []).append((session, entries))
        fref, sref = ray.put(files), ray.put(settings)
        # Largest partitions first: they bound the run's wall time.
        order = sorted(parts, key=lambda p: -sum(len(e) for _, e in parts[p]))
        self._gens = {p: _merge_partition.remote(parts[p], fref, sref) for p in order}
        for session, _ in work:
            ref = next(self._gens[partition_of(session, self.partitions)])
            prod = _get(ref)
            del ref
            yield prod
        for p, gen in self._gens.items():
            self.workers.append(_get(next(gen)))
        self._gens = {}

    def stats(self) -> dict:
        """Engine facts for report.json: partitions, CPUs, and each partition task's worker pid and peak RSS."""
        peaks: dict[int, int] = {}
        for w in self.workers:
            peaks[w["pid"]] = max(peaks.get(w["pid"], 0), w["peak_rss"])
        return {"name": self.name, "cpus": self.cpus, "partitions": self.partitions, "tasks": len(self.workers),
                "workers": [{"pid": pid, "peak_rss_mb": round(rss / 1e6, 1)} for pid, rss in sorted(peaks.items())]}

    def close(self) -> None:
        for gen in self._gens.values():
            try:
                ray.cancel(gen, force=True)
            except Exception:  # noqa: BLE001 — best effort while failing anyway
                pass
        self._gens = {}
        if self.owned and ray.is_initialized():
            ray.shutdown()
