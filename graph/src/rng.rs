//! Counter-based random numbers: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as
//! 1, 2, 3", SC 2011), the generator torch's and JAX's GPU dropout use. A counter-based generator has no
//! state to carry between kernels: element `i` of `rand(shape, key)` is a pure function of the key and
//! `i`, so every backend (the reference here, the kernel interpreter, WGSL, PTX) draws the same numbers,
//! and a training step's backward pass recomputes its dropout mask instead of saving it.
//!
//! This file is the specification: the reference interpreter calls [`uniform`], and the kernel lowering
//! (`lower.rs`) writes the same rounds as 32-bit integer kernel IR; the conformance suite holds the two
//! to bit equality.

use crate::data::TensorData;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::Op;
use crate::loc::SourceLoc;
use crate::shape::Shape;
use crate::trace::{record, Tensor};

/// Philox's round multipliers.
pub const MULTIPLIERS: [u32; 2] = [0xD251_1F53, 0xCD9E_8D57];
/// Philox's key increments per round (the golden ratio and √3 − 1, in 32-bit fixed point).
pub const KEY_STEPS: [u32; 2] = [0x9E37_79B9, 0xBB67_AE85];
/// Rounds: ten, Crush-resistant with margin (Salmon et al.).
pub const ROUNDS: usize = 10;

/// Philox4x32-10 of `counter` under `key`: four independent 32-bit words.
pub fn philox4x32(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for round in 0..ROUNDS {
        if round > 0 {
            k = [k[0].wrapping_add(KEY_STEPS[0]), k[1].wrapping_add(KEY_STEPS[1])];
        }
        let p0 = u64::from(MULTIPLIERS[0]) * u64::from(c[0]);
        let p1 = u64::from(MULTIPLIERS[1]) * u64::from(c[2]);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// The counter of element `index` in `stream`: the index's low and high 32 bits, the stream, zero.
pub fn counter(index: u64, stream: u32) -> [u32; 4] {
    [index as u32, (index >> 32) as u32, stream, 0]
}

/// The uniform number of element `index` under `key` (stream 0).
pub fn uniform(index: u64, key: [u32; 2]) -> f64 {
    uniform_in(index, 0, key)
}

/// The uniform number of element `index` of `stream` under `key`: the top 24 bits of Philox's first
/// word, scaled by 2^-24 — a multiple of 2^-24 in [0, 1), exact in f32.
pub fn uniform_in(index: u64, stream: u32, key: [u32; 2]) -> f64 {
    f64::from(philox4x32(counter(index, stream), key)[0] >> 8) * (1.0 / 16_777_216.0)
}

/// The 32-bit pattern an i32 value (held as f64, as interpreters hold values) stands for.
pub fn word_of(v: f64) -> u32 {
    v as i64 as i32 as u32
}

/// The key two i32 values (a key tensor's elements) stand for: their 32-bit patterns.
pub fn key_of(k0: f64, k1: f64) -> [u32; 2] {
    [word_of(k0), word_of(k1)]
}

impl Tensor {
    /// A random-number key: `[seed, step]` as an i32 tensor of two elements. Keys that differ in either
    /// draw unrelated numbers; a training loop passes `rng_key(seed, step)` each step, which changes data,
    /// not the graph (no recompile).
    pub fn rng_key(seed: u32, step: u32) -> Tensor {
        Tensor::from_data(TensorData::from_rounded(
            vec![f64::from(seed as i32), f64::from(step as i32)],
            vec![2],
            DType::I32,
        ))
    }

    /// Uniform random numbers in [0, 1) (f32) of shape `dims`, drawn under `key` (see [`Tensor::rng_key`]):
    /// Philox4x32-10 of each element's flat index, the same numbers on every backend.
    #[track_caller]
    pub fn rand(dims: &[usize], key: &Tensor) -> Result<Tensor> {
        rand_at(Shape::from_dims(dims), key, 0, SourceLoc::caller())
    }

    /// [`Tensor::rand`] in `stream`: numbers unrelated to every other stream's under the same key.
    #[track_caller]
    pub fn rand_in(dims: &[usize], key: &Tensor, stream: u32) -> Result<Tensor> {
        rand_at(Shape::from_dims(dims), key, stream, SourceLoc::caller())
    }

    /// [`Tensor::rand`] of this tensor's shape (symbolic dims included).
    #[track_caller]
    pub fn rand_like(&self, key: &Tensor) -> Result<Tensor> {
        rand_at(self.shape(), key, 0, SourceLoc::caller())
    }

    /// [`Tensor::rand_like`] in `stream` (see [`Tensor::rand_in`]).
    #[track_caller]
    pub fn rand_like_in(&self, key: &Tensor, stream: u32) -> Result<Tensor> {
        rand_at(self.shape(), key, stream, SourceLoc::caller())
    }

    /// Zeroes each element with probability `p` and scales the rest by `1/(1-p)`
    /// (`torch.nn.functional.dropout` in training), the mask drawn under `key` by [`Tensor::rand_like`]:
    /// the backward pass recomputes it from the key instead of saving it.
    #[track_caller]
    pub fn dropout(&self, p: f64, key: &Tensor) -> Result<Tensor> {
        Ok(self.dropout_at(p, key, 0, SourceLoc::caller())?.0)
    }

    /// [`Tensor::dropout`] with its mask drawn in `stream`: a model's dropout sites share one key per
    /// step and differ by stream, so no two draw the same mask.
    #[track_caller]
    pub fn dropout_in(&self, p: f64, key: &Tensor, stream: u32) -> Result<Tensor> {
        Ok(self.dropout_at(p, key, stream, SourceLoc::caller())?.0)
    }

    /// [`Tensor::dropout_in`] and its mask (bool, true where an element was kept): ONNX's `Dropout`
    /// returns both.
    #[track_caller]
    pub fn dropout_with_mask(&self, p: f64, key: &Tensor, stream: u32) -> Result<(Tensor, Tensor)> {
        self.dropout_at(p, key, stream, SourceLoc::caller())
    }

    fn dropout_at(&self, p: f64, key: &Tensor, stream: u32, loc: SourceLoc) -> Result<(Tensor, Tensor)> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::InvalidArgument {
                op: "dropout".into(),
                msg: format!("p = {p}: a probability in [0, 1) was expected"),
                loc,
            });
        }
        SourceLoc::attributed(loc.clone(), || {
            let keep = rand_at(self.shape(), key, stream, loc.clone())?.ge(p)?;
            Ok((keep.where_(self.mul(1.0 / (1.0 - p))?, 0.0)?, keep))
        })
    }
}

