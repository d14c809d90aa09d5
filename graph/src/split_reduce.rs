//! Split reductions: a reduction the device cannot spread over its cores in one pass becomes a chain of
//! reductions, each over a piece of the reduced axis, that can.
//!
//! Lowering gives each output of a reduction either a workgroup (rows along the innermost axis, read
//! contiguously) or a thread (columns: the innermost axis kept, so neighbouring threads read neighbouring
//! elements). Two shapes defeat both on their own:
//! - a few long rows (a mean-square loss over a whole batch is one row of millions): a handful of
//!   workgroups on a GPU of a hundred cores;
//! - columns with long reduced axes (a bias gradient sums 4,096 tokens for each of 768 features): a
//!   thread per output is too few threads, each walking too far, and a workgroup per output reads one
//!   element per row at a stride.
//!
//! Here, before fusion, each is rewritten as `[outer, r, inner] → [outer, c, r/c, inner]` summed over
//! the `r/c` axis, then the `c` partials reduced the same way, until one pass suffices. Partial sums of a
//! half-precision tensor are kept in f32 and rounded once at the end, as a single pass would. Only
//! shapes known at compile time split (a piece must divide the axis exactly); the kernels each stage
//! becomes are ordinary row or column reductions, so every backend gets the same plan.

use crate::decompose::Builder;
use crate::dtype::DType;
use crate::interp::reduce_dtype;
use crate::ir::{NodeId, ReduceOp};
use crate::shape::{reduced_shape, Shape};
use crate::sym::Expr;

/// Outputs a column stage aims for unless the target says otherwise (`Target::column_threads`): an H200
/// keeps 132 × 2,048 threads resident; half of that, each with its own stream of loads, keeps its memory
/// busy.
pub const COLUMN_THREADS: u64 = 1 << 17;
/// Elements one thread of a column stage sums in sequence: fewer wastes the thread, more makes the pass
/// a chain of dependent loads.
const COLUMN_SERIAL: (u64, u64) = (16, 128);
/// Rows fewer than this leave most of a GPU's cores idle (a workgroup each)...
const FEW_ROWS: u64 = 512;
/// ...when each is at least this long; split rows aim for this many rows...
const WANT_ROWS: u64 = 1024;
/// ...of at least this many elements each (a workgroup's worth of loads in flight).
const MIN_PIECE: u64 = 4096;

/// The longest column a single pass sums serially (lowering's column strategy reads this bound).
pub const SERIAL_COLUMN: u64 = COLUMN_SERIAL.1;

/// What a target offers column reductions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Columns {
    /// Outputs a column stage aims for (`Target::column_threads`).
    pub threads: u64,
    /// The target's subgroup size, when it has subgroup operations (0 otherwise): a last pass over more
    /// than `SERIAL_COLUMN` partials is a row reduction per output that lowering gives a subgroup of its
    /// own (`Launch::packed`), so the first pass can leave a few hundred partials instead of needing a
    /// middle pass (a launch of its own) to bring them under the serial bound.
    pub subgroup: u64,
}

impl Columns {
    /// What `target` offers.
    pub(crate) fn of(target: &crate::target::Target) -> Columns {
        Columns { threads: target.column_threads, subgroup: target.subgroup_size.unwrap_or(0) as u64 }
    }

    /// Without a target: the default aim, no subgroup passes.
    pub(crate) const DEFAULT: Columns = Columns { threads: COLUMN_THREADS, subgroup: 0 };
}

/// `op` over `axes` of `x` (a node of `b`'s graph) as a chain of split reductions, or `None` when one
/// pass is as good: a reduction other than a sum, max or min, symbolic dims, reduced axes that are not
/// adjacent, or a shape lowering already spreads well. The result has the one-pass reduction's dtype
/// and shape.
pub(crate) fn split(b: &mut Builder, op: ReduceOp, x: NodeId, axes: &[usize], keepdim: bool) -> Option<NodeId> {
    let input = b.shape(x);
    let dims: Vec<u64> =
        input.dims().iter().map(|d| d.as_const().filter(|&c| c > 0).map(|c| c as u64)).collect::<Option<_>>()?;
    let mut axes = axes.to_vec();
    axes.sort_unstable();
    axes.dedup();
    let (&lo, &last) = (axes.first()?, axes.last()?);
    if last + 1 - lo != axes.len() || last >= dims.len() {
        return None;
    }
    let outer: u64 = dims[..lo].iter().product();
    let reduced: u64 = dims[lo..=last].iter().product();
    let inner: u64 = dims[last + 1..].iter().product();
    let pieces = plan(outer, reduced, inner, b.columns);
    if pieces.is_empty() {
        return None;
    }
    let (dtype, shape) = (reduce_dtype(op, b.dtype(x)), reduced_shape(&input, &axes, keepdim));
    // Partial sums of half-precision values stay in f32 (as one pass's accumulator does).
    let half = b.dtype(x).is_half() && op == ReduceOp::Sum;
    let mut v = if half { b.cast(x, DType::F32) } else { x };
    // The kept axes stay as they are, so the last pass can be the reduction's own shape.
    let around = |mid: &[u64]| {
        let mut d = input.dims()[..lo].to_vec();
        d.extend(mid.iter().map(|&n| Expr::from(n as usize)));
        d.extend_from_slice(&input.dims()[last + 1..]);
        Shape(d)
    };
    let mut r = reduced;
    for c in pieces {
        v = b.reshape(v, around(&[c, r / c]));
        v = b.reduce_whole(op, v, &[lo + 1], false);
        r = c;
    }
    let v = b.reduce_whole(op, v, &[lo], keepdim && axes.len() == 1);
    let v = b.cast(v, dtype);
    Some(if b.shape(v) == shape { v } else { b.reshape(v, shape) })
}

