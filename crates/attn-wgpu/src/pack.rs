//! Host-side layout changes around the kernel, which reads contiguous BHSD tensors whose head
//! dim is padded to the kernel's (zeros: they change no dot product, and the padded output
//! columns are dropped on the way back).
//!
//! Packing happens once, in `prepare`, outside the timed dispatch; it is what lets the kernel
//! take any strides (views, BSHD, broadcast batches) with one indexing scheme. bf16 is widened
//! to f32 here, exactly, and the output rounded once back to bf16 on read. Rows are found
//! through the problem's [`SeqMap`], so that packed (varlen) queries and keys and a paged cache
//! are gathered into the same layout, each sequence's rows first in its slot of the longest
//! sequence's length and zeros after (the kernel reads each sequence's lengths).

use crate::plan::KernelType;
use attn_core::{Data, DataMut, Element, Inputs, SeqMap};
use half::f16;

/// Each sequence's query and key counts, as the kernel's `seq_lens` buffer holds them.
pub fn seq_lens(map: &SeqMap<'_>) -> Vec<u32> {
    (0..map.problem().shape.batch).flat_map(|b| [map.q_len(b) as u32, map.k_len(b) as u32]).collect()
}

/// q, k and v as the bytes of the kernel's buffers, `[batch, heads, rows, d_pad]`: each
/// sequence's rows (as `map` finds them) padded with zeros to `rows` (q, then k and v;
/// [`crate::plan::padded_rows`]). With `k_tiles` = `Some(bn)` (which
/// `rows.1` is a multiple of), K is laid out transposed per tile of `bn` keys: each head's
/// tile `t` is a `d_pad × bn` block, element (key `t·bn + n`, dim `d`) at `d·bn + n`, so that
/// four consecutive keys at one dim are one vec4 (`Variant::direct`).
pub fn pack_inputs(
    map: &SeqMap<'_>,
    inputs: &Inputs<'_>,
    ty: KernelType,
    d_pad: usize,
    rows: (usize, usize),
    k_tiles: Option<usize>,
) -> [Vec<u8>; 3] {
    let s = map.problem().shape;
    let one =
        |data: Data<'_>, row_at: &RowAt<'_>, heads: usize, seq: usize, seq_pad: usize, tiles| -> Vec<u8> {
            let dims = Dims { batch: s.batch, heads, seq, seq_pad, d: s.head_dim, d_pad, tiles };
            match (data, ty) {
                (Data::F32(x), _) => bytemuck::cast_slice(&pack(x, row_at, dims, |v| v)).to_vec(),
                (Data::Bf16(x), _) => bytemuck::cast_slice(&pack(x, row_at, dims, |v| v.to_f32())).to_vec(),
                (Data::F16(x), KernelType::F16) => {
                    pack(x, row_at, dims, |v| v.to_bits()).iter().flat_map(|b| b.to_le_bytes()).collect()
                }
                (Data::F16(x), KernelType::F32) => {
                    bytemuck::cast_slice(&pack(x, row_at, dims, |v| v.to_f32())).to_vec()
                }
            }
        };
    let q_at = |b, h, i| (i < map.q_len(b)).then(|| map.q_offset(b, h, i));
    let k_at = |b, g, j| (j < map.k_len(b)).then(|| map.k_offset(b, g, j));
    let v_at = |b, g, j| (j < map.k_len(b)).then(|| map.v_offset(b, g, j));
    [
        one(inputs.q, &q_at, s.heads_q, s.seq_q, rows.0, None),
        one(inputs.k, &k_at, s.heads_kv, s.seq_k, rows.1, k_tiles),
        one(inputs.v, &v_at, s.heads_kv, s.seq_k, rows.1, None),
    ]
}

/// Where row `(b, h, i)` of a tensor starts, or `None` past its sequence's rows.
type RowAt<'a> = dyn Fn(usize, usize, usize) -> Option<usize> + 'a;

