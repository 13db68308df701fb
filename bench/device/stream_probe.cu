// How fast can a kernel stream K and V the way a decode kernel reads them? A read-bandwidth probe
// for issue 33's decode gap (cuDNN's decode kernel read K/V faster than torch.sum, attn's decode
// family slower, until its rings' rows were unpadded and the L2 hint dropped: what this found). Two tensors (K and V), each `regions` contiguous regions of `rows` rows
// of 256 bytes (a BHSD (batch, KV head) at D = 128 bf16), one CTA per region, as the decode grid
// with one split. Each form reads every byte once into shared memory (or registers) and does
// nothing else with it, so the time is the access pattern's alone:
//   warps    four warps, warp w taking chunks w, w + 4, ... of 32 rows (K then V, 16 bytes a
//            lane per cp.async), each its own ring of STAGES chunks: attn's decode kernel's copies
//   tiles    the CTA's 128 threads copy 128-row tiles of K, then of V (one commit group each), a
//            ring of STAGES tiles, a block barrier per tile: cuDNN's and FlashAttention-2's shape
//   ldg      plain 16-byte loads into registers, UNROLL in flight a thread, xor-folded
// each with and without cp.async's L2 256-byte prefetch hint (part 0); and (part 1) the warps'
// form with work on each chunk (a stand-in of WORK cycles, or ldmatrix reads of it) and with the
// rings' rows padded to 272 bytes, as the decode kernel's were. Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90a -o /tmp/stream_probe bench/device/stream_probe.cu
//   /tmp/stream_probe <regions> <rows> <iters> <part>
// (bench/device/stream-probe.sh, PART=0 or 1). Prints one JSON line per form: GB/s = K and V
// bytes / the median time (CUDA events, each timed call behind an untimed twin).
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CHECK(x)                                                                                  \
    do {                                                                                          \
        cudaError_t e = (x);                                                                      \
        if (e != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e));     \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

constexpr int ROW = 256;  // bytes a row (D = 128, bf16)

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
template <bool HINT>
__device__ __forceinline__ void cp16(unsigned dst, const void* src) {
    if (HINT)
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
    else
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void wait_groups() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// attn's decode copies: warp w's chunks of 32 rows, a ring of STAGES (K, V) chunk pairs each.
// WORK: what a warp does with each chunk once it has landed: 0 nothing (one word read), else
// WORK cycles of a dependent chain (a stand-in for the products and softmax), or -1 the chunk read
// back by ldmatrix, K then V transposed (as the kernel's products read it), xor-folded. PITCH: the
// ring's row pitch in bytes (256, or 272: the kernel's rows padded to D + 8 elements).
template <int STAGES, bool HINT, int WORK = 0, int PITCH = ROW>
__global__ void __launch_bounds__(128) warps(const char* k, const char* v, int rows, unsigned* sink) {
    extern __shared__ __align__(128) char smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const size_t base = (size_t)blockIdx.x * rows * ROW;
    char* ring = smem + warp * STAGES * 2 * 32 * PITCH;
    const int chunks = rows / 32, mine = (chunks - warp + 3) / 4;
    auto load = [&](int i) {
        const int c = warp + 4 * i, s = i % STAGES;
        const size_t off = base + (size_t)c * 32 * ROW;
        char* dk = ring + s * 2 * 32 * PITCH;
#pragma unroll
        for (int it = 0; it < 32 * ROW / 16 / 32; ++it) {
            const int b = (lane + 32 * it) * 16;
            const int d = (b / ROW) * PITCH + b % ROW;
            cp16<HINT>(smem_u32(dk + d), k + off + b);
            cp16<HINT>(smem_u32(dk + 32 * PITCH + d), v + off + b);
        }
    };
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < mine) load(s);
        commit();
    }
    unsigned acc = 0;
    for (int i = 0; i < mine; ++i) {
        __syncwarp();
        if (i + STAGES - 1 < mine) load(i + STAGES - 1);
        commit();
        wait_groups<STAGES - 1>();
        __syncwarp();
        const char* chunk = ring + (i % STAGES) * 2 * 32 * PITCH;
        if (WORK > 0) {
            const long long until = clock64() + WORK;
            unsigned x = acc;
            while (clock64() < until) x = x * 1664525u + 1013904223u;
            acc ^= x;
        } else if (WORK < 0) {
            // Each lane's ldmatrix rows: 8 rows x 16 bytes per matrix, four matrices a call.
            const unsigned a = smem_u32(chunk) + (lane % 8 + 8 * ((lane / 8) % 2)) * PITCH + (lane / 16) * 16;
#pragma unroll
            for (int half = 0; half < 2; ++half)
#pragma unroll
                for (int c = 0; c < ROW / 32; ++c) {
                    unsigned r0, r1, r2, r3;
                    const unsigned at = a + half * 32 * PITCH + c * 32;
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(at));
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(at + 16 * PITCH));
                    acc ^= r0 ^ r1 ^ r2 ^ r3;
                }
        } else {
            acc ^= *reinterpret_cast<const unsigned*>(chunk + lane * 4);
        }
    }
    if (acc == 0x12345678u) sink[0] = acc;  // keeps the reads
}

