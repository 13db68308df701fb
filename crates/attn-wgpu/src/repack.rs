//! The layout changes of a device-resident call, on the GPU: the pack pass
//! (`kernels/pack.wgsl`) copies q, k and v from the caller's buffers (any strides with a
//! contiguous head dim, f32, f16 or bf16, anywhere in a buffer) into the packed layout the
//! attention kernels read, and the unpack pass (`kernels/unpack.wgsl`) copies the packed output
//! and LSE into the caller's o and LSE. They do on the device what `pack.rs` does on the host for
//! the host path, bit for bit (their conversions are integer arithmetic: `kernels/convert.wgsl`).
//! With packed or paged sequences a sequence pass (`kernels/seqs.wgsl`) runs first: from the
//! caller's index arrays it writes each sequence's lengths and first packed rows, clamped into
//! the problem's bounds, which the pack and unpack passes and the kernel read.
//!
//! A caller's tensor is bound as a range of its buffer ([`Window`]) that starts at a multiple of
//! the device's `min_storage_buffer_offset_alignment` at or before the tensor's first byte, and
//! ends at the word after the last element its strides reach: the shader is told where the tensor
//! starts inside the range, so the caller's offsets need no alignment beyond their element size,
//! and a tensor in a buffer larger than one binding may be used as long as its own span fits.

use crate::plan::{KernelType, Variant};
use attn_core::{DType, Error, Problem, Result, Strides};

/// Invocations per workgroup of both passes (`@workgroup_size` in their WGSL).
pub(crate) const WORKGROUP: u32 = 64;

/// One specialisation of the pack or unpack pass: the caller's element type and the packed one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Repack {
    /// From the caller's `src` elements into a packed tensor of `ty`.
    Pack { src: DType, ty: KernelType },
    /// From a packed output of `ty` into the caller's `dst` elements.
    Unpack { ty: KernelType, dst: DType },
    /// The sequence table from the caller's index arrays (`kernels/seqs.wgsl`).
    Seqs,
}

impl Repack {
    /// The pass's WGSL.
    pub(crate) fn source(self) -> String {
        let convert = include_str!("../kernels/convert.wgsl");
        let code = |d: DType| match d {
            DType::F32 => "0",
            DType::F16 => "1",
            DType::Bf16 => "2",
        };
        let f16 = |ty: KernelType| if ty == KernelType::F16 { "true" } else { "false" };
        match self {
            Repack::Seqs => include_str!("../kernels/seqs.wgsl").to_string(),
            Repack::Pack { src, ty } => crate::wgsl::fill(
                include_str!("../kernels/pack.wgsl"),
                &[("CONVERT", convert), ("SRC", code(src)), ("DST_F16", f16(ty))],
            ),
            Repack::Unpack { ty, dst } => {
                let (word, store, nan) = match dst {
                    DType::F32 => ("u32", STORE_32, "0x7fc00000"),
                    DType::F16 => ("atomic<u32>", STORE_16, "0x7e00"),
                    DType::Bf16 => ("atomic<u32>", STORE_16, "0x7fc0"),
                };
                crate::wgsl::fill(
                    include_str!("../kernels/unpack.wgsl"),
                    &[
                        ("CONVERT", convert),
                        ("SRC_F16", f16(ty)),
                        ("DST", code(dst)),
                        ("NAN", nan),
                        ("O_WORD", word),
                        ("STORE", store),
                    ],
                )
            }
        }
    }

    /// Invocations per row of the unpack pass: the words a row of `d` elements of `dst` can touch.
    pub(crate) fn row_words(dst: DType, d: usize) -> usize {
        match dst {
            DType::F32 => d,
            // A row that starts at an odd element spans one word more than half its length.
            DType::F16 | DType::Bf16 => d / 2 + 1,
        }
    }
}

/// The unpack pass's store of one word of a row of 32-bit elements.
const STORE_32: &str = "    if (w < P.d) {
        o[first + w] = value(row, w);
    }";

