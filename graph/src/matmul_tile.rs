//! The matmul template's schedule ([`Tile`]), chosen here once from the target and the product's shape,
//! so the renderers print it and decide nothing.
//!
//! Five schedules, over 16 × 16 threads where the target runs 256 a workgroup (8 × 32 for the narrow one):
//! - **large**: 128 × 128 outputs a workgroup, 8 × 8 a thread in two runs of 4 each way, depth 8. Per
//!   step of depth a thread reads 2 + 2 four-wide vectors of workgroup memory for 64 multiply-adds;
//! - **half**: 128 × 64 (or 64 × 128), 8 × 4 a thread, depth 8: 2 + 1 vectors for 32;
//! - **medium**: 64 × 64, 4 × 4 a thread (one run of 4 each way), depth 16: 1 + 1 vectors for 16;
//! - **narrow**: 32 × 128 (or 128 × 32) over 8 × 32 threads, 4 × 4 a thread, depth 16: the medium
//!   tile's work a thread for products with 32–63 rows (DenseNet's 32-channel 3 × 3 convolutions, whose
//!   batch and pixels are the columns), where it makes at least [`NARROW_MIN_GROUPS`] workgroups;
//! - **small**: 16 × 16, one output a thread, depth 16: products too narrow for the others.
//!
//! A large tile leaves a GPU's cores idle when a product has few of them: under
//! [`LARGE_MIN_GROUPS`] workgroups the half one is taken, and under as many of those the medium one.
//! A transformer's projections (4096 tokens × 768 features: 192 large tiles, 384 half ones) are the
//! usual case.

use crate::kernel::{MatOperand, Scalar, Stmt, Tile};
use crate::sym::{Expr, SymId};
use crate::target::Target;

/// The large schedule's tile edge: [`Target::matmul_tile`]'s default (no cap).
pub const LARGEST: u32 = 128;

/// Fewest workgroups a product must make of large tiles to take them: about two for each compute unit
/// of a large GPU (an H200 has 132), so the last wave is not most of the run.
pub const LARGE_MIN_GROUPS: i64 = 256;

/// Fewest workgroups a product must make of narrow tiles to take them (one a compute unit of a large
/// GPU): with fewer, the small tile's many more workgroups keep more of the GPU busy.
pub const NARROW_MIN_GROUPS: i64 = 128;

/// The schedule for a product of `batch` matrices of `m × n` outputs summed in elements of `acc_bytes`,
/// its operands read in `depth_fastest` order ([`read_order`]).
pub fn choose(target: &Target, batch: &Expr, m: &Expr, n: &Expr, acc_bytes: u32, depth_fastest: [bool; 2]) -> Tile {
    let tile = shape(target, batch, m, n, acc_bytes, depth_fastest);
    // The target's stages where their tiles fit its workgroup memory (WebGPU's guaranteed 16 KiB holds
    // one stage of the large tile, not two).
    let staged = Tile { stages: target.matmul_stages.clamp(1, 2), ..tile };
    if staged.shared_bytes(acc_bytes) <= target.template_shared_bytes() {
        staged
    } else {
        tile
    }
}

/// [`choose`]'s output tile, thread grid and depth step, with one stage.
fn shape(target: &Target, batch: &Expr, m: &Expr, n: &Expr, acc_bytes: u32, depth_fastest: [bool; 2]) -> Tile {
    let side = threads_side(target.max_threads_per_group);
    let at_least = |e: &Expr, c: u32| e.as_const().is_none_or(|v| v >= i64::from(c));
    // Workgroups the product makes of `edge`-wide tiles, where every extent is known.
    let groups = |t: &Tile| {
        let tiles = |e: &Expr, edge: u32| e.as_const().map(|v| (v + i64::from(edge) - 1) / i64::from(edge));
        Some(batch.as_const()?.saturating_mul(tiles(m, t.m)?).saturating_mul(tiles(n, t.n)?))
    };
    let takes = |t: &Tile| {
        target.matmul_tile >= t.m.max(t.n)
            && at_least(m, t.m)
            && at_least(n, t.n)
            && t.shared_bytes(acc_bytes) <= target.template_shared_bytes()
    };
    let enough = |t: &Tile| takes(t) && groups(t).is_none_or(|g| g >= LARGE_MIN_GROUPS);
    let large = Tile { m: 8 * side, n: 8 * side, k: 8, threads: [side, side], run: 4, depth_fastest, stages: 1 };
    if enough(&large) {
        return large;
    }
    // Half tiles, the longer side along the longer extent (rows on a tie, or where unknown).
    let tall = Tile { n: 4 * side, ..large };
    let wide = Tile { m: 4 * side, ..large };
    let rows_first = match (m.as_const(), n.as_const()) {
        (Some(m), Some(n)) => m >= n,
        (Some(_), None) => false,
        _ => true,
    };
    let halves = if rows_first { [tall, wide] } else { [wide, tall] };
    if let Some(half) = halves.into_iter().find(|t| enough(t)) {
        return half;
    }
    let medium = Tile { m: 4 * side, n: 4 * side, k: 16, threads: [side, side], run: 4, depth_fastest, stages: 1 };
    if takes(&medium) {
        return medium;
    }
    // Narrow tiles, the short side across the short extent; threads 8 × 32 (for 256), 4 × 4 sums each.
    if side >= 4 {
        let rows =
            Tile { m: 2 * side, n: 8 * side, k: 16, threads: [side / 2, 2 * side], run: 4, depth_fastest, stages: 1 };
        let cols = Tile { m: 8 * side, n: 2 * side, threads: [2 * side, side / 2], ..rows };
        let many = |t: &Tile| takes(t) && groups(t).is_none_or(|g| g >= NARROW_MIN_GROUPS);
        if let Some(narrow) = [rows, cols].into_iter().find(|t| many(t)) {
            return narrow;
        }
    }
    Tile { m: side, n: side, k: 16, threads: [side, side], run: 1, depth_fastest, stages: 1 }
}

