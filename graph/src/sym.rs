//! Symbolic dimension algebra.
//!
//! A tensor dimension in kiln is either a constant or an integer expression
//! over named symbols (`batch`, `seq_len`, ...). Keeping dims symbolic lets one
//! compiled kernel serve every concrete size instead of recompiling per shape:
//! shapes, strides, buffer sizes, index expressions and launch grids are all
//! [`Expr`]s that get evaluated against [`Bindings`] only at launch time.
//!
//! Every [`Expr`] is kept in a canonical form (a polynomial over opaque atoms
//! such as symbols, floor divisions, modulos, min and max), so `==` and `Hash`
//! decide semantic equality for all the rewrites done here. That is what lets
//! the compiler dedupe kernels, check shape compatibility and cache plans
//! without evaluating anything.
//!
//! Division and modulo follow Python semantics (floor division; the remainder
//! takes the sign of the divisor) because that is what index arithmetic on
//! negative offsets needs and what users coming from PyTorch expect.
//!
//! Division by zero never panics: [`Expr::checked_floor_div`] and
//! [`Expr::checked_modulo`] reject a constant zero divisor up front, while the
//! infallible [`Expr::floor_div`] / [`Expr::modulo`] keep such a division as an
//! opaque term so that [`Expr::eval`] reports it when the kernel is launched.
//! Simplification may discharge a division whose divisor would have been zero
//! (e.g. `0 * (a // b)` is `0`), exactly as it would for any other term.
//!
//! Arithmetic on constants and coefficients is checked. The `checked_*`
//! methods report i64 overflow as [`SymError::Overflow`]; the operator impls and
//! the plain methods panic on overflow, mirroring integer arithmetic.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

/// Identifier of a symbolic dimension; its name and range live in a [`SymTable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SymId(pub u32);

impl fmt::Display for SymId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}", self.0)
    }
}

/// Errors from evaluating or building symbolic expressions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SymError {
    /// The expression mentions a symbol that the bindings do not give a value.
    #[error("symbol {0} has no binding")]
    UnboundSymbol(SymId),
    /// A divisor was zero (known at build time or evaluated at run time).
    #[error("division by zero in `{expr}`")]
    DivisionByZero {
        /// The offending (sub)expression, rendered.
        expr: String,
    },
    /// An intermediate value did not fit in an i64.
    #[error("i64 overflow in `{expr}`")]
    Overflow {
        /// The offending (sub)expression, rendered.
        expr: String,
    },
}

fn overflow_err(expr: impl fmt::Display) -> SymError {
    SymError::Overflow { expr: expr.to_string() }
}

#[track_caller]
fn overflow_panic(op: &str) -> ! {
    panic!("symbolic {op} overflowed i64; use the checked_ variant to handle this")
}

/// Python floor division; `None` on division by zero or overflow.
fn py_floor_div(a: i64, b: i64) -> Option<i64> {
    let q = a.checked_div(b)?;
    // Truncation rounded toward zero; floor differs only for inexact quotients
    // of opposite sign.
    if a % b != 0 && ((a < 0) != (b < 0)) {
        Some(q - 1)
    } else {
        Some(q)
    }
}

/// Python modulo (sign of the divisor); `None` on division by zero.
fn py_mod(a: i64, b: i64) -> Option<i64> {
    if b == 0 {
        return None;
    }
    if b == -1 {
        // `i64::MIN % -1` traps in Rust although the answer is simply 0.
        return Some(0);
    }
    let r = a % b;
    Some(if r != 0 && ((r < 0) != (b < 0)) { r + b } else { r })
}

/// An opaque factor of a monomial. Operands are canonical; Min/Max operands
/// are stored in canonical order because the operations commute.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
enum Atom {
    Sym(SymId),
    FloorDiv(Box<Expr>, Box<Expr>),
    Mod(Box<Expr>, Box<Expr>),
    Min(Box<Expr>, Box<Expr>),
    Max(Box<Expr>, Box<Expr>),
}

impl Atom {
    fn rank(&self) -> u8 {
        match self {
            Atom::Sym(_) => 0,
            Atom::FloorDiv(..) => 1,
            Atom::Mod(..) => 2,
            Atom::Min(..) => 3,
            Atom::Max(..) => 4,
        }
    }

    fn operands(&self) -> Option<(&Expr, &Expr)> {
        match self {
            Atom::Sym(_) => None,
            Atom::FloorDiv(a, b) | Atom::Mod(a, b) | Atom::Min(a, b) | Atom::Max(a, b) => Some((a, b)),
        }
    }

    fn eval(&self, b: &Bindings) -> Result<i64, SymError> {
        let (x, y) = match self {
            Atom::Sym(s) => return b.get(*s).ok_or(SymError::UnboundSymbol(*s)),
            Atom::FloorDiv(x, y) | Atom::Mod(x, y) | Atom::Min(x, y) | Atom::Max(x, y) => (x.eval(b)?, y.eval(b)?),
        };
        let div_zero = || SymError::DivisionByZero { expr: self.to_string() };
        match self {
            Atom::FloorDiv(..) if y == 0 => Err(div_zero()),
            Atom::Mod(..) if y == 0 => Err(div_zero()),
            Atom::FloorDiv(..) => py_floor_div(x, y).ok_or_else(|| overflow_err(self)),
            Atom::Mod(..) => py_mod(x, y).ok_or_else(|| overflow_err(self)),
            Atom::Min(..) => Ok(x.min(y)),
            _ => Ok(x.max(y)),
        }
    }
}

// Manual ordering because `Expr` deliberately does not implement `Ord` (see
// `cmp_expr`).
impl Ord for Atom {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Atom::Sym(a), Atom::Sym(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()).then_with(|| {
                match (self.operands(), other.operands()) {
                    (Some((a1, b1)), Some((a2, b2))) => cmp_expr(a1, a2).then_with(|| cmp_expr(b1, b2)),
                    _ => Ordering::Equal, // same rank, so both are symbols
                }
            }),
        }
    }
}

impl PartialOrd for Atom {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// `coeff * product(atoms)`; atoms sorted, coefficient never zero.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
struct Term {
    atoms: Vec<Atom>,
    coeff: i64,
}

/// The greatest common divisor of `|a|` and `|b|` (a positive `a` and any `b`: positive).
fn gcd(a: i64, b: i64) -> i64 {
    let (mut a, mut b) = (a.unsigned_abs(), b.unsigned_abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    i64::try_from(a).unwrap_or(1)
}

/// Total order on canonical expressions, constants last so that
/// `min(s0, 8)` reads naturally. `Expr` itself does not implement `Ord`:
/// `Ord::min`/`Ord::max` would shadow the symbolic `min`/`max` on owned values
/// and silently pick the structurally smaller expression.
fn cmp_expr(a: &Expr, b: &Expr) -> Ordering {
    (a.terms.is_empty(), &a.terms, a.constant).cmp(&(b.terms.is_empty(), &b.terms, b.constant))
}

fn merge_atoms(a: &[Atom], b: &[Atom]) -> Vec<Atom> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i] <= b[j] {
            out.push(a[i].clone());
            i += 1;
        } else {
            out.push(b[j].clone());
            j += 1;
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}

/// An expression as a plain tree, for renderers that print or emit code for it (WGSL infix text, PTX
/// instruction sequences). Division and modulo have Python floor semantics, as everywhere in `sym`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExprTree {
    /// An integer.
    Const(i64),
    /// A symbol.
    Sym(SymId),
    /// Sum of two or more parts.
    Add(Vec<ExprTree>),
    /// Product of two or more factors.
    Mul(Vec<ExprTree>),
    /// Floor division.
    FloorDiv(Box<ExprTree>, Box<ExprTree>),
    /// Modulo with the divisor's sign.
    Mod(Box<ExprTree>, Box<ExprTree>),
    /// Minimum.
    Min(Box<ExprTree>, Box<ExprTree>),
    /// Maximum.
    Max(Box<ExprTree>, Box<ExprTree>),
}

/// An immutable integer expression over symbols, always in canonical form.
///
/// The form is a polynomial: a sorted list of monomials (products of atoms)
/// with non-zero i64 coefficients, plus a constant. Structural equality is
/// therefore semantic equality for every simplification this module performs.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawExpr")]
pub struct Expr {
    terms: Vec<Term>,
    constant: i64,
}

/// Untrusted wire form; re-canonicalized on deserialization so a hand-edited
/// or stale file cannot break the `==`-is-semantic invariant.
#[derive(Deserialize)]
struct RawExpr {
    terms: Vec<Term>,
    constant: i64,
}

impl TryFrom<RawExpr> for Expr {
    type Error = SymError;
    fn try_from(raw: RawExpr) -> Result<Self, SymError> {
        let raw = Expr { terms: raw.terms, constant: raw.constant };
        raw.try_subst(&BTreeMap::new()).ok_or_else(|| overflow_err("deserialized expression"))
    }
}

impl Expr {
    /// The constant zero.
    pub const ZERO: Expr = Expr { terms: Vec::new(), constant: 0 };

    /// A constant expression.
    pub fn constant(c: i64) -> Self {
        Expr { terms: Vec::new(), constant: c }
    }

    /// The expression consisting of a single symbol.
    pub fn sym(s: SymId) -> Self {
        Self::atom(Atom::Sym(s))
    }

    fn atom(a: Atom) -> Self {
        Expr { terms: vec![Term { atoms: vec![a], coeff: 1 }], constant: 0 }
    }

    fn binary_atom(make: fn(Box<Expr>, Box<Expr>) -> Atom, a: &Expr, b: &Expr) -> Self {
        Self::atom(make(Box::new(a.clone()), Box::new(b.clone())))
    }

    /// The value if the expression is a constant.
    pub fn as_const(&self) -> Option<i64> {
        self.terms.is_empty().then_some(self.constant)
    }

    /// Whether the expression has no symbols at all.
    pub fn is_const(&self) -> bool {
        self.terms.is_empty()
    }

