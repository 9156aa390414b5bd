// The int4 GEMV on the integer tensor cores: y[t] = W · x[t] for M = 1..8 activation rows over
// int4 codes (per row or in groups of a multiple of 64 columns), on mma.sync.m16n8k32 (u8 codes
// × s8 activation digits, s32 sums). Compiled by NVRTC after gemv.cu and gemm.cu (Job, u8, u32,
// u64, scale_index come from there).
//
// Why integers: a code widens to a u8 with one mask (even nibbles) or a shift and a mask (odd
// nibbles), where the bf16 tensor-core GEMV (gemv_tc.cu) spent a mask, an or and an FMA per two
// codes and three MMAs per 16 columns; that kernel issued ~600 instructions per 2 KB of weights
// and read a token's 16 expert gate/up matrices at 0.44 of the HBM read rate. This one issues
// ~200 and, on the packed layout below, reads them at 0.81 (0.71 with the activation split's
// launch; RESULTS, "The int4 GEMV on the integer tensor cores").
//
// Activations (q_split, one warp per 64-column step and token, once per launch): an exponent E
// per (token, step) with max|x| < 2^E; xi = rint(x · 2^(26-E)) (|xi| < 2^26, exact to 2^(E-27),
// i.e. within 2^-26 of the step's largest |x|) as four balanced base-128 digits d_p in [-64, 63],
// x ≈ Σ_p d_p · 2^(E-26+7p). Each digit plane is an MMA column of its own: column c = 4·tok + p,
// eight columns (two tokens) per MMA, so M = 1, 2 take one MMA per 16 rows × 32 columns.
//
// Per (row, column) and 64-column step: P = Σ_k n_k·d_k over the step's codes n = code + 8, exact
// in s32 (two k32 MMAs chained), f = (P − 8·Σ_k d_k) · 2^(E-26+7p) (exact in f32: |P − 8Σd| <
// 2^24), acc_c = fma(scale, f, acc_c), steps in increasing order per warp (warp w of W takes
// steps w, w + W, …), the warps' sums added in warp order (((a0 + a1) + a2) + …); then a token's
// output y = ((A3 + A2) + A1) + A0 over its four digit columns. W (4, 8 or 16 warps per block)
// follows from the column count alone (gemv.rs `q_kernel`), so an output depends only on its
// row, its token's activations and the column count — not on M, the row tiles per warp, the
// layout (packed or stored) or the other matrices of the launch.
//
// Layouts (Job.packed): stored — rows of row_bytes, scales row-major (what the RAM slab holds,
// so copied experts need no conversion); packed (`q_pack`, at upload; rows % 16 == 0, cols % 64
// == 0) — for each 16-row tile and 64-column step, lane L = 4g + t's 16 bytes (row g's 8 bytes
// of columns 16t … 16t + 15, then row g + 8's) at ((tile·steps + step)·32 + L)·16, and scale j
// of row r at ((tile·row_scales + j)·8 + g)·2 + h (g = r % 8, h = r / 8 % 2): one coalesced
// 512-byte load per tile and step instead of sixteen 32-byte pieces.


// Packs one stored int4 matrix (rows % 16 == 0, cols % 64 == 0) into `w` / `s`: thread i moves
// row i / (cols / 16)'s 8 bytes of 16 columns, and the scales whose first column is there.
extern "C" __global__ void q_pack(const u8* W, const float* S, int rows, int cols, int row_bytes,
                                  int row_scales, u32 gmagic, int gshift, u8* w, float* s) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const int pieces = cols >> 4;
    if (i >= (u64)rows * pieces) return;
    const int r = (int)(i / pieces), c = (int)(i % pieces) * 16;
    *(uint2*)(w + q_packed_byte(r, c, cols)) = *(const uint2*)(W + (u64)r * row_bytes + c / 2);
    const int j = (int)scale_index((u32)c, gmagic, gshift);
    if (c == 0 || j != (int)scale_index((u32)(c - 1), gmagic, gshift))
        s[q_packed_scale(r, j, row_scales)] = S[(u64)r * row_scales + j];
}

