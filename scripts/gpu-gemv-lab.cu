// The int4 GEMV lab: the model's tensor-core GEMV (gemv_tc.cu, compiled from the tree) against
// exploration variants of it, in one process on the GPU machine, alternated, each checked against
// the model kernel's output; no Rust build needed, so one device call measures many variants.
//
//   /usr/local/cuda/bin/nvcc -O3 -arch=sm_90 -std=c++17 -I crates/nectar-cuda/src \
//       scripts/gpu-gemv-lab.cu -o lab && ./lab            # every variant, shape and M = 1, 2, 4, 8
//   ./lab only xf_t4,xk_t4_s2_d3                            # those and the model kernel, gate_up M = 1
//                                                           # (for `ncu --kernel-name NAME ...`)
//
// Ratios are GB/s (weights + scales) over the same run's `read_ref` (gemv.cu). Variants, and what
// they measured on the H200 (RESULTS, 2026-12-04 "The int4 GEMV lab"): pfN (L2 prefetch N rounds
// ahead), l2b256 (the L2::256B load hint), wp_* (a warp-local cp.async ring, activations split in
// the loop), xf_* (activation fragments split once per launch by `xfrag_split`; `_ps`: one scale
// multiply per 64-column step), xw_* / xk_* (xf plus the cp.async ring; xk keeps the model's
// per-k-step products). None reached the model kernel's int4 rate by more than 4 %.
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <cmath>
#include <cuda_runtime.h>
#include "gemv.cu"
#include "gemm.cu"
#include "gemv_tc.cu"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

// ---------- variant A: gemv_tc + L2 prefetch PF own-steps ahead, optional L2::256B loads ----------
template <int L2B>
__device__ __forceinline__ uint2 ld_w64(const void* p) {
    uint2 v;
    if constexpr (L2B == 256)
        asm volatile("ld.global.nc.L2::256B.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    else if constexpr (L2B == 128)
        asm volatile("ld.global.nc.L2::128B.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    else
        v = __ldg((const uint2*)p);
    return v;
}

template <int T, bool ROW_SCALE, int PF, int L2B>
__device__ __forceinline__ void gemv_pf(const Job& job, int rows, int cols, int m, int row_bytes,
                                        int row_scales, u32 gmagic, int gshift) {
    constexpr int F = FMT_I4;
    constexpr int N = 2;
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
        for (int h = 0; h < 2; h++) rs[i][h] = ROW_SCALE ? __ldg(srow[i][h]) : 1.0f;
    u32 wn[T][2][N];
    float xn[16];
    float sn[T][2];
    auto prefetch = [&](int s) {
        const int c0 = s * TC_STEP + 16 * t;
        if (c0 < cols) {
#pragma unroll
            for (int i = 0; i < T; i++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(wrow[i][h] + (u64)c0 / 2));
        }
    };
    auto load = [&](int s) {
        const int c0 = s * TC_STEP + 16 * t;
#pragma unroll
        for (int i = 0; i < T; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (c0 < cols) {
                    const uint2 v = ld_w64<L2B>(wrow[i][h] + (u64)c0 / 2);
                    wn[i][h][0] = v.x;
                    wn[i][h][1] = v.y;
                } else {
                    wn[i][h][0] = 0x88888888u;
                    wn[i][h][1] = 0x88888888u;
                }
                if (!ROW_SCALE)
                    sn[i][h] = __ldg(srow[i][h] + scale_index(s * TC_STEP, gmagic, gshift));
                else
                    sn[i][h] = rs[i][h];
            }
        if (has_x && c0 < cols) {
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const float4 v = __ldg((const float4*)(xrow + s * TC_STEP) + q);
                xn[4 * q] = v.x; xn[4 * q + 1] = v.y; xn[4 * q + 2] = v.z; xn[4 * q + 3] = v.w;
            }
        } else {
#pragma unroll
            for (int q = 0; q < 16; q++) xn[q] = 0.0f;
        }
    };
    if (PF > 0) {
#pragma unroll
        for (int d = 1; d <= PF; d++)
            if (warp + d * TC_WARPS < nsteps) prefetch(warp + d * TC_WARPS);
    }
    if (warp < nsteps) load(warp);
    for (int s = warp; s < nsteps; s += TC_WARPS) {
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
        if (PF > 0 && s + (PF + 1) * TC_WARPS < nsteps) prefetch(s + (PF + 1) * TC_WARPS);
        if (s + TC_WARPS < nsteps) load(s + TC_WARPS);
        u32 b[3][4][2];
        tc_split_x<F>(xc, b);
#pragma unroll
        for (int i = 0; i < T; i++) {
            u32 lo0[4], hi0[4], lo1[4], hi1[4];
            tc_decode<F>(wc[i][0], lo0, hi0);
            tc_decode<F>(wc[i][1], lo1, hi1);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const u32 a[4] = {lo0[j], lo1[j], hi0[j], hi1[j]};
                float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int part = 2; part >= 0; part--) mma_bf16(p, a, b[part][j][0], b[part][j][1]);
                acc[i][0] = fmaf(sc[i][0], p[0], acc[i][0]);
                acc[i][1] = fmaf(sc[i][0], p[1], acc[i][1]);
                acc[i][2] = fmaf(sc[i][1], p[2], acc[i][2]);
                acc[i][3] = fmaf(sc[i][1], p[3], acc[i][3]);
            }
        }
    }
    __shared__ float red[TC_WARPS - 1][T][4][32];
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
                for (int w = 0; w < TC_WARPS - 1; w++) v += red[w][i][e][lane];
                const int r = row0 + 16 * i + g + (e >= 2 ? 8 : 0);
                const int tok = 2 * t + (e & 1);
                if (r < rows && tok < m) Y[(u64)tok * rows + r] = v;
            }
    }
}

