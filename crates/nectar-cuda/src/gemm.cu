// Nectar's tensor-core GEMM for prefill and batched verify: y[t] = W · x[t] for M activation
// rows (tokens) at once, over weights in their stored format. Compiled by NVRTC together with
// gemv.cu (appended to it: Job, FMT_*, f16_to_f32 and scale_index come from there).
//
// Each block computes a tile of 128 weight rows × 64 tokens. Per step of 32 columns it reads the
// weight tile in its stored bytes, dequantises it to bf16 in shared memory, converts the f32
// activations to bf16 in shared memory, and multiplies the two on the tensor cores
// (mma.sync.m16n8k16, bf16 inputs, f32 accumulation): 8 warps, each 32 weight rows × 32 tokens.
// The next step's global loads are issued before the current step's products (register
// staging), so their latency hides behind the tensor-core work.
//
// Precision. bf16 keeps 8 significant bits, so nothing is rounded to bf16 alone (that costs
// ~1e-3 relative per product, ten times the model's parity bar). Values are split into bf16
// parts instead, v = v0 + v1 + v2 with v0 = RN(v), v1 = RN(v - v0), v2 = RN(v - v0 - v1) (each
// difference exact in f32), which keeps a value to about 2^-24 of itself:
//   - activations: XP parts (3 for the model; the `_x2` / `_x1` kernels keep 2 or 1, measured
//     for speed and error, not used by the model);
//   - weights: int8 / int4 codes are exact in bf16 (one part) and their f32 scale is applied per
//     16-column step; bf16 weights are exact; f16 weights are exact in 2 parts; f32 weights, and
//     int4 groups that split a 16-column step (dequantised first to the CPU's f32 code × scale),
//     take 3 parts.
//   The products of weight part i and activation part j with i + j <= 2 are taken (terms below
//   2^-24 of |w·x| are dropped): 3 tensor-core products per step for codes and bf16, 5 for f16,
//   6 for f32.
//
// Accumulation order, for each output (weight row r, token t), over 16-column steps k in
// increasing order: p = 0; for s = 2, 1, 0: for i = 0, 1, …: p = mma(w_i, x_(s-i), p) (the
// small terms first); then acc = fma(scale(r, k), p, acc) for codes, acc = acc + p otherwise.
// mma adds 16 products to its f32 input inside the tensor core, which aligns and truncates
// them to the largest: starting each step from 0 keeps that error relative to the step's own
// terms, not to the running sum (adding into the running sum measured eight times the error
// on bf16 weights: 9.3e-7 against 1.2e-7 of Σ|w·x|).
// An output depends only on its own row, token and the column order — not on M, the tile it
// lands in, or the other matrices of the launch — so a token's result is the same whatever M
// (tested bit for bit). It is not the GEMV kernels' order: parity with the CPU is by tolerance.

#define GEMM_BW 128      // weight rows per block
#define GEMM_BX 64       // tokens per block
#define GEMM_BK 32       // columns per step
#define GEMM_LD 20       // u32 per shared-memory row: 16 bf16 pairs + 4 padding (no bank conflicts)
#define GEMM_THREADS 256

// Raw 32-bit words holding 16 consecutive weights of format F.
template <int F> struct Raw;
template <> struct Raw<FMT_F32> { enum { N = 16 }; };
template <> struct Raw<FMT_BF16> { enum { N = 8 }; };
template <> struct Raw<FMT_F16> { enum { N = 8 }; };
template <> struct Raw<FMT_I8> { enum { N = 4 }; };
template <> struct Raw<FMT_I4> { enum { N = 2 }; };

// Two f32 → one bf16x2 word (round to nearest even): lo in the low half.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Splits a pair (a: even column, b: odd column) into N bf16x2 parts, largest first.
template <int N>
__device__ __forceinline__ void split_pair(float a, float b, u32 (&out)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) {
        out[i] = pack_bf16x2(a, b);
        a -= __uint_as_float(out[i] << 16);
        b -= __uint_as_float(out[i] & 0xffff0000u);
    }
}

