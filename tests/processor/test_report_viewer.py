"""Scenarios for processor/viewer.py and report.html's page (README.md, The report), without a browser
(tests/integration/test_viewer.py drives chromium over the same page).

1.x  the pure parts: JSON safe inside <script>, strip windows and their encoding, vocabulary pieces, call texts
2.x  through polar-process: report.json unchanged, one self-contained page, the text notice and --report-no-text,
     --vocab (token text only, never the end-of-turn set), --report-max-mb's tiers, the trainer's files
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil

import numpy as np
import orjson
import pytest

from polar.processor.cli import main
from polar.processor.load import InputError
from polar.processor.trainer_files import trainer_sections
from polar.processor.viewer import (CONTEXT, ROW_COLS, Vocabs, call_texts, content_text, encode_strip, piece_text,
                                    read_vocab, script_json, windows)
from tests.processor.synth import session_records, write_flows
from tests.support.scripts import load_script

pytestmark = pytest.mark.unit

HOSTILE = "</script><img src=x onerror=window.__pwned=1>"
MARKER = "zebra-quartz-marker"  # a word only the conversation text holds


def hostile_dump(directory) -> dict:
    """A small processed-dump input: synth sessions with every defect, a hostile session name and message, and calls
    without a session; rewards in two groups."""
    recs = session_records("s1", ["turn", "turn", "side", "retry", "trunc", "turn", "compact", "turn", "error"], seed=1)
    recs += session_records("s2", ["turn", "drift", "turn", "nolp", "turn"], seed=2)
    evil = session_records(HOSTILE, ["turn", "turn", "abort", "turn"], seed=3)
    for r in evil:
        body = orjson.loads(r["upstream_request"])
        body["messages"][1]["content"] = f"{HOSTILE} {MARKER} \u2028 & done"
        r["upstream_request"] = orjson.dumps(body)
    recs += evil + session_records(None, ["turn", "side"], seed=4)
    write_flows(str(directory / "flows"), recs, per_file=7)
    rewards = directory / "rewards.jsonl"
    rewards.write_text("".join(json.dumps(x) + "\n" for x in [
        {"session": "s1", "reward": 1.0, "group": "g1"}, {"session": "s2", "reward": 0.0, "group": "g1"},
        {"session": HOSTILE, "reward": 0.5, "group": f"g-{HOSTILE}"}]))
    return {"flows": str(directory / "flows"), "rewards": str(rewards)}


def run(dump: dict, out, *extra: str) -> tuple[dict, str]:
    assert main([dump["flows"], "-o", str(out), "-q", "--rewards", dump["rewards"], *extra]) == 0
    return json.loads((out / "report.json").read_text()), (out / "report.html").read_text(encoding="utf-8")


def embedded(page: str, block: str):
    m = re.search(rf'<script type="application/json" id="{block}">(.*?)</script>', page, flags=re.DOTALL)
    return None if m is None else json.loads(m.group(1))


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    return hostile_dump(tmp_path_factory.mktemp("viewer"))


@pytest.fixture(scope="module")
def plain(dump, tmp_path_factory):
    return run(dump, tmp_path_factory.mktemp("plain") / "out")


# ---------------------------------------------------------------------------------------------------- 1.x pure

@pytest.mark.parametrize("value", [HOSTILE, "a & b > c", "line\u2028sep\u2029para", {"k</script>": ["<!--", "-->"]},
                                   "ünïcødé 漢字 🙂"])
def test_1_1_script_json_is_inert_inside_a_script_element_and_means_the_same(value):
    text = script_json(value)
    assert not re.search(r"[<>&\u2028\u2029]", text)
    assert json.loads(text) == value


@pytest.mark.parametrize("n, trainable, marks, expect", [
    (1000, [(500, 510)], [], [(436, 574)]),  # one span, 64 tokens either side
    (1000, [(10, 20)], [], [(0, 84)]),  # clipped at the start
    (1000, [(990, 1000)], [], [(926, 1000)]),  # and at the end
    (1000, [(100, 110), (300, 310)], [], [(36, 174), (236, 374)]),  # far apart: two windows
    (1000, [(100, 110), (180, 190)], [], [(36, 254)]),  # windows that touch are one
    (1000, [(100, 110), (240, 250)], [], [(36, 314)]),  # a gap under 8 tokens is shown, not collapsed
    (1000, [], [700], [(636, 764)]),  # a break with nothing trainable near it
    (1000, [], [], []),  # nothing to show: one collapsed count
], ids=["one", "start", "end", "apart", "touching", "near", "break_only", "nothing"])
def test_1_2_strip_windows_are_spans_and_marks_with_context(n, trainable, marks, expect):
    mask = np.zeros(n, dtype=np.uint8)
    for a, b in trainable:
        mask[a:b] = 1
    assert CONTEXT == 64
    assert windows(n, mask, marks) == expect


def _expand(runs: list[int]) -> list[int]:
    out, v = [], 0
    for r in runs:
        out += [v] * r
        v ^= 1
    return out


def test_1_3_a_strip_holds_every_trainable_token_with_its_logprob_and_counts_the_rest():
    rng = np.random.default_rng(0)
    n = 3000
    ids = rng.integers(0, 50_000, n).astype(np.int32)
    mask = np.zeros(n, dtype=np.uint8)
    for a, b in [(900, 940), (1500, 1501), (2990, 3000)]:
        mask[a:b] = 1
    lps = np.where(mask == 1, -rng.random(n), 0).astype(np.float32)
    strip = encode_strip(ids, mask, lps, marks=[2000])
    shown = trainable = 0
    for start, part_ids, runs, part_lps in strip["parts"]:
        m = mask[start:start + len(part_ids)]
        assert part_ids == ids[start:start + len(part_ids)].tolist()
        assert _expand(runs) == m.tolist()
        assert part_lps == np.rint(lps[start:start + len(part_ids)][m == 1] * 1000).astype(int).tolist()
        shown += len(part_ids)
        trainable += int(m.sum())
    assert strip["n"] == n and trainable == int(mask.sum()) and shown < n  # the rest is collapsed
    assert [p[0] for p in strip["parts"]] == [836, 1436, 1936, 2926]
    assert encode_strip(ids, mask, None, [])["parts"][0][3] is None  # a sequence without logprobs


@pytest.mark.parametrize("piece, byte_level, text", [
    ("Ġhello", True, " hello"), ("ĊĊ", True, "\n\n"), ("Ã©", True, "é"), ("<|im_end|>", True, "<|im_end|>"),
    ("Ã", True, "\\xc3"),  # half of a two-byte character
    ("▁hello", False, " hello"), ("<0x0A>", False, "<0x0A>"),
], ids=["space", "newlines", "two_bytes", "special", "partial", "sentencepiece", "byte_fallback"])
def test_1_4_vocabulary_pieces_are_shown_as_text(piece, byte_level, text):
    assert piece_text(piece, byte_level) == text


def test_1_5_read_vocab_takes_model_vocab_and_added_tokens(tmp_path, tokenizer_dir):
    vocab = read_vocab(tokenizer_dir)
    with open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8") as fh:
        tok = json.load(fh)
    assert vocab[tok["model"]["vocab"]["<|im_end|>"]] == "<|im_end|>"
    spaced = next(p for p in tok["model"]["vocab"] if p.startswith("Ġ") and p[1:].isascii() and p[1:].isalpha())
    assert vocab[tok["model"]["vocab"][spaced]] == " " + spaced[1:]
    (tmp_path / "uni").mkdir()
    (tmp_path / "uni" / "tokenizer.json").write_text(json.dumps({
        "model": {"type": "Unigram", "vocab": [["<unk>", 0.0], ["▁the", -1.0], ["s", -2.0]]},
        "added_tokens": [{"id": 3, "content": "<eot>"}]}))
    assert read_vocab(str(tmp_path / "uni")) == {0: "<unk>", 1: " the", 2: "s", 3: "<eot>"}
    with pytest.raises(InputError, match="--vocab"):
        read_vocab(str(tmp_path / "nowhere"))
    (tmp_path / "bad.json").write_text('{"model": {}}')
    with pytest.raises(InputError, match="no model.vocab"):
        read_vocab(str(tmp_path / "bad.json"))


def test_1_6_vocab_per_model_or_for_every_model(tmp_path, tokenizer_dir):
    v = Vocabs.read([f"m1={tokenizer_dir}"])
    assert v.key_for("m1") == "m1" and v.key_for("m2") is None
    v = Vocabs.read([tokenizer_dir, f"m1={tokenizer_dir}"])
    assert v.key_for("m1") == "m1" and v.key_for("other") == "*" and v.key_for(None) == "*"


def test_1_7_each_call_shows_the_messages_new_since_its_chains_previous_call():
    sys_m = {"role": "system", "content": "s" * 5000}
    u1 = {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {}}]}
    a1 = {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "sh", "arguments": {"c": 1}}}]}
    t1 = {"role": "tool", "content": "out"}
    side = [{"role": "user", "content": "title?"}]
    rows = [{"chain_id": "c1", "messages": json.dumps([sys_m, u1]), "assistant": json.dumps({"content": "ok"})},
            {"chain_id": "c2", "messages": json.dumps(side), "assistant": None},
            {"chain_id": "c1", "messages": json.dumps([sys_m, u1, a1, t1]), "assistant": None},
            {"chain_id": "c1", "messages": json.dumps([sys_m, {"role": "user", "content": "edited"}, a1]),
             "assistant": None},
            {"chain_id": "c1", "messages": json.dumps([sys_m, {"role": "user", "content": "edited"}, a1]),
             "assistant": None}]
    first, other, second, edited, again = call_texts(rows)
    assert edited["from"] == 1 and [m[1] for m in edited["new"]] == ["edited", ""]  # history rewritten
    assert again["from"] == 3 and again["new"] == []  # the same messages sent again
    assert first["from"] == 0 and [m[0] for m in first["new"]] == ["system", "user"]
    assert first["new"][0][1].endswith("(3,000 more characters)") and first["new"][1][1] == "hi\n[image_url]"
    assert first["out"][0] == "ok" and other["new"] == [["user", "title?", []]]
    assert second["from"] == 2 and second["new"][0] == ["assistant", "", [["sh", '{"c":1}']]]
    assert content_text(None) == "" and content_text(3) == "3"


# ---------------------------------------------------------------------------------------------------- 2.x the CLI

REPORT_KEYS = {"version", "mode", "inputs", "counts", "merge_ratio", "tokens", "breaks", "break_causes", "flags",
               "flag_events", "rewards", "warnings", "eot", "per_protocol", "per_model", "sessions", "options",
               "outputs", "seconds", "tokens_per_second", "engine", "per_replica"}


def test_2_1_report_json_keeps_its_keys_and_vocab_never_changes_the_end_of_turn_set(dump, plain, tmp_path,
                                                                                    tokenizer_dir):
    doc, _ = plain
    other = tmp_path / "vocab"
    shutil.copytree(tokenizer_dir, other)
    (other / "generation_config.json").write_text(json.dumps({"eos_token_id": [77, 78]}))  # what --tokenizer reads
    doc2, page = run(dump, tmp_path / "out", "--vocab", str(other), "--report-max-mb", "5")
    assert set(doc) == set(doc2) == REPORT_KEYS
    assert doc2["eot"] == doc["eot"] and 77 not in {i for e in doc2["eot"].values() for i in e["ids"]}
    strip = lambda d: {k: v for k, v in d.items() if k not in ("options", "seconds", "tokens_per_second", "outputs")}  # noqa: E731
    assert strip(doc2) == strip(doc)
    assert embedded(page, "polar-index")["vocab"] is True and embedded(page, "polar-vocab")["*"]


def test_2_1b_a_tokenizer_given_for_the_end_of_turn_ids_also_gives_the_token_text(dump, plain, tmp_path,
                                                                                 tokenizer_dir):
    _, page = plain
    assert embedded(page, "polar-index")["vocab"] is False  # neither --vocab nor --tokenizer: ids only
    with_tok = tmp_path / "tok"
    shutil.copytree(tokenizer_dir, with_tok)
    (with_tok / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    _, page2 = run(dump, tmp_path / "out", "--tokenizer", str(with_tok), "--report-max-mb", "5")
    assert embedded(page2, "polar-index")["vocab"] is True and embedded(page2, "polar-vocab")["*"]


def test_2_2_the_page_is_one_self_contained_file(plain):
    _, page = plain
    outside = page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "http://" not in outside and "https://" not in outside
    assert not re.search(r"<(link|img|iframe|object|embed)\b|<script[^>]*\bsrc=|@import|url\(", page, flags=re.IGNORECASE)
    # The Content-Security-Policy admits exactly the page's one script.
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page).group(1)
    scripts = re.findall(r"<script>(.*?)</script>", page, flags=re.DOTALL)
    assert len(scripts) == 1 and "default-src 'none'" in csp
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    assert f"'sha256-{digest}'" in csp
    assert "innerHTML" not in scripts[0] and "insertAdjacentHTML" not in scripts[0] and "eval(" not in scripts[0]


def test_2_3_hostile_text_stays_data(plain):
    _, page = plain
    assert HOSTILE not in page and "<img" not in page
    idx = embedded(page, "polar-index")
    sessions = [r[ROW_COLS.index("session")] for r in idx["rows"]]
    assert HOSTILE in sessions and None in sessions  # the null-session group is listed too
    i = sessions.index(HOSTILE)
    assert embedded(page, f"polar-s-{i}")["session"] == HOSTILE
    texts = embedded(page, f"polar-x-{i}")
    assert any(HOSTILE in m[1] and MARKER in m[1] and "\u2028" in m[1] for t in texts for m in t["new"])
    assert "&lt;/script&gt;" in page  # the overview's breaks table escapes it as HTML


def test_2_4_the_top_says_whether_the_page_holds_conversation_text(dump, plain, tmp_path, tokenizer_dir):
    _, page = plain
    top = page[:page.index("</header>")]
    assert "contains conversation text" in top and MARKER in page
    _, bare = run(dump, tmp_path / "bare", "--report-no-text", "--vocab", tokenizer_dir)
    top = bare[:bare.index("</header>")]
    assert "no conversation text (--report-no-text)" in top
    assert MARKER not in bare and embedded(bare, "polar-vocab") == {}
    idx = embedded(bare, "polar-index")
    assert idx["text"] is False and idx["vocab"] is False
    assert 'id="polar-x-' not in bare and 'id="polar-s-0"' in bare


def _tiers(idx: dict) -> list[int]:
    col = {c: ROW_COLS.index(c) for c in ROW_COLS}
    trivial = 1 << idx["flags"].index("constrained_decoding") | 1 << idx["flags"].index("side_chain")
    return [0 if r[col["causes"]] or r[col["flags"]] & ~trivial else (1 if r[col["flags"]] else 2)
            for r in idx["rows"]]


def test_2_5_over_report_max_mb_broken_and_flagged_sessions_keep_their_strips_first(tmp_path, tokenizer_dir):
    bench = load_script("scripts/bench_report", "bench_report")
    demo = bench.demo_shaped(str(tmp_path), 120, seed=3, tokenizer_dir=tokenizer_dir)
    full = tmp_path / "full"
    assert main([demo["flows"], "-o", str(full), "-q", "--rewards", demo["rewards"]]) == 0
    page = (full / "report.html").read_text()
    size = lambda kind: sum(len(m) for m in re.findall(rf'id="polar-{kind}-\d+">(.*?)</script>', page))  # noqa: E731
    cases = [("strips", len(page.encode()) - size("t") * 0.6),  # room for about 40 % of the strips
             ("text", len(page.encode()) - size("t") - size("x") * 0.5),  # no strip, half the text
             ("over", 1000)]  # not even the calls and chains fit
    for name, budget in cases:
        out = tmp_path / name
        assert main([demo["flows"], "-o", str(out), "-q", "--rewards", demo["rewards"],
                     "--report-max-mb", f"{budget / 1e6:.6f}"]) == 0
        cut = (out / "report.html").read_text()
        idx = embedded(cut, "polar-index")
        strips = {int(i) for i in re.findall(r'id="polar-t-(\d+)"', cut)}
        texts = {int(i) for i in re.findall(r'id="polar-x-(\d+)"', cut)}
        n = len(idx["rows"])
        assert idx["strips"]["left_out"] == n - len(strips) and idx["texts"]["left_out"] == n - len(texts)
        top = cut[:cut.index("</header>")]
        assert f"Token strips of {n - len(strips)}" in top and f"of {n} sessions were left out" in top
        if name == "over":
            assert not strips and not texts and "The page is still over --report-max-mb 0.001" in top
            continue
        assert len(cut.encode()) <= budget and "still over" not in top
        tier = _tiers(idx)
        problems = {i for i, t in enumerate(tier) if t == 0}
        if name == "strips":  # every text, the problems' strips, then as many others as fit
            assert len(texts) == n and problems <= strips and 0 < len(strips) < n
        else:
            assert not strips - problems and problems <= texts and 0 < len(texts) < n
            assert f"and the conversation text of {n - len(texts)}" in top


def test_2_6_the_trainer_files_are_rendered_when_present(tmp_path, dump):
    assert trainer_sections(None, None) == "" and trainer_sections(str(tmp_path / "no.json"), None) == ""
    import polars as pl

    verify = tmp_path / "verify.parquet"
    pl.DataFrame([
        {"sequence_id": "a", "n_checked": 10, "median_abs_gap": 0.01, "max_abs_gap": 0.2, "share_within": 0.9},
        {"sequence_id": "b", "n_checked": 5, "median_abs_gap": 0.03, "max_abs_gap": 0.5, "share_within": 0.8}],
    ).write_parquet(verify)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"step": s, "reward_mean": r, "loss": 1 / s}) + "\n"
                             for s, r in [(1, 0.2), (2, 0.4), (3, 0.5)]))
    html = trainer_sections(str(verify), str(train))
    assert "Verify: recomputed vs recorded logprobs" in html and "2 sequences, 15 tokens checked" in html
    assert "Training steps" in html and html.count("<polyline") == 2 and "step 3: 0.5" in html
    (tmp_path / "broken.jsonl").write_text("{not json\n")
    assert "unreadable" in trainer_sections(None, str(tmp_path / "broken.jsonl"))
    # polar-process renders the files OUT holds (a run with --overwrite over the trainer's OUT).
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(verify, out / "verify.parquet")
    shutil.copy(train, out / "train.jsonl")
    _, page = run(dump, out, "--overwrite")
    assert "Verify: recomputed vs recorded logprobs" in page and "Training steps" in page


def test_2_6b_polar_verify_s_parquet_is_rendered_only_for_the_sequences_it_checked(tmp_path, dump):
    import polars as pl

    out = tmp_path / "out"
    out.mkdir()
    rows = [{"sequence_id": "a", "n_checked": 7, "median_abs_gap": 0.01, "max_abs_gap": 0.1, "share_within": 1.0,
             "sequences_sha256": None}]
    pl.DataFrame(rows).write_parquet(out / "verify.parquet")  # unstamped: rendered
    _, page = run(dump, out, "--overwrite")
    assert "Verify: recomputed vs recorded logprobs" in page and "1 sequences, 7 tokens checked" in page
    stamp = hashlib.sha256((out / "sequences.parquet").read_bytes()).hexdigest()
    pl.DataFrame([{**rows[0], "sequences_sha256": "0" * 64}]).write_parquet(out / "verify.parquet")
    _, page = run(dump, out, "--overwrite")  # rows of another sequences.parquet: stale, left out
    assert "Verify: recomputed vs recorded logprobs" not in page
    pl.DataFrame([{**rows[0], "sequences_sha256": stamp}]).write_parquet(out / "verify.parquet")
    _, page = run(dump, out, "--overwrite")  # the same input gives the same sequences.parquet bytes
    assert "7 tokens checked" in page


def test_2_7_a_bad_vocab_stops_the_run_before_out_is_touched(dump, tmp_path, capsys):
    assert main([dump["flows"], "-o", str(tmp_path / "out"), "--vocab", str(tmp_path / "missing")]) == 2
    assert "--vocab" in capsys.readouterr().err and not (tmp_path / "out").exists()
    for bad in ("0", "-1", "nan", "x"):
        with pytest.raises(SystemExit) as exit_:
            main([dump["flows"], "-o", str(tmp_path / "out"), "--report-max-mb", bad])
        assert exit_.value.code == 2
