// Nectar's GEMV kernels: y[i] = W · x[i] for M = 1..8 activation rows, over weights in their
// stored format (nectar_kernels::WeightFormat), compiled at run time by NVRTC (gemv.rs).
//
// Layout (the one nectar-kernels defines; gemv.rs passes the per-format numbers):
//   W: rows × row_bytes bytes, row-major. f32 / bf16 / f16 little-endian; int8 two's complement;
//      int4 two codes per byte, even column in the low nibble, stored +8.
//   S: rows × row_scales f32 (int8 / int4 only); column c of row r uses S[r*row_scales + c/group]
//      (per-row formats: group = cols, so the index is 0).
//   x: M × cols f32, y: M × rows f32, row-major.
//
// Work split: one warp owns R consecutive output rows; `path` bit 0 selects the vector path
// (row_bytes % 16 == 0, aligned pointers), else the scalar path (any layout): lane L takes the
// columns L, L+32, … one byte-addressed weight at a time.
//   Float formats, vector path (the chunk path): lane L reads the 16-byte chunks L, L+32, … of
//   each of its rows, so a warp streams 512 contiguous bytes per row per step.
//   int8 / int4, vector path (the word path, `gemv_words`): lane L reads the 32-bit words L,
//   L+32, … of each row (U words per row in flight), so its activations sit next to lane L+1's;
//   `path` bit 1: one scale per row.
//
// Accumulation order (what makes results reproducible, not equal to the CPU's): each lane keeps
// one f32 accumulator per (row, activation row) and adds the weights it owns (its chunks or its
// words, as above) in increasing column order with fused multiply-adds; the 32 lane sums are
// then combined by a butterfly (xor 16, 8, 4, 2, 1). A row's result therefore depends only on its
// own bytes and x — not on M, R, U, the grid, or which other matrices share the launch.
//   exact: each weight is dequantised exactly as the CPU does (w = code * scale, rounded to f32),
//          then fma(w, x, acc).
//   word:  the codes of one 32-bit word (8 int4 / 4 int8 codes, which always share a scale) are
//          summed as fma(code, x, p) from p = 0, then acc = fma(scale, p, acc): one multiply per
//          word instead of per weight, and a different rounding of the same sum.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// One matrix of a launch (blockIdx.y): device addresses of W, S, x and y, and W's layout:
// packed != 0 only for int4 matrices in gemv_q.cu's packed layout, which only gemv_q and the
// GEMM read (gemv.rs never gives such a job to the kernels of this file).
struct Job {
    u64 w;
    u64 s;
    u64 x;
    u64 y;
    u64 packed;
};

// gemv_q.cu's packed int4 layout (described there): the byte offset of row r's 8 bytes of
// columns c … c + 15 (c % 16 == 0), and the index of row r's scale j.
__device__ __forceinline__ u64 q_packed_byte(int r, int c, int cols) {
    return (((u64)(r >> 4) * (cols >> 6) + (c >> 6)) * 32 + (r & 7) * 4 + ((c >> 4) & 3)) * 16 +
           ((r >> 3) & 1) * 8;
}
__device__ __forceinline__ u64 q_packed_scale(int r, int j, int row_scales) {
    return (((u64)(r >> 4) * row_scales + j) * 8 + (r & 7)) * 2 + ((r >> 3) & 1);
}

#define FMT_F32 0
#define FMT_BF16 1
#define FMT_F16 2
#define FMT_I8 3
#define FMT_I4 4

// Weights per 32-bit word of each format.
template <int F> struct Wpw;
template <> struct Wpw<FMT_F32> { enum { N = 1 }; };
template <> struct Wpw<FMT_BF16> { enum { N = 2 }; };
template <> struct Wpw<FMT_F16> { enum { N = 2 }; };
template <> struct Wpw<FMT_I8> { enum { N = 4 }; };
template <> struct Wpw<FMT_I4> { enum { N = 8 }; };

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// The stored values of one 32-bit word of a float format.
template <int F> __device__ __forceinline__ void word_values(u32 v, float (&out)[Wpw<F>::N]);

