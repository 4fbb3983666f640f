"""Rule 5: the end-of-turn set E per `model_served`.

Sources, first that applies: `--eot-token-id` (every model); `--tokenizer [MODEL=]DIR` (`eos_token_id` from
generation_config.json and config.json, and tokenizer_config.json's `eos_token` looked up in the tokenizer's added
tokens — read as plain JSON, no transformers); else the dump's own evidence: the last id of completions with finish
`stop`/`tool_calls` and a null `stop_reason`, which vLLM guarantees to be EOS. Evidence that disagrees is an error.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson

from polar.processor.load import IndexEntry

OPTIONS_HINT = "pass --eot-token-id N (repeatable) or --tokenizer [MODEL=]DIR"


class EotError(ValueError):
    """No usable end-of-turn set: the CLI exits 2 naming the options."""


@dataclass
class EotTable:
    """E per model; `default` applies to models without their own entry."""

    default: frozenset[int] | None = None
    default_source: str | None = None
    by_model: dict[str | None, frozenset[int]] = field(default_factory=dict)
    source: dict[str | None, str] = field(default_factory=dict)

    def get(self, model: str | None) -> frozenset[int] | None:
        return self.by_model.get(model, self.default)

    def describe(self) -> dict:
        out = {str(m): {"ids": sorted(e), "source": self.source[m]} for m, e in self.by_model.items()}
        if self.default is not None:
            out["*"] = {"ids": sorted(self.default), "source": self.default_source}
        return out


def _read_json(path: str) -> dict:
    try:
        with open(path, "rb") as fh:
            obj = orjson.loads(fh.read())
    except FileNotFoundError:
        return {}
    except (OSError, orjson.JSONDecodeError) as exc:
        raise EotError(f"{path}: unreadable ({exc})") from exc
    return obj if isinstance(obj, dict) else {}


def _ids(value: object) -> set[int]:
    if isinstance(value, bool):
        return set()
    if isinstance(value, int):
        return {value}
    if isinstance(value, list):
        return {v for v in value if isinstance(v, int) and not isinstance(v, bool)}
    return set()


def tokenizer_eot(directory: str) -> frozenset[int]:
    """EOS ids a model directory declares, without transformers."""
    if not os.path.isdir(directory):
        raise EotError(f"--tokenizer {directory}: not a directory")
    ids: set[int] = set()
    ids |= _ids(_read_json(os.path.join(directory, "generation_config.json")).get("eos_token_id"))
    ids |= _ids(_read_json(os.path.join(directory, "config.json")).get("eos_token_id"))
    tcfg = _read_json(os.path.join(directory, "tokenizer_config.json"))
    eos = tcfg.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if isinstance(eos, str):
        found = None
        for tid, tok in (tcfg.get("added_tokens_decoder") or {}).items():
            if isinstance(tok, dict) and tok.get("content") == eos:
                found = int(tid)
        if found is None:
            tj = _read_json(os.path.join(directory, "tokenizer.json"))
            for tok in tj.get("added_tokens") or []:
                if isinstance(tok, dict) and tok.get("content") == eos:
                    found = tok.get("id")
            vocab = (tj.get("model") or {}).get("vocab")
            if found is None and isinstance(vocab, dict):
                found = vocab.get(eos)
        if isinstance(found, int):
            ids.add(found)
    if not ids:
        raise EotError(f"--tokenizer {directory}: no eos_token_id in generation_config.json, config.json or "
                       "tokenizer_config.json")
    return frozenset(ids)


def parse_tokenizer_arg(arg: str) -> tuple[str | None, str]:
    """`[MODEL=]DIR` → (model or None, dir). A DIR that exists is taken whole even if it contains '='."""
    if "=" in arg and not os.path.isdir(arg):
        model, _, directory = arg.partition("=")
        return model or None, directory
    return None, arg


def evidence(entries: Iterable[IndexEntry]) -> dict[str | None, Counter]:
    """Per model, the last ids of completions with finish `stop`/`tool_calls` and a null `stop_reason` (vLLM
    guarantees those end with EOS), counted."""
    out: dict[str | None, Counter] = {}
    for e in entries:
        if e.finish_reason in ("stop", "tool_calls") and e.stop_reason is None and e.last_completion_id is not None:
            out.setdefault(e.model_served, Counter())[e.last_completion_id] += 1
    return out


def occurring(calls: Iterable, ids: Iterable[int]) -> list[int]:
    """Which of `ids` occur in some call's prompt or completion, sorted. Stops reading once every id was found,
    so a right end-of-turn id costs the first prompt (templates end every message with it)."""
    want = set(ids)
    seen: set[int] = set()
    for c in calls:
        for arr in (c.completion, c.prompt):
            if want and arr is not None and len(arr):
                found = {i for i in want if bool((arr == i).any())}
                seen |= found
                want -= found
        if not want:
            break
    return sorted(seen)


def never_seen_warning(eot_ids: Iterable[int], seen: Iterable[int], entries: Iterable[IndexEntry]) -> str | None:
    """The warning for `--eot-token-id` ids that occur in no prompt or completion of the dump (a wrong id makes
    every merge break with no_eot_in_tail), naming what the dump's own evidence says instead."""
    unseen = sorted(set(eot_ids) - set(seen))
    if not unseen:
        return None
    ev = Counter()
    for counts in evidence(entries).values():
        ev.update(counts)
    hint = (f"; completions that stopped naturally end with {', '.join(f'{t} ({n}×)' for t, n in ev.most_common(3))}"
            if ev else "")
    return (f"--eot-token-id {', '.join(map(str, unseen))} never occurs in the dump (in no prompt or completion): "
            f"every turn boundary needs an end-of-turn id; check the id{hint}")


def resolve(entries: Iterable[IndexEntry], eot_ids: list[int], tokenizers: list[str]) -> EotTable:
    """Build E for every model in the dump. Raises EotError when evidence disagrees; models without any source
    are simply absent (see `missing`)."""
    table = EotTable()
    entries = list(entries)
    if eot_ids:
        table.default, table.default_source = frozenset(eot_ids), "--eot-token-id"
        return table
    for arg in tokenizers:
        model, directory = parse_tokenizer_arg(arg)
        ids = tokenizer_eot(directory)
        if model is None:
            table.default, table.default_source = ids, f"--tokenizer {directory}"
        else:
            table.by_model[model], table.source[model] = ids, f"--tokenizer {directory}"
    if table.default is not None:
        return table
    for model, counts in evidence(e for e in entries if e.model_served not in table.by_model).items():
        if len(counts) > 1:
            seen = ", ".join(f"{tid} ({n}×)" for tid, n in counts.most_common())
            raise EotError(f"end-of-turn evidence for model {model!r} disagrees: completions that stopped naturally "
                           f"end with {seen}; {OPTIONS_HINT}")
        table.by_model[model] = frozenset(counts)
        table.source[model] = f"evidence ({sum(counts.values())} completions)"
    return table


def missing(table: EotTable, entries: Iterable[IndexEntry]) -> list[str | None]:
    """Models with completions but no end-of-turn set."""
    return sorted({e.model_served for e in entries if e.has_completion and table.get(e.model_served) is None},
                  key=str)
