//! One specialisation of `kernels/decode.cu`: its tiles, the shared memory they take and the
//! NVRTC request that compiles it.

use crate::compile::{Arch, CompileRequest};
use attn_core::DType;

/// The kernel source, compiled at run time for the device's exact architecture.
pub const SOURCE: &str = include_str!("../../kernels/decode.cu");
/// The headers it includes, by name: the Ampere/Ada family's (`kernels/mma_sm80.cuh`, the
/// mma.sync building blocks both kernels use).
pub const HEADERS: &[(&str, &str)] = crate::ampere::variant::HEADERS;

/// Warps per CTA: each walks its own chunks of the split's keys.
pub const WARPS: u32 = 4;

/// One compiled specialisation of `kernels/decode.cu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    /// f16 or bf16.
    pub dtype: DType,
    /// Head dimension.
    pub head_dim: usize,
    /// 16-row tiles of query rows per CTA (`block_m = 16 · m_tiles`): the rows of a GQA group
    /// that share a K/V head.
    pub m_tiles: u32,
    /// Keys per chunk (a warp's unit of work and of its copy ring).
    pub block_n: usize,
    /// Chunks in each warp's cp.async ring.
    pub stages: u32,
    /// A per-row key window compiled in (causal, or a sliding window).
    pub masked: bool,
    /// K/V copies ask L2 to fetch 256 bytes per miss (`cp.async ... .L2::256B`).
    pub l2_prefetch: bool,
    /// Per-sequence key counts, a paged K/V cache, soft-cap and ALiBi compiled in (each taken
    /// or not at run time, by the parameter block); without them the kernel's code is the plain
    /// one's.
    pub extras: bool,
    /// The problem's head dim is below `head_dim` (the next of [`super::plan::HEAD_DIMS`], a
    /// multiple of 8): its columns past it are zeros in shared memory, never loaded or stored
    /// (`ATTN_PAD`; with the extras, whose parameter block the kernel then reads).
    pub pad: bool,
    /// The persistent form (`ATTN_PERSIST`; plain, unmasked, one split, one row tile, 32-key
    /// chunks): fewer CTAs than (sequence, KV head, row block) items, each taking items in turn
    /// with its warps' copy rings running on from one item into the next, and a second Q buffer
    /// for the next item's rows ([`super::plan::persistent`]).
    pub persist: bool,
}

impl Variant {
    /// Query rows per CTA.
    pub fn block_m(&self) -> usize {
        16 * self.m_tiles as usize
    }

    /// Threads per CTA.
    pub fn threads(&self) -> u32 {
        32 * WARPS
    }

    /// Dynamic shared memory: the larger of Q (rows padded to `head_dim + 8` elements; two buffers
    /// in the persistent form) plus every warp's ring of K and V chunks (rows of `head_dim`
    /// elements, swizzled, where that is a multiple of 64; else padded as Q's) and the warps'
    /// merge area (f32 accumulators, maxima and sums), and at least the split merge's weights for
    /// [`super::MAX_SPLITS`] splits.
    /// Mirrors `KV_BYTES` and `MERGE_BYTES` in `kernels/decode.cu`.
    pub fn shared_bytes(&self) -> u32 {
        let q_row = self.head_dim + 8;
        let ring_row = if self.head_dim.is_multiple_of(64) { self.head_dim } else { q_row };
        let ring = WARPS as usize * self.stages as usize * 2 * self.block_n * ring_row;
        let q_buffers = if self.persist { 2 } else { 1 };
        let kv = (q_buffers * self.block_m() * q_row + ring) * 2;
        let merge = WARPS as usize * self.block_m() * (self.head_dim + 2) * 4;
        let weights = self.block_m() * super::plan::MAX_SPLITS as usize * 4;
        kv.max(merge).max(weights) as u32
    }

    /// Static shared memory: the ticket's flag, which the compiler places in a 128-byte slot
    /// ahead of the 128-byte-aligned dynamic area (ptxas reports 128 bytes; the CI compile test
    /// checks this bound).
    pub const STATIC_SHARED: u32 = 128;

    /// The name of the specialisation.
    pub fn name(&self) -> String {
        format!(
            "decode_{}_d{}_bm{}_bn{}_s{}{}{}{}{}{}",
            self.dtype,
            self.head_dim,
            self.block_m(),
            self.block_n,
            self.stages,
            if self.l2_prefetch { "_l2" } else { "" },
            if self.masked { "_masked" } else { "" },
            if self.extras { "_ext" } else { "" },
            if self.pad { "_pad" } else { "" },
            if self.persist { "_persist" } else { "" }
        )
    }

    /// The NVRTC `-D` defines that select it.
    pub fn defines(&self) -> Vec<(String, String)> {
        vec![
            ("ATTN_BF16".into(), u8::from(self.dtype == DType::Bf16).to_string()),
            ("ATTN_D".into(), self.head_dim.to_string()),
            ("ATTN_MTILES".into(), self.m_tiles.to_string()),
            ("ATTN_WARPS".into(), WARPS.to_string()),
            ("ATTN_BN".into(), self.block_n.to_string()),
            ("ATTN_STAGES".into(), self.stages.to_string()),
            ("ATTN_MASKED".into(), u8::from(self.masked).to_string()),
            ("ATTN_L2_PREFETCH".into(), u8::from(self.l2_prefetch).to_string()),
            ("ATTN_EXTRAS".into(), u8::from(self.extras).to_string()),
            ("ATTN_PAD".into(), u8::from(self.pad).to_string()),
            ("ATTN_PERSIST".into(), u8::from(self.persist).to_string()),
            ("ATTN_SHARED_BYTES".into(), self.shared_bytes().to_string()),
        ]
    }

    /// The NVRTC request that compiles this specialisation for `arch`.
    pub fn request(&self, arch: Arch) -> CompileRequest {
        CompileRequest::new(self.name(), SOURCE, arch).headers(HEADERS).defines(self.defines())
    }

    /// The registers one thread may use: 65536 / threads, at most 255. CI fails a variant over
    /// it (or with any spill).
    pub fn register_budget(&self) -> u32 {
        (65536 / self.threads()).min(255)
    }
}