/// The piece counts of each split stage (outermost last), for `outer × reduced × inner` elements.
fn plan(outer: u64, mut reduced: u64, inner: u64, columns: Columns) -> Vec<u64> {
    if inner > 1 {
        if let Some(c) = subgroup_tail(outer * inner, reduced, columns) {
            return vec![c];
        }
    }
    let mut pieces = Vec::new();
    while let Some(c) =
        if inner == 1 { row_pieces(outer, reduced) } else { column_pieces(outer * inner, reduced, columns.threads) }
    {
        pieces.push(c);
        reduced = c;
    }
    pieces
}

/// Pieces to cut `rows` contiguous rows of `len` into, when there are too few rows for the device.
fn row_pieces(rows: u64, len: u64) -> Option<u64> {
    if rows >= FEW_ROWS || len < 8 * MIN_PIECE {
        return None;
    }
    let most = (WANT_ROWS / rows).max(2).min(len / MIN_PIECE);
    (2..=most).rev().find(|c| len % c == 0)
}

/// Pieces to cut columns of `len` into, for `outputs` columns read side by side: pieces of at most
/// `COLUMN_SERIAL.1` elements (longer ones are not short columns; and the search stays a few steps
/// however long the axis).
fn column_pieces(outputs: u64, len: u64, column_threads: u64) -> Option<u64> {
    let (fewest, most) = COLUMN_SERIAL;
    if len <= 2 * fewest {
        return None;
    }
    let serial = (outputs * len).div_ceil(column_threads.max(1)).clamp(fewest, most);
    let piece = (serial..=most.min(len - 1)).find(|d| len % d == 0)?;
    Some(len / piece)
}

/// With subgroups, two passes: serial pieces of at least `COLUMN_SERIAL.0` elements leaving more
/// partials than one thread sums serially and at most what one subgroup takes in its last pass (the piece
/// count nearest the target's aim). `None` where no such count divides the column.
fn subgroup_tail(outputs: u64, len: u64, columns: Columns) -> Option<u64> {
    // As many as lowering gives one subgroup's threads (more get a workgroup of several subgroups).
    let most = columns.subgroup * crate::lower::ROW_ELEMENTS_PER_THREAD;
    let aim = (columns.threads / outputs.max(1)).max(1);
    (SERIAL_COLUMN + 1..=most.min(len / COLUMN_SERIAL.0)).filter(|c| len % c == 0).min_by_key(|&c| c.abs_diff(aim))
}

#[cfg(test)]
mod tests {
    use super::{plan, Columns, COLUMN_THREADS};

    const NO_SUBGROUPS: Columns = Columns::DEFAULT;

    fn aiming(threads: u64) -> Columns {
        Columns { threads, subgroup: 0 }
    }

    #[test]
    fn a_whole_tensor_mean_is_cut_into_a_thousand_rows_then_one() {
        // W5's loss: one row of 8·512·768.
        assert_eq!(plan(1, 3 << 20, 1, NO_SUBGROUPS), vec![768]);
    }

    #[test]
    fn many_rows_or_short_rows_stay_whole() {
        assert!(plan(8192, 8192, 1, NO_SUBGROUPS).is_empty());
        assert!(plan(4, 1000, 1, NO_SUBGROUPS).is_empty());
    }

    #[test]
    fn a_bias_gradient_sums_columns_in_short_serial_pieces() {
        // 3,072 features over 4,096 tokens: 32 pieces of 128, then 32 partials each.
        assert_eq!(plan(1, 4096, 3072, NO_SUBGROUPS), vec![32]);
        // 768 features: 128 pieces of 32, then 8 of 16, then 8 partials.
        assert_eq!(plan(1, 4096, 768, NO_SUBGROUPS), vec![128, 8]);
        // Aiming for twice the threads: pieces of 16 (256 of them), then 16 of 16, then 16 partials.
        assert_eq!(plan(1, 4096, 768, aiming(2 * COLUMN_THREADS)), vec![256, 16]);
    }

    #[test]
    fn with_subgroups_a_column_is_summed_in_two_passes() {
        let cuda = Columns { threads: 1 << 18, subgroup: 32 };
        // 768 features over 4,096 tokens: 256 pieces of 16, then a subgroup sums each feature's 256.
        assert_eq!(plan(1, 4096, 768, cuda), vec![256]);
        // The QKV projection's 2,304: the same 256 pieces (the aim, 113, would leave too few partials).
        assert_eq!(plan(1, 4096, 2304, cuda), vec![256]);
        // No count of partials between 129 and 256 divides 4,099 · 2: the serial plan.
        assert_eq!(plan(1, 4099 * 2, 768, cuda), plan(1, 4099 * 2, 768, Columns { subgroup: 0, ..cuda }));
        // Rows along the innermost axis are not columns.
        assert_eq!(plan(1, 3 << 20, 1, cuda), vec![768]);
    }

    #[test]
    fn a_column_too_short_or_without_divisors_stays_whole() {
        assert!(plan(1, 32, 768, NO_SUBGROUPS).is_empty());
        assert!(plan(1, 4099, 768, NO_SUBGROUPS).is_empty(), "4,099 is prime");
        // Twice a large prime: no piece of 16–128 divides it (and finding that takes a few steps).
        assert!(plan(1, 2 * 1_000_000_007, 4, NO_SUBGROUPS).is_empty());
    }
}