    /// If `self` is exactly one atom with coefficient 1 and no constant.
    fn as_single_atom(&self) -> Option<&Atom> {
        match self.terms.as_slice() {
            [t] if t.coeff == 1 && t.atoms.len() == 1 && self.constant == 0 => Some(&t.atoms[0]),
            _ => None,
        }
    }

    /// Every symbol mentioned anywhere, including inside divisions and min/max.
    pub fn symbols(&self) -> BTreeSet<SymId> {
        let mut out = BTreeSet::new();
        self.collect_symbols(&mut out);
        out
    }

    /// How many divisions and remainders the expression computes, nested ones included.
    pub fn divisions(&self) -> usize {
        let atoms = self.terms.iter().flat_map(|t| &t.atoms);
        atoms
            .map(|atom| {
                let own = usize::from(matches!(atom, Atom::FloorDiv(..) | Atom::Mod(..)));
                own + atom.operands().map_or(0, |(a, b)| a.divisions() + b.divisions())
            })
            .sum()
    }

    fn collect_symbols(&self, out: &mut BTreeSet<SymId>) {
        for atom in self.terms.iter().flat_map(|t| &t.atoms) {
            if let Atom::Sym(s) = atom {
                out.insert(*s);
            } else if let Some((a, b)) = atom.operands() {
                a.collect_symbols(out);
                b.collect_symbols(out);
            }
        }
    }

    /// Whether `k` provably divides the expression for every binding: every
    /// coefficient and the constant are multiples of `k`. `0` divides only `0`.
    pub fn is_divisible_by(&self, k: i64) -> bool {
        if k == 0 {
            return self.as_const() == Some(0);
        }
        let k = k.unsigned_abs();
        self.terms.iter().map(|t| t.coeff).chain(std::iter::once(self.constant)).all(|c| c.unsigned_abs() % k == 0)
    }

    // ---- overflow-aware core; `None` means an i64 overflow ----

    fn try_combine(&self, rhs: &Expr, negate_rhs: bool) -> Option<Expr> {
        let op = |a: i64, b: i64| {
            if negate_rhs {
                a.checked_sub(b)
            } else {
                a.checked_add(b)
            }
        };
        let rhs_coeff = |c: i64| if negate_rhs { c.checked_neg() } else { Some(c) };
        let (a, b) = (&self.terms, &rhs.terms);
        let mut terms = Vec::with_capacity(a.len() + b.len());
        let (mut i, mut j) = (0, 0);
        while i < a.len() || j < b.len() {
            let ord = match (a.get(i), b.get(j)) {
                (Some(x), Some(y)) => x.atoms.cmp(&y.atoms),
                (Some(_), None) => Ordering::Less,
                _ => Ordering::Greater,
            };
            match ord {
                Ordering::Less => {
                    terms.push(a[i].clone());
                    i += 1;
                }
                Ordering::Greater => {
                    terms.push(Term { atoms: b[j].atoms.clone(), coeff: rhs_coeff(b[j].coeff)? });
                    j += 1;
                }
                Ordering::Equal => {
                    let c = op(a[i].coeff, b[j].coeff)?;
                    if c != 0 {
                        terms.push(Term { atoms: a[i].atoms.clone(), coeff: c });
                    }
                    i += 1;
                    j += 1;
                }
            }
        }
        Some(Expr { terms, constant: op(self.constant, rhs.constant)? })
    }

    fn try_scale(&self, c: i64) -> Option<Expr> {
        match c {
            0 => Some(Expr::ZERO),
            1 => Some(self.clone()),
            _ => Some(Expr {
                terms: self
                    .terms
                    .iter()
                    .map(|t| Some(Term { atoms: t.atoms.clone(), coeff: t.coeff.checked_mul(c)? }))
                    .collect::<Option<_>>()?,
                constant: self.constant.checked_mul(c)?,
            }),
        }
    }

    fn try_mul(&self, rhs: &Expr) -> Option<Expr> {
        if let Some(c) = rhs.as_const() {
            return self.try_scale(c);
        }
        if let Some(c) = self.as_const() {
            return rhs.try_scale(c);
        }
        let mut acc: BTreeMap<Vec<Atom>, i64> = BTreeMap::new();
        let mut add = |atoms: Vec<Atom>, c: i64| -> Option<()> {
            let slot = acc.entry(atoms).or_insert(0);
            *slot = slot.checked_add(c)?;
            Some(())
        };
        for x in &self.terms {
            for y in &rhs.terms {
                add(merge_atoms(&x.atoms, &y.atoms), x.coeff.checked_mul(y.coeff)?)?;
            }
            if rhs.constant != 0 {
                add(x.atoms.clone(), x.coeff.checked_mul(rhs.constant)?)?;
            }
        }
        if self.constant != 0 {
            for y in &rhs.terms {
                add(y.atoms.clone(), y.coeff.checked_mul(self.constant)?)?;
            }
        }
        Some(Expr {
            terms: acc.into_iter().filter(|&(_, c)| c != 0).map(|(atoms, coeff)| Term { atoms, coeff }).collect(),
            constant: self.constant.checked_mul(rhs.constant)?,
        })
    }

    /// Splits `self = k * quot + rem` with every coefficient of `rem` (and its
    /// constant) in `[0, k)`. Needs `k > 0`.
    fn split_by(&self, k: i64) -> (Expr, Expr) {
        let mut quot = Expr::constant(self.constant.div_euclid(k));
        let mut rem = Expr::constant(self.constant.rem_euclid(k));
        for t in &self.terms {
            let (q, r) = (t.coeff.div_euclid(k), t.coeff.rem_euclid(k));
            if q != 0 {
                quot.terms.push(Term { atoms: t.atoms.clone(), coeff: q });
            }
            if r != 0 {
                rem.terms.push(Term { atoms: t.atoms.clone(), coeff: r });
            }
        }
        (quot, rem)
    }

    /// The divisor of a single `x // m` or `x % m` atom with constant `m > 0`.
    fn const_divisor_atom(&self) -> Option<(&Atom, &Expr, i64)> {
        let atom = self.as_single_atom()?;
        let (inner, d) = atom.operands()?;
        let m = d.as_const().filter(|&m| m > 0)?;
        Some((atom, inner, m))
    }

    fn try_floor_div(&self, d: &Expr) -> Option<Expr> {
        let keep = || Some(Self::binary_atom(Atom::FloorDiv, self, d));
        let Some(k) = d.as_const() else {
            return keep();
        };
        match k {
            // Left opaque so `eval` reports it; see the module docs.
            0 => keep(),
            1 => Some(self.clone()),
            // floor(a / -k) == floor(-a / k): keep divisors positive so there is
            // one canonical spelling.
            _ if k < 0 => match (self.try_scale(-1), k.checked_neg()) {
                (Some(na), Some(nk)) => na.try_floor_div(&Expr::constant(nk)),
                _ => keep(),
            },
            _ => {
                // floor((k*q + r) / k) == q + floor(r / k) for integer q.
                let (quot, rem) = self.split_by(k);
                let rest = if rem.is_const() {
                    Expr::ZERO // 0 <= rem < k
                } else if let Some((Atom::FloorDiv(..), inner, m)) = rem.const_divisor_atom() {
                    // floor(floor(x / m) / k) == floor(x / (m*k)) for m, k > 0.
                    match m.checked_mul(k) {
                        Some(mk) => inner.try_floor_div(&Expr::constant(mk))?,
                        None => Self::binary_atom(Atom::FloorDiv, &rem, d),
                    }
                } else {
                    Self::binary_atom(Atom::FloorDiv, &rem, d)
                };
                quot.try_combine(&rest, false)
            }
        }
    }

    fn try_modulo(&self, d: &Expr) -> Option<Expr> {
        let keep = || Some(Self::binary_atom(Atom::Mod, self, d));
        let Some(k) = d.as_const() else {
            return keep();
        };
        match k {
            0 => keep(),
            1 | -1 => Some(Expr::ZERO),
            // a mod -k == -((-a) mod k): keep divisors positive.
            _ if k < 0 => match (self.try_scale(-1), k.checked_neg()) {
                (Some(na), Some(nk)) => na.try_modulo(&Expr::constant(nk))?.try_scale(-1),
                _ => keep(),
            },
            _ => {
                // Multiples of k never change the remainder.
                let (_, rem) = self.split_by(k);
                if rem.is_const() {
                    return Some(rem);
                }
                if let Some((Atom::Mod(..), inner, m)) = rem.const_divisor_atom() {
                    if m <= k {
                        return Some(rem); // x mod m already lies in [0, k)
                    }
                    if m % k == 0 {
                        return inner.try_modulo(d);
                    }
                }
                Some(Self::binary_atom(Atom::Mod, &rem, d))
            }
        }
    }

    fn min_max(&self, other: &Expr, want_min: bool) -> Expr {
        // A constant difference decides the comparison outright (covers
        // constants and `min(x, x)`).
        if let Some(diff) = other.try_combine(self, true).and_then(|d| d.as_const()) {
            let self_smaller = diff >= 0;
            return if self_smaller == want_min { self.clone() } else { other.clone() };
        }
        let (a, b) = if cmp_expr(self, other) == Ordering::Greater { (other, self) } else { (self, other) };
        Self::binary_atom(if want_min { Atom::Min } else { Atom::Max }, a, b)
    }

    fn try_subst(&self, map: &BTreeMap<SymId, Expr>) -> Option<Expr> {
        let mut acc = Expr::constant(self.constant);
        for t in &self.terms {
            let mut prod = Expr::constant(t.coeff);
            for atom in &t.atoms {
                let v = match atom {
                    Atom::Sym(s) => map.get(s).cloned().unwrap_or_else(|| Expr::sym(*s)),
                    Atom::FloorDiv(a, b) => a.try_subst(map)?.try_floor_div(&b.try_subst(map)?)?,
                    Atom::Mod(a, b) => a.try_subst(map)?.try_modulo(&b.try_subst(map)?)?,
                    Atom::Min(a, b) => a.try_subst(map)?.min_max(&b.try_subst(map)?, true),
                    Atom::Max(a, b) => a.try_subst(map)?.min_max(&b.try_subst(map)?, false),
                };
                prod = prod.try_mul(&v)?;
            }
            acc = acc.try_combine(&prod, false)?;
        }
        Some(acc)
    }

