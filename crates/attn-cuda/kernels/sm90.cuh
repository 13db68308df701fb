// Hopper (sm_90a) building blocks for the kernels of the Hopper family: warpgroup matrix products
// (wgmma) and their shared-memory descriptors, mbarriers, bulk tensor copies (TMA), register
// reallocation and named barriers. Each is one PTX instruction or a short loop around one; the
// PTX ISA's section names are given so that each can be checked against it.
//
// The wgmma wrappers themselves are generated per shape (their operand lists are long) and
// come in as the header `sm90_wgmma.cuh` (crates/attn-cuda/src/hopper/wgmma.rs).
#pragma once

namespace sm90 {

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ---- mbarrier (PTX ISA 9.7.13.15): a 64-bit shared-memory object that completes a phase once
// its expected arrivals have arrived and its expected transaction bytes have landed.

__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(arrivals));
}

// Makes the initialised barriers visible to the async proxy (TMA) before anyone uses them.
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` of bulk copies completing on this barrier's phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}

// Announces `bytes` of bulk copies completing on this barrier's phase, without an arrival (the
// thread arrives later, when its own writes for the phase are done).
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// Waits until the phase of parity `parity` has completed. A fresh barrier is in phase 0, and
// the phase before it counts as complete: waiting on parity 1 returns at once.
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}

// Whether the phase of parity `parity` has completed, without waiting.
__device__ __forceinline__ bool mbar_test(unsigned long long* bar, unsigned parity) {
    unsigned done;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
    return done != 0;
}

// ---- Bulk tensor copy (TMA, PTX ISA 9.7.9.25): one thread asks the copy engine for a box of a
// tensor described by a tensor map (built on the host by cuTensorMapEncodeTiled and passed as a
// __grid_constant__ parameter); the bytes land in shared memory and complete on `bar`.

// A CUtensorMap: 128 opaque bytes, 64-byte aligned at least (cudarc's CUDA 13 type says 128).
struct __align__(128) TensorMap {
    unsigned long long opaque[16];
};

__device__ __forceinline__ void tma_prefetch(const TensorMap* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}

// The box at coordinates (c0, c1, c2, c3), innermost first, of a 4-D tensor map.
__device__ __forceinline__ void tma_load_4d(void* dst, const TensorMap* map, unsigned long long* bar, int c0,
                                            int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(smem_u32(dst)),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar))
        : "memory");
}

// The box of a 4-D tensor map at (c0, c1, c2, c3) from shared memory back to global memory;
// elements outside the tensor are not written. Completes in this thread's bulk groups.
__device__ __forceinline__ void tma_store_4d(const TensorMap* map, const void* src, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
            reinterpret_cast<unsigned long long>(map)),
        "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(src))
        : "memory");
}

// This thread's bulk stores so far form a group (PTX ISA 9.7.9.24.6); waiting for the groups
// to have read their shared memory (before it is written again), or to be done altogether.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Orders this thread's ordinary shared-memory writes before later reads by the async proxy
// (wgmma operands, bulk copies); needed between such writes and the barrier that publishes them.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Four 8 x 8 matrices of 16-bit elements to shared memory (stmatrix, PTX ISA 9.7.14.5.16) from
// registers laid out as an accumulator's packed pairs: register m of lane l holds row l / 4,
// elements 2 (l % 4) and + 1, of matrix m; lane l gives the address of row l % 8 of matrix l / 8
// (16 contiguous bytes).
__device__ __forceinline__ void stmatrix_x4(unsigned addr, const unsigned (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
                 "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

// ---- wgmma (PTX ISA 9.7.15): a warpgroup of 4 consecutive warps multiplies 64 x N x 16 tiles,
// issued asynchronously; accumulators stay in registers.

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups are still running.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving reads or writes of these registers across this point: wgmma
// reads and writes them asynchronously, between its issue and the wait that follows. Before a
// batch's wgmma_fence it keeps the arithmetic that produced them (a rescale of O, P's packing)
// from sinking into the batch, where ptxas would then serialize every wgmma (its note C7514).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N, int M>
__device__ __forceinline__ void fence_regs(unsigned (&r)[N][M]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < M; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// Shared-memory matrix descriptor (PTX ISA 9.7.15.5.1) of an operand in the layout TMA writes
// with 128-byte swizzling: rows of 64 16-bit elements (128 bytes, whose 16-byte chunks are
// XOR-ed with the row index mod 8), 8-row groups 1024 bytes apart (the stride byte offset).
// `leading` is the leading byte offset: unused for K-major operands (whose K extent, 16
// elements, stays inside one 128-byte row), and for MN-major ones the distance between
// consecutive 64-element column blocks. The tile must start 1024-byte aligned (base offset 0);
// moving the start address by 32 bytes steps K by 16 inside a row, as the swizzle is applied
// to the final address.
__device__ __forceinline__ unsigned long long sw128_desc(unsigned addr, unsigned leading) {
    return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4)            // start address
           | static_cast<unsigned long long>((leading >> 4) & 0x3FFF) << 16  // leading byte offset
           | static_cast<unsigned long long>(1024 >> 4) << 32                // stride byte offset
           | 1ull << 62;                                                     // 128-byte swizzle
}

// The descriptor of the operand `bytes` further on (a multiple of 16): only the start address
// field, the low 14 bits, moves, and shared memory lies below 256 KB, so it never carries into
// the next field. Adding to the low word alone keeps a product's descriptors one integer add
// apart (the whole descriptor rebuilt is five instructions before each wgmma).
__device__ __forceinline__ unsigned long long desc_advance(unsigned long long desc, unsigned bytes) {
    const unsigned lo = static_cast<unsigned>(desc) + (bytes >> 4);
    return (desc & 0xFFFFFFFF00000000ull) | lo;
}

// ---- Registers and barriers between warpgroups.

// setmaxnreg (PTX ISA 9.7.17.1): the warpgroup gives registers back to the pool, or waits until
// the pool has them. Takes effect only with a register cap at entry (__launch_bounds__(T, 1)).
template <int R>
__device__ __forceinline__ void regs_release() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void regs_claim() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}

// Named barriers (bar.sync / bar.arrive, PTX ISA 9.7.13.1): `threads` threads in all meet at
// barrier `id`; arriving does not wait. Id 0 is __syncthreads'.
__device__ __forceinline__ void named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace sm90
