// The absorbed MLA form of decode, MTP and verify rows (absorbed.rs): attention straight over a
// sequence's cached latents mirrored in VRAM, the K up-projection folded into the query and the
// V up-projection into the output — the CPU's `attention/absorbed.rs`, in five launches:
//   1. absorbed_qlat_<fmt>:  q_lat[r][h][c] = sum_j q_nope[r][h][j] * W_UK[h][j][c]
//   2. absorbed_scores:      s[r][h][k] = (q_lat[r][h] . latent[t_k] + q_pe[r][h] . k_pe[t_k]) * scale
//   3. absorbed_softmax:     p[r][h][:] = softmax(s[r][h][:])
//   4. absorbed_weighted:    o_lat[r][h][c] = sum_k p[r][h][k] * latent[t_k][c]
//   5. absorbed_uv_<fmt>:    out[r][h][v] = sum_c W_UV[h][v][c] * o_lat[r][h][c]
// kv_b (W) is read in its stored bytes: rows h*(dn+dv) + j are W_UK[h][j], rows h*(dn+dv) + dn + v
// are W_UV[h][v]; every weight is dequantised to the CPU's f32 value (code * scale, rounded), as
// gemv.cu's `exact` order does (value_at, scale_index).
//
// Accumulation order (reproducible; parity with the CPU by tolerance):
//   q_lat: one fma chain over j = 0 .. dn-1 in increasing j (the CPU: the same order, its
//          scaled_add multiply-then-add);
//   score: a = fma chain over the latent dims in increasing c, b = fma chain over the rope dims in
//          increasing d, s = (a + b) * scale (the CPU: two canonical 16-lane dots);
//   softmax: the max, e_k = expf(s_k - max), their sum in a fixed tree over the block's 256
//          threads (thread i sums keys i, i+256, … in order, then pairs by halving), p_k = e_k * (1/sum)
//          (the CPU: a sequential sum);
//   o_lat: slice j of 8 sums keys j, j+8, j+16, … of the row's list in order by fma, then the
//          slices are added ((0+1)+(2+3))+((4+5)+(6+7)) (the CPU: one chain in list order);
//   out:   lane L sums columns L, L+32, … by fma, then the butterfly xor 16, 8, 4, 2, 1.
// Each row's result depends only on its query, its keys and the weights, never on the other rows.

#define ABS_KEYS 16           // keys per score block
#define ABS_MAX_RANK 512      // latent width the score block stages (GLM-5.x: 512)
#define ABS_MAX_DR 128        // rope width the score block stages (GLM-5.x: 64)
#define ABS_SOFTMAX_THREADS 256
#define ABS_COLS 32           // latent columns per weighted-sum block
#define ABS_HEADS 8           // heads per weighted-sum block
#define ABS_SLICES 8          // key slices per weighted-sum block (ABS_COLS × ABS_SLICES threads)
#define ABS_CHUNK 256         // keys per weighted-sum stage (a multiple of ABS_SLICES)

// One decode row: its sequence's mirrored cache and the keys it attends.
struct AbsRow {
    u64 latent;  // keys held × rank f32
    u64 kpe;     // keys held × dr f32
    int nkeys;   // keys attended
    int list;    // offset of its key indices in the launch's list, or -1: keys 0 .. nkeys-1
};

__device__ __forceinline__ int abs_key(const AbsRow& row, const int* list, int k) {
    return row.list < 0 ? k : list[row.list + k];
}

// 1. q_lat: grid (ceil(rank/128), heads, rows), block 128; thread c of the latent width.
template <int F>
__device__ __forceinline__ void absorbed_qlat(const float* q, const u8* W, const float* S,
                                              float* q_lat, int heads, int dn, int dr, int dv,
                                              int rank, int row_bytes, int row_scales, u32 gmagic,
                                              int gshift) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int h = blockIdx.y, r = blockIdx.z;
    if (c >= rank) return;
    const float* qn = q + ((u64)r * heads + h) * (dn + dr);
    const int sidx = IsQuant<F>::V ? scale_index((u32)c, gmagic, gshift) : 0;
    float acc = 0.0f;
    // Unrolled so that several rows' loads are in flight: each iteration's weight comes from L2.
#pragma unroll 8
    for (int j = 0; j < dn; j++) {
        const u64 wr = (u64)h * (dn + dv) + j;
        float w = value_at<F>(W + wr * row_bytes, c);
        if (IsQuant<F>::V) w = __fmul_rn(w, __ldg(S + wr * row_scales + sidx));
        acc = fmaf(__ldg(qn + j), w, acc);
    }
    q_lat[((u64)r * heads + h) * rank + c] = acc;
}

