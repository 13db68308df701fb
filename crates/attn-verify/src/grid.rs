//! The case grids: `quick` (sub-minute, in every `cargo xtask test`) and `full`.

use crate::case::{Case, Distribution};
use attn_core::rng::SplitMix64;
use attn_core::sequences::{KeyStore, OwnedExtras, batch_of};
use attn_core::{Alibi, DType, Layout, Mask, Problem, Shape, Strides, TensorStrides};

pub(crate) fn case(family: &'static str, tag: &str, problem: Problem, dist: Distribution, seed: u64) -> Case {
    with_extras(family, tag, problem, OwnedExtras::default(), dist, seed)
}

pub(crate) fn with_extras(
    family: &'static str,
    tag: &str,
    problem: Problem,
    extras: OwnedExtras,
    dist: Distribution,
    seed: u64,
) -> Case {
    let mask = match problem.params.mask {
        attn_core::Mask::None => "full",
        attn_core::Mask::Causal => "causal",
        attn_core::Mask::Window { .. } => "window",
    };
    Case { family, name: format!("{family}/{}/{mask}/{tag}", problem.dtype), problem, dist, seed, extras }
}

/// ALiBi slopes as models use them: `2^(-8 (h + 1) / heads)`, for every (batch, head) when
/// `per_batch` (each batch's slopes scaled differently, so that a wrong batch index shows).
fn alibi_slopes(batch: usize, heads: usize, per_batch: bool) -> Vec<f32> {
    let slope = |b: usize, h: usize| (1.0 + b as f32) * 2f32.powf(-8.0 * (h + 1) as f32 / heads as f32);
    match per_batch {
        false => (0..heads).map(|h| slope(0, h)).collect(),
        true => (0..batch).flat_map(|b| (0..heads).map(move |h| slope(b, h))).collect(),
    }
}

/// Adds ALiBi slopes to a case's problem and extras.
pub(crate) fn alibi(mut c: Case, per_batch: bool) -> Case {
    let s = c.problem.shape;
    c.problem = c.problem.with_alibi(if per_batch { Alibi::PerBatchHead } else { Alibi::PerHead });
    c.extras.alibi_slopes = Some(alibi_slopes(s.batch, s.heads_q, per_batch));
    c.name += if per_batch { "/alibi-per-batch" } else { "/alibi" };
    c
}

pub(crate) fn p(shape: Shape, dtype: DType) -> Problem {
    Problem::new(shape, dtype).with_lse(true)
}

/// A GQA shape: `hq` query heads over `hkv` K/V heads, `sq` queries, `sk` keys.
pub(crate) fn gqa_shape(batch: usize, hq: usize, hkv: usize, sq: usize, sk: usize, d: usize) -> Shape {
    Shape { heads_kv: hkv, seq_q: sq, seq_k: sk, ..Shape::new(batch, hq, 1, d) }
}

pub(crate) fn sk(sq: usize, sk: usize, heads: usize, d: usize) -> Shape {
    Shape { seq_q: sq, seq_k: sk, ..Shape::new(1, heads, 1, d) }
}

/// [`batch_of`] with the LSE asked for, as every case does.
pub(crate) fn seqs(
    shape: Shape,
    dtype: DType,
    q_lens: &[usize],
    k_lens: &[usize],
    keys: KeyStore,
) -> (Problem, OwnedExtras) {
    let (problem, extras) = batch_of(shape, dtype, q_lens, k_lens, keys);
    (problem.with_lse(true), extras)
}

/// Views into buffers whose rows and heads are padded: outputs have gaps that must stay
/// untouched.
pub(crate) fn padded(problem: Problem) -> Problem {
    let s = problem.shape;
    let row = s.head_dim + 8;
    let pad = |heads: usize, seq: usize| Strides {
        batch: heads * (seq + 2) * row,
        head: (seq + 2) * row,
        seq: row,
    };
    let q = pad(s.heads_q, s.seq_q);
    let kv = pad(s.heads_kv, s.seq_k);
    problem.with_strides(TensorStrides { q, k: kv, v: kv, o: q })
}

