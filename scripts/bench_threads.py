#!/usr/bin/env python3
"""Decode scaling with threads: `nectar --threads T run … --json`, alternated over binaries,
models and thread counts, with each run's CPU time and context switches (from the kernel's
rusage of the child, so no perf needed). Standard library only.

    scripts/bench_threads.py --model /tmp/demo-q --model models/nectar-demo-glm5 \\
        --bin target/release/nectar --bin /tmp/old/nectar --threads 1,2 --rounds 3

Every round runs every (model, binary, threads) once with `--max-tokens N` (default 128) and
once with `--max-tokens 1`; the difference of the two gives the decode's own CPU time and
context switches per token (loading and prefill cancel). The prompt is `code_long` from the
demo model's reference.json (284 tokens: DSA active), greedy, so every run must produce the
same tokens; the script fails if two runs differ. Reported: median (range) decode tok/s as
`nectar run` measures it, its ratio between thread counts, CPU ms per decoded token, and
voluntary (the thread slept: a futex wait) and involuntary (preempted) context switches per
token. The load average is printed at the start and the end: on a loaded machine only the CPU
and context-switch columns mean much.

A peer in the same rounds (issue 12 item 7): `--llama-bench BIN --gguf FILE` adds llama.cpp's
decode at every thread count, alternated with the Nectar arms: `llama-bench -p 0 -n N -d P -r 1`
(decode only, after a context of P = the prompt's length, so the attention spans what Nectar's
does), once with `-n N` and once with `-n 1` for the CPU and context-switch columns. llama-bench
decodes random token ids rather than a greedy continuation (no token check for that arm);
benchmarks/peers.sh builds it and converts the demo (benchmarks/peers.md).
"""

import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prompt_ids(name):
    with open(os.path.join(ROOT, "models/nectar-demo-glm5/reference.json")) as f:
        ref = json.load(f)
    for p in ref["prompts"]:
        if p["name"] == name:
            return ",".join(map(str, p["input_ids"]))
    sys.exit(f"no prompt {name!r} in reference.json")


def run_with_rusage(binary, model, threads, ids, max_tokens):
    """Runs nectar once; returns (its JSON output, its rusage)."""
    return run_child([binary, "--threads", str(threads), "run", "--model", model, "--json",
                      "--max-tokens", str(max_tokens), "--prompt-ids", ids])


def llama_bench(binary, gguf, threads, depth, n_gen):
    """Runs llama-bench once (one repetition, decode only); returns (its test's JSON, rusage)."""
    out, ru = run_child([binary, "-m", gguf, "-t", str(threads), "-p", "0", "-n", str(n_gen),
                         "-d", str(depth), "-r", "1", "-o", "json"])
    tests = [t for t in out if t["n_gen"] == n_gen]
    if len(tests) != 1:
        sys.exit(f"{binary}: expected one decode test in its JSON, got {out!r}")
    return tests[0], ru


