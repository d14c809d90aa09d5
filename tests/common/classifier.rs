//! A small classifier and its synthetic data: what the training-loop tests fit (quick on every backend).

use kiln::data::{features, labels, TensorDataset};
use kiln::nn::{cross_entropy, Init, Linear, Module};
use kiln::{Result, Tensor};

/// A two-layer classifier.
#[derive(Clone, Debug)]
pub struct Mlp {
    hidden: Linear,
    out: Linear,
}

impl Mlp {
    /// Its weights drawn from `seed`.
    pub fn new(inputs: usize, width: usize, classes: usize, seed: u64) -> Mlp {
        let mut init = Init::new(seed);
        init.std = 0.3;
        Mlp {
            hidden: Linear::new(inputs, width, true, &mut init).unwrap(),
            out: Linear::new(width, classes, true, &mut init).unwrap(),
        }
    }

    /// The class scores of `x`.
    pub fn logits(&self, x: &Tensor) -> Result<Tensor> {
        self.out.forward(&self.hidden.forward(x)?.gelu()?)
    }

    /// Cross-entropy of `batch = [features, labels]`.
    pub fn loss(&self, batch: &[Tensor]) -> Result<Tensor> {
        cross_entropy(&self.logits(&batch[0])?, &batch[1])
    }
}

impl Module for Mlp {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut v: Vec<(String, Tensor)> =
            self.hidden.parameters().into_iter().map(|(n, t)| (format!("hidden.{n}"), t)).collect();
        v.extend(self.out.parameters().into_iter().map(|(n, t)| (format!("out.{n}"), t)));
        v
    }

    fn with_parameters(&self, next: &mut dyn Iterator<Item = Tensor>) -> Result<Self> {
        Ok(Mlp { hidden: self.hidden.with_parameters(next)?, out: self.out.with_parameters(next)? })
    }
}

/// `n` points of 4 features around three class centres (deterministic).
pub fn blobs(n: usize, seed: u64) -> TensorDataset {
    let mut s = seed;
    let mut unit = || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((s >> 33) as f64 / (1u64 << 31) as f64) * 2.0 - 1.0
    };
    let centres = [[1.0, 0.0, -1.0, 0.5], [-1.0, 1.0, 0.0, -0.5], [0.0, -1.0, 1.0, 0.0]];
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for i in 0..n {
        let c = i % 3;
        x.extend(centres[c].iter().map(|v| (v + 0.6 * unit()) as f32));
        y.push(c as i64);
    }
    TensorDataset::new(vec![features(&x, 4).unwrap(), labels(&y).unwrap()]).unwrap()
}
