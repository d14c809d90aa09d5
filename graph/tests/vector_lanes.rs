//! Vectorised kernels as renderers print them: each lane's body ([`Kernel::lane_body`]) has its index
//! expressions rewritten over the vector's number. Every rewritten expression must equal the original
//! at that lane's element, for every vectorised kernel of the workloads with padded windows,
//! concatenations and permuted reads (W6), and of a transformer (W5, W5-bf16); and
//! the rewriting must move the lane-independent work out of the lanes (W6's im2col writers).

use kiln_graph::kernel::{builtin::VECTOR_INDEX, Kernel, LoopMode, Scalar, Stmt};
use kiln_graph::sym::{Bindings, Expr, ExprTree, SymId};
use kiln_graph::{capture, compile_graph, workloads, Target};
use std::collections::HashSet;

/// The index expressions of a loop body, in order.
fn exprs(body: &[Stmt]) -> Vec<&Expr> {
    body.iter()
        .filter_map(|st| match st {
            Stmt::Let { value: Scalar::Load { index, .. }, .. } | Stmt::Store { index, .. } => Some(index),
            Stmt::Let { value: Scalar::Index { expr }, .. } => Some(expr),
            _ => None,
        })
        .collect()
}

/// Adds every division and remainder in `t` to `out`, spelled out.
fn divisions(t: &ExprTree, out: &mut HashSet<String>) {
    match t {
        ExprTree::Const(_) | ExprTree::Sym(_) => {}
        ExprTree::Add(v) | ExprTree::Mul(v) => v.iter().for_each(|x| divisions(x, out)),
        ExprTree::FloorDiv(a, b) | ExprTree::Mod(a, b) => {
            out.insert(format!("{t:?}"));
            divisions(a, out);
            divisions(b, out);
        }
        ExprTree::Min(a, b) | ExprTree::Max(a, b) => {
            divisions(a, out);
            divisions(b, out);
        }
    }
}

/// The vectorised `Global` loop of `k`: its variable, extent and body.
fn vector_loop(k: &Kernel) -> Option<(SymId, &Expr, &[Stmt])> {
    k.body.iter().find_map(|st| match st {
        Stmt::Loop { sym, extent, mode: LoopMode::Global, body } if k.vector_width > 1 => {
            Some((*sym, extent, body.as_slice()))
        }
        _ => None,
    })
}

/// Checks every lane of every vectorised kernel of `id` compiled for `target`; returns how many
/// distinct divisions and remainders the lanes of a vector compute, in all kernels, before (each lane
/// its own, at its own element) and after rewriting (lanes share what reads the same).
fn check(id: &str, target: &Target) -> (usize, usize) {
    let w = workloads::all().into_iter().find(|w| w.id == id).expect("workload");
    let c = compile_graph(&capture(&w.full, w.f).unwrap(), target).unwrap();
    let (mut before, mut after) = (0, 0);
    let mut checked = 0;
    for k in &c.kernels {
        let Some((i, extent, body)) = vector_loop(k) else { continue };
        let n = extent.as_const().expect("a concrete workload");
        let width = i64::from(k.vector_width);
        let ranges = k.index_ranges();
        let original = exprs(body);
        let mut own = HashSet::new();
        original.iter().for_each(|e| divisions(&e.tree(), &mut own));
        before += own.len() * k.vector_width as usize;
        let mut shared = HashSet::new();
        for lane in 0..k.vector_width {
            let rewritten = k.lane_body(i, body, lane, &ranges);
            let rewritten = exprs(&rewritten);
            assert_eq!(rewritten.len(), original.len(), "{}", k.name);
            rewritten.iter().for_each(|e| divisions(&e.tree(), &mut shared));
            // Vectors at both ends and a spread in between.
            let vectors = n / width;
            let samples = (0..vectors.min(64)).chain((0..64).map(|s| s * vectors / 64)).chain([vectors - 1]);
            for v in samples {
                let element = width * v + i64::from(lane);
                let at = Bindings::new().with(i, element).with(VECTOR_INDEX, v);
                for (o, r) in original.iter().zip(&rewritten) {
                    assert_eq!(
                        r.eval(&at),
                        o.eval(&at),
                        "{}: lane {lane} of vector {v}: `{o}` rewritten as `{r}`",
                        k.name
                    );
                }
            }
        }
        after += shared.len();
        checked += 1;
    }
    assert!(checked > 0, "{id} has vectorised kernels");
    (before, after)
}

#[test]
fn every_lane_of_densenet_reads_what_its_element_reads() {
    let (before, after) = check("W6", &Target::cuda(90));
    // What lanes still divide is mostly the lane-independent coordinates, the same expression in every
    // lane (computed once); before, every lane divided its own element's index.
    assert!(after * 3 < before, "divisions per vector: {after} rewritten against {before}");
    check("W6", &Target::webgpu_default());
}

#[test]
fn every_lane_of_a_transformer_reads_what_its_element_reads() {
    check("W5-bf16", &Target::cuda(90));
    check("W5", &Target::cuda(90));
}

fn scaled(t: &[kiln_graph::Tensor]) -> kiln_graph::Result<Vec<kiln_graph::Tensor>> {
    Ok(vec![t[0].mul(2.0)?.add(1.0)?])
}

fn widened(t: &[kiln_graph::Tensor]) -> kiln_graph::Result<Vec<kiln_graph::Tensor>> {
    Ok(vec![t[0].cast(kiln_graph::DType::F32)?.mul(3.0)?])
}

/// A vector fills one access with its widest element: eight bf16 lanes on CUDA (16 bytes), four on
/// WebGPU, whose vectors stop at four; four where an f32 buffer is beside the bf16 one (eight would take
/// it two accesses and twice the registers).
#[test]
fn half_precision_vectors_fill_sixteen_bytes_where_the_target_allows_eight_lanes() {
    use kiln_graph::{DType, TensorSpec};
    let width = |f: fn(&[kiln_graph::Tensor]) -> kiln_graph::Result<Vec<kiln_graph::Tensor>>, dtype, t: &Target| {
        let g = capture(&[TensorSpec::new(dtype, &[64, 96])], f).unwrap();
        let c = compile_graph(&g, t).unwrap();
        assert_eq!(c.kernels.len(), 1, "{c}");
        c.kernels[0].vector_width
    };
    let web = Target { packed_half_storage: false, ..Target::webgpu_default() };
    assert_eq!(width(scaled, DType::BF16, &Target::cuda(90)), 8);
    assert_eq!(width(scaled, DType::BF16, &web), 4);
    assert_eq!(width(scaled, DType::F32, &Target::cuda(90)), 4);
    assert_eq!(width(widened, DType::BF16, &Target::cuda(90)), 4);
}