#define PF_ENTRY(NAME, T, PF, L2B)                                                              \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32)                                 \
        NAME(const Job* jobs, int rows, int cols, int m, int row_bytes, int row_scales,         \
             u32 gmagic, int gshift, int path) {                                                \
        const Job job = jobs[blockIdx.y];                                                       \
        if (path & 2) gemv_pf<T, true, PF, L2B>(job, rows, cols, m, row_bytes, row_scales, gmagic, gshift); \
        else gemv_pf<T, false, PF, L2B>(job, rows, cols, m, row_bytes, row_scales, gmagic, gshift); \
    }
PF_ENTRY(pf0_t4, 4, 0, 0)
PF_ENTRY(pf1_t4, 4, 1, 0)
PF_ENTRY(pf2_t4, 4, 2, 0)
PF_ENTRY(pf4_t4, 4, 4, 0)
PF_ENTRY(l2b256_t4, 4, 0, 256)
PF_ENTRY(pf2l2b_t4, 4, 2, 256)

// ---------- variant B: warp-local cp.async pipeline, contiguous K per warp ----------
// Warp w takes the contiguous 64-column steps [w*ns/4, (w+1)*ns/4); stages of SS steps are copied
// (16-byte cp.async.cg) into the warp's own D-slot ring in shared memory, row stride RS bytes.
__device__ __forceinline__ void cp16(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int K> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(K) : "memory"); }

template <int T, int SS, int D, bool ROW_SCALE>
__device__ __forceinline__ void gemv_wp(const Job& job, int rows, int cols, int m, int row_bytes,
                                        int row_scales, u32 gmagic, int gshift, u8* smem) {
    constexpr int F = FMT_I4;
    constexpr int RB = SS * 32;            // bytes per row per stage (int4)
    constexpr int RS = RB + 32;            // padded row stride: rows g, g+4 fall 32 B apart mod 128
    constexpr int SLOT = 16 * T * RS;      // bytes per stage slot
    constexpr int CH = 16 * T * RB / 16;   // 16-byte chunks per stage
    constexpr int CPR = RB / 16;           // chunks per row
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16 * T;
    const u8* W = (const u8*)job.w;
    const float* S = (const float*)job.s;
    const float* X = (const float*)job.x;
    u8* ring = smem + warp * (D * SLOT);
    const u32 ring_s = (u32)__cvta_generic_to_shared(ring);
    const int nsteps = (cols + TC_STEP - 1) / TC_STEP;
    const int s_begin = warp * nsteps / TC_WARPS, s_end = (warp + 1) * nsteps / TC_WARPS;
    const int nstages = (s_end - s_begin + SS - 1) / SS;
    auto issue = [&](int st) {
        if (st < nstages) {
            const int byte0 = (s_begin + st * SS) * 32;  // int4: 32 bytes per 64-col step
            const int lim = min(s_end * 32, row_bytes);
            const u32 slot = ring_s + (st % D) * SLOT;
#pragma unroll
            for (int k = 0; k < (CH + 31) / 32; k++) {
                const int c = lane + 32 * k;
                if (c < CH) {
                    const int r = c / CPR, q = c % CPR;
                    const int rr = min(row0 + r, rows - 1);
                    const int off = byte0 + 16 * q;
                    const int n = off < lim ? 16 : 0;
                    cp16(slot + r * RS + 16 * q, W + (u64)rr * row_bytes + (n ? off : 0), n);
                }
            }
        }
        cp_commit();
    };
    float acc[T][4];
#pragma unroll
    for (int i = 0; i < T; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[i][e] = 0.0f;
    const float* srow[T][2];
    float rs[T][2];
#pragma unroll
    for (int i = 0; i < T; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = min(row0 + 16 * i + g + 8 * h, rows - 1);
            srow[i][h] = S + (u64)r * row_scales;
            rs[i][h] = ROW_SCALE ? __ldg(srow[i][h]) : 1.0f;
        }
    const bool has_x = g < m;
    const float* xrow = X + (u64)(has_x ? g : 0) * cols + 16 * t;
#pragma unroll
    for (int st = 0; st < D - 1; st++) issue(st);
    for (int st = 0; st < nstages; st++) {
        issue(st + D - 1);
        cp_wait<D - 1>();
        __syncwarp();
        const u8* slot = ring + (st % D) * SLOT;
#pragma unroll
        for (int q = 0; q < SS; q++) {
            const int s = s_begin + st * SS + q;
            if (s < s_end) {
                const int c0 = s * TC_STEP + 16 * t;
                float xc[16];
                if (has_x && c0 < cols) {
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        const float4 v = __ldg((const float4*)(xrow + s * TC_STEP) + k);
                        xc[4 * k] = v.x; xc[4 * k + 1] = v.y; xc[4 * k + 2] = v.z; xc[4 * k + 3] = v.w;
                    }
                } else {
#pragma unroll
                    for (int k = 0; k < 16; k++) xc[k] = 0.0f;
                }
                u32 b[3][4][2];
                tc_split_x<F>(xc, b);
#pragma unroll
                for (int i = 0; i < T; i++) {
                    float sc[2];
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        sc[h] = ROW_SCALE ? rs[i][h] : __ldg(srow[i][h] + scale_index(s * TC_STEP, gmagic, gshift));
                    u32 w0[2], w1[2];
                    {
                        const uint2 v0 = *(const uint2*)(slot + (16 * i + g) * RS + 32 * q + 8 * t);
                        const uint2 v1 = *(const uint2*)(slot + (16 * i + g + 8) * RS + 32 * q + 8 * t);
                        w0[0] = v0.x; w0[1] = v0.y; w1[0] = v1.x; w1[1] = v1.y;
                    }
                    u32 lo0[4], hi0[4], lo1[4], hi1[4];
                    tc_decode<F>(w0, lo0, hi0);
                    tc_decode<F>(w1, lo1, hi1);
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const u32 a[4] = {lo0[j], lo1[j], hi0[j], hi1[j]};
                        float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                        for (int part = 2; part >= 0; part--) mma_bf16(p, a, b[part][j][0], b[part][j][1]);
                        acc[i][0] = fmaf(sc[0], p[0], acc[i][0]);
                        acc[i][1] = fmaf(sc[0], p[1], acc[i][1]);
                        acc[i][2] = fmaf(sc[1], p[2], acc[i][2]);
                        acc[i][3] = fmaf(sc[1], p[3], acc[i][3]);
                    }
                }
            }
        }
        __syncwarp();
    }
    cp_wait<0>();
    __syncthreads();
    float* red = (float*)smem;  // reuse the rings: [TC_WARPS-1][T][4][32]
    if (warp > 0) {
#pragma unroll
        for (int i = 0; i < T; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) red[(((warp - 1) * T + i) * 4 + e) * 32 + lane] = acc[i][e];
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
                for (int w = 0; w < TC_WARPS - 1; w++) v += red[((w * T + i) * 4 + e) * 32 + lane];
                const int r = row0 + 16 * i + g + (e >= 2 ? 8 : 0);
                const int tok = 2 * t + (e & 1);
                if (r < rows && tok < m) Y[(u64)tok * rows + r] = v;
            }
    }
}
#define WP_ENTRY(NAME, T, SS, D)                                                                \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32)                                 \
        NAME(const Job* jobs, int rows, int cols, int m, int row_bytes, int row_scales,         \
             u32 gmagic, int gshift, int path) {                                                \
        extern __shared__ __align__(16) u8 smem[];                                              \
        const Job job = jobs[blockIdx.y];                                                       \
        if (path & 2) gemv_wp<T, SS, D, true>(job, rows, cols, m, row_bytes, row_scales, gmagic, gshift, smem); \
        else gemv_wp<T, SS, D, false>(job, rows, cols, m, row_bytes, row_scales, gmagic, gshift, smem); \
    }
