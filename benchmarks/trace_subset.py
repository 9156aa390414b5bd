"""Writes a trace directory holding some conversations of another one's `decode` kind, so that
`nectar fit --project --trace SUB` and `nectar bench replay --trace SUB` see the very same
routes (benchmarks/RESULTS.md, "The projection validated on a quiet machine").

usage: trace_subset.py SRC_DIR DEST_DIR INDEX[,INDEX...] [DECODED]    e.g. ... 0,6,12,18 96

DECODED keeps each conversation's prompt and its first DECODED decode rows, so that a short
replay (`bench replay --tokens DECODED`) and the projection's hit-rate curve see the same rows.
"""
import ast
import json
import os
import shutil
import struct
import sys


def read_npy(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:6] == b"\x93NUMPY", f"{path}: not an .npy file"
    major = data[6]
    if major == 1:
        (hlen,) = struct.unpack("<H", data[8:10])
        start = 10
    else:
        (hlen,) = struct.unpack("<I", data[8:12])
        start = 12
    header = ast.literal_eval(data[start : start + hlen].decode("latin1"))
    assert not header["fortran_order"], f"{path}: Fortran order"
    return header, data[start + hlen :]


def write_npy(path, descr, shape, body):
    header = repr({"descr": descr, "fortran_order": False, "shape": tuple(shape)}).encode()
    pad = 64 - (10 + len(header) + 1) % 64
    header += b" " * pad + b"\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + body)


def main():
    src, dest, picks = sys.argv[1], sys.argv[2], [int(i) for i in sys.argv[3].split(",")]
    man = json.load(open(os.path.join(src, "manifest.json")))
    entry = man["traces"]["decode"]
    segs = [entry["segments"][i] for i in picks]
    if len(sys.argv) > 4:
        keep = int(sys.argv[4])
        segs = [dict(s, end=min(s["end"], s["start"] + s["warmup"] + keep), decoded=min(s["decoded"], keep))
                for s in segs]
    os.makedirs(dest, exist_ok=True)
    out_segs, parts = [], {"experts": [], "tokens": []}
    row = 0
    for s in segs:
        n = s["end"] - s["start"]
        out_segs.append(dict(s, start=row, end=row + n))
        row += n
    shapes = {}
    for key in ("experts", "tokens"):
        if key not in entry:
            continue
        header, body = read_npy(os.path.join(src, entry[key]))
        shape = list(header["shape"])
        per_row = len(body) // shape[0]
        chunks = [body[s["start"] * per_row : s["end"] * per_row] for s in segs]
        shapes[key] = [row] + shape[1:]
        write_npy(os.path.join(dest, entry[key]), header["descr"], shapes[key], b"".join(chunks))
    sub = dict(entry, segments=out_segs, shape=shapes["experts"])
    sub["note"] = f"{entry.get('note', '')} [conversations {picks} of {src}]"
    json.dump(dict(man, traces={"decode": sub}), open(os.path.join(dest, "manifest.json"), "w"), indent=1)
    cfg = os.path.join(src, "model-config.json")
    if os.path.exists(cfg):
        shutil.copy(cfg, dest)
    print(f"{dest}: {len(segs)} conversations, {row} rows")


if __name__ == "__main__":
    main()
