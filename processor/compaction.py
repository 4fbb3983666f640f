"""Compaction calls, recognised by a rule rather than by any CLI's wording (docs/merge-rules.md rule 12,
`--compaction train|mask`).

A call X is a compaction call when its completion reappears in the prompt of a later call B of the session whose
prompt extends no earlier chain tip (B opened a chain: the conversation's prefix broke there). That is what a summary
is: text the model wrote that the agent puts, instead of the history, at the head of a new context. An ordinary turn
reappears in its successor's prompt too, but there the prefix holds (the successor joins the chain). The match is on
token ids: the completion's last TAIL ids before its final id and EDGE more (re-rendered inside a message, a summary's
last ids may tokenize differently; its head may be reasoning the agent never shows again, so the tail is what must
reappear), at least MIN_SUMMARY_IDS of them (a one-line answer quoted later is no summary).

What the merge does with it: B's chain joins X's lineage (the conversation goes on after the summary, so the calls
after it are not a side chain), and X's sequence is flagged `compaction`. `train` keeps X's completion trained under
the session's advantage; `mask` sets its tokens to mask 0 (left out of the loss, counted in the flag events).
"""

from __future__ import annotations

import numpy as np

COMPACTIONS = ("train", "mask")
EDGE = 2
MIN_SUMMARY_IDS = 16
TAIL = 64


def _contains(haystack: np.ndarray, needle: np.ndarray) -> bool:
    """Whether int32 `needle` occurs contiguously in `haystack` (memcmp on the bytes, whole ids only)."""
    hay, pin = haystack.tobytes(), needle.tobytes()
    at = hay.find(pin)
    while at != -1 and at % 4:
        at = hay.find(pin, at + 1)
    return at != -1


def summary_core(completion: np.ndarray) -> np.ndarray | None:
    """The ids of a completion a later prompt must hold for it to count as a summary: up to TAIL ids before its last
    id (an end of turn or not) and EDGE more, never its first EDGE; None when fewer than MIN_SUMMARY_IDS."""
    end = len(completion) - 1 - EDGE
    core = completion[max(EDGE, end - TAIL):end]
    return core if len(core) >= MIN_SUMMARY_IDS else None


def find(completions: list[np.ndarray], prompts: list[np.ndarray], opens: list[bool]) -> dict[int, int]:
    """{position of X: position of B} over one session's eligible calls in (t_start, id) order: X's summary core
    occurs in B's prompt, B is later and opened a chain; the first such B."""
    found: dict[int, int] = {}
    for x, completion in enumerate(completions):
        core = summary_core(completion)
        if core is None:
            continue
        for b in range(x + 1, len(prompts)):
            if opens[b] and _contains(prompts[b], core):
                found[x] = b
                break
    return found
