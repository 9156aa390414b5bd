// MLA attention of a prefill chunk in the reconstructed form (attention.rs; the model's
// `Attention::reconstructed` is the CPU reference): per head, the scores of each query row
// against the keys it may see, softmax in f32, times V — flash-attention style, on the tensor
// cores. Compiled by NVRTC after gemv.cu (u32 comes from there).
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
// Work split: one block of 8 warps per (tile of FA_R = 64 query rows, head), its queries in
// shared memory; it walks the keys 0 ..= max(pos of its rows) in tiles of FA_K = 32 (a tile no
// row may see is skipped; a tile is one word of a selection bitmap). Per tile:
//   1. scores S = Q·Kᵀ (64 × 32): warp w computes rows 16·(w/2) … +16 × keys 16·(w%2) … +16;
//   2. online softmax: four threads per row, eight keys each; the probabilities replace S;
//   3. O += P·V: warp w owns rows 16·(w/2) … +16 × output columns of half w%2 of dv.
// The key tile and then the value tile share one buffer.
//
// Precision: mma.sync.m16n8k8 with tf32 inputs (10 explicit mantissa bits) and f32 accumulation.
// Every f32 operand x is split into two tf32 parts, x = hi + lo with hi = x rounded half away
// from zero to tf32 and lo = x − hi (exact) truncated to tf32, which keeps x to ~2^-21 of
// itself, and a product is a·b ≈ a_lo·b_hi + a_hi·b_lo + a_hi·b_hi (a_lo·b_lo, dropped, is
// below 2^-22 of |a·b|):
// three tensor-core products for one f32 product, at about f32's accuracy (tested against an
// f64 reference to 1e-5 of max|v|; plain tf32 would miss that by two orders).
//
// Accumulation order (reproducible, not equal to the CPU's):
//   score(r, t) = scale · Σ over steps of 8 dims in increasing order of p, where
//                 p = mma(a_hi, b_hi, mma(a_hi, b_lo, mma(a_lo, b_hi, 0))) over the step's dims
//                 (nope dims first, then rope; the tensor core sums a step's products in its
//                 own order), added to the running f32 sum with one fadd;
//   softmax online over the key tiles in increasing position: per tile, mx' = max(mx, tile's
//                 scores), p = expf(s − mx'), f = expf(mx − mx'), l = l·f + Σ p (each of the
//                 four threads of a row sums its 8 keys in order, then (s0 + s1) + (s2 + s3));
//   O(r, c) = O·f + Σ over steps of 8 keys of the same three-product step p (P split like
//                 any operand); out = O / l.
// Starting each step's products from 0 and adding them to the running sum in f32 keeps the
// tensor core's internal truncation relative to the step's terms (gemm.cu measured why).
// Masked keys (t > pos, or outside the row's selection) contribute exactly nothing: their
// probability is 0 and their value rows are finite.

#define FA_R 64
#define FA_K 32
#define FA_THREADS 256
#define FA_NT 16                // largest count of 8-column output tiles per warp (dv ≤ 256)
#define FA_LDP (FA_K + 4)       // shared stride of the probabilities (≡ 4 mod 8: no conflicts)
#define MLA_NEG_INF (-__int_as_float(0x7f800000))  // NVRTC has no <math.h> INFINITY

