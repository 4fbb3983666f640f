"""Text to ASCII words: accents folded, a few letters that do not decompose spelled out, everything else a break."""

from __future__ import annotations

import re
import unicodedata

# letters that NFKD does not split into a base letter and a mark
SPELLED = {"ß": "ss", "æ": "ae", "Æ": "AE", "ø": "o", "Ø": "O", "œ": "oe", "Œ": "OE", "ł": "l", "Ł": "L", "đ": "d",
           "Đ": "D", "þ": "th", "Þ": "Th"}
WORD = re.compile(r"[a-z0-9]+")


def fold_to_ascii(text: str) -> str:
    """`text` with accents removed and the SPELLED letters replaced; characters with no ASCII form are dropped."""
    spelled = "".join(SPELLED.get(ch, ch) for ch in text)
    decomposed = unicodedata.normalize("NFKD", spelled)
    return decomposed.encode("ascii", "ignore").decode("ascii")


def words(text: str) -> list[str]:
    """The lower-case ASCII words of `text`; apostrophes join (`don't` → `dont`), anything else separates."""
    folded = fold_to_ascii(text).lower().replace("'", "").replace("’", "")
    return WORD.findall(folded)
