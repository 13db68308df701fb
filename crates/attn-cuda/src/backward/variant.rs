//! One specialisation of `kernels/flash_bwd.cu`: its tiles, shared memory, launches and the NVRTC
//! request that compiles it.

use crate::compile::{Arch, CompileRequest};
use attn_core::{DType, Launch, Problem};

/// The kernel source, compiled at run time for the device's exact architecture.
pub const SOURCE: &str = include_str!("../../kernels/flash_bwd.cu");

/// Keys per CTA of the main pass (`BN` in the kernel: 16 per warp, 4 warps).
pub const BLOCK_N: usize = 64;
/// Query rows per step of the main pass (`BM` in the kernel).
pub const BLOCK_M: usize = 64;
/// Threads per block of each of the three kernels.
pub const THREADS: u32 = 128;
/// Query rows per block of the pre-pass and the conversion (a warp each).
const ROWS_PER_BLOCK: usize = 4;

/// One compiled specialisation of `kernels/flash_bwd.cu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    /// f16 or bf16.
    pub dtype: DType,
    /// Head dimension the kernel is compiled for (`ATTN_D`): 64 or 128; the problem's own (a
    /// multiple of 8 up to it) is a run-time parameter.
    pub head_dim: usize,
}

/// The three launches of one backward call, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launches {
    /// `attn_bwd_pre`: D and the zeroed dQ accumulator.
    pub pre: Launch,
    /// `attn_bwd`: dK, dV and dQ's accumulation.
    pub main: Launch,
    /// `attn_bwd_dq`: dQ from its accumulator.
    pub dq: Launch,
}

impl Variant {
    /// The head dims the kernel is compiled for.
    pub const HEAD_DIMS: [usize; 2] = [64, 128];

    /// Every variant that ships: each dtype at each head dim.
    pub fn all() -> Vec<Variant> {
        [DType::F16, DType::Bf16]
            .into_iter()
            .flat_map(|dtype| Self::HEAD_DIMS.map(|head_dim| Variant { dtype, head_dim }))
            .collect()
    }

    /// The variant for a problem of `dtype` and head dim `d`, or `None` past 128 (or not a
    /// multiple of 8).
    pub fn for_problem(dtype: DType, d: usize) -> Option<Variant> {
        let head_dim = Self::HEAD_DIMS.into_iter().find(|&k| d <= k && d.is_multiple_of(8) && d > 0)?;
        Some(Variant { dtype, head_dim })
    }

    /// Dynamic shared memory of the main pass: K and V (`BLOCK_N` rows), Q and dO (`BLOCK_M`
    /// rows), dSᵀ (`BLOCK_N × BLOCK_M`), all 16-bit, and the step's LSE and D (f32). Mirrors the
    /// pointer arithmetic at the top of `attn_bwd`.
    pub fn shared_bytes(&self) -> u32 {
        (((2 * BLOCK_N + 2 * BLOCK_M) * self.head_dim + BLOCK_N * BLOCK_M) * 2 + 2 * BLOCK_M * 4) as u32
    }

    /// The name of the specialisation.
    pub fn name(&self) -> String {
        format!("flash_bwd_{}_d{}_bm{BLOCK_M}_bn{BLOCK_N}", self.dtype, self.head_dim)
    }

    /// The NVRTC `-D` defines that select it.
    pub fn defines(&self) -> Vec<(String, String)> {
        vec![
            ("ATTN_BF16".into(), u8::from(self.dtype == DType::Bf16).to_string()),
            ("ATTN_D".into(), self.head_dim.to_string()),
        ]
    }

    /// The NVRTC request that compiles this specialisation for `arch`.
    pub fn request(&self, arch: Arch) -> CompileRequest {
        CompileRequest::new(self.name(), SOURCE, arch).headers(crate::ampere::HEADERS).defines(self.defines())
    }

    /// Registers one thread may use so that a block fits the register file (255 at 128 threads).
    pub fn register_budget(&self) -> u32 {
        (65536 / THREADS).min(255)
    }

    /// The launches for `problem`: the main pass one block per (key block, kv head, sequence),
    /// the row passes a warp per (query row, query head, sequence), over the longest sequence.
    pub fn launches(&self, problem: &Problem) -> Launches {
        let s = problem.shape;
        let rows = Launch {
            grid: [s.seq_q.div_ceil(ROWS_PER_BLOCK) as u32, s.heads_q as u32, s.batch as u32],
            block: [THREADS, 1, 1],
            dynamic_shared_bytes: 0,
            static_shared_bytes: 0,
            registers_per_thread: None,
            spill_bytes: None,
        };
        let main = Launch {
            grid: [s.seq_k.div_ceil(BLOCK_N) as u32, s.heads_kv as u32, s.batch as u32],
            dynamic_shared_bytes: self.shared_bytes(),
            ..rows.clone()
        };
        Launches { pre: rows.clone(), main, dq: rows }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_fits_an_l4_and_head_dims_pick_their_kernel() {
        // An L4 (sm_89) opts in to 99 KiB a block; D=128 takes 72.5 KiB.
        for v in Variant::all() {
            assert!(v.shared_bytes() <= 99 * 1024, "{}: {} B", v.name(), v.shared_bytes());
        }
        assert_eq!(Variant { dtype: DType::Bf16, head_dim: 128 }.shared_bytes(), 74_240);
        assert_eq!(Variant::for_problem(DType::F16, 40).map(|v| v.head_dim), Some(64));
        assert_eq!(Variant::for_problem(DType::F16, 72).map(|v| v.head_dim), Some(128));
        assert_eq!(Variant::for_problem(DType::F16, 136), None);
        assert_eq!(Variant::for_problem(DType::F16, 60), None);
    }
}
