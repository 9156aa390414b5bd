// The DSA indexer's scores of a prefill chunk (index.rs; nectar-kernels' `index_score` is the
// CPU reference, which this kernel reproduces bit for bit so that the top-k selection made from
// its scores is the CPU's):
//   score(i, t) = Σ_h w[i][h] · relu((q[i][h] · key[t]) · qk_scale)
//
// Layout (f32, row-major):
//   q:    m × heads × dim   the rows' indexer queries (RoPE applied)
//   w:    m × heads         the rows' head weights, already times heads^-½
//   keys: T × dim           the sequence's indexer keys (normed, RoPE applied)
//   pos:  m                 each row's position: it is scored against keys 0 ..= pos
//   out:  m × T             scores; entries t > pos are left untouched
//
// Work split: one block of 256 threads per (tile of IX_K = 16 keys, tile of IX_R = 16 rows);
// thread (r, k) = (tid / 16, tid % 16) computes score(i0 + r, t0 + k). The key tile stays in
// shared memory for every head; the rows' queries are staged one head at a time.
//
// Accumulation order (exactly the CPU's, so the scores are the same bits):
//   q_h · key: nectar-kernels' canonical dot: 16 lanes from +0, element c into lane c % 16 by
//     one fma each in increasing c (a ragged tail as if padded with zeros, fma(0, 0, lane)),
//     then the lanes folded by halves (l[j] += l[j + 8], + 4, + 2, then l[0] + l[1]);
//   then × qk_scale, max(·, 0), × w_h, and added to the running score from +0 in increasing h,
//   each a separately rounded f32 operation (the _rn intrinsics keep NVRTC from fusing them).

#define IX_R 16
#define IX_K 16
#define IX_THREADS 256
#define IX_DMAX 256            // largest index_head_dim (index.rs checks)
#define IX_LD (IX_DMAX + 1)    // shared row stride: a column walk hits 16 different banks

