// The tensor-core GEMV: y[t] = W · x[t] for M = 1..8 activation rows (tokens), over int8 and
// bf16 weights in their stored bytes (int4 has its own, gemv_q.cu), on mma.sync.m16n8k16 (bf16
// inputs, f32 accumulation) with the weight rows as the MMA's 16 rows and the tokens as its 8 columns — so the cost of a
// launch hardly depends on M up to 8, where the f32 kernels (gemv.cu) pay one FMA per weight
// and token. Compiled by NVRTC after gemv.cu and gemm.cu (Job, FMT_*, scale_index, split_pair,
// mma_bf16 come from there).
//
// Work split. A block of NW warps owns 16·T consecutive weight rows (T MMA row tiles per warp).
// The columns are walked in steps of 64; warp w takes steps w, w + NW, … (split-K inside the
// block), and the warps' sums are added at the end through shared memory. NW follows from the
// matrix's shape alone (gemv.rs `tc_warps`: 16 for at most 1,024 rows of 4,097 to 12,288
// columns, else 4), so it is
// part of a row's order like the steps themselves; more warps give a launch of few long rows
// (kv_a: 576 rows, 36 blocks) the loads in flight it lacks. In a step, lane (g = lane / 4,
// t = lane % 4) reads 16 consecutive values of rows g and g + 8 of each tile, columns 64·s + 16·t … +16 (int8: 16 bytes, bf16: 32), and the 16 activations of
// token g at the same columns (tokens ≥ M read as zero). The values go to the MMA's k slots so
// that A (weights) and B (activations) agree: k-step j (0..3) takes values 4j, 4j+1 (slots 2t,
// 2t+1) and 4j+2, 4j+3 (slots 2t+8, 2t+9).
//
// Precision: int8 codes and bf16 weights are exact in bf16; activations are split into
// three bf16 parts x = x0 + x1 + x2 (gemm.cu's split_pair, exact to ~2^-24·|x|); the products
// w·x_i are exact and the tensor core adds them in f32 (aligned to the largest addend).
//
// Accumulation order, for output (row r, token t): each warp w keeps acc_w = 0 and, over its
// steps s = w, w + NW, … in increasing order and each step's 16-column k-steps j = 0..3 in
// order (gemm.cu's order per k-step): p = 0; p = mma(w, x2, p); p = mma(w, x1, p);
// p = mma(w, x0, p); acc_w = fma(scale, p, acc_w) (bf16: acc_w += p); then
// y = ((acc_0 + acc_1) + …) + acc_{NW-1}. (mma adds its 16 products to p inside the tensor core,
// aligned to the largest addend; starting each k-step from 0 keeps that error relative to the
// k-step's own terms.) An output depends only on its row, its token's activations, the column
// count and that order — not on M, T, the grid or the other matrices of the launch. Summing each 64-column step in one p (one scale multiply per step) was measured no
// faster (2026-12-02) and is not kept.

#define TC_STEP 64

// u32 words per lane, row and step (16 values).
template <int F> struct TcRaw;
template <> struct TcRaw<FMT_I8> { enum { N = 4 }; };
template <> struct TcRaw<FMT_BF16> { enum { N = 8 }; };

// The 16 values of `row` from column c0 (a multiple of 16); past the end (cols is a multiple of
// 16 here) the code of zero / +0.0.
template <int F>
__device__ __forceinline__ void tc_load_w(const u8* row, int c0, int cols,
                                          u32 (&raw)[TcRaw<F>::N]) {
    constexpr int N = TcRaw<F>::N;
    if (c0 < cols) {
        const u8* p = row + (u64)c0 * (N * 4) / 16;
        if constexpr (N == 2) {
            const uint2 v = __ldg((const uint2*)p);
            raw[0] = v.x;
            raw[1] = v.y;
        } else {
#pragma unroll
            for (int i = 0; i < N / 4; i++) {
                const uint4 v = __ldg((const uint4*)p + i);
                raw[4 * i] = v.x;
                raw[4 * i + 1] = v.y;
                raw[4 * i + 2] = v.z;
                raw[4 * i + 3] = v.w;
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; i++) raw[i] = 0u;
    }
}

// A-fragment words of one row: lo[j] for slots 2t, 2t+1 of k-step j, hi[j] for 2t+8, 2t+9.
template <int F>
__device__ __forceinline__ void tc_decode(const u32 (&raw)[TcRaw<F>::N], u32 (&lo)[4],
                                          u32 (&hi)[4]) {
    if constexpr (F == FMT_I8) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float c[4];
            word_codes_i8(raw[j], c);
            // Exact small integers: an f32's top half is its bf16.
            lo[j] = __byte_perm(__float_as_uint(c[0]), __float_as_uint(c[1]), 0x7632);
            hi[j] = __byte_perm(__float_as_uint(c[2]), __float_as_uint(c[3]), 0x7632);
        }
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            lo[j] = raw[2 * j];
            hi[j] = raw[2 * j + 1];
        }
    }
}

