//! The symbolic simplifier against evaluation: an expression built from the fuzzer's bytes over three
//! symbols with ranges, simplified with those ranges, must evaluate to the same value as the original for
//! every binding inside the ranges (where the original evaluates without overflow).
#![no_main]

use kiln_graph::sym::{Bindings, Expr, SymTable};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let mut it = bytes.iter().copied();
    let mut next = move || it.next();
    let mut table = SymTable::new();
    let mut syms = Vec::new();
    for name in ["a", "b", "c"] {
        let lo = i64::from(next().unwrap_or(0) % 8);
        let hi = lo + i64::from(next().unwrap_or(7) % 64);
        syms.push((table.new_symbol(name, lo, Some(hi)), lo, hi));
    }
    // A stack machine: each byte pushes a leaf or combines the top two.
    let mut stack: Vec<Expr> = Vec::new();
    while let Some(op) = next() {
        let arg = i64::from(next().unwrap_or(1));
        let leaf = match op % 12 {
            0 => Some(Expr::constant(arg - 128)),
            1 => Some(Expr::sym(syms[(arg as usize) % 3].0)),
            _ => None,
        };
        if let Some(e) = leaf {
            stack.push(e);
            continue;
        }
        let (Some(y), Some(x)) = (stack.pop(), stack.pop()) else { continue };
        let r = match op % 12 {
            2 | 3 => x.checked_add(&y),
            4 => x.checked_sub(&y),
            5 | 6 => x.checked_mul(&y),
            // Divisors the kernels use: positive constants and symbols (sizes).
            7 => x.checked_floor_div(&Expr::constant(arg % 16 + 1)),
            8 => x.checked_modulo(&Expr::constant(arg % 16 + 1)),
            9 => x.checked_floor_div(&Expr::sym(syms[(arg as usize) % 3].0).add(&Expr::constant(1))),
            10 => Ok(x.min(&y)),
            _ => Ok(x.max(&y)),
        };
        match r {
            Ok(e) => stack.push(e),
            Err(_) => return,
        }
        if stack.len() > 32 {
            return;
        }
    }
    let Some(e) = stack.pop() else { return };
    let simple = e.simplify_in(&table);
    // Bindings at the ranges' corners and a few points between.
    for pick in 0..8u32 {
        let mut b = Bindings::new();
        for (k, (s, lo, hi)) in syms.iter().enumerate() {
            let v = match (pick >> k) & 1 {
                0 => *lo,
                _ => *hi,
            };
            let v = if pick >= 4 { lo + (hi - lo) / 2 + (k as i64) % (hi - lo + 1) } else { v };
            b.bind(*s, v.min(*hi));
        }
        if let (Ok(want), Ok(got)) = (e.eval(&b), simple.eval(&b)) {
            assert_eq!(want, got, "{e} simplified to {simple} differs at {b:?}");
        }
    }
});