// Programmatic dependent launch (sm_90+; gemv.rs launches the GEMV with it after q_split): the
// GEMV's blocks start while the split runs, issue their first weight loads, and wait for the
// split's digits only where they read them. Elsewhere both are no-ops.
__device__ __forceinline__ void q_launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void q_wait_primary() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// One source of q_split: activations (m × cols f32) and where their digits go.
struct QSrc {
    u64 x;
    u64 q;
};

// Bytes of one source's digits: [step][group][32 lanes] uint4 B words, then [step][group][4 t]
// float4 {2^(E-26+7p), −8·Σd·2^(E-26+7p)} of D columns 2t, 2t + 1.
__device__ __forceinline__ u64 q_digit_bytes(int nsteps, int G) { return (u64)nsteps * G * 512; }

// Grid (ceil(steps · 2G / 4), sources), 128 threads: warp (step, token slot < 2G); lane l holds
// columns 2l, 2l + 1. Token slots ≥ m are zero digits.
extern "C" __global__ void __launch_bounds__(128)
    q_split(const QSrc* srcs, int m, int cols, int G) {
    __shared__ signed char dg[4][4][64];  // [warp][digit plane][column]
    q_launch_dependents();
    const QSrc src = srcs[blockIdx.y];
    const float* X = (const float*)src.x;
    const int nsteps = (cols + 63) >> 6;
    uint4* xq = (uint4*)src.q;
    float* xe = (float*)(src.q + q_digit_bytes(nsteps, G));
    const int lane = threadIdx.x & 31, wb = threadIdx.x >> 5;
    const int i = blockIdx.x * 4 + wb;
    if (i >= nsteps * 2 * G) return;
    const int tok = i % (2 * G), s = i / (2 * G);
    const int c = 64 * s + 2 * lane;
    float x0 = 0.0f, x1 = 0.0f;
    if (tok < m && c < cols) {
        x0 = X[(u64)tok * cols + c];
        if (c + 1 < cols) x1 = X[(u64)tok * cols + c + 1];
    }
    float mx = fmaxf(fabsf(x0), fabsf(x1));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    // A NaN or infinite activation makes its step's scale NaN, so the token's outputs are NaN
    // (as the CPU's sums are) instead of digits of garbage.
    const bool bad = __any_sync(0xffffffffu, !(fabsf(x0) <= 3.4e38f) || !(fabsf(x1) <= 3.4e38f));
    int E = 0;
    if (mx > 0.0f && !bad) frexpf(mx, &E);
    const float up = ldexpf(1.0f, 26 - E);
    // Offset 64 · (1 + 2^7 + 2^14 + 2^21): each 7-bit field minus 64 is a balanced digit.
    const int b0 = __float2int_rn(x0 * up) + 0x8102040, b1 = __float2int_rn(x1 * up) + 0x8102040;
    const int q = tok >> 1;
    // The four planes' digits, then their sums over the step (four independent reductions).
    int sum[4];
#pragma unroll
    for (int p = 0; p < 4; p++) {
        const int d0 = ((b0 >> (7 * p)) & 127) - 64, d1 = ((b1 >> (7 * p)) & 127) - 64;
        dg[wb][p][2 * lane] = (signed char)d0;
        dg[wb][p][2 * lane + 1] = (signed char)d1;
        sum[p] = d0 + d1;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int p = 0; p < 4; p++) sum[p] += __shfl_xor_sync(0xffffffffu, sum[p], o);
    if (lane < 4) {
        // Lane p writes plane p's {2^(E-26+7p), -8·Σd·2^(E-26+7p)}.
        const int p = lane, gc = 4 * (tok & 1) + p;
        const int sp = p == 0 ? sum[0] : p == 1 ? sum[1] : p == 2 ? sum[2] : sum[3];
        const float pw = bad ? __int_as_float(0x7fc00000) : ldexpf(1.0f, E - 26 + 7 * p);
        float* e = xe + (u64)(s * G + q) * 16;
        e[gc * 2] = pw;
        e[gc * 2 + 1] = -8.0f * (float)sp * pw;
    }
    __syncwarp();
    if (lane < 16) {
        // Lane (g, t) of the GEMV, g = this token's plane p: B words of k32 step 0 (columns
        // 16t + {0,2,4,6}, then {1,3,5,7}) and step 1 (the same + 8) — the codes' order after
        // the even / odd nibble masks.
        const int p = lane >> 2, t = lane & 3, gc = 4 * (tok & 1) + p;
        const signed char* d = dg[wb][p] + 16 * t;
        u32 w[4];
#pragma unroll
        for (int h = 0; h < 4; h++) {
            const int k0 = (h >> 1) * 8 + (h & 1);
            w[h] = (u32)(u8)d[k0] | ((u32)(u8)d[k0 + 2] << 8) | ((u32)(u8)d[k0 + 4] << 16) |
                   ((u32)(u8)d[k0 + 6] << 24);
        }
        xq[(u64)(s * G + q) * 32 + gc * 4 + t] = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

__device__ __forceinline__ void mma_u8s8(int (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                         u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Block: W warps over 16·T rows (T row tiles per warp), split over the 64-column steps (warp w
// takes steps w, w + W, …, in increasing order, one step of loads ahead). W is part of the
// accumulation order, T is not. Job.x holds the job's digits (q_split's layout for G).
template <int T, int G, int W, bool ROW_SCALE, bool PACKED>
__device__ __forceinline__ void gemv_q(const Job& job, int rows, int cols, int m, int row_bytes,
                                       int row_scales, u32 gmagic, int gshift,
                                       float (*red)[G][4][32]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int tile0 = blockIdx.x * T, row0 = tile0 * 16;
    const u8* Wt = (const u8*)job.w;
    const float* S = (const float*)job.s;
    const int nsteps = (cols + 63) >> 6;
    const uint4* xq = (const uint4*)job.x;
    const float4* xe = (const float4*)(job.x + q_digit_bytes(nsteps, G));
    // Rows past the end re-read the last row (packed: the last tile), never stored.
    int row[T][2], tile[T];
#pragma unroll
    for (int i = 0; i < T; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) row[i][h] = min(row0 + 16 * i + g + 8 * h, rows - 1);
#pragma unroll
    for (int i = 0; i < T; i++) tile[i] = max(min(tile0 + i, (rows >> 4) - 1), 0);
    float rs[T][2];
#pragma unroll
    for (int i = 0; i < T; i++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            rs[i][h] = !ROW_SCALE ? 1.0f
                       : PACKED   ? __ldg(S + q_packed_scale(row[i][h], 0, 1))
                                  : __ldg(S + (u64)row[i][h] * row_scales);
    float acc[T][G][4];
#pragma unroll
    for (int i = 0; i < T; i++)
#pragma unroll
        for (int q = 0; q < G; q++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][q][e] = 0.0f;

    uint4 wn[T];
    float sn[T][2];
    uint4 xn[G];
    float4 en[G];
    auto load_w = [&](int s, uint4 (&wv)[T], float (&sv)[T][2]) {
        const int c0 = s * 64 + 16 * t;
#pragma unroll
        for (int i = 0; i < T; i++) {
            if constexpr (PACKED) {
                wv[i] = __ldg((const uint4*)Wt + ((u64)tile[i] * nsteps + s) * 32 + lane);
            } else {
                uint2 a = make_uint2(0x88888888u, 0x88888888u), b = a;
                if (c0 < cols) {
                    a = __ldg((const uint2*)(Wt + (u64)row[i][0] * row_bytes + c0 / 2));
                    b = __ldg((const uint2*)(Wt + (u64)row[i][1] * row_bytes + c0 / 2));
                }
                wv[i] = make_uint4(a.x, a.y, b.x, b.y);
            }
            if (ROW_SCALE) {
                sv[i][0] = rs[i][0];
                sv[i][1] = rs[i][1];
            } else {
                const int j = (int)scale_index((u32)(s * 64), gmagic, gshift);
                if constexpr (PACKED) {
                    const float2 v = __ldg((const float2*)S + ((u64)tile[i] * row_scales + j) * 8 + g);
                    sv[i][0] = v.x;
                    sv[i][1] = v.y;
                } else {
                    sv[i][0] = __ldg(S + (u64)row[i][0] * row_scales + j);
                    sv[i][1] = __ldg(S + (u64)row[i][1] * row_scales + j);
                }
            }
        }
    };
    auto load_x = [&](int s, uint4 (&xv)[G], float4 (&ev)[G]) {
        // L2 loads, not the read-only path: with a dependent launch the digits are written
        // while this grid runs (griddepcontrol.wait makes them visible).
#pragma unroll
        for (int q = 0; q < G; q++) {
            xv[q] = __ldcg(xq + ((u64)s * G + q) * 32 + lane);
            ev[q] = __ldcg(xe + ((u64)s * G + q) * 4 + t);
        }
    };
    if (warp < nsteps) load_w(warp, wn, sn);
    q_wait_primary();
    if (warp < nsteps) load_x(warp, xn, en);
    for (int s = warp; s < nsteps; s += W) {
        uint4 wc[T];
        float sc[T][2];
        uint4 xc[G];
        float4 ec[G];
#pragma unroll
        for (int i = 0; i < T; i++) {
            wc[i] = wn[i];
            sc[i][0] = sn[i][0];
            sc[i][1] = sn[i][1];
        }
#pragma unroll
        for (int q = 0; q < G; q++) {
            xc[q] = xn[q];
            ec[q] = en[q];
        }
        // The next step's loads are in flight during this step's products (two steps ahead
        // measured slower at every shape: more registers, fewer blocks; RESULTS).
        if (s + W < nsteps) {
            load_w(s + W, wn, sn);
            load_x(s + W, xn, en);
        }
#pragma unroll
        for (int i = 0; i < T; i++) {
            // Words .x / .z: rows g / g + 8, columns 16t … +7; .y / .w: 16t + 8 … +15. Even
            // nibbles to A's k slots 4t…4t+3, odd ones to 16 + 4t… (q_split orders B alike).
            const u32 m4 = 0x0f0f0f0fu;
            const u32 a00 = wc[i].x & m4, a02 = (wc[i].x >> 4) & m4;
            const u32 a01 = wc[i].z & m4, a03 = (wc[i].z >> 4) & m4;
            const u32 a10 = wc[i].y & m4, a12 = (wc[i].y >> 4) & m4;
            const u32 a11 = wc[i].w & m4, a13 = (wc[i].w >> 4) & m4;
#pragma unroll
            for (int q = 0; q < G; q++) {
                int p[4] = {0, 0, 0, 0};
                mma_u8s8(p, a00, a01, a02, a03, xc[q].x, xc[q].y);
                mma_u8s8(p, a10, a11, a12, a13, xc[q].z, xc[q].w);
                // D element e: row g (+8 for e ≥ 2), column 2t + (e & 1).
                const float f0 = fmaf((float)p[0], ec[q].x, ec[q].y);
                const float f1 = fmaf((float)p[1], ec[q].z, ec[q].w);
                const float f2 = fmaf((float)p[2], ec[q].x, ec[q].y);
                const float f3 = fmaf((float)p[3], ec[q].z, ec[q].w);
                acc[i][q][0] = fmaf(sc[i][0], f0, acc[i][q][0]);
                acc[i][q][1] = fmaf(sc[i][0], f1, acc[i][q][1]);
                acc[i][q][2] = fmaf(sc[i][1], f2, acc[i][q][2]);
                acc[i][q][3] = fmaf(sc[i][1], f3, acc[i][q][3]);
            }
        }
    }

    // The warps' sums, one row tile at a time, added in warp order by warp 0; then each token's
    // digit columns (odd t holds planes 2, 3 of its token, even t planes 0, 1). `red`: W − 1
    // warps' partial sums (the entry's shared memory, one array for every instance).
    float* Y = (float*)job.y;
#pragma unroll
    for (int i = 0; i < T; i++) {
        if (i > 0) __syncthreads();
        if (warp > 0) {
#pragma unroll
            for (int q = 0; q < G; q++)
#pragma unroll
                for (int e = 0; e < 4; e++) red[warp - 1][q][e][lane] = acc[i][q][e];
        }
        __syncthreads();
        if (warp == 0) {
#pragma unroll
            for (int q = 0; q < G; q++) {
                float v[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    v[e] = acc[i][q][e];
#pragma unroll
                    for (int w = 0; w < W - 1; w++) v[e] += red[w][q][e][lane];
                }
                const float hi0 = __shfl_down_sync(0xffffffffu, v[1] + v[0], 1);
                const float hi1 = __shfl_down_sync(0xffffffffu, v[3] + v[2], 1);
                const int tok = 2 * q + (t >> 1), r = row0 + 16 * i + g;
                if ((t & 1) == 0 && tok < m) {
                    if (r < rows) Y[(u64)tok * rows + r] = (hi0 + v[1]) + v[0];
                    if (r + 8 < rows) Y[(u64)tok * rows + r + 8] = (hi1 + v[3]) + v[2];
                }
            }
        }
    }
}

// `path` bit 1: one scale per row. Job.packed picks the layout per job. Kernel
// gemv_q_t{T}_g{G}_w{W}: W * 32 threads (the kernels gemv.rs `q_kernel` picks).
#define GEMV_Q_ENTRY(T, G, W)                                                                      \
    extern "C" __global__ void __launch_bounds__(W * 32)                                           \
        gemv_q_t##T##_g##G##_w##W(const Job* jobs, int rows, int cols, int m, int row_bytes,       \
                                  int row_scales, u32 gmagic, int gshift, int path) {              \
        __shared__ float red[W - 1][G][4][32];                                                     \
        const Job job = jobs[blockIdx.y];                                                          \
        if (path & 2) {                                                                            \
            if (job.packed) gemv_q<T, G, W, true, true>(job, rows, cols, m, row_bytes, row_scales, gmagic, gshift, red); \
            else gemv_q<T, G, W, true, false>(job, rows, cols, m, row_bytes, row_scales, gmagic, gshift, red); \
        } else {                                                                                   \
            if (job.packed) gemv_q<T, G, W, false, true>(job, rows, cols, m, row_bytes, row_scales, gmagic, gshift, red); \
            else gemv_q<T, G, W, false, false>(job, rows, cols, m, row_bytes, row_scales, gmagic, gshift, red); \
        }                                                                                          \
    }
#define GEMV_Q_GROUPS(T, W) \
    GEMV_Q_ENTRY(T, 1, W) GEMV_Q_ENTRY(T, 2, W) GEMV_Q_ENTRY(T, 3, W) GEMV_Q_ENTRY(T, 4, W)
GEMV_Q_GROUPS(1, 4)
GEMV_Q_GROUPS(2, 4)
GEMV_Q_GROUPS(4, 4)
GEMV_Q_GROUPS(1, 8)
GEMV_Q_GROUPS(4, 8)
GEMV_Q_ENTRY(4, 1, 16)
GEMV_Q_ENTRY(4, 2, 16)
GEMV_Q_ENTRY(2, 3, 16)
GEMV_Q_ENTRY(2, 4, 16)