template <> __device__ __forceinline__ void word_values<FMT_F32>(u32 v, float (&out)[1]) {
    out[0] = __uint_as_float(v);
}
template <> __device__ __forceinline__ void word_values<FMT_BF16>(u32 v, float (&out)[2]) {
    out[0] = __uint_as_float(v << 16);
    out[1] = __uint_as_float(v & 0xffff0000u);
}
template <> __device__ __forceinline__ void word_values<FMT_F16>(u32 v, float (&out)[2]) {
    out[0] = f16_to_f32((u16)(v & 0xffffu));
    out[1] = f16_to_f32((u16)(v >> 16));
}
template <int F> struct IsQuant { enum { V = (F == FMT_I8 || F == FMT_I4) }; };

// Column -> scale index, c / group, by the multiply-shift gemv.rs computes (exact for c < 2^31).
__device__ __forceinline__ int scale_index(u32 c, u32 gmagic, int gshift) {
    return (int)((__umulhi(c, gmagic) + c) >> gshift);
}

// Loads N consecutive activations starting at p (p is N*4-byte aligned on the vector path).
template <int N> __device__ __forceinline__ void load_x(const float* p, float (&out)[N]);
template <> __device__ __forceinline__ void load_x<1>(const float* p, float (&out)[1]) {
    out[0] = __ldg(p);
}
template <> __device__ __forceinline__ void load_x<2>(const float* p, float (&out)[2]) {
    const float2 a = __ldg((const float2*)p);
    out[0] = a.x;
    out[1] = a.y;
}
template <> __device__ __forceinline__ void load_x<4>(const float* p, float (&out)[4]) {
    const float4 a = __ldg((const float4*)p);
    out[0] = a.x;
    out[1] = a.y;
    out[2] = a.z;
    out[3] = a.w;
}
template <> __device__ __forceinline__ void load_x<8>(const float* p, float (&out)[8]) {
    const float4 a = __ldg((const float4*)p);
    const float4 b = __ldg((const float4*)p + 1);
    out[0] = a.x;
    out[1] = a.y;
    out[2] = a.z;
    out[3] = a.w;
    out[4] = b.x;
    out[5] = b.y;
    out[6] = b.z;
    out[7] = b.w;
}

// Adds one word of R rows (values v[r]) of a float format against the activations xs into acc.
template <int F, int M, int R>
__device__ __forceinline__ void accumulate_word(const u32 (&v)[R], const float (&xs)[M][Wpw<F>::N],
                                                float (&acc)[R][M]) {
    constexpr int N = Wpw<F>::N;
#pragma unroll
    for (int r = 0; r < R; r++) {
        float w[N];
        word_values<F>(v[r], w);
#pragma unroll
        for (int m = 0; m < M; m++) {
#pragma unroll
            for (int j = 0; j < N; j++) acc[r][m] = fmaf(w[j], xs[m][j], acc[r][m]);
        }
    }
}

template <int M, int R>
__device__ __forceinline__ void reduce_store(float (&acc)[R][M], const Job& job, int row0,
                                             int rows) {
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
        for (int m = 0; m < M; m++) {
            float a = acc[r][m];
            a += __shfl_xor_sync(0xffffffffu, a, 16);
            a += __shfl_xor_sync(0xffffffffu, a, 8);
            a += __shfl_xor_sync(0xffffffffu, a, 4);
            a += __shfl_xor_sync(0xffffffffu, a, 2);
            a += __shfl_xor_sync(0xffffffffu, a, 1);
            acc[r][m] = a;
        }
    }
    const int lane = threadIdx.x & 31;
    float* Y = (float*)job.y;
    // Spread the R*M stores over lanes (every lane holds every sum after the butterfly).
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
        for (int m = 0; m < M; m++) {
            if (lane == (r * M + m) % 32 && row0 + r < rows)
                Y[(u64)m * rows + row0 + r] = acc[r][m];
        }
    }
}