// The 16 weights of row `row` starting at column k0 into raw words, element by element; columns
// at or past `cols` read as zero (int4: the stored +8 code of zero).
template <int F>
__device__ __forceinline__ void load_raw_slow(const u8* row, int k0, int cols,
                                              u32 (&raw)[Raw<F>::N]) {
#pragma unroll
    for (int i = 0; i < Raw<F>::N; i++) raw[i] = 0;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const int k = k0 + j;
        const bool ok = k < cols;
        if constexpr (F == FMT_F32) {
            if (ok) {
                const u8* p = row + 4 * k;
                raw[j] = (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
            }
        } else if constexpr (F == FMT_BF16 || F == FMT_F16) {
            if (ok) {
                const u8* p = row + 2 * k;
                raw[j >> 1] |= ((u32)p[0] | ((u32)p[1] << 8)) << (16 * (j & 1));
            }
        } else if constexpr (F == FMT_I8) {
            if (ok) raw[j >> 2] |= (u32)row[k] << (8 * (j & 3));
        } else {
            const u32 nib = ok ? ((u32)row[k >> 1] >> (4 * (k & 1))) & 0xfu : 8u;
            raw[j >> 3] |= nib << (4 * (j & 7));
        }
    }
}

// The same 16 weights by one vector load (row 16-byte aligned, k0 a multiple of 16, all in range).
template <int F>
__device__ __forceinline__ void load_raw_vec(const u8* row, int k0, u32 (&raw)[Raw<F>::N]) {
    constexpr int bytes = Raw<F>::N * 4;
    const u8* p = row + (k0 / 16) * bytes;
    if constexpr (bytes == 8) {
        const uint2 v = __ldg((const uint2*)p);
        raw[0] = v.x;
        raw[1] = v.y;
    } else {
#pragma unroll
        for (int i = 0; i < bytes / 16; i++) {
            const uint4 v = __ldg((const uint4*)p + i);
            raw[4 * i] = v.x;
            raw[4 * i + 1] = v.y;
            raw[4 * i + 2] = v.z;
            raw[4 * i + 3] = v.w;
        }
    }
}