// The CTA's copies: 128-row tiles of K, then V, a ring of STAGES tiles, one barrier a tile.
template <int STAGES, bool HINT>
__global__ void __launch_bounds__(128) tiles(const char* k, const char* v, int rows, unsigned* sink) {
    extern __shared__ __align__(128) char smem[];
    const size_t base = (size_t)blockIdx.x * rows * ROW;
    const int n = rows / 128;
    auto load = [&](int i) {
        const size_t off = base + (size_t)i * 128 * ROW;
        char* dk = smem + (i % STAGES) * 2 * 128 * ROW;
#pragma unroll
        for (int it = 0; it < 128 * ROW / 16 / 128; ++it) {
            const int b = (threadIdx.x + 128 * it) * 16;
            cp16<HINT>(smem_u32(dk + b), k + off + b);
        }
        commit();
#pragma unroll
        for (int it = 0; it < 128 * ROW / 16 / 128; ++it) {
            const int b = (threadIdx.x + 128 * it) * 16;
            cp16<HINT>(smem_u32(dk + 128 * ROW + b), v + off + b);
        }
        commit();
    };
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n) load(s);
        else commit(), commit();
    }
    unsigned acc = 0;
    for (int i = 0; i < n; ++i) {
        if (i + STAGES - 1 < n) load(i + STAGES - 1);
        else commit(), commit();
        wait_groups<2 * (STAGES - 1)>();
        __syncthreads();
        acc ^= *reinterpret_cast<const unsigned*>(smem + (i % STAGES) * 2 * 128 * ROW + threadIdx.x * 4);
        __syncthreads();  // the stage is free for the copy STAGES - 1 tiles on
    }
    if (acc == 0x12345678u) sink[0] = acc;
}

// Plain loads into registers, UNROLL 16-byte loads in flight a thread (K and V alternately).
template <int UNROLL>
__global__ void __launch_bounds__(256) ldg(const uint4* k, const uint4* v, int rows, unsigned* sink) {
    const size_t per = (size_t)rows * ROW / 16;
    const uint4* kb = k + blockIdx.x * per;
    const uint4* vb = v + blockIdx.x * per;
    unsigned acc = 0;
    for (size_t i = threadIdx.x; i < per; i += 256 * UNROLL / 2) {
        uint4 x[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL / 2; ++u) {
            x[2 * u] = __ldcs(kb + i + u * 256);
            x[2 * u + 1] = __ldcs(vb + i + u * 256);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) acc ^= x[u].x ^ x[u].y ^ x[u].z ^ x[u].w;
    }
    if (acc == 0x12345678u) sink[0] = acc;
}

