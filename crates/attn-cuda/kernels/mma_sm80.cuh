// The mma.sync building blocks that the sm_80+ kernels share (flash_fwd.cu and decode.cu): the
// 16-bit element type (ATTN_BF16), shared-memory addresses, cp.async groups, ldmatrix, the
// m16n8k16 product, quad reductions. Each is one PTX instruction or a short unrolled loop,
// and inlined: each kernel's PTX is what it was when it held its own copies.
//
// An accumulator tile is mma.sync's m16n8 C fragment (`float c[4]`): a thread holds rows
// lane / 4 (elements 0, 1) and lane / 4 + 8 (elements 2, 3), columns 2 (lane % 4) + (e & 1).
// Left in each kernel: cp.async's copy (`cp_async16`; decode's can ask L2 for 256-byte fetches)
// and the online-softmax steps (the same text in both, but NVRTC orders the code differently
// once they are wrapped in functions taking the tile arrays, and each kernel's PTX stays as it
// was: crates/attn-cuda/examples/ptx_hashes.rs checks it).
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#if ATTN_BF16
typedef __nv_bfloat16 elem_t;
typedef __nv_bfloat162 elem2_t;
#define MMA_T "bf16"
__device__ __forceinline__ elem2_t pack2(float lo, float hi) { return __floats2bfloat162_rn(lo, hi); }
#else
typedef __half elem_t;
typedef __half2 elem2_t;
#define MMA_T "f16"
__device__ __forceinline__ elem2_t pack2(float lo, float hi) { return __floats2half2_rn(lo, hi); }
#endif

// NVRTC has no <math.h>, hence no INFINITY.
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned addr, unsigned (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// c += a * b for one m16n8k16 tile.
__device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_T "." MMA_T ".f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x in one MUFU.EX2 instruction (flushes subnormal results to 0; 2^-inf = 0).
__device__ __forceinline__ float exp2_fast(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// tanh(x) in one MUFU.TANH instruction (tanh.approx.f32: the soft-cap's; its error in
// crates/attn-cuda/src/scores.rs, ScoreParams::softcap_in).
__device__ __forceinline__ float tanh_fast(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ unsigned as_u32(elem2_t x) { return *reinterpret_cast<unsigned*>(&x); }

// Max / sum over the 4 threads of a quad, which together hold one row of an accumulator tile.
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffff, x, 1);
    return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// Zeroes a score (S) accumulator before its products.
template <int TILES, int N>
__device__ __forceinline__ void zero_scores(float (&s)[TILES][N][4]) {
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
        for (int i = 0; i < N; ++i) s[t][i][0] = s[t][i][1] = s[t][i][2] = s[t][i][3] = 0.f;
}
