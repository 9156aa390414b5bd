#!/usr/bin/env python3
"""Two conversations served together: writes two trace directories from a trace kind whose
segments are conversations (route256's `decode`, `decode-sampled`), pairing conversation i with
i + n/2 (other domains). INTER runs both prompts, then their decode rows interleaved (A1 B1 A2
B2 …: with `nectar bench policy --window 2` every step is a batch of one row of each, as a
server decodes two requests); SEQ runs the same rows one conversation after the other (each
2-row step then verifies two tokens of one stream). Both are kind `session` (one cache, no
reset), each pair's decode cut to the shorter of the two; INTER carries `session.streams.npy`
(each row's conversation, the server's sequence), unless `--flat`. See benchmarks/RESULTS.md,
"Two conversations in one batch".

    python3 benchmarks/trace_interleave.py SRC_DIR KIND DEST_PREFIX [--flat]   # e.g. ... route256 decode /tmp/ilv
    nectar bench policy --trace /tmp/ilv-INTER --window 2 --slots 12,16,32 --admission lru,predictive
    nectar bench replay --model SYNTH --trace /tmp/ilv-INTER --kind session --memory-budget 5200M  # as serve --parallel 2
"""
import json
import os
import shutil
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trace_subset import read_npy, write_npy  # noqa: E402


def main():
    src, kind, prefix = sys.argv[1], sys.argv[2], sys.argv[3]
    # --flat: INTER without its streams file (one token history for both conversations, as
    # before the predictor kept streams apart).
    flat = "--flat" in sys.argv[4:]
    man = json.load(open(os.path.join(src, "manifest.json")))
    e = man["traces"][kind]
    eh, eb = read_npy(os.path.join(src, e["experts"]))
    th, tb = read_npy(os.path.join(src, e["tokens"]))
    _, layers, k = eh["shape"]
    rowb = layers * k * 2  # int16 expert ids
    tokb = 2  # uint16 token ids
    segs = e["segments"]
    half = len(segs) // 2
    for name in ("INTER", "SEQ"):
        rows, out, seq = [], [], []
        for a, b in ((i, i + half) for i in range(half)):
            A, B = segs[a], segs[b]
            pa = list(range(A["start"], A["start"] + A["warmup"]))
            pb = list(range(B["start"], B["start"] + B["warmup"]))
            m = min(A["end"] - A["start"] - A["warmup"], B["end"] - B["start"] - B["warmup"])
            da = list(range(A["start"] + A["warmup"], A["start"] + A["warmup"] + m))
            db = list(range(B["start"] + B["warmup"], B["start"] + B["warmup"] + m))
            if name == "INTER":
                start = len(rows)
                rows += pa + pb + [r for pair in zip(da, db) for r in pair]
                seq += [a] * len(pa) + [b] * len(pb) + [a, b] * m
                out.append(dict(domain=f"{A['domain']}+{B['domain']}", kind="conversation",
                                source=f"{kind} #{a} + #{b}", start=start, end=len(rows),
                                warmup=len(pa) + len(pb), decoded=2 * m))
            else:
                for s, p, d in ((a, pa, da), (b, pb, db)):
                    start = len(rows)
                    rows += p + d
                    out.append(dict(domain=segs[s]["domain"], kind="conversation",
                                    source=f"{kind} #{s}", start=start, end=len(rows),
                                    warmup=len(p), decoded=m))
        dest = f"{prefix}-{name}"
        os.makedirs(dest, exist_ok=True)
        write_npy(os.path.join(dest, "session.experts.npy"), eh["descr"], (len(rows), layers, k),
                  b"".join(eb[r * rowb:(r + 1) * rowb] for r in rows))
        write_npy(os.path.join(dest, "session.tokens.npy"), th["descr"], (len(rows),),
                  b"".join(tb[r * tokb:(r + 1) * tokb] for r in rows))
        entry = dict(e, experts="session.experts.npy", tokens="session.tokens.npy",
                     shape=[len(rows), layers, k], segments=out,
                     replay={"reset": "never", "note": f"one cache; {name} of {kind}"})
        if seq and not flat:
            # Which conversation each row is (the server's sequence): the policy learns each
            # one's tokens as its own stream.
            write_npy(os.path.join(dest, "session.streams.npy"), "<u2", (len(rows),),
                      b"".join(struct.pack("<H", x) for x in seq))
            entry["streams"] = "session.streams.npy"
        # The traced model's layer count (which trace layer is the MTP layer), for `bench replay`.
        if os.path.exists(os.path.join(src, "model-config.json")):
            shutil.copy(os.path.join(src, "model-config.json"), dest)
        json.dump(dict(man, traces={"session": entry}), open(os.path.join(dest, "manifest.json"), "w"), indent=1)
        print(dest, len(rows), "rows,", len(out), "segments")


if __name__ == "__main__":
    main()
