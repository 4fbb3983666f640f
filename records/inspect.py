"""The flow-file inspector: `python -m polar.records FILE...` prints the records of flow files, directories or globs.

A summary per record by default (token arrays as a count and their first ids, bodies cut to 120 characters);
`--full` prints every value whole. Exit codes: 0 ok, 2 bad input (a path that is not there, a file that is not a
flow file, a record this reader cannot read); every error is one line on stderr, a torn tail one `#` line.
"""

from __future__ import annotations

import sys

import msgpack

from .flowdir import FILE_SUFFIX, OPEN_SUFFIX, FileScan, NotAFlowFile, expand_inputs, iter_file
from .schema import SchemaError, unpack_floats, unpack_ids

PROG = "python -m polar.records"

# Fields that hold token ids (int32 bytes, or ASCII ids) (printed as ids, never as bytes).
ID_FIELDS = ("prompt_token_ids", "completion_token_ids", "prompt_tail_ids")


def _summary(record: dict) -> dict:
    out = {}
    for key, value in record.items():
        if key in ID_FIELDS and isinstance(value, (bytes, msgpack.ExtType)):
            try:
                ids = unpack_ids(value)
            except ValueError as exc:
                out[key] = f"<undecodable ids: {exc}>"
                continue
            form = " (ASCII)" if isinstance(value, msgpack.ExtType) else ""
            out[key] = f"{len(ids)} ids{form}: {ids[:8]}{'…' if len(ids) > 8 else ''}"
        elif key == "completion_logprobs" and isinstance(value, bytes):
            lps = unpack_floats(value)
            out[key] = f"{len(lps)} logprobs: {[round(x, 3) for x in lps[:4]]}{'…' if len(lps) > 4 else ''}"
        elif isinstance(value, bytes):
            out[key] = f"<{len(value)} bytes> {value[:120].decode('utf-8', 'replace')}{'…' if len(value) > 120 else ''}"
        else:
            out[key] = value
    return out


def _full(record: dict) -> dict:
    return {k: (unpack_ids(v) if k in ID_FIELDS and isinstance(v, (bytes, msgpack.ExtType))
                else unpack_floats(v) if k == "completion_logprobs" and isinstance(v, bytes)
                else v.decode("utf-8", "replace") if isinstance(v, bytes) else v)
            for k, v in record.items()}


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Print flow files. Exit codes: 0 ok, 2 bad input (a path that is not there, a file that is not a flow file,
    a record this reader cannot read); every error is one line on stderr, headed by `prog`."""
    import argparse
    import json

    from polar.records.cliargs import OneLineParser

    parser = OneLineParser(prog=prog, description="Print flow records.")
    parser.add_argument("paths", nargs="+", help="flow files, directories or globs")
    parser.add_argument("--full", action="store_true", help="print whole bodies and token arrays")
    args = parser.parse_args(argv)
    err = lambda msg: print(f"{prog}: error: {msg}", file=sys.stderr) or 2  # noqa: E731
    try:
        paths = expand_inputs(args.paths)
    except FileNotFoundError as exc:
        return err(f"{exc}; pass flow files, directories or globs that exist")
    if not paths:
        return err(f"no flow files (*{FILE_SUFFIX}, *{OPEN_SUFFIX}) in {' '.join(args.paths)}")
    status = 0
    for path in paths:
        scan = FileScan(path)
        print(f"# {path}")
        try:
            for offset, rec in iter_file(path, scan):
                if args.full:
                    print(json.dumps({"offset": offset, **_full(rec)}, ensure_ascii=False, default=str))
                else:
                    print(json.dumps({"offset": offset, **_summary(rec)}, ensure_ascii=False, default=str, indent=1))
        except NotAFlowFile as exc:
            status = err(str(exc))
            continue
        except SchemaError as exc:
            status = err(f"{path}: {exc}")
        except OSError as exc:
            status = err(f"{path}: {exc.strerror or exc}")
            continue
        if scan.torn_tail:
            print(f"# {scan.torn_tail.describe()}", file=sys.stderr)
        print(f"# {scan.records} records")
    return status
