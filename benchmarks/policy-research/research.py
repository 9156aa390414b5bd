#!/usr/bin/env python3
"""Expert-cache policy research on tests/fixtures/traces/route256 (numpy only).

Replays the step model of /work/shared/traces/replay.py (one token per step, main layers 1..7, prompt
rows replayed but not counted, reset per conversation for decode*, never for session/prefill) and
compares causal policies against Belady-with-bypass (`opt-bypass`).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/fixtures/traces"))
import replay as R  # noqa: E402

E = 256
DIR = os.path.join(os.path.dirname(__file__), "../../tests/fixtures/traces/route256")


def load(kind):
    arr, layer_ids, segs, rp = R.load_trace(DIR, kind)
    tok = np.load(os.path.join(DIR, f"{kind}.tokens.npy")).astype(np.int64)
    reset_mode = rp.get("reset", "never")
    rows, counted, reset = R.build_steps(segs, 1, "warm", reset_mode)
    rows = np.array([r[0] for r in rows])
    return arr, tok, rows, counted, reset


def onehot(arr, li):
    T = arr.shape[0]
    oh = np.zeros((T, E), bool)
    for j in range(arr.shape[2]):
        v = arr[:, li, j] >= 0
        oh[np.nonzero(v)[0], arr[v, li, j]] = True
    return oh


NS = (1, 2, 4, 8, 16, 32)


def context_match(tok, reset, ns=NS):
    """Causal longest-suffix match. For step t: the most recent p <= t-2 (since the last reset) whose n
    tokens ending at p equal the n tokens ending at t, longest n in `ns` first -> match[t] (-1 = none),
    mlen[t]. Reads token ids up to t only; the continuation rows p+1..t-1 are already processed. The
    n-grams ending at t-2 become visible at step t (so the map always holds the latest usable p)."""
    T = len(tok)
    match = np.full(T, -1)
    mlen = np.zeros(T, int)
    maps = {n: {} for n in ns}
    seg0 = 0
    for t in range(T):
        if reset[t]:
            maps = {n: {} for n in ns}
            seg0 = t
        q = t - 2
        if q >= seg0:
            for n in ns:
                if q - n + 1 >= seg0:
                    maps[n][tuple(tok[q - n + 1:q + 1])] = q
        for n in reversed(ns):
            if t - n + 1 < seg0:
                continue
            p = maps[n].get(tuple(tok[t - n + 1:t + 1]))
            if p is not None:
                match[t] = p
                mlen[t] = n
                break
    return match, mlen


def opt_bypass(oh, counted, reset, caps):
    """Belady with bypass (replay.py's opt-bypass on one-hot rows)."""
    T = len(oh)
    U = [list(np.nonzero(oh[t])[0]) for t in range(T)]
    nu = R.next_use(U, counted, reset, E)
    return {C: R.run_opt(U, counted, reset, C, nu, True) for C in caps}


def simulate(oh, counted, reset, caps, scorer):
    """Score-based bypass cache: after each step keep the C highest scores among residents and this
    step's experts (ties: residents first, then this step's order). `scorer(t)` -> float[E], called
    once per step after the step's hits are counted (it may read only causal information)."""
    T = len(oh)
    caches = {C: np.zeros(E, bool) for C in caps}
    hq = {C: [0, 0] for C in caps}
    for t in range(T):
        u = oh[t]
        if reset[t]:
            for C in caps:
                caches[C][:] = False
        if counted[t]:
            n = int(u.sum())
            for C in caps:
                hq[C][0] += int((caches[C] & u).sum())
                hq[C][1] += n
        s = scorer(t)
        for C in caps:
            c = caches[C]
            cand = c | u
            if cand.sum() > C:
                key = np.where(cand, s + 1e-9 * c, -np.inf)
                keep = np.argpartition(-key, C - 1)[:C]
                c[:] = False
                c[keep] = True
            else:
                c |= u
    return hq


# ------------------------------------------------------------------------------------ policies
def lru_scorer(oh, reset):
    """LRU as a score (forced admission is emulated by giving this step's experts the top scores)."""
    last = np.full(E, -1.0)

    def sc(t):
        last[oh[t]] = t + 1e6  # this step's experts always enter (forced admission)
        s = last.copy()
        last[oh[t]] = t
        return s
    return sc


def topc_scorer(oh, reset, H=32):
    """Decayed-frequency top-C (replay.py's topc:H)."""
    g = 0.5 ** (1.0 / H)
    F = np.zeros(E)

    def sc(t):
        if reset[t]:
            F[:] = 0
        F[:] = F * g + oh[t]
        return F.copy()
    return sc


def predictive_scorer(oh, reset, match, H=32, w_m=1.0, gamma=0.8, D=16, w_x=2.0):
    """The winner (Rust: Admission::Predictive). Per candidate e of layer l after step t:
        f(e) = 8 F(e) / sum F           F = request counts decayed with half-life H steps
        m(e) = sum_{k=1..min(D, t-1-p)} gamma^(k-1) [e in R(p+k, l)]   p = context match of step t
        x(e) = (sum_{e' in R(t,l)} N(e' -> e) + f(e)) / (sum_{e' in R(t,l)} n(e') + 1)
        score = f + w_m m + w_x x
    N(a -> b): rows s with a in R(s,l) and b in R(s+1,l) seen so far; n(a): such rows with a successor.
    All tables reset with the cache (decode: per conversation)."""
    g = 0.5 ** (1.0 / H)
    F = np.zeros(E)
    N = np.zeros((E, E))
    n = np.zeros(E)
    wts = gamma ** np.arange(D)

    def sc(t):
        if reset[t]:
            F[:] = 0
            N[:] = 0
            n[:] = 0
        elif t > 0:
            prev = oh[t - 1]
            N[prev] += oh[t]
            n[prev] += 1
        F[:] = F * g + oh[t]
        f = F / max(F.sum(), 1e-12) * 8
        s = f.copy()
        p = match[t]
        if p >= 0 and w_m:
            k = min(D, t - 1 - p)
            s += w_m * (wts[:k, None] * oh[p + 1:p + 1 + k]).sum(0)
        if w_x:
            cur = oh[t]
            s += w_x * (N[cur].sum(0) + f) / (n[cur].sum() + 1)
        return s
    return sc


POLICIES = {
    "lru": lambda oh, reset, match: lru_scorer(oh, reset),
    "topc:32": lambda oh, reset, match: topc_scorer(oh, reset, 32),
    "freq+transition": lambda oh, reset, match: predictive_scorer(oh, reset, match, w_m=0.0),
    "freq+match": lambda oh, reset, match: predictive_scorer(oh, reset, match, w_x=0.0),
    "predictive": lambda oh, reset, match: predictive_scorer(oh, reset, match),
}
CAPS = (8, 12, 16, 32, 64)
KINDS = ("decode", "decode-sampled", "session", "prefill")


def evaluate(kind, policies, caps=CAPS):
    arr, tok, rows, counted, reset = load(kind)
    assert (rows == np.arange(len(rows))).all()
    match, _ = context_match(tok, reset)
    out = {p: {C: [0, 0] for C in caps} for p in list(policies) + ["opt-bypass"]}
    for li in range(7):
        oh = onehot(arr, li)
        for C, hq in opt_bypass(oh, counted, reset, caps).items():
            out["opt-bypass"][C][0] += hq[0]
            out["opt-bypass"][C][1] += hq[1]
        if "lru" in policies:  # replay.py's LRU (intra-step recency by selection rank)
            Ur, _ = R.layer_requests(arr, li, [[t] for t in range(len(oh))])
            for C in caps:
                h, q = R.run_lru(Ur, counted, reset, C)
                out["lru"][C][0] += h
                out["lru"][C][1] += q
        for name in policies:
            if name == "lru":
                continue
            for C, hq in simulate(oh, counted, reset, caps, POLICIES[name](oh, reset, match)).items():
                out[name][C][0] += hq[0]
                out[name][C][1] += hq[1]
    return {p: {C: v[0] / v[1] for C, v in d.items()} for p, d in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--traces", default=",".join(KINDS))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--json")
    a = ap.parse_args()
    pols = a.policies.split(",")
    allres = {}
    print("| trace | policy | " + " | ".join(f"C={C}" for C in CAPS) + " |")
    print("|---|---|" + "---|" * len(CAPS))
    for kind in a.traces.split(","):
        r = evaluate(kind, pols)
        allres[kind] = r
        opt = r["opt-bypass"]
        for p in pols + ["opt-bypass"]:
            cells = [f"{r[p][C]:.3f}" + ("" if p == "opt-bypass" else f" ({r[p][C] / opt[C]:.2f})") for C in CAPS]
            print(f"| {kind} | {p} | " + " | ".join(cells) + " |", flush=True)
    if a.json:
        json.dump(allres, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
