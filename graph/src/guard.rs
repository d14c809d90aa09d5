//! Guards: the conditions under which a compiled entry may run again without tracing. An entry records,
//! for each tensor argument, its dtype, rank and every dim — a constant, or a symbol with a range — plus
//! the static arguments and the backend, which arguments are the same tensor (aliasing: `f(&x, &x)`
//! traces `x - x` as one input), which captured tensors (weights) the graph reads, and the shape
//! constraints tracing assumed (a reshape's `-1` that divides only for some sizes). A call checks them
//! cheaply; the first one that fails is the recompile reason kiln logs (`KILN_LOGS=recompiles`).

use crate::dtype::DType;
use crate::sym::{Bindings, SymId};
use serde::{Deserialize, Serialize};
use std::fmt;

/// When a dim becomes symbolic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dynamic {
    /// Static first; a dim whose change caused a recompile becomes symbolic in the new entry (torch's
    /// default).
    #[default]
    Auto,
    /// Every dim is symbolic from the first compile (sizes 0 and 1 stay specialised).
    Always,
    /// Every dim is static: each new shape compiles anew.
    Never,
}

/// One dim's guard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DimGuard {
    /// Exactly this size.
    Static(usize),
    /// Any size in `lo..=hi` (`hi` unbounded when `None`); dims sharing a symbol must be equal.
    Symbol {
        /// The symbol the compiled code uses for this dim.
        sym: SymId,
        /// Smallest size.
        lo: i64,
        /// Largest size.
        hi: Option<i64>,
    },
}

/// The guard of one tensor argument.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgGuard {
    /// Element type.
    pub dtype: DType,
    /// One guard per dim (the rank is their count).
    pub dims: Vec<DimGuard>,
}

/// All guards of one compiled entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Guards {
    /// Tensor arguments, in order.
    pub args: Vec<ArgGuard>,
    /// Static arguments, printed.
    pub statics: Vec<String>,
    /// The backend the entry runs on.
    pub backend: String,
    /// Per tensor argument: the index of the first argument that is the same tensor (itself when
    /// distinct). Tracing merges aliased arguments into one graph input, so the pattern must match.
    pub aliases: Vec<usize>,
    /// Identities of the captured tensors (weights) the graph reads as inputs of their own: an argument
    /// that *is* one of them was traced differently (merged with the capture), so it cannot reuse this entry.
    pub captured: Vec<u64>,
    /// Shape expressions tracing assumed to be zero (e.g. `(2*s0) % 4` for a reshape to `[-1, 4]`).
    pub shape_checks: Vec<crate::sym::Expr>,
}

/// The aliasing pattern of tensor identities: per position, the first position with the same identity.
pub fn alias_pattern(ids: &[u64]) -> Vec<usize> {
    // A map, not a scan of the earlier ids: W4 passes 259 tensors, and this runs on every call. Ids are
    // kiln's own counters, so the fast non-keyed hash is safe.
    let mut first: rustc_hash::FxHashMap<u64, usize> =
        rustc_hash::FxHashMap::with_capacity_and_hasher(ids.len(), Default::default());
    ids.iter().enumerate().map(|(i, id)| *first.entry(*id).or_insert(i)).collect()
}

thread_local! {
    /// First position of each identity, reused across calls (this check runs on every call).
    static FIRST_SEEN: std::cell::RefCell<rustc_hash::FxHashMap<u64, usize>> = Default::default();
}

/// Whether `ids` have the aliasing pattern `pattern` ([`alias_pattern`]), without building it.
pub fn aliases_match(ids: &[u64], pattern: &[usize]) -> bool {
    if ids.len() != pattern.len() {
        return false;
    }
    FIRST_SEEN.with(|m| {
        let Ok(mut first) = m.try_borrow_mut() else { return alias_pattern(ids) == pattern };
        first.clear();
        ids.iter().zip(pattern).enumerate().all(|(i, (id, &want))| *first.entry(*id).or_insert(i) == want)
    })
}

/// The most elements a tensor of a bounded entry may hold: below 2³¹, so every element index (and every
/// offset a kernel derives from one) is a non-negative 32-bit value and a lowering may compute it so.
pub const INDEX_LIMIT: i64 = (1 << 31) - 1;