/// The same for 16-bit elements: word `w` of the row holds one or two of its elements; a word
/// shared with memory outside the view (or with another row) is changed only in the row's half.
const STORE_16: &str = "    let word = (first >> 1u) + w;
    let lo = 2u * word;
    let lo_in = lo >= first && lo < first + P.d;
    let hi_in = lo + 1u >= first && lo + 1u < first + P.d;
    if (lo_in && hi_in) {
        atomicStore(&o[word], value(row, lo - first) | (value(row, lo + 1u - first) << 16u));
    } else if (lo_in) {
        atomicAnd(&o[word], 0xffff0000u);
        atomicOr(&o[word], value(row, lo - first));
    } else if (hi_in) {
        atomicAnd(&o[word], 0x0000ffffu);
        atomicOr(&o[word], value(row, lo + 1u - first) << 16u);
    }";

/// The pack pass's uniform block; matches `struct Pack` in `kernels/pack.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct PackParams {
    base: u32,
    stride_b: u32,
    stride_h: u32,
    stride_s: u32,
    heads: u32,
    seq: u32,
    d: u32,
    seq_pad: u32,
    d_pad: u32,
    tile: u32,
    words: u32,
    groups_x: u32,
    seqs: u32,
    rows: u32,
    which: u32,
    batch: u32,
    page_size: u32,
    pages: u32,
    pages_per_seq: u32,
    table_at: u32,
}

/// The unpack pass's uniform block; matches `struct Unpack` in `kernels/unpack.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct UnpackParams {
    base: u32,
    stride_b: u32,
    stride_h: u32,
    stride_s: u32,
    heads: u32,
    seq: u32,
    d: u32,
    d_pad: u32,
    row_words: u32,
    invocations: u32,
    groups_x: u32,
    lse_base: u32,
    lse_on: u32,
    seqs: u32,
    q_packed: u32,
    q_total: u32,
    batch: u32,
    pad: [u32; 3],
}

/// The sequence pass's uniform block; matches `struct Seqs` in `kernels/seqs.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct SeqsParams {
    batch: u32,
    seq_q: u32,
    seq_k: u32,
    q_packed: u32,
    q_total: u32,
    k_packed: u32,
    k_total: u32,
    k_used: u32,
    cu_q_at: u32,
    cu_k_at: u32,
    used_at: u32,
    pad: u32,
}

/// Where each index array a problem reads starts in the call's copy of them (`indices`, in
/// entries; [`attn_core::Problem::extras_read`]'s order, the slopes left out), and the entries
/// in all: the arrays the problem reads, one after another.
pub(crate) fn index_layout(problem: &Problem) -> ([u32; 4], u64) {
    let mut at = [0u32; 4];
    let mut next = 0u64;
    for (i, array) in problem.extras_read().into_iter().take(4).enumerate() {
        at[i] = next as u32;
        next += array.read.map_or(0, |(n, _)| n as u64);
    }
    (at, next)
}

/// The sequence pass of `problem` (one with sequences of their own lengths), and its grid.
pub(crate) fn seqs_pass(problem: &Problem) -> Result<Pass<SeqsParams>> {
    let s = problem.shape;
    let b = problem.batching;
    let (at, _) = index_layout(problem);
    let (q_packed, q_total) = match b.q {
        attn_core::QueryRows::Packed { total } => (1, u32_of(total as u64)?),
        _ => (0, 0),
    };
    let (k_packed, k_total) = match b.kv {
        attn_core::KvRows::Packed { total } => (1, u32_of(total as u64)?),
        _ => (0, 0),
    };
    Ok(Pass {
        params: SeqsParams {
            batch: u32_of(s.batch as u64)?,
            seq_q: s.seq_q as u32,
            seq_k: s.seq_k as u32,
            q_packed,
            q_total,
            k_packed,
            k_total,
            k_used: u32::from(b.keys_used),
            cu_q_at: at[0],
            cu_k_at: at[1],
            used_at: at[2],
            pad: 0,
        },
        grid: [u32_of((s.batch as u64).div_ceil(WORKGROUP as u64))?, 1, 1],
    })
}

