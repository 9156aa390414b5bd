#!/usr/bin/env python3
"""Held-out tuning of the predictive policy's terms (numpy; imports research.py).

Every trace's conversations are split by parity: even conversations tune, odd ones report (the
cache runs over the whole trace as in research.py; only the hit counts are split, so reported rows
never entered the choice of parameters). Candidate terms beyond `predictive`:

  l(e) = 8 L(e) / sum L        L = requests decayed with a long half-life H2 (the conversation's
                               own routes so far, its prompt included: what this text keeps using)
  y(e) = (sum_{a in R(t,l)} N2(a -> e) + f(e)) / (sum_{a in R(t,l)} n2(a) + 1)
                               N2: rows s with a in R(s,l) and e in R(s+2,l) (lag-2 transitions)
  score = f + w_m m + w_x x + w_l l + w_y y

Run: /tmp/pyenv/bin/python heldout.py [--traces ...] [--grid]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import research as Q  # noqa: E402

E = Q.E


def parts(kind, n_rows):
    """Conversation parity per row (0 = tune, 1 = report)."""
    _, _, segs, _ = Q.R.load_trace(Q.DIR, kind)
    out = np.zeros(n_rows, int)
    for i, s in enumerate(segs):
        out[s["start"]:s["end"]] = i % 2
    return out


def simulate(oh, counted, reset, part, caps, scorer):
    T = len(oh)
    caches = {C: np.zeros(E, bool) for C in caps}
    hq = {C: np.zeros((2, 2), int) for C in caps}
    for t in range(T):
        u = oh[t]
        if reset[t]:
            for C in caps:
                caches[C][:] = False
        if counted[t]:
            n = int(u.sum())
            for C in caps:
                hq[C][part[t], 0] += int((caches[C] & u).sum())
                hq[C][part[t], 1] += n
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


def scorer2(oh, reset, match, H=32, w_m=1.0, w_x=2.0, H2=512, w_l=0.0, w_y=0.0, gamma=0.8, D=16,
            ohp=None, w_c=0.0):
    g = 0.5 ** (1.0 / H)
    g2 = 0.5 ** (1.0 / H2)
    F = np.zeros(E)
    L = np.zeros(E)
    N = np.zeros((E, E))
    n = np.zeros(E)
    N2 = np.zeros((E, E))
    n2 = np.zeros(E)
    wts = gamma ** np.arange(D)
    seg = [0]
    Nc = np.zeros((E, E))
    nc = np.zeros(E)

    def sc(t):
        if reset[t]:
            F[:] = 0
            L[:] = 0
            N[:] = 0
            n[:] = 0
            N2[:] = 0
            n2[:] = 0
            Nc[:] = 0
            nc[:] = 0
            seg[0] = t
        else:
            if t - 1 >= seg[0]:
                prev = oh[t - 1]
                N[prev] += oh[t]
                n[prev] += 1
            if w_c and ohp is not None:
                pp = ohp[t - 1]
                Nc[pp] += oh[t]
                nc[pp] += 1
            if w_y and t - 2 >= seg[0]:
                p2 = oh[t - 2]
                N2[p2] += oh[t]
                n2[p2] += 1
        F[:] = F * g + oh[t]
        L[:] = L * g2 + oh[t]
        f = F / max(F.sum(), 1e-12) * 8
        s = f.copy()
        p = match[t]
        if p >= 0 and w_m:
            k = min(D, t - 1 - p)
            s += w_m * (wts[:k, None] * oh[p + 1:p + 1 + k]).sum(0)
        cur = oh[t]
        if w_x:
            s += w_x * (N[cur].sum(0) + f) / (n[cur].sum() + 1)
        if w_l:
            s += w_l * L / max(L.sum(), 1e-12) * 8
        if w_c and ohp is not None:
            cp = ohp[t]
            s += w_c * (Nc[cp].sum(0) + f) / (nc[cp].sum() + 1)
        if w_y:
            s += w_y * (N2[cur].sum(0) + f) / (n2[cur].sum() + 1)
        return s
    return sc


_cache = {}


def data(kind):
    if kind not in _cache:
        arr, tok, rows, counted, reset = Q.load(kind)
        match, _ = Q.context_match(tok, reset)
        part = parts(kind, len(rows))
        ohs = [Q.onehot(arr, li) for li in range(7)]
        opt = np.zeros((len(Q.CAPS), 2, 2), int)
        for oh in ohs:
            # Belady per part: run it once, split its hit counts the same way.
            U = [list(np.nonzero(oh[t])[0]) for t in range(len(oh))]
            nu = Q.R.next_use(U, counted, reset, E)
            for ci, C in enumerate(Q.CAPS):
                for pt in (0, 1):
                    c2 = counted & (part == pt)
                    h, q = Q.R.run_opt(U, c2, reset, C, nu, True)
                    opt[ci, pt] += (h, q)
        _cache[kind] = (ohs, counted, reset, match, part, opt)
    return _cache[kind]


def evaluate(kind, params, caps=Q.CAPS):
    ohs, counted, reset, match, part, opt = data(kind)
    tot = {C: np.zeros((2, 2), int) for C in caps}
    for li, oh in enumerate(ohs):
        ohp = ohs[li - 1] if li > 0 else None
        sc = scorer2(oh, reset, match, ohp=ohp, **params)
        for C, hq in simulate(oh, counted, reset, part, caps, sc).items():
            tot[C] += hq
    out = {}
    for C in caps:
        ci = Q.CAPS.index(C)
        out[C] = [tot[C][p, 0] / tot[C][p, 1] / (opt[ci, p, 0] / opt[ci, p, 1]) for p in (0, 1)]
        out[C].append(tot[C][1, 0] / tot[C][1, 1])
    return out  # C -> [tune ratio, report ratio, report hit]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--traces", default="decode-sampled,prefill,decode,session")
    ap.add_argument("--caps", default="8,12,16")
    ap.add_argument("--params", default="{}")
    a = ap.parse_args()
    caps = tuple(int(c) for c in a.caps.split(","))
    params = json.loads(a.params)
    for kind in a.traces.split(","):
        r = evaluate(kind, params, caps)
        print(kind, json.dumps(params), " ".join(f"C{C}: tune {v[0]:.3f} report {v[1]:.3f} (hit {v[2]:.3f})" for C, v in r.items()), flush=True)


if __name__ == "__main__":
    main()


def context_match_all(tok, reset, ns=Q.NS, keep=8):
    """Like research.context_match, but every kept earlier occurrence (the `keep` latest) of the
    longest matched context: -> list per step of positions p (latest first)."""
    T = len(tok)
    out = [[] for _ in range(T)]
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
                    lst = maps[n].setdefault(tuple(tok[q - n + 1:q + 1]), [])
                    lst.insert(0, q)
                    del lst[keep:]
        for n in reversed(ns):
            if t - n + 1 < seg0:
                continue
            ps = maps[n].get(tuple(tok[t - n + 1:t + 1]))
            if ps:
                out[t] = list(ps)
                break
    return out


def scorer_all(oh, reset, matches, H=32, w_m=1.0, w_x=2.0, gamma=0.8, D=16):
    """predictive with the match term averaged over every kept occurrence of the context."""
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
        ps = matches[t]
        if ps and w_m:
            acc = np.zeros(E)
            for p in ps:
                k = min(D, t - 1 - p)
                acc += (wts[:k, None] * oh[p + 1:p + 1 + k]).sum(0)
            s += w_m * acc / len(ps)
        cur = oh[t]
        s += w_x * (N[cur].sum(0) + f) / (n[cur].sum() + 1)
        return s
    return sc


def evaluate_all(kind, keep, caps=Q.CAPS, **kw):
    ohs, counted, reset, match, part, opt = data(kind)
    arr, tok, rows, counted, reset = Q.load(kind)
    matches = context_match_all(tok, reset, keep=keep)
    tot = {C: np.zeros((2, 2), int) for C in caps}
    for oh in ohs:
        for C, hq in simulate(oh, counted, reset, part, caps, scorer_all(oh, reset, matches, **kw)).items():
            tot[C] += hq
    out = {}
    for C in caps:
        ci = Q.CAPS.index(C)
        out[C] = [tot[C][p, 0] / tot[C][p, 1] / (opt[ci, p, 0] / opt[ci, p, 1]) for p in (0, 1)]
        out[C].append(tot[C][1, 0] / tot[C][1, 1])
    return out