// 5. out = W_UV · o_lat: grid (ceil(heads*dv/4), rows), block 128; one warp per (head, v).
template <int F>
__device__ __forceinline__ void absorbed_uv(const float* o_lat, const u8* W, const float* S,
                                            float* out, int heads, int dn, int dv, int rank,
                                            int row_bytes, int row_scales, u32 gmagic, int gshift) {
    const int lane = threadIdx.x & 31;
    const int hv = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int r = blockIdx.y;
    if (hv >= heads * dv) return;
    const int h = hv / dv, v = hv % dv;
    const u64 wr = (u64)h * (dn + dv) + dn + v;
    const u8* row = W + wr * row_bytes;
    const float* ol = o_lat + ((u64)r * heads + h) * rank;
    float acc = 0.0f;
    for (int c = lane; c < rank; c += 32) {
        float w = value_at<F>(row, c);
        if (IsQuant<F>::V)
            w = __fmul_rn(w, __ldg(S + wr * row_scales + scale_index((u32)c, gmagic, gshift)));
        acc = fmaf(w, __ldg(ol + c), acc);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) out[((u64)r * heads + h) * dv + v] = acc;
}

#define ABSORBED_FMT(NAME, F)                                                                     \
    extern "C" __global__ void __launch_bounds__(128)                                             \
        absorbed_qlat_##NAME(const float* q, const u8* W, const float* S, float* q_lat, int heads, \
                             int dn, int dr, int dv, int rank, int row_bytes, int row_scales,     \
                             u32 gmagic, int gshift) {                                            \
        absorbed_qlat<F>(q, W, S, q_lat, heads, dn, dr, dv, rank, row_bytes, row_scales, gmagic,  \
                         gshift);                                                                 \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(128)                                             \
        absorbed_uv_##NAME(const float* o_lat, const u8* W, const float* S, float* out, int heads, \
                           int dn, int dv, int rank, int row_bytes, int row_scales, u32 gmagic,   \
                           int gshift) {                                                          \
        absorbed_uv<F>(o_lat, W, S, out, heads, dn, dv, rank, row_bytes, row_scales, gmagic,      \
                       gshift);                                                                   \
    }

ABSORBED_FMT(f32, FMT_F32)
ABSORBED_FMT(bf16, FMT_BF16)
ABSORBED_FMT(f16, FMT_F16)
ABSORBED_FMT(i8, FMT_I8)
ABSORBED_FMT(i4, FMT_I4)

// 2. Scores: grid (ceil(max keys / ABS_KEYS), rows), block 256. The block stages ABS_KEYS keys'
// latents and rope keys in shared memory (rows padded by one float: thread k of a warp reads
// bank k + c), then thread (hh, k) = (tid / 16, tid % 16) scores key k for heads hh, hh + 16, ….
// `scores` is rows × heads × stride.
extern "C" __global__ void __launch_bounds__(256)
    absorbed_scores(const AbsRow* rows, const int* list, const float* q, const float* q_lat,
                    float* scores, int heads, int dn, int dr, int rank, int stride, float scale) {
    __shared__ float lat_s[ABS_KEYS * (ABS_MAX_RANK + 1)];
    __shared__ float kpe_s[ABS_KEYS * (ABS_MAX_DR + 1)];
    const int r = blockIdx.y;
    const AbsRow row = rows[r];
    const int k0 = blockIdx.x * ABS_KEYS;
    if (k0 >= row.nkeys) return;
    const int tid = threadIdx.x;
    const int n = min(ABS_KEYS, row.nkeys - k0);
    const float* L = (const float*)row.latent;
    const float* P = (const float*)row.kpe;
    for (int i = tid; i < n * rank; i += blockDim.x) {
        const int kk = i / rank, c = i - kk * rank;
        lat_s[kk * (rank + 1) + c] = __ldg(L + (u64)abs_key(row, list, k0 + kk) * rank + c);
    }
    for (int i = tid; i < n * dr; i += blockDim.x) {
        const int kk = i / dr, d = i - kk * dr;
        kpe_s[kk * (dr + 1) + d] = __ldg(P + (u64)abs_key(row, list, k0 + kk) * dr + d);
    }
    __syncthreads();
    const int kk = tid & (ABS_KEYS - 1), hh = tid / ABS_KEYS;
    if (kk >= n) return;
    const float* ls = lat_s + kk * (rank + 1);
    const float* ps = kpe_s + kk * (dr + 1);
    for (int h = hh; h < heads; h += blockDim.x / ABS_KEYS) {
        const float* ql = q_lat + ((u64)r * heads + h) * rank;
        const float* qp = q + ((u64)r * heads + h) * (dn + dr) + dn;
        float a = 0.0f, b = 0.0f;
        for (int c = 0; c < rank; c++) a = fmaf(__ldg(ql + c), ls[c], a);
        for (int d = 0; d < dr; d++) b = fmaf(__ldg(qp + d), ps[d], b);
        scores[((u64)r * heads + h) * stride + k0 + kk] = __fmul_rn(__fadd_rn(a, b), scale);
    }
}