/// Upper bounds for the dims a trace makes symbolic, chosen so that no argument exceeds
/// [`INDEX_LIMIT`] elements while the guards hold: an entry whose symbols are bounded proves its index
/// arithmetic fits 32 bits (`Kernel::index_ranges`), where an unbounded symbol forces 64-bit fallbacks.
///
/// `args[i]` is argument `i`'s dims with, for each, whether it is to be symbolic. Every argument's
/// symbolic dims may grow by one common factor, `(INDEX_LIMIT / elements)^(1/m)` for `m` symbolic dims,
/// so their product stays within the limit; dims of one size share a symbol (duck sizing) and take the
/// least bound any argument allows. A bound below the current size (an argument already past the
/// limit) is `None`: that entry indexes in 64 bits. Returned per argument and dim (`None` also for
/// static dims).
pub fn index_bounds(args: &[(&[usize], Vec<bool>)]) -> Vec<Vec<Option<i64>>> {
    let mut by_size: std::collections::BTreeMap<usize, i64> = std::collections::BTreeMap::new();
    for (dims, symbolic) in args {
        let m = symbolic.iter().filter(|&&s| s).count();
        let elements: f64 = dims.iter().map(|&d| d as f64).product();
        if m == 0 || elements == 0.0 {
            continue; // nothing grows, or an empty tensor stays empty whatever its symbols are
        }
        let factor = (INDEX_LIMIT as f64 / elements).powf(1.0 / m as f64);
        let mut bounds: Vec<i128> = dims
            .iter()
            .zip(symbolic)
            .map(|(&d, &s)| if s { (d as f64 * factor).floor().min(INDEX_LIMIT as f64) as i128 } else { d as i128 })
            .collect();
        // Exactly, in integers: floating rounding must not let the bounds' product pass the limit.
        while bounds.iter().product::<i128>() > INDEX_LIMIT as i128 {
            let Some(j) = (0..dims.len()).filter(|&j| symbolic[j]).max_by_key(|&j| bounds[j]) else { break };
            bounds[j] -= 1;
        }
        for ((&d, _), &bound) in dims.iter().zip(symbolic).zip(&bounds).filter(|((_, s), _)| **s) {
            let bound = bound as i64;
            by_size.entry(d).and_modify(|b| *b = (*b).min(bound)).or_insert(bound);
        }
    }
    args.iter()
        .map(|(dims, symbolic)| {
            dims.iter().zip(symbolic).map(|(&d, &s)| by_size.get(&d).copied().filter(|&b| s && b >= d as i64)).collect()
        })
        .collect()
}

/// Why a guard failed: the recompile reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardFailure {
    /// Which tensor argument, if one.
    pub arg: Option<usize>,
    /// Which of its dims, if one.
    pub dim: Option<usize>,
    /// In words.
    pub reason: String,
    /// The size exceeded a symbol's upper bound. Where the policy made the dim symbolic that bound is
    /// the 32-bit index bound [`index_bounds`] gave it, and the recompile makes the dim unbounded instead
    /// of bounding it again (a `mark_dynamic` range stays the user's).
    #[serde(default)]
    pub past_bound: bool,
}

impl fmt::Display for GuardFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

/// What a call presents to the guards: each tensor argument's dtype and dims, the statics, the backend.
pub struct CallSignature<'a> {
    /// `(dtype, dims)` per tensor argument.
    pub args: &'a [(DType, std::borrow::Cow<'a, [usize]>)],
    /// Static arguments, printed.
    pub statics: &'a [String],
    /// Backend name.
    pub backend: &'a str,
    /// Identity of each tensor argument ([`crate::Tensor::id`]).
    pub ids: &'a [u64],
}

impl Guards {
    /// Checks a call; on success returns the symbol values the call binds.
    pub fn check(&self, call: &CallSignature) -> Result<Bindings, GuardFailure> {
        let fail = |arg, dim, reason: String| Err(GuardFailure { arg, dim, reason, past_bound: false });
        if call.backend != self.backend {
            return fail(None, None, format!("backend changed from {} to {}", self.backend, call.backend));
        }
        if call.statics != self.statics.as_slice() {
            return fail(None, None, format!("static arguments changed from {:?} to {:?}", self.statics, call.statics));
        }
        if call.args.len() != self.args.len() {
            return fail(None, None, format!("expected {} tensor arguments, got {}", self.args.len(), call.args.len()));
        }
        let mut b = Bindings::new();
        for (i, (g, (dtype, dims))) in self.args.iter().zip(call.args).enumerate() {
            let dims: &[usize] = dims;
            if g.dtype != *dtype {
                return fail(Some(i), None, format!("input {i}: dtype changed from {} to {dtype}", g.dtype));
            }
            if g.dims.len() != dims.len() {
                return fail(Some(i), None, format!("input {i}: rank changed from {} to {}", g.dims.len(), dims.len()));
            }
            for (d, (dg, &v)) in g.dims.iter().zip(dims).enumerate() {
                match dg {
                    DimGuard::Static(s) if *s != v => {
                        return fail(Some(i), Some(d), format!("input {i} dim {d}: expected size {s}, got {v}"));
                    }
                    DimGuard::Static(_) => {}
                    DimGuard::Symbol { sym, lo, hi } => {
                        let v = v as i64;
                        if v < *lo || hi.is_some_and(|h| v > h) {
                            let range = format!("{lo}..={}", hi.map_or("inf".into(), |h| h.to_string()));
                            return Err(GuardFailure {
                                arg: Some(i),
                                dim: Some(d),
                                reason: format!("input {i} dim {d}: size {v} is outside {sym}'s range {range}"),
                                past_bound: v >= *lo,
                            });
                        }
                        match b.get(*sym) {
                            Some(prev) if prev != v => {
                                return fail(
                                    Some(i),
                                    Some(d),
                                    format!(
                                        "input {i} dim {d}: size {v} differs from {prev}, which shares symbol {sym}"
                                    ),
                                );
                            }
                            _ => {
                                b.bind(*sym, v);
                            }
                        }
                    }
                }
            }
        }
        if !aliases_match(call.ids, &self.aliases) {
            let aliases = alias_pattern(call.ids);
            return fail(
                None,
                None,
                format!("argument aliasing changed from {:?} to {aliases:?} (same tensor passed twice)", self.aliases),
            );
        }
        if let Some(i) = call.ids.iter().position(|id| self.captured.contains(id)) {
            return fail(Some(i), None, format!("input {i} is a tensor the function also captures (a weight)"));
        }
        for check in &self.shape_checks {
            match check.eval(&b) {
                Ok(0) => {}
                Ok(v) => return fail(None, None, format!("shape constraint `{check} == 0` does not hold ({v})")),
                Err(e) => return fail(None, None, format!("shape constraint `{check} == 0`: {e}")),
            }
        }
        Ok(b)
    }

