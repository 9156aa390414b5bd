// RoPE of query heads kept in VRAM (rows.rs): per (row, head), the `2·half` dims at `offset` of
// the head rotate by the row's angles and come out de-interleaved — rotated pair i lands at i and
// half + i — as nectar-kernels' RopeTable::rotate writes them, with the same operations, each a
// separately rounded f32 (e·c − o·s and o·c + e·s; the _rn intrinsics keep NVRTC from fusing),
// so the same bits. `sc` holds each row's (sin, cos) per pair, computed on the host.

#define ROPE_MAX_HALF 128

extern "C" __global__ void rope_heads(float* __restrict__ x, const float* __restrict__ sc,
                                      int rows, int heads, int head_dim, int offset, int half) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)rows * heads) return;
    long long r = t / heads;
    float* v = x + t * head_dim + offset;
    const float* a = sc + r * 2 * half;
    float out[2 * ROPE_MAX_HALF];
    for (int i = 0; i < half; i++) {
        float s = a[2 * i], c = a[2 * i + 1];
        float e = v[2 * i], o = v[2 * i + 1];
        out[i] = __fsub_rn(__fmul_rn(e, c), __fmul_rn(o, s));
        out[half + i] = __fadd_rn(__fmul_rn(o, c), __fmul_rn(e, s));
    }
    for (int i = 0; i < 2 * half; i++) v[i] = out[i];
}
