// The int4 GEMV lab: the model's gemv_q kernels (gemv_q.cu, compiled from the tree) as gemv.rs
// picked them before (4 warps per block, `q_tiles` of 1a462a9) and now (`q_kernel`: 4, 8 or 16
// warps by the column count, row tiles by the launch), each after the activation split as the
// model launches them (q_split, then the GEMV as its programmatic dependent), on GLM-5.2's
// expert and attention shapes at M = 1…8; rounds alternated, median per arm, outputs compared
// (bits differ where the warps do: they are in the accumulation order). Builds without a GPU:
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -I crates/nectar-cuda/src \
//       scripts/gpu-gemv-q-lab.cu -o lab      # then on the GPU machine: ./lab [M,M,...]
//
// Ratios are GB/s of weights + scales over the same run's `read_ref` (gemv.cu). RESULTS, "The
// int4 GEMV's warps per block", has what it measured and the variants tried before it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <cuda_runtime.h>
#include "gemv.cu"
#include "gemm.cu"
#include "gemv_q.cu"

#define CK(x)                                                                                     \
    do {                                                                                          \
        cudaError_t e = (x);                                                                      \
        if (e != cudaSuccess) {                                                                   \
            printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e));                 \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

typedef void (*KFn)(const Job*, int, int, int, int, int, u32, int, int);
#define K(T, G, W) (KFn) gemv_q_t##T##_g##G##_w##W
#define KG(T, W) {K(T, 1, W), K(T, 2, W), K(T, 3, W), K(T, 4, W)}
// Every kernel the model has (gemv_q.cu), by [T][W] and G.
static KFn kernel(int T, int W, int G) {
    static const KFn w4[3][4] = {KG(1, 4), KG(2, 4), KG(4, 4)};
    static const KFn w8[2][4] = {KG(1, 8), KG(4, 8)};
    static const KFn w16[4] = {K(4, 1, 16), K(4, 2, 16), K(2, 3, 16), K(2, 4, 16)};
    if (W == 4) return w4[T == 1 ? 0 : T == 2 ? 1 : 2][G - 1];
    if (W == 8) return w8[T == 1 ? 0 : 1][G - 1];
    return w16[G - 1];
}

// The kernel before this lab (4 warps; gemv.rs `q_tiles` of 1a462a9) and now (`q_kernel`).
static void old_kernel(int rows, int cols, int n, int G, int& T, int& W) {
    long r = (long)rows * n;
    W = 4;
    T = r < 24576 / 2 ? 1 : (r >= 24576 && cols >= 4096) ? 4 : 2;
}
static void new_kernel(int rows, int cols, int n, int G, int& T, int& W) {
    long r = (long)rows * n;
    if (cols > 12288) { T = G <= 2 ? 4 : 2; W = 16; }
    else if (cols > 4096) { T = r >= 24576 ? 4 : 1; W = 8; }
    else if (r < 24576 / 2) { T = 1; W = 4; }
    else if (G > 2) { T = 4; W = 4; }
    else { T = 2; W = 4; }
}