template <typename F>
double median_us(F launch, int iters) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 3; ++i) launch();
    CHECK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int i = 0; i < iters; ++i) {
        launch();  // the untimed twin, as the decode timings
        CHECK(cudaEventRecord(a));
        launch();
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1e3f);
    }
    CHECK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main(int argc, char** argv) {
    const int regions = argc > 1 ? atoi(argv[1]) : 1024;  // (batch, KV head) pairs
    const int rows = argc > 2 ? atoi(argv[2]) : 4096;     // keys each
    const int iters = argc > 3 ? atoi(argv[3]) : 30;
    const size_t bytes = (size_t)regions * rows * ROW;
    char *k, *v;
    unsigned* sink;
    CHECK(cudaMalloc(&k, bytes));
    CHECK(cudaMalloc(&v, bytes));
    CHECK(cudaMalloc(&sink, 4));
    CHECK(cudaMemset(k, 1, bytes));
    CHECK(cudaMemset(v, 2, bytes));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    auto report = [&](const char* form, double us, int smem) {
        printf("{\"form\":\"%s\",\"device\":\"%s\",\"regions\":%d,\"rows\":%d,\"smem\":%d,\"us\":%.2f,\"gbps\":%.1f}\n", form,
               prop.name, regions, rows, smem, us, 2.0 * bytes / us / 1e3);
        fflush(stdout);
    };
#define RUN(NAME, KERNEL, SMEM, THREADS, ...)                                                              \
    do {                                                                                                  \
        CHECK(cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));           \
        report(NAME, median_us([&] { KERNEL<<<regions, THREADS, SMEM>>>(__VA_ARGS__); }, iters), SMEM);  \
    } while (0)
    const int part = argc > 4 ? atoi(argv[4]) : 0;  // 0: the copy forms; 1: the warps with work
    if (part == 0) {
        RUN("warps s2", (warps<2, false>), 4 * 2 * 2 * 32 * ROW, 128, k, v, rows, sink);
        RUN("warps s2 l2", (warps<2, true>), 4 * 2 * 2 * 32 * ROW, 128, k, v, rows, sink);
        RUN("warps s1 l2", (warps<1, true>), 4 * 1 * 2 * 32 * ROW, 128, k, v, rows, sink);
        RUN("warps s3 l2", (warps<3, true>), 4 * 3 * 2 * 32 * ROW, 128, k, v, rows, sink);
        RUN("tiles s2", (tiles<2, false>), 2 * 2 * 128 * ROW, 128, k, v, rows, sink);
        RUN("tiles s2 l2", (tiles<2, true>), 2 * 2 * 128 * ROW, 128, k, v, rows, sink);
        RUN("tiles s1 l2", (tiles<1, true>), 1 * 2 * 128 * ROW, 128, k, v, rows, sink);
        RUN("tiles s1", (tiles<1, false>), 1 * 2 * 128 * ROW, 128, k, v, rows, sink);
        RUN("ldg u8", (ldg<8>), 0, 256, (const uint4*)k, (const uint4*)v, rows, sink);
        RUN("ldg u16", (ldg<16>), 0, 256, (const uint4*)k, (const uint4*)v, rows, sink);
        RUN("warps s2 l2", (warps<2, true>), 4 * 2 * 2 * 32 * ROW, 128, k, v, rows, sink);
        RUN("tiles s1 l2", (tiles<1, true>), 1 * 2 * 128 * ROW, 128, k, v, rows, sink);
    } else {
        constexpr int P = ROW + 16;  // the kernel's padded rows (D + 8 elements)
        RUN("warps s2", (warps<2, false>), 4 * 2 * 2 * 32 * ROW, 128, k, v, rows, sink);
        RUN("warps s2 pad", (warps<2, false, 0, P>), 4 * 2 * 2 * 32 * P, 128, k, v, rows, sink);
        RUN("warps s2 pad ldsm", (warps<2, false, -1, P>), 4 * 2 * 2 * 32 * P, 128, k, v, rows, sink);
        RUN("warps s3 pad ldsm", (warps<3, false, -1, P>), 4 * 3 * 2 * 32 * P, 128, k, v, rows, sink);
        RUN("warps s2 work1000", (warps<2, false, 1000>), 4 * 2 * 2 * 32 * ROW, 128, k, v, rows, sink);
        RUN("warps s3 work1000", (warps<3, false, 1000>), 4 * 3 * 2 * 32 * ROW, 128, k, v, rows, sink);
        RUN("warps s2 work2000", (warps<2, false, 2000>), 4 * 2 * 2 * 32 * ROW, 128, k, v, rows, sink);
        RUN("warps s3 work2000", (warps<3, false, 2000>), 4 * 3 * 2 * 32 * ROW, 128, k, v, rows, sink);
        RUN("warps s3 pad work2000", (warps<3, false, 2000, P>), 4 * 3 * 2 * 32 * P, 128, k, v, rows, sink);
        RUN("warps s2 l2 work2000", (warps<2, true, 2000>), 4 * 2 * 2 * 32 * ROW, 128, k, v, rows, sink);
        RUN("warps s2", (warps<2, false>), 4 * 2 * 2 * 32 * ROW, 128, k, v, rows, sink);
    }
    return 0;
}