/// About forty small cases covering every family: seconds on two cores.
pub fn quick() -> Vec<Case> {
    use DType::*;
    use Distribution::*;
    let mut v = vec![];
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        let base = p(Shape::new(2, 4, 128, 64), dtype);
        v.push(case("standard", "b2h4s128d64", base, Normal, 10 + i as u64));
        v.push(case("standard", "b2h4s128d64", base.causal(), Normal, 20 + i as u64));
        let large = p(Shape::new(1, 2, 100, 64), dtype).causal();
        v.push(case("large-logits", "s100d64", large, LargeMagnitude, 30 + i as u64));
    }
    v.extend([
        case("odd-lengths", "s1", p(Shape::new(1, 2, 1, 64), F32), Normal, 40),
        case("odd-lengths", "s77d32", p(Shape::new(1, 2, 77, 32), Bf16).causal(), Normal, 41),
        case("odd-lengths", "sq65sk130", p(sk(65, 130, 2, 64), F16), Normal, 42),
        case("head-dims", "d96", p(Shape::new(1, 2, 70, 96), F32).causal(), Normal, 50),
        case("head-dims", "d256", p(Shape::new(1, 2, 65, 256), Bf16).causal(), Normal, 51),
        case("head-dims", "d32", p(Shape::new(1, 2, 64, 32), F16), Normal, 52),
        // 200 keys: two key tiles or more in every GPU kernel at D = 128, so that a product
        // reads what the one before it left (registers, stages) in each form the quick grid checks.
        case("head-dims", "d128", p(Shape::new(1, 2, 200, 128), Bf16), Normal, 53),
        // Head dims between the GPU kernels' own (multiples of 8, which a kernel may run padded
        // to its next head dim): rows of these lengths next to each other in memory, so that a
        // kernel reading a padded row's length reads its neighbour's; GQA in half of them.
        case("head-dims", "d8-gqa", p(gqa_shape(1, 4, 2, 70, 70, 8), F16).causal(), Normal, 54),
        case("head-dims", "d40", p(Shape::new(1, 2, 130, 40), Bf16), Normal, 55),
        case("head-dims", "d80-gqa", p(gqa_shape(1, 4, 2, 100, 100, 80), F16).causal(), Normal, 56),
        case("head-dims", "d136", p(Shape::new(1, 2, 90, 136), Bf16).causal(), Normal, 57),
        case("head-dims", "d200-gqa", p(gqa_shape(1, 4, 1, 70, 70, 200), F16), Normal, 58),
        case("head-dims", "d248-gqa", p(gqa_shape(1, 4, 2, 65, 80, 248), Bf16).causal(), Normal, 59),
        case("gqa", "hq8hkv2", p(Shape { heads_kv: 2, ..Shape::new(1, 8, 96, 64) }, Bf16), OneHotPeaked, 60),
        case(
            "gqa",
            "mqa-hq8hkv1",
            p(Shape { heads_kv: 1, ..Shape::new(1, 8, 96, 64) }, F16).causal(),
            OneHotPeaked,
            61,
        ),
        case("causal-offset", "sq40sk150", p(sk(40, 150, 2, 64), F32).causal(), Normal, 70),
        case("empty-rows", "sq150sk40", p(sk(150, 40, 2, 64), Bf16).causal(), Normal, 71),
        case("one-hot", "s128", p(Shape::new(1, 4, 128, 64), Bf16).causal(), OneHotPeaked, 80),
        case("heavy-tail", "s128", p(Shape::new(1, 4, 128, 64), F32), HeavyTailed, 90),
        case("heavy-tail", "s128", p(Shape::new(1, 4, 128, 64), F16).causal(), HeavyTailed, 91),
        case(
            "layouts",
            "bshd",
            p(Shape { heads_kv: 2, ..Shape::new(2, 4, 80, 64) }, F16).with_layout(Layout::Bshd),
            Normal,
            100,
        ),
        case("layouts", "padded-views", padded(p(Shape::new(2, 2, 70, 64), Bf16).causal()), Normal, 101),
        case(
            "exact",
            "small-integers",
            p(Shape::new(1, 2, 64, 32), F32).with_scale(0.25),
            SmallIntegers,
            110,
        ),
        case("scale", "0.05", p(Shape::new(1, 2, 128, 128), Bf16).with_scale(0.05), Normal, 120),
        // GPU kernels fold the scale into the exponent and must handle its sign and zero apart.
        case(
            "scale",
            "negative",
            p(Shape::new(1, 2, 200, 64), Bf16).causal().with_scale(-0.125),
            Normal,
            121,
        ),
        case("scale", "zero", p(Shape::new(1, 2, 100, 128), F16).with_scale(0.0), Normal, 122),
        // Sliding windows: causal with a window behind the diagonal and seq_q < seq_k, windows
        // on both sides wider than the sequence, seq_q > seq_k (rows whose window lies before
        // key 0), and one ahead of the diagonal.
        case(
            "window",
            "sq40sk150-l16r0",
            p(sk(40, 150, 2, 64), F32).with_window(Some(16), Some(0)),
            Normal,
            140,
        ),
        case(
            "window",
            "wider-than-seq",
            p(Shape::new(1, 2, 100, 64), Bf16).with_window(Some(500), Some(500)),
            Normal,
            141,
        ),
        case(
            "window",
            "sq150sk40-l8r0",
            p(sk(150, 40, 2, 64), F16).with_window(Some(8), Some(0)),
            Normal,
            142,
        ),
        case(
            "window",
            "l0r24",
            p(Shape::new(1, 2, 130, 32), F32).with_window(Some(0), Some(24)),
            Normal,
            143,
        ),
        // Soft-capping: large logits, where the cap decides the softmax; with a window and GQA.
        case(
            "softcap",
            "cap30-large",
            p(Shape::new(1, 2, 100, 64), F32).with_softcap(30.0),
            LargeMagnitude,
            150,
        ),
        case(
            "softcap",
            "cap5-window-gqa",
            p(Shape { heads_kv: 2, ..Shape::new(1, 4, 96, 64) }, Bf16)
                .with_softcap(5.0)
                .with_window(Some(32), Some(0)),
            Normal,
            151,
        ),
        alibi(
            case(
                "alibi",
                "sq40sk96-hq4hkv2",
                p(Shape { heads_kv: 2, ..sk(40, 96, 4, 64) }, F32).causal(),
                Normal,
                160,
            ),
            false,
        ),
        alibi(case("alibi", "b2s80", p(Shape::new(2, 4, 80, 32), Bf16), Normal, 161), true),
        alibi(
            case(
                "alibi",
                "sq8sk70-window-cap",
                p(sk(8, 70, 2, 64), F16).with_window(Some(20), Some(3)).with_softcap(10.0),
                Normal,
                162,
            ),
            false,
        ),
    ]);
    // Sequences of different lengths: an empty one, one-token ones, queries longer than keys.
    let (q_lens, k_lens) = ([5, 0, 1, 40, 17], [9, 3, 1, 33, 70]);
    let gqa = Shape { heads_kv: 2, ..Shape::new(1, 4, 1, 64) };
    for (dtype, causal, seed) in [(F32, true, 170), (Bf16, false, 171)] {
        let (mut problem, extras) = seqs(gqa, dtype, &q_lens, &k_lens, KeyStore::Packed);
        if causal {
            problem = problem.causal();
        }
        v.push(with_extras("varlen", "b5-hq4hkv2", problem, extras, OneHotPeaked, seed));
    }
    let (problem, extras) = seqs(Shape::new(1, 2, 1, 32), F16, &q_lens, &k_lens, KeyStore::Packed);
    let windowed = problem.with_window(Some(6), Some(2)).with_softcap(8.0);
    v.push(alibi(with_extras("varlen", "b5-window-cap", windowed, extras, Normal, 172), true));
    // A paged cache: pages shuffled, sequences filling them partly; decode and a prefill chunk.
    for (page, sq, dtype, seed) in [(16, 1, Bf16, 180), (16, 4, F32, 181), (64, 9, F16, 182)] {
        let k_lens = [37, 1, 130, 64];
        let (problem, extras) =
            seqs(gqa, dtype, &[sq; 4], &k_lens, KeyStore::Paged { page_size: page, seed });
        v.push(with_extras(
            "paged",
            &format!("page{page}-sq{sq}"),
            problem.causal(),
            extras,
            OneHotPeaked,
            seed,
        ));
    }
    let (problem, extras) =
        seqs(gqa, Bf16, &[3, 1, 8], &[50, 7, 90], KeyStore::Paged { page_size: 16, seed: 183 });
    v.push(alibi(
        with_extras(
            "paged",
            "page16-varlen-window",
            problem.with_window(Some(24), Some(0)),
            extras,
            Normal,
            183,
        ),
        false,
    ));
    // Prefill chunks from a paged cache (more query rows per KV head than the decode family
    // takes, so the prefill kernels' paging runs): pages of 16, 48 (dividing no key tile), 64
    // (D=64: the Hopper family's paged tiles) and 256 keys, shuffled; a sequence without queries, one of a single key, key counts ending
    // mid-page and mid-tile; each GPU kernel head dim; causal and not, a window with ALiBi.
    let prefill = |d: usize| Shape { heads_kv: 2, ..Shape::new(1, 4, 1, d) };
    for (d, page, dtype, causal, seed) in [
        (64, 16, Bf16, true, 186),
        (128, 48, F16, false, 187),
        (256, 256, Bf16, false, 188),
        (128, 64, Bf16, true, 189),
        (64, 64, F16, false, 191),
    ] {
        let (mut problem, extras) = seqs(
            prefill(d),
            dtype,
            &[70, 0, 33, 130],
            &[300, 1, 33, 177],
            KeyStore::Paged { page_size: page, seed },
        );
        if causal {
            problem = problem.causal();
        }
        v.push(with_extras("paged", &format!("prefill-d{d}-page{page}"), problem, extras, Normal, seed));
    }
    // D=64 from pages of 64 keys with a soft-cap (large logits) and ALiBi under a causal mask (on
    // the Hopper family, the soft-capped sequences' tiles, not its paged ones).
    let (problem, extras) = seqs(
        prefill(64),
        Bf16,
        &[70, 0, 33, 130],
        &[300, 1, 33, 177],
        KeyStore::Paged { page_size: 64, seed: 195 },
    );
    let capped = problem.causal().with_softcap(5.0);
    v.push(alibi(with_extras("paged", "prefill-d64-page64-cap5", capped, extras, LargeMagnitude, 195), true));
    let (problem, extras) =
        seqs(prefill(128), Bf16, &[90, 40], &[400, 41], KeyStore::Paged { page_size: 64, seed: 190 });
    let windowed = problem.with_window(Some(150), Some(0));
    v.push(alibi(with_extras("paged", "prefill-d128-page64-window", windowed, extras, Normal, 190), false));
    // Decode-shaped varlen batches (the CUDA backend's decode family): packed queries of 0 to 3
    // tokens over packed keys (one sequence without keys), causal, with ALiBi; one query a
    // sequence over packed keys.
    let gqa4 = Shape { heads_kv: 2, ..Shape::new(1, 8, 1, 128) };
    let (problem, extras) = seqs(gqa4, Bf16, &[1, 3, 0, 2, 1], &[300, 2, 9, 1000, 0], KeyStore::Packed);
    v.push(alibi(with_extras("varlen", "decode-b5-q0to3", problem.causal(), extras, Normal, 184), true));
    let (problem, extras) = seqs(gqa4, F16, &[1; 4], &[70, 1, 2000, 33], KeyStore::Packed);
    v.push(with_extras("varlen", "decode-b4-q1", problem, extras, OneHotPeaked, 185));
    // Decode at D = 112 (padded on the decode kernel's 128 build) from a paged cache, with ALiBi.
    let (problem, extras) = seqs(
        gqa_shape(1, 8, 2, 1, 1, 112),
        Bf16,
        &[1; 3],
        &[700, 33, 2000],
        KeyStore::Paged { page_size: 16, seed: 194 },
    );
    v.push(alibi(with_extras("paged", "decode-b3-d112-page16", problem, extras, Normal, 194), false));
    // A dense cache each sequence fills partly (FlashAttention's `cache_seqlens`).
    let (problem, extras) = seqs(gqa, Bf16, &[2; 3], &[10, 100, 1], KeyStore::DenseUsed);
    v.push(with_extras("kv-cache", "b3-seqused", problem.causal(), extras, OneHotPeaked, 190));
    v.extend([
        // Decode: a few query rows per GQA group (the CUDA backend's split-KV family), with
        // several splits, a causal mask whose last rows see more keys, two row blocks (64 rows),
        // rows that see no key, a window, BSHD and padded views, D = 256 and a negative scale.
        case("decode", "sq1-hq8hkv2-sk3000", p(gqa_shape(1, 8, 2, 1, 3000, 128), Bf16), Normal, 200),
        case("decode", "sq4-hq8hkv2-sk777", p(gqa_shape(2, 8, 2, 4, 777, 64), F16).causal(), Normal, 201),
        case(
            "decode",
            "sq16-hq4hkv1-sk1500",
            p(gqa_shape(1, 4, 1, 16, 1500, 128), Bf16).causal(),
            Normal,
            202,
        ),
        case("decode", "sq8-sk5", p(gqa_shape(1, 4, 2, 8, 5, 64), Bf16).causal(), Normal, 203),
        case(
            "decode",
            "sq3-sk5000-l700r0",
            p(gqa_shape(1, 8, 2, 3, 5000, 128), Bf16).with_window(Some(700), Some(0)),
            Normal,
            204,
        ),
        case(
            "decode",
            "sq2-d256-bshd",
            p(gqa_shape(2, 4, 2, 2, 900, 256), F16).with_layout(Layout::Bshd).with_scale(-0.07),
            Normal,
            205,
        ),
        case(
            "decode",
            "sq1-padded-views",
            padded(p(gqa_shape(2, 8, 2, 1, 1000, 64), Bf16)),
            OneHotPeaked,
            206,
        ),
        // More (sequence, KV head) items than a GPU of up to 160 SMs holds CTAs of the D = 64
        // kernel at once: the CUDA backend's persistent form, each CTA taking several in turn.
        case("decode", "sq1-b42-hq32hkv8-sk300-d64", p(gqa_shape(42, 32, 8, 1, 300, 64), Bf16), Normal, 210),
        // Head dims other than 64, 128 and 256 on the decode kernel: 80 (its own build, as Phi-2
        // has it), 72 (padded on the 80 build) causal in BSHD, 200 (on the 256 build) with a window.
        case("decode", "sq1-hq8hkv2-sk3000-d80", p(gqa_shape(1, 8, 2, 1, 3000, 80), Bf16), Normal, 207),
        case(
            "decode",
            "sq4-hq8hkv2-sk777-d72-bshd",
            p(gqa_shape(2, 8, 2, 4, 777, 72), F16).causal().with_layout(Layout::Bshd),
            Normal,
            208,
        ),
        case(
            "decode",
            "sq2-hq8hkv2-sk2000-d200-l300r0",
            p(gqa_shape(1, 8, 2, 2, 2000, 200), Bf16).with_window(Some(300), Some(0)),
            Normal,
            209,
        ),
        // Past the keys one dispatch may walk on a software adapter (`attn-wgpu`'s key split),
        // under a causal mask and GQA.
        case(
            "long-keys",
            "sq8sk40000-hq4hkv2",
            p(Shape { heads_kv: 2, ..sk(8, 40_000, 4, 64) }, Bf16).causal(),
            Normal,
            130,
        ),
    ]);
    v
}