/// A pass's uniform block and its grid.
pub(crate) struct Pass<T> {
    pub(crate) params: T,
    pub(crate) grid: [u32; 3],
}

/// Which of q, k, v a pack pass fills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Input {
    Q,
    K,
    V,
}

/// The pack pass of `input` for `problem` run by `variant`, the tensor starting at element `base`
/// of its binding.
pub(crate) fn pack_pass(
    problem: &Problem,
    variant: &Variant,
    input: Input,
    base: u32,
    per_dim: u32,
) -> Result<Pass<PackParams>> {
    let s = problem.shape;
    let d_pad = variant.head_dim as usize;
    let rows = crate::plan::padded_rows(variant, s.seq_q, s.seq_k);
    let (st, heads, seq, seq_pad, tile) = match input {
        Input::Q => (problem.strides.q, s.heads_q, s.seq_q, rows.0, 0),
        Input::K => {
            let tile = if variant.direct { variant.block_n() } else { 0 };
            (problem.strides.k, s.heads_kv, s.seq_k, rows.1, tile)
        }
        Input::V => (problem.strides.v, s.heads_kv, s.seq_k, rows.1, 0),
    };
    let elements = (s.batch * heads * seq_pad * d_pad) as u64;
    let words = elements / (4 / variant.ty.size());
    let grid = grid(words, per_dim)?;
    let [stride_b, stride_h, stride_s] = strides32(st)?;
    // Where the rows of a sequence are: packed, in pages, or at (b, row).
    let rows_of = match (input, problem.batching.q, problem.batching.kv) {
        (Input::Q, attn_core::QueryRows::Packed { .. }, _) => 1,
        (Input::K | Input::V, _, attn_core::KvRows::Packed { .. }) => 1,
        (Input::K | Input::V, _, attn_core::KvRows::Paged { .. }) => 2,
        _ => 0,
    };
    let (page_size, pages, pages_per_seq) = match problem.batching.kv {
        attn_core::KvRows::Paged { page_size, pages, pages_per_seq } => {
            (page_size, pages.max(1), pages_per_seq)
        }
        _ => (1, 1, 0),
    };
    Ok(Pass {
        params: PackParams {
            base,
            stride_b,
            stride_h,
            stride_s,
            heads: heads as u32,
            seq: seq as u32,
            d: s.head_dim as u32,
            seq_pad: seq_pad as u32,
            d_pad: d_pad as u32,
            tile,
            words: u32_of(words)?,
            groups_x: grid[0],
            seqs: u32::from(!problem.batching.is_dense()),
            rows: rows_of,
            which: u32::from(input != Input::Q),
            batch: s.batch as u32,
            page_size: u32_of(page_size as u64)?,
            pages: u32_of(pages as u64)?,
            pages_per_seq: u32_of(pages_per_seq as u64)?,
            table_at: index_layout(problem).0[3],
        },
        grid,
    })
}

/// The unpack pass of `problem` run by `variant`: o starting at element `base` of its binding,
/// the LSE (where asked for) at element `lse_base` of its.
pub(crate) fn unpack_pass(
    problem: &Problem,
    variant: &Variant,
    base: u32,
    lse_base: u32,
    per_dim: u32,
) -> Result<Pass<UnpackParams>> {
    let s = problem.shape;
    let rows = (s.batch * s.heads_q * s.seq_q) as u64;
    let row_words = Repack::row_words(problem.dtype, s.head_dim);
    let invocations = rows * row_words as u64;
    let grid = grid(invocations, per_dim)?;
    let [stride_b, stride_h, stride_s] = strides32(problem.strides.o)?;
    Ok(Pass {
        params: UnpackParams {
            base,
            stride_b,
            stride_h,
            stride_s,
            heads: s.heads_q as u32,
            seq: s.seq_q as u32,
            d: s.head_dim as u32,
            d_pad: variant.head_dim,
            row_words: row_words as u32,
            invocations: u32_of(invocations)?,
            groups_x: grid[0],
            lse_base,
            lse_on: u32::from(problem.params.return_lse),
            seqs: u32::from(!problem.batching.is_dense()),
            q_packed: u32::from(matches!(problem.batching.q, attn_core::QueryRows::Packed { .. })),
            q_total: match problem.batching.q {
                attn_core::QueryRows::Packed { total } => u32_of(total as u64)?,
                _ => 0,
            },
            batch: s.batch as u32,
            pad: [0; 3],
        },
        grid,
    })
}

