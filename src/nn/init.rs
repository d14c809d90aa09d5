//! Deterministic parameter initialisation: the same seed gives the same weights on every machine and
//! backend (values are drawn on the host, then moved), so runs and tests are reproducible.

use crate::{Result, Tensor};

/// A seeded source of initial weights: normal with a standard deviation (GPT-2's 0.02 by default).
#[derive(Clone, Debug)]
pub struct Init {
    state: u64,
    /// Standard deviation of [`Init::normal`].
    pub std: f64,
}

impl Init {
    /// A source seeded by `seed`, std 0.02.
    pub fn new(seed: u64) -> Init {
        Init { state: seed, std: 0.02 }
    }

    /// SplitMix64: a well-mixed 64-bit stream from a counter.
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// An f32 tensor of `dims` drawn from N(0, std²) (Box–Muller).
    pub fn normal(&mut self, dims: &[usize]) -> Result<Tensor> {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| {
                let (u, w) = (self.unit(), self.unit());
                ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * w).cos() * self.std) as f32
            })
            .collect();
        Tensor::from_slice(&v, dims)
    }

    /// Integers uniform in `0..below`, as i64 (token ids, class labels).
    pub fn ints(&mut self, dims: &[usize], below: u64) -> Result<Tensor> {
        let n: usize = dims.iter().product();
        let v: Vec<i64> = (0..n).map(|_| (self.next_u64() % below.max(1)) as i64).collect();
        Tensor::from_slice(&v, dims)
    }
}