WP_ENTRY(wp_t4_s2_d4, 4, 2, 4)
WP_ENTRY(wp_t2_s4_d4, 2, 4, 4)
WP_ENTRY(wp_t2_s2_d6, 2, 2, 6)
WP_ENTRY(wp_t4_s2_d3, 4, 2, 3)
WP_ENTRY(wp_t1_s4_d6, 1, 4, 6)


// ---------- variant C: activation fragments split once per launch (pre-kernel), per-step scale,
// the decode's magic in a register (one LOP3 per nibble pair) ----------
// xf layout: [nsteps][8 g][4 t][24 u32]: token g's B fragments (3 parts x 4 k-steps x 2).
extern "C" __global__ void xfrag_split(const float* X, int m, int cols, u32* xf) {
    const int nsteps = (cols + TC_STEP - 1) / TC_STEP;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;  // (s, g, t)
    if (i >= nsteps * m * 4) return;
    const int t = i & 3, g = (i >> 2) % m, s = (i >> 2) / m;
    float x[16];
    const int c0 = s * TC_STEP + 16 * t;
#pragma unroll
    for (int k = 0; k < 16; k++) x[k] = c0 + k < cols ? X[(u64)g * cols + c0 + k] : 0.0f;
    u32 b[3][4][2];
    tc_split_x<FMT_I4>(x, b);
    uint4* o = (uint4*)(xf + ((u64)(s * 8 + g) * 4 + t) * 24);
#pragma unroll
    for (int q = 0; q < 6; q++) {
        const int a = 4 * q;
        o[q] = make_uint4(b[a / 8][(a % 8) / 2][a % 2], b[(a + 1) / 8][((a + 1) % 8) / 2][(a + 1) % 2],
                          b[(a + 2) / 8][((a + 2) % 8) / 2][(a + 2) % 2], b[(a + 3) / 8][((a + 3) % 8) / 2][(a + 3) % 2]);
    }
}

__device__ __forceinline__ u32 lop_mask_or(u32 v, u32 mask, u32 magic) {
    u32 r;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(v), "r"(mask), "r"(magic));  // (a & b) | c
    return r;
}

template <int T, bool ROW_SCALE, bool PSTEP>
__device__ __forceinline__ void gemv_xf(const Job& job, int rows, int cols, int m, int row_bytes,
                                        int row_scales, u32 gmagic, int gshift, const u32* xf) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16 * T;
    const u8* W = (const u8*)job.w;
    const float* S = (const float*)job.s;
    const u8* wrow[T][2];
    const float* srow[T][2];
