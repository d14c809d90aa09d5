//! `Tensor::einsum` against a direct evaluation of its definition (every assignment of the labels, the
//! products summed into the output), implicit outputs and ellipses against their written-out equations,
//! a symbolic batch, gradients through it, and its errors at the caller's line.

use kiln_graph::{capture, DType, Error, Tensor, TensorData, TensorSpec};
use std::collections::BTreeMap;

fn tensor(dims: &[usize], seed: usize) -> Tensor {
    let n: usize = dims.iter().product();
    let v: Vec<f64> = (0..n).map(|i| (((i + seed) * 37 % 23) as f64 - 11.0) * 0.25).collect();
    Tensor::from_data(TensorData::from_f64(v, dims, DType::F64).unwrap())
}

/// The definition: for every assignment of the labels, the operands' product added to the output.
fn direct(equation: &str, operands: &[&Tensor]) -> (Vec<usize>, Vec<f64>) {
    let (inputs, output) = equation.split_once("->").unwrap();
    let terms: Vec<Vec<char>> = inputs.split(',').map(|t| t.chars().collect()).collect();
    let out: Vec<char> = output.chars().collect();
    let mut size = BTreeMap::new();
    let data: Vec<(Vec<usize>, Vec<f64>)> = operands
        .iter()
        .map(|t| {
            (
                t.shape().dims().iter().map(|d| d.as_const().unwrap() as usize).collect(),
                t.to_data().unwrap().values().to_vec(),
            )
        })
        .collect();
    for (term, (dims, _)) in terms.iter().zip(&data) {
        for (c, d) in term.iter().zip(dims) {
            size.insert(*c, *d);
        }
    }
    let labels: Vec<char> = size.keys().copied().collect();
    let out_dims: Vec<usize> = out.iter().map(|c| size[c]).collect();
    let mut result = vec![0.0; out_dims.iter().product()];
    let total: usize = labels.iter().map(|c| size[c]).product();
    for mut k in 0..total {
        let mut at = BTreeMap::new();
        for c in labels.iter().rev() {
            at.insert(*c, k % size[c]);
            k /= size[c];
        }
        let flat = |term: &[char], dims: &[usize]| term.iter().zip(dims).fold(0, |f, (c, d)| f * d + at[c]);
        let product: f64 = terms.iter().zip(&data).map(|(term, (dims, v))| v[flat(term, dims)]).product();
        result[flat(&out, &out_dims)] += product;
    }
    (out_dims, result)
}

fn check(equation: &str, operands: &[&Tensor], written_out: &str) {
    let got = Tensor::einsum(equation, operands).unwrap_or_else(|e| panic!("{equation}: {e}"));
    let (dims, want) = direct(written_out, operands);
    let shape: Vec<usize> = got.shape().dims().iter().map(|d| d.as_const().unwrap() as usize).collect();
    assert_eq!(shape, dims, "{equation}");
    let g = got.to_data().unwrap().values().to_vec();
    for (i, (a, b)) in g.iter().zip(&want).enumerate() {
        assert!((a - b).abs() <= 1e-12 * (1.0 + b.abs()), "{equation}: element {i}: {a} vs {b}");
    }
}

#[test]
fn equations_match_their_definition() {
    let (a, b, c) = (tensor(&[3, 4], 0), tensor(&[4, 5], 1), tensor(&[5, 2], 2));
    let (v, w) = (tensor(&[4], 3), tensor(&[4], 4));
    let (x, y) = (tensor(&[2, 3, 4], 5), tensor(&[2, 4, 5], 6));
    let sq = tensor(&[4, 4], 7);
    let cube = tensor(&[2, 3, 3], 8);
    for (eq, ops) in [
        ("ij,jk->ik", vec![&a, &b]),
        ("ij->ji", vec![&a]),
        ("ij->", vec![&a]),
        ("ij->j", vec![&a]),
        ("i,i->", vec![&v, &w]),
        ("i,j->ij", vec![&v, &w]),
        ("i,i->i", vec![&v, &w]),
        ("bij,bjk->bik", vec![&x, &y]),
        ("bij,bjk->kbi", vec![&x, &y]),
        ("bij,bjk->b", vec![&x, &y]),
        ("ii->i", vec![&sq]),
        ("ii->", vec![&sq]),
        ("bii->bi", vec![&cube]),
        ("ij,jk,kl->il", vec![&a, &b, &c]),
        ("ij,jk,kl->li", vec![&a, &b, &c]),
        ("ij,ij->ij", vec![&sq, &sq]),
        ("ij,kj->ikj", vec![&a, &a]),
    ] {
        check(eq, &ops, eq);
    }
}