int main(int argc, char** argv) {
    CK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize >> 20);
    std::vector<int> ms_list = {1, 2, 3, 4, 6, 8};
    if (argc > 1) {
        ms_list.clear();
        for (char* p = strtok(argv[1], ","); p; p = strtok(nullptr, ",")) ms_list.push_back(atoi(p));
    }
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

    struct Shape {
        const char* name;
        int rows, cols, batch;
        bool packed;
    };
    std::vector<Shape> shapes = {
        {"gate_up x16", 2048, 6144, 16, true}, {"down x8", 6144, 2048, 8, true},
        {"q_b", 16384, 2048, 1, true},         {"o_proj", 6144, 16384, 1, true},
        {"kv_b", 28672, 512, 1, true},         {"kv_b stored", 28672, 512, 1, false},
        {"gate lone", 2048, 6144, 1, true},    {"shared gate_up x2", 2048, 6144, 2, true},
        {"indexer wq_b", 4096, 2048, 1, true}, {"kv_a", 576, 6144, 1, true},
    };
    for (auto& sh : shapes) {
        const int nsteps = sh.cols / 64, row_scales = sh.cols / 64, row_bytes = sh.cols / 2;
        size_t wb = (size_t)sh.rows * row_bytes, sb = (size_t)sh.rows * row_scales * 4;
        size_t per = (wb + sb) * sh.batch;
        int copies = std::max<size_t>(2, (size_t)(600ull << 20) / per + 1);
        u8* Wd;
        float *S, *X, *Y;
        Job* J;
        QSrc* srcs;
        u8* digits;
        CK(cudaMalloc(&Wd, wb * sh.batch * copies));
        CK(cudaMalloc(&S, sb * sh.batch * copies));
        CK(cudaMalloc(&X, 8ull * sh.cols * 4));
        CK(cudaMalloc(&Y, 8ull * sh.rows * 4 * sh.batch));
        CK(cudaMalloc(&J, sizeof(Job) * sh.batch * copies));
        CK(cudaMalloc(&srcs, sizeof(QSrc)));
        const size_t dbytes = (size_t)nsteps * 4 * (512 + 64);
        CK(cudaMalloc(&digits, dbytes));
        {
            std::vector<u8> hw(wb * sh.batch);
            uint64_t z = 12345;
            auto nx = [&]() { return z = z * 6364136223846793005ull + 1442695040888963407ull; };
            for (auto& b : hw) b = (u8)(nx() >> 33);
            std::vector<float> hs(sb / 4 * sh.batch), hx(8ull * sh.cols);
            for (auto& s : hs) s = 0.001f + (float)((nx() >> 40) & 0xffff) / 65536.0f * 0.02f;
            for (auto& x : hx) x = (float)((int)((nx() >> 33) & 0xffff) - 32768) / 32768.0f;
            for (int c = 0; c < copies; c++) {
                CK(cudaMemcpy(Wd + wb * sh.batch * c, hw.data(), hw.size(), cudaMemcpyHostToDevice));
                CK(cudaMemcpy(S + sb / 4 * sh.batch * c, hs.data(), sb * sh.batch,
                              cudaMemcpyHostToDevice));
            }
            CK(cudaMemcpy(X, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
            std::vector<Job> hj(sh.batch * copies);
            for (int c = 0; c < copies; c++)
                for (int b = 0; b < sh.batch; b++) {
                    Job& j = hj[c * sh.batch + b];
                    j.w = (u64)(Wd + wb * (c * sh.batch + b));
                    j.s = (u64)(S + sb / 4 * (c * sh.batch + b));
                    j.x = (u64)digits;
                    j.y = (u64)(Y + (size_t)8 * sh.rows * b);
                    j.packed = sh.packed;
                }
            CK(cudaMemcpy(J, hj.data(), hj.size() * sizeof(Job), cudaMemcpyHostToDevice));
            QSrc q{(u64)X, (u64)digits};
            CK(cudaMemcpy(srcs, &q, sizeof q, cudaMemcpyHostToDevice));
        }
        for (int m : ms_list) {
            const int G = (m + 1) / 2;
            auto split = [&]() {
                q_split<<<dim3((nsteps * 2 * G + 3) / 4, 1), 128>>>(srcs, m, sh.cols, G);
            };
            struct Arm {
                std::string name;
                int T, W;
            };
            std::vector<Arm> arms(2);
            old_kernel(sh.rows, sh.cols, sh.batch, G, arms[0].T, arms[0].W);
            new_kernel(sh.rows, sh.cols, sh.batch, G, arms[1].T, arms[1].W);
            for (auto& a : arms) a.name = "t" + std::to_string(a.T) + "_w" + std::to_string(a.W);
            arms[0].name = "old " + arms[0].name;
            arms[1].name = "new " + arms[1].name;
            auto run = [&](const Arm& a, int c) {
                split();
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3((sh.rows + 16 * a.T - 1) / (16 * a.T), sh.batch);
                cfg.blockDim = dim3(a.W * 32);
                cudaLaunchAttribute at[1];
                at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                at[0].val.programmaticStreamSerializationAllowed = 1;
                cfg.attrs = at;
                cfg.numAttrs = 1;
                CK(cudaLaunchKernelEx(&cfg, kernel(a.T, a.W, G), (const Job*)(J + c * sh.batch),
                                      sh.rows, sh.cols, m, row_bytes, row_scales, (u32)0, 6, 0));
            };
            std::vector<float> yref(8ull * sh.rows * sh.batch), yv(yref.size());
            CK(cudaMemset(Y, 0, yref.size() * 4));
            run(arms[0], 0);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(yref.data(), Y, yref.size() * 4, cudaMemcpyDeviceToHost));
            printf("%s M=%d (%.1f MB per launch)\n", sh.name, m, per / 1e6);
            std::vector<std::vector<float>> times(arms.size());
            const int iters = 60;
            for (int round = 0; round < 10; round++)
                for (size_t k = 0; k < arms.size(); k++) {
                    size_t ai = round % 2 ? arms.size() - 1 - k : k;
                    for (int c = 0; c < copies; c++) run(arms[ai], c);
                    CK(cudaEventRecord(e0));
                    for (int it = 0; it < iters; it++) run(arms[ai], it % copies);
                    CK(cudaEventRecord(e1));
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    times[ai].push_back(ms * 1e3f / iters);
                }
            CK(cudaGetLastError());
            for (size_t ai = 0; ai < arms.size(); ai++) {
                CK(cudaMemset(Y, 0, yref.size() * 4));
                run(arms[ai], 0);
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(yv.data(), Y, yv.size() * 4, cudaMemcpyDeviceToHost));
                double maxd = 0, maxr = 0;
                bool same = true;
                for (int b = 0; b < sh.batch; b++)
                    for (int tok = 0; tok < m; tok++)
                        for (int r = 0; r < sh.rows; r++) {
                            size_t i = (size_t)8 * sh.rows * b + (size_t)tok * sh.rows + r;
                            maxd = std::max(maxd, (double)fabsf(yv[i] - yref[i]));
                            maxr = std::max(maxr, (double)fabsf(yref[i]));
                            if (yv[i] != yref[i]) same = false;
                        }
                auto ts = times[ai];
                std::sort(ts.begin(), ts.end());
                double us = ts[ts.size() / 2];
                printf("  %-18s %8.2f us (%6.2f-%6.2f) %6.0f GB/s  %.3f of read  %s (%.1e)\n",
                       arms[ai].name.c_str(), us, ts.front(), ts.back(), per / (us * 1e-6) / 1e9,
                       per / (us * 1e-6) / 1e9 / ref, same ? "bits=" : "bits!=",
                       maxd / std::max(maxr, 1e-30));
            }
            fflush(stdout);
        }
        CK(cudaFree(Wd));
        CK(cudaFree(S));
        CK(cudaFree(X));
        CK(cudaFree(Y));
        CK(cudaFree(J));
        CK(cudaFree(srcs));
        CK(cudaFree(digits));
    }
    printf("read_ref again %.0f GB/s\n", read_bw());
    return 0;
}