#pragma unroll
    for (int i = 0; i < T; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = min(row0 + 16 * i + g + 8 * h, rows - 1);
            wrow[i][h] = W + (u64)r * row_bytes;
            srow[i][h] = S + (u64)r * row_scales;
        }
    const bool has_x = g < m;
    const uint4* xrow = (const uint4*)(xf + ((u64)g * 4 + t) * 24);
    const u64 xstride = 8 * 4 * 24 / 4;  // uint4 per step
    const int nsteps = (cols + TC_STEP - 1) / TC_STEP;
    u32 mask, magic, bias, one;
    asm volatile("mov.b32 %0, 0x000f000f;" : "=r"(mask));
    asm volatile("mov.b32 %0, 0x43004300;" : "=r"(magic));
    asm volatile("mov.b32 %0, 0xc308c308;" : "=r"(bias));
    asm volatile("mov.b32 %0, 0x3f803f80;" : "=r"(one));
    float acc[T][4];
#pragma unroll
    for (int i = 0; i < T; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[i][e] = 0.0f;
    float rs[T][2];
#pragma unroll
    for (int i = 0; i < T; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) rs[i][h] = ROW_SCALE ? __ldg(srow[i][h]) : 1.0f;
    u32 wn[T][2][2];
    uint4 xn[6];
    float sn[T][2];
    auto load = [&](int s) {
        const int c0 = s * TC_STEP + 16 * t;
#pragma unroll
        for (int i = 0; i < T; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (c0 < cols) {
                    const uint2 v = __ldg((const uint2*)(wrow[i][h] + (u64)c0 / 2));
                    wn[i][h][0] = v.x;
                    wn[i][h][1] = v.y;
                } else {
                    wn[i][h][0] = 0x88888888u;
                    wn[i][h][1] = 0x88888888u;
                }
                sn[i][h] = ROW_SCALE ? rs[i][h] : __ldg(srow[i][h] + scale_index(s * TC_STEP, gmagic, gshift));
            }
        if (has_x) {
#pragma unroll
            for (int q = 0; q < 6; q++) xn[q] = __ldg(xrow + s * xstride + q);
        } else {
#pragma unroll
            for (int q = 0; q < 6; q++) xn[q] = make_uint4(0, 0, 0, 0);
        }
    };
    auto unb = [&](u32 v) {
        u32 r;
        asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(v), "r"(one), "r"(bias));
        return r;
    };
    if (warp < nsteps) load(warp);
    for (int s = warp; s < nsteps; s += TC_WARPS) {
        u32 wc[T][2][2];
        uint4 xc[6];
        float sc[T][2];
#pragma unroll
        for (int i = 0; i < T; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                sc[i][h] = sn[i][h];
                wc[i][h][0] = wn[i][h][0];
                wc[i][h][1] = wn[i][h][1];
            }
#pragma unroll
        for (int q = 0; q < 6; q++) xc[q] = xn[q];
        if (s + TC_WARPS < nsteps) load(s + TC_WARPS);
        const u32* bx = (const u32*)xc;  // [part][j][2]
#pragma unroll
        for (int i = 0; i < T; i++) {
            u32 lo[2][4], hi[2][4];
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int w = 0; w < 2; w++) {
                    const u32 v = wc[i][h][w];
                    lo[h][2 * w] = unb(lop_mask_or(v, mask, magic));
                    hi[h][2 * w] = unb(lop_mask_or(v >> 4, mask, magic));
                    lo[h][2 * w + 1] = unb(lop_mask_or(v >> 8, mask, magic));
                    hi[h][2 * w + 1] = unb(lop_mask_or(v >> 12, mask, magic));
                }
            float ps[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const u32 a[4] = {lo[0][j], lo[1][j], hi[0][j], hi[1][j]};
                float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                float (&d)[4] = PSTEP ? ps : p;
#pragma unroll
                for (int part = 2; part >= 0; part--) mma_bf16(d, a, bx[(part * 4 + j) * 2], bx[(part * 4 + j) * 2 + 1]);
                if (!PSTEP) {
                    acc[i][0] = fmaf(sc[i][0], p[0], acc[i][0]);
                    acc[i][1] = fmaf(sc[i][0], p[1], acc[i][1]);
                    acc[i][2] = fmaf(sc[i][1], p[2], acc[i][2]);
                    acc[i][3] = fmaf(sc[i][1], p[3], acc[i][3]);
                }
            }
            if (PSTEP) {
                acc[i][0] = fmaf(sc[i][0], ps[0], acc[i][0]);
                acc[i][1] = fmaf(sc[i][0], ps[1], acc[i][1]);
                acc[i][2] = fmaf(sc[i][1], ps[2], acc[i][2]);
                acc[i][3] = fmaf(sc[i][1], ps[3], acc[i][3]);
            }
        }
    }
    __shared__ float red[TC_WARPS - 1][T][4][32];
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
                for (int w = 0; w < TC_WARPS - 1; w++) v += red[w][i][e][lane];
                const int r = row0 + 16 * i + g + (e >= 2 ? 8 : 0);
                const int tok = 2 * t + (e & 1);
                if (r < rows && tok < m) Y[(u64)tok * rows + r] = v;
            }
    }
}
// The x fragments' buffer travels in Job.x (the pre-kernel wrote it there).
#define XF_ENTRY(NAME, T, PSTEP, MINB)                                                          \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32, MINB)                           \
        NAME(const Job* jobs, int rows, int cols, int m, int row_bytes, int row_scales,         \
             u32 gmagic, int gshift, int path) {                                                \
        const Job job = jobs[blockIdx.y];                                                       \
        const u32* xf = (const u32*)job.x;                                                      \
        if (path & 2) gemv_xf<T, true, PSTEP>(job, rows, cols, m, row_bytes, row_scales, gmagic, gshift, xf); \
        else gemv_xf<T, false, PSTEP>(job, rows, cols, m, row_bytes, row_scales, gmagic, gshift, xf); \
    }