#[test]
fn implicit_outputs_and_ellipses_follow_torch() {
    let (a, b) = (tensor(&[3, 4], 0), tensor(&[4, 5], 1));
    let sq = tensor(&[4, 4], 7);
    let (x, y) = (tensor(&[2, 3, 4], 5), tensor(&[2, 4, 5], 6));
    // Without `->`: the labels used once, alphabetically.
    check("ij,jk", &[&a, &b], "ij,jk->ik");
    check("ba", &[&a], "ba->ab");
    check("ii", &[&sq], "ii->");
    // An ellipsis stands for the axes the letters leave, broadcast across operands.
    check("...ij,...jk->...ik", &[&x, &y], "bij,bjk->bik");
    check("...ij,...jk", &[&x, &y], "bij,bjk->bik");
    check("...ij,jk->...ik", &[&x, &b.reshape(&[4, 5]).unwrap()], "bij,jk->bik");
    check("b...,b...->b", &[&x, &x], "bij,bij->b");
    check("...ii->...i", &[&tensor(&[2, 3, 3], 8)], "bii->bi");
    check(" i j , j k -> i k ", &[&a, &b], "ij,jk->ik");
    // A size-1 axis broadcasts: the ellipsis's batch of 1 against 2, a label's 1 against 4.
    let (one, y0) = (tensor(&[1, 4, 5], 6), tensor(&[4, 5], 6));
    let got = Tensor::einsum("...ij,...jk->...ik", &[&x, &one]).unwrap().to_data().unwrap().values().to_vec();
    let want = Tensor::einsum("bij,jk->bik", &[&x, &y0]).unwrap().to_data().unwrap().values().to_vec();
    assert_eq!(got, want);
    let row = tensor(&[1, 5], 9);
    let got = Tensor::einsum("ij,jk->ik", &[&a, &row]).unwrap().to_data().unwrap().values().to_vec();
    let want =
        Tensor::einsum("ij,jk->ik", &[&a, &row.expand(&[4, 5]).unwrap()]).unwrap().to_data().unwrap().values().to_vec();
    assert_eq!(got, want);
}

#[test]
fn contractions_are_matmuls_and_differentiate() {
    let spec = [TensorSpec::new(DType::F32, &[2, 3, 4]), TensorSpec::new(DType::F32, &[4, 5])];
    let g = capture(&spec, |t| Ok(vec![Tensor::einsum("nij,jk->nik", &[&t[0], &t[1]])?]));
    let g = g.unwrap_or_else(|e| panic!("{e}"));
    assert!(g.nodes.iter().any(|n| n.op == kiln_graph::ir::Op::MatMul), "{g}");
    // d/da sum(einsum(ij,jk->ik)) is b's row sums, broadcast over a's rows.
    let (a, b) = (tensor(&[3, 4], 0), tensor(&[4, 5], 1));
    let f = |p: &[Tensor]| Tensor::einsum("ij,jk->ik", &[&p[0], &p[1]])?.sum(&[], false);
    let (_, grads) = kiln_graph::autodiff::value_and_grad(f, &[a, b.clone()], &[0]).unwrap_or_else(|e| panic!("{e}"));
    let rows: Vec<f64> = b.sum(&[1], false).unwrap().to_data().unwrap().values().to_vec();
    let ga = grads[0].to_data().unwrap().values().to_vec();
    assert_eq!(ga.len(), 12);
    for (i, g) in ga.iter().enumerate() {
        assert!((g - rows[i % 4]).abs() < 1e-12, "element {i}: {g} vs {}", rows[i % 4]);
    }
}

#[test]
fn bad_equations_are_typed_errors_at_the_callers_line() {
    let (a, b) = (tensor(&[3, 4], 0), tensor(&[5, 5], 1));
    for (eq, ops) in [
        ("ij,jk->ik", vec![&a]),
        ("ijk->i", vec![&a]),
        ("i1->i", vec![&a]),
        ("ij->iz", vec![&a]),
        ("ij->ii", vec![&a]),
        ("ij,jk->ik", vec![&a, &b]),
        ("ii->i", vec![&a]),
    ] {
        let (r, line) = (Tensor::einsum(eq, &ops), line!());
        match r {
            Err(Error::InvalidArgument { op, loc, .. }) | Err(Error::Shape { op, loc, .. }) => {
                assert!(op == "einsum" || op == "matmul", "{eq}: {op}");
                assert_eq!(loc.line, line, "{eq}: {loc}");
            }
            other => panic!("{eq}: expected a typed error, got {other:?}"),
        }
    }
}

/// Random equations: one to three operands of rank 0 to 3 over five labels (repeats in an operand are
/// diagonals), each label one size, an explicit output of some labels in any order — every contraction
/// plan `einsum` picks (pairwise matmuls, diagonals, sums of labels only one operand has, outer products)
/// against the definition.
mod random_equations {
    use super::{check, tensor};
    use proptest::prelude::*;

    fn equation() -> impl Strategy<Value = (String, Vec<Vec<usize>>)> {
        let sizes = proptest::collection::vec(1usize..4, 5);
        let terms = proptest::collection::vec(proptest::collection::vec(0usize..5, 0..4), 1..4);
        let order = proptest::collection::vec(any::<u8>(), 5);
        (sizes, terms, order, any::<u8>()).prop_map(|(sizes, terms, order, keep)| {
            let label = |l: usize| (b'a' + l as u8) as char;
            let mut used: Vec<usize> = terms.iter().flatten().copied().collect();
            used.sort_unstable();
            used.dedup();
            // Some of the labels, each once, in an order drawn from `order`.
            let mut out: Vec<usize> = used.iter().copied().filter(|&l| keep & (1 << l) != 0).collect();
            out.sort_by_key(|&l| order[l]);
            let inputs: Vec<String> = terms.iter().map(|t| t.iter().map(|&l| label(l)).collect()).collect();
            let eq = format!("{}->{}", inputs.join(","), out.iter().map(|&l| label(l)).collect::<String>());
            let dims = terms.iter().map(|t| t.iter().map(|&l| sizes[l]).collect()).collect();
            (eq, dims)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn random_equations_match_their_definition((eq, dims) in equation()) {
            let operands: Vec<kiln_graph::Tensor> = dims.iter().enumerate().map(|(i, d)| tensor(d, i)).collect();
            let refs: Vec<&kiln_graph::Tensor> = operands.iter().collect();
            check(&eq, &refs, &eq);
        }
    }
}