// B-fragment words of the lane's token: b[part][j][0] for slots 2t, 2t+1 of k-step j, [1] for
// 2t+8, 2t+9 — the same columns as tc_decode's lo / hi.
template <int F>
__device__ __forceinline__ void tc_split_x(const float (&x)[16], u32 (&b)[3][4][2]) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int l0 = 4 * j, l1 = 4 * j + 1, h0 = 4 * j + 2, h1 = 4 * j + 3;
        u32 lo[3], hi[3];
        split_pair<3>(x[l0], x[l1], lo);
        split_pair<3>(x[h0], x[h1], hi);
#pragma unroll
        for (int p = 0; p < 3; p++) {
            b[p][j][0] = lo[p];
            b[p][j][1] = hi[p];
        }
    }
}

template <int F, int T, int NW, bool ROW_SCALE>
__device__ __forceinline__ void gemv_tc(const Job& job, int rows, int cols, int m, int row_bytes,
                                        int row_scales, u32 gmagic, int gshift) {
    constexpr int N = TcRaw<F>::N;
    constexpr bool CODES = F != FMT_BF16;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16 * T;
    const u8* W = (const u8*)job.w;
    const float* S = (const float*)job.s;
    const float* X = (const float*)job.x;
    const u8* wrow[T][2];
    const float* srow[T][2];
#pragma unroll
    for (int i = 0; i < T; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            // Rows past the end re-read the last row (its bytes exist) and are never stored.
            const int r = min(row0 + 16 * i + g + 8 * h, rows - 1);
            wrow[i][h] = W + (u64)r * row_bytes;
            srow[i][h] = S + (u64)r * row_scales;
        }
    const bool has_x = g < m;
    const float* xrow = X + (u64)(has_x ? g : 0) * cols + 16 * t;
    const int nsteps = (cols + TC_STEP - 1) / TC_STEP;

    float acc[T][4];
#pragma unroll
    for (int i = 0; i < T; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[i][e] = 0.0f;
    float rs[T][2];
#pragma unroll
    for (int i = 0; i < T; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) rs[i][h] = CODES && ROW_SCALE ? __ldg(srow[i][h]) : 1.0f;

    u32 wn[T][2][N];
    float xn[16];
    float sn[T][2];
    auto load = [&](int s) {
        const int c0 = s * TC_STEP + 16 * t;
#pragma unroll
        for (int i = 0; i < T; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                tc_load_w<F>(wrow[i][h], c0, cols, wn[i][h]);
                if (CODES && !ROW_SCALE)
                    sn[i][h] = __ldg(srow[i][h] + scale_index(s * TC_STEP, gmagic, gshift));
                else
                    sn[i][h] = rs[i][h];
            }
        if (has_x && c0 < cols) {
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const float4 v = __ldg((const float4*)(xrow + s * TC_STEP) + q);
                xn[4 * q] = v.x;
                xn[4 * q + 1] = v.y;
                xn[4 * q + 2] = v.z;
                xn[4 * q + 3] = v.w;
            }
        } else {
#pragma unroll
            for (int q = 0; q < 16; q++) xn[q] = 0.0f;
        }
    };

    if (warp < nsteps) load(warp);
    for (int s = warp; s < nsteps; s += NW) {
        u32 wc[T][2][N];
        float xc[16];
        float sc[T][2];
#pragma unroll
        for (int i = 0; i < T; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                sc[i][h] = sn[i][h];
#pragma unroll
                for (int k = 0; k < N; k++) wc[i][h][k] = wn[i][h][k];
            }
#pragma unroll
        for (int q = 0; q < 16; q++) xc[q] = xn[q];
        // The next step's loads are in flight during this step's products.
        if (s + NW < nsteps) load(s + NW);

        u32 b[3][4][2];
        tc_split_x<F>(xc, b);
#pragma unroll
        for (int i = 0; i < T; i++) {
            u32 lo0[4], hi0[4], lo1[4], hi1[4];
            tc_decode<F>(wc[i][0], lo0, hi0);
            tc_decode<F>(wc[i][1], lo1, hi1);
            {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const u32 a[4] = {lo0[j], lo1[j], hi0[j], hi1[j]};
                    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int part = 2; part >= 0; part--) mma_bf16(p, a, b[part][j][0], b[part][j][1]);
                    if (CODES) {
                        acc[i][0] = fmaf(sc[i][0], p[0], acc[i][0]);
                        acc[i][1] = fmaf(sc[i][0], p[1], acc[i][1]);
                        acc[i][2] = fmaf(sc[i][1], p[2], acc[i][2]);
                        acc[i][3] = fmaf(sc[i][1], p[3], acc[i][3]);
                    } else {
#pragma unroll
                        for (int e = 0; e < 4; e++) acc[i][e] += p[e];
                    }
                }
            }
        }
    }

    // The warps' sums, added in warp order by warp 0.
    __shared__ float red[NW - 1][T][4][32];
    if (warp > 0) {
#pragma unroll
        for (int i = 0; i < T; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) red[warp - 1][i][e][lane] = acc[i][e];
    }
    __syncthreads();
    if (warp == 0) {
        float* Y = (float*)job.y;
#pragma unroll
        for (int i = 0; i < T; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = acc[i][e];
#pragma unroll
                for (int w = 0; w < NW - 1; w++) v += red[w][i][e][lane];
                // D fragment: element e is row g (+8 for e >= 2), token 2t (+1 for odd e).
                const int r = row0 + 16 * i + g + (e >= 2 ? 8 : 0);
                const int tok = 2 * t + (e & 1);
                if (r < rows && tok < m) Y[(u64)tok * rows + r] = v;
            }
    }
}

