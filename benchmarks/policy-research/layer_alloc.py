"""Would slots spread unevenly over the layers beat the runtime's equal share?

The runtime gives every sparse layer the same number of expert slots. This asks whether any split of
the same total (L·C slots) over the layers reads fewer experts, using the best a cache can do at
each capacity (Belady with bypass, replay.py's `run_opt`) — an upper bound on what any per-layer
capacity rule could gain. For each layer it computes the Belady hits at every capacity, then
fills the total greedily by marginal hits (optimal for concave curves) and compares with C each.

Run: python3 layer_alloc.py [TRACE_DIR] [KIND ...]  (default: the route256 traces, decode and
session; ~1 min per kind). Prints, per C: the hit rate with C slots per layer, with the best split,
their ratio, and the split.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "fixtures", "traces"))
import replay  # noqa: E402

CAPACITIES = [8, 12, 16, 32]


def curves(arr, li, segments, reset_mode, top, E):
    rows, counted, reset = replay.build_steps(segments, 1, "warm", reset_mode)
    U, _ = replay.layer_requests(arr, li, rows)
    nu = replay.next_use(U, counted, reset, E)
    return {c: replay.run_opt(U, counted, reset, c, nu, True) for c in range(1, top + 1)}


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "tests", "fixtures", "traces", "route256")
    kinds = sys.argv[2:] or ["decode", "session"]
    for kind in kinds:
        arr, layer_ids, segments, rp = replay.load_trace(d, kind)
        main_layers = [i for i, l in enumerate(layer_ids) if l != max(layer_ids)]  # the last is MTP
        E = int(arr.max()) + 1
        top = 2 * max(CAPACITIES)
        cur = {li: curves(arr, li, segments, rp.get("reset", "never"), top, E) for li in main_layers}
        print(f"{kind}: {len(main_layers)} main layers, {E} experts")
        for C in CAPACITIES:
            alloc = {li: 1 for li in main_layers}
            while sum(alloc.values()) < C * len(main_layers):
                gain = lambda li: cur[li][alloc[li] + 1][0] - cur[li][alloc[li]][0] if alloc[li] < top else -1
                alloc[max(main_layers, key=gain)] += 1
            q = sum(cur[li][C][1] for li in main_layers)
            even = sum(cur[li][C][0] for li in main_layers) / q
            best = sum(cur[li][alloc[li]][0] for li in main_layers) / q
            split = [alloc[li] for li in main_layers]
            print(f"  C={C:3d}  equal {even:.4f}  best split {best:.4f}  ratio {best / even:.4f}  split {split}")


if __name__ == "__main__":
    main()
