#!/usr/bin/env python3
"""Checks that llama.cpp runs the demo model, not just that it runs: greedy output against the
Hugging Face reference the demo ships (models/nectar-demo-glm5/reference.json).

    benchmarks/peers_check.py LLAMA_BIN GGUF [PROMPT ...]   (default prompt: code_long)

For each prompt, `llama-completion` (greedy, one thread) decodes as many tokens as the
reference's greedy continuation; the prompt's token ids llama.cpp prints must equal the
reference's `input_ids` (its tokenizer conversion) and the generated text its `greedy_text`.
`code_long` (284 tokens) runs the DSA indexer's top-128 selection; `zh` is the other raw
(untemplated) prompt whose continuation has no end-of-text token. Use the BF16 GGUF for an exact
check; a Q4_0 one may drift from the reference after a few tokens. Exits 1 on any difference.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def check(binary, gguf, prompt):
    n = len(prompt["greedy_ids"])
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        # llama.cpp drops one trailing newline of a prompt file: add one so the text stays whole.
        f.write(prompt["text"] + "\n")
    try:
        r = subprocess.run([binary, "-m", gguf, "-f", f.name, "-n", str(n), "--temp", "0",
                            "-t", "1", "--no-warmup", "-no-cnv", "--verbose-prompt"],
                           capture_output=True, timeout=600)
    finally:
        os.unlink(f.name)
    if r.returncode != 0:
        sys.exit(f"{binary} failed ({r.returncode}): {r.stderr.decode(errors='replace')[-2000:]}")
    err = r.stderr.decode(errors="replace")
    ids = [int(i) for i in re.findall(r"I\s+(\d+) -> '", err)]
    out = r.stdout.decode(errors="replace")
    text = prompt["text"]
    gen = out[len(text):] if out.startswith(text) else None
    want = prompt["greedy_text"]
    ok_ids = ids == prompt["input_ids"]
    # llama-completion ends its output with newlines of its own.
    ok_gen = gen is not None and gen.startswith(want) and not gen[len(want):].strip()
    print(f"{prompt['name']}: prompt ids {'equal' if ok_ids else 'DIFFER'} ({len(ids)} tokens); "
          f"{n} greedy tokens {'equal' if ok_gen else 'DIFFER'} to the reference")
    if not ok_gen:
        print(f"  llama.cpp: {gen!r}\n  reference: {prompt['greedy_text']!r}")
    return ok_ids and ok_gen


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    binary = os.path.join(sys.argv[1], "llama-completion")
    gguf = sys.argv[2]
    names = sys.argv[3:] or ["code_long"]
    with open(os.path.join(ROOT, "models/nectar-demo-glm5/reference.json")) as f:
        prompts = {p["name"]: p for p in json.load(f)["prompts"]}
    ok = [check(binary, gguf, prompts[n]) for n in names]
    sys.exit(0 if all(ok) else 1)


if __name__ == "__main__":
    main()
