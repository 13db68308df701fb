//! The arrays a device-resident call takes beside q, k, v and o: the LSE it writes and the
//! index arrays and slopes it reads ([`attn_core::Extras`] in device memory), and the checks
//! made on them before anything is enqueued.
//!
//! What is checked, with a typed error: each array is given exactly when the plan's problem
//! needs it, holds at least the entries the problem reads (`[batch + 1]` offsets, `[batch]` key
//! counts, `[batch, pages_per_seq]` page numbers, `[heads_q]` or `[batch, heads_q]` slopes),
//! belongs to the stream's context and is 4-byte aligned. What is not: the contents. The
//! host-copy path checks them with [`attn_core::Problem::check_extras`]; these calls cannot
//! without a copy back. Instead the kernels clamp every index they read into the problem's
//! bounds (offsets into `[0, total]`, lengths into `[0, seq_q]` / `[0, seq_k]` and never past
//! the packed rows, key counts into `[0, the keys a sequence holds]`, page numbers into
//! `[0, pages)`), a few scalar instructions per CTA or per page lookup: a corrupt array gives
//! wrong rows, never a read or write outside the tensors. Valid arrays pass the clamps
//! unchanged, so the results are the host-copy path's bit for bit.

use crate::tensors::ExtraPointers;
use attn_core::{Error, Problem, Result};
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, DevicePtr, DeviceSlice};

/// What [`crate::Cuda::run_on_stream`] takes beside q, k, v and o, each where the plan's
/// problem needs it (and only then): the LSE it writes, and the index arrays and ALiBi slopes
/// it reads, all of them device memory on the stream's context. `DeviceArrays::default()` is
/// none of them: a dense problem without LSE or ALiBi.
///
/// The contents are not checked (that would need a copy back to the host): the kernels clamp
/// every index into the problem's bounds, so bad contents give wrong rows but never touch
/// memory outside the tensors (see the [module notes](self)). [`attn_core::Problem::check_extras`]
/// checks a host copy where a caller has one.
#[derive(Debug, Default)]
pub struct DeviceArrays<'a> {
    /// `[batch, heads_q, seq_q]` f32 (or `[heads_q, total]` for packed queries), written:
    /// where the problem asks for the LSE.
    pub lse: Option<CudaViewMut<'a, f32>>,
    /// `[batch + 1]` i32 query offsets from 0: for packed (varlen) queries.
    pub cu_seqlens_q: Option<CudaView<'a, i32>>,
    /// `[batch + 1]` i32 key offsets from 0: for packed (varlen) keys.
    pub cu_seqlens_k: Option<CudaView<'a, i32>>,
    /// `[batch]` i32 keys each sequence uses: for per-sequence key counts (a paged cache's).
    pub seqused_k: Option<CudaView<'a, i32>>,
    /// `[batch, pages_per_seq]` i32 page numbers, row-major: for a paged KV cache.
    pub block_table: Option<CudaView<'a, i32>>,
    /// `[heads_q]` or `[batch, heads_q]` f32 slopes: for ALiBi.
    pub alibi_slopes: Option<CudaView<'a, f32>>,
}

impl<'a> DeviceArrays<'a> {
    /// Only an LSE buffer (a dense problem that asks for the LSE).
    pub fn with_lse(lse: CudaViewMut<'a, f32>) -> Self {
        DeviceArrays { lse: Some(lse), ..DeviceArrays::default() }
    }

    /// The index arrays as [`Given`]s (their lengths, addresses and contexts), in the order of
    /// [`Problem::extras_read`], with the guards that order the stream after their last writes elsewhere
    /// (held by the caller until the launch is enqueued).
    pub(crate) fn given<'s>(
        &'s self,
        stream: &'s CudaStream,
    ) -> ([Option<Given>; 5], Vec<cudarc::driver::SyncOnDrop<'s>>) {
        let mut guards = vec![];
        let ctx = stream.context().cu_ctx();
        let mut one =
            |address_and_guard: (u64, cudarc::driver::SyncOnDrop<'s>), len: usize, owner: &CudaStream| {
                guards.push(address_and_guard.1);
                let other_context = (owner.context().cu_ctx() != ctx).then(|| owner.context().ordinal());
                Some(Given { len: Some(len), address: address_and_guard.0, other_context })
            };
        let mut int = |v: &'s Option<CudaView<'a, i32>>| match v {
            Some(v) => one(v.device_ptr(stream), v.len(), v.stream()),
            None => None,
        };
        let ints =
            [int(&self.cu_seqlens_q), int(&self.cu_seqlens_k), int(&self.seqused_k), int(&self.block_table)];
        let slopes = match &self.alibi_slopes {
            Some(v) => one(v.device_ptr(stream), v.len(), v.stream()),
            None => None,
        };
        let [a, b, c, d] = ints;
        ([a, b, c, d, slopes], guards)
    }
}