    // ---- public arithmetic ----

    /// `self + rhs`, or an error if a coefficient overflows.
    pub fn checked_add(&self, rhs: &Expr) -> Result<Expr, SymError> {
        self.try_combine(rhs, false).ok_or_else(|| overflow_err(format_args!("({self}) + ({rhs})")))
    }

    /// `self - rhs`, or an error if a coefficient overflows.
    pub fn checked_sub(&self, rhs: &Expr) -> Result<Expr, SymError> {
        self.try_combine(rhs, true).ok_or_else(|| overflow_err(format_args!("({self}) - ({rhs})")))
    }

    /// `self * rhs` (fully expanded), or an error if a coefficient overflows.
    pub fn checked_mul(&self, rhs: &Expr) -> Result<Expr, SymError> {
        self.try_mul(rhs).ok_or_else(|| overflow_err(format_args!("({self}) * ({rhs})")))
    }

    /// `-self`, or an error if a coefficient is `i64::MIN`.
    pub fn checked_neg(&self) -> Result<Expr, SymError> {
        self.try_scale(-1).ok_or_else(|| overflow_err(format_args!("-({self})")))
    }

    /// Floor division; rejects a constant zero divisor and overflow.
    pub fn checked_floor_div(&self, d: &Expr) -> Result<Expr, SymError> {
        if d.as_const() == Some(0) {
            return Err(SymError::DivisionByZero { expr: format!("({self}) // 0") });
        }
        self.try_floor_div(d).ok_or_else(|| overflow_err(format_args!("({self}) // ({d})")))
    }

    /// Python modulo; rejects a constant zero divisor and overflow.
    pub fn checked_modulo(&self, d: &Expr) -> Result<Expr, SymError> {
        if d.as_const() == Some(0) {
            return Err(SymError::DivisionByZero { expr: format!("({self}) % 0") });
        }
        self.try_modulo(d).ok_or_else(|| overflow_err(format_args!("({self}) % ({d})")))
    }

    /// `self + rhs`. Panics on i64 overflow of a coefficient.
    pub fn add(&self, rhs: &Expr) -> Expr {
        self.try_combine(rhs, false).unwrap_or_else(|| overflow_panic("add"))
    }

    /// `self - rhs`. Panics on i64 overflow of a coefficient.
    pub fn sub(&self, rhs: &Expr) -> Expr {
        self.try_combine(rhs, true).unwrap_or_else(|| overflow_panic("sub"))
    }

    /// `self * rhs`. Panics on i64 overflow of a coefficient.
    pub fn mul(&self, rhs: &Expr) -> Expr {
        self.try_mul(rhs).unwrap_or_else(|| overflow_panic("mul"))
    }

    /// `-self`. Panics if a coefficient is `i64::MIN`.
    pub fn neg(&self) -> Expr {
        self.try_scale(-1).unwrap_or_else(|| overflow_panic("neg"))
    }

    /// Floor division. A constant zero divisor is kept as an opaque term that
    /// fails in [`Expr::eval`]. Panics on i64 overflow of a coefficient.
    pub fn floor_div(&self, d: &Expr) -> Expr {
        self.try_floor_div(d).unwrap_or_else(|| overflow_panic("floor_div"))
    }

    /// Python modulo (sign of the divisor). A constant zero divisor is kept as
    /// an opaque term that fails in [`Expr::eval`]. Panics on i64 overflow.
    pub fn modulo(&self, d: &Expr) -> Expr {
        self.try_modulo(d).unwrap_or_else(|| overflow_panic("modulo"))
    }

    /// Symbolic minimum (never overflows).
    pub fn min(&self, other: &Expr) -> Expr {
        self.min_max(other, true)
    }

    /// Symbolic maximum (never overflows).
    pub fn max(&self, other: &Expr) -> Expr {
        self.min_max(other, false)
    }

    /// Replaces symbols by expressions and re-simplifies. Panics on overflow.
    pub fn substitute(&self, map: &BTreeMap<SymId, Expr>) -> Expr {
        self.try_subst(map).unwrap_or_else(|| overflow_panic("substitute"))
    }

    /// Replaces symbols by expressions and re-simplifies, reporting overflow.
    pub fn checked_substitute(&self, map: &BTreeMap<SymId, Expr>) -> Result<Expr, SymError> {
        self.try_subst(map).ok_or_else(|| overflow_err(format_args!("substitution into {self}")))
    }

    /// How much the expression grows when `sym` grows by `delta`, when that is one constant wherever
    /// `sym` stands (an affine use, or a period the simplifier proves): an unrolled copy of a loop body
    /// then addresses memory at a fixed offset from the first copy's address.
    pub fn shift_by(&self, sym: SymId, delta: i64) -> Option<i64> {
        let moved =
            self.try_subst(&BTreeMap::from([(sym, Expr::sym(sym).checked_add(&Expr::constant(delta)).ok()?)]))?;
        moved.checked_sub(self).ok()?.as_const()
    }

    /// The expression as a tree: a sum of products of atoms, then the constant.
    pub fn tree(&self) -> ExprTree {
        let pair = |x: &Expr, y: &Expr| (Box::new(x.tree()), Box::new(y.tree()));
        let mut parts: Vec<ExprTree> = Vec::with_capacity(self.terms.len() + 1);
        for t in &self.terms {
            let mut factors = Vec::with_capacity(t.atoms.len() + 1);
            if t.coeff != 1 {
                factors.push(ExprTree::Const(t.coeff));
            }
            for atom in &t.atoms {
                factors.push(match atom {
                    Atom::Sym(s) => ExprTree::Sym(*s),
                    Atom::FloorDiv(x, y) => {
                        let (x, y) = pair(x, y);
                        ExprTree::FloorDiv(x, y)
                    }
                    Atom::Mod(x, y) => {
                        let (x, y) = pair(x, y);
                        ExprTree::Mod(x, y)
                    }
                    Atom::Min(x, y) => {
                        let (x, y) = pair(x, y);
                        ExprTree::Min(x, y)
                    }
                    Atom::Max(x, y) => {
                        let (x, y) = pair(x, y);
                        ExprTree::Max(x, y)
                    }
                });
            }
            parts.push(if factors.len() == 1 {
                factors.pop().unwrap_or(ExprTree::Const(1))
            } else {
                ExprTree::Mul(factors)
            });
        }
        if self.constant != 0 || parts.is_empty() {
            parts.push(ExprTree::Const(self.constant));
        }
        if parts.len() == 1 {
            parts.pop().unwrap_or(ExprTree::Const(0))
        } else {
            ExprTree::Add(parts)
        }
    }

    fn is_zero(&self) -> bool {
        self.terms.is_empty() && self.constant == 0
    }