def run_child(cmd):
    """Runs cmd once and reaps it itself; returns (its stdout as JSON, its rusage)."""
    binary = cmd[0]
    with open(os.devnull, "wb") as devnull:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.dup2(w, 1)
            os.dup2(devnull.fileno(), 2)
            os.execv(binary, cmd)
        os.close(w)
        chunks = []
        while True:
            b = os.read(r, 1 << 16)
            if not b:
                break
            chunks.append(b)
        os.close(r)
        _, status, ru = os.wait4(pid, 0)
    if status != 0:
        sys.exit(f"{' '.join(cmd[:6])} … failed (status {status})")
    return json.loads(b"".join(chunks)), ru


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--bin", action="append", default=None)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt", default="code_long")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON object")
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench: a peer arm (with --gguf)")
    ap.add_argument("--gguf", help="the GGUF model llama-bench decodes (e.g. the demo at Q4_0)")
    a = ap.parse_args()
    if bool(a.llama_bench) != bool(a.gguf):
        ap.error("--llama-bench and --gguf go together")
    bins = a.bin or [os.path.join(ROOT, "target/release/nectar")]
    threads = [int(t) for t in a.threads.split(",")]
    ids = prompt_ids(a.prompt)
    load_start = load()
    print(f"load average at start: {load_start}; cores: {os.cpu_count()}", file=sys.stderr)
    rows = {}
    tokens = {}
    peer = None
    for rnd in range(a.rounds):
        for model in a.model:
            for b in bins:
                for t in threads:
                    full, ru = run_with_rusage(b, model, t, ids, a.max_tokens)
                    _, ru1 = run_with_rusage(b, model, t, ids, 1)
                    n = full["stats"]["generated_tokens"] - 1
                    prev = tokens.setdefault(model, full["tokens"])
                    if full["tokens"] != prev:
                        sys.exit(f"{b} --threads {t} on {model}: tokens differ from the first run")
                    cpu = (ru.ru_utime + ru.ru_stime) - (ru1.ru_utime + ru1.ru_stime)
                    r = rows.setdefault((model, b, t), [])
                    r.append({
                        "tok_s": full["stats"]["decode_tok_s"],
                        "cpu_ms_per_tok": 1e3 * cpu / n,
                        "vol_cs_per_tok": (ru.ru_nvcsw - ru1.ru_nvcsw) / n,
                        "invol_cs_per_tok": (ru.ru_nivcsw - ru1.ru_nivcsw) / n,
                    })
                    print(f"round {rnd + 1}: {os.path.basename(model)} {b} --threads {t}: "
                          f"{r[-1]['tok_s']:.0f} tok/s", file=sys.stderr)
        if a.llama_bench:
            depth = len(ids.split(","))
            for t in threads:
                test, ru = llama_bench(a.llama_bench, a.gguf, t, depth, a.max_tokens)
                tok_s = test["avg_ts"]
                # What llama-bench ran with (its defaults), for the record.
                peer = {k: test.get(k) for k in ("cpu_info", "backends", "model_type", "model_size",
                                                 "n_batch", "poll", "type_k", "type_v",
                                                 "flash_attn", "repack", "n_depth", "n_gen")}
                _, ru1 = llama_bench(a.llama_bench, a.gguf, t, depth, 1)
                n = a.max_tokens - 1
                cpu = (ru.ru_utime + ru.ru_stime) - (ru1.ru_utime + ru1.ru_stime)
                r = rows.setdefault((a.gguf, a.llama_bench, t), [])
                r.append({
                    "tok_s": tok_s,
                    "cpu_ms_per_tok": 1e3 * cpu / n,
                    "vol_cs_per_tok": (ru.ru_nvcsw - ru1.ru_nvcsw) / n,
                    "invol_cs_per_tok": (ru.ru_nivcsw - ru1.ru_nivcsw) / n,
                })
                print(f"round {rnd + 1}: {os.path.basename(a.gguf)} {a.llama_bench} -t {t}: "
                      f"{tok_s:.0f} tok/s", file=sys.stderr)
    print(f"load average at end: {load()}", file=sys.stderr)

    def med(xs):
        return statistics.median(xs)

    out = []
    for (model, b, t), rs in rows.items():
        tok = [r["tok_s"] for r in rs]
        one = rows.get((model, b, threads[0]))
        out.append({
            "model": model, "bin": b, "threads": t,
            "decode_tok_s": med(tok), "min": min(tok), "max": max(tok),
            "vs_first_threads": med(tok) / med([r["tok_s"] for r in one]),
            **{k: med([r[k] for r in rs])
               for k in ["cpu_ms_per_tok", "vol_cs_per_tok", "invol_cs_per_tok"]},
        })
    if a.json:
        print(json.dumps({"load_start": load_start, "load_end": load(), "cores": os.cpu_count(),
                          "prompt_tokens": len(ids.split(",")), "max_tokens": a.max_tokens,
                          "rounds": a.rounds, "llama_bench": peer, "rows": out}, indent=1))
        return
    print(f"| model | binary | threads | decode tok/s, median (range) | vs {threads[0]} thread(s) "
          "| CPU ms/token | voluntary cs/token | involuntary cs/token |")
    print("|---|---|--:|---|--:|--:|--:|--:|")
    for r in out:
        print(f"| {os.path.basename(r['model'])} | {r['bin']} | {r['threads']} | "
              f"{r['decode_tok_s']:.0f} ({r['min']:.0f}–{r['max']:.0f}) | "
              f"{r['vs_first_threads']:.2f} | {r['cpu_ms_per_tok']:.2f} | "
              f"{r['vol_cs_per_tok']:.2f} | {r['invol_cs_per_tok']:.2f} |")


if __name__ == "__main__":
    main()