/// `Tile::depth_fastest` for operands `a` (read at row `i`, depth `p`) and `b` (depth `p`, column `j`):
/// depth-fastest where an operand's loads step one element along the depth and not along its other
/// axis, the other way round where they step one element along that axis; otherwise as a row-major
/// operand is read. A linear layer's weight is the usual case: `x · wᵀ` reads B one element apart along
/// the depth, and the other order read it 768 elements apart from thread to thread.
pub fn read_order(a: &MatOperand, b: &MatOperand, [_, i, j, p]: [SymId; 4]) -> [bool; 2] {
    [depth_fastest(&a.body, p, i).unwrap_or(true), depth_fastest(&b.body, p, j).unwrap_or(false)]
}

/// Whether the first load of `body` that is contiguous along exactly one of `depth` and `other` is so
/// along `depth`.
fn depth_fastest(body: &[Stmt], depth: SymId, other: SymId) -> Option<bool> {
    body.iter().find_map(|st| match st {
        Stmt::Let { value: Scalar::Load { index, .. }, .. } => {
            match (index.shift_by(depth, 1) == Some(1), index.shift_by(other, 1) == Some(1)) {
                (true, false) => Some(true),
                (false, true) => Some(false),
                _ => None,
            }
        }
        _ => None,
    })
}

