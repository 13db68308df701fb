//! Appending new keys and values to a cache before attending: FlashAttention's
//! `flash_attn_with_kvcache` with its `k`/`v` arguments. This host version defines the
//! behaviour: sequence `b`'s new key `t` lands at position `seqused_k[b] + t` of that
//! sequence's cache (dense or paged), and the attention that follows sees `seqused_k[b] + len`
//! keys.
//!
//! Example: a paged cache of 4-key pages, `block_table = [[2, 0]]`, `seqused_k = [3]`; two new
//! keys go to row 3 of page 2 and row 0 of page 0, and the attention then takes
//! `seqused_k = [5]`.

use crate::{DType, Data, DataMut, Element, Error, Extras, KvRows, Problem, Result, Strides};

/// New rows (keys or values) for every sequence of a cache: `[batch, len, heads_kv, head_dim]`
/// as `strides` place them (batch, head and seq strides; the head dim contiguous).
#[derive(Clone, Copy, Debug)]
pub struct NewRows<'a> {
    /// The rows.
    pub data: Data<'a>,
    /// Their strides.
    pub strides: Strides,
    /// New rows per sequence.
    pub len: usize,
}

/// Which tensor of a cache a call writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheTensor {
    /// The keys (placed by the problem's `k` strides).
    Keys,
    /// The values (placed by the problem's `v` strides).
    Values,
}

/// Writes new keys and values into the cache `cache` describes (a problem with per-sequence key
/// counts, [`crate::Batching::keys_used`], whose keys are dense or paged) after each sequence's
/// `seqused_k[b]` keys, and returns the key counts after the append, which the attention call
/// that follows takes as its `seqused_k`. Every check happens before the first write (see
/// [`append_rows`]); `k_new` and `v_new` must have the same length.
pub fn append_kv(
    cache: &Problem,
    extras: Extras<'_>,
    k_cache: DataMut<'_>,
    v_cache: DataMut<'_>,
    k_new: NewRows<'_>,
    v_new: NewRows<'_>,
) -> Result<Vec<i32>> {
    if k_new.len != v_new.len {
        return Err(Error::InvalidParameter {
            what: format!("{} new keys but {} new values; append as many of each", k_new.len, v_new.len),
        });
    }
    check(cache, extras, CacheTensor::Keys, (k_cache.dtype(), k_cache.len()), &k_new)?;
    check(cache, extras, CacheTensor::Values, (v_cache.dtype(), v_cache.len()), &v_new)?;
    append_rows(cache, extras, CacheTensor::Keys, k_cache, k_new)?;
    append_rows(cache, extras, CacheTensor::Values, v_cache, v_new)
}

/// [`append_kv`] for one tensor of the cache (keys or values): checks the cache's extras,
/// dtypes, lengths, room for `len` more rows in every sequence (at most `seq_k`) and the
/// block-table entries the new rows reach, then writes; returns the key counts after the append.
pub fn append_rows(
    cache: &Problem,
    extras: Extras<'_>,
    tensor: CacheTensor,
    mut dst: DataMut<'_>,
    new: NewRows<'_>,
) -> Result<Vec<i32>> {
    check(cache, extras, tensor, (dst.dtype(), dst.len()), &new)?;
    let map = cache.seq_map(extras)?;
    let s = cache.shape;
    let d = s.head_dim;
    let used: Vec<usize> = (0..s.batch).map(|b| map.k_len(b)).collect();
    let places = (0..s.batch).flat_map(|b| {
        let (map, used) = (&map, &used);
        (0..new.len).flat_map(move |t| {
            (0..s.heads_kv).map(move |g| {
                let j = used[b] + t;
                let to = match tensor {
                    CacheTensor::Keys => map.k_offset(b, g, j),
                    CacheTensor::Values => map.v_offset(b, g, j),
                };
                (to, new.strides.offset(b, g, t))
            })
        })
    });
    fn copy<T: Element>(dst: &mut [T], src: &[T], places: impl Iterator<Item = (usize, usize)>, d: usize) {
        for (to, from) in places {
            dst[to..to + d].copy_from_slice(&src[from..from + d]);
        }
    }
    match (dst.reborrow(), new.data) {
        (DataMut::F32(dst), Data::F32(src)) => copy(dst, src, places, d),
        (DataMut::F16(dst), Data::F16(src)) => copy(dst, src, places, d),
        (DataMut::Bf16(dst), Data::Bf16(src)) => copy(dst, src, places, d),
        _ => unreachable!("dtypes checked"),
    }
    Ok(used.iter().map(|&n| (n + new.len) as i32).collect())
}

/// Everything [`append_rows`] checks before writing; `dst` is the cache tensor's (dtype, length).
fn check(
    cache: &Problem,
    extras: Extras<'_>,
    tensor: CacheTensor,
    dst: (DType, usize),
    new: &NewRows<'_>,
) -> Result<()> {
    let bad = |what: String| Err(Error::InvalidParameter { what });
    check_append_layout(cache, tensor, dst, (new.data.dtype(), new.data.len()), new.strides, new.len)?;
    let map = cache.seq_map(extras)?;
    let s = cache.shape;
    for b in 0..s.batch {
        let n = map.k_len(b);
        if n + new.len > s.seq_k {
            return bad(format!(
                "sequence {b} holds {n} keys; {} more do not fit its cache of seq_k = {} keys",
                new.len, s.seq_k
            ));
        }
        if let (KvRows::Paged { page_size, pages, pages_per_seq }, Some(table)) =
            (cache.batching.kv, extras.block_table)
        {
            for slot in n / page_size..(n + new.len).div_ceil(page_size) {
                let page = table[b * pages_per_seq + slot];
                if page < 0 || page as usize >= pages {
                    return bad(format!(
                        "block_table[{b}][{slot}] = {page}: the new keys of sequence {b} reach that slot, and a page \
                         number is 0 to {}",
                        pages - 1
                    ));
                }
            }
        }
    }
    Ok(())
}

