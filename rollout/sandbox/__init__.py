"""Sandboxes for agents and verifiers behind one seam: a backend fills the `Sandbox` protocol (`base`: available,
prepare, command, memory_limit, kill, cleanup, and the facts callers ask — isolated, runs_images, exports_rootfs,
warm_slots, labels_runs, real_uid) and is registered once (`registry`: bwrap, docker, none); `run` runs one sandbox
to its end whatever the backend; `view` is what every backend's sandbox shows; `control`, `relay` and `cgroup` its
control directory, its one path out and its limits; `warm` the warm slots of --warm-agents."""