/// One index array as a call gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Given {
    /// Its entries, where known (the raw entry does not know them).
    pub len: Option<usize>,
    /// Its device address.
    pub address: u64,
    /// The ordinal of the device of its context, where that is not the stream's context
    /// (`None`: the stream's context, or unknown).
    pub other_context: Option<usize>,
}

/// Checks `given` (in [`Problem::extras_read`]'s order) against `problem` (`stream_ordinal`, the device of the
/// stream's context, is for the errors): each array present exactly when the problem needs it, long enough
/// where its length is known, on the stream's context, 4-byte aligned. Returns the addresses
/// for the kernel's parameter block (0 for each absent one).
pub(crate) fn check(
    problem: &Problem,
    given: [Option<Given>; 5],
    stream_ordinal: usize,
) -> Result<ExtraPointers> {
    let mut at = [0u64; 5];
    for (i, (array, given)) in problem.extras_read().into_iter().zip(given).enumerate() {
        let (name, need, why) = (array.name, array.read, array.why);
        let kind = if name == "alibi_slopes" { "f32" } else { "i32" };
        let given = match (need, given) {
            (None, None) => continue,
            (Some((n, dims)), None) => {
                return Err(Error::Shape {
                    tensor: name,
                    what: format!(
                        "the problem uses {}, so `{name}` ({dims} = {n} {kind} in device memory) is \
                         required but was not given",
                        why
                    ),
                });
            }
            (None, Some(_)) => {
                return Err(Error::Shape {
                    tensor: name,
                    what: format!(
                        "`{name}` was given, but the problem uses no {}: give it only with one",
                        why
                    ),
                });
            }
            (Some((n, dims)), Some(g)) => {
                if let Some(len) = g.len
                    && len < n
                {
                    return Err(Error::Shape {
                        tensor: name,
                        what: format!("the device buffer holds {len} {kind}; the problem reads {dims} = {n}"),
                    });
                }
                g
            }
        };
        if let Some(ordinal) = given.other_context {
            return Err(Error::Shape {
                tensor: name,
                what: format!(
                    "its buffer belongs to the context of device {ordinal}, the stream to device \
                     {stream_ordinal}'s: arrays and stream must share a context"
                ),
            });
        }
        if given.address % 4 != 0 {
            return Err(Error::Shape {
                tensor: name,
                what: format!(
                    "device address {:#x} is not a 4-byte aligned {kind} array: the kernels read it {kind} by {kind}",
                    given.address
                ),
            });
        }
        at[i] = given.address;
    }
    let [cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes] = at;
    Ok(ExtraPointers { cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes })
}