/// Writes the kernel's packed output (`bytes`) into the rows of the output view that `map`
/// finds (each sequence's own rows); the gaps of a strided view, and packed rows of no
/// sequence, are left untouched.
pub fn unpack_output(map: &SeqMap<'_>, ty: KernelType, d_pad: usize, bytes: &[u8], out: &mut DataMut<'_>) {
    let s = map.problem().shape;
    let values: Vec<f32> = match ty {
        KernelType::F32 => bytemuck::cast_slice(bytes).to_vec(),
        KernelType::F16 => {
            bytes.chunks_exact(2).map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()).collect()
        }
    };
    fn scatter<T: Element>(dst: &mut [T], values: &[f32], map: &SeqMap<'_>, d_pad: usize) {
        let s = map.problem().shape;
        for (b, h, i) in map.rows() {
            let row = (b * s.heads_q + h) * s.seq_q + i;
            let at = map.o_offset(b, h, i);
            let src = &values[row * d_pad..row * d_pad + s.head_dim];
            for (x, &y) in dst[at..at + s.head_dim].iter_mut().zip(src) {
                *x = T::from_f32(y);
            }
        }
    }
    debug_assert_eq!(values.len(), s.batch * s.heads_q * s.seq_q * d_pad);
    match out {
        DataMut::F32(x) => scatter(x, &values, map, d_pad),
        DataMut::F16(x) => scatter(x, &values, map, d_pad),
        DataMut::Bf16(x) => scatter(x, &values, map, d_pad),
    }
}

/// Writes the kernel's LSE (`[batch, heads_q, seq_q]`, each sequence's rows first in its slot)
/// into the problem's LSE layout (`[heads_q, total]` for packed queries), each sequence's own
/// rows only.
pub fn unpack_lse(map: &SeqMap<'_>, kernel: &[f32], dst: &mut [f32]) {
    let s = map.problem().shape;
    if map.problem().batching.is_dense() {
        dst.copy_from_slice(kernel);
        return;
    }
    for (b, h, i) in map.rows() {
        dst[map.lse_index(b, h, i)] = kernel[(b * s.heads_q + h) * s.seq_q + i];
    }
}

/// The extents of one tensor.
#[derive(Clone, Copy)]
struct Dims {
    batch: usize,
    heads: usize,
    seq: usize,
    /// Rows per head in the packed tensor (`seq` and then zeros).
    seq_pad: usize,
    d: usize,
    d_pad: usize,
    /// Transposed per tile of this many rows (a divisor of `seq_pad`), where set.
    tiles: Option<usize>,
}

/// Contiguous `[batch, heads, seq_pad, d_pad]` from the rows `row_at` finds, converting each
/// element; the padding (and rows past a sequence's) is zeros. With `n.tiles = Some(bn)`, each
/// head's rows are instead stored as `seq_pad / bn` blocks of `[d_pad, bn]` (each tile
/// transposed).
fn pack<T: Copy, U: Copy + Default>(
    src: &[T],
    row_at: &RowAt<'_>,
    n: Dims,
    convert: impl Fn(T) -> U,
) -> Vec<U> {
    let mut out = vec![U::default(); n.batch * n.heads * n.seq_pad * n.d_pad];
    for b in 0..n.batch {
        for h in 0..n.heads {
            let head = (b * n.heads + h) * n.seq_pad * n.d_pad;
            for i in 0..n.seq {
                let Some(at) = row_at(b, h, i) else { continue };
                let row = &src[at..at + n.d];
                match n.tiles {
                    None => {
                        let to = head + i * n.d_pad;
                        for (x, &y) in out[to..to + n.d].iter_mut().zip(row) {
                            *x = convert(y);
                        }
                    }
                    Some(bn) => {
                        let tile = head + (i / bn) * n.d_pad * bn;
                        for (d, &y) in row.iter().enumerate() {
                            out[tile + d * bn + i % bn] = convert(y);
                        }
                    }
                }
            }
        }
    }
    out
}
