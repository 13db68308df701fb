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
//! For a paged KV cache, the kernel forms every K/V row address in one function, `kv_row(b, g,
//! j)`: a block table (`[batch, max_pages]` page indices into `[num_pages, page_size, heads_kv,
//! D]`) changes that function and the parameter block. Per-sequence key counts replace `seq_k`
//! where the kernel computes a sequence's key range (`lo`, `hi` and the diagonal's shift), and
//! the plan sizes the splits by the longest sequence.

pub(crate) mod launch;
pub(crate) mod plan;
pub(crate) mod variant;

pub use plan::{MAX_ROWS, MAX_SPLITS, Split, Tiles};
pub use variant::{SOURCE, Variant};