// Chunk path (float formats on the vector layout).
template <int F, int M, int R>
__device__ __forceinline__ void gemv_vec(const Job& job, int rows, int cols, int row_bytes) {
    constexpr int N = Wpw<F>::N;
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
    if (row0 >= rows) return;
    const u8* W = (const u8*)job.w;
    const float* X = (const float*)job.x;
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++) acc[r][m] = 0.0f;
    // Rows past the end re-read the last row (its bytes exist) and are never stored.
    const uint4* wrow[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int rr = min(row0 + r, rows - 1);
        wrow[r] = (const uint4*)(W + (u64)rr * row_bytes);
    }
    const int nchunks = row_bytes >> 4;
    for (int k = lane; k < nchunks; k += 32) {
        uint4 q[R];
#pragma unroll
        for (int r = 0; r < R; r++) q[r] = __ldg(wrow[r] + k);
#pragma unroll
        for (int word = 0; word < 4; word++) {
            const int c = k * 4 * N + word * N;
            u32 v[R];
#pragma unroll
            for (int r = 0; r < R; r++)
                v[r] = word == 0 ? q[r].x : word == 1 ? q[r].y : word == 2 ? q[r].z : q[r].w;
            float xs[M][N];
#pragma unroll
            for (int m = 0; m < M; m++) load_x<N>(X + (u64)m * cols + c, xs[m]);
            accumulate_word<F, M, R>(v, xs, acc);
        }
    }
    reduce_store<M, R>(acc, job, row0, rows);
}

// Word path (int8 / int4 on the vector layout): lane L owns the 32-bit words L, L+32, L+64, …
// of each of its R rows, U words per row in flight per step. A warp's weight load is then 128
// contiguous bytes per row, and its activation loads are contiguous too (lane L needs the 8
// (int4) or 4 (int8) activations of its word, next to lane L+1's): the 16-byte-chunk mapping
// above made each lane need 128 bytes of x 128 bytes from its neighbour's, so every activation
// load touched 32 cache lines and the L1, not HBM, was the limit.
//
// Codes are decoded with one logic op each: int4 code j of a word is masked in place and given
// the exponent 2^(23-4j), so the float is 2^(23-4j) + (code + 8) exactly and one subtraction
// leaves the signed code (codes 5..7 after one shift of the word by 12); int8 bytes are moved
// into a 2^23 float by one byte permute. Exact order: w = code * scale (the CPU's value), then
// one FMA per activation row; word order as above.
__device__ __forceinline__ void word_codes_i4(u32 v, float (&c)[8]) {
    const u32 u = v >> 12;
    c[0] = __uint_as_float((v & 0xfu) | 0x4b000000u) - 8388616.0f;  // 2^23 + 8
    c[1] = __uint_as_float((v & 0xf0u) | 0x49000000u) - 524296.0f;  // 2^19 + 8
    c[2] = __uint_as_float((v & 0xf00u) | 0x47000000u) - 32776.0f;  // 2^15 + 8
    c[3] = __uint_as_float((v & 0xf000u) | 0x45000000u) - 2056.0f;  // 2^11 + 8
    c[4] = __uint_as_float((v & 0xf0000u) | 0x43000000u) - 136.0f;  // 2^7 + 8
    c[5] = __uint_as_float((u & 0xf00u) | 0x47000000u) - 32776.0f;
    c[6] = __uint_as_float((u & 0xf000u) | 0x45000000u) - 2056.0f;
    c[7] = __uint_as_float((u & 0xf0000u) | 0x43000000u) - 136.0f;
}
__device__ __forceinline__ void word_codes_i8(u32 v, float (&c)[4]) {
    // (b ^ 0x80) is b + 128 for a two's-complement byte b; byte j goes under 0x4b (2^23).
    const u32 u = v ^ 0x80808080u;
    c[0] = __uint_as_float(__byte_perm(u, 0x4b000000u, 0x7440)) - 8388736.0f;
    c[1] = __uint_as_float(__byte_perm(u, 0x4b000000u, 0x7441)) - 8388736.0f;
    c[2] = __uint_as_float(__byte_perm(u, 0x4b000000u, 0x7442)) - 8388736.0f;
    c[3] = __uint_as_float(__byte_perm(u, 0x4b000000u, 0x7443)) - 8388736.0f;
}
template <int F> __device__ __forceinline__ void word_codes(u32 v, float (&c)[Wpw<F>::N]);
template <> __device__ __forceinline__ void word_codes<FMT_I4>(u32 v, float (&c)[8]) {
    word_codes_i4(v, c);
}
template <> __device__ __forceinline__ void word_codes<FMT_I8>(u32 v, float (&c)[4]) {
    word_codes_i8(v, c);
}