// Weight j (0..15) of the raw words as a float (before any scale): the value for float
// formats, the signed code for int8 / int4 (exact small integers).
template <int F> __device__ __forceinline__ float raw_value(const u32 (&raw)[Raw<F>::N], int j) {
    if constexpr (F == FMT_F32) return __uint_as_float(raw[j]);
    else if constexpr (F == FMT_BF16) return __uint_as_float((raw[j >> 1] >> (16 * (j & 1))) << 16);
    else if constexpr (F == FMT_F16) return f16_to_f32((u16)(raw[j >> 1] >> (16 * (j & 1))));
    else if constexpr (F == FMT_I8)
        return __uint_as_float(0x4b000000u | (((raw[j >> 2] ^ 0x80808080u) >> (8 * (j & 3))) & 0xffu)) -
               8388736.0f;
    else return __uint_as_float(0x4b000000u | ((raw[j >> 3] >> (4 * (j & 7))) & 0xfu)) - 8388616.0f;
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// CODES: integer codes in one exact bf16 part, scale per 16-column step. WP, XP: bf16 parts of
// the weights and of the activations.
template <int F, bool CODES, int WP, int XP>
__device__ __forceinline__ void gemm_tile(const Job& job, int rows, int cols, int m,
                                          int row_bytes, int row_scales, u32 gmagic, int gshift,
                                          int vec) {
    constexpr int RN = Raw<F>::N;
    __shared__ __align__(16) u32 sW[WP][GEMM_BW][GEMM_LD];
    __shared__ __align__(16) u32 sX[XP][GEMM_BX][GEMM_LD];
    __shared__ float sS[CODES ? GEMM_BW : 1][2];

    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tig = lane & 3;
    const int row_base = blockIdx.x * GEMM_BW;
    const int tok_base = blockIdx.y * GEMM_BX;
    const u8* W = (const u8*)job.w;
    const float* S = (const float*)job.s;
    const float* X = (const float*)job.x;
    float* Y = (float*)job.y;

    // Loader roles: weight row lr, columns 16·lh … +16 of the step; token lt, columns 8·lq … +8.
    const int lr = tid >> 1, lh = tid & 1;
    const int lt = tid >> 2, lq = tid & 3;
    const int wrow = min(row_base + lr, rows - 1);  // past the end: re-read the last row
    const int xtok = min(tok_base + lt, m - 1);     // (never stored)
    const u8* wrow_p = W + (u64)wrow * row_bytes;
    const float* srow_p = S + (u64)wrow * row_scales;
    const float* xrow_p = X + (u64)xtok * cols;
    const bool wvec = (vec & 1) != 0, xvec = (vec & 2) != 0;
    const bool packed = job.packed != 0;

    u32 raw[RN];
    float xv[8];
    float sc = 0.0f;
    auto load = [&](int kt) {
        const int k0 = kt + 16 * lh;
        bool stored = true;
        if constexpr (F == FMT_I4) {
            if (packed && k0 < cols) {
                // Packed int4 (gemv_q.cu): cols % 64 == 0, so a piece is whole or past the end
                // (where the stored path below reads nothing).
                const uint2 v = __ldg((const uint2*)(W + q_packed_byte(wrow, k0, cols)));
                raw[0] = v.x;
                raw[1] = v.y;
                sc = __ldg(S + q_packed_scale(wrow, scale_index(k0, gmagic, gshift), row_scales));
                stored = false;
            }
        }
        if (stored) {
            if (wvec && k0 + 16 <= cols)
                load_raw_vec<F>(wrow_p, k0, raw);
            else
                load_raw_slow<F>(wrow_p, k0, cols, raw);
            if (CODES) sc = k0 < cols ? __ldg(srow_p + scale_index(k0, gmagic, gshift)) : 0.0f;
        }
        const int c0 = kt + 8 * lq;
        if (xvec && c0 + 8 <= cols) {
            const float4 a = __ldg((const float4*)(xrow_p + c0));
            const float4 b = __ldg((const float4*)(xrow_p + c0) + 1);
            xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
            xv[4] = b.x; xv[5] = b.y; xv[6] = b.z; xv[7] = b.w;
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) xv[j] = c0 + j < cols ? __ldg(xrow_p + c0 + j) : 0.0f;
        }
    };
    auto store = [&](int kt) {
        u32 w[8][WP];
#pragma unroll
        for (int p = 0; p < 8; p++) {
            if constexpr (F == FMT_BF16 && WP == 1) {
                w[p][0] = raw[p];
            } else if constexpr (CODES) {
                // Exact small integers: the f32's top half is the bf16.
                w[p][0] = (__float_as_uint(raw_value<F>(raw, 2 * p)) >> 16) |
                          (__float_as_uint(raw_value<F>(raw, 2 * p + 1)) & 0xffff0000u);
            } else {
                float a = raw_value<F>(raw, 2 * p), b = raw_value<F>(raw, 2 * p + 1);
                if (IsQuant<F>::V) {
                    // Odd groups: the CPU's dequantised value, code × scale in f32.
                    const int k = kt + 16 * lh + 2 * p;
                    a = k < cols ? __fmul_rn(a, __ldg(srow_p + scale_index(k, gmagic, gshift))) : 0.0f;
                    b = k + 1 < cols ? __fmul_rn(b, __ldg(srow_p + scale_index(k + 1, gmagic, gshift)))
                                     : 0.0f;
                }
                split_pair<WP>(a, b, w[p]);
            }
        }
#pragma unroll
        for (int q = 0; q < WP; q++) {
            uint4* dst = (uint4*)&sW[q][lr][8 * lh];
            dst[0] = make_uint4(w[0][q], w[1][q], w[2][q], w[3][q]);
            dst[1] = make_uint4(w[4][q], w[5][q], w[6][q], w[7][q]);
        }
        if constexpr (CODES) sS[lr][lh] = sc;
        u32 x[4][XP];
#pragma unroll
        for (int p = 0; p < 4; p++) split_pair<XP>(xv[2 * p], xv[2 * p + 1], x[p]);
#pragma unroll
        for (int q = 0; q < XP; q++)
            *(uint4*)&sX[q][lt][4 * lq] = make_uint4(x[0][q], x[1][q], x[2][q], x[3][q]);
    };

    // Warp tile: weight rows wm·32 … +32 (two m16 tiles), tokens wn·32 … +32 (four n8 tiles).
    const int wm = warp & 3, wn = warp >> 2;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    load(0);
    for (int kt = 0; kt < cols; kt += GEMM_BK) {
        __syncthreads();  // the previous step's products are done with shared memory
        store(kt);
        __syncthreads();
        if (kt + GEMM_BK < cols) load(kt + GEMM_BK);  // in flight during the products below
#pragma unroll 1
        for (int ks = 0; ks < 2; ks++) {
            const int kp = ks * 8;  // bf16-pair offset of this 16-column step
            u32 a[WP][2][4];
#pragma unroll
            for (int p = 0; p < WP; p++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int r = wm * 32 + i * 16 + g;
                    a[p][i][0] = sW[p][r][kp + tig];
                    a[p][i][1] = sW[p][r + 8][kp + tig];
                    a[p][i][2] = sW[p][r][kp + tig + 4];
                    a[p][i][3] = sW[p][r + 8][kp + tig + 4];
                }
            u32 b[XP][4][2];
#pragma unroll
            for (int q = 0; q < XP; q++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int t = wn * 32 + j * 8 + g;
                    b[q][j][0] = sX[q][t][kp + tig];
                    b[q][j][1] = sX[q][t][kp + tig + 4];
                }
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float s0 = 0.0f, s1 = 0.0f;
                if constexpr (CODES) {
                    s0 = sS[wm * 32 + i * 16 + g][ks];
                    s1 = sS[wm * 32 + i * 16 + g + 8][ks];
                }
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int o = 2; o >= 0; o--)
#pragma unroll
                        for (int wi = 0; wi < WP; wi++) {
                            const int xi = o - wi;
                            if (xi >= 0 && xi < XP) mma_bf16(p, a[wi][i], b[xi][j][0], b[xi][j][1]);
                        }
                    if (CODES) {
                        acc[i][j][0] = fmaf(s0, p[0], acc[i][j][0]);
                        acc[i][j][1] = fmaf(s0, p[1], acc[i][j][1]);
                        acc[i][j][2] = fmaf(s1, p[2], acc[i][j][2]);
                        acc[i][j][3] = fmaf(s1, p[3], acc[i][j][3]);
                    } else {
#pragma unroll
                        for (int e = 0; e < 4; e++) acc[i][j][e] += p[e];
                    }
                }
            }
        }
    }

    // D fragment: element e of tile (i, j) is weight row g (+8 for e >= 2), token 2·tig (+1 for
    // odd e). y is tokens × rows.
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = row_base + wm * 32 + i * 16 + g + (e >= 2 ? 8 : 0);
                const int t = tok_base + wn * 32 + j * 8 + 2 * tig + (e & 1);
                if (r < rows && t < m) Y[(u64)t * rows + r] = acc[i][j][e];
            }
}