/// The quick grid plus longer sequences (up to 128k keys), larger head dims and batches (a few
/// minutes on two cores; run by `attn verify`).
pub fn full() -> Vec<Case> {
    let mut v = quick();
    let mut seed = 1000;
    for dtype in DType::ALL {
        for (seq, d) in [(256, 128), (1000, 64), (1024, 128), (511, 256)] {
            for causal in [false, true] {
                let mut problem = p(Shape { heads_kv: 2, ..Shape::new(2, 4, seq, d) }, dtype);
                if causal {
                    problem = problem.causal();
                }
                seed += 1;
                v.push(case("long", &format!("s{seq}d{d}"), problem, Distribution::Normal, seed));
            }
        }
        // The key counts users run: decode at 128k keys, a prefill chunk at 32k.
        for (sq, keys, d) in [(1, 131_072, 128), (64, 32_768, 64)] {
            for causal in [false, true] {
                let mut problem = p(Shape { heads_kv: 2, ..sk(sq, keys, 4, d) }, dtype);
                if causal {
                    problem = problem.causal();
                }
                seed += 1;
                v.push(case(
                    "long-keys",
                    &format!("sq{sq}sk{keys}d{d}"),
                    problem,
                    Distribution::Normal,
                    seed,
                ));
            }
        }
        // A varlen prefill of 12 sequences of 1..=1100 tokens, and decode from a paged cache
        // of 256-key pages holding up to 9000 keys, both under GQA.
        let mut rng = SplitMix64::new(seed);
        let lens: Vec<usize> = (0..12).map(|_| 1 + rng.below(1100)).collect();
        let gqa = Shape { heads_kv: 2, ..Shape::new(1, 4, 1, 128) };
        let (varlen, extras) = seqs(gqa, dtype, &lens, &lens, KeyStore::Packed);
        v.push(with_extras("varlen", "b12-s1100", varlen.causal(), extras, Distribution::Normal, seed));
        // Sequences around the prefill kernels' query blocks (64 to 192 rows): empty, one token,
        // one short of a block, a block, one past, several; keys packed and longer than the
        // queries, or a dense cache each sequence fills partly (seqused_k); each native head dim;
        // one with ALiBi, one windowed, one soft-capped; D=64 windowed and soft-capped, with and
        // without ALiBi.
        if dtype != DType::F32 {
            let q_lens = [0, 1, 127, 128, 129, 191, 193, 450];
            let k_lens = [5, 1, 300, 128, 140, 0, 400, 450];
            let cases = [
                ("b8-d64-hq4hkv2", 64, KeyStore::Packed, Mask::None),
                ("b8-d128-hq4hkv2-causal", 128, KeyStore::Packed, Mask::Causal),
                ("b8-d256-seqused-causal", 256, KeyStore::DenseUsed, Mask::Causal),
                ("b8-d128-window", 128, KeyStore::Packed, Mask::Window { left: Some(70), right: Some(5) }),
                ("b8-d64-causal-cap20", 64, KeyStore::Packed, Mask::Causal),
                (
                    "b8-d64-window-cap20",
                    64,
                    KeyStore::Packed,
                    Mask::Window { left: Some(100), right: Some(0) },
                ),
                (
                    "b8-d64-window-cap20-alibi",
                    64,
                    KeyStore::Packed,
                    Mask::Window { left: Some(100), right: Some(0) },
                ),
            ];
            for (tag, d, keys, mask) in cases {
                seed += 1;
                let shape = Shape { heads_kv: 2, ..Shape::new(1, 4, 1, d) };
                let (mut problem, extras) = seqs(shape, dtype, &q_lens, &k_lens, keys);
                if tag.contains("cap20") {
                    problem = problem.with_softcap(20.0);
                }
                let family = if keys == KeyStore::DenseUsed { "kv-cache" } else { "varlen" };
                let case =
                    with_extras(family, tag, problem.with_mask(mask), extras, Distribution::Normal, seed);
                let biased = (d == 128 && mask == Mask::Causal) || tag.ends_with("alibi");
                v.push(if biased { alibi(case, true) } else { case });
            }
        }
        let keys: Vec<usize> = (0..6).map(|_| 1 + rng.below(9000)).collect();
        let (paged, extras) = seqs(gqa, dtype, &[1; 6], &keys, KeyStore::Paged { page_size: 256, seed });
        v.push(with_extras("paged", "b6-sk9000-page256", paged, extras, Distribution::Normal, seed));
        // Decode at the lengths users run: GQA 32:8 up to 32k keys, MHA at 128k, a window of 4k
        // behind the diagonal at 64k, BSHD at D = 256.
        if dtype != DType::F32 {
            let rows = [
                ("sq1-hq32hkv8-sk32768", p(gqa_shape(1, 32, 8, 1, 32_768, 128), dtype)),
                ("sq4-hq32hkv8-sk33001", p(gqa_shape(1, 32, 8, 4, 33_001, 128), dtype).causal()),
                ("sq16-hq8hkv2-sk32768", p(gqa_shape(1, 8, 2, 16, 32_768, 64), dtype).causal()),
                ("sq1-hq4hkv4-sk131072", p(gqa_shape(1, 4, 4, 1, 131_072, 128), dtype)),
                (
                    "sq2-hq16hkv2-sk65536-l4096r0",
                    p(gqa_shape(1, 16, 2, 2, 65_536, 128), dtype).with_window(Some(4096), Some(0)),
                ),
                (
                    "b4-sq1-hq32hkv8-sk8192-d256-bshd",
                    p(gqa_shape(4, 32, 8, 1, 8192, 256), dtype).with_layout(Layout::Bshd),
                ),
                ("sq1-hq32hkv8-sk32768-d96", p(gqa_shape(1, 32, 8, 1, 32_768, 96), dtype)),
            ];
            for (tag, problem) in rows {
                seed += 1;
                v.push(case("decode", tag, problem, Distribution::Normal, seed));
            }
            // Decode from caches at the same lengths: GQA 32:8, one or four queries, pages of
            // 16, 64 and 256 keys (shuffled), sequences of different key counts up to 32k (one
            // of a single key, one ending mid-page), and the score features on top.
            let gqa = gqa_shape(1, 32, 8, 1, 1, 128);
            let keys = [32_768, 1, 5003, 20_000];
            for (page, sq, causal) in [(16, 1, false), (64, 4, true), (256, 1, false)] {
                seed += 1;
                let store = KeyStore::Paged { page_size: page, seed };
                let (mut paged, extras) = seqs(gqa, dtype, &[sq; 4], &keys, store);
                if causal {
                    paged = paged.causal();
                }
                let tag = format!("b4-sq{sq}-hq32hkv8-sk32768-page{page}");
                v.push(with_extras("paged", &tag, paged, extras, Distribution::Normal, seed));
            }
            seed += 1;
            let store = KeyStore::Paged { page_size: 64, seed };
            let (paged, extras) = seqs(gqa, dtype, &[2; 3], &[9000, 17, 4100], store);
            let paged = paged.with_window(Some(1000), Some(0)).with_softcap(30.0);
            let tag = "b3-sq2-hq32hkv8-sk9000-page64-cap30";
            v.push(alibi(with_extras("paged", tag, paged, extras, Distribution::Normal, seed), true));
            seed += 1;
            let (used, extras) = seqs(gqa, dtype, &[1; 3], &[32_768, 100, 17_000], KeyStore::DenseUsed);
            let tag = "b3-sq1-hq32hkv8-sk32768";
            v.push(with_extras("kv-cache", tag, used.causal(), extras, Distribution::Normal, seed));
            seed += 1;
            let capped = p(gqa_shape(2, 32, 8, 1, 8192, 128), dtype).with_softcap(50.0);
            v.push(case("softcap", "decode-sq1-hq32hkv8-sk8192", capped, Distribution::LargeMagnitude, seed));
            seed += 1;
            let biased = p(gqa_shape(2, 16, 2, 2, 9000, 64), dtype).causal();
            v.push(alibi(
                case("alibi", "decode-sq2-hq16hkv2-sk9000", biased, Distribution::Normal, seed),
                false,
            ));
        }
        // Head dims between the GPU kernels' own, with several blocks and key tiles: GQA,
        // causal and not, a window, a soft-cap, padded views, decode rows and a varlen batch.
        let dims = [
            ("s1000d40-gqa", p(gqa_shape(2, 4, 2, 1000, 1000, 40), dtype).causal()),
            ("s700d72", p(Shape::new(1, 4, 700, 72), dtype)),
            ("s600d152-gqa", p(gqa_shape(1, 4, 2, 600, 600, 152), dtype).causal()),
            ("s513d248", p(Shape::new(1, 2, 513, 248), dtype)),
            ("s900d104-l200r0", p(gqa_shape(1, 4, 2, 900, 900, 104), dtype).with_window(Some(200), Some(0))),
            ("s800d24-cap30", p(Shape::new(1, 4, 800, 24), dtype).causal().with_softcap(30.0)),
            ("s300d56-padded-views", padded(p(Shape::new(2, 2, 300, 56), dtype).causal())),
            ("sq1sk5000d200-gqa", p(gqa_shape(2, 8, 2, 1, 5000, 200), dtype)),
        ];
        for (tag, problem) in dims {
            seed += 1;
            v.push(case("head-dims", tag, problem, Distribution::Normal, seed));
        }
        let mut rng = SplitMix64::new(seed);
        let lens: Vec<usize> = (0..5).map(|_| 1 + rng.below(400)).collect();
        let (problem, extras) =
            seqs(Shape { heads_kv: 2, ..Shape::new(1, 4, 1, 88) }, dtype, &lens, &lens, KeyStore::Packed);
        seed += 1;
        v.push(with_extras("head-dims", "varlen-d88", problem.causal(), extras, Distribution::Normal, seed));
        seed += 1;
        let large = p(Shape::new(1, 4, 1024, 128), dtype).causal();
        v.push(case("large-logits", "s1024d128", large, Distribution::LargeMagnitude, seed));
    }
    // Windows and soft-caps long enough that GPU kernels skip key tiles before and after a query
    // block's window and mask only its edges: several blocks and tiles, GQA, seq_q != seq_k
    // both ways (rows that see no key), each side unbounded in turn, every head dim family.
    let gqa = |seq, d| Shape { heads_kv: 2, ..Shape::new(1, 4, seq, d) };
    for dtype in [DType::Bf16, DType::F16] {
        let windows = [
            ("s2048d128-l300r0-gqa", p(gqa(2048, 128), dtype).with_window(Some(300), Some(0))),
            ("sq700sk1500d64-l200r77", p(sk(700, 1500, 4, 64), dtype).with_window(Some(200), Some(77))),
            ("sq1500sk700d256-l64r0", p(sk(1500, 700, 2, 256), dtype).with_window(Some(64), Some(0))),
            ("s1000d64-l-r100", p(gqa(1000, 64), dtype).with_window(None, Some(100))),
            ("s1000d96-l50r-", p(Shape::new(1, 2, 1000, 96), dtype).with_window(Some(50), None)),
        ];
        let caps = [
            (
                "s1024d128-cap30",
                p(gqa(1024, 128), dtype).causal().with_softcap(30.0),
                Distribution::LargeMagnitude,
            ),
            ("s1000d64-cap50", p(Shape::new(1, 4, 1000, 64), dtype).with_softcap(50.0), Distribution::Normal),
            (
                "s2048d128-cap30-l512r0",
                p(gqa(2048, 128), dtype).with_softcap(30.0).with_window(Some(512), Some(0)),
                Distribution::Normal,
            ),
            (
                "s700d256-cap5-l100r100",
                p(Shape::new(1, 2, 700, 256), dtype).with_softcap(5.0).with_window(Some(100), Some(100)),
                Distribution::Normal,
            ),
        ];
        for (tag, problem) in windows {
            seed += 1;
            v.push(case("window", tag, problem, Distribution::Normal, seed));
        }
        for (tag, problem, dist) in caps {
            seed += 1;
            v.push(case("softcap", tag, problem, dist, seed));
        }
        // ALiBi on the GPU kernels' own head dims, with every mask and the soft-cap: several
        // query blocks and key tiles (the bias grows across them), seq_q != seq_k both ways,
        // GQA, slopes per head and per (batch, head).
        let biased = [
            (
                "s1000d128-gqa-cap30",
                p(gqa_shape(2, 8, 2, 1000, 1000, 128), dtype).causal().with_softcap(30.0),
                true,
            ),
            ("sq900sk1300d128", p(gqa_shape(2, 4, 2, 900, 1300, 128), dtype), true),
            (
                "sq1300sk700d64-l300r40",
                p(sk(1300, 700, 4, 64), dtype).with_window(Some(300), Some(40)),
                false,
            ),
            ("s1500d64-cap20", p(Shape::new(1, 4, 1500, 64), dtype).with_softcap(20.0), false),
            ("s1200d64-gqa", p(gqa_shape(1, 4, 2, 1200, 1200, 64), dtype).causal(), true),
            ("s777d256", p(Shape::new(2, 2, 777, 256), dtype), true),
            ("s600d256", p(Shape::new(1, 2, 600, 256), dtype).causal(), false),
            (
                "s2048d128-cap30-l512r0",
                p(gqa(2048, 128), dtype).with_softcap(30.0).with_window(Some(512), Some(0)),
                false,
            ),
        ];
        for (tag, problem, per_batch) in biased {
            seed += 1;
            v.push(alibi(case("alibi", tag, problem, Distribution::Normal, seed), per_batch));
        }
    }
    v
}