template <int F, int M, int R, int U, bool WORD, bool ROW_SCALE>
__device__ __forceinline__ void gemv_words(const Job& job, int rows, int cols, int row_bytes,
                                           int row_scales, u32 gmagic, int gshift) {
    constexpr int N = Wpw<F>::N;
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
    if (row0 >= rows) return;
    const u8* W = (const u8*)job.w;
    const float* S = (const float*)job.s;
    const float* X = (const float*)job.x;
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++) acc[r][m] = 0.0f;
    const u32* wrow[R];
    const float* srow[R];
    float rs[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int rr = min(row0 + r, rows - 1);
        wrow[r] = (const u32*)(W + (u64)rr * row_bytes);
        srow[r] = S + (u64)rr * row_scales;
        rs[r] = ROW_SCALE ? __ldg(srow[r]) : 0.0f;
    }
    const int nwords = row_bytes >> 2;
    for (int k0 = lane; k0 < nwords; k0 += 32 * U) {
        u32 q[U][R];
        float s[U][R];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = k0 + 32 * u;
            if (k < nwords) {
                // A scale group never splits a word (gemv.rs admits only such layouts here).
                const int si = ROW_SCALE ? 0 : scale_index(k * N, gmagic, gshift);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    q[u][r] = __ldg(wrow[r] + k);
                    s[u][r] = ROW_SCALE ? rs[r] : __ldg(srow[r] + si);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = k0 + 32 * u;
            if (k < nwords) {
                float xs[M][N];
#pragma unroll
                for (int m = 0; m < M; m++) load_x<N>(X + (u64)m * cols + k * N, xs[m]);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float c[N];
                    word_codes<F>(q[u][r], c);
                    if (WORD) {
#pragma unroll
                        for (int m = 0; m < M; m++) {
                            float p = 0.0f;
#pragma unroll
                            for (int j = 0; j < N; j++) p = fmaf(c[j], xs[m][j], p);
                            acc[r][m] = fmaf(s[u][r], p, acc[r][m]);
                        }
                    } else {
#pragma unroll
                        for (int j = 0; j < N; j++) {
                            const float w = __fmul_rn(c[j], s[u][r]);
#pragma unroll
                            for (int m = 0; m < M; m++) acc[r][m] = fmaf(w, xs[m][j], acc[r][m]);
                        }
                    }
                }
            }
        }
    }
    reduce_store<M, R>(acc, job, row0, rows);
}

// One stored value of row r, column c (before scaling), by byte addressing.
template <int F> __device__ __forceinline__ float value_at(const u8* row, int c);
template <> __device__ __forceinline__ float value_at<FMT_F32>(const u8* row, int c) {
    const u8* p = row + 4 * c;
    return __uint_as_float((u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24));
}
template <> __device__ __forceinline__ float value_at<FMT_BF16>(const u8* row, int c) {
    const u8* p = row + 2 * c;
    return __uint_as_float(((u32)p[0] | ((u32)p[1] << 8)) << 16);
}
template <> __device__ __forceinline__ float value_at<FMT_F16>(const u8* row, int c) {
    const u8* p = row + 2 * c;
    return f16_to_f32((u16)((u32)p[0] | ((u32)p[1] << 8)));
}
template <> __device__ __forceinline__ float value_at<FMT_I8>(const u8* row, int c) {
    return (float)(signed char)row[c];
}
template <> __device__ __forceinline__ float value_at<FMT_I4>(const u8* row, int c) {
    const u32 b = row[c >> 1];
    return (float)(int)((c & 1 ? b >> 4 : b & 0xfu)) - 8.0f;
}

