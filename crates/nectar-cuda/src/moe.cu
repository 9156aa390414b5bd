// A MoE layer's gathers and weighted combine on the GPU (moe.rs), so its activations cross PCIe
// once each way per layer.

// dst[p][h] = x[rows[p]][h]: the rows each routed expert runs on, expert after expert.
extern "C" __global__ void moe_gather(float* __restrict__ dst, const float* __restrict__ x,
                                      const unsigned* __restrict__ rows, long long pairs,
                                      long long hidden) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < pairs * hidden;
         i += stride) {
        long long p = i / hidden, h = i - p * hidden;
        dst[i] = x[(long long)rows[p] * hidden + h];
    }
}

// out[r][h] = ((0 + w[r][0]·y[pair[r][0]][h]) + w[r][1]·y[pair[r][1]][h] + …) + shared[r][h]:
// the host's combine (moe.rs in nectar-model) in its order, each operation separately rounded
// (the _rn intrinsics keep NVRTC from fusing them), so the same bits. A pair of 0xffffffff is a
// slot the row does not use.
extern "C" __global__ void moe_combine(float* __restrict__ out, const float* __restrict__ y,
                                       const float* __restrict__ shared,
                                       const unsigned* __restrict__ pair,
                                       const float* __restrict__ weight, long long m, int k,
                                       long long hidden) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < m * hidden;
         i += stride) {
        long long r = i / hidden, h = i - r * hidden;
        float acc = 0.0f;
        for (int s = 0; s < k; s++) {
            unsigned p = pair[r * k + s];
            if (p != 0xffffffffu)
                acc = __fadd_rn(acc, __fmul_rn(weight[r * k + s], y[(long long)p * hidden + h]));
        }
        out[i] = __fadd_rn(acc, shared[i]);
    }
}
