// Smoke kernels: prove that NVRTC, the CUDA headers and the driver plumbing work end to end,
// independently of the attention kernel. Tests compile this for every target architecture and,
// where there is a GPU, run it.

// The 16-bit types the attention kernel uses; including them checks that the header directory
// was found and that NVRTC accepts the headers.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

// y[i] = 2 x[i]: plain pointer arguments.
extern "C" __global__ void smoke_scale_f32(const float* __restrict__ x, float* __restrict__ y, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}

// The parameter block passed by value, as the attention kernel takes its arguments. Must match
// `SmokeParams` in the tests of crates/attn-cuda (repr(C), same field order).
struct SmokeParams {
    const float* x;
    float* y;
    unsigned n;
    float factor;
};

// y[i] = factor x[i], with everything in one by-value struct.
extern "C" __global__ void smoke_params(const __grid_constant__ SmokeParams p) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) p.y[i] = p.factor * p.x[i];
}

// y[i] = bf16(2 f16(x[i])), staged through static shared memory so ptxas reports some.
extern "C" __global__ void smoke_halves(const __half* __restrict__ x, __nv_bfloat16* __restrict__ y, unsigned n) {
    __shared__ float staged[256];
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    staged[threadIdx.x] = i < n ? __half2float(x[i]) : 0.0f;
    __syncthreads();
    if (i < n) y[i] = __float2bfloat16_rn(2.0f * staged[threadIdx.x]);
}