/// Threads along each side of the square: the largest power of two up to 16 whose square the target runs
/// in one workgroup.
fn threads_side(max_threads: u32) -> u32 {
    let mut side = 16;
    while side > 1 && side * side > max_threads {
        side /= 2;
    }
    side
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tile(target: &Target, batch: i64, m: i64, n: i64) -> Tile {
        choose(target, &Expr::from(batch), &Expr::from(m), &Expr::from(n), 4, [true, false])
    }

    #[test]
    fn large_products_take_large_tiles_and_fewer_half_or_medium_ones() {
        let t = Target::webgpu_default();
        // W5's MLP: 4096 tokens × 3072 features make 32 × 24 large tiles.
        assert_eq!(tile(&t, 1, 4096, 3072).m, 128);
        // 4096 × 768 make 192 large tiles: fewer than two a compute unit, so half ones (384).
        assert_eq!((tile(&t, 1, 4096, 768).m, tile(&t, 1, 4096, 768).n), (128, 64));
        assert_eq!((tile(&t, 1, 768, 4096).m, tile(&t, 1, 768, 4096).n), (64, 128));
        // 1024 × 1024 make 64 large tiles and 128 half ones: medium ones (256).
        assert_eq!((tile(&t, 1, 1024, 1024).m, tile(&t, 1, 1024, 1024).n), (64, 64));
        assert_eq!(tile(&t, 96, 512, 512).m, 128);
        // Attention's second product (96 heads × 512 queries × 64 values): half tiles, the short side 64.
        assert_eq!((tile(&t, 96, 512, 64).m, tile(&t, 96, 512, 64).n), (128, 64));
        assert_eq!(tile(&t, 1, 100, 4096).m, 64);
        // 40 rows × 16,384 columns (DenseNet's first 3 × 3 convolutions): 128 narrow tiles.
        assert_eq!(
            (tile(&t, 1, 40, 16384).m, tile(&t, 1, 40, 16384).n, tile(&t, 1, 40, 16384).threads),
            (32, 128, [8, 32])
        );
        assert_eq!((tile(&t, 1, 16384, 40).m, tile(&t, 1, 16384, 40).n), (128, 32));
        assert_eq!(tile(&t, 1, 4096, 40).m, 16);
        // 32 × 1,024 would make 8: the small tile's 128 keep more of a GPU busy.
        assert_eq!(tile(&t, 1, 32, 1024).m, 16);
        assert_eq!(tile(&t, 1, 4096, 20).m, 16);
        // A symbolic extent may be large.
        let sym = Expr::sym(crate::sym::SymId(0));
        assert_eq!(choose(&t, &Expr::from(1i64), &sym, &Expr::from(1024i64), 4, [true, false]).m, 128);
        let tall = choose(&t, &Expr::from(1i64), &sym, &Expr::from(72i64), 4, [true, false]);
        assert_eq!((tall.m, tall.n), (128, 64));
        let wide = choose(&t, &Expr::from(1i64), &Expr::from(72i64), &sym, 4, [true, false]);
        assert_eq!((wide.m, wide.n), (64, 128));
    }

    #[test]
    fn every_schedule_fits_its_target() {
        for threads in [1024, 256, 128, 64, 32, 1] {
            for cap in [128, 64, 16] {
                for stages in [1, 2] {
                    let t = Target {
                        max_threads_per_group: threads,
                        matmul_tile: cap,
                        matmul_stages: stages,
                        ..Target::webgpu_default()
                    };
                    for (m, n) in [(4096, 4096), (4096, 768), (768, 4096), (64, 64), (40, 16384), (16384, 40), (16, 3)]
                    {
                        let s = tile(&t, 1, m, n);
                        let count = s.threads[0] * s.threads[1];
                        assert!(count <= threads, "{s:?} on {threads} threads");
                        assert_eq!(s.unfit(count), None, "{s:?}");
                        assert!(s.m.max(s.n) <= cap.max(s.threads[0]), "{s:?} under a cap of {cap}");
                        assert!(s.shared_bytes(4) <= t.template_shared_bytes());
                        assert!(s.stages <= stages, "{s:?}");
                    }
                }
            }
        }
    }

    /// `Tile::slot_step`'s walk is the element each slot reads (`local + q · threads`), placed as the
    /// renderers place it from the element itself, for every schedule and both read orders.
    #[test]
    fn slots_walk_the_elements_they_read() {
        // 16 and 64 threads a workgroup make the smaller sides (4 and 8 threads) whose slots step by a
        // number of rows that is not a whole run (the renderers' other store form).
        for (max_threads, (m, n)) in [256, 64, 16].into_iter().flat_map(|t| {
            [(4096, 4096), (4096, 768), (768, 4096), (64, 64), (40, 16384), (16384, 40), (16, 3)].map(|mn| (t, mn))
        }) {
            let t = Target {
                shared_memory_bytes: 48 * 1024,
                max_threads_per_group: max_threads,
                ..Target::webgpu_default()
            };
            for order in [[true, false], [false, true], [true, true], [false, false]] {
                let s = choose(&t, &Expr::from(1i64), &Expr::from(m as i64), &Expr::from(n as i64), 4, order);
                let threads = s.threads[0] * s.threads[1];
                for (side, outer) in [(0, s.m), (1, s.n)] {
                    let Some([dd, step_other]) = s.slot_step(side, threads) else { continue };
                    for local in 0..threads {
                        for q in 0..s.slots(threads)[side] {
                            let e = local + q * threads;
                            if e >= outer * s.k {
                                continue;
                            }
                            let (depth, other, first) = if s.depth_fastest[side] {
                                (e % s.k, e / s.k, (local % s.k, local / s.k))
                            } else {
                                (e / outer, e % outer, (local / outer, local % outer))
                            };
                            assert_eq!((depth, other), (first.0 + q * dd, first.1 + q * step_other), "{s:?}");
                        }
                    }
                }
            }
        }
    }

    /// Two stages where they fit the target's workgroup memory: WebGPU's guaranteed 16 KiB holds one of
    /// the large (8.25 KiB a stage) and medium (8.5 KiB) tiles and two of the small one; 48 KiB two of
    /// each.
    #[test]
    fn two_stages_where_they_fit() {
        let web = Target { matmul_stages: 2, ..Target::webgpu_default() };
        assert_eq!(web.template_shared_bytes(), 16 * 1024);
        assert_eq!((tile(&web, 1, 4096, 4096).m, tile(&web, 1, 4096, 4096).stages), (128, 1));
        assert_eq!((tile(&web, 1, 1024, 1024).m, tile(&web, 1, 1024, 1024).stages), (64, 1));
        assert_eq!((tile(&web, 1, 4096, 20).m, tile(&web, 1, 4096, 20).stages), (16, 2));
        let big = Target { shared_memory_bytes: 48 * 1024, ..web };
        assert_eq!((tile(&big, 1, 4096, 4096).stages, tile(&big, 1, 1024, 1024).stages), (2, 2));
        assert_eq!(tile(&Target::webgpu_default(), 1, 4096, 4096).stages, 1);
    }
}