    /// Checks argument shapes alone, as a call with this entry's dtypes, statics, backend and aliasing
    /// would present them (the explorer's "try these shapes"): the symbol values they bind, or the first
    /// guard that fails — the recompile reason such a call would log.
    pub fn check_dims(&self, dims: &[Vec<usize>]) -> Result<Bindings, GuardFailure> {
        let args: Vec<(DType, std::borrow::Cow<'_, [usize]>)> = dims
            .iter()
            .enumerate()
            .map(|(i, d)| (self.args.get(i).map_or(DType::F32, |a| a.dtype), std::borrow::Cow::Borrowed(&d[..])))
            .collect();
        // Identities with this entry's aliasing pattern, none of them a captured tensor's.
        let ids: Vec<u64> =
            (0..dims.len()).map(|i| (1u64 << 62) + self.aliases.get(i).copied().unwrap_or(i) as u64).collect();
        self.check(&CallSignature { args: &args, statics: &self.statics, backend: &self.backend, ids: &ids })
    }

    /// Number of symbolic dims.
    pub fn symbolic_dims(&self) -> usize {
        self.args.iter().flat_map(|a| &a.dims).filter(|d| matches!(d, DimGuard::Symbol { .. })).count()
    }
}

impl fmt::Display for Guards {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, a) in self.args.iter().enumerate() {
            let dims: Vec<String> = a
                .dims
                .iter()
                .map(|d| match d {
                    DimGuard::Static(s) => s.to_string(),
                    DimGuard::Symbol { sym, lo, hi } => {
                        format!("{sym}∈[{lo}, {}]", hi.map_or("∞".into(), |h| h.to_string()))
                    }
                })
                .collect();
            writeln!(f, "input {i}: {} [{}]", a.dtype, dims.join(", "))?;
        }
        if !self.statics.is_empty() {
            writeln!(f, "statics: {:?}", self.statics)?;
        }
        if self.aliases.iter().enumerate().any(|(i, &a)| a != i) {
            writeln!(f, "aliasing: {:?}", self.aliases)?;
        }
        if !self.captured.is_empty() {
            writeln!(f, "captured tensors: {}", self.captured.len())?;
        }
        for c in &self.shape_checks {
            writeln!(f, "shape: {c} == 0")?;
        }
        write!(f, "backend: {}", self.backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sym::Expr;

    fn guards() -> Guards {
        Guards {
            args: vec![
                ArgGuard {
                    dtype: DType::F32,
                    dims: vec![DimGuard::Static(8), DimGuard::Symbol { sym: SymId(0), lo: 2, hi: None }],
                },
                ArgGuard { dtype: DType::F32, dims: vec![DimGuard::Symbol { sym: SymId(0), lo: 2, hi: None }] },
            ],
            statics: vec!["true".into()],
            backend: "cpu".into(),
            aliases: vec![0, 1],
            captured: vec![99],
            shape_checks: vec![],
        }
    }

    /// Owned dims as a call presents them.
    fn sig<const N: usize>(args: [(DType, Vec<usize>); N]) -> Vec<(DType, std::borrow::Cow<'static, [usize]>)> {
        args.into_iter().map(|(d, v)| (d, std::borrow::Cow::Owned(v))).collect()
    }

    fn call<'a>(args: &'a [(DType, std::borrow::Cow<'a, [usize]>)], statics: &'a [String]) -> CallSignature<'a> {
        CallSignature { args, statics, backend: "cpu", ids: &[1, 2] }
    }

    #[test]
    fn guards_bind_symbols_and_name_the_failing_dim() {
        let g = guards();
        let statics = vec!["true".to_string()];
        let ok = sig([(DType::F32, vec![8, 40]), (DType::F32, vec![40])]);
        assert_eq!(g.check(&call(&ok, &statics)).unwrap().get(SymId(0)), Some(40));
        let bad = sig([(DType::F32, vec![9, 40]), (DType::F32, vec![40])]);
        let f = g.check(&call(&bad, &statics)).unwrap_err();
        assert_eq!((f.arg, f.dim), (Some(0), Some(0)));
        assert!(f.reason.contains("input 0 dim 0"), "{f}");
        let unequal = sig([(DType::F32, vec![8, 40]), (DType::F32, vec![41])]);
        assert!(g.check(&call(&unequal, &statics)).unwrap_err().reason.contains("shares symbol"));
        let small = sig([(DType::F32, vec![8, 1]), (DType::F32, vec![1])]);
        assert!(g.check(&call(&small, &statics)).unwrap_err().reason.contains("outside"));
        let dtype = sig([(DType::F16, vec![8, 40]), (DType::F32, vec![40])]);
        assert!(g.check(&call(&dtype, &statics)).unwrap_err().reason.contains("dtype changed"));
        let other = vec!["false".to_string()];
        assert!(g.check(&call(&ok, &other)).unwrap_err().reason.contains("static arguments"));
        let same = CallSignature { ids: &[1, 1], ..call(&ok, &statics) };
        assert!(g.check(&same).unwrap_err().reason.contains("aliasing changed"));
        let weight = CallSignature { ids: &[1, 99], ..call(&ok, &statics) };
        assert_eq!(g.check(&weight).unwrap_err().arg, Some(1));
    }

    #[test]
    fn index_bounds_keep_every_argument_under_the_limit() {
        // W3-dynamic's shape: the rows may grow until the tensor holds 2^31 - 1 elements.
        let b = index_bounds(&[(&[300, 4096], vec![true, false])]);
        assert_eq!(b, vec![vec![Some(INDEX_LIMIT / 4096), None]]);
        // Two symbols of one argument share the headroom; products of the bounds stay within the limit.
        let b = index_bounds(&[(&[100, 300], vec![true, true]), (&[300], vec![true])]);
        let (x, y) = (b[0][0].unwrap(), b[0][1].unwrap());
        assert!(x >= 100 && y >= 300 && x * y <= INDEX_LIMIT, "{x} {y}");
        assert!(x * y > INDEX_LIMIT / 2, "the headroom is used: {x} {y}");
        // Duck sizing: the size-300 symbol takes the least bound any argument gives it.
        assert_eq!(b[1][0], Some(y));
        // An argument already past the limit leaves its symbols unbounded (64-bit entry).
        let b = index_bounds(&[(&[1 << 20, 4096], vec![true, false])]);
        assert_eq!(b, vec![vec![None, None]]);
        // Empty tensors constrain nothing; static dims get no bound.
        let b = index_bounds(&[(&[0, 7], vec![false, true])]);
        assert_eq!(b, vec![vec![None, None]]);
    }

    #[test]
    fn a_size_past_the_bound_says_so() {
        let mut g = guards();
        g.args[1].dims[0] = DimGuard::Symbol { sym: SymId(0), lo: 2, hi: Some(50) };
        g.args[0].dims[1] = DimGuard::Symbol { sym: SymId(0), lo: 2, hi: Some(50) };
        let statics = vec!["true".to_string()];
        let big = sig([(DType::F32, vec![8, 60]), (DType::F32, vec![60])]);
        assert!(g.check(&call(&big, &statics)).unwrap_err().past_bound);
        let small = sig([(DType::F32, vec![8, 1]), (DType::F32, vec![1])]);
        assert!(!g.check(&call(&small, &statics)).unwrap_err().past_bound);
    }

    #[test]
    fn shape_checks_are_evaluated_with_the_call_sizes() {
        let s = Expr::sym(SymId(0));
        let g = Guards { shape_checks: vec![(s * Expr::from(2usize)).modulo(&Expr::from(4usize))], ..guards() };
        let statics = vec!["true".to_string()];
        let even = sig([(DType::F32, vec![8, 40]), (DType::F32, vec![40])]);
        assert!(g.check(&call(&even, &statics)).is_ok());
        let odd = sig([(DType::F32, vec![8, 41]), (DType::F32, vec![41])]);
        assert!(g.check(&call(&odd, &statics)).unwrap_err().reason.contains("shape constraint"));
    }
}