// Any layout (odd widths, unaligned views, groups that split a word): per-weight, exact.
template <int F, int M, int R>
__device__ __forceinline__ void gemv_scalar(const Job& job, int rows, int cols, int row_bytes,
                                            int row_scales, u32 gmagic, int gshift) {
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
    if (row0 >= rows) return;
    const u8* W = (const u8*)job.w;
    const float* S = (const float*)job.s;
    const float* X = (const float*)job.x;
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++) acc[r][m] = 0.0f;
    for (int c = lane; c < cols; c += 32) {
        float xs[M];
#pragma unroll
        for (int m = 0; m < M; m++) xs[m] = __ldg(X + (u64)m * cols + c);
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int rr = min(row0 + r, rows - 1);
            float w = value_at<F>(W + (u64)rr * row_bytes, c);
            if (IsQuant<F>::V)
                w = __fmul_rn(w, __ldg(S + (u64)rr * row_scales + scale_index(c, gmagic, gshift)));
#pragma unroll
            for (int m = 0; m < M; m++) acc[r][m] = fmaf(w, xs[m], acc[r][m]);
        }
    }
    reduce_store<M, R>(acc, job, row0, rows);
}

// Rows per warp: each activation load serves R rows, so R is as large as the registers allow:
// 8 rows at M <= 2, 4 up to M = 4, 2 beyond (the integer kernels' R below is the same).
#define ROWS_PER_WARP(M) ((M) <= 2 ? 8 : (M) <= 4 ? 4 : 2)

// Float formats: the 16-byte chunk path (bf16 reaches 0.9+ of the read bandwidth with it).
#define GEMV_ENTRY(NAME, F, M)                                                                    \
    extern "C" __global__ void __launch_bounds__(128)                                             \
        NAME(const Job* jobs, int rows, int cols, int row_bytes, int row_scales, u32 gmagic,      \
             int gshift, int path) {                                                              \
        const Job job = jobs[blockIdx.y];                                                         \
        if (path & 1)                                                                             \
            gemv_vec<F, M, ROWS_PER_WARP(M)>(job, rows, cols, row_bytes);                         \
        else                                                                                      \
            gemv_scalar<F, M, ROWS_PER_WARP(M)>(job, rows, cols, row_bytes, row_scales, gmagic,   \
                                                gshift);                                          \
    }

// Integer formats: the word path (`path` bit 0; bit 1: one scale per row), R rows per warp, U
// words per row in flight.
#define GEMV_WORDS_ENTRY(NAME, F, M, WORD, R, U)                                                  \
    extern "C" __global__ void __launch_bounds__(128)                                             \
        NAME(const Job* jobs, int rows, int cols, int row_bytes, int row_scales, u32 gmagic,      \
             int gshift, int path) {                                                              \
        const Job job = jobs[blockIdx.y];                                                         \
        if ((path & 3) == 3)                                                                      \
            gemv_words<F, M, R, U, WORD, true>(job, rows, cols, row_bytes, row_scales, gmagic,    \
                                               gshift);                                           \
        else if (path & 1)                                                                        \
            gemv_words<F, M, R, U, WORD, false>(job, rows, cols, row_bytes, row_scales, gmagic,   \
                                                gshift);                                          \
        else                                                                                      \
            gemv_scalar<F, M, R>(job, rows, cols, row_bytes, row_scales, gmagic, gshift);         \
    }

