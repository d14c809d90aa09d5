//! ONNX's `MelWeightMatrix`: the triangular filters that map a one-sided spectrum's bins onto mel
//! bands, `[dft_length / 2 + 1, num_mel_bins]`. Every input is a scalar, so the matrix is made on the
//! host, as ONNX's reference makes it (band edges evenly spaced in mels over `num_mel_bins + 2` steps,
//! each edge rounded down to a spectrum bin), and enters the graph as a constant.

use super::{invalid, one, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::{Tensor, TensorData};

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["MelWeightMatrix"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    (op == "MelWeightMatrix").then(|| mel_weight_matrix(node))
}

/// The most entries kiln makes on the host.
const MAX_ENTRIES: usize = 1 << 26;

fn mel(hz: f64) -> f64 {
    2595.0 * (1.0 + hz / 700.0).log10()
}

fn hz(mel: f64) -> f64 {
    700.0 * (10f64.powf(mel / 2595.0) - 1.0)
}

/// `num_mel_bins`, `dft_length`, `sample_rate`, `lower_edge_hertz`, `upper_edge_hertz` (scalars).
fn mel_weight_matrix(node: &Node) -> OpResult<Vec<Value>> {
    let scalar = |i: usize, what: &str| -> OpResult<f64> {
        match node.host_values(i)?.as_deref() {
            Some([v]) => Ok(*v),
            _ => invalid(format!("{what} (one value)")),
        }
    };
    let (bands, length, rate) = (scalar(0, "num_mel_bins")?, scalar(1, "dft_length")?, scalar(2, "sample_rate")?);
    let (low, high) = (scalar(3, "lower_edge_hertz")?, scalar(4, "upper_edge_hertz")?);
    if bands < 1.0 || length < 1.0 || rate <= 0.0 || !(0.0..=high).contains(&low) {
        return invalid(format!("{bands} bands of a {length}-point spectrum at {rate} Hz over {low}–{high} Hz"));
    }
    let (bands, bins) = (bands as usize, length as usize / 2 + 1);
    if bands.saturating_mul(bins) > MAX_ENTRIES {
        return unsupported(format!("a {bins} × {bands} matrix made on the host (up to {MAX_ENTRIES} entries)"));
    }
    let step = (mel(high) - mel(low)) / (bands + 2) as f64;
    let edges: Vec<usize> = (0..bands + 2)
        .map(|i| ((length + 1.0) * hz(i as f64 * step + mel(low)) / rate).floor().max(0.0) as usize)
        .collect();
    let mut m = vec![0.0; bins * bands];
    let mut set = |j: usize, band: usize, v: f64| {
        if j < bins {
            m[j * bands + band] = v;
        }
    };
    for band in 0..bands {
        let (left, centre, right) = (edges[band], edges[band + 1], edges[band + 2]);
        if centre == left {
            set(centre, band, 1.0);
        } else {
            // Edges past the spectrum (an upper edge above the Nyquist frequency) weigh bins up to its end.
            for j in left..=centre.min(bins - 1) {
                set(j, band, (j - left) as f64 / (centre - left) as f64);
            }
        }
        for j in centre..right.min(bins) {
            set(j, band, (right - j) as f64 / (right - centre) as f64);
        }
    }
    one(Tensor::from_data(TensorData::from_f64(m, &[bins, bands], node.output_datatype()?)?))
}

#[cfg(test)]
mod tests {
    use super::super::testing::run_one;
    use crate::value::Value;
    use kiln_graph::Tensor;

    fn s(v: f32) -> Option<Value> {
        Some(Value::Tensor(Tensor::from_slice(&[v], &[]).unwrap()))
    }

    /// Values from a port of ONNX's reference: 3 bands of a 32-point spectrum at 16 kHz over
    /// 100–6,000 Hz have edges at bins 0, 1, 2, 4 and 7.
    #[test]
    fn bands_are_triangles_between_their_edge_bins() {
        let i = |v: i64| Some(Value::Tensor(Tensor::from_slice(&[v], &[]).unwrap()));
        let out = run_one("MelWeightMatrix", vec![], &[i(3), i(32), i(16000), s(100.0), s(6000.0)]).unwrap();
        assert_eq!(out[0].shape().as_concrete(), Some(vec![17, 3]));
        let m = out[0].to_vec::<f32>().unwrap();
        let mut want = vec![0.0f32; 17 * 3];
        for (j, band, v) in
            [(1, 0, 1.0), (2, 1, 1.0), (3, 1, 0.5), (3, 2, 0.5), (4, 2, 1.0), (5, 2, 2.0 / 3.0), (6, 2, 1.0 / 3.0)]
        {
            want[j * 3 + band] = v;
        }
        assert!(m.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-6), "{m:?}");
        let e = run_one("MelWeightMatrix", vec![], &[i(0), i(16), i(8000), s(0.0), s(4000.0)]).unwrap_err();
        assert!(e.starts_with("invalid"), "{e}");
    }
}