/// [`ExtraPointers`] of the raw entry as [`Given`]s (0: absent; lengths and contexts unknown).
pub(crate) fn given_raw(at: ExtraPointers) -> [Option<Given>; 5] {
    [at.cu_seqlens_q, at.cu_seqlens_k, at.seqused_k, at.block_table, at.alibi_slopes]
        .map(|address| (address != 0).then_some(Given { len: None, address, other_context: None }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_core::sequences::{KeyStore, batch_of};
    use attn_core::{Alibi, DType, Shape};

    /// Each array's name and the entries the problem reads from it, in `check`'s order.
    fn needed(problem: &Problem) -> [(&'static str, Option<(usize, &'static str)>); 5] {
        problem.extras_read().map(|a| (a.name, a.read))
    }

    fn shape() -> Shape {
        Shape { batch: 1, heads_q: 4, heads_kv: 2, seq_q: 1, seq_k: 1, head_dim: 64 }
    }

    /// Three sequences, packed queries and keys.
    fn packed() -> Problem {
        batch_of(shape(), DType::Bf16, &[3, 1, 2], &[5, 2, 4], KeyStore::Packed).0
    }

    /// Two sequences in a paged cache of 16-key pages, with ALiBi per (batch, head).
    fn paged() -> Problem {
        let (p, _) =
            batch_of(shape(), DType::Bf16, &[1, 1], &[40, 7], KeyStore::Paged { page_size: 16, seed: 1 });
        p.with_alibi(Alibi::PerBatchHead)
    }

    fn array(len: usize) -> Option<Given> {
        Some(Given { len: Some(len), address: 0x1000, other_context: None })
    }

    fn err(r: Result<ExtraPointers>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn needed_arrays_follow_the_layout() {
        let n = needed(&packed());
        assert_eq!(n[0].1, Some((4, "[batch + 1]")));
        assert_eq!(n[1].1, Some((4, "[batch + 1]")));
        assert!(n[2].1.is_none() && n[3].1.is_none() && n[4].1.is_none());
        let n = needed(&paged());
        assert!(n[0].1.is_none() && n[1].1.is_none());
        assert_eq!(n[2].1, Some((2, "[batch]")));
        assert_eq!(n[3].1, Some((2 * 3, "[batch, pages_per_seq]")));
        assert_eq!(n[4].1, Some((2 * 4, "[batch, heads_q]")));
        let per_head = paged().with_alibi(Alibi::PerHead);
        assert_eq!(needed(&per_head)[4].1, Some((4, "[heads_q]")));
        let dense = Problem::new(shape(), DType::Bf16);
        assert!(needed(&dense).iter().all(|(_, n)| n.is_none()));
    }

    #[test]
    fn good_arrays_give_their_addresses() {
        let at = check(
            &packed(),
            [array(4), Some(Given { len: Some(9), address: 0x2000, other_context: None }), None, None, None],
            0,
        )
        .unwrap();
        assert_eq!((at.cu_seqlens_q, at.cu_seqlens_k, at.block_table), (0x1000, 0x2000, 0));
        let at = check(&paged(), [None, None, array(2), array(6), array(8)], 0).unwrap();
        assert_eq!(at.alibi_slopes, 0x1000);
        assert_eq!(
            check(&Problem::new(shape(), DType::Bf16), [None; 5], 0).unwrap(),
            ExtraPointers::default()
        );
    }

    #[test]
    fn a_missing_array_says_what_it_must_be() {
        let e = err(check(&packed(), [array(4), None, None, None, None], 0));
        assert!(
            e.contains("`cu_seqlens_k`")
                && e.contains("packed (varlen) keys")
                && e.contains("[batch + 1] = 4 i32"),
            "{e}"
        );
        let e = err(check(&paged(), [None, None, array(2), array(6), None], 0));
        assert!(e.contains("ALiBi") && e.contains("[batch, heads_q] = 8 f32"), "{e}");
    }

    #[test]
    fn an_array_the_problem_does_not_use_is_refused() {
        let e = err(check(&packed(), [array(4), array(4), None, array(6), None], 0));
        assert!(e.contains("`block_table` was given") && e.contains("uses no paged KV cache"), "{e}");
        let e = err(check(&Problem::new(shape(), DType::Bf16), [None, None, None, None, array(4)], 0));
        assert!(e.contains("`alibi_slopes` was given") && e.contains("ALiBi"), "{e}");
    }

    #[test]
    fn short_arrays_are_refused_longer_ones_taken() {
        let e = err(check(&packed(), [array(3), array(4), None, None, None], 0));
        assert!(e.contains("holds 3 i32") && e.contains("[batch + 1] = 4"), "{e}");
        let e = err(check(&paged(), [None, None, array(1), array(6), array(8)], 0));
        assert!(e.contains("seqused_k") && e.contains("[batch] = 2"), "{e}");
        let e = err(check(&paged(), [None, None, array(2), array(5), array(8)], 0));
        assert!(e.contains("[batch, pages_per_seq] = 6"), "{e}");
        let e = err(check(&paged(), [None, None, array(2), array(6), array(4)], 0));
        assert!(e.contains("holds 4 f32") && e.contains("[batch, heads_q] = 8"), "{e}");
        // A view into a longer buffer is fine: the problem reads its first entries.
        assert!(check(&paged(), [None, None, array(20), array(60), array(80)], 0).is_ok());
        // The raw entry's arrays have no known length: only presence and alignment are checked.
        let raw =
            ExtraPointers { seqused_k: 0x100, block_table: 0x200, alibi_slopes: 0x300, ..Default::default() };
        assert_eq!(check(&paged(), given_raw(raw), 0).unwrap(), raw);
    }

    #[test]
    fn another_context_and_misalignment_are_refused() {
        let other = Some(Given { len: Some(4), address: 0x1000, other_context: Some(1) });
        let e = err(check(&packed(), [array(4), other, None, None, None], 0));
        assert!(e.contains("device 1") && e.contains("device 0") && e.contains("share a context"), "{e}");
        let odd = Some(Given { len: Some(4), address: 0x1002, other_context: None });
        let e = err(check(&packed(), [odd, array(4), None, None, None], 0));
        assert!(e.contains("0x1002") && e.contains("4-byte aligned"), "{e}");
        let raw = ExtraPointers { cu_seqlens_q: 0x1001, cu_seqlens_k: 0x2000, ..Default::default() };
        assert!(err(check(&packed(), given_raw(raw), 0)).contains("4-byte aligned"));
    }
}