// `path` bit 1: one scale per row (int8).
#define GEMV_TC_ENTRY(NAME, F, T, NW)                                                             \
    extern "C" __global__ void __launch_bounds__(NW * 32)                                         \
        NAME(const Job* jobs, int rows, int cols, int m, int row_bytes, int row_scales,           \
             u32 gmagic, int gshift, int path) {                                                  \
        const Job job = jobs[blockIdx.y];                                                         \
        if (path & 2)                                                                             \
            gemv_tc<F, T, NW, true>(job, rows, cols, m, row_bytes, row_scales, gmagic, gshift);    \
        else                                                                                      \
            gemv_tc<F, T, NW, false>(job, rows, cols, m, row_bytes, row_scales, gmagic, gshift);   \
    }

// `_t4`: four row tiles per warp (launches of many rows: each activation split serves 64 rows);
// `_t1`: one (launches of few rows, which need the blocks). T changes which warp computes a
// row, never a row's order: both give identical results (`_t2`: the sixteen-warp kernel's, whose
// sums of four tiles would outgrow a block's static shared memory). `_w4` / `_w16`:
// warps per block.
GEMV_TC_ENTRY(gemv_tc_i8_t1_w4, FMT_I8, 1, 4)
GEMV_TC_ENTRY(gemv_tc_i8_t4_w4, FMT_I8, 4, 4)
GEMV_TC_ENTRY(gemv_tc_bf16_t1_w4, FMT_BF16, 1, 4)
GEMV_TC_ENTRY(gemv_tc_bf16_t4_w4, FMT_BF16, 4, 4)
GEMV_TC_ENTRY(gemv_tc_i8_t1_w16, FMT_I8, 1, 16)
GEMV_TC_ENTRY(gemv_tc_i8_t2_w16, FMT_I8, 2, 16)
GEMV_TC_ENTRY(gemv_tc_bf16_t1_w16, FMT_BF16, 1, 16)
GEMV_TC_ENTRY(gemv_tc_bf16_t2_w16, FMT_BF16, 2, 16)