// q · key in the canonical order above (both rows in shared memory, `dim` floats each).
__device__ __forceinline__ float ix_dot(const float* q, const float* key, int dim) {
    float l[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) l[j] = 0.0f;
    for (int c0 = 0; c0 < dim; c0 += 16) {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int c = c0 + j;
            const float a = c < dim ? q[c] : 0.0f;
            const float b = c < dim ? key[c] : 0.0f;
            l[j] = fmaf(a, b, l[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) l[j] = __fadd_rn(l[j], l[j + 8]);
#pragma unroll
    for (int j = 0; j < 4; ++j) l[j] = __fadd_rn(l[j], l[j + 4]);
#pragma unroll
    for (int j = 0; j < 2; ++j) l[j] = __fadd_rn(l[j], l[j + 2]);
    return __fadd_rn(l[0], l[1]);
}

extern "C" __global__ void __launch_bounds__(IX_THREADS) dsa_index_scores(
    const float* __restrict__ q, const float* __restrict__ w, const float* __restrict__ keys,
    const int* __restrict__ pos, float* __restrict__ out, int m, int heads, int dim, int T,
    float qk_scale) {
    __shared__ float qs[IX_R * IX_LD];
    __shared__ float ks[IX_K * IX_LD];
    __shared__ int pos_s[IX_R];

    const int tid = threadIdx.x;
    const int r = tid / IX_K, k = tid % IX_K;
    const int i0 = blockIdx.y * IX_R;
    const int t0 = blockIdx.x * IX_K;
    if (tid < IX_R) pos_s[tid] = i0 + tid < m ? pos[i0 + tid] : -1;
    for (int e = tid; e < IX_K * dim; e += IX_THREADS) {
        const int kk = e / dim, d = e % dim;
        const int tk = t0 + kk;
        ks[kk * IX_LD + d] = tk < T ? keys[(long)tk * dim + d] : 0.0f;
    }
    __syncthreads();
    int last = -1;
    for (int rr = 0; rr < IX_R; ++rr) last = max(last, pos_s[rr]);
    if (t0 > last) return;  // the same for every thread of the block: no row sees this tile
    const int i = i0 + r, t = t0 + k;
    const bool live = i < m && t <= pos_s[r];
    float s = 0.0f;
    for (int h = 0; h < heads; ++h) {
        __syncthreads();  // the previous head's queries have been read
        for (int e = tid; e < IX_R * dim; e += IX_THREADS) {
            const int rr = e / dim, d = e % dim;
            const int ii = i0 + rr;
            qs[rr * IX_LD + d] = ii < m ? q[((long)ii * heads + h) * dim + d] : 0.0f;
        }
        __syncthreads();
        const float d = ix_dot(qs + r * IX_LD, ks + k * IX_LD, dim);
        const float x = fmaxf(__fmul_rn(d, qk_scale), 0.0f);
        if (live) s = __fadd_rn(s, __fmul_rn(w[(long)i * heads + h], x));
    }
    if (live) out[(long)i * T + t] = s;
}

// The same scores for few rows (decode, MTP and verify steps: index.rs sends m <= FEW_ROWS here).
// The tiled kernel above computes a 16-row tile per key tile, so one row left 15 of 16
// threads idle (0.35 ms per layer step after an 8k prompt on the H200, more than the CPU's 16
// cores took). Here warp kk of a block owns key t0 + kk and lane hl head h0 + hl of each pass
// of IX_FH heads: each lane takes its head's dot product in the canonical order above, the
// products w_h · relu(·) go to shared memory, and lane 0 adds them into the score in increasing
// h — the same operations in the same order, so the same bits as the tiled kernel and the CPU.
#define IX_FK 8    // keys per block: one warp each
#define IX_FH 32   // heads per pass: one lane each

extern "C" __global__ void __launch_bounds__(IX_FK * IX_FH) dsa_index_scores_few(
    const float* __restrict__ q, const float* __restrict__ w, const float* __restrict__ keys,
    const int* __restrict__ pos, float* __restrict__ out, int m, int heads, int dim, int T,
    float qk_scale) {
    __shared__ float qs[IX_FH * IX_LD];
    __shared__ float ks[IX_FK * IX_LD];
    __shared__ float ps[IX_FK][IX_FH];

    const int tid = threadIdx.x;
    const int kk = tid / IX_FH, hl = tid % IX_FH;
    const int t0 = blockIdx.x * IX_FK;
    const int t = t0 + kk;
    for (int e = tid; e < IX_FK * dim; e += IX_FK * IX_FH) {
        const int k2 = e / dim, d = e % dim;
        const int tk = t0 + k2;
        ks[k2 * IX_LD + d] = tk < T ? keys[(long)tk * dim + d] : 0.0f;
    }
    for (int i = 0; i < m; ++i) {
        const int p = pos[i];
        if (t0 > p) continue;  // the same for every thread of the block: no key here is visible
        float s = 0.0f;
        for (int h0 = 0; h0 < heads; h0 += IX_FH) {
            __syncthreads();  // the keys are staged; the previous pass's queries have been read
            for (int e = tid; e < IX_FH * dim; e += IX_FK * IX_FH) {
                const int hh = e / dim, d = e % dim;
                const int h = h0 + hh;
                qs[hh * IX_LD + d] = h < heads ? q[((long)i * heads + h) * dim + d] : 0.0f;
            }
            __syncthreads();
            const int h = h0 + hl;
            const float d = ix_dot(qs + hl * IX_LD, ks + kk * IX_LD, dim);
            const float x = fmaxf(__fmul_rn(d, qk_scale), 0.0f);
            ps[kk][hl] = h < heads ? __fmul_rn(w[(long)i * heads + h], x) : 0.0f;
            __syncwarp();
            if (hl == 0) {
                const int n = min(IX_FH, heads - h0);
                for (int hh = 0; hh < n; ++hh) s = __fadd_rn(s, ps[kk][hh]);
            }
            __syncwarp();
        }
        if (hl == 0 && t <= p) out[(long)i * T + t] = s;
    }
}
