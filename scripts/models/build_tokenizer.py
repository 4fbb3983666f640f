#!/usr/bin/env python3
"""Build the offline byte-level BPE tokenizer folder: ``build_tokenizer.py OUT_DIR``.

The folder is a Hugging Face tokenizer (tokenizer.json, tokenizer_config.json with our ChatML-with-tools
template, special_tokens_map.json, generation_config.json) that transformers' AutoTokenizer and vLLM load.
The training corpus is generated here from a fixed seed (English-ish prose, Python, JSON, shell, markdown),
so the build needs no network and gives the same bytes every time. A stamp file makes a second run with the
same inputs a no-op. Needs only `tokenizers` (no transformers).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import tempfile
from pathlib import Path

# One worker keeps the BPE merge order independent of thread scheduling.
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tokenizers  # noqa: E402
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "chatml_tools.jinja"
VOCAB_SIZE = 3072
SEED = 20261129
STAMP = ".polar-tokenizer-stamp"

# (content, special). Special tokens are dropped from decoded text by skip_special_tokens; the reasoning
# and tool tags are NOT special (as in Qwen), so vLLM's reasoning and tool parsers still see them in text.
ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
]
EOS = "<|im_end|>"
PAD = "<|endoftext|>"

_WORDS = (
    "the a an of to and in is it that for on with as was be this are by at from or have not but you all "
    "can we they will one which their there been has more if when what so about who out up into time "
    "some could them see other than then now look only come its over think also back after use two how "
    "our work first well way even new want because any these give day most us file code test run build "
    "error value list string number function return call tool result user assistant model token request "
    "response stream message content system server client proxy session record flow prompt output input "
    "read write open close path line change fix add remove update check find show print make need help "
    "please thanks sure here let me first next finally done okay yes no maybe should would must data "
    "directory folder command shell python json markdown table column row index key name type object array"
).split()
_NAMES = "foo bar baz qux items result data config path name value count total index args kwargs".split()
_CMDS = [
    "ls -la", "cat README.md", "git status", "git diff --stat", "grep -rn TODO src/", "python -m pytest -q",
    "pip install -e .", "mkdir -p out", "rm -rf build", "echo hello", "cd /tmp && ls", "find . -name '*.py'",
    "head -n 20 log.txt", "wc -l *.py", "npm install", "make test", "curl -s http://127.0.0.1:8000/health",
]


_SYLLABLES = "ka ri to mu sen dar el on ist ver pro gram ing tion ex port im al ic com pu ter net work log".split()


def _word(rng: random.Random) -> str:
    if rng.random() < 0.8:
        return rng.choice(_WORDS)
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))


def _sentence(rng: random.Random) -> str:
    words = [_word(rng) for _ in range(rng.randint(4, 16))]
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice([".", ".", ".", "?", "!", ":"])


def _python(rng: random.Random) -> str:
    fn, a, b = _word(rng), rng.choice(_NAMES), rng.choice(_NAMES)
    n = rng.randint(0, 99)
    return (
        f"def {fn}_{n}({a}, {b}=None):\n"
        f'    """{_sentence(rng)}"""\n'
        f"    if {b} is None:\n        {b} = []\n"
        f"    for i in range({n}):\n        {b}.append({a}[i] * {n})\n"
        f"    return {{'{a}': {a}, '{b}': len({b})}}\n"
    )


def _json(rng: random.Random) -> str:
    obj = {
        "name": rng.choice(["bash", "read_file", "write_file", "search", "list_dir", "edit"]),
        "arguments": {rng.choice(_NAMES): rng.choice([rng.choice(_CMDS), rng.randint(0, 1000), True, None])},
    }
    if rng.random() < 0.5:
        return json.dumps(obj, ensure_ascii=False)
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _markdown(rng: random.Random) -> str:
    return (
        f"# {_sentence(rng)}\n\n- {_sentence(rng)}\n- `{rng.choice(_CMDS)}`\n\n"
        f"| {rng.choice(_NAMES)} | {rng.choice(_NAMES)} |\n|---|---|\n| {rng.randint(0, 9)} | {rng.randint(0, 9)} |\n\n"
        f"```bash\n{rng.choice(_CMDS)}\n```\n"
    )


def corpus() -> list[str]:
    """The training texts: deterministic for SEED."""
    rng = random.Random(SEED)
    texts = [TEMPLATE.read_text(encoding="utf-8")]
    makers = [lambda: " ".join(_sentence(rng) for _ in range(rng.randint(1, 5))), lambda: _python(rng),
              lambda: _json(rng), lambda: "$ " + rng.choice(_CMDS), lambda: _markdown(rng)]
    for i in range(30000):
        texts.append(makers[i % len(makers)]())
    # Bytes beyond ASCII so multi-byte characters get merges too.
    texts += ["café naïve résumé – “quotes” — ✓ → ∑ 你好 世界 こんにちは 😀"] * 50
    return texts


def stamp_text() -> str:
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update(TEMPLATE.read_bytes())
    h.update(tokenizers.__version__.encode())
    return h.hexdigest()


def train() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[t for t, _ in ADDED_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    # Re-register so the special flag is right for each (the trainer marks all of them special).
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, s in ADDED_TOKENS if s])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, s in ADDED_TOKENS if not s])
    return tok


def write(out_dir: Path) -> None:
    tok = train()
    ids = {t: tok.token_to_id(t) for t, _ in ADDED_TOKENS}
    template = TEMPLATE.read_text(encoding="utf-8")
    decoder = {
        str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": s}
        for t, s in ADDED_TOKENS
    }
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [t for t, s in ADDED_TOKENS if s and t not in (EOS, PAD)],
        "bos_token": None,
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS,
        "errors": "replace",
        "model_max_length": 65536,
        "pad_token": PAD,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    special_map = {
        "additional_special_tokens": config["additional_special_tokens"],
        "eos_token": {"content": EOS, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
        "pad_token": {"content": PAD, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
    }
    generation = {"eos_token_id": [ids[EOS], ids["<|endoftext|>"]], "pad_token_id": ids[PAD]}

    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "tokenizer.json": tok.to_str(pretty=True),
        "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False),
        "special_tokens_map.json": json.dumps(special_map, indent=2),
        "generation_config.json": json.dumps(generation, indent=2),
        "chat_template.jinja": template,
    }
    for name, text in files.items():
        _atomic_write(out_dir / name, text if text.endswith("\n") else text + "\n")
    _atomic_write(out_dir / STAMP, stamp_text() + "\n")


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: build_tokenizer.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    stamp = out / STAMP
    if stamp.exists() and stamp.read_text().strip() == stamp_text():
        return 0
    write(out)
    print(f"tokenizer written to {out} (vocab {Tokenizer.from_file(str(out / 'tokenizer.json')).get_vocab_size()})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
