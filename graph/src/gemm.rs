//! When a matmul goes to the device's GEMM library (cuBLAS) instead of kiln's matmul template, and the
//! strided description the library gets. Vendor GEMMs are tuned per architecture far beyond a generic
//! template; what kiln keeps is the fusion around them: the epilogue becomes the next fused kernel.
//! Both decisions (whether, and the operand layouts) are made here from the `Target`, so runtimes only
//! translate the description into calls.

use crate::dtype::DType;
use crate::ir::{BinaryOp, Graph, NodeId, Op};
use crate::kernel::{GemmLayout, GemmOperand};
use crate::sym::{Expr, SymId, SymTable};
use crate::target::Target;
use std::collections::{BTreeMap, BTreeSet};

/// Multiply-adds below which kiln's own template (with its fused epilogue) beats a library call plus a
/// separate epilogue kernel: W4's 10 x 10 layers are ~1000 each, and one library launch costs more than
/// the whole fused layer.
pub const LIBRARY_MIN_MACS: i64 = 1 << 18;

/// Whether matmul `node` runs on the target's GEMM library: the target has one, the dtype is a float
/// the library takes, and the product is big enough (or symbolic, so possibly big).
pub fn wants_library(target: &Target, graph: &Graph, node: NodeId) -> bool {
    let n = graph.node(node);
    if !target.library_gemm || !matches!(n.dtype, DType::F32 | DType::F16 | DType::BF16) {
        return false;
    }
    let Some(a) = n.inputs.first() else { return false };
    let k = graph.node(*a).shape.dims().last().cloned().unwrap_or_else(|| Expr::from(1usize));
    let macs = n.shape.numel() * k;
    macs.as_const().is_none_or(|c| c >= LIBRARY_MIN_MACS)
}

/// Byte alignment the library's epilogue needs of every matrix it reads or writes (cuBLASLt picks its
/// vectorised kernels for 16-byte aligned operands); `lower` hands it nothing less, and a decomposition
/// that counts on the epilogue (`conv::Builder::conv_by_rows`) lays its slices out to keep it.
pub const EPILOGUE_ALIGN_BYTES: i64 = 16;

/// The matmuls of a decomposed graph whose library call rounds its operands to TF32
/// ([`Target::tf32_convolutions`]): the f32 products that convolutions of the traced graph became.
/// `origin[i]` is the traced node that decomposed node `i` came from.
pub fn tf32_products(decomposed: &Graph, origin: &[NodeId], traced: &Graph, target: &Target) -> BTreeSet<NodeId> {
    if !target.tf32_convolutions {
        return BTreeSet::new();
    }
    let from_conv = |i: usize| origin.get(i).is_some_and(|o| matches!(traced.node(*o).op, Op::Conv { .. }));
    (decomposed.nodes.iter().enumerate())
        .filter(|(i, n)| n.op == Op::MatMul && n.dtype == DType::F32 && from_conv(*i))
        .map(|(i, _)| NodeId(i as u32))
        .collect()
}

/// Whether `target` runs f32 convolutions in TF32 and `traced` has one (conservatively: a small one may
/// stay on kiln's full-precision template). The tolerance rule widens for such graphs
/// (`tolerance::Tolerance::of_on`).
pub fn rounds_to_tf32(traced: &Graph, target: &Target) -> bool {
    target.tf32_convolutions && traced.nodes.iter().any(|n| matches!(n.op, Op::Conv { .. }) && n.dtype == DType::F32)
}

/// `x` rounded to TF32, kiln's model of what the matrix units read: an f32 with its 13 lowest mantissa
/// bits rounded away, to nearest with ties away from zero (PTX's `cvt.rna.tf32.f32`). cuBLAS does not
/// document its conversion (it may truncate); the tolerance rule covers either.
pub fn tf32(x: f64) -> f64 {
    let f = x as f32;
    if !f.is_finite() {
        return f as f64;
    }
    f32::from_bits((f.to_bits() + 0x1000) & !0x1fff) as f64
}

/// What an add after a library GEMM brings to the call's epilogue ([`crate::kernel::GemmEpilogue`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addend {
    /// A vector along the output's last axis, broadcast over its rows (a linear layer's bias).
    Bias,
    /// A tensor shaped like the output (a residual connection).
    Residual,
}