fn rand_at(shape: Shape, key: &Tensor, stream: u32, loc: SourceLoc) -> Result<Tensor> {
    if key.dtype() != DType::I32 || key.shape().dims().len() != 1 || key.shape().dims()[0].as_const() != Some(2) {
        return Err(Error::InvalidArgument {
            op: "rand".into(),
            msg: format!(
                "the key is {} {}; an i32 tensor of two elements was expected (Tensor::rng_key)",
                key.dtype(),
                key.shape()
            ),
            loc,
        });
    }
    record(Op::Rand { stream }, &[key], DType::F32, shape, loc)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The known-answer vectors of the Random123 distribution (`kat_vectors`, philox4x32 10).
    #[test]
    fn philox_matches_the_published_answers() {
        assert_eq!(philox4x32([0; 4], [0; 2]), [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]);
        assert_eq!(philox4x32([u32::MAX; 4], [u32::MAX; 2]), [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]);
        assert_eq!(
            philox4x32([0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344], [0xa409_3822, 0x299f_31d0]),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn uniforms_are_in_the_unit_interval_and_look_uniform() {
        let n = 100_000u64;
        let xs: Vec<f64> = (0..n).map(|i| uniform(i, [7, 11])).collect();
        assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x) && x == x as f32 as f64));
        let mean = xs.iter().sum::<f64>() / n as f64;
        // The mean of n uniforms has standard deviation 1/sqrt(12 n) ≈ 0.0009: 5 of them.
        assert!((mean - 0.5).abs() < 0.0045, "{mean}");
        let mut buckets = [0u32; 10];
        xs.iter().for_each(|&x| buckets[(x * 10.0) as usize] += 1);
        assert!(buckets.iter().all(|&b| (9_500..10_500).contains(&b)), "{buckets:?}");
        // Another key, other numbers.
        assert_ne!(uniform(0, [7, 11]), uniform(0, [7, 12]));
    }

    /// Streams of one key are unrelated: element by element they agree as often as chance says (1 in
    /// 2^24 for equal values; about half the time on which side of 0.5 they fall), and stream 0 is
    /// `uniform`.
    #[test]
    fn streams_of_one_key_draw_unrelated_numbers() {
        let n = 20_000u64;
        let key = [7, 11];
        assert!((0..100).all(|i| uniform_in(i, 0, key) == uniform(i, key)));
        for (a, b) in [(0, 1), (1, 2), (3, 0xFFFF_FFF0)] {
            let same = (0..n).filter(|&i| uniform_in(i, a, key) == uniform_in(i, b, key)).count();
            let sides = (0..n).filter(|&i| (uniform_in(i, a, key) < 0.5) == (uniform_in(i, b, key) < 0.5)).count();
            assert!(same < 3, "streams {a} and {b}: {same} equal draws");
            // Binomial(n, 1/2): standard deviation 71; 5 of them.
            assert!((sides as i64 - n as i64 / 2).abs() < 355, "streams {a} and {b}: {sides} of {n} on one side");
        }
    }
}