    /// `self` as exactly `p // a`, if it is that.
    fn single_floor_div(&self) -> Option<(&Expr, &Expr)> {
        match (self.constant, self.terms.as_slice()) {
            (0, [Term { atoms, coeff: 1 }]) => match atoms.as_slice() {
                [Atom::FloorDiv(p, a)] => Some((p, a)),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether `0 <= self < y` for a symbolic `y`, from loop extents: a loop variable over `0..y`, or
    /// `p // a` with `a` positive and `p` below `a*y` (unflattening an index over symbolic dims: the row
    /// `r` of a `[s0, s0]` loop over `0..s0*s0` gives `r // s0`, which is below `s0`).
    fn below_symbolic(&self, y: &Expr, table: &SymTable) -> bool {
        if self.is_zero() || self.single_sym().is_some_and(|s| table.extent(s) == Some(y)) {
            return true;
        }
        match self.single_floor_div() {
            Some((p, a)) if table.bounds(a).lo.is_some_and(|lo| lo >= 1) => {
                a.checked_mul(y).is_ok_and(|ay| p.below_symbolic(&ay, table))
            }
            _ => false,
        }
    }

    /// The symbol when `self` is exactly one symbol.
    fn single_sym(&self) -> Option<SymId> {
        match (self.constant, self.terms.as_slice()) {
            (0, [Term { atoms, coeff: 1 }]) => match atoms.as_slice() {
                [Atom::Sym(s)] => Some(*s),
                _ => None,
            },
            _ => None,
        }
    }

    /// `self` as `q * m + r` for a symbolic monomial `m` (coefficient 1, no constant): `q` gathers the
    /// terms whose atoms include all of `m`'s, `r` the rest. `None` when `m` is not such a monomial or no
    /// term is a multiple of it.
    fn split_multiple_of(&self, m: &Expr) -> Option<(Expr, Expr)> {
        let [Term { atoms: unit, coeff: 1 }] = m.terms.as_slice() else { return None };
        if m.constant != 0 {
            return None;
        }
        let (mut q, mut r) = (Expr::ZERO, Expr::constant(self.constant));
        for t in &self.terms {
            let mut rest = t.atoms.clone();
            let divides = unit.iter().all(|a| match rest.iter().position(|b| b == a) {
                Some(i) => {
                    rest.remove(i);
                    true
                }
                None => false,
            });
            let term = |atoms: Vec<Atom>| Expr { terms: vec![Term { atoms, coeff: t.coeff }], constant: 0 };
            if divides {
                q = q.checked_add(&term(rest)).ok()?;
            } else {
                r = r.checked_add(&term(t.atoms.clone())).ok()?;
            }
        }
        (!q.is_zero()).then_some((q, r))
    }

    /// `self / g` where `g` divides every coefficient and the constant.
    fn exact_div(&self, g: i64) -> Option<Expr> {
        if g == 0 || self.constant % g != 0 || self.terms.iter().any(|t| t.coeff % g != 0) {
            return None;
        }
        let terms = self.terms.iter().map(|t| Term { atoms: t.atoms.clone(), coeff: t.coeff / g }).collect();
        Some(Expr { terms, constant: self.constant / g })
    }

    /// `self` as `k*q + r` with `0 <= r < k` proved by `table`'s ranges, for a constant `k > 0`: the
    /// multiples of `k` go to `q`, and a constant part of `r` whose range lies within one multiple of `k`
    /// moves over too. A term `c*(a // d)` where `c` divides `k` is first split at `k` as
    /// `k*(a // (d*k/c)) + c*((a // d) % (k/c))`: an index whose coordinates were merged into one
    /// quotient (`4096*(i // 1024)` from `262144*(i // 65536) + 4096*((i // 1024) % 64)`) and offset
    /// (a padded window's `-65`) is divided at the coordinate boundary again, so the division and the
    /// remainder both go.
    fn split_by_range(&self, k: &Expr, table: &SymTable) -> Option<(Expr, Expr)> {
        let k = k.as_const().filter(|&k| k > 1)?;
        let within = |x: &Expr| -> Option<(Expr, Expr)> {
            let (q, r) = x.split_by(k);
            let b = table.bounds(&r);
            let z = b.lo?.div_euclid(k);
            if b.hi?.div_euclid(k) != z {
                return None;
            }
            Some((q.checked_add(&Expr::constant(z)).ok()?, r.checked_sub(&Expr::constant(z.checked_mul(k)?)).ok()?))
        };
        if let Some(found) = within(self) {
            return Some(found);
        }
        // `g*y + r` with `g` dividing `k` and `0 <= r < g` (a vector lane's offset): `(y // (k/g), ...)`.
        let g = self.terms.iter().fold(k, |g, t| gcd(g, t.coeff));
        if g > 1 && !self.terms.is_empty() {
            let r = self.constant.rem_euclid(g);
            let y = self.checked_sub(&Expr::constant(r)).ok()?.exact_div(g)?;
            let m = Expr::constant(k / g);
            let q = y.checked_floor_div(&m).ok()?;
            let rem = y
                .checked_modulo(&m)
                .ok()?
                .checked_mul(&Expr::constant(g))
                .ok()?
                .checked_add(&Expr::constant(r))
                .ok()?;
            return Some((q, rem));
        }
        let mut unfolded = Expr::constant(self.constant);
        let mut changed = false;
        for t in &self.terms {
            let term = Expr { terms: vec![t.clone()], constant: 0 };
            let parts = match t.atoms.as_slice() {
                [Atom::FloorDiv(a, d)] if t.coeff % k != 0 && k % t.coeff == 0 => {
                    let f = Expr::constant(k / t.coeff.abs());
                    let quotient = Expr::binary_atom(Atom::FloorDiv, a, d);
                    let high = quotient.checked_floor_div(&f).ok()?.checked_mul(&f).ok()?;
                    let low = quotient.checked_modulo(&f).ok()?;
                    changed = true;
                    high.checked_add(&low).ok()?.checked_mul(&Expr::constant(t.coeff)).ok()?
                }
                _ => term,
            };
            unfolded = unfolded.checked_add(&parts).ok()?;
        }
        if changed {
            within(&unfolded)
        } else {
            None
        }
    }

    /// Rewrites `self` using the ranges in `table`: `a // k` becomes 0 and `a % k` becomes `a` when
    /// `0 <= a < k`, and `min`/`max` whose order the ranges decide collapse to one side. Index
    /// expressions built from loop variables lose their redundant divisions this way.
    ///
    /// Symbolic divisors use the extents recorded with [`SymTable::set_extent`]: `(q*y + i) // y` is `q` and
    /// `(q*y + i) % y` is `i` when `0 <= i < y` is known (a loop variable over `0..y`), which is what
    /// flattening and unflattening an index over symbolic dims produces.
    ///
    /// Never panics: where rewriting would overflow a coefficient (a symbol fixed to a large value, say),
    /// the expression is returned as it is.
    pub fn simplify_in(&self, table: &SymTable) -> Expr {
        self.try_simplify_in(table).unwrap_or_else(|| self.clone())
    }

    fn try_simplify_in(&self, table: &SymTable) -> Option<Expr> {
        let below = |x: &Expr, y: &Expr| match y.as_const() {
            Some(k) if k > 0 => {
                let b = table.bounds(x);
                b.lo.is_some_and(|lo| lo >= 0) && b.hi.is_some_and(|hi| hi < k)
            }
            _ => x.below_symbolic(y, table),
        };
        // `x` as `q*y + r` with `r` below `y`: `(q, r)`.
        let split = |x: &Expr, y: &Expr| -> Option<(Expr, Expr)> {
            let (q, r) = x.split_multiple_of(y)?;
            below(&r, y).then_some((q, r))
        };
        let mut acc = Expr::constant(self.constant);
        for t in &self.terms {
            let mut prod = Expr::constant(t.coeff);
            for atom in &t.atoms {
                let a = match atom {
                    Atom::Sym(s) => match table.range(*s) {
                        Some((lo, Some(hi))) if lo == hi => Expr::constant(lo),
                        _ => Expr::sym(*s),
                    },
                    Atom::FloorDiv(x, y) => {
                        let (x, y) = (x.simplify_in(table), y.simplify_in(table));
                        if below(&x, &y) {
                            Expr::ZERO
                        } else if let Some((q, _)) = split(&x, &y) {
                            q
                        } else if let Some((q, _)) = x.split_by_range(&y, table) {
                            q
                        } else {
                            x.try_floor_div(&y)?
                        }
                    }
                    Atom::Mod(x, y) => {
                        let (x, y) = (x.simplify_in(table), y.simplify_in(table));
                        if below(&x, &y) {
                            x
                        } else if let Some((_, r)) = split(&x, &y) {
                            r
                        } else if let Some((_, r)) = x.split_by_range(&y, table) {
                            r
                        } else {
                            x.try_modulo(&y)?
                        }
                    }
                    Atom::Min(x, y) => {
                        let (x, y) = (x.simplify_in(table), y.simplify_in(table));
                        match table.known_ge(&x, &y) {
                            Some(true) => y,
                            Some(false) => x,
                            None => x.min(&y),
                        }
                    }
                    Atom::Max(x, y) => {
                        let (x, y) = (x.simplify_in(table), y.simplify_in(table));
                        match table.known_ge(&x, &y) {
                            Some(true) => x,
                            Some(false) => y,
                            None => x.max(&y),
                        }
                    }
                };
                prod = prod.try_mul(&a)?;
            }
            acc = acc.try_combine(&prod, false)?;
        }
        Some(acc.fold_div_mod())
    }

    /// Folds `c*k*(d // k) + c*(y % k)` into `c*d`, repeatedly, where `d` is `y` (true for every integer
    /// `y` and non-zero `k` under floor semantics) or `y % m` with `k` dividing `m` (then `(y % m) % k` is
    /// `y % k`): a flat index split into coordinates and recombined with the same strides
    /// (`393216*(i // 512) + 768*(i % 512)` is `768*i`, `32*((i % 1024) // 32) + i % 32` is `i % 1024`)
    /// collapses back, so kernels do not divide at all.
    fn fold_div_mod(self) -> Expr {
        let mut e = self;
        'again: loop {
            for t in &e.terms {
                let [Atom::Mod(y, k)] = t.atoms.as_slice() else { continue };
                // `y` itself, and each `y % m` (`k | m`) that some term divides by `k`.
                let mut dividends = vec![(**y).clone()];
                if let Some(kc) = k.as_const().filter(|&k| k > 0) {
                    for p in &e.terms {
                        let [Atom::FloorDiv(inner, d)] = p.atoms.as_slice() else { continue };
                        let Some(Atom::Mod(y2, m)) = inner.as_single_atom() else { continue };
                        if **d == **k && y2 == y && m.as_const().is_some_and(|m| m > 0 && m % kc == 0) {
                            dividends.push((**inner).clone());
                        }
                    }
                }
                let c = Expr::constant(t.coeff);
                let remainder = Expr { terms: vec![t.clone()], constant: 0 };
                for d in dividends {
                    let whole = d.checked_floor_div(k).and_then(|q| q.checked_mul(k)).and_then(|q| q.checked_mul(&c));
                    let Ok(whole) = whole else { continue };
                    let [partner] = whole.terms.as_slice() else { continue };
                    if whole.constant != 0 || !e.terms.contains(partner) {
                        continue;
                    }
                    let folded = e
                        .checked_sub(&whole)
                        .and_then(|x| x.checked_sub(&remainder))
                        .and_then(|x| x.checked_add(&d.checked_mul(&c)?));
                    if let Ok(f) = folded {
                        e = f;
                        continue 'again;
                    }
                }
            }
            return e;
        }
    }

    /// Evaluates with checked arithmetic; never panics.
    pub fn eval(&self, bindings: &Bindings) -> Result<i64, SymError> {
        let mut acc = self.constant;
        for t in &self.terms {
            let mut prod = t.coeff;
            for atom in &t.atoms {
                prod = prod.checked_mul(atom.eval(bindings)?).ok_or_else(|| overflow_err(self))?;
            }
            acc = acc.checked_add(prod).ok_or_else(|| overflow_err(self))?;
        }
        Ok(acc)
    }
}

impl From<i64> for Expr {
    fn from(c: i64) -> Self {
        Expr::constant(c)
    }
}

impl From<usize> for Expr {
    /// Panics above `i64::MAX`, which no real dimension reaches.
    fn from(c: usize) -> Self {
        Expr::constant(i64::try_from(c).expect("dimension exceeds i64::MAX"))
    }
}

impl From<SymId> for Expr {
    fn from(s: SymId) -> Self {
        Expr::sym(s)
    }
}

macro_rules! bin_op {
    ($Trait:ident, $method:ident) => {
        impl std::ops::$Trait<Expr> for Expr {
            type Output = Expr;
            fn $method(self, rhs: Expr) -> Expr {
                Expr::$method(&self, &rhs)
            }
        }
        impl std::ops::$Trait<&Expr> for Expr {
            type Output = Expr;
            fn $method(self, rhs: &Expr) -> Expr {
                Expr::$method(&self, rhs)
            }
        }
        impl std::ops::$Trait<Expr> for &Expr {
            type Output = Expr;
            fn $method(self, rhs: Expr) -> Expr {
                Expr::$method(self, &rhs)
            }
        }
        impl std::ops::$Trait<&Expr> for &Expr {
            type Output = Expr;
            fn $method(self, rhs: &Expr) -> Expr {
                Expr::$method(self, rhs)
            }
        }
        impl std::ops::$Trait<i64> for Expr {
            type Output = Expr;
            fn $method(self, rhs: i64) -> Expr {
                Expr::$method(&self, &Expr::constant(rhs))
            }
        }
        impl std::ops::$Trait<i64> for &Expr {
            type Output = Expr;
            fn $method(self, rhs: i64) -> Expr {
                Expr::$method(self, &Expr::constant(rhs))
            }
        }
    };
}

bin_op!(Add, add);
bin_op!(Sub, sub);
bin_op!(Mul, mul);

impl std::ops::Neg for Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        Expr::neg(&self)
    }
}

