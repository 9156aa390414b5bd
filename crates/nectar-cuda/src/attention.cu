// MLA attention of a prefill chunk in the reconstructed form (attention.rs; the model's
// `Attention::reconstructed` is the CPU reference): per head, the scores of each query row
// against the keys it may see, softmax in f32, times V.
//
// Layout (f32, row-major):
//   q:    m × heads × (dn + dr)   the chunk's queries (RoPE already applied to the last dr dims)
//   kv:   T × heads × (dn + dv)   kv_b's output for the sequence's T keys: [k_nope ; v] per head
//   kpe:  T × dr                  the rope keys (shared by every head)
//   pos:  m                       each row's position; it sees keys 0 ..= pos
//   moff: m                       -1: every key 0 ..= pos; else the word offset in `bits` of the
//                                 row's DSA selection, a bitmap over the T keys (bit t of word t/32)
//   out:  m × heads × dv
//
// Work split: one block of 256 threads per (tile of MLA_R = 16 query rows, head); it walks the
// keys 0 ..= max(pos of its rows) in tiles of MLA_K = 16 (a tile no row may see is skipped).
// Thread (r, k) = (tid / 16, tid % 16) computes the score of row r against key k of the tile;
// thread (r, c0 = tid % 16) owns the output columns c0, c0 + 16, … of row r.
//
// Accumulation order (reproducible, not equal to the CPU's):
//   score(r, t) = (Σ_{d < dn} q[d]·k_nope[t][d] + Σ_{d < dr} q[dn + d]·kpe[t][d]) · scale, one
//                 f32 fused multiply-add chain in increasing d (nope dims first);
//   softmax online over the key tiles in increasing position: per tile, mx' = max(mx, tile's
//                 scores), p = expf(s − mx'), l = l·expf(mx − mx') + Σ p (in increasing key
//                 order), acc = acc·expf(mx − mx') + Σ p·v (fma, increasing key order);
//   out = acc / l.
// Masked keys (t > pos, or outside the row's selection) contribute exactly nothing.

#define MLA_R 16
#define MLA_K 16
#define MLA_THREADS 256
#define MLA_DMAX 256            // largest dn + dr and dv (attention.rs checks)
#define MLA_LD (MLA_DMAX + 1)   // shared row stride: a column walk hits 16 different banks
#define MLA_NEG_INF (-__int_as_float(0x7f800000))  // NVRTC has no <math.h> INFINITY