XF_ENTRY(xf_t4, 4, false, 1)
XF_ENTRY(xf_t4_ps, 4, true, 1)
XF_ENTRY(xf_t2_ps, 2, true, 1)
XF_ENTRY(xf_t2_ps_b4, 2, true, 4)
XF_ENTRY(xf_t4_ps_b3, 4, true, 3)

// ---------- variant D: C's fragments and per-step scale, weights through a warp-local cp.async
// ring (contiguous steps per warp), so D-1 stages of weights are in flight per warp ----------
template <int T, bool ROW_SCALE, int SS, int D, bool PSTEP = true>
__device__ __forceinline__ void gemv_xfwp(const Job& job, int rows, int cols, int m, int row_bytes,
                                          int row_scales, u32 gmagic, int gshift, const u32* xf, u8* smem) {
    constexpr int RB = SS * 32;
    constexpr int RS = RB + 32;
    constexpr int SLOT = 16 * T * RS;
    constexpr int CH = 16 * T * RB / 16;
    constexpr int CPR = RB / 16;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16 * T;
    const u8* W = (const u8*)job.w;
    const float* S = (const float*)job.s;
    u8* ring = smem + warp * (D * SLOT);
    const u32 ring_s = (u32)__cvta_generic_to_shared(ring);
    const int nsteps = (cols + TC_STEP - 1) / TC_STEP;
    const int s_begin = warp * nsteps / TC_WARPS, s_end = (warp + 1) * nsteps / TC_WARPS;
    const int nstages = (s_end - s_begin + SS - 1) / SS;
    const int lim = min(s_end * 32, row_bytes);
    auto issue = [&](int st) {
        if (st < nstages) {
            const int byte0 = (s_begin + st * SS) * 32;
            const u32 slot = ring_s + (st % D) * SLOT;
#pragma unroll
            for (int k = 0; k < (CH + 31) / 32; k++) {
                const int c = lane + 32 * k;
                if (CH % 32 == 0 || c < CH) {
                    const int r = c / CPR, q = c % CPR;
                    const int rr = min(row0 + r, rows - 1);
                    const int off = byte0 + 16 * q;
                    const int n = off < lim ? 16 : 0;
                    cp16(slot + r * RS + 16 * q, W + (u64)rr * row_bytes + (n ? off : 0), n);
                }
            }
        }
        cp_commit();
    };
    const float* srow[T][2];
    float rs[T][2];
#pragma unroll
    for (int i = 0; i < T; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = min(row0 + 16 * i + g + 8 * h, rows - 1);
            srow[i][h] = S + (u64)r * row_scales;
            rs[i][h] = ROW_SCALE ? __ldg(srow[i][h]) : 1.0f;
        }
    const bool has_x = g < m;
    const uint4* xrow = (const uint4*)(xf + ((u64)g * 4 + t) * 24);
    const u64 xstride = 8 * 4 * 24 / 4;
    u32 mask, magic, bias, one;
    asm volatile("mov.b32 %0, 0x000f000f;" : "=r"(mask));
    asm volatile("mov.b32 %0, 0x43004300;" : "=r"(magic));
    asm volatile("mov.b32 %0, 0xc308c308;" : "=r"(bias));
    asm volatile("mov.b32 %0, 0x3f803f80;" : "=r"(one));
    auto unb = [&](u32 v) {
        u32 r;
        asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(v), "r"(one), "r"(bias));
        return r;
    };
    float acc[T][4];
