//! The Hopper family (sm_90a, H100/H200): `kernels/flash_fwd_sm90.cu`, a warp-specialized
//! FlashAttention forward on wgmma tensor-core products, TMA copies and mbarriers.
//!
//! The backend picks it on devices of compute capability 9.0 for what it supports (f16/bf16,
//! head dims 64, 128 and 256, strides that are multiples of 8 elements), and says in the plan
//! why it fell back to the Ampere/Ada family otherwise. Its settings ([`Settings`], read from the
//! `ATTN_CUDA_SM90_*` knobs in `crate::options`) force tiles, a smaller persistent grid, every
//! tile whole, one or two Q slots, the causal block order or a traced build.
//!
//! - [`plan`]: the variants, their tiles, launch and shared memory, validated before launch.
//! - `launch`: the kernel's parameter block with its four TMA tensor maps (Q, K, V in; O out),
//!   and the causal tile order's head groups.
//! - `wgmma`: the generated wgmma wrappers (the header `sm90_wgmma.cuh`).

pub(crate) mod launch;
pub mod plan;
mod wgmma;

pub use plan::{Form, Variant};

/// The kernel source, compiled at run time for sm_90a.
pub const SOURCE: &str = include_str!("../../kernels/flash_fwd_sm90.cu");
/// The Hopper primitives it includes as `sm90.cuh`.
pub const PRIMITIVES: &str = include_str!("../../kernels/sm90.cuh");

/// The Hopper family's settings (`crate::options`): each `None` leaves the plan's choice.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settings {
    /// `ATTN_CUDA_SM90_TILES`: tiles instead of the plan's ([`plan::key_tiles_for`]); consumers
    /// 0 stands for the head dim's.
    pub tiles: Option<plan::Tiles>,
    /// `ATTN_CUDA_SM90_GRID`: at most this many CTAs in the persistent grid (at most one per SM
    /// anyway).
    pub grid: Option<u32>,
    /// `ATTN_CUDA_SM90_SPLIT`: whether the persistent form may split its tail ([`plan::Split`];
    /// default yes).
    pub split: Option<bool>,
    /// `ATTN_CUDA_SM90_QSLOTS`: Q tiles in shared memory ([`Variant::q_slots`]).
    pub q_slots: Option<u32>,
    /// `ATTN_CUDA_SM90_BLOCKS`: causal query blocks from the bottom or not ([`Variant::bottom`]).
    pub bottom: Option<bool>,
    /// `ATTN_CUDA_SM90_TRACE`: where a traced build ([`Variant::trace`]) writes its timelines.
    pub trace: Option<std::path::PathBuf>,
    /// `ATTN_CUDA_FORM` (an experiment, retiring): an earlier form of the kernel.
    pub form: Option<Form>,
    /// `ATTN_CUDA_SM90_TURNS` (an experiment, retiring): the consumers' turns ([`Variant::pingpong`]).
    pub turns: Option<bool>,
    /// `ATTN_CUDA_SM90_TRIM` (an experiment, retiring): trimmed causal tiles ([`Variant::trim`]).
    pub trim: Option<bool>,
    /// `ATTN_CUDA_SM90_DEFINES` (an experiment, retiring): overrides compiled into every Hopper
    /// kernel (`crate::experiment_defines`).
    pub defines: Option<Vec<(String, String)>>,
}

impl Settings {
    /// Whether any is set (and so asks for the Hopper family).
    pub fn any(&self) -> bool {
        *self != Settings::default()
    }

    /// Whether the persistent form may split its tail.
    pub fn splits(&self) -> bool {
        self.split.unwrap_or(true)
    }
}
