"""The recorder: owns one call's flow record, from the agent's request to the file.

The driver tells it what happened (`set`, `note`, `error`, `take_stream`); it alone builds the record
(`record.new_record`, so every field of `record.FIELDS` is there) and writes it, once. The promise "a record is on
disk before the agent receives the last byte of its response" is `seal()`: every ending of a call — the streamed
finish, the JSON body, a provider error, a mid-stream error event — calls it before sending its last bytes, and a
record that could not be written raises `RecordLost` there, so the agent is never handed an answer nobody recorded.
Exact mode's hooks run around the write: `finish` (echo check, compact prompt) before it, `commit` (cache the turn as
the next call's parent) after it.
"""

from __future__ import annotations

import logging
import time

import orjson

from polar import records as rec
from polar.records import FlowWriter

from .codecs.base import GatewayError

log = logging.getLogger("polar.call")

_FIELDS = frozenset(rec.FIELDS)


class RecordLost(RuntimeError):
    """The record could not be written: the call must end in the protocol's error, not in a success."""


class Recorder:
    def __init__(self, writer: FlowWriter, exact=None, **fields):
        self.writer = writer
        self.exact = exact  # exact.ExactMode when polar_exact is on
        self.exact_turn = None  # exact.ExactTurn, set by the driver once prepared
        self.record = rec.new_record(**fields)
        self.reader = None  # stream_reader.StreamReader: its token data goes into the record at the write
        self.sealed = False
        self.lost: OSError | None = None

    # ------------------------------------------------------------------------------------------ what happened

    def set(self, **values) -> None:
        unknown = values.keys() - _FIELDS
        if unknown:
            raise ValueError(f"not record fields: {sorted(unknown)}")
        self.record.update(values)

    def note(self, *notes: str) -> None:
        self.record["normalizations"].extend(notes)

    def error(self, stage: str, err: GatewayError, status: int | None) -> None:
        """The first failure of the call (later ones are consequences and do not replace it)."""
        if self.record["error"] is None:
            self.record["error"] = {"stage": stage, "status": status, "type": err.kind, "message": err.message[:4000]}

    @property
    def has_error(self) -> bool:
        return self.record["error"] is not None

    def take_stream(self, reader) -> None:
        self.reader = reader

    def skip(self) -> None:
        """No record for this call (below polar_min_free_mb: there is no room for one either; logged by the caller)."""
        self.sealed = True

    # ------------------------------------------------------------------------------------------ the write

    def seal(self) -> None:
        """Write the record now (once); raise RecordLost if that failed. Call before the agent's last bytes."""
        self._write()
        if self.lost is not None:
            raise RecordLost(f"the flow record could not be written: {self.lost}")

    def close(self) -> None:
        """At the end of every generation call: write the record if no ending sealed it (e.g. the agent left)."""
        self._write()

    def _write(self) -> None:
        if self.sealed:
            return
        self.sealed = True
        r = self.record
        r["t_end"] = time.time()
        if self.reader is not None:
            self._absorb(self.reader)
        # exact mode compares and caches the prompt as a list; the plain path keeps the backend's digits
        prompt = self._exact_prompt() if self.reader is not None and self.exact_turn is not None else None
        try:
            if self.exact_turn is not None:
                self.exact.finish(self.exact_turn, r, prompt)
            rec.validate(r)
            self.writer.write(r)
            if self.exact_turn is not None and self.reader is not None:
                self.exact.commit(self.exact_turn, r, prompt, self.reader.completion_token_ids, r["assistant"])
        except (OSError, ValueError) as exc:
            # The writer has already cut the file back and moved to a new one; seal() tells the driver.
            log.error("polar: could not write record %s: %s", r["id"], exc)
            self.lost = exc if isinstance(exc, OSError) else OSError(str(exc))

    def _exact_prompt(self) -> list[int] | None:
        """The echoed prompt as a list. When the backend's digits are exactly the ids exact mode sent (serialized
        as the proxy sent them), those are the list: the echo check is a bytes compare and nothing is decoded."""
        rd, sent = self.reader, self.exact_turn.sent
        if rd.prompt_ids_ascii is not None and sent is not None and rd.prompt_ids_ascii == orjson.dumps(sent)[1:-1]:
            return sent
        return rd.prompt_token_ids

    def _absorb(self, rd) -> None:
        r = self.record
        # the backend's digits as they came (ASCII ids) when the fast path took them, else int32
        r["prompt_token_ids"] = (rec.ascii_ids(rd.prompt_ids_ascii) if rd.prompt_ids_ascii is not None
                                 else rec.pack_ids(rd.prompt_token_ids))
        r["completion_token_ids"] = rec.pack_ids(rd.completion_token_ids)
        # One logprob per sampled token, or none at all (record.validate holds the invariant).
        r["completion_logprobs"] = (rec.pack_floats(rd.logprobs)
                                    if rd.logprobs is not None and not rd.missing_logprobs
                                    and len(rd.logprobs) == len(rd.completion_token_ids or ()) else None)
        r["finish_reason"] = rd.finish_reason
        r["stop_reason"] = rd.stop_reason
        r["usage"] = rd.usage
        r["assistant"] = rd.assistant_message()
        r["weight_versions"] = rd.weight_versions
        if r["backend"] is not None:
            r["backend"]["system_fingerprint"] = rd.system_fingerprint
        if rd.model:
            r["model_served"] = rd.model