__device__ __forceinline__ void split_tf32(float x, u32& hi, u32& lo) {
    // Round half away from zero to tf32 in two integer operations (cvt.rna.tf32.f32 is a
    // longer sequence on sm_90 that also guards infinities and NaNs, which never reach here:
    // operands are finite queries, keys, values and probabilities).
    hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi)) & 0xffffe000u;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The A fragment (16 × 8, row-major at `a` with stride `ld`) of lane (g, t) = (lane / 4,
// lane % 4): rows g and g + 8, columns t and t + 4, split into tf32 parts.
__device__ __forceinline__ void fa_load_a(const float* a, int ld, u32 (&hi)[4], u32 (&lo)[4]) {
    split_tf32(a[0], hi[0], lo[0]);
    split_tf32(a[8 * ld], hi[1], lo[1]);
    split_tf32(a[4], hi[2], lo[2]);
    split_tf32(a[8 * ld + 4], hi[3], lo[3]);
}

// One step of an f32 product on the tensor cores: acc += A·B over 8 columns of A, three
// products (small terms first) started from 0 (see the header).
__device__ __forceinline__ void fa_step(float (&acc)[4], const u32 (&ah)[4], const u32 (&al)[4],
                                        float b0, float b1) {
    u32 bh0, bl0, bh1, bl1;
    split_tf32(b0, bh0, bl0);
    split_tf32(b1, bh1, bl1);
    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_tf32(p, al, bh0, bh1);
    mma_tf32(p, ah, bl0, bl1);
    mma_tf32(p, ah, bh0, bh1);
#pragma unroll
    for (int e = 0; e < 4; e++) acc[e] += p[e];
}

// Shared memory (dynamic, in floats; attention.rs sizes it the same way):
//   queries FA_R × ldq | key or value tile FA_K × max(ldq, ldv) | probabilities FA_R × FA_LDP
//   | per row: rescale factor, sum, visible-key word, position, selection offset.
// ldq = dqp + 4 and ldv = dvp + 8 make every fragment load hit 32 different banks.
extern "C" __global__ void __launch_bounds__(FA_THREADS, 2) mla_prefill_attn(
    const float* __restrict__ q, const float* __restrict__ kv, const float* __restrict__ kpe,
    const int* __restrict__ pos, const int* __restrict__ moff, const unsigned int* __restrict__ bits,
    float* __restrict__ out, int m, int heads, int dn, int dr, int dv, float scale) {
    extern __shared__ float fa_smem[];
    const int dq = dn + dr;
    const int dqp = (dq + 7) & ~7;   // whole 8-dim steps
    const int dvp = (dv + 15) & ~15; // two halves of whole 8-column tiles
    const int ldq = dqp + 4, ldv = dvp + 8;
    float* qs = fa_smem;
    float* kvs = qs + FA_R * ldq;
    float* ps = kvs + FA_K * max(ldq, ldv);
    float* f_s = ps + FA_R * FA_LDP;
    float* l_s = f_s + FA_R;
    u32* w_s = (u32*)(l_s + FA_R);
    int* pos_s = (int*)(w_s + FA_R);
    int* off_s = pos_s + FA_R;

    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int rg = (warp >> 1) * 16; // the warp's first row in the tile
    const int half = warp & 1;
    const int i0 = blockIdx.x * FA_R;
    const int h = blockIdx.y;
    const long kvw = (long)heads * (dn + dv);
    const float* kvh = kv + (long)h * (dn + dv);

    if (tid < FA_R) {
        const int i = i0 + tid;
        pos_s[tid] = i < m ? pos[i] : -1;
        off_s[tid] = i < m ? moff[i] : -1;
    }
    // Loads walk one row per warp and its columns by lane: coalesced, no division.
    for (int r = warp; r < FA_R; r += FA_THREADS / 32) {
        const int i = i0 + r;
        const float* qr = q + ((long)i * heads + h) * dq;
        for (int d = lane; d < dqp; d += 32) qs[r * ldq + d] = i < m && d < dq ? qr[d] : 0.0f;
    }
    __syncthreads();
    int last = -1;
    for (int r = 0; r < FA_R; ++r) last = max(last, pos_s[r]);

    // Softmax state of row sr, kept by its four threads (all four hold the same values).
    const int sr = tid >> 2, sq = tid & 3;
    float mx = MLA_NEG_INF, l = 0.0f;
    // Output tiles: rows rg + g, rg + g + 8; columns c0 + 8·j + 2t, +1.
    const int ntv = dvp / 16;
    const int c0 = half * (dvp / 2);
    float o[FA_NT][4];
#pragma unroll
    for (int j = 0; j < FA_NT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

    for (int t0 = 0; t0 <= last; t0 += FA_K) {
        // The keys of this tile each row sees, as one word: its selection's, cut at its position.
        bool any = false;
        if (tid < FA_R) {
            const int p = pos_s[tid];
            u32 w = 0;
            if (p >= t0) {
                w = off_s[tid] < 0 ? 0xffffffffu : bits[off_s[tid] + (t0 >> 5)];
                const int n = p - t0;
                if (n < 31) w &= (2u << n) - 1u;
            }
            w_s[tid] = w;
            any = w != 0;
        }
        if (!__syncthreads_or(any)) continue;
        // 1. The key tile [k_nope ; kpe] of keys t0 … t0 + 31 (zero past `last` and past dq).
        for (int k = warp; k < FA_K; k += FA_THREADS / 32) {
            const int tk = t0 + k;
            for (int d = lane; d < dqp; d += 32) {
                float v = 0.0f;
                if (tk <= last && d < dq)
                    v = d < dn ? kvh[tk * kvw + d] : kpe[(long)tk * dr + (d - dn)];
                kvs[k * ldq + d] = v;
            }
        }
        __syncthreads();
        {
            float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
            const float* qa = qs + (rg + g) * ldq + t;
            const float* kb = kvs + (half * 16 + g) * ldq + t;
            for (int k0 = 0; k0 < dqp; k0 += 8) {
                u32 ah[4], al[4];
                fa_load_a(qa + k0, ldq, ah, al);
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const float* b = kb + j * 8 * ldq + k0;
                    fa_step(s[j], ah, al, b[0], b[4]);
                }
            }
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int key = half * 16 + j * 8 + 2 * t;
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    const int r = rg + g + 8 * hr;
                    const u32 w = w_s[r];
                    float2 v;
                    v.x = (w >> key) & 1u ? s[j][2 * hr] * scale : MLA_NEG_INF;
                    v.y = (w >> (key + 1)) & 1u ? s[j][2 * hr + 1] * scale : MLA_NEG_INF;
                    *(float2*)&ps[r * FA_LDP + key] = v;
                }
            }
        }
        __syncthreads();
        // 2. Online softmax of row sr over keys 8·sq … +8; the value tile loads meanwhile.
        {
            float* pr = ps + sr * FA_LDP + sq * 8;
            float4 a = *(float4*)pr, b = *(float4*)(pr + 4);
            float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            float tm = MLA_NEG_INF;
#pragma unroll
            for (int k = 0; k < 8; k++) tm = fmaxf(tm, v[k]);
            tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 1));
            tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 2));
            const float nm = fmaxf(mx, tm);
            float f = 1.0f, sum = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const float e = nm == MLA_NEG_INF || v[k] == MLA_NEG_INF ? 0.0f : expf(v[k] - nm);
                v[k] = e;
                sum += e;
            }
            if (nm != MLA_NEG_INF) f = mx == MLA_NEG_INF ? 0.0f : expf(mx - nm);
            *(float4*)pr = make_float4(v[0], v[1], v[2], v[3]);
            *(float4*)(pr + 4) = make_float4(v[4], v[5], v[6], v[7]);
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            mx = nm;
            l = l * f + sum;
            if (sq == 0) f_s[sr] = f;
        }
        for (int k = warp; k < FA_K; k += FA_THREADS / 32) {
            const int tk = t0 + k;
            for (int c = lane; c < dvp; c += 32)
                kvs[k * ldv + c] = tk <= last && c < dv ? kvh[tk * kvw + dn + c] : 0.0f;
        }
        __syncthreads();
        // 3. O = O·f + P·V.
        {
            const float fa = f_s[rg + g], fb = f_s[rg + g + 8];
#pragma unroll
            for (int j = 0; j < FA_NT; j++) {
                o[j][0] *= fa;
                o[j][1] *= fa;
                o[j][2] *= fb;
                o[j][3] *= fb;
            }
            const float* pa = ps + (rg + g) * FA_LDP + t;
            const float* vb = kvs + t * ldv + c0 + g;
#pragma unroll
            for (int k0 = 0; k0 < FA_K; k0 += 8) {
                u32 ah[4], al[4];
                fa_load_a(pa + k0, FA_LDP, ah, al);
#pragma unroll
                for (int j = 0; j < FA_NT; j++) {
                    if (j < ntv) {
                        const float* b = vb + k0 * ldv + j * 8;
                        fa_step(o[j], ah, al, b[0], b[4 * ldv]);
                    }
                }
            }
        }
        __syncthreads();
    }
    if (sq == 0) l_s[sr] = l;
    __syncthreads();
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int r = rg + g + 8 * hr;
        const int i = i0 + r;
        if (i >= m) continue;
        const float lr = l_s[r];
        float* orow = out + ((long)i * heads + h) * dv;
#pragma unroll
        for (int j = 0; j < FA_NT; j++) {
            const int c = c0 + j * 8 + 2 * t;
            if (j < ntv) {
                if (c < dv) orow[c] = lr > 0.0f ? o[j][2 * hr] / lr : 0.0f;
                if (c + 1 < dv) orow[c + 1] = lr > 0.0f ? o[j][2 * hr + 1] / lr : 0.0f;
            }
        }
    }
}
