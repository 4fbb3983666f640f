"""The main-chain calls of one session, from its records alone (rules 9 and 12 of docs/merge-rules.md): the calls a
rollout runner scores workspace states at (`polar-rollout --turn-states`), before any polar-process run.

The same routing and lineage rules as the merge, so the boundaries the runner scores are the calls polar-process
later puts in the session's main chain; per_request mode, because the chain, not the merge, is what is asked (no
end-of-turn ids needed).
"""

from __future__ import annotations

from polar import records as rec
from polar.processor.merge import merge_group
from polar.processor.normalize import AsciiPrompts, to_call


def main_chain_calls(records: list[dict]) -> list[str]:
    """The ids of the session's main-chain calls in (t_start, id) order. `records`: one session's records as stored
    (any order; compact prompts resolved here)."""
    ordered = sorted(records, key=lambda r: (r.get("t_start") or 0.0, str(r.get("id"))))
    resolver, prompts = rec.PromptResolver(), AsciiPrompts()
    calls = [to_call(resolver.resolve(dict(r)), "", 0, prompts) for r in ordered]
    res = merge_group(calls, mode="per_request", eot_for=lambda _model: None)
    main = {cid for s in res.sequences if not s.side_chain and "superseded" not in s.flags for cid in s.call_ids}
    return [c.id for c in calls if c.id in main]