/// Workgroups of [`WORKGROUP`] for `invocations`: along x up to the device's limit per
/// dimension, then along y.
fn grid(invocations: u64, per_dim: u32) -> Result<[u32; 3]> {
    let groups = invocations.div_ceil(WORKGROUP as u64).max(1);
    let x = groups.min(per_dim.max(1) as u64);
    let y = groups.div_ceil(x);
    if y > per_dim as u64 {
        return Err(Error::TooLarge {
            what: format!(
                "a layout pass of {invocations} invocations exceeds {per_dim}² workgroups of {WORKGROUP}"
            ),
        });
    }
    Ok([x as u32, y as u32, 1])
}

/// A tensor's strides as the passes' u32s (they index within one binding, which is smaller).
fn strides32(st: Strides) -> Result<[u32; 3]> {
    Ok([u32_of(st.batch as u64)?, u32_of(st.head as u64)?, u32_of(st.seq as u64)?])
}

fn u32_of(x: u64) -> Result<u32> {
    u32::try_from(x).map_err(|_| Error::TooLarge {
        what: format!("{x} does not fit the 32-bit indices of the layout passes"),
    })
}

/// Where a caller's tensor is bound: a byte range of its buffer, and the element of that range
/// the tensor starts at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    /// First byte of the binding: a multiple of the storage offset alignment.
    pub(crate) offset: u64,
    /// Bytes bound: a multiple of 4.
    pub(crate) size: u64,
    /// The tensor's first element, counted from `offset`.
    pub(crate) base: u32,
}

/// What [`window`] needs to know about one caller tensor.
pub(crate) struct Extent {
    /// `q`, `k`, `v`, `o` or `lse`.
    pub(crate) tensor: &'static str,
    /// The buffer's size and usage.
    pub(crate) buffer_size: u64,
    pub(crate) usage: wgpu::BufferUsages,
    /// The tensor's first byte in the buffer.
    pub(crate) offset: u64,
    /// Bytes per element.
    pub(crate) element: u64,
    /// Elements from the first to one past the last that the strides reach.
    pub(crate) span: u128,
}