#define GEMM_ENTRY(NAME, F, CODES, WP, XP)                                                        \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 2)                                 \
        NAME(const Job* jobs, int rows, int cols, int m, int row_bytes, int row_scales,           \
             u32 gmagic, int gshift, int vec) {                                                   \
        const Job job = jobs[blockIdx.z];                                                         \
        gemm_tile<F, CODES, WP, XP>(job, rows, cols, m, row_bytes, row_scales, gmagic, gshift,    \
                                    vec);                                                         \
    }

// What the model uses: activations in 3 parts.
GEMM_ENTRY(gemm_f32, FMT_F32, false, 3, 3)
GEMM_ENTRY(gemm_f16, FMT_F16, false, 2, 3)
GEMM_ENTRY(gemm_bf16, FMT_BF16, false, 1, 3)
GEMM_ENTRY(gemm_i8, FMT_I8, true, 1, 3)
GEMM_ENTRY(gemm_i4, FMT_I4, true, 1, 3)
GEMM_ENTRY(gemm_i4_deq, FMT_I4, false, 3, 3)
// Measured only: activations in 2 parts, or rounded to one bf16.
GEMM_ENTRY(gemm_bf16_x2, FMT_BF16, false, 1, 2)
GEMM_ENTRY(gemm_i8_x2, FMT_I8, true, 1, 2)
GEMM_ENTRY(gemm_i4_x2, FMT_I4, true, 1, 2)
GEMM_ENTRY(gemm_bf16_x1, FMT_BF16, false, 1, 1)
GEMM_ENTRY(gemm_i8_x1, FMT_I8, true, 1, 1)
GEMM_ENTRY(gemm_i4_x1, FMT_I4, true, 1, 1)
