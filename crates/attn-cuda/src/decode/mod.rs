//! The decode family (sm_80 to sm_90): `kernels/decode.cu`, split-KV attention (flash-decoding)
//! for short query lengths, on `mma.sync`, `ldmatrix` and `cp.async`.
//!
//! The backend takes it on every architecture for problems whose GQA group holds few query
//! rows: `heads_q / heads_kv · seq_q ≤` [`MAX_ROWS`] (decode, seq_q 1 to 16 with groups up
//! to 4, 1 to 8 with groups of 8, and speculative decoding's short runs). There the prefill
//! kernels waste their 64- to 192-row query tiles and read each K/V head once per query head;
//! this one reads it once per split for the whole group, and cuts the keys into enough splits
//! to fill the device.
//!
//! - `variant`: one specialisation (dtype, head dim, row tiles, stages, mask), its shared memory
//!   and NVRTC request.
//! - `plan`: when the family applies, the variant and split count a problem takes, and the
//!   variants that ship.
//! - `launch`: the kernel's parameter block and the workspace (partial results and tickets).
//!
//! Packed (varlen) queries and keys, paged KV caches, per-sequence key counts (`seqused_k`),
//! soft-caps and ALiBi run in each tile configuration's extras variant ([`Variant::extras`],
//! `ATTN_EXTRAS`), which a problem takes when it asks for any of them; the plain variants compile
//! to the PTX they had before (`examples/decode_ptx.rs` checks it). The offsets, block table,
//! key counts and slopes are copied to the device with the inputs (`DeviceTensors`), or given as
//! the caller's device memory to the device-resident calls (unchecked there: the kernel clamps
//! offsets into the packed rows, key counts into `[0, seq_k]` and page numbers into
//! `[0, pages)`, see `crate::indices`). A sequence's rows and key range (`lo`, `hi`, the
//! diagonal's shift) are its own: a group's rows are sized by the longest sequence's queries (a
//! shorter one's rows past its own are padding, neither computed against keys nor stored), and
//! the plan sizes the splits by the longest sequence's keys, each sequence cutting its own into
//! that many (a split past a short sequence's end leaves an empty partial). Chunks start on
//! multiples of their 16 or 32 keys and pages hold a multiple of 16, so a chunk lies in at most
//! two pages, whose numbers `load_chunk` reads once per chunk.
//!
//! Head dims other than [`plan::HEAD_DIMS`] (multiples of 8 up to 256) run on the next of these
//! in its extras variant with [`Variant::pad`] (`ATTN_PAD`): only the problem's columns are
//! copied and stored, the rest are zeros in shared memory, which the products still cover (D = 80
//! padded on the 128 build took 0.78 of D = 128's time for 0.63 of its bytes; on its own build,
//! 0.68: `docs/performance.md`).

pub(crate) mod launch;
pub(crate) mod plan;
pub(crate) mod variant;

pub use plan::{MAX_ROWS, MAX_SPLITS, Split, Tiles};
pub use variant::{HEADERS, SOURCE, Variant};