impl std::ops::Neg for &Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        Expr::neg(self)
    }
}

/// Whether an operand of `//` or `%` can be printed without parentheses.
fn is_simple(e: &Expr) -> bool {
    match e.as_const() {
        Some(c) => c >= 0,
        None => matches!(e.as_single_atom(), Some(Atom::Sym(_) | Atom::Min(..) | Atom::Max(..))),
    }
}

struct Operand<'a>(&'a Expr);

impl fmt::Display for Operand<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if is_simple(self.0) {
            write!(f, "{}", self.0)
        } else {
            write!(f, "({})", self.0)
        }
    }
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Atom::Sym(s) => write!(f, "{s}"),
            Atom::FloorDiv(a, b) => write!(f, "{} // {}", Operand(a), Operand(b)),
            Atom::Mod(a, b) => write!(f, "{} % {}", Operand(a), Operand(b)),
            Atom::Min(a, b) => write!(f, "min({a}, {b})"),
            Atom::Max(a, b) => write!(f, "max({a}, {b})"),
        }
    }
}

impl fmt::Display for Expr {
    /// Python-compatible syntax, highest degree first, constant last.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return write!(f, "{}", self.constant);
        }
        let mut terms: Vec<&Term> = self.terms.iter().collect();
        terms.sort_by_key(|t| Reverse(t.atoms.len()));
        for (i, t) in terms.iter().enumerate() {
            let negative = t.coeff < 0;
            match (i, negative) {
                (0, true) => f.write_str("-")?,
                (0, false) => {}
                (_, true) => f.write_str(" - ")?,
                (_, false) => f.write_str(" + ")?,
            }
            let abs = t.coeff.unsigned_abs();
            if abs != 1 {
                write!(f, "{abs}*")?;
            }
            // `//` and `%` bind like `*`, so they need parentheses unless they
            // stand alone (`a - b // 2` is fine, `-(b // 2)` and `2*(b // 2)`
            // are not).
            let bare = abs == 1 && t.atoms.len() == 1 && !(i == 0 && negative);
            for (j, atom) in t.atoms.iter().enumerate() {
                if j > 0 {
                    f.write_str("*")?;
                }
                if !bare && matches!(atom, Atom::FloorDiv(..) | Atom::Mod(..)) {
                    write!(f, "({atom})")?;
                } else {
                    write!(f, "{atom}")?;
                }
            }
        }
        match self.constant {
            0 => Ok(()),
            c if c < 0 => write!(f, " - {}", c.unsigned_abs()),
            c => write!(f, " + {c}"),
        }
    }
}

/// Concrete values for symbols, supplied at kernel launch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bindings {
    values: BTreeMap<SymId, i64>,
}

impl Bindings {
    /// No symbols bound.
    pub fn new() -> Self {
        Self::default()
    }

    /// Binds `sym` to `value`, returning the previous value if any.
    pub fn bind(&mut self, sym: SymId, value: i64) -> Option<i64> {
        self.values.insert(sym, value)
    }

    /// Builder-style [`Bindings::bind`].
    pub fn with(mut self, sym: SymId, value: i64) -> Self {
        self.values.insert(sym, value);
        self
    }

    /// The value bound to `sym`.
    pub fn get(&self, sym: SymId) -> Option<i64> {
        self.values.get(&sym).copied()
    }

    /// All bindings in symbol order.
    pub fn iter(&self) -> impl Iterator<Item = (SymId, i64)> + '_ {
        self.values.iter().map(|(&s, &v)| (s, v))
    }

    /// Number of bound symbols.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether nothing is bound.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

impl FromIterator<(SymId, i64)> for Bindings {
    fn from_iter<I: IntoIterator<Item = (SymId, i64)>>(iter: I) -> Self {
        Bindings { values: iter.into_iter().collect() }
    }
}

/// An inclusive integer interval; `None` means unbounded on that side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Interval {
    /// Least possible value, if bounded below.
    pub lo: Option<i64>,
    /// Greatest possible value, if bounded above.
    pub hi: Option<i64>,
}

impl Interval {
    /// Every integer.
    pub const FULL: Interval = Interval { lo: None, hi: None };

    /// Whether `v` lies in the interval.
    pub fn contains(&self, v: i64) -> bool {
        self.lo.is_none_or(|lo| lo <= v) && self.hi.is_none_or(|hi| v <= hi)
    }

    /// Whether every value lies in `[lo, hi]` (both bounded and inside).
    pub fn within(&self, lo: i64, hi: i64) -> bool {
        self.lo.is_some_and(|l| l >= lo) && self.hi.is_some_and(|h| h <= hi)
    }
}

/// Extended integers for interval arithmetic. Finite values are kept within
/// i64 range (see `Iv::clamp`), so i128 products never overflow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ext {
    NegInf,
    Fin(i128),
    PosInf,
}

impl Ext {
    fn neg(self) -> Ext {
        match self {
            Ext::NegInf => Ext::PosInf,
            Ext::Fin(v) => Ext::Fin(-v),
            Ext::PosInf => Ext::NegInf,
        }
    }

    fn signum(self) -> i128 {
        match self {
            Ext::NegInf => -1,
            Ext::Fin(v) => v.signum(),
            Ext::PosInf => 1,
        }
    }

    /// `0 * inf = 0`, which is right for endpoint products of closed intervals.
    fn mul(self, o: Ext) -> Ext {
        match (self, o) {
            (Ext::Fin(a), Ext::Fin(b)) => Ext::Fin(a * b),
            _ => match self.signum() * o.signum() {
                0 => Ext::Fin(0),
                s if s > 0 => Ext::PosInf,
                _ => Ext::NegInf,
            },
        }
    }

    /// Floor division by a positive divisor.
    fn floor_div_pos(self, d: Ext) -> Ext {
        match (self, d) {
            (Ext::Fin(x), Ext::Fin(y)) => Ext::Fin(x.div_euclid(y)),
            (Ext::Fin(x), _) => Ext::Fin(if x >= 0 { 0 } else { -1 }),
            (inf, _) => inf,
        }
    }

