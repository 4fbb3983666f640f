"""polar.records: the flow record contract and the flow directory — the floor every other part of the house stands on.

This package imports only the standard library and msgpack (never another polar package; Polars only in `out`): the
gateway writes records through it, and the processor, the rollout runner and the trainer read them through it.

- `schema`: the record itself — its fields and version (FIELDS, VERSION, `new_record`, `validate`, `normalize`), the
  token-array encodings (`pack_ids`, `pack_floats`, `ascii_ids`; read back by `ids_blob`, `unpack_ids`, `id_count`),
  header redaction, and record ids (`uuid7`, the project's one).
- `flowdir`: the flow directory — writer file names (`WriterName`), the writer (`FlowWriter`), whole-record reads
  (`iter_file`, `iter_files`, `PromptResolver`), the skim of a record's small fields (`skim`, `skim_file`),
  positioned reads (`read_at`, `record_at`, `RecordFiles`) and dead-writer recovery (`close_dead_writers`).
- `inspect`: `python -m polar.records FILE...` prints flow files.
- `out`: OUT's tables, the processor's contract with every trainer-side reader — typed, versioned Polars schemas with
  their rules (`SEQUENCES`, `CALLS`, `BATCHES`, `read`, `VERSION`). The one module that imports Polars: this package
  does not import it, so `import polar.records` (the gateway's, the rollout's) never loads Polars.
- `results`: a rollout RUN's results.jsonl and its one rule, a sample's highest attempt (`read_latest`).
- `estimators`: evaluation over a RUN's samples, as pure functions: pass@k, the resolved rate and its bootstrap
  interval over tasks (polar-rollout's summary, polar-train's held-out pass@1).
- `files`: a file replaced whole or not at all (`write_atomic`, `write_json_atomic`), for every writer of the house.
"""

from .flowdir import (  # noqa: F401
    FILE_SUFFIX, OPEN_SUFFIX, RECORD_ERRORS, FileScan, FlowWriter, LowDiskSpace, NotAFlowFile, PromptResolver,
    RecordFiles, TornTail, Undecodable, WriterName, close_dead_writers, closed_name, expand_inputs, flow_stem,
    is_open_name, iter_file, iter_files, local_host, not_a_flow_file, read_at, record_at, skim, skim_file, sniff,
    writer_stamp,
)
from .inspect import main  # noqa: F401
from .schema import (  # noqa: F401
    ASCII_ID_FIELDS, ASCII_IDS, ERROR_STAGES, FIELDS, PROTOCOLS, REDACTED, SECRET_HEADERS, VERSION, SchemaError,
    ascii_ids, id_count, ids_blob, is_ascii_ids, is_ids, is_constrained, new_record, normalize, pack, pack_floats, pack_ids,
    redact_headers, token_ids, unpack_floats, unpack_ids, uuid7, validate, version_problem,
)
