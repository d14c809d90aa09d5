//! When a result is right: one tolerance rule for every comparison kiln makes against its f64 reference —
//! the bench's full-size output checks, `kiln check` and its minimizer — stated here and in every report.
//!
//! The rule: element `i` passes when `|got − want| ≤ √D · (atol + rtol · max(|want|, rms(want)))`, with
//! `(rtol, atol)` torch.testing's defaults for the output dtype (f32: 1.3e-6 / 1e-5; bf16: 1.6e-2 / 1e-5;
//! f16: 1e-3 / 1e-5) and `D` the graph's depth: the heaviest path through its decomposed graph, where
//! an elementwise op weighs 1 and a sum of `n` terms (a reduction, a contraction) weighs `√n` (rounding
//! errors of a sum grow like the square root of its length). `max(|want|, rms)`: rounding errors scale
//! with the magnitudes that were summed, so an element that happens to be near zero inherits the error of
//! its tensor's scale, not its own. An f32 output of a graph with f32 convolutions, on a target that runs
//! them in TF32 (`tf32_convolutions`, PyTorch's default for convolutions), gets f16's base instead: TF32
//! keeps f16's 10 mantissa bits.

use crate::data::TensorData;
use crate::dtype::DType;
use crate::error::Result;
use crate::ir::{Graph, OpFamily};

/// The rule's base tolerances for an output dtype: torch.testing's defaults.
pub fn base(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::BF16 => (1.6e-2, 1e-5),
        DType::F16 => (1e-3, 1e-5),
        DType::F64 => (1e-7, 1e-7),
        _ => (1.3e-6, 1e-5),
    }
}

/// The rule in one line, for reports.
pub const RULE: &str = "|got − want| ≤ √D·(atol + rtol·max(|want|, rms(want))) per element; (rtol, atol) = torch.testing's defaults for the dtype (f32 1.3e-6/1e-5, f64 1e-7/1e-7, bf16 1.6e-2/1e-5; f16's 1e-3/1e-5 for f32 outputs of a graph with f32 convolutions on a target that runs them in TF32, which keeps f16's mantissa); D = the heaviest path through the decomposed graph, an elementwise op weighing 1 and a sum of n terms √n";

/// A tolerance for one output.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Relative part, already scaled by `√D`.
    pub rtol: f64,
    /// Absolute part, already scaled by `√D`.
    pub atol: f64,
}

impl Tolerance {
    /// The rule for `g`'s (first) output: its dtype and `g`'s depth.
    pub fn of(g: &Graph) -> Result<Tolerance> {
        let dtype = g.outputs.first().map_or(DType::F32, |o| g.node(*o).dtype);
        Ok(Tolerance::rule(dtype, depth(g)?))
    }

    /// [`Tolerance::of`] for `g` run on `target`: an f32 output gets f16's base when `target` runs `g`'s
    /// f32 convolutions in TF32 (`gemm::rounds_to_tf32`).
    pub fn of_on(g: &Graph, target: &crate::Target) -> Result<Tolerance> {
        let dtype = g.outputs.first().map_or(DType::F32, |o| g.node(*o).dtype);
        Ok(Tolerance::rule_for(dtype, depth(g)?, crate::gemm::rounds_to_tf32(g, target)))
    }

    /// [`Tolerance::rule`], with f16's base for an f32 output when `tf32` (its graph's convolutions ran
    /// in TF32, which keeps f16's 10 mantissa bits).
    pub fn rule_for(dtype: DType, depth: f64, tf32: bool) -> Tolerance {
        Tolerance::rule(if tf32 && dtype == DType::F32 { DType::F16 } else { dtype }, depth)
    }

    /// The rule for an output of `dtype` from a graph of depth `depth`.
    pub fn rule(dtype: DType, depth: f64) -> Tolerance {
        let (r, a) = base(dtype);
        let s = depth.max(1.0).sqrt();
        Tolerance { rtol: r * s, atol: a * s }
    }
}