#define GEMV_FLOAT(FN, F)                                                                         \
    GEMV_ENTRY(gemv_##FN##_m1, F, 1)                                                       \
    GEMV_ENTRY(gemv_##FN##_m2, F, 2)                                                       \
    GEMV_ENTRY(gemv_##FN##_m3, F, 3)                                                       \
    GEMV_ENTRY(gemv_##FN##_m4, F, 4)                                                       \
    GEMV_ENTRY(gemv_##FN##_m5, F, 5)                                                       \
    GEMV_ENTRY(gemv_##FN##_m6, F, 6)                                                       \
    GEMV_ENTRY(gemv_##FN##_m7, F, 7)                                                       \
    GEMV_ENTRY(gemv_##FN##_m8, F, 8)

// The integer kernels: R = RA rows per warp at M <= 2, RB up to 4, RC beyond; U words per row in
// flight. `_u4` (U = 4) serves launches of few rows (gemv.rs, `FEW_ROWS`); R and U change which
// warp and step handle a word, never a row's summation order, so both give identical results.
#define WQ(FN, F, ORD, WORD, M, SUF, R, U) GEMV_WORDS_ENTRY(gemv_##FN##_##ORD##_m##M##SUF, F, M, WORD, R, U)
#define GEMV_WORDS_ORDER(FN, F, ORD, WORD, SUF, RA, RB, RC, U)                                     \
    WQ(FN, F, ORD, WORD, 1, SUF, RA, U) WQ(FN, F, ORD, WORD, 2, SUF, RA, U)                        \
    WQ(FN, F, ORD, WORD, 3, SUF, RB, U) WQ(FN, F, ORD, WORD, 4, SUF, RB, U)                        \
    WQ(FN, F, ORD, WORD, 5, SUF, RC, U) WQ(FN, F, ORD, WORD, 6, SUF, RC, U)                        \
    WQ(FN, F, ORD, WORD, 7, SUF, RC, U) WQ(FN, F, ORD, WORD, 8, SUF, RC, U)
#define GEMV_WORDS(FN, F, SUF, RA, RB, RC, U)                                                     \
    GEMV_WORDS_ORDER(FN, F, exact, false, SUF, RA, RB, RC, U)                                     \
    GEMV_WORDS_ORDER(FN, F, word, true, SUF, RA, RB, RC, U)

GEMV_FLOAT(f32, FMT_F32)
GEMV_FLOAT(bf16, FMT_BF16)
GEMV_FLOAT(f16, FMT_F16)
GEMV_WORDS(i8, FMT_I8, , 8, 4, 2, 2)
GEMV_WORDS(i4, FMT_I4, , 8, 4, 2, 2)
GEMV_WORDS(i8, FMT_I8, _u4, 8, 4, 2, 4)
GEMV_WORDS(i4, FMT_I4, _u4, 8, 4, 2, 4)

// Read-bandwidth reference for `nectar bench gpu`: every 16-byte word of p[0..n16) read once
// (grid-stride, four loads in flight per thread), folded by xor so the loads stay; a block
// writes its fold only in the (practically never) case that it equals a fixed constant.
extern "C" __global__ void __launch_bounds__(256) read_ref(const uint4* p, u64 n16, uint4* out) {
    uint4 a = make_uint4(0, 0, 0, 0);
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        const uint4 v0 = __ldg(p + i);
        const uint4 v1 = __ldg(p + i + stride);
        const uint4 v2 = __ldg(p + i + 2 * stride);
        const uint4 v3 = __ldg(p + i + 3 * stride);
        a.x ^= v0.x ^ v1.x ^ v2.x ^ v3.x;
        a.y ^= v0.y ^ v1.y ^ v2.y ^ v3.y;
        a.z ^= v0.z ^ v1.z ^ v2.z ^ v3.z;
        a.w ^= v0.w ^ v1.w ^ v2.w ^ v3.w;
    }
    for (; i < n16; i += stride) {
        const uint4 v = __ldg(p + i);
        a.x ^= v.x;
        a.y ^= v.y;
        a.z ^= v.z;
        a.w ^= v.w;
    }
    if ((a.x ^ a.y ^ a.z ^ a.w) == 0x9e3779b9u) out[blockIdx.x] = a;
}