#pragma unroll
    for (int i = 0; i < T; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[i][e] = 0.0f;
    uint4 xn[6];
    float sn[T][2];
    auto load_xs = [&](int s) {
        if (s < s_end) {
#pragma unroll
            for (int i = 0; i < T; i++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    sn[i][h] = ROW_SCALE ? rs[i][h] : __ldg(srow[i][h] + scale_index(s * TC_STEP, gmagic, gshift));
            if (has_x) {
#pragma unroll
                for (int q = 0; q < 6; q++) xn[q] = __ldg(xrow + s * xstride + q);
            } else {
#pragma unroll
                for (int q = 0; q < 6; q++) xn[q] = make_uint4(0, 0, 0, 0);
            }
        }
    };
#pragma unroll
    for (int st = 0; st < D - 1; st++) issue(st);
    load_xs(s_begin);
    for (int st = 0; st < nstages; st++) {
        issue(st + D - 1);
        cp_wait<D - 1>();
        __syncwarp();
        const u8* slot = ring + (st % D) * SLOT;
#pragma unroll
        for (int q = 0; q < SS; q++) {
            const int s = s_begin + st * SS + q;
            if (s < s_end) {
                uint4 xc[6];
                float sc[T][2];
#pragma unroll
                for (int k = 0; k < 6; k++) xc[k] = xn[k];
#pragma unroll
                for (int i = 0; i < T; i++) { sc[i][0] = sn[i][0]; sc[i][1] = sn[i][1]; }
                load_xs(s + 1);
                const u32* bx = (const u32*)xc;
#pragma unroll
                for (int i = 0; i < T; i++) {
                    u32 wv[2][2];
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const uint2 v = *(const uint2*)(slot + (16 * i + g + 8 * h) * RS + 32 * q + 8 * t);
                        wv[h][0] = v.x;
                        wv[h][1] = v.y;
                    }
                    u32 lo[2][4], hi[2][4];
#pragma unroll
                    for (int h = 0; h < 2; h++)
#pragma unroll
                        for (int w = 0; w < 2; w++) {
                            const u32 v = wv[h][w];
                            lo[h][2 * w] = unb(lop_mask_or(v, mask, magic));
                            hi[h][2 * w] = unb(lop_mask_or(v >> 4, mask, magic));
                            lo[h][2 * w + 1] = unb(lop_mask_or(v >> 8, mask, magic));
                            hi[h][2 * w + 1] = unb(lop_mask_or(v >> 12, mask, magic));
                        }
                    float ps[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const u32 a[4] = {lo[0][j], lo[1][j], hi[0][j], hi[1][j]};
                        float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        float (&d)[4] = PSTEP ? ps : p;
#pragma unroll
                        for (int part = 2; part >= 0; part--) mma_bf16(d, a, bx[(part * 4 + j) * 2], bx[(part * 4 + j) * 2 + 1]);
                        if (!PSTEP) {
                            acc[i][0] = fmaf(sc[i][0], p[0], acc[i][0]);
                            acc[i][1] = fmaf(sc[i][0], p[1], acc[i][1]);
                            acc[i][2] = fmaf(sc[i][1], p[2], acc[i][2]);
                            acc[i][3] = fmaf(sc[i][1], p[3], acc[i][3]);
                        }
                    }
                    if (PSTEP) {
                        acc[i][0] = fmaf(sc[i][0], ps[0], acc[i][0]);
                        acc[i][1] = fmaf(sc[i][0], ps[1], acc[i][1]);
                        acc[i][2] = fmaf(sc[i][1], ps[2], acc[i][2]);
                        acc[i][3] = fmaf(sc[i][1], ps[3], acc[i][3]);
                    }
                }
            }
        }
        __syncwarp();
    }
    cp_wait<0>();
    __syncthreads();
    float* red = (float*)smem;
    if (warp > 0) {
#pragma unroll
        for (int i = 0; i < T; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) red[(((warp - 1) * T + i) * 4 + e) * 32 + lane] = acc[i][e];
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
                for (int w = 0; w < TC_WARPS - 1; w++) v += red[((w * T + i) * 4 + e) * 32 + lane];
                const int r = row0 + 16 * i + g + (e >= 2 ? 8 : 0);
                const int tok = 2 * t + (e & 1);
                if (r < rows && tok < m) Y[(u64)tok * rows + r] = v;
            }
    }
}
#define XFWP_ENTRY(NAME, T, SS, D, ...)                                                            \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32)                                 \
        NAME(const Job* jobs, int rows, int cols, int m, int row_bytes, int row_scales,         \
             u32 gmagic, int gshift, int path) {                                                \
        extern __shared__ __align__(16) u8 smem[];                                              \
        const Job job = jobs[blockIdx.y];                                                       \
        const u32* xf = (const u32*)job.x;                                                      \
        if (path & 2) gemv_xfwp<T, true, SS, D, ##__VA_ARGS__>(job, rows, cols, m, row_bytes, row_scales, gmagic, gshift, xf, smem); \
        else gemv_xfwp<T, false, SS, D, ##__VA_ARGS__>(job, rows, cols, m, row_bytes, row_scales, gmagic, gshift, xf, smem); \
    }
XFWP_ENTRY(xw_t4_s2_d4, 4, 2, 4)
XFWP_ENTRY(xw_t4_s2_d3, 4, 2, 3)
XFWP_ENTRY(xw_t2_s2_d6, 2, 2, 6)
XFWP_ENTRY(xw_t2_s4_d4, 2, 4, 4)
XFWP_ENTRY(xw_t4_s1_d6, 4, 1, 6)
XFWP_ENTRY(xk_t4_s2_d3, 4, 2, 3, false)
XFWP_ENTRY(xk_t4_s2_d4, 4, 2, 4, false)
XFWP_ENTRY(xk_t2_s4_d4, 2, 4, 4, false)

typedef void (*KFn)(const Job*, int, int, int, int, int, u32, int, int);
struct Var { const char* name; KFn fn; int T; int smem; bool xf = false; };

static int wp_smem(int T, int SS, int D) { return TC_WARPS * D * 16 * T * (SS * 32 + 32); }

