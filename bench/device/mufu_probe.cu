// How many exp2 and tanh results an SM returns a clock, per PTX form (issue 33: the soft-cap
// costs a second MUFU result a score). Each thread runs 8 independent chains of
// x = op(x * a + b) (one FFMA or HFMA2 feeding each op, as the softmax does); the grid is one
// wave of the device's resident blocks; cycles from clock64() per block. Prints one JSON line
// per form: results per clock per SM (the op's results, two for a packed form).
// Build: nvcc -O3 -arch=sm_90a -o mufu_probe mufu_probe.cu; run: ./mufu_probe [iters]
#include <cstdio>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  printf("{\"error\":\"%s at line %d\"}\n", cudaGetErrorString(e), __LINE__); return 1; } } while (0)

enum Op { EX2_F32, EX2_F16X2, EX2_BF16X2, TANH_F32, TANH_F16X2, TANH_BF16X2, FFMA_ONLY };

template <int OP>
__device__ __forceinline__ unsigned step(unsigned x) {
  unsigned y;
  if (OP == EX2_F32 || OP == TANH_F32 || OP == FFMA_ONLY) {
    float f = __uint_as_float(x) * 0.999f - 0.5f;
    float r;
    if (OP == EX2_F32) asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(f));
    else if (OP == TANH_F32) asm volatile("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(f));
    else r = f;
    y = __float_as_uint(r);
  } else if (OP == EX2_F16X2 || OP == TANH_F16X2) {
    __half2 h = *reinterpret_cast<__half2*>(&x);
    h = __hfma2(h, __float2half2_rn(0.999f), __float2half2_rn(-0.5f));
    unsigned in = *reinterpret_cast<unsigned*>(&h);
    if (OP == EX2_F16X2) asm volatile("ex2.approx.f16x2 %0, %1;" : "=r"(y) : "r"(in));
    else asm volatile("tanh.approx.f16x2 %0, %1;" : "=r"(y) : "r"(in));
  } else {
    __nv_bfloat162 h = *reinterpret_cast<__nv_bfloat162*>(&x);
    h = __hfma2(h, __float2bfloat162_rn(0.999f), __float2bfloat162_rn(-0.5f));
    unsigned in = *reinterpret_cast<unsigned*>(&h);
    if (OP == EX2_BF16X2) asm volatile("ex2.approx.ftz.bf16x2 %0, %1;" : "=r"(y) : "r"(in));
    else asm volatile("tanh.approx.bf16x2 %0, %1;" : "=r"(y) : "r"(in));
  }
  return y;
}

template <int OP>
__global__ void probe(int iters, unsigned* sink, long long* cycles) {
  unsigned x[8];
  for (int c = 0; c < 8; ++c) x[c] = 0x3c003c00u + threadIdx.x + c;
  __syncthreads();
  long long t0 = clock64();
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int c = 0; c < 8; ++c) x[c] = step<OP>(x[c]);
  }
  __syncthreads();
  long long t1 = clock64();
  unsigned acc = 0;
  for (int c = 0; c < 8; ++c) acc ^= x[c];
  if (acc == 0x12345678u) sink[0] = acc;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <int OP>
int run(const char* name, int results_per_op, int iters, int sms, int threads) {
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, probe<OP>, threads, 0));
  int blocks = per_sm * sms;
  unsigned* sink; long long* cycles;
  CHECK(cudaMalloc(&sink, 4)); CHECK(cudaMalloc(&cycles, blocks * sizeof(long long)));
  probe<OP><<<blocks, threads>>>(iters / 10, sink, cycles);  // warm-up
  CHECK(cudaGetLastError()); CHECK(cudaDeviceSynchronize());
  probe<OP><<<blocks, threads>>>(iters, sink, cycles);
  CHECK(cudaGetLastError()); CHECK(cudaDeviceSynchronize());
  long long* host = new long long[blocks];
  CHECK(cudaMemcpy(host, cycles, blocks * sizeof(long long), cudaMemcpyDeviceToHost));
  long long worst = 0;
  for (int b = 0; b < blocks; ++b) worst = host[b] > worst ? host[b] : worst;
  double results = double(per_sm) * threads * iters * 8 * results_per_op;  // one SM's
  printf("{\"op\":\"%s\",\"blocks_per_sm\":%d,\"threads\":%d,\"iters\":%d,\"cycles\":%lld,"
         "\"results_per_clk_per_sm\":%.2f}\n", name, per_sm, threads, iters, worst, results / worst);
  delete[] host; cudaFree(sink); cudaFree(cycles);
  return 0;
}

int main(int argc, char** argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 4096;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int threads = 256, bad = 0;
  bad |= run<FFMA_ONLY>("ffma (chain only)", 1, iters, sms, threads);
  bad |= run<EX2_F32>("ex2.approx.ftz.f32", 1, iters, sms, threads);
  bad |= run<EX2_F16X2>("ex2.approx.f16x2", 2, iters, sms, threads);
  bad |= run<EX2_BF16X2>("ex2.approx.ftz.bf16x2", 2, iters, sms, threads);
  bad |= run<TANH_F32>("tanh.approx.f32", 1, iters, sms, threads);
  bad |= run<TANH_F16X2>("tanh.approx.f16x2", 2, iters, sms, threads);
  bad |= run<TANH_BF16X2>("tanh.approx.bf16x2", 2, iters, sms, threads);
  return bad;
}
