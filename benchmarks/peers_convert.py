#!/usr/bin/env python3
"""Runs llama.cpp's own convert_hf_to_gguf.py on the demo model, unchanged but for one fact.

    benchmarks/peers_convert.py LLAMA_CPP_SRC MODEL_DIR OUT.gguf [--outtype bf16]

llama.cpp names a BPE pre-tokenizer by hashing the tokens of a fixed test text; a tokenizer it has
not seen stops the conversion ("BPE pre-tokenizer was not recognized"). The demo's 8,192-token
tokenizer is its own, so its hash is new, but its pre-tokenizer is not: tokenizer.json's Split
regex is character for character the one llama.cpp implements as `qwen2` (src/llama-vocab.cpp,
"original regex from tokenizer.json"), followed by byte-level mapping. This script checks that
regex and, for the demo's hash only, answers `qwen2`; every other model, tensor and key goes
through the converter as released.
"""

import json
import os
import runpy
import sys

# The demo tokenizer's hash of llama.cpp's test text (convert_hf_to_gguf.py prints it as chkhsh).
DEMO_CHKHSH = "2cd7351a96787adb64a8b8b60fed27b6f0b7bbc4dc8d5af41a92890e694141eb"
# Qwen2's pre-tokenizer regex as tokenizer.json spells it.
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def check_pre_tokenizer(model_dir):
    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        pre = json.load(f)["pre_tokenizer"]
    steps = pre.get("pretokenizers", [])
    ok = (len(steps) == 2 and steps[0].get("type") == "Split"
          and steps[0]["pattern"].get("Regex") == QWEN2_REGEX
          and steps[1].get("type") == "ByteLevel" and not steps[1].get("use_regex"))
    if not ok:
        sys.exit(f"{model_dir}/tokenizer.json: pre_tokenizer is not qwen2's Split + ByteLevel")


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    src, model_dir, out = sys.argv[1:4]
    check_pre_tokenizer(model_dir)
    sys.path.insert(0, src)
    sys.path.insert(1, os.path.join(src, "gguf-py"))
    from hashlib import sha256

    from conversion import base

    released = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer):
        chktxt = released.__code__.co_consts  # the test text is the method's first constant
        text = next(c for c in chktxt if isinstance(c, str) and "\U0001F680" in c)
        if sha256(str(tokenizer.encode(text)).encode()).hexdigest() == DEMO_CHKHSH:
            return "qwen2"
        return released(self, tokenizer)

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    outtype = sys.argv[4:] or ["--outtype", "bf16"]
    sys.argv = [os.path.join(src, "convert_hf_to_gguf.py"), *outtype, "--outfile", out, model_dir]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