extern "C" __global__ void __launch_bounds__(MLA_THREADS) mla_prefill_attn(
    const float* __restrict__ q, const float* __restrict__ kv, const float* __restrict__ kpe,
    const int* __restrict__ pos, const int* __restrict__ moff, const unsigned int* __restrict__ bits,
    float* __restrict__ out, int m, int heads, int dn, int dr, int dv, float scale) {
    __shared__ float qs[MLA_R * MLA_LD];
    __shared__ float ks[MLA_K * MLA_LD];   // the key tile, then the value tile
    __shared__ float ps[MLA_R * (MLA_K + 1)];
    __shared__ float mx_s[MLA_R], l_s[MLA_R], f_s[MLA_R];
    __shared__ int pos_s[MLA_R], off_s[MLA_R];

    const int tid = threadIdx.x;
    const int r = tid / MLA_K, kk = tid % MLA_K;
    const int i0 = blockIdx.x * MLA_R;
    const int h = blockIdx.y;
    const int dq = dn + dr;
    const long kvw = (long)heads * (dn + dv);

    if (tid < MLA_R) {
        const int i = i0 + tid;
        pos_s[tid] = i < m ? pos[i] : -1;
        off_s[tid] = i < m ? moff[i] : -1;
        mx_s[tid] = MLA_NEG_INF;
        l_s[tid] = 0.0f;
    }
    for (int e = tid; e < MLA_R * dq; e += MLA_THREADS) {
        const int rr = e / dq, d = e % dq;
        const int i = i0 + rr;
        qs[rr * MLA_LD + d] = i < m ? q[((long)i * heads + h) * dq + d] : 0.0f;
    }
    __syncthreads();
    int last = -1;
    for (int rr = 0; rr < MLA_R; ++rr) last = max(last, pos_s[rr]);

    float acc[MLA_DMAX / MLA_K];
#pragma unroll
    for (int j = 0; j < MLA_DMAX / MLA_K; ++j) acc[j] = 0.0f;

    for (int t0 = 0; t0 <= last; t0 += MLA_K) {
        const int t = t0 + kk;
        const int p = pos_s[r];
        bool see = p >= 0 && t <= p;
        if (see && off_s[r] >= 0) see = (bits[off_s[r] + (t >> 5)] >> (t & 31)) & 1u;
        if (!__syncthreads_or(see)) continue;
        // Key tile: [k_nope ; kpe] of keys t0 .. t0 + 15.
        for (int e = tid; e < MLA_K * dq; e += MLA_THREADS) {
            const int k = e / dq, d = e % dq;
            const int tk = t0 + k;
            float v = 0.0f;
            if (tk <= last) v = d < dn ? kv[tk * kvw + (long)h * (dn + dv) + d] : kpe[(long)tk * dr + (d - dn)];
            ks[k * MLA_LD + d] = v;
        }
        __syncthreads();
        float s = MLA_NEG_INF;
        if (see) {
            float a = 0.0f;
            for (int d = 0; d < dq; ++d) a = fmaf(qs[r * MLA_LD + d], ks[kk * MLA_LD + d], a);
            s = a * scale;
        }
        ps[r * (MLA_K + 1) + kk] = s;
        __syncthreads();
        // Per row: the new running max, the probabilities, the rescale factor.
        if (tid < MLA_R) {
            float* pr = &ps[tid * (MLA_K + 1)];
            float mx = mx_s[tid];
            for (int k = 0; k < MLA_K; ++k) mx = fmaxf(mx, pr[k]);
            float f = 1.0f, sum = 0.0f;
            if (mx != MLA_NEG_INF) {
                f = mx_s[tid] == MLA_NEG_INF ? 0.0f : expf(mx_s[tid] - mx);
                for (int k = 0; k < MLA_K; ++k) {
                    const float e = pr[k] == MLA_NEG_INF ? 0.0f : expf(pr[k] - mx);
                    pr[k] = e;
                    sum += e;
                }
            } else {
                for (int k = 0; k < MLA_K; ++k) pr[k] = 0.0f;
            }
            mx_s[tid] = mx;
            l_s[tid] = l_s[tid] * f + sum;
            f_s[tid] = f;
        }
        // Value tile into the same buffer (every score has been read).
        for (int e = tid; e < MLA_K * dv; e += MLA_THREADS) {
            const int k = e / dv, d = e % dv;
            const int tk = t0 + k;
            ks[k * MLA_LD + d] = tk <= last ? kv[tk * kvw + (long)h * (dn + dv) + dn + d] : 0.0f;
        }
        __syncthreads();
        const float f = f_s[r];
        const float* pr = &ps[r * (MLA_K + 1)];
#pragma unroll
        for (int j = 0; j < MLA_DMAX / MLA_K; ++j) {
            const int c = kk + j * MLA_K;
            if (c < dv) {
                float a = acc[j] * f;
                for (int k = 0; k < MLA_K; ++k) a = fmaf(pr[k], ks[k * MLA_LD + c], a);
                acc[j] = a;
            }
        }
        __syncthreads();
    }
    const int i = i0 + r;
    if (i < m) {
        const float l = l_s[r];
#pragma unroll
        for (int j = 0; j < MLA_DMAX / MLA_K; ++j) {
            const int c = kk + j * MLA_K;
            if (c < dv) out[((long)i * heads + h) * dv + c] = l > 0.0f ? acc[j] / l : 0.0f;
        }
    }
}