/// The heaviest path through `g` after decomposition (see the module doc).
pub fn depth(g: &Graph) -> Result<f64> {
    let d = crate::decompose::decompose(g)?.graph;
    let mut at = vec![0.0f64; d.nodes.len()];
    for (i, n) in d.nodes.iter().enumerate() {
        let before = n.inputs.iter().map(|x| at[x.index()]).fold(0.0, f64::max);
        let numel = |s: &crate::shape::Shape| s.as_concrete().map_or(1.0, |v| v.iter().product::<usize>() as f64);
        let weight = match n.op.family() {
            OpFamily::Pointwise => 1.0,
            OpFamily::Reduce => {
                let input = n.inputs.first().map_or(1.0, |x| numel(&d.nodes[x.index()].shape));
                (input / numel(&n.shape).max(1.0)).max(1.0).sqrt()
            }
            OpFamily::Matmul => {
                let k = n
                    .inputs
                    .first()
                    .and_then(|x| d.nodes[x.index()].shape.as_concrete())
                    .and_then(|v| v.last().copied());
                (k.unwrap_or(1) as f64).sqrt()
            }
            _ => 0.0,
        };
        at[i] = before + weight;
    }
    Ok(d.outputs.iter().map(|o| at[o.index()]).fold(1.0, f64::max))
}

/// An expected output and where it came from.
#[derive(Clone, Debug)]
pub struct Expected {
    /// Its shape.
    pub dims: Vec<usize>,
    /// Its values.
    pub values: Vec<f64>,
    /// Root mean square of the values (the tensor's scale).
    pub rms: f64,
    /// What produced it, for the report.
    pub source: String,
}

impl Expected {
    /// From values and their source.
    pub fn new(dims: Vec<usize>, values: Vec<f64>, source: &str) -> Expected {
        let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        let rms = (finite.iter().map(|v| v * v).sum::<f64>() / finite.len().max(1) as f64).sqrt();
        Expected { dims, values, rms, source: source.into() }
    }

    /// From a tensor.
    pub fn of(t: &TensorData, source: &str) -> Expected {
        Expected::new(t.dims().to_vec(), t.values().to_vec(), source)
    }
}

/// The outcome of comparing one output.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    /// Worst `|got − want| / |want|` over elements whose `|want|` is at least a tenth of the tensor's rms
    /// (relative error is meaningless near zero; those elements are still held to the rule).
    pub max_rel_err: f64,
    /// Elements outside the tolerance (a NaN where a number was expected counts; NaN for NaN does not).
    pub mismatches: usize,
    /// Whether every element passed and the shapes agree.
    pub correct: bool,
}

impl Outcome {
    /// An expected output that is not there.
    pub const MISSING: Outcome = Outcome { max_rel_err: f64::INFINITY, mismatches: 1, correct: false };

    /// Every expected output against the one at its position in `got` (a missing one fails, and so does
    /// expecting nothing).
    pub fn of_each<T>(want: &[Expected], got: &[T], compare: impl Fn(&T, &Expected) -> Outcome) -> Outcome {
        want.iter()
            .enumerate()
            .map(|(i, w)| got.get(i).map_or(Outcome::MISSING, |g| compare(g, w)))
            .reduce(Outcome::and)
            .unwrap_or(Outcome::MISSING)
    }

    /// Two outcomes of one configuration (its device-time run and its public call) as one.
    pub fn and(self, o: Outcome) -> Outcome {
        Outcome {
            max_rel_err: self.max_rel_err.max(o.max_rel_err),
            mismatches: self.mismatches + o.mismatches,
            correct: self.correct && o.correct,
        }
    }
}

/// Compares `got` with `want` under `tol`.
pub fn compare(got: &TensorData, want: &Expected, tol: Tolerance) -> Outcome {
    compare_values(got.dims(), got.values(), want, tol)
}

