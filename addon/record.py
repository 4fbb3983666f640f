"""Kept for one release; import polar.records.

The flow record contract and the flow directory moved to `polar.records` (`polar.records.schema`,
`polar.records.flowdir`); this module re-exports the names it used to define, and `python -m polar.addon.record
FILE...` still prints flow files (as `python -m polar.records FILE...` does).
"""

from __future__ import annotations

import sys

from polar.records.flowdir import (  # noqa: F401
    FILE_SUFFIX, OPEN_SUFFIX, FileScan, FlowWriter, LowDiskSpace, NotAFlowFile, PromptResolver, TornTail,
    expand_inputs, iter_file, iter_files, not_a_flow_file, read_at, sniff,
)
from polar.records.inspect import ID_FIELDS  # noqa: F401
from polar.records.inspect import main as _main
from polar.records.schema import (  # noqa: F401
    ERROR_STAGES, FIELDS, PROTOCOLS, REDACTED, SECRET_HEADERS, VERSION, SchemaError, is_constrained, new_record,
    normalize, pack, pack_floats, pack_ids, redact_headers, token_ids, unpack_floats, unpack_ids, uuid7, validate,
    version_problem,
)


def main(argv: list[str] | None = None) -> int:
    """`python -m polar.records`'s inspector under this module's old name."""
    return _main(argv, prog="python -m polar.addon.record")


if __name__ == "__main__":
    sys.exit(main())