/// The binding of a caller's tensor, or a typed error saying why the buffer cannot hold it:
/// no `STORAGE` usage, an offset that is not a whole element, a buffer too small for what the
/// strides reach (rounded up to the whole word, as storage bindings are), or a span larger than
/// one binding may be on this device.
pub(crate) fn window(e: &Extent, alignment: u64, max_binding: u64, device: &str) -> Result<Window> {
    let shape = |what: String| Error::Shape { tensor: e.tensor, what };
    if !e.usage.contains(wgpu::BufferUsages::STORAGE) {
        return Err(shape(format!(
            "the buffer's usages are {:?}; it must have STORAGE (the layout passes bind it as a storage buffer)",
            e.usage
        )));
    }
    if !e.offset.is_multiple_of(e.element) {
        return Err(shape(format!(
            "byte offset {} is not a multiple of the element size, {} bytes",
            e.offset, e.element
        )));
    }
    let end = e.offset as u128 + e.span * e.element as u128;
    // Storage bindings are whole 4-byte words.
    let end_word = end.div_ceil(4) * 4;
    if end_word > e.buffer_size as u128 {
        return Err(shape(format!(
            "the buffer holds {} bytes; from byte offset {} the problem's shape and strides reach byte {end}{}",
            e.buffer_size,
            e.offset,
            if end_word > end {
                format!(" (bound as whole 4-byte words: {end_word})")
            } else {
                String::new()
            }
        )));
    }
    let start = e.offset - e.offset % alignment;
    let size = (end_word - start as u128) as u64;
    if size > max_binding {
        return Err(Error::OverDeviceLimit {
            kernel: format!("the binding of `{}`", e.tensor),
            resource: "storage buffer binding bytes",
            needed: size,
            allowed: max_binding,
            device: device.into(),
        });
    }
    Ok(Window { offset: start, size, base: ((e.offset - start) / e.element) as u32 })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every specialisation of both passes parses and validates.
    #[test]
    fn every_pass_validates() {
        let mut all = vec![];
        for ty in [KernelType::F32, KernelType::F16] {
            for d in [DType::F32, DType::F16, DType::Bf16] {
                all.push(Repack::Pack { src: d, ty });
                all.push(Repack::Unpack { ty, dst: d });
            }
        }
        all.push(Repack::Seqs);
        for r in all {
            let src = r.source();
            let module = naga::front::wgsl::parse_str(&src)
                .unwrap_or_else(|e| panic!("{r:?}: {}", e.emit_to_string(&src)));
            let caps = naga::valid::Capabilities::empty();
            naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
                .validate(&module)
                .unwrap_or_else(|e| panic!("{r:?}: {}", e.emit_to_string(&src)));
        }
    }

    /// The uniform blocks are the size of their WGSL structs, every field 4 bytes.
    #[test]
    fn params_match_the_wgsl_structs() {
        for (r, name, size) in [
            (Repack::Pack { src: DType::F32, ty: KernelType::F32 }, "Pack", size_of::<PackParams>()),
            (Repack::Unpack { ty: KernelType::F32, dst: DType::F32 }, "Unpack", size_of::<UnpackParams>()),
            (Repack::Seqs, "Seqs", size_of::<SeqsParams>()),
        ] {
            let module = naga::front::wgsl::parse_str(&r.source()).expect("parses");
            let (_, ty) = module.types.iter().find(|(_, t)| t.name.as_deref() == Some(name)).expect(name);
            let naga::TypeInner::Struct { members, span } = &ty.inner else {
                panic!("{name} is not a struct")
            };
            assert_eq!(*span as usize, size, "{name}");
            assert_eq!(members.len(), size / 4, "{name}: every field is 4 bytes");
        }
    }

    fn extent(buffer_size: u64, offset: u64, element: u64, span: u128) -> Extent {
        Extent { tensor: "q", buffer_size, usage: wgpu::BufferUsages::STORAGE, offset, element, span }
    }

    /// A binding starts at the alignment at or before the tensor and ends at its last word.
    #[test]
    fn windows_start_aligned_and_end_at_the_last_word() {
        let w = window(&extent(4096, 262, 2, 5), 256, 1 << 20, "dev").unwrap();
        assert_eq!(w, Window { offset: 256, size: 16, base: 3 });
        let w = window(&extent(4096, 0, 4, 10), 256, 1 << 20, "dev").unwrap();
        assert_eq!(w, Window { offset: 0, size: 40, base: 0 });
    }

    /// Each way a buffer can fail to hold a tensor is its own typed error.
    #[test]
    fn windows_refuse_what_cannot_be_bound() {
        let err = |e: Extent| window(&e, 256, 1 << 20, "dev").unwrap_err().to_string();
        assert!(err(extent(39, 0, 4, 10)).contains("reach byte 40"));
        // 5 f16 from byte 0 end at byte 10, whose word ends at 12.
        assert!(err(extent(10, 0, 2, 5)).contains("whole 4-byte words: 12"));
        assert!(err(extent(4096, 3, 2, 5)).contains("not a multiple of the element size"));
        let mut no_storage = extent(4096, 0, 4, 10);
        no_storage.usage = wgpu::BufferUsages::COPY_DST;
        assert!(err(no_storage).contains("must have STORAGE"));
        let e = window(&extent(1 << 30, 0, 4, 1 << 20), 256, 1 << 20, "dev").unwrap_err();
        assert!(matches!(e, Error::OverDeviceLimit { .. }), "{e}");
    }
}