/// [`compare`] over plain values.
pub fn compare_values(dims: &[usize], got: &[f64], want: &Expected, tol: Tolerance) -> Outcome {
    if dims != want.dims.as_slice() || got.len() != want.values.len() {
        return Outcome { max_rel_err: f64::INFINITY, mismatches: got.len().max(want.values.len()), correct: false };
    }
    let (mut worst, mut mismatches) = (0.0f64, 0usize);
    for (&a, &b) in got.iter().zip(&want.values) {
        if a.is_nan() && b.is_nan() || a == b {
            continue;
        }
        let diff = (a - b).abs();
        let within = diff <= tol.atol + tol.rtol * b.abs().max(want.rms);
        if !within {
            mismatches += 1;
        }
        if b.abs() >= 0.1 * want.rms || !diff.is_finite() {
            let rel = if b == 0.0 { f64::INFINITY } else { diff / b.abs() };
            worst = worst.max(if rel.is_nan() { f64::INFINITY } else { rel });
        }
    }
    Outcome { max_rel_err: worst, mismatches, correct: mismatches == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want(v: &[f64]) -> Expected {
        Expected::new(vec![v.len()], v.to_vec(), "test")
    }

    #[test]
    fn the_rule_scales_with_depth_and_dtype() {
        let t = Tolerance::rule(DType::F32, 100.0);
        assert!((t.rtol - 1.3e-5).abs() < 1e-12 && (t.atol - 1e-4).abs() < 1e-12);
        assert_eq!(Tolerance::rule(DType::BF16, 1.0), Tolerance { rtol: 1.6e-2, atol: 1e-5 });
        assert_eq!(Tolerance::rule(DType::F32, 0.0), Tolerance::rule(DType::F32, 1.0), "depth is at least 1");
    }

    #[test]
    fn an_element_off_by_more_than_the_rule_fails_and_one_within_passes() {
        let w = want(&[1.0, -2.0, 3.0, 0.0]);
        let t = Tolerance::rule(DType::F32, 1.0);
        // rms = sqrt(14/4) ≈ 1.87; for `want` = 3 the allowed error is 1e-5 + 1.3e-6·3.
        let ok = compare_values(&[4], &[1.0, -2.0, 3.0 + 1e-5, 1e-5], &w, t);
        assert!(ok.correct, "{ok:?}");
        let bad = compare_values(&[4], &[1.0, -2.0, 3.0 + 1e-4, 0.0], &w, t);
        assert_eq!((bad.correct, bad.mismatches), (false, 1));
        assert!((bad.max_rel_err - 1e-4 / 3.0).abs() < 1e-9, "{bad:?}");
    }

    #[test]
    fn near_zero_elements_are_held_to_the_tensors_scale() {
        // 1e-5 off at an element of 1e-9: hopeless relatively, fine against the tensor's scale.
        let w = want(&[1e-9, 1.0, -1.0]);
        let o = compare_values(&[3], &[1e-9 + 1e-5, 1.0, -1.0], &w, Tolerance::rule(DType::F32, 1.0));
        assert!(o.correct, "{o:?}");
        assert_eq!(o.max_rel_err, 0.0, "relative error is not reported near zero");
    }

    #[test]
    fn nans_shapes_and_the_deliberately_wrong_element() {
        let w = want(&[1.0, f64::NAN, 2.0]);
        let t = Tolerance::rule(DType::F32, 1.0);
        assert!(compare_values(&[3], &[1.0, f64::NAN, 2.0], &w, t).correct, "NaN where NaN is expected");
        assert!(!compare_values(&[3], &[1.0, 0.0, f64::NAN], &w, t).correct, "NaN where a number is expected");
        assert!(!compare_values(&[1, 3], &[1.0, f64::NAN, 2.0], &w, t).correct, "shapes differ");
        // What KILN_TEST_WRONG_KERNEL does: the last element one too large, even at bf16's depth-scaled rule.
        let big = want(&(0..1000).map(|i| (i as f64).sin()).collect::<Vec<_>>());
        let mut got = big.values.clone();
        *got.last_mut().expect("non-empty") += 1.0;
        assert!(!compare_values(&[1000], &got, &big, Tolerance::rule(DType::BF16, 100.0)).correct);
    }

    #[test]
    fn each_expected_output_must_be_there_and_right() {
        let t = Tolerance::rule(DType::F32, 1.0);
        let (a, b) = (want(&[1.0, 2.0]), want(&[3.0]));
        let cmp = |g: &Vec<f64>, w: &Expected| compare_values(&[g.len()], g, w, t);
        assert!(Outcome::of_each(&[a.clone(), b.clone()], &[vec![1.0, 2.0], vec![3.0]], cmp).correct);
        assert!(!Outcome::of_each(&[a.clone(), b.clone()], &[vec![1.0, 2.0]], cmp).correct, "one missing");
        assert!(!Outcome::of_each(&[a.clone(), b], &[vec![1.0, 2.0], vec![4.0]], cmp).correct, "one wrong");
        assert!(!Outcome::of_each(&[], &[vec![1.0]], cmp).correct, "expecting nothing checks nothing");
        let _ = a;
    }

    #[test]
    fn depth_counts_sums_by_their_length() {
        let g = crate::capture(&[crate::TensorSpec::new(DType::F32, &[4, 64])], |t| {
            Ok(vec![t[0].sum(&[1], false)?.exp()?])
        })
        .expect("captures");
        // A sum of 64 (√64 = 8) then one elementwise op.
        assert!((depth(&g).expect("decomposes") - 9.0).abs() < 1e-9);
    }
}
