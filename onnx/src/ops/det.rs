//! ONNX's `Det`: the determinant of each `M × M` matrix by Leibniz's formula, `Σ_σ sign(σ) Π_i x[i, σ(i)]`
//! — one gather of every permutation's entries, their products and a signed sum, exact for the small
//! matrices models take determinants of (elimination would need a pivot chosen per matrix).

use super::{invalid, one, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::{DType, Tensor};

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["Det"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    (op == "Det").then(|| det(node))
}

/// The largest matrix kiln expands: 6! = 720 products of six entries.
const MAX_SIZE: usize = 6;

/// Every permutation of `0..n` with its sign, in lexicographic order.
fn permutations(n: usize) -> Vec<(Vec<usize>, f64)> {
    if n == 0 {
        return vec![(vec![], 1.0)];
    }
    let mut out = Vec::new();
    for first in 0..n {
        for (rest, sign) in permutations(n - 1) {
            // The rest permutes the values other than `first`; placing `first` ahead of them moves it
            // past `first` smaller values: that many transpositions.
            let mut p = vec![first];
            p.extend(rest.into_iter().map(|v| if v >= first { v + 1 } else { v }));
            out.push((p, if first % 2 == 0 { sign } else { -sign }));
        }
    }
    out
}

/// `x` `[*, M, M]` → `[*]`, each matrix's determinant.
fn det(node: &Node) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let Some(dims) = x.shape().as_concrete() else { return unsupported("Det over symbolic dims") };
    let r = dims.len();
    if r < 2 || dims[r - 1] != dims[r - 2] || !x.dtype().is_float() {
        return invalid(format!("matrices of shape {dims:?} and dtype {} (square, float)", x.dtype()));
    }
    let n = dims[r - 1];
    if n > MAX_SIZE {
        return unsupported(format!("the determinant of a {n} × {n} matrix (kiln expands up to {MAX_SIZE})"));
    }
    let batch: Vec<isize> = dims[..r - 2].iter().map(|&d| d as isize).collect();
    if n == 0 {
        return one(Tensor::full(1.0, &dims[..r - 2], x.dtype())?);
    }
    let perms = permutations(n);
    let index: Vec<f64> =
        perms.iter().flat_map(|(p, _)| p.iter().enumerate().map(|(i, &j)| (i * n + j) as f64)).collect();
    let flat = x.reshape(&[&batch[..], &[(n * n) as isize]].concat())?;
    let picked = flat
        .index_select(-1, &node.model.constant(index, &[perms.len() * n], DType::I64)?)?
        .reshape(&[&batch[..], &[perms.len() as isize, n as isize]].concat())?;
    let mut product = picked.narrow(-1, 0, 1)?;
    for i in 1..n {
        product = product.mul(&picked.narrow(-1, i, 1)?)?;
    }
    let signs = node.model.constant(perms.iter().map(|(_, s)| *s).collect(), &[perms.len(), 1], x.dtype())?;
    one(product.mul(&signs)?.sum(&[-2, -1], false)?)
}

#[cfg(test)]
mod tests {
    use super::super::testing::run_one;
    use super::permutations;
    use crate::value::Value;
    use kiln_graph::Tensor;

    #[test]
    fn permutations_carry_their_signs() {
        let p = permutations(3);
        assert_eq!(p.len(), 6);
        assert_eq!(p[0], (vec![0, 1, 2], 1.0));
        assert_eq!(p[1], (vec![0, 2, 1], -1.0));
        assert_eq!(p[2], (vec![1, 0, 2], -1.0));
        assert_eq!(p[5], (vec![2, 1, 0], -1.0));
        assert_eq!(permutations(4).iter().map(|(_, s)| s).sum::<f64>(), 0.0);
    }

    /// A batch of a rotation-and-scale (det 6) and a singular matrix (det 0); a non-square input is an
    /// error.
    #[test]
    fn determinants_of_a_batch() {
        let x = Tensor::from_slice(
            &[2f32, 0.0, 0.0, 0.0, 0.0, 3.0, 0.0, -1.0, 0.0, 1.0, 2.0, 3.0, 2.0, 4.0, 6.0, 0.0, 1.0, 5.0],
            &[2, 3, 3],
        )
        .unwrap();
        let out = run_one("Det", vec![], &[Some(Value::Tensor(x))]).unwrap();
        assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![6.0, 0.0]);
        let bad = Tensor::from_slice(&[0f32; 6], &[2, 3]).unwrap();
        assert!(run_one("Det", vec![], &[Some(Value::Tensor(bad))]).unwrap_err().starts_with("invalid"));
    }
}
