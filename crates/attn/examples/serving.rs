//! What an inference server does, on the slice path: a varlen prefill of prompts of different
//! lengths (packed, FlashAttention's `cu_seqlens`), their keys and values moved into a paged
//! cache, then decode steps that append one key per sequence and attend over the pages
//! (FlashAttention's `flash_attn_with_kvcache`), all with ALiBi. Every step is checked against
//! the exact reference. `cargo run --release --example serving`.

use attn::sequences::{KeyStore, alibi_standard_slopes, batch_of};
use attn::{Alibi, Attention, Backend, Buffer, DType, Inputs, NewRows, Outputs, Problem, Shape, append_kv};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (heads_q, heads_kv, d) = (8, 2, 64);
    let shape = Shape { heads_kv, ..Shape::new(1, heads_q, 1, d) };
    let prompts = [37usize, 5, 120];
    let mut rng = attn::rng::SplitMix64::new(7);
    let mut random = |len: usize| -> Vec<f32> { (0..len).map(|_| rng.normal() as f32).collect() };
    let slopes = alibi_standard_slopes(heads_q);

    // Prefill: the prompts packed back to back, each causal on its own length.
    let (prefill, mut packed) = batch_of(shape, DType::F32, &prompts, &prompts, KeyStore::Packed);
    let prefill = prefill.causal().with_alibi(Alibi::PerHead);
    packed.alibi_slopes = Some(slopes.clone());
    let [q, k, v] = [0, 1, 2].map(|t| Buffer::F32(random(prefill.required_lens()[t].1)));
    let backend = Backend::auto(&prefill)?;
    println!("prefill on {}: {prefill}", backend.name());
    check(
        &*backend,
        &prefill,
        Inputs::new(q.as_data(), k.as_data(), v.as_data()).with_extras(packed.borrow()),
    )?;

    // A paged cache of 16-key pages with room for 8 more keys per sequence; the prompts' keys and
    // values moved in row by row (what a server's cache-write kernel does).
    let room: Vec<usize> = prompts.iter().map(|n| n + 8).collect();
    let (cache, mut extras) =
        batch_of(shape, DType::F32, &[1; 3], &room, KeyStore::Paged { page_size: 16, seed: 3 });
    let cache = cache.causal().with_alibi(Alibi::PerHead);
    extras.alibi_slopes = Some(slopes);
    let [_, (_, k_len), (_, v_len), _] = cache.required_lens();
    let (mut k_cache, mut v_cache) = (vec![0f32; k_len], vec![0f32; v_len]);
    {
        let from = prefill.seq_map(packed.borrow())?;
        let to = cache.seq_map(extras.borrow())?; // every sequence's cache, full size
        let [Buffer::F32(k), Buffer::F32(v)] = [&k, &v] else { unreachable!("f32") };
        for (b, &n) in prompts.iter().enumerate() {
            for (g, j) in (0..heads_kv).flat_map(|g| (0..n).map(move |j| (g, j))) {
                let (src, dst) = (from.k_offset(b, g, j), to.k_offset(b, g, j));
                k_cache[dst..dst + d].copy_from_slice(&k[src..src + d]);
                let (src, dst) = (from.v_offset(b, g, j), to.v_offset(b, g, j));
                v_cache[dst..dst + d].copy_from_slice(&v[src..src + d]);
            }
        }
    }
    extras.seqused_k = Some(prompts.iter().map(|&n| n as i32).collect());

    // Decode: each step appends one key and value per sequence, then attends over the pages.
    let backend = Backend::auto(&cache)?;
    println!("decode on {}: {cache}", backend.name());
    for step in 0..4 {
        let new_rows = attn::Layout::Bshd.strides(heads_kv, 1, d);
        let (k_new, v_new) = (random(3 * heads_kv * d), random(3 * heads_kv * d));
        let new_k = NewRows { data: attn::Data::F32(&k_new), strides: new_rows, len: 1 };
        let new_v = NewRows { data: attn::Data::F32(&v_new), ..new_k };
        let (k_dst, v_dst) = (attn::DataMut::F32(&mut k_cache), attn::DataMut::F32(&mut v_cache));
        let used = append_kv(&cache, extras.borrow(), k_dst, v_dst, new_k, new_v)?;
        println!("  step {step}: keys per sequence {used:?}");
        extras.seqused_k = Some(used);
        let q = random(cache.required_lens()[0].1);
        let inputs = Inputs::new(attn::Data::F32(&q), attn::Data::F32(&k_cache), attn::Data::F32(&v_cache));
        check(&*backend, &cache, inputs.with_extras(extras.borrow()))?;
    }
    Ok(())
}

/// Runs `problem` on `backend` and compares every row with the f64 reference.
fn check(
    backend: &dyn Attention,
    problem: &Problem,
    inputs: Inputs<'_>,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut o = Buffer::zeros(problem.dtype, problem.required_lens()[3].1);
    backend.forward(problem, inputs, Outputs { o: o.as_data_mut(), lse: None })?;
    let map = problem.seq_map(inputs.extras)?;
    let mut worst = 0.0f64;
    for (b, h, i) in map.rows() {
        let want = attn_cpu::Reference::row(problem, &inputs, b, h, i)?;
        let at = map.o_offset(b, h, i);
        for (x, w) in want.o.iter().enumerate() {
            worst = worst.max((o.as_data().get_f32(at + x) as f64 - w).abs());
        }
    }
    println!("  max |error| vs the f64 reference: {worst:.2e}");
    if worst > 1e-4 {
        return Err(format!("error {worst:.2e} past f32's rounding").into());
    }
    Ok(())
}