/// What an append checks that does not read the index arrays' contents (the device path's
/// checks, where they are in device memory): a cache with per-sequence key counts whose keys
/// are dense or paged, a valid problem, and the cache tensor (`dst`: dtype, elements) and the
/// new rows (`new`: dtype, elements; `strides`, `len` rows per sequence) of the problem's
/// dtype and long enough for what the problem and the strides reach.
pub fn check_append_layout(
    cache: &Problem,
    tensor: CacheTensor,
    dst: (DType, usize),
    new: (DType, usize),
    strides: Strides,
    len: usize,
) -> Result<()> {
    if !cache.batching.keys_used || matches!(cache.batching.kv, KvRows::Packed { .. }) {
        return Err(Error::InvalidParameter {
            what: format!(
                "appending to a cache needs per-sequence key counts (seqused_k) and dense or paged keys; {cache} \
                 has neither or packed keys"
            ),
        });
    }
    cache.validate()?;
    let s = cache.shape;
    let [_, (_, k_need), (_, v_need), _] = cache.required_lens();
    let (name, need) = match tensor {
        CacheTensor::Keys => ("k", k_need),
        CacheTensor::Values => ("v", v_need),
    };
    let new_need = strides.required_len(s.batch, s.heads_kv, len.max(1), s.head_dim);
    for (what, (dtype, len), need) in [("cache", dst, need), ("new rows", new, new_need)] {
        if dtype != cache.dtype {
            return Err(Error::DTypeMismatch { tensor: name, expected: cache.dtype, found: dtype });
        }
        if len < need {
            return Err(Error::Shape {
                tensor: name,
                what: format!("the {what} have {len} elements; they need {need}"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sequences::{KeyStore, batch_of};
    use crate::{Buffer, DType, Shape};

    /// The module's example: two new keys after three, across a page boundary.
    #[test]
    fn new_keys_land_after_each_sequences_keys_in_its_pages() {
        let shape = Shape { heads_kv: 1, ..Shape::new(1, 1, 1, 2) };
        let (cache, mut extras) =
            batch_of(shape, DType::F32, &[1], &[8], KeyStore::Paged { page_size: 4, seed: 0 });
        extras.block_table = Some(vec![2, 0]);
        extras.seqused_k = Some(vec![3]);
        let pages = match cache.batching.kv {
            KvRows::Paged { pages, .. } => pages,
            _ => unreachable!(),
        };
        let (mut k, mut v) =
            (Buffer::zeros(DType::F32, pages * 4 * 2), Buffer::zeros(DType::F32, pages * 4 * 2));
        let new_k = Buffer::from_f32(DType::F32, [1.0, 2.0, 3.0, 4.0]);
        let new_v = Buffer::from_f32(DType::F32, [5.0, 6.0, 7.0, 8.0]);
        let strides = Strides { batch: 4, head: 2, seq: 2 };
        let new = NewRows { data: new_k.as_data(), strides, len: 2 };
        let new_values = NewRows { data: new_v.as_data(), ..new };
        let used =
            append_kv(&cache, extras.borrow(), k.as_data_mut(), v.as_data_mut(), new, new_values).unwrap();
        assert_eq!(used, vec![5]);
        let (k, v) = (k.to_f32_vec(), v.to_f32_vec());
        // Row 3 of page 2 (element 2·8 + 3·2) and row 0 of page 0.
        assert_eq!((&k[22..24], &k[0..2]), (&[1.0, 2.0][..], &[3.0, 4.0][..]));
        assert_eq!((&v[22..24], &v[0..2]), (&[5.0, 6.0][..], &[7.0, 8.0][..]));
        assert_eq!(k.iter().filter(|&&x| x != 0.0).count(), 4, "nothing else written");

        // Errors, before any write, into scratch caches.
        let fails = |extras: &crate::OwnedExtras, k: NewRows<'_>, v: NewRows<'_>| {
            let (mut kc, mut vc) = (Buffer::zeros(DType::F32, 64), Buffer::zeros(DType::F32, 64));
            append_kv(&cache, extras.borrow(), kc.as_data_mut(), vc.as_data_mut(), k, v)
                .unwrap_err()
                .to_string()
        };
        // No room: 6 more after 3 in a cache of seq_k = 8 keys.
        let six = Buffer::zeros(DType::F32, 12);
        let six = NewRows { data: six.as_data(), len: 6, ..new };
        let err = fails(&extras, six, six);
        assert!(err.contains("do not fit") && err.contains("seq_k = 8"), "{err}");
        // Keys and values of different lengths.
        assert!(fails(&extras, new, NewRows { len: 1, ..new }).contains("as many of each"));
        // A table slot the new keys reach but that holds no page.
        extras.block_table = Some(vec![2, -1]);
        let err = fails(&extras, new, new);
        assert!(err.contains("block_table[0][1] = -1"), "{err}");
    }
}