int main(int argc, char** argv) {
    int dev = 0;
    CK(cudaSetDevice(dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    std::vector<Var> vars = {
        {"tensor(repo)", (KFn)gemv_tc_i4_t4, 4, 0},
        {"pf0_t4", (KFn)pf0_t4, 4, 0},
        {"pf1_t4", (KFn)pf1_t4, 4, 0},
        {"pf2_t4", (KFn)pf2_t4, 4, 0},
        {"pf4_t4", (KFn)pf4_t4, 4, 0},
        {"l2b256_t4", (KFn)l2b256_t4, 4, 0},
        {"pf2l2b_t4", (KFn)pf2l2b_t4, 4, 0},
        {"wp_t4_s2_d4", (KFn)wp_t4_s2_d4, 4, wp_smem(4, 2, 4)},
        {"wp_t2_s4_d4", (KFn)wp_t2_s4_d4, 2, wp_smem(2, 4, 4)},
        {"wp_t2_s2_d6", (KFn)wp_t2_s2_d6, 2, wp_smem(2, 2, 6)},
        {"wp_t4_s2_d3", (KFn)wp_t4_s2_d3, 4, wp_smem(4, 2, 3)},
        {"wp_t1_s4_d6", (KFn)wp_t1_s4_d6, 1, wp_smem(1, 4, 6)},
        {"xf_t4", (KFn)xf_t4, 4, 0, true},
        {"xf_t4_ps", (KFn)xf_t4_ps, 4, 0, true},
        {"xf_t2_ps", (KFn)xf_t2_ps, 2, 0, true},
        {"xf_t2_ps_b4", (KFn)xf_t2_ps_b4, 2, 0, true},
        {"xf_t4_ps_b3", (KFn)xf_t4_ps_b3, 4, 0, true},
        {"xw_t4_s2_d4", (KFn)xw_t4_s2_d4, 4, wp_smem(4, 2, 4), true},
        {"xw_t4_s2_d3", (KFn)xw_t4_s2_d3, 4, wp_smem(4, 2, 3), true},
        {"xw_t2_s2_d6", (KFn)xw_t2_s2_d6, 2, wp_smem(2, 2, 6), true},
        {"xw_t2_s4_d4", (KFn)xw_t2_s4_d4, 2, wp_smem(2, 4, 4), true},
        {"xw_t4_s1_d6", (KFn)xw_t4_s1_d6, 4, wp_smem(4, 1, 6), true},
        {"xk_t4_s2_d3", (KFn)xk_t4_s2_d3, 4, wp_smem(4, 2, 3), true},
        {"xk_t4_s2_d4", (KFn)xk_t4_s2_d4, 4, wp_smem(4, 2, 4), true},
        {"xk_t2_s4_d4", (KFn)xk_t2_s4_d4, 2, wp_smem(2, 4, 4), true},
    };
    // `lab only NAME,NAME,...` keeps those variants (and the repo kernel), gate_up x16 M=1 only.
    bool only = argc > 2 && !strcmp(argv[1], "only");
    if (only) {
        std::vector<Var> keep = {vars[0]};
        for (auto& v : vars)
            if (strstr(argv[2], v.name) && strcmp(v.name, vars[0].name)) keep.push_back(v);
        vars = keep;
    }
    for (auto& v : vars) {
        if (v.smem > 0) CK(cudaFuncSetAttribute(v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem));
        cudaFuncAttributes a;
        CK(cudaFuncGetAttributes(&a, v.fn));
        int blocks = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, v.fn, TC_WARPS * 32, v.smem));
        printf("%-14s regs %3d local %3zu smem %6d blocks/SM %d\n", v.name, a.numRegs, a.localSizeBytes, v.smem, blocks);
    }
    // read reference over 1 GiB
    size_t rb = 1ull << 30;
    uint4 *rp, *ro;
    CK(cudaMalloc(&rp, rb));
    CK(cudaMemset(rp, 1, rb));
    CK(cudaMalloc(&ro, 1 << 20));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto read_bw = [&]() {
        float best = 1e30f;
        for (int r = 0; r < 5; r++) {
            CK(cudaEventRecord(e0));
            read_ref<<<prop.multiProcessorCount * 8, 256>>>(rp, rb / 16, ro);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            best = std::min(best, ms);
        }
        return rb / (best * 1e-3) / 1e9;
    };
    double ref = read_bw();
    printf("read_ref %.0f GB/s\n", ref);

    struct Shape { const char* name; int rows, cols, batch, group; };
    std::vector<Shape> shapes = {
        {"gate_up x16 g64", 2048, 6144, 16, 64},
        {"down x8 g64", 6144, 2048, 8, 64},
        {"gate_up x16 row", 2048, 6144, 16, 0},
        {"q_b g64", 16384, 2048, 1, 64},
        {"kv_b g64", 28672, 512, 1, 64},
        {"o_proj g64", 6144, 16384, 1, 64},
        {"gate lone g64", 2048, 6144, 1, 64},
    };
    std::vector<int> ms_list = {1, 2, 4, 8};
    if (only) { shapes.resize(1); ms_list = {1}; }
    for (auto& sh : shapes) {
        size_t row_bytes = sh.cols / 2;
        int row_scales = sh.group ? sh.cols / sh.group : 1;
        size_t wb = (size_t)sh.rows * row_bytes, sb = (size_t)sh.rows * row_scales * 4;
        size_t per = (wb + sb) * sh.batch;
        int copies = std::max<size_t>(2, (size_t)(400ull << 20) / per + 1);
        u8* W; float* S; float* X; float* Y; Job* J;
        CK(cudaMalloc(&W, wb * sh.batch * copies));
        CK(cudaMalloc(&S, sb * sh.batch * copies));
        CK(cudaMalloc(&X, 8ull * sh.cols * 4));
        CK(cudaMalloc(&Y, 8ull * sh.rows * 4 * sh.batch));
        CK(cudaMalloc(&J, sizeof(Job) * sh.batch * copies));
        Job* J2; u32* XF;
        CK(cudaMalloc(&J2, sizeof(Job) * sh.batch * copies));
        CK(cudaMalloc(&XF, (size_t)((sh.cols + 63) / 64) * 8 * 4 * 24 * 4));
        {
            std::vector<u8> hw(wb * sh.batch);
            uint64_t z = 12345;
            for (auto& b : hw) { z = z * 6364136223846793005ull + 1442695040888963407ull; b = (u8)(z >> 33); }
            std::vector<float> hs(sb / 4 * sh.batch), hx(8ull * sh.cols);
            for (auto& s : hs) { z = z * 6364136223846793005ull + 1442695040888963407ull; s = 0.001f + (float)((z >> 40) & 0xffff) / 65536.0f * 0.02f; }
            for (auto& x : hx) { z = z * 6364136223846793005ull + 1442695040888963407ull; x = (float)((int)((z >> 33) & 0xffff) - 32768) / 32768.0f; }
            for (int c = 0; c < copies; c++) {
                CK(cudaMemcpy(W + wb * sh.batch * c, hw.data(), hw.size(), cudaMemcpyHostToDevice));
                CK(cudaMemcpy(S + sb / 4 * sh.batch * c, hs.data(), sb * sh.batch, cudaMemcpyHostToDevice));
            }
            CK(cudaMemcpy(X, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
            std::vector<Job> hj(sh.batch * copies);
            for (int c = 0; c < copies; c++)
                for (int b = 0; b < sh.batch; b++) {
                    Job& j = hj[c * sh.batch + b];
                    j.w = (u64)(W + wb * (c * sh.batch + b));
                    j.s = (u64)(S + sb / 4 * (c * sh.batch + b));
                    j.x = (u64)X;
                    j.y = (u64)(Y + (size_t)8 * sh.rows * b);
                }
            CK(cudaMemcpy(J, hj.data(), hj.size() * sizeof(Job), cudaMemcpyHostToDevice));
            for (auto& j : hj) j.x = (u64)XF;
            CK(cudaMemcpy(J2, hj.data(), hj.size() * sizeof(Job), cudaMemcpyHostToDevice));
        }
        u32 gmagic = 0; int gshift = 6;  // c / 64
        int path = sh.group ? 0 : 2;
        for (int m : ms_list) {
            // reference output: repo kernel
            std::vector<float> yref(8ull * sh.rows * sh.batch), yv(yref.size());
            auto launch = [&](const Var& v, int c) {
                dim3 grid((sh.rows + 16 * v.T - 1) / (16 * v.T), sh.batch);
                if (v.xf) {
                    int n = (sh.cols + 63) / 64 * m * 4;
                    xfrag_split<<<(n + 127) / 128, 128>>>(X, m, sh.cols, XF);
                }
                v.fn<<<grid, TC_WARPS * 32, v.smem>>>((v.xf ? J2 : J) + c * sh.batch, sh.rows, sh.cols, m, (int)row_bytes, row_scales, gmagic, gshift, path);
            };
            CK(cudaMemset(Y, 0, yref.size() * 4));
            launch(vars[0], 0);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(yref.data(), Y, yref.size() * 4, cudaMemcpyDeviceToHost));
            printf("%s M=%d (copies %d, %.1f MB per launch)\n", sh.name, m, copies, per / 1e6);
            std::vector<std::vector<float>> times(vars.size());
            int iters = 50;
            for (int round = 0; round < 4; round++) {
                for (size_t vi0 = 0; vi0 < vars.size(); vi0++) {
                    size_t vi = round % 2 ? vars.size() - 1 - vi0 : vi0;
                    const Var& v = vars[vi];
                    for (int c = 0; c < copies; c++) launch(v, c);  // warm
                    CK(cudaEventRecord(e0));
                    for (int it = 0; it < iters; it++) launch(v, it % copies);
                    CK(cudaEventRecord(e1));
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    times[vi].push_back(ms * 1e3f / iters);
                }
            }
            CK(cudaGetLastError());
            for (size_t vi = 0; vi < vars.size(); vi++) {
                CK(cudaMemset(Y, 0, yref.size() * 4));
                launch(vars[vi], 0);
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(yv.data(), Y, yv.size() * 4, cudaMemcpyDeviceToHost));
                double maxd = 0, maxr = 0; bool same = true;
                for (int b = 0; b < sh.batch; b++)
                    for (int tok = 0; tok < m; tok++)
                        for (int r = 0; r < sh.rows; r++) {
                            size_t i = (size_t)8 * sh.rows * b + (size_t)tok * sh.rows + r;
                            maxd = std::max(maxd, (double)fabsf(yv[i] - yref[i]));
                            maxr = std::max(maxr, (double)fabsf(yref[i]));
                            if (yv[i] != yref[i]) same = false;
                        }
                auto ts = times[vi];
                std::sort(ts.begin(), ts.end());
                double us = ts[ts.size() / 2];
                printf("  %-14s %8.2f us  %7.0f GB/s  %.3f of read  %s (max|d|/max|y| %.2e)\n", vars[vi].name, us, per / (us * 1e-6) / 1e9, per / (us * 1e-6) / 1e9 / ref, same ? "bits=" : "bits!=", maxd / std::max(maxr, 1e-30));
            }
            fflush(stdout);
        }
        CK(cudaFree(J2)); CK(cudaFree(XF));
        CK(cudaFree(W)); CK(cudaFree(S)); CK(cudaFree(X)); CK(cudaFree(Y)); CK(cudaFree(J));
    }
    printf("read_ref again %.0f GB/s\n", read_bw());
    return 0;
}
