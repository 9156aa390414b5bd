// The SwiGLU combine of MLPs on the GPU (swiglu.rs): g[i] = silu(g[i]) · u[i] with
// silu(z) = z / (1 + exp(−z)), the CPU's formula (nectar-kernels' `silu`), each operation a
// separately rounded f32 (the _rn intrinsics keep NVRTC from fusing them); `expf` is CUDA's
// (within 2 ulp of the CPU's libm), so results agree within that, not bit for bit.
//
// Layout: g and u are n floats each (the gate and up products of a batch of MLPs, row-major).

extern "C" __global__ void swiglu_combine(float* __restrict__ g, const float* __restrict__ u,
                                          long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float z = g[i];
        float s = __fdiv_rn(z, __fadd_rn(1.0f, expf(-z)));
        g[i] = __fmul_rn(s, u[i]);
    }
}
