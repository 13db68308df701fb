//! How the persistent grid deals out a problem's tiles, and where it cuts the tail.

use super::variant::Variant;
use attn_core::Problem;

/// The fewest key tiles in a unit of the split tail ([`Split`]): a partial piece writes its O
/// and reads the others' (about a key tile's worth of time at D=128), so runs shorter than this
/// would spend more on the merge than they save.
pub const MIN_RUN: u64 = 4;

/// Key tiles the split must take off the busiest CTA (or a quarter of its work, for problems of
/// one wave or less) before the tail is split: each piece pays a tile's start and end again and
/// the merge, which a small gain does not cover: on the H100 at D=128 a gain of 0 to 7 key
/// tiles came out even or slower, of 15 or more faster (measured at 6ccb445, see
/// docs/experiments.md).
pub const MIN_GAIN: u64 = 12;

/// How the persistent grid deals out its work (`Piece` in the kernel). Without a mask every
/// tile takes the same time, so `tiles` over `ctas` CTAs leaves the last wave part-empty: at
/// D=128, S=4096 on 132 SMs, 2048 tiles are 15 waves and 68 tiles, and 64 SMs wait out the 16th
/// (3% of the whole). The tail (the tiles past the last whole wave, or all of them when there
/// are fewer tiles than CTAs) is cut instead into `units` runs of its key tiles, as even as
/// integers allow and at least [`MIN_RUN`] long, which the CTAs draw after the whole tiles (where
/// that gains at least [`MIN_GAIN`] key tiles or a quarter of the busiest CTA's work); a
/// tile cut between runs is merged by the piece that ends last. Under a causal mask tiles differ
/// in length and go longest first instead: no split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    /// Tiles handed out whole: the first `whole` of the tile order.
    pub whole: u32,
    /// Units the tail's key tiles are dealt to (0: no split).
    pub units: u32,
    /// Tiles in the tail.
    pub tail_tiles: u32,
    /// Key tiles per tile (every tile's, without a mask).
    pub key_tiles: u32,
}

impl Split {
    /// Every tile whole.
    pub fn none(tiles: u32) -> Split {
        Split { whole: tiles, units: 0, tail_tiles: 0, key_tiles: 0 }
    }

    /// Key tiles in the tail.
    pub fn tail_iters(&self) -> u32 {
        self.tail_tiles * self.key_tiles
    }

    /// The launch's u32 counters: the scheduler's two, then one per tail tile and consumer
    /// warpgroup (its pieces that have arrived).
    pub fn counters(&self, consumers: u32) -> usize {
        2 + (self.tail_tiles * consumers) as usize
    }

    /// f32s of partial results: two slots per unit (its first and last piece), each with, per
    /// consumer thread, its O accumulators (D / 2) and its rows' maxima and sums (4).
    pub fn partial_floats(&self, head_dim: usize, consumers: u32) -> usize {
        2 * self.units as usize * consumers as usize * 128 * (head_dim / 2 + 4)
    }

    /// The device memory a launch holds beyond the tensors, as the plan's memory note ends.
    pub fn workspace(&self, variant: &Variant) -> String {
        let counters = 4 * self.counters(variant.consumers);
        match self.partial_floats(variant.head_dim, variant.consumers) {
            0 => format!(" and the tile counters ({counters} B)"),
            n => {
                format!(
                    ", the tile counters ({counters} B) and the split tail's partial results ({} B)",
                    4 * n
                )
            }
        }
    }
}

impl Variant {
    /// How the persistent grid splits the tail of `problem` over `ctas` CTAs (`Split`);
    /// `Split::none` under a causal mask or a window, with sequences of their own lengths (whose
    /// tiles differ in length), or where it would not help (the
    /// tiles fill whole waves, runs of `MIN_RUN` would not outnumber the tail's tiles, or the
    /// busiest CTA would gain less than `MIN_GAIN` key tiles and a quarter of its work).
    /// The grid [`Variant::launch`] gives for `ctas` splits the same way as `ctas`.
    pub fn split(&self, problem: &Problem, ctas: u32) -> Split {
        let tiles = self.tiles(problem).min(i32::MAX as u64) as u32;
        let key_tiles = problem.shape.seq_k.div_ceil(self.block_n) as u64;
        let rest = tiles % ctas.max(1);
        if self.causal || self.window || self.seqs || rest == 0 || key_tiles == 0 {
            return Split::none(tiles);
        }
        let units = (rest as u64 * key_tiles / MIN_RUN).min(ctas as u64) as u32;
        // The kernel's piece arithmetic multiplies units by the tail's key tiles in 32 bits.
        if units <= rest || units as u64 * rest as u64 * key_tiles > i32::MAX as u64 {
            return Split::none(tiles);
        }
        // The busiest CTA's key tiles: a whole tile of the last wave, or its run of the tail.
        let unsplit = tiles.div_ceil(ctas.max(1)) as u64 * key_tiles;
        let gain = key_tiles - (rest as u64 * key_tiles).div_ceil(units as u64);
        if gain < MIN_GAIN && 4 * gain < unsplit {
            return Split::none(tiles);
        }
        Split { whole: tiles - rest, units, tail_tiles: rest, key_tiles: key_tiles as u32 }
    }
}
