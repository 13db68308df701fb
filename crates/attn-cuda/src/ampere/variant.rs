//! One specialisation of `kernels/flash_fwd.cu`: its tiles, the resources they take, its launch
//! and the NVRTC request that compiles it.

use crate::compile::{Arch, CompileRequest};
use attn_core::{DType, Launch, Problem};

/// The kernel source, compiled at run time for the device's exact architecture.
pub const SOURCE: &str = include_str!("../../kernels/flash_fwd.cu");
/// The headers it includes, by name: the mma.sync building blocks it shares with the decode
/// family (`kernels/mma_sm80.cuh`).
pub const HEADERS: &[(&str, &str)] = &[("mma_sm80.cuh", include_str!("../../kernels/mma_sm80.cuh"))];

/// One compiled specialisation of `kernels/flash_fwd.cu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    /// f16 or bf16.
    pub dtype: DType,
    /// Head dimension the kernel is compiled for (`ATTN_D`): the problem's, or with `pad` the
    /// next one of `plan::PADDED_HEAD_DIMS` (64, 128, 256) above it.
    pub head_dim: usize,
    /// Warps per block.
    pub warps: u32,
    /// 16-row tiles per warp: each K/V fragment read from shared memory feeds this many matrix
    /// products. `block_m = 16 · m_tiles · warps`.
    pub m_tiles: u32,
    /// Keys per tile.
    pub block_n: usize,
    /// K/V shared-memory stages: 1 (K and V double-buffered against each other) or 2 (each
    /// double-buffered: the loads of a tile overlap the whole tile before it).
    pub stages: u32,
    /// Causal (bottom-right) masking compiled in.
    pub causal: bool,
    /// A sliding window compiled in (`ATTN_WINDOW`; never with `causal`): each block walks only
    /// the key tiles its rows see. The bounds are run-time parameters (`crate::scores`).
    pub window: bool,
    /// Score soft-capping compiled in (`ATTN_SOFTCAP`); the cap is a run-time parameter.
    pub softcap: bool,
    /// Sequences of their own lengths compiled in (`ATTN_SEQS`): packed queries or keys, a paged
    /// cache, per-sequence key counts, each chosen at run time by its index array (null or not).
    pub seqs: bool,
    /// The ALiBi bias compiled in (`ATTN_ALIBI`); the slopes are a run-time array.
    pub alibi: bool,
    /// A smaller head dim compiled in (`ATTN_PAD`): the problem's head dim (a multiple of 8
    /// below `head_dim`) is a run-time parameter; Q, K and V load zeros past it and O is stored
    /// up to it.
    pub pad: bool,
}

impl Variant {
    /// Query rows per block.
    pub fn block_m(&self) -> usize {
        16 * (self.m_tiles * self.warps) as usize
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        32 * self.warps
    }

    /// Dynamic shared memory: the Q tile and `stages` K and V tiles, 16-bit elements. Mirrors
    /// the pointer arithmetic at the top of `attn_fwd` in `kernels/flash_fwd.cu`.
    pub fn shared_bytes(&self) -> u32 {
        ((self.block_m() + 2 * self.stages as usize * self.block_n) * self.head_dim * 2) as u32
    }

    /// The name of the specialisation: dtype, head dim, tiles, mask, soft-cap, sequences, ALiBi,
    /// padding.
    pub fn name(&self) -> String {
        format!(
            "flash_fwd_{}_d{}_bm{}_w{}_bn{}_s{}{}{}{}{}{}{}",
            self.dtype,
            self.head_dim,
            self.block_m(),
            self.warps,
            self.block_n,
            self.stages,
            if self.causal { "_causal" } else { "" },
            if self.window { "_window" } else { "" },
            if self.softcap { "_softcap" } else { "" },
            if self.seqs { "_seqs" } else { "" },
            if self.alibi { "_alibi" } else { "" },
            if self.pad { "_pad" } else { "" }
        )
    }

    /// The NVRTC `-D` defines that select it.
    pub fn defines(&self) -> Vec<(String, String)> {
        vec![
            ("ATTN_BF16".into(), u8::from(self.dtype == DType::Bf16).to_string()),
            ("ATTN_D".into(), self.head_dim.to_string()),
            ("ATTN_WARPS".into(), self.warps.to_string()),
            ("ATTN_MTILES".into(), self.m_tiles.to_string()),
            ("ATTN_BN".into(), self.block_n.to_string()),
            ("ATTN_STAGES".into(), self.stages.to_string()),
            ("ATTN_CAUSAL".into(), u8::from(self.causal).to_string()),
            ("ATTN_WINDOW".into(), u8::from(self.window).to_string()),
            ("ATTN_SOFTCAP".into(), u8::from(self.softcap).to_string()),
            ("ATTN_SEQS".into(), u8::from(self.seqs).to_string()),
            ("ATTN_ALIBI".into(), u8::from(self.alibi).to_string()),
            ("ATTN_PAD".into(), u8::from(self.pad).to_string()),
        ]
    }

    /// The NVRTC request that compiles this specialisation for `arch`.
    pub fn request(&self, arch: Arch) -> CompileRequest {
        CompileRequest::new(self.name(), SOURCE, arch).headers(HEADERS).defines(self.defines())
    }

    /// The registers one thread may use so that a block fits the register file: the fewer of
    /// 255 and 65536 / threads. CI fails a variant over it (or with any spill).
    pub fn register_budget(&self) -> u32 {
        (65536 / self.threads()).min(255)
    }

    /// The launch for `problem`: one block per (query block, batch · head); under a causal mask
    /// the axes swap, so that blocks start longest first across all heads (see the kernel).
    pub fn launch(&self, problem: &Problem) -> Launch {
        let s = problem.shape;
        Launch {
            grid: match self.causal {
                true => [(s.batch * s.heads_q) as u32, s.seq_q.div_ceil(self.block_m()) as u32, 1],
                false => [s.seq_q.div_ceil(self.block_m()) as u32, (s.batch * s.heads_q) as u32, 1],
            },
            block: [self.threads(), 1, 1],
            dynamic_shared_bytes: self.shared_bytes(),
            static_shared_bytes: 0,
            registers_per_thread: None,
            spill_bytes: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HEADERS;

    /// The names a source's `#include "..."` lines ask for.
    fn quoted_includes(source: &str) -> Vec<&str> {
        source
            .lines()
            .filter_map(|l| l.trim().strip_prefix("#include \""))
            .filter_map(|rest| rest.split('"').next())
            .collect()
    }

    #[test]
    fn every_header_the_mma_sync_kernels_include_is_passed() {
        for (file, source) in [("flash_fwd.cu", super::SOURCE), ("decode.cu", crate::decode::SOURCE)] {
            let includes = quoted_includes(source);
            assert!(includes.contains(&"mma_sm80.cuh"), "{file} includes the shared header");
            for name in includes {
                assert!(HEADERS.iter().any(|(n, _)| *n == name), "{file} includes `{name}`, not in HEADERS");
            }
        }
        for (name, text) in HEADERS {
            assert!(quoted_includes(text).is_empty(), "{name} includes nothing of its own");
        }
    }
}
