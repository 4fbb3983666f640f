"""Files written whole or not at all — the project's one way to replace a file a reader may be reading: the bytes go
to a hidden temporary name beside the target (this process's own, numbered), then one rename, so a reader sees the
old file or the new one, never part of one; a failed write leaves no temporary behind. Standard library only.
(polar.rollout.serve_protocol, which must stand on the standard library alone, keeps its own copy of the rule.)"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from typing import Any

_seq = itertools.count()


def write_atomic(path: str | os.PathLike, data: bytes | str, *, mode: int | None = None) -> None:
    """`data` (text is UTF-8) at `path`, replacing whatever is there in one rename; `mode` sets the file's bits."""
    path = os.fspath(path)
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{next(_seq)}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | os.PathLike, doc: Any, *, indent: int | None = 1, mode: int | None = None,
                      **dumps: Any) -> None:
    """`doc` as JSON (one trailing newline) at `path`, whole or not at all."""
    write_atomic(path, json.dumps(doc, indent=indent, **dumps) + "\n", mode=mode)