    fn add(self, o: Ext, toward: Ext) -> Ext {
        match (self, o) {
            (Ext::Fin(a), Ext::Fin(b)) => Ext::Fin(a + b),
            _ => toward,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Iv {
    lo: Ext,
    hi: Ext,
}

impl Iv {
    const FULL: Iv = Iv { lo: Ext::NegInf, hi: Ext::PosInf };

    fn point(v: i64) -> Iv {
        Iv { lo: Ext::Fin(v.into()), hi: Ext::Fin(v.into()) }
    }

    /// Widens out-of-i64 endpoints (soundly) to keep i128 math overflow-free.
    fn clamp(self) -> Iv {
        let (min, max) = (i128::from(i64::MIN), i128::from(i64::MAX));
        let lo = match self.lo {
            Ext::Fin(v) if v < min => Ext::NegInf,
            Ext::Fin(v) if v > max => Ext::Fin(max),
            Ext::PosInf => Ext::Fin(max),
            e => e,
        };
        let hi = match self.hi {
            Ext::Fin(v) if v > max => Ext::PosInf,
            Ext::Fin(v) if v < min => Ext::Fin(min),
            Ext::NegInf => Ext::Fin(min),
            e => e,
        };
        Iv { lo, hi }
    }

    fn add(self, o: Iv) -> Iv {
        Iv { lo: self.lo.add(o.lo, Ext::NegInf), hi: self.hi.add(o.hi, Ext::PosInf) }.clamp()
    }

    fn neg(self) -> Iv {
        Iv { lo: self.hi.neg(), hi: self.lo.neg() }
    }

    fn from_corners(c: [Ext; 4]) -> Iv {
        Iv { lo: *c.iter().min().unwrap(), hi: *c.iter().max().unwrap() }.clamp()
    }

    fn mul(self, o: Iv) -> Iv {
        Iv::from_corners([self.lo.mul(o.lo), self.lo.mul(o.hi), self.hi.mul(o.lo), self.hi.mul(o.hi)])
    }

    fn floor_div(self, d: Iv) -> Iv {
        if d.lo > Ext::Fin(0) {
            // x / y is monotone in each argument for y > 0, and floor keeps that.
            Iv::from_corners([
                self.lo.floor_div_pos(d.lo),
                self.lo.floor_div_pos(d.hi),
                self.hi.floor_div_pos(d.lo),
                self.hi.floor_div_pos(d.hi),
            ])
        } else if d.hi < Ext::Fin(0) {
            self.neg().floor_div(d.neg())
        } else {
            Iv::FULL
        }
    }

    fn modulo(self, d: Iv) -> Iv {
        let zero = Ext::Fin(0);
        // The remainder lies strictly between 0 and the divisor.
        let mut out =
            Iv { lo: d.lo.add(Ext::Fin(1), Ext::NegInf).min(zero), hi: d.hi.add(Ext::Fin(-1), Ext::PosInf).max(zero) };
        if d.lo > zero && self.lo >= zero {
            if self.hi < d.lo {
                return self; // x mod m == x for 0 <= x < m
            }
            out.hi = out.hi.min(self.hi);
        } else if d.hi < zero && self.hi <= zero {
            if self.lo > d.hi {
                return self;
            }
            out.lo = out.lo.max(self.lo);
        }
        out.clamp()
    }

    fn min(self, o: Iv) -> Iv {
        Iv { lo: self.lo.min(o.lo), hi: self.hi.min(o.hi) }
    }

    fn max(self, o: Iv) -> Iv {
        Iv { lo: self.lo.max(o.lo), hi: self.hi.max(o.hi) }
    }

    fn to_public(self) -> Interval {
        let get = |e: Ext| match e {
            Ext::Fin(v) => i64::try_from(v).ok(),
            _ => None,
        };
        Interval { lo: get(self.lo), hi: get(self.hi) }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct SymInfo {
    name: String,
    lo: i64,
    hi: Option<i64>,
}

/// Names and value ranges of the symbols of one graph; answers range
/// questions (`is this dim >= 1?`) that canonical forms alone cannot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SymTable {
    syms: Vec<SymInfo>,
    /// Ranges of symbols created elsewhere (a kernel's loop variables), by id.
    #[serde(default)]
    extra: BTreeMap<SymId, (i64, Option<i64>)>,
    /// Symbolic exclusive upper bounds of loop variables (`0 <= s < extent`), for divisions by symbolic
    /// dims.
    #[serde(default)]
    extents: BTreeMap<SymId, Expr>,
}

impl SymTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Creates a symbol with inclusive range `[lo, hi]` (`hi = None`:
    /// unbounded above). Panics if `hi < lo` or after `u32::MAX` symbols.
    pub fn new_symbol(&mut self, name: &str, lo: i64, hi: Option<i64>) -> SymId {
        assert!(hi.is_none_or(|hi| lo <= hi), "symbol {name}: empty range [{lo}, {hi:?}]");
        let id = SymId(u32::try_from(self.syms.len()).expect("too many symbols"));
        self.syms.push(SymInfo { name: name.to_owned(), lo, hi });
        id
    }

    /// The symbol's name, if it belongs to this table.
    pub fn name(&self, s: SymId) -> Option<&str> {
        self.info(s).map(|i| i.name.as_str())
    }

    /// The symbol's inclusive range `(lo, hi)`, if it belongs to this table.
    pub fn range(&self, s: SymId) -> Option<(i64, Option<i64>)> {
        self.info(s).map(|i| (i.lo, i.hi)).or_else(|| self.extra.get(&s).copied())
    }

    /// Records the inclusive range of a symbol this table did not create (a loop variable), so range
    /// questions and [`Expr::simplify_in`] can use it. An empty range is ignored.
    pub fn set_range(&mut self, s: SymId, lo: i64, hi: Option<i64>) {
        if hi.is_none_or(|hi| lo <= hi) && self.info(s).is_none() {
            self.extra.insert(s, (lo, hi));
        }
    }

    /// Records that a loop variable this table did not create runs over `0..extent` (a symbolic extent;
    /// constant ones are plain ranges, see [`SymTable::set_range`]).
    pub fn set_extent(&mut self, s: SymId, extent: Expr) {
        if self.info(s).is_none() {
            self.extents.insert(s, extent);
        }
    }

    /// The symbolic extent recorded for `s`.
    pub fn extent(&self, s: SymId) -> Option<&Expr> {
        self.extents.get(&s)
    }

    /// The first symbol with this name.
    pub fn lookup(&self, name: &str) -> Option<SymId> {
        let idx = self.syms.iter().position(|i| i.name == name)?;
        u32::try_from(idx).ok().map(SymId)
    }

    /// Number of symbols.
    pub fn len(&self) -> usize {
        self.syms.len()
    }

    /// Whether the table has no symbols.
    pub fn is_empty(&self) -> bool {
        self.syms.is_empty()
    }

    fn info(&self, s: SymId) -> Option<&SymInfo> {
        self.syms.get(usize::try_from(s.0).ok()?)
    }

    /// Sound (possibly loose) bounds on `e` over all in-range bindings for
    /// which `e` evaluates. Symbols unknown to the table are unbounded.
    pub fn bounds(&self, e: &Expr) -> Interval {
        self.iv(e).to_public()
    }

    /// [`SymTable::bounds`] of an expression's tree (the form renderers walk), node by node: a
    /// renderer asks it of each dividend to know whether 32-bit division is exact there.
    pub fn tree_bounds(&self, t: &ExprTree) -> Interval {
        self.iv_tree(t).to_public()
    }

    /// Whether `t` is a non-negative 32-bit value wherever it is computed: where it is, a renderer that
    /// indexes in 64 bits divides it in 32 (one decision for every renderer that asks).
    pub fn fits_u32(&self, t: &ExprTree) -> bool {
        self.tree_bounds(t).within(0, u32::MAX.into())
    }

    fn iv_tree(&self, t: &ExprTree) -> Iv {
        let fold = |v: &[ExprTree], mul: bool| {
            let mut acc = self.iv_tree(&v[0]);
            for x in &v[1..] {
                let y = self.iv_tree(x);
                acc = if mul { acc.mul(y) } else { acc.add(y) };
            }
            acc
        };
        match t {
            ExprTree::Const(c) => Iv::point(*c),
            ExprTree::Sym(s) => self.sym_iv(*s),
            ExprTree::Add(v) => fold(v, false),
            ExprTree::Mul(v) => fold(v, true),
            ExprTree::FloorDiv(a, b) => self.iv_tree(a).floor_div(self.iv_tree(b)),
            ExprTree::Mod(a, b) => self.iv_tree(a).modulo(self.iv_tree(b)),
            ExprTree::Min(a, b) => self.iv_tree(a).min(self.iv_tree(b)),
            ExprTree::Max(a, b) => self.iv_tree(a).max(self.iv_tree(b)),
        }
    }

    fn sym_iv(&self, s: SymId) -> Iv {
        match self.range(s) {
            Some((lo, hi)) => Iv { lo: Ext::Fin(lo.into()), hi: hi.map_or(Ext::PosInf, |h| Ext::Fin(h.into())) },
            None => Iv::FULL,
        }
    }

    fn iv(&self, e: &Expr) -> Iv {
        let mut acc = Iv::point(e.constant);
        for t in &e.terms {
            let mut prod = Iv::point(t.coeff);
            for atom in &t.atoms {
                let a = match atom {
                    Atom::Sym(s) => self.sym_iv(*s),
                    Atom::FloorDiv(x, y) => self.iv(x).floor_div(self.iv(y)),
                    Atom::Mod(x, y) => self.iv(x).modulo(self.iv(y)),
                    Atom::Min(x, y) => self.iv(x).min(self.iv(y)),
                    Atom::Max(x, y) => self.iv(x).max(self.iv(y)),
                };
                prod = prod.mul(a);
            }
            acc = acc.add(prod);
        }
        acc
    }

    /// `Some(true)` if `a == b` for all in-range bindings, `Some(false)` if
    /// never, `None` if it cannot be decided here.
    pub fn known_eq(&self, a: &Expr, b: &Expr) -> Option<bool> {
        if a == b {
            return Some(true);
        }
        let diff = self.bounds(&a.try_combine(b, true)?);
        if diff.lo == Some(0) && diff.hi == Some(0) {
            Some(true)
        } else if !diff.contains(0) {
            Some(false)
        } else {
            None
        }
    }

    /// `Some(true)` if `a >= b` for all in-range bindings, `Some(false)` if
    /// `a < b` for all of them, `None` if it cannot be decided here.
    pub fn known_ge(&self, a: &Expr, b: &Expr) -> Option<bool> {
        let diff = self.bounds(&a.try_combine(b, true)?);
        if diff.lo.is_some_and(|lo| lo >= 0) {
            Some(true)
        } else if diff.hi.is_some_and(|hi| hi < 0) {
            Some(false)
        } else {
            None
        }
    }

    /// Whether `k` provably divides `e` for all in-range bindings.
    pub fn known_divisible(&self, e: &Expr, k: i64) -> bool {
        if e.is_divisible_by(k) {
            return true;
        }
        let b = self.bounds(e);
        match (b.lo, b.hi) {
            (Some(lo), Some(hi)) if lo == hi => py_mod(lo, k) == Some(0),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {

    /// Found by `fuzz/fuzz_targets/sym_simplify.rs`: a symbol its range fixes to one value, substituted
    /// into a term whose coefficient is near `i64::MAX`, overflowed inside `simplify_in` (a panic). Now
    /// the expression comes back unsimplified, and still evaluates the same.
    #[test]
    fn simplifying_never_panics_on_overflow() {
        let mut table = SymTable::new();
        let a = table.new_symbol("a", 3, Some(3));
        let big = Expr::constant(i64::MAX / 2 + 1).checked_mul(&Expr::sym(a)).expect("no overflow yet");
        let e = big.checked_add(&Expr::sym(a).floor_div(&Expr::constant(2))).expect("fits");
        let s = e.simplify_in(&table);
        let b = Bindings::new().with(a, 3);
        assert_eq!(s.eval(&b).is_err(), e.eval(&b).is_err());
        let small = Expr::sym(a).mul(&Expr::constant(5));
        assert_eq!(small.simplify_in(&table).as_const(), Some(15), "ordinary folding still happens");
    }
    use super::*;
    use proptest::prelude::*;

    fn s(i: u32) -> Expr {
        Expr::sym(SymId(i))
    }

    fn c(v: i64) -> Expr {
        Expr::constant(v)
    }

    #[test]
    fn constant_folding_python_semantics() {
        assert_eq!((c(3) + c(4) * 5).as_const(), Some(23));
        assert_eq!(c(-7).floor_div(&c(2)).as_const(), Some(-4));
        assert_eq!(c(-7).modulo(&c(2)).as_const(), Some(1));
        assert_eq!(c(7).modulo(&c(-2)).as_const(), Some(-1));
        assert_eq!(c(7).floor_div(&c(-2)).as_const(), Some(-4));
        assert_eq!(c(-7).floor_div(&c(-2)).as_const(), Some(3));
        assert_eq!(c(-7).modulo(&c(-2)).as_const(), Some(-1));
        assert_eq!(c(i64::MIN).modulo(&c(-1)).as_const(), Some(0));
        assert_eq!(c(3).min(&c(-2)).as_const(), Some(-2));
        assert_eq!(c(3).max(&c(-2)).as_const(), Some(3));
        for a in -9..=9 {
            for b in [-4, -3, -1, 1, 2, 5] {
                assert_eq!(c(a).floor_div(&c(b)).as_const(), py_floor_div(a, b));
                assert_eq!(c(a).modulo(&c(b)).as_const(), py_mod(a, b));
            }
        }
    }

    #[test]
    fn canonical_equality() {
        assert_eq!(s(0) * 2 + s(1), s(1) + s(0) + s(0));
        assert_eq!(&s(0) * &s(1), s(1) * s(0));
        assert_eq!((s(0) + 1) * (s(0) - 1), s(0) * s(0) - 1);
        assert_eq!(s(0).mul(&c(0)), Expr::ZERO);
        assert_eq!(s(0) * 1, s(0));
        assert_eq!(s(0) - s(0), Expr::ZERO);
        assert_eq!(-(-s(0)), s(0));
        assert_eq!(s(0).min(&s(1)), s(1).min(&s(0)));
        assert_eq!(s(0).min(&s(0)), s(0));
        assert_eq!(s(0).max(&(s(0) + 3)), s(0) + 3);
        assert_eq!(s(0).min(&(s(0) + 3)), s(0));
    }

    #[test]
    fn division_simplifications() {
        assert_eq!((s(0) * 4).floor_div(&c(4)), s(0));
        assert_eq!((s(0) * 4 + 8).floor_div(&c(4)), s(0) + 2);
        assert_eq!((s(0) * 4 + s(1)).floor_div(&c(4)), s(0) + s(1).floor_div(&c(4)));
        assert_eq!(s(0).floor_div(&c(1)), s(0));
        assert_eq!(s(0).modulo(&c(1)), Expr::ZERO);
        assert_eq!((s(0) * 6 + 12).modulo(&c(3)), Expr::ZERO);
        assert_eq!((s(0) + 5).modulo(&c(4)), (s(0) + 1).modulo(&c(4)));
        assert_eq!(s(0).floor_div(&c(2)).floor_div(&c(3)), s(0).floor_div(&c(6)));
        assert_eq!(s(0).modulo(&c(12)).modulo(&c(4)), s(0).modulo(&c(4)));
        assert_eq!(s(0).modulo(&c(4)).modulo(&c(8)), s(0).modulo(&c(4)));
        assert_eq!(s(0).floor_div(&c(-2)), (-s(0)).floor_div(&c(2)));
        assert!((s(0) * 6 + 12).is_divisible_by(3));
        assert!(!(s(0) * 6 + 1).is_divisible_by(3));
        assert!(Expr::ZERO.is_divisible_by(0));
    }

    #[test]
    fn eval_matches_direct_computation() {
        let e = (s(0) * s(1) * 4 + s(2)).floor_div(&(s(0) + 1)) + s(1).modulo(&c(3)) - s(2).max(&c(2));
        for (x, y, z) in [(3, 5, -7), (0, -4, 9), (10, 10, 10)] {
            let b = Bindings::new().with(SymId(0), x).with(SymId(1), y).with(SymId(2), z);
            let want = py_floor_div(x * y * 4 + z, x + 1).unwrap() + py_mod(y, 3).unwrap() - z.max(2);
            assert_eq!(e.eval(&b), Ok(want));
        }
    }

    #[test]
    fn eval_errors_do_not_panic() {
        let b = Bindings::new().with(SymId(0), 0);
        assert_eq!(s(1).eval(&b), Err(SymError::UnboundSymbol(SymId(1))));
        assert!(matches!(c(5).floor_div(&s(0)).eval(&b), Err(SymError::DivisionByZero { .. })));
        assert!(matches!(s(0).floor_div(&c(0)).eval(&b), Err(SymError::DivisionByZero { .. })));
        assert!(matches!(c(5).checked_modulo(&c(0)), Err(SymError::DivisionByZero { .. })));
        let big = Bindings::new().with(SymId(0), 1 << 40);
        assert!(matches!((s(0) * s(0)).eval(&big), Err(SymError::Overflow { .. })));
        let min = Bindings::new().with(SymId(0), i64::MIN).with(SymId(1), -1);
        assert!(matches!(s(0).floor_div(&s(1)).eval(&min), Err(SymError::Overflow { .. })));
        assert!(matches!(c(i64::MAX).checked_add(&c(1)), Err(SymError::Overflow { .. })));
    }

    #[test]
    fn display() {
        assert_eq!((s(0) * s(1) * 4 + s(2) + 3).to_string(), "4*s0*s1 + s2 + 3");
        assert_eq!((s(0) + 1).floor_div(&c(2)).to_string(), "(s0 + 1) // 2");
        assert_eq!(s(0).modulo(&c(4)).to_string(), "s0 % 4");
        assert_eq!(s(0).min(&c(8)).to_string(), "min(s0, 8)");
        assert_eq!(c(-5).to_string(), "-5");
        assert_eq!((c(1) - s(0) * 2).to_string(), "-2*s0 + 1");
        assert_eq!((s(1) - s(0).floor_div(&c(2))).to_string(), "s1 - s0 // 2");
        assert_eq!((-s(0).floor_div(&c(2))).to_string(), "-(s0 // 2)");
        assert_eq!((s(1) * s(0).modulo(&c(3))).to_string(), "s1*(s0 % 3)");
        assert_eq!(s(0).floor_div(&(s(1) * 2)).to_string(), "s0 // (2*s1)");
    }

    #[test]
    fn ranges_and_known_facts() {
        let mut t = SymTable::new();
        let n = t.new_symbol("n", 1, Some(100));
        let m = t.new_symbol("m", 0, None);
        assert_eq!(t.name(n), Some("n"));
        assert_eq!(t.range(m), Some((0, None)));
        assert_eq!(t.lookup("m"), Some(m));
        let (n, m) = (Expr::sym(n), Expr::sym(m));
        assert_eq!(t.known_ge(&n, &c(1)), Some(true));
        assert_eq!(t.known_ge(&n, &c(101)), Some(false));
        assert_eq!(t.known_ge(&n, &c(50)), None);
        assert_eq!(t.known_eq(&(&n + 1), &n), Some(false));
        assert_eq!(t.known_eq(&(&n * 2), &(&n + &n)), Some(true));
        assert_eq!(t.known_eq(&n, &c(0)), Some(false));
        assert_eq!(t.known_eq(&n, &m), None);
        assert_eq!(t.known_ge(&(&n * &m), &c(0)), Some(true));
        assert_eq!(t.known_ge(&n.modulo(&c(8)), &c(8)), Some(false));
        assert_eq!(t.bounds(&(n.floor_div(&c(4)) - &m)), Interval { lo: None, hi: Some(25) });
        assert!(t.known_divisible(&(&n * 8 + 16), 4));
        assert!(!t.known_divisible(&n, 4));
    }

    #[test]
    fn tree_matches_eval() {
        let e = (s(0) * 4 + s(1)).floor_div(&c(3)) * 2 - s(0).min(&c(5)) + s(1).modulo(&c(4)) + 7;
        fn ev(t: &ExprTree, b: &Bindings) -> i64 {
            match t {
                ExprTree::Const(c) => *c,
                ExprTree::Sym(s) => b.get(*s).unwrap(),
                ExprTree::Add(v) => v.iter().map(|x| ev(x, b)).sum(),
                ExprTree::Mul(v) => v.iter().map(|x| ev(x, b)).product(),
                ExprTree::FloorDiv(x, y) => ev(x, b).div_euclid(ev(y, b)),
                ExprTree::Mod(x, y) => ev(x, b).rem_euclid(ev(y, b)),
                ExprTree::Min(x, y) => ev(x, b).min(ev(y, b)),
                ExprTree::Max(x, y) => ev(x, b).max(ev(y, b)),
            }
        }
        for (x, y) in [(0, 0), (3, 9), (10, 2), (7, 7)] {
            let b = Bindings::new().with(SymId(0), x).with(SymId(1), y);
            assert_eq!(ev(&e.tree(), &b), e.eval(&b).unwrap());
        }
        assert_eq!(c(0).tree(), ExprTree::Const(0));
        assert_eq!(s(2).tree(), ExprTree::Sym(SymId(2)));
    }

    #[test]
    fn ranges_remove_redundant_division() {
        let mut t = SymTable::new();
        let n = t.new_symbol("n", 1, None);
        let (i, j) = (SymId(1 << 20), SymId((1 << 20) + 1));
        t.set_range(i, 0, Some(2));
        t.set_range(j, 0, Some(7));
        let flat = s(i.0) * 8 + s(j.0);
        assert_eq!(flat.floor_div(&c(8)).simplify_in(&t), s(i.0));
        assert_eq!(flat.modulo(&c(8)).simplify_in(&t), s(j.0));
        assert_eq!(s(i.0).modulo(&c(3)).simplify_in(&t), s(i.0));
        assert_eq!(s(i.0).modulo(&c(2)).simplify_in(&t), s(i.0).modulo(&c(2)));
        assert_eq!(s(j.0).min(&c(9)).simplify_in(&t), s(j.0));
        // A symbol pinned to one value is that value.
        let one = SymId((1 << 20) + 2);
        t.set_range(one, 0, Some(0));
        assert_eq!((s(one.0) * 5 + s(j.0)).simplify_in(&t), s(j.0));
        // Unknown upper bounds keep the operation.
        assert_eq!(s(n.0).modulo(&c(4)).simplify_in(&t), s(n.0).modulo(&c(4)));
        // Coordinates recombined with their own strides fold back into the flat index, nested too.
        let i = s(n.0);
        let split =
            i.floor_div(&c(6144)) * 3145728 + i.floor_div(&c(512)).modulo(&c(12)) * 262144 + i.modulo(&c(512)) * 512;
        assert_eq!(split.simplify_in(&t), i.clone() * 512);
        // A loop variable over a symbolic extent: (q*m + k) // m is q and (q*m + k) % m is k.
        let mut t2 = t.clone();
        let (q, m, k) = (s(j.0), s(n.0), SymId((1 << 20) + 3));
        t2.set_extent(k, m.clone());
        let flat = q.clone() * m.clone() + s(k.0);
        assert_eq!(flat.floor_div(&m).simplify_in(&t2), q);
        assert_eq!(flat.modulo(&m).simplify_in(&t2), s(k.0));
        assert_eq!(flat.floor_div(&m).simplify_in(&t), flat.floor_div(&m), "no extent, no rewrite");
    }

    #[test]
    fn shift_by_is_the_constant_growth_of_an_affine_use() {
        let e = s(0) * 8192 + s(1);
        assert_eq!(e.shift_by(SymId(1), 256), Some(256));
        assert_eq!(e.shift_by(SymId(0), 2), Some(16384));
        assert_eq!((s(1) * 3 + 7).shift_by(SymId(2), 5), Some(0));
        // A division of the shifted symbol grows by different amounts at different points.
        assert_eq!(s(1).floor_div(&c(3)).shift_by(SymId(1), 1), None);
    }

    #[test]
    fn substitute_resimplifies() {
        let e = (s(0) * 4 + s(1)).floor_div(&c(4));
        let map = BTreeMap::from([(SymId(1), s(2) * 8)]);
        assert_eq!(e.substitute(&map), s(0) + s(2) * 2);
        let map = BTreeMap::from([(SymId(0), c(3)), (SymId(1), c(5))]);
        assert_eq!(e.substitute(&map), c(4));
        assert_eq!(e.symbols(), BTreeSet::from([SymId(0), SymId(1)]));
    }

    #[test]
    fn serde_round_trip() {
        let e = (s(0) * s(1) * 4 + s(2)).floor_div(&(s(0) + 1)) - s(1).min(&c(7));
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(serde_json::from_str::<Expr>(&json).unwrap(), e);
        let mut t = SymTable::new();
        t.new_symbol("batch", 1, None);
        let back: SymTable = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back, t);
        let b = Bindings::new().with(SymId(3), -2);
        let back: Bindings = serde_json::from_str(&serde_json::to_string(&b).unwrap()).unwrap();
        assert_eq!(back, b);
        // Non-canonical input is re-canonicalized rather than trusted.
        let raw = r#"{"terms":[{"atoms":[{"Sym":0}],"coeff":2},{"atoms":[{"Sym":0}],"coeff":-2}],"constant":1}"#;
        assert_eq!(serde_json::from_str::<Expr>(raw).unwrap(), c(1));
    }

    #[derive(Clone, Debug)]
    enum Tree {
        C(i64),
        S(u32),
        Neg(Box<Tree>),
        Bin(u8, Box<Tree>, Box<Tree>),
    }

    fn tree() -> impl Strategy<Value = Tree> {
        let leaf = prop_oneof![(-6i64..=6).prop_map(Tree::C), (0u32..3).prop_map(Tree::S)];
        leaf.prop_recursive(4, 24, 2, |inner| {
            prop_oneof![
                inner.clone().prop_map(|a| Tree::Neg(Box::new(a))),
                (0u8..7, inner.clone(), inner).prop_map(|(op, a, b)| Tree::Bin(op, Box::new(a), Box::new(b))),
            ]
        })
    }

    fn build(t: &Tree) -> Expr {
        match t {
            Tree::C(v) => c(*v),
            Tree::S(i) => s(*i),
            Tree::Neg(a) => -build(a),
            Tree::Bin(op, a, b) => {
                let (a, b) = (build(a), build(b));
                match op {
                    0 => a + b,
                    1 => a - b,
                    2 => a * b,
                    3 => a.floor_div(&b),
                    4 => a.modulo(&b),
                    5 => a.min(&b),
                    _ => a.max(&b),
                }
            }
        }
    }

    /// Direct evaluation; `None` on division by zero.
    fn direct(t: &Tree, v: &[i64; 3]) -> Option<i64> {
        Some(match t {
            Tree::C(x) => *x,
            Tree::S(i) => v[*i as usize],
            Tree::Neg(a) => -direct(a, v)?,
            Tree::Bin(op, a, b) => {
                let (a, b) = (direct(a, v)?, direct(b, v)?);
                match op {
                    0 => a + b,
                    1 => a - b,
                    2 => a * b,
                    3 => py_floor_div(a, b)?,
                    4 => py_mod(a, b)?,
                    5 => a.min(b),
                    _ => a.max(b),
                }
            }
        })
    }

    fn bindings(v: &[i64; 3]) -> Bindings {
        (0..3).map(|i| (SymId(i), v[i as usize])).collect()
    }

    proptest! {
        #[test]
        fn canonical_eval_matches_tree(t in tree(), v in prop::array::uniform3(-8i64..=8)) {
            let e = build(&t);
            if let Some(want) = direct(&t, &v) {
                prop_assert_eq!(e.eval(&bindings(&v)), Ok(want), "{}", e);
            }
            let json = serde_json::to_string(&e).unwrap();
            prop_assert_eq!(serde_json::from_str::<Expr>(&json).unwrap(), e);
        }

        #[test]
        fn algebraic_laws(a in tree(), b in tree(), c in tree()) {
            let (a, b, c) = (build(&a), build(&b), build(&c));
            prop_assert_eq!(&a + &b, &b + &a);
            prop_assert_eq!(&a * &b, &b * &a);
            prop_assert_eq!(&a * (&b + &c), &a * &b + &a * &c);
            prop_assert_eq!((&a + &b) - &b, a.clone());
            prop_assert_eq!(a.min(&b), b.min(&a));
            prop_assert_eq!(a.max(&b), b.max(&a));
        }

        #[test]
        fn simplify_in_preserves_values(t in tree(), x in 0i64..=8, y in 1i64..=5, z in -4i64..=4) {
            let mut table = SymTable::new();
            table.new_symbol("x", 0, Some(8));
            table.new_symbol("y", 1, None);
            table.new_symbol("z", -4, Some(4));
            let e = build(&t);
            if let Ok(v) = e.eval(&bindings(&[x, y, z])) {
                let simple = e.simplify_in(&table);
                prop_assert_eq!(simple.eval(&bindings(&[x, y, z])), Ok(v), "{} became {}", e, simple);
            }
        }

        /// Index expressions as lowering builds them (coordinates merged into quotients, padded
        /// positions clamped, offsets), divided and reduced by powers of two: the range-based split and
        /// the nested-remainder fold keep every value.
        #[test]
        fn index_divisions_keep_values(
            coeffs in prop::array::uniform4(prop::sample::select(vec![1i64, 2, 4, 16, 32, 64, 1024, 4096, -4])),
            shifts in prop::array::uniform3(0u32..8),
            offset in -300i64..300,
            k in prop::sample::select(vec![2i64, 4, 32, 64, 256, 4096]),
        ) {
            let mut table = SymTable::new();
            let x = table.new_symbol("x", 0, Some(4095));
            let i = Expr::sym(x);
            let d = |sh: u32| Expr::constant(1 << sh);
            let clamped = (i.modulo(&d(shifts[2])) + c(offset % 3)).max(&c(1)).min(&d(shifts[2]));
            let e = i.floor_div(&d(shifts[0])) * coeffs[0]
                + i.floor_div(&d(shifts[1])).modulo(&d(shifts[2])) * coeffs[1]
                + clamped * coeffs[2]
                + i.modulo(&d(shifts[0])) * coeffs[3]
                + c(offset);
            let k = c(k);
            for q in [e.floor_div(&k), e.modulo(&k), e.modulo(&c(4096)).floor_div(&k) * k.clone() + e.modulo(&k)] {
                let simple = q.simplify_in(&table);
                for v in (0..4096).step_by(7).chain([4095]) {
                    let b = Bindings::new().with(x, v);
                    prop_assert_eq!(simple.eval(&b), q.eval(&b), "{} became {} at x = {}", q, simple, v);
                }
            }
        }

        #[test]
        fn bounds_are_sound(t in tree(), x in 0i64..=8, y in 1i64..=5, z in -4i64..=4) {
            let mut table = SymTable::new();
            table.new_symbol("x", 0, Some(8));
            table.new_symbol("y", 1, None);
            table.new_symbol("z", -4, Some(4));
            let e = build(&t);
            if let Ok(v) = e.eval(&bindings(&[x, y, z])) {
                let iv = table.bounds(&e);
                prop_assert!(iv.contains(v), "{} = {} not in {:?}", e, v, iv);
                // The same question asked of the tree renderers walk, and of each of its dividends.
                let tree = e.tree();
                let tv = table.tree_bounds(&tree);
                prop_assert!(tv.contains(v), "{} = {} not in the tree's {:?}", e, v, tv);
            }
        }
    }
}
