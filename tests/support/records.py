"""Reading flow records in tests: every record of a flow directory, the one record of a call, and the check that a
record's token ids are what the scripted upstream sent."""

from __future__ import annotations

import os

from polar import records as rec


def flow_records(flows_dir: str) -> list[dict]:
    """Every record in the flow files (closed and `.open`) under `flows_dir`, by start time then id."""
    out = []
    for path in rec.expand_inputs([flows_dir]) if os.path.isdir(flows_dir) else []:
        for _, r in rec.iter_file(path):
            out.append(r)
    out.sort(key=lambda r: (r["t_start"] or 0, r["id"]))
    return out


def one_record(gateway) -> dict:
    """The only record this test's calls wrote through `gateway`."""
    records = gateway.records()
    assert len(records) == 1, [r.get("error") for r in records]
    return records[0]


def assert_tokens_match(record: dict, upstream, index: int = -1) -> None:
    """The record's prompt and completion ids are those of the upstream's response `index` (default: the last)."""
    truth = upstream.responses[index]
    assert rec.token_ids(record, "prompt_token_ids") == truth.prompt_token_ids
    assert rec.token_ids(record, "completion_token_ids") == truth.completion_ids