// 3. Softmax in place over each (row, head)'s nkeys scores: grid (heads, rows), block 256.
__device__ __forceinline__ float abs_block_reduce(float v, float* red, bool is_max) {
    const int tid = threadIdx.x;
    red[tid] = v;
    __syncthreads();
    for (int s = ABS_SOFTMAX_THREADS / 2; s > 0; s >>= 1) {
        if (tid < s) red[tid] = is_max ? fmaxf(red[tid], red[tid + s]) : red[tid] + red[tid + s];
        __syncthreads();
    }
    const float out = red[0];
    __syncthreads();
    return out;
}

extern "C" __global__ void __launch_bounds__(ABS_SOFTMAX_THREADS)
    absorbed_softmax(const AbsRow* rows, float* scores, int heads, int stride) {
    __shared__ float red[ABS_SOFTMAX_THREADS];
    const int h = blockIdx.x, r = blockIdx.y, tid = threadIdx.x;
    const int n = rows[r].nkeys;
    float* s = scores + ((u64)r * heads + h) * stride;
    float mx = MLA_NEG_INF;
    for (int k = tid; k < n; k += ABS_SOFTMAX_THREADS) mx = fmaxf(mx, s[k]);
    mx = abs_block_reduce(mx, red, true);
    if (mx == MLA_NEG_INF) {
        for (int k = tid; k < n; k += ABS_SOFTMAX_THREADS) s[k] = 0.0f;
        return;
    }
    float sum = 0.0f;
    for (int k = tid; k < n; k += ABS_SOFTMAX_THREADS) {
        const float e = expf(s[k] - mx);
        s[k] = e;
        sum += e;
    }
    sum = abs_block_reduce(sum, red, false);
    const float inv = 1.0f / sum;
    for (int k = tid; k < n; k += ABS_SOFTMAX_THREADS) s[k] = s[k] * inv;
}

// 4. o_lat: grid (ceil(rank / ABS_COLS), ceil(heads / ABS_HEADS), rows), block ABS_COLS ×
// ABS_SLICES: thread (slice, col) sums p[h][k] * latent[t_k][c] for ABS_HEADS heads over the
// keys k ≡ slice (mod ABS_SLICES) — a warp reads 32 consecutive floats of one key, and eight
// warps keep loads in flight — with ABS_CHUNK keys' probabilities and indices staged in shared
// memory at a time; the slices' sums are then added in a fixed tree.
extern "C" __global__ void __launch_bounds__(ABS_COLS * ABS_SLICES)
    absorbed_weighted(const AbsRow* rows, const int* list, const float* p, float* o_lat,
                      int heads, int rank, int stride) {
    __shared__ float p_s[ABS_HEADS][ABS_CHUNK];
    __shared__ int t_s[ABS_CHUNK];
    __shared__ float part[ABS_SLICES][ABS_HEADS][ABS_COLS];
    const int r = blockIdx.z, h0 = blockIdx.y * ABS_HEADS, tid = threadIdx.x;
    const int col = tid % ABS_COLS, slice = tid / ABS_COLS;
    const int c = blockIdx.x * ABS_COLS + col;
    const AbsRow row = rows[r];
    const float* L = (const float*)row.latent;
    float acc[ABS_HEADS];
#pragma unroll
    for (int i = 0; i < ABS_HEADS; i++) acc[i] = 0.0f;
    for (int k0 = 0; k0 < row.nkeys; k0 += ABS_CHUNK) {
        const int n = min(ABS_CHUNK, row.nkeys - k0);
        __syncthreads();
        for (int i = tid; i < ABS_HEADS * ABS_CHUNK; i += ABS_COLS * ABS_SLICES) {
            const int hh = i / ABS_CHUNK, kk = i - hh * ABS_CHUNK;
            p_s[hh][kk] = (h0 + hh < heads && kk < n)
                              ? p[((u64)r * heads + h0 + hh) * stride + k0 + kk]
                              : 0.0f;
        }
        for (int kk = tid; kk < n; kk += ABS_COLS * ABS_SLICES) t_s[kk] = abs_key(row, list, k0 + kk);
        __syncthreads();
        if (c < rank) {
#pragma unroll 4
            for (int kk = slice; kk < n; kk += ABS_SLICES) {
                const float l = __ldg(L + (u64)t_s[kk] * rank + c);
#pragma unroll
                for (int i = 0; i < ABS_HEADS; i++) acc[i] = fmaf(p_s[i][kk], l, acc[i]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < ABS_HEADS; i++) part[slice][i][col] = acc[i];
    __syncthreads();
    if (slice == 0 && c < rank) {
#pragma unroll
        for (int i = 0; i < ABS_HEADS; i++) {
            if (h0 + i >= heads) break;
            const float a = __fadd_rn(__fadd_rn(part[0][i][col], part[1][i][col]),
                                      __fadd_rn(part[2][i][col], part[3][i][col]));
            const float b = __fadd_rn(__fadd_rn(part[4][i][col], part[5][i][col]),
                                      __fadd_rn(part[6][i][col], part[7][i][col]));
            o_lat[((u64)r * heads + h0 + i) * rank + c] = __fadd_rn(a, b);
        }
    }
}
