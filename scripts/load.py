#!/usr/bin/env python3
"""Bounded loopback load test for `nectar serve`: N concurrent clients, each sending a fixed
number of streaming chat requests; reports latency percentiles, time to first token, and
throughput per concurrency level. Standard library only.

    scripts/load.py --base-url http://127.0.0.1:8080 --clients 1,4,16 --requests 4 --max-tokens 64

Every request is greedy with a fixed token budget and a prompt drawn from a fixed list, so runs
are comparable. The result is printed as a table and, with --json, as one JSON object.
"""

import argparse
import json
import statistics
import threading
import time
import urllib.request

WORDS = [
    "harbor", "anchor", "river", "mountain", "lantern", "garden", "window", "silver",
    "forest", "candle", "bridge", "meadow", "thunder", "pepper", "marble", "feather",
]


def one_request(base, key, prompt, max_tokens):
    """Streams one chat completion; returns (latency s, ttft s, completion tokens)."""
    body = json.dumps({
        "model": "nectar",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    req = urllib.request.Request(base + "/v1/chat/completions", data=body, headers=headers)
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ttft is None and ev.get("choices") and ev["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - t0
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
    return time.perf_counter() - t0, ttft or 0.0, tokens


def pct(xs, p):
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def level(base, key, clients, requests, max_tokens):
    results = []
    lock = threading.Lock()
    errors = []

    def client(c):
        for i in range(requests):
            prompt = 'Define the word "%s".' % WORDS[(c * requests + i) % len(WORDS)]
            try:
                r = one_request(base, key, prompt, max_tokens)
            except Exception as e:  # noqa: BLE001 - reported, not hidden
                with lock:
                    errors.append(repr(e))
                continue
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = [r[0] for r in results]
    ttft = [r[1] for r in results]
    tokens = sum(r[2] for r in results)
    return {
        "clients": clients,
        "requests": len(results),
        "errors": errors,
        "wall_s": wall,
        "latency_p50_s": pct(lat, 50) if lat else None,
        "latency_p99_s": pct(lat, 99) if lat else None,
        "ttft_p50_s": pct(ttft, 50) if ttft else None,
        "ttft_p99_s": pct(ttft, 99) if ttft else None,
        "tokens": tokens,
        "tok_s": tokens / wall if wall > 0 else 0.0,
        "per_client_tok_s": statistics.mean(r[2] / r[0] for r in results) if results else 0.0,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8080")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--clients", default="1,4,16", help="comma-separated concurrency levels")
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    levels = [int(x) for x in a.clients.split(",")]
    # Warm-up: one request so the first level does not pay page faults.
    one_request(a.base_url, a.api_key, 'Define the word "warm".', 4)
    out = [level(a.base_url, a.api_key, c, a.requests, a.max_tokens) for c in levels]
    if a.json:
        print(json.dumps({"levels": out, "max_tokens": a.max_tokens, "requests": a.requests}))
        return
    print("clients  requests  p50 s   p99 s   ttft p50  ttft p99  tok/s   per-client tok/s  errors")
    for r in out:
        print("%7d  %8d  %6.2f  %6.2f  %8.3f  %8.3f  %6.1f  %16.1f  %d" % (
            r["clients"], r["requests"], r["latency_p50_s"] or 0, r["latency_p99_s"] or 0,
            r["ttft_p50_s"] or 0, r["ttft_p99_s"] or 0, r["tok_s"], r["per_client_tok_s"],
            len(r["errors"])))
    if any(r["errors"] for r in out):
        raise SystemExit("some requests failed: " + "; ".join(sum((r["errors"] for r in out), [])))


if __name__ == "__main__":
    main()