/// Whether `add` adds something to `tip` (the GEMM's value so far) that the library can add inside the
/// call, and what: the other operand has the output's dtype and shape, and is either an `expand` of a
/// vector along the last axis (a bias) or anything else (a residual, read in place when laid out as the
/// output, else stored first). Returns the kind and the other operand.
pub fn addend(graph: &Graph, add: NodeId, tip: NodeId) -> Option<(Addend, NodeId)> {
    let n = graph.node(add);
    if n.op != (Op::Binary { op: BinaryOp::Add }) {
        return None;
    }
    let other = match n.inputs[..] {
        [a, b] if a == tip && b != tip => b,
        [a, b] if b == tip && a != tip => a,
        _ => return None,
    };
    let (t, o) = (graph.node(tip), graph.node(other));
    if o.dtype != t.dtype || n.dtype != t.dtype || o.shape != t.shape || n.shape != t.shape {
        return None;
    }
    let dims = t.shape.dims();
    let vector = |s: &crate::shape::Shape| {
        let d = s.dims();
        d.len() == dims.len()
            && d.split_last().is_some_and(|(last, rows)| {
                *last == dims[dims.len() - 1] && rows.iter().all(|e| e.as_const() == Some(1))
            })
    };
    let bias = o.op == Op::Expand && vector(&graph.node(o.inputs[0]).shape);
    Some((if bias { Addend::Bias } else { Addend::Residual }, other))
}

/// `e` as `offset + sum(coef_s * s)` over `syms` when it is exactly that (no floor-division or modulo
/// of them survives): `(offset, coefficients)`, the coefficients free of `syms`.
pub fn affine(e: &Expr, syms: &[SymId]) -> Option<(Expr, Vec<Expr>)> {
    let zero: BTreeMap<SymId, Expr> = syms.iter().map(|&s| (s, Expr::from(0i64))).collect();
    let offset = e.checked_substitute(&zero).ok()?;
    let mut coefs = Vec::with_capacity(syms.len());
    for &s in syms {
        let shift = BTreeMap::from([(s, Expr::sym(s) + Expr::from(1i64))]);
        let c = e.checked_substitute(&shift).ok()?.checked_sub(e).ok()?;
        if c.symbols().iter().any(|x| syms.contains(x)) {
            return None;
        }
        coefs.push(c);
    }
    let mut rebuilt = offset.clone();
    for (&s, c) in syms.iter().zip(&coefs) {
        rebuilt = rebuilt.checked_add(&Expr::sym(s).checked_mul(c).ok()?).ok()?;
    }
    (rebuilt == *e).then_some((offset, coefs))
}

/// The operand layout for a `rows x cols` view with the given strides, if a GEMM library can read it
/// in place: one of the two strides is 1 and the other (the leading dimension) spans the contiguous
/// extent. A dimension of extent 1 takes any stride.
pub fn operand(
    buffer: usize,
    offset: Expr,
    (rows, cols): (&Expr, &Expr),
    (row_stride, col_stride): (&Expr, &Expr),
    table: &SymTable,
) -> Option<GemmOperand> {
    let one = |e: &Expr| e.as_const() == Some(1);
    let spans = |ld: &Expr, extent: &Expr| table.known_ge(ld, extent) == Some(true);
    let row_major = (one(cols) || one(col_stride)) && (one(rows) || spans(row_stride, cols));
    let col_major = (one(rows) || one(row_stride)) && (one(cols) || spans(col_stride, rows));
    let (layout, ld) = if row_major {
        (GemmLayout::RowMajor, if one(rows) { cols.clone() } else { row_stride.clone() })
    } else if col_major {
        (GemmLayout::ColMajor, if one(cols) { rows.clone() } else { col_stride.clone() })
    } else {
        return None;
    };
    // Libraries want a leading dimension of at least 1 even for empty matrices.
    let ld = if table.known_ge(&ld, &Expr::from(1i64)) == Some(true) { ld } else { return None };
    Some(GemmOperand { buffer, offset, layout, ld })
}

impl GemmOperand {
    /// Element index of `(r, c)` for evaluated `start` (offset plus batch strides) and `ld`.
    pub fn element(&self, start: i64, ld: i64, r: i64, c: i64) -> i64 {
        match self.layout {
            GemmLayout::RowMajor => start + r * ld + c,
            GemmLayout::ColMajor => start + r + c * ld,
        }
    }
}
