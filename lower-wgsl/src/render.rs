//! Kernel IR → WGSL. A printer: every decision was made in `kiln-graph`; this file only spells the IR in
//! WGSL, following the IR's evaluation rules (see `kiln_graph::kernel`).

mod attention;
mod attention_registers;

use crate::storage::Storage;
use kiln_graph::dtype::DType;
use kiln_graph::ir::{BinaryOp, UnaryOp};
use kiln_graph::kernel::{
    builtin, Access, BitOp, KReduceOp, Kernel, LoopMode, MatMul, ReduceStrategy, RowLoad, Scalar, Stmt, VarId,
    ROW_ELEMENT,
};
use kiln_graph::sym::{Expr, ExprTree, SymId};
use std::collections::HashMap;
use std::fmt::Write;

/// Helper functions every kernel may call (beside [`approximations`]).
pub const PRELUDE: &str = include_str!("prelude.wgsl");

/// The 8-bit float functions (`kf8_round`, `kf8_bits`, `kf8_value`): appended to the prelude of a kernel
/// that calls them (a `kf8_` in its body), so other kernels do not parse them.
pub const PRELUDE_F8: &str = include_str!("prelude_f8.wgsl");

/// The f16 `maximum`/`minimum` that keep NaN (`kmaxh`, `kminh`): appended to the prelude of a kernel
/// that calls them (only kernels computing in f16, which enable it, do).
pub const PRELUDE_F16: &str = include_str!("prelude_f16.wgsl");

/// The f64 helpers (`kmaxd`, `kd2i`, `kd2f_odd`, …): appended to the prelude of a kernel that calls one.
pub const PRELUDE_F64: &str = include_str!("prelude_f64.wgsl");

/// The names [`PRELUDE_F64`] defines, any of which a kernel calling needs it.
const F64_HELPERS: [&str; 7] = ["kisnand(", "kmaxd(", "kmind(", "krelud(", "kd2i(", "kd2u(", "kd2f_odd("];

/// `c[0] + s·(c[1] + s·(…))` as nested `fma`s from the last coefficient (`approx::horner`'s order).
fn horner(c: &[f64], s: &str) -> String {
    let n = c.len();
    let mut p = format!("fma({:?}, {s}, {:?})", c[n - 1], c[n - 2]);
    for k in c[..n - 2].iter().rev() {
        p = format!("fma({p}, {s}, {k:?})");
    }
    p
}

/// `ktanh` and `kerf`: the PTX renderer's designs, from the coefficients `kiln_graph::approx` holds for
/// both (one source, one tested error budget).
pub fn approximations() -> String {
    use kiln_graph::approx::{ERF_CLAMP, ERF_LARGE_LOG2, ERF_SMALL, ERF_SPLIT, TANH_SMALL, TANH_SPLIT};
    format!(
        "fn ktanh(x: f32) -> f32 {{
    // An odd polynomial below |x| = {TANH_SPLIT:?}, where 1 - 2/(e^2|x| + 1) would cancel, that form above;
    // both computed and one selected, so a subgroup never diverges. A driver's own tanh may come from exp
    // and overflow to NaN past |x| ~ 44; here e^2|x| stops at e^80 (WGSL lets a driver assume no
    // infinities), where the form is 1 in f32.
    let s = x * x;
    let small = fma({tanh}, s * x, x);
    let a = abs(x);
    let big = 1.0 - 2.0 / (exp(min(a + a, 80.0)) + 1.0);
    return select(select(sign(x) * big, x, kisnan(x)), small, a < {TANH_SPLIT:?});
}}

fn kerf(x: f32) -> f32 {{
    // x + x p(x^2) below |x| = {ERF_SPLIT:?}, 1 - 2^q(min(|x|, {ERF_CLAMP:?})) with x's sign above; both computed
    // and one selected, so a subgroup never diverges (W1's inputs straddle the split).
    let a = abs(x);
    let s = x * x;
    let small = fma({small}, x, x);
    let t = min(a, {ERF_CLAMP:?});
    let big = 1.0 - exp2({large});
    return select(select(select(big, -big, x < 0.0), small, a < {ERF_SPLIT:?}), x, kisnan(x));
}}
",
        tanh = horner(&TANH_SMALL, "s"),
        small = horner(&ERF_SMALL, "s"),
        large = horner(&ERF_LARGE_LOG2, "t"),
    )
}

pub use kiln_graph::kernel::RenderError;

/// A rendered shader and what the runtime needs to bind it.
#[derive(Clone, Debug)]
pub struct Shader {
    /// Kernel name (the entry point is `main`).
    pub name: String,
    /// WGSL source.
    pub source: String,
    /// The storage layout of each kernel buffer, in binding order.
    pub storage: Vec<Storage>,
    /// Whether binding `buffers.len()` is the uniform block of symbol values.
    pub uses_symbols: bool,
}

struct Writer<'k> {
    k: &'k Kernel,
    f16: bool,
    out: String,
    var_dtype: HashMap<VarId, DType>,
    storage: Vec<Storage>,
    /// Inside a `Group` loop and outside any `Threads` loop: stores are thread 0's.
    single_thread_stores: bool,
    red_types: std::collections::BTreeSet<&'static str>,
    /// Workgroup tiles of the matmul template: (A elements, B elements, element type).
    mm_tiles: Option<(i64, i64, String)>,
    /// The kernel's index ranges ([`Kernel::index_ranges`]): which divisions may be unsigned.
    ranges: kiln_graph::sym::SymTable,
    /// Workgroup arrays of an attention template: (name, `vec4<f32>` elements).
    attention_arrays: Vec<(&'static str, u32)>,
    /// f32 buffers an attention template binds as `vec4<f32>` (its rows are aligned to 4).
    attention_vec4: std::collections::BTreeSet<usize>,
    error: Option<String>,
    /// Inside a vectorised loop: the lane being written and the loop variable.
    lane: Option<(u32, SymId)>,
    /// Variables defined inside the vectorised loop body (named per lane).
    lane_vars: std::collections::HashSet<VarId>,
    /// Buffers bound as arrays of vectors (accessed `vector_width` elements at a time).
    vector_buffers: std::collections::HashSet<usize>,
    /// Persistent rows: the row elements each thread keeps in registers, by (buffer, dtype, index with
    /// the pass variable replaced by `ROW_ELEMENT`).
    row_cache: HashMap<(usize, DType, Expr), usize>,
    /// The register slot being written, in an unrolled persistent pass.
    unroll_slot: Option<u32>,
    /// The loop variable of the row pass being written, while persistent rows are on.
    pass_sym: Option<SymId>,
    /// Buffers of a row with lanes bound as arrays of `row_lanes`-vectors ([`row_vector_buffers`]).
    row_vectors: std::collections::HashSet<usize>,
    /// Inside a slot group of such a row: the lane being written.
    group_lane: Option<u32>,
    /// The group's vector loads and stores, by (buffer, index as the pass writes it): their names.
    group_loads: HashMap<(usize, Expr), String>,
    group_stores: HashMap<(usize, Expr), String>,
    /// Names of group vectors written so far.
    groups: usize,
    /// The shader reads the subgroup builtins (`sg_lane`, `sg_id`): a combine shuffles within
    /// subgroups, or groups are packed one a subgroup.
    subgroups: bool,
}

/// An i32 literal. WGSL reads `-2147483648i` as the negation of `2147483648i`, which is out of range
/// and rejected, so i32's minimum is written as an expression.
fn int_literal(v: i32) -> String {
    match v {
        i32::MIN => "(-2147483647i - 1i)".into(),
        v => format!("{v}i"),
    }
}

fn float_literal(v: f64) -> String {
    let x = v as f32;
    if x.is_nan() {
        "knan()".into()
    } else if x.is_infinite() {
        if x > 0.0 {
            "kinf()".into()
        } else {
            "(-kinf())".into()
        }
    } else {
        format!("{x:?}f")
    }
}

/// An f64 literal: exact (Rust prints the shortest digits that read back as the same f64); non-finite
/// values through f32's, which convert exactly.
fn f64_literal(v: f64) -> String {
    if v.is_finite() {
        format!("{v:?}lf")
    } else {
        format!("f64({})", float_literal(v))
    }
}

/// Element `idx` of a buffer of `bits`-wide elements packed into 32-bit words: the word's index and the
/// element's bit offset in it. Indices are never negative, so a shift and a mask (naga guards a signed
/// division and remainder with several instructions each).
fn packed_place(idx: &str, bits: u32) -> (String, String) {
    let per = 32 / bits;
    (format!("({idx}) >> {}u", per.trailing_zeros()), format!("{bits}u * u32(({idx}) & {}i)", per - 1))
}

/// The store of `value_bits` (a `u32` of at most `bits` bits) as element `idx` of packed buffer `buffer`.
/// Elements sharing a word are each written by one thread: clear ours, then set it, with atomics so a
/// neighbour's is never overwritten.
fn packed_store(buffer: usize, idx: &str, bits: u32, value_bits: &str) -> String {
    let (w, sh) = packed_place(idx, bits);
    let mask = (1u64 << bits) - 1;
    format!(
        "{{ let w = {w}; let sh = {sh}; atomicAnd(&b{buffer}[w], ~({mask}u << sh)); \
         atomicOr(&b{buffer}[w], {value_bits} << sh); }}"
    )
}

impl<'k> Writer<'k> {
    /// The WGSL type values of `d` are computed in.
    fn ty(&self, d: DType) -> &'static str {
        match d {
            DType::F32 | DType::BF16 => "f32",
            DType::F64 => "f64",
            DType::F8E4M3 | DType::F8E5M2 | DType::F8E4M3FNUZ | DType::F8E5M2FNUZ | DType::F4E2M1 => "f32",
            DType::F16 if self.f16 => "f16",
            DType::F16 => "f32",
            DType::I32 | DType::I64 | DType::U8 | DType::I8 | DType::U16 | DType::I16 => "i32",
            DType::I4 | DType::U4 | DType::I2 | DType::U2 => "i32",
            // u64 in its low word, as i64 in i32.
            DType::U32 | DType::U64 => "u32",
            DType::Bool => "bool",
        }
    }

    /// The layout of small float dtype `d` (a `Storage::Minifloat`'s, which `Storage::of` makes only for
    /// a dtype that has one); a render error otherwise.
    fn minifloat(&mut self, d: DType) -> Option<kiln_graph::dtype::Minifloat> {
        let f = d.minifloat();
        if f.is_none() {
            self.fail(format!("{d} stored as a small float"));
        }
        f
    }

    fn fail(&mut self, msg: String) {
        self.error.get_or_insert(msg);
    }

    fn expr(&mut self, e: &Expr) -> String {
        // Inside a vectorised loop the loop variable is lane 0's element: lane `l` reads `i + l`.
        let shifted;
        let e = match self.lane {
            Some((l, i)) if l > 0 && e.symbols().contains(&i) => {
                shifted = e.substitute(&std::collections::BTreeMap::from([(i, Expr::sym(i) + Expr::from(l as i64))]));
                &shifted
            }
            _ => e,
        };
        fn go(w: &mut Writer, t: &ExprTree) -> String {
            match t {
                ExprTree::Const(c) => match i32::try_from(*c) {
                    Ok(c) => int_literal(c),
                    Err(_) => {
                        w.fail(format!("index constant {c} does not fit in i32"));
                        "0i".into()
                    }
                },
                ExprTree::Sym(s) => sym(*s),
                ExprTree::Add(v) => format!("({})", v.iter().map(|x| go(w, x)).collect::<Vec<_>>().join(" + ")),
                ExprTree::Mul(v) => format!("({})", v.iter().map(|x| go(w, x)).collect::<Vec<_>>().join(" * ")),
                // A power-of-two divisor is an arithmetic shift and a mask, floor semantics for any
                // sign; another positive constant divides a dividend the kernel's index ranges prove
                // non-negative as unsigned (a multiply and a shift). Elsewhere `kfloordiv`/`kmod`: a
                // signed division and remainder with floor corrections, which NVIDIA's Vulkan compiler
                // neither folds nor hoists out of a loop (`benches/NOTES.md`, session 44).
                ExprTree::FloorDiv(a, b) | ExprTree::Mod(a, b) => {
                    let div = matches!(t, ExprTree::FloorDiv(..));
                    match **b {
                        ExprTree::Const(k) if k > 0 && k <= 1 << 30 && (k as u64).is_power_of_two() => {
                            if div {
                                format!("({} >> {}u)", go(w, a), k.trailing_zeros())
                            } else {
                                format!("({} & {})", go(w, a), int_literal((k - 1) as i32))
                            }
                        }
                        ExprTree::Const(k) if k > 0 && k <= i64::from(i32::MAX) && w.ranges.fits_u32(a) => {
                            let op = if div { "/" } else { "%" };
                            format!("i32(u32({}) {op} {k}u)", go(w, a))
                        }
                        _ if div => format!("kfloordiv({}, {})", go(w, a), go(w, b)),
                        _ => format!("kmod({}, {})", go(w, a), go(w, b)),
                    }
                }
                ExprTree::Min(a, b) => format!("min({}, {})", go(w, a), go(w, b)),
                ExprTree::Max(a, b) => format!("max({}, {})", go(w, a), go(w, b)),
            }
        }
        go(self, &e.tree())
    }

    /// Converts `x`, a value of dtype `from`, to dtype `to`, rounding to the narrower float types.
    fn convert(&self, x: &str, from: DType, to: DType) -> String {
        if let (Some(f), true) = (to.minifloat(), from != to) {
            let v = if from == DType::F64 { format!("kd2f_odd({x})") } else { self.convert_type(x, from, DType::F32) };
            return format!(
                "kf8_round({v}, {}i, {}i, {}, {}, {}, {})",
                f.mantissa_bits,
                f.emin(),
                float_literal(f.max),
                f.infinities,
                f.unsigned_zero,
                f.nan
            );
        }
        let v = self.convert_type(x, from, to);
        match to.narrow_bits() {
            // Wrapped to the narrow width (`lower` casts every op's result that may leave it).
            Some((bits, signed)) if from != to => {
                if signed {
                    format!("extractBits({v}, 0u, {bits}u)")
                } else {
                    format!("({v} & {}i)", (1u32 << bits) - 1)
                }
            }
            _ => v,
        }
    }

    /// `x` converted to the WGSL type of `to`, rounded to `to` where it is a half type.
    fn convert_type(&self, x: &str, from: DType, to: DType) -> String {
        let (tf, tt) = (self.ty(from), self.ty(to));
        let same_type = if tf == tt { x.to_string() } else { String::new() };
        match (tf, tt) {
            _ if tf == tt => match to {
                DType::F16 if !self.f16 && from != DType::F16 => format!("kround_f16({same_type})"),
                DType::BF16 if from != DType::BF16 => format!("kround_bf16({same_type})"),
                _ => same_type,
            },
            ("bool", "i32") => format!("select(0i, 1i, {x})"),
            ("bool", t) => format!("select({t}(0), {t}(1), {x})"),
            (_, "bool") => format!("({x} != {tf}(0))"),
            ("f32", "i32") => format!("kf2i({x})"),
            ("f16", "i32") => format!("kf2i(f32({x}))"),
            ("f32", "u32") => format!("kf2u({x})"),
            ("f64", "i32") => format!("kd2i({x})"),
            ("f64", "u32") => format!("kd2u({x})"),
            // A half rounds once from f64, as the reference does: through f32 rounded to odd.
            ("f64", "f16") => format!("f16(kd2f_odd({x}))"),
            ("f64", "f32") => match to {
                DType::F16 if !self.f16 => format!("kround_f16(kd2f_odd({x}))"),
                DType::BF16 => format!("kround_bf16(kd2f_odd({x}))"),
                _ => format!("f32({x})"),
            },
            ("f16", "u32") => format!("kf2u(f32({x}))"),
            ("i32", "f32") | ("u32", "f32") | ("f16", "f32") => {
                let v = format!("f32({x})");
                match to {
                    DType::F16 if !self.f16 => format!("kround_f16({v})"),
                    DType::BF16 => format!("kround_bf16({v})"),
                    _ => v,
                }
            }
            (_, t) => format!("{t}({x})"),
        }
    }

    fn var(&self, v: VarId) -> String {
        match self.lane {
            Some((l, _)) if self.lane_vars.contains(&v) => format!("v{}_{l}", v.0),
            _ => format!("v{}", v.0),
        }
    }

    /// The element at `idx` of a buffer bound as vectors.
    fn vector_element(&mut self, buffer: usize, index: &Expr) -> String {
        let w = self.width_of(buffer);
        if let Some((l, i)) = self.lane {
            if *index == Expr::sym(i) {
                return format!("q{buffer}[{l}]");
            }
        }
        let e = self.expr(index);
        format!("b{buffer}[({e}) / {w}i][({e}) % {w}i]")
    }

    /// Elements of one array element of `buffer`: the vectorised loop's width, a row's lanes, or 1.
    fn width_of(&self, buffer: usize) -> i64 {
        if self.row_vectors.contains(&buffer) {
            self.k.row_lanes as i64
        } else if self.vector_buffers.contains(&buffer) {
            self.k.vector_width as i64
        } else {
            1
        }
    }

    fn dtype_of(&self, v: VarId) -> DType {
        self.var_dtype.get(&v).copied().unwrap_or(DType::F32)
    }

    fn load(&mut self, buffer: usize, index: &Expr) -> (String, DType) {
        if self.vector_buffers.contains(&buffer) || self.row_vectors.contains(&buffer) {
            let el = self.vector_element(buffer, index);
            let raw = if self.storage[buffer] == Storage::BoolU32 { format!("({el} != 0u)") } else { el };
            return (raw, self.k.buffers[buffer].dtype);
        }
        let idx = self.expr(index);
        let b = &self.k.buffers[buffer];
        let raw = match self.storage[buffer] {
            Storage::I64Pairs | Storage::U64Pairs => format!("b{buffer}[2i * ({idx})]"),
            Storage::BoolU32 => format!("(b{buffer}[{idx}] != 0u)"),
            Storage::F16Packed => {
                let (w, _) = packed_place(&idx, 16);
                format!("unpack2x16float(b{buffer}[{w}])[({idx}) & 1i]")
            }
            Storage::Bf16Packed => {
                let (w, sh) = packed_place(&idx, 16);
                format!("bitcast<f32>(((b{buffer}[{w}] >> ({sh})) & 0xffffu) << 16u)")
            }
            Storage::NarrowInt { bits, signed } => {
                let (w, sh) = packed_place(&idx, bits);
                let word = format!("b{buffer}[{w}]");
                if signed {
                    format!("extractBits(bitcast<i32>({word}), {sh}, {bits}u)")
                } else {
                    format!("i32(extractBits({word}, {sh}, {bits}u))")
                }
            }
            Storage::Minifloat(d) => {
                let (w, sh) = packed_place(&idx, 8);
                let Some(f) = self.minifloat(d) else { return (String::new(), b.dtype) };
                format!(
                    "kf8_value(extractBits(b{buffer}[{w}], {sh}, 8u), {}u, {}i, {}, {}, {}u, {})",
                    f.mantissa_bits, f.bias, f.infinities, f.unsigned_zero, f.bits, f.nan
                )
            }
            _ => format!("b{buffer}[{idx}]"),
        };
        (raw, b.dtype)
    }

    fn scalar(&mut self, dtype: DType, value: &Scalar) -> String {
        let ty = self.ty(dtype);
        match value {
            Scalar::Const { value } => match ty {
                "f32" => float_literal(*value),
                "f64" => f64_literal(*value),
                "f16" => format!("f16({})", float_literal(*value)),
                "i32" => int_literal((*value as i64).clamp(i32::MIN as i64, i32::MAX as i64) as i32),
                // Wrapped, as the dtype's own rounding does (u32's −1 is its largest value); a u64's low word.
                "u32" => format!("{}u", dtype.round(*value) as u64 as u32),
                _ => (if *value != 0.0 { "true" } else { "false" }).into(),
            },
            Scalar::Load { buffer, index, guard: None } if self.cached_slot(*buffer, dtype, index).is_some() => {
                let k = self.cached_slot(*buffer, dtype, index).unwrap_or_default();
                format!("rc{k}_{}", self.unroll_slot.unwrap_or(0))
            }
            Scalar::Load { buffer, index, guard: None }
                if self.group_lane.is_some() && self.group_loads.contains_key(&(*buffer, index.clone())) =>
            {
                let name = &self.group_loads[&(*buffer, index.clone())];
                let raw = format!("{name}[{}]", self.group_lane.unwrap_or(0));
                self.convert(&raw, self.k.buffers[*buffer].dtype, dtype)
            }
            Scalar::Load { buffer, index, guard } => {
                let (raw, from) = self.load(*buffer, index);
                let v = self.convert(&raw, from, dtype);
                match guard {
                    None => v,
                    Some(g) => {
                        let zero = self.convert("0i", DType::I32, dtype);
                        format!("select({zero}, {v}, {})", self.var(*g))
                    }
                }
            }
            Scalar::Index { expr } => {
                let e = self.expr(expr);
                self.convert(&e, DType::I32, dtype)
            }
            Scalar::Unary { op, a } if ty == "f64" => {
                let x = self.var(*a);
                match op {
                    UnaryOp::Neg => format!("-{x}"),
                    UnaryOp::Abs => format!("abs({x})"),
                    UnaryOp::Sqrt => format!("sqrt({x})"),
                    UnaryOp::Rsqrt => format!("(1.0lf / sqrt({x}))"),
                    UnaryOp::Reciprocal => format!("(1.0lf / {x})"),
                    UnaryOp::Floor => format!("floor({x})"),
                    UnaryOp::Ceil => format!("ceil({x})"),
                    UnaryOp::Round => format!("round({x})"),
                    UnaryOp::Relu => format!("krelud({x})"),
                    op => {
                        self.fail(format!("f64 {op:?} left for the renderer (graph::f64_math writes it out)"));
                        String::new()
                    }
                }
            }
            Scalar::Unary { op, a } => {
                let x = self.var(*a);
                let float = ty == "f32";
                match op {
                    UnaryOp::Neg if ty == "u32" => format!("(0u - {x})"),
                    UnaryOp::Neg => format!("-{x}"),
                    UnaryOp::Abs => format!("abs({x})"),
                    UnaryOp::Exp => format!("exp({x})"),
                    UnaryOp::Log => format!("log({x})"),
                    UnaryOp::Sqrt => format!("sqrt({x})"),
                    UnaryOp::Rsqrt => format!("inverseSqrt({x})"),
                    UnaryOp::Sin => format!("sin({x})"),
                    UnaryOp::Cos => format!("cos({x})"),
                    UnaryOp::Tanh if float => format!("ktanh({x})"),
                    UnaryOp::Tanh => format!("tanh({x})"),
                    UnaryOp::Sigmoid if float => format!("ksigmoid({x})"),
                    UnaryOp::Sigmoid => format!("{ty}(ksigmoid(f32({x})))"),
                    UnaryOp::Erf if float => format!("kerf({x})"),
                    UnaryOp::Erf => format!("{ty}(kerf(f32({x})))"),
                    UnaryOp::Relu if float => format!("krelu({x})"),
                    UnaryOp::Relu => format!("max({x}, {ty}(0))"),
                    UnaryOp::Reciprocal => format!("(1.0 / {x})"),
                    UnaryOp::Floor => format!("floor({x})"),
                    UnaryOp::Ceil => format!("ceil({x})"),
                    UnaryOp::Round => format!("round({x})"),
                    UnaryOp::Not => format!("!{x}"),
                    UnaryOp::IsNan => {
                        let from = self.ty(self.dtype_of(*a));
                        if from == "f64" {
                            format!("kisnand({x})")
                        } else if from == "f32" {
                            format!("kisnan({x})")
                        } else {
                            format!("kisnan(f32({x}))")
                        }
                    }
                }
            }
            Scalar::Binary { op, a, b } => {
                let (x, y) = (self.var(*a), self.var(*b));
                let operand = self.ty(self.dtype_of(*a));
                let float = operand == "f32";
                if operand == "f64" && *op == BinaryOp::Pow {
                    self.fail("an f64 pow left for the renderer (graph::f64_math writes it out)".into());
                }
                match op {
                    BinaryOp::Add => format!("({x} + {y})"),
                    BinaryOp::Sub => format!("({x} - {y})"),
                    BinaryOp::Mul => format!("({x} * {y})"),
                    BinaryOp::Div if operand == "i32" => format!("kfloordiv_i({x}, {y})"),
                    BinaryOp::Div if operand == "u32" => format!("select({x} / {y}, 0u, {y} == 0u)"),
                    BinaryOp::Div => format!("({x} / {y})"),
                    BinaryOp::Pow if float => format!("kpow({x}, {y})"),
                    BinaryOp::Pow if operand == "i32" => format!("kipow({x}, {y})"),
                    BinaryOp::Pow => format!("{operand}(kpow(f32({x}), f32({y})))"),
                    BinaryOp::Max if float => format!("kmaxf({x}, {y})"),
                    BinaryOp::Max if operand == "f64" => format!("kmaxd({x}, {y})"),
                    BinaryOp::Min if operand == "f64" => format!("kmind({x}, {y})"),
                    BinaryOp::Min if float => format!("kminf({x}, {y})"),
                    BinaryOp::Max if operand == "f16" => format!("kmaxh({x}, {y})"),
                    BinaryOp::Min if operand == "f16" => format!("kminh({x}, {y})"),
                    BinaryOp::Max => format!("max({x}, {y})"),
                    BinaryOp::Min => format!("min({x}, {y})"),
                    BinaryOp::Eq => format!("({x} == {y})"),
                    BinaryOp::Ne => format!("({x} != {y})"),
                    BinaryOp::Lt => format!("({x} < {y})"),
                    BinaryOp::Le => format!("({x} <= {y})"),
                    BinaryOp::Gt => format!("({x} > {y})"),
                    BinaryOp::Ge => format!("({x} >= {y})"),
                    BinaryOp::And => format!("({x} && {y})"),
                    BinaryOp::Or => format!("({x} || {y})"),
                    BinaryOp::BitAnd => format!("({x} & {y})"),
                    BinaryOp::BitOr => format!("({x} | {y})"),
                    BinaryOp::BitXor => format!("({x} ^ {y})"),
                    // WGSL takes a shift amount modulo the width: one past it is written out (all bits out,
                    // or the sign for an arithmetic right shift).
                    BinaryOp::Shl => format!("select({x} << u32({y}), {operand}(0), u32({y}) >= 32u)"),
                    BinaryOp::Shr if operand == "u32" => format!("select({x} >> u32({y}), 0u, u32({y}) >= 32u)"),
                    BinaryOp::Shr => format!("({x} >> min(u32({y}), 31u))"),
                }
            }
            Scalar::Select { cond, a, b } => format!("select({}, {}, {})", self.var(*b), self.var(*a), self.var(*cond)),
            Scalar::Cast { a } => self.convert(&self.var(*a), self.dtype_of(*a), dtype),
            // WGSL's own division (2.5 ulp by the spec): a refinement would not make it exact.
            Scalar::Quotient { a, b, .. } => format!("({} / {})", self.var(*a), self.var(*b)),
            Scalar::Bits { op, a, b } => {
                let (x, y) = (format!("bitcast<u32>({})", self.var(*a)), format!("bitcast<u32>({})", self.var(*b)));
                let r = match op {
                    BitOp::Xor => format!("({x} ^ {y})"),
                    BitOp::Add => format!("({x} + {y})"),
                    BitOp::MulLo => format!("({x} * {y})"),
                    BitOp::MulHi => format!("kmulhi_u32({x}, {y})"),
                    BitOp::Shr => format!("({x} >> ({y} & 31u))"),
                };
                format!("bitcast<i32>({r})")
            }
        }
    }

    /// The register array holding this load in a persistent row pass, if any.
    fn cached_slot(&self, buffer: usize, dtype: DType, index: &Expr) -> Option<usize> {
        let key = (buffer, dtype, RowLoad::key(index, self.pass_sym?));
        self.row_cache.get(&key).copied()
    }

    /// Whether persistent rows are active in the row being written.
    fn persistent(&self) -> bool {
        self.k.row_cache.is_some() && !self.row_cache.is_empty()
    }

    /// This thread's element of slot `slot` of a persistent row (`Kernel::row_slot_offset` from slot 0,
    /// `local · row_lanes`).
    fn slot_element(&self, slot: u32) -> String {
        match self.k.row_lanes {
            0 | 1 => format!("local + {}i", self.k.row_slot_offset(slot)),
            lanes => format!("local * {lanes}i + {}i", self.k.row_slot_offset(slot)),
        }
    }

    /// A pass of a persistent row over `s` (statements `body`), unrolled: the body, then `after` at the
    /// same depth, once per slot. In a row with vector buffers (`row_vectors`), slots go a group at a
    /// time: the body's group loads and stores (`Kernel::row_group_accesses`) move once a group, and each
    /// lane reads and fills its component.
    fn persistent_pass(
        &mut self,
        depth: usize,
        s: SymId,
        extent: &Expr,
        body: &[Stmt],
        mut after: impl FnMut(&mut Self, usize),
    ) {
        let i = sym(s);
        let slots = self.k.row_cache.unwrap_or(1);
        let (mut loads, mut stores) = self.k.row_group_accesses(s, body);
        loads.retain(|(b, _, _)| self.row_vectors.contains(b));
        stores.retain(|(b, _)| self.row_vectors.contains(b));
        if loads.is_empty() && stores.is_empty() {
            for slot in 0..slots {
                self.open_slot(depth, &i, extent, slot);
                self.block(depth + 2, body);
                after(self, depth + 2);
                self.close_slot(depth);
            }
            return;
        }
        let lanes = self.k.row_lanes;
        for first in (0..slots).step_by(lanes as usize) {
            // The group opens as its first slot does (a group lies inside the row or past it entirely).
            let g = format!("{i}_g");
            self.open_slot(depth, &g, extent, first);
            let d = depth + 2;
            self.line(d, &format!("let {i}: i32 = {g};"));
            for (b, _, index) in &loads {
                let name = format!("gv{}", self.groups);
                self.groups += 1;
                let e = self.expr(index);
                self.line(d, &format!("let {name} = b{b}[({e}) / {lanes}i];"));
                self.group_loads.insert((*b, index.clone()), name);
            }
            for (b, index) in &stores {
                let name = format!("gv{}", self.groups);
                self.groups += 1;
                let elem = self.storage[*b].wgsl_element();
                self.line(d, &format!("var {name}: vec{lanes}<{elem}>;"));
                self.group_stores.insert((*b, index.clone()), name);
            }
            for lane in 0..lanes {
                self.line(d, "{");
                self.line(d + 1, &format!("let {i}: i32 = {g} + {lane}i;"));
                self.unroll_slot = Some(first + lane);
                self.group_lane = Some(lane);
                self.block(d + 1, body);
                after(self, d + 1);
                self.line(d, "}");
            }
            self.group_lane = None;
            for (b, index) in &stores {
                let name = self.group_stores.remove(&(*b, index.clone())).unwrap_or_default();
                let e = self.expr(index);
                self.line(d, &format!("b{b}[({e}) / {lanes}i] = {name};"));
            }
            self.group_loads.clear();
            self.close_slot(depth);
        }
    }

    /// Opens unrolled copy `slot` of a persistent row pass (its element: [`Writer::slot_element`]), skipped
    /// past the row's end `extent` (untested where `Kernel::slot_inside_row` holds). Closed by
    /// [`Writer::close_slot`].
    fn open_slot(&mut self, depth: usize, j: &str, extent: &Expr, slot: u32) {
        self.line(depth, "{");
        let at = self.slot_element(slot);
        self.line(depth + 1, &format!("let {j}: i32 = {at};"));
        if self.k.slot_inside_row(slot, extent) {
            self.line(depth + 1, "{");
        } else {
            let n = self.expr(extent);
            self.line(depth + 1, &format!("if ({j} < {n}) {{"));
        }
        self.unroll_slot = Some(slot);
    }

    fn close_slot(&mut self, depth: usize) {
        self.unroll_slot = None;
        self.line(depth + 1, "}");
        self.line(depth, "}");
    }

    /// Persistent rows: before the row's passes, every thread loads its elements of the row once into
    /// registers; each pass (reductions, then the epilogue) reads them from there.
    fn fill_row_cache(&mut self, depth: usize, body: &[Stmt]) {
        let Some(slots) = self.k.row_cache else { return };
        for (k, load) in RowLoad::of_row(body).into_iter().enumerate() {
            let ty = self.ty(load.dtype);
            if self.row_vectors.contains(&load.buffer)
                && self.k.row_vector_access(load.buffer, &load.index, ROW_ELEMENT)
            {
                // A vector a slot group, its lanes the group's slots.
                let lanes = self.k.row_lanes;
                let e = self.expr(&load.index);
                for first in (0..slots).step_by(lanes as usize) {
                    let at = e.replace("rowj", &format!("({})", self.slot_element(first)));
                    self.line(depth, &format!("let rv{k}_{first} = b{}[({at}) / {lanes}i];", load.buffer));
                    for lane in 0..lanes {
                        let raw = format!("rv{k}_{first}[{lane}]");
                        let v = self.convert(&raw, self.k.buffers[load.buffer].dtype, load.dtype);
                        self.line(depth, &format!("let rc{k}_{}: {ty} = {v};", first + lane));
                    }
                }
                self.row_cache.insert((load.buffer, load.dtype, load.index), k);
                continue;
            }
            let (raw, from) = self.load(load.buffer, &load.index);
            let v = self.convert(&raw, from, load.dtype);
            // Unrolled into scalars so they stay in registers (an indexed array may go to local memory).
            for slot in 0..slots {
                let at = v.replace("rowj", &format!("({})", self.slot_element(slot)));
                self.line(depth, &format!("let rc{k}_{slot}: {ty} = {at};"));
            }
            self.row_cache.insert((load.buffer, load.dtype, load.index), k);
        }
    }

    fn line(&mut self, depth: usize, text: &str) {
        let _ = writeln!(self.out, "{}{text}", "    ".repeat(depth));
    }

    /// Value `v` (of the buffer's dtype) as a component of one of `buffer`'s stored vectors.
    fn vector_component(&self, buffer: usize, v: String) -> String {
        match self.storage[buffer] {
            Storage::BoolU32 => format!("select(0u, 1u, {v})"),
            Storage::F16 => format!("f16({v})"),
            _ => v,
        }
    }

    fn store(&mut self, depth: usize, buffer: usize, index: &Expr, value: VarId) {
        let from = self.dtype_of(value);
        let to = self.k.buffers[buffer].dtype;
        let v = self.convert(&self.var(value), from, to);
        if let (true, Some((l, i))) = (self.vector_buffers.contains(&buffer), self.lane) {
            if *index == Expr::sym(i) {
                // Collected per lane; the vectorised loop writes the whole vector after the last lane.
                let v = self.vector_component(buffer, v);
                self.line(depth, &format!("let out{buffer}_{l} = {v};"));
                return;
            }
        }
        if let (Some(lane), Some(name)) = (self.group_lane, self.group_stores.get(&(buffer, index.clone()))) {
            let text = format!("{name}[{lane}] = {};", self.vector_component(buffer, v));
            self.line(depth, &text);
            return;
        }
        if self.row_vectors.contains(&buffer) {
            let el = self.vector_element(buffer, index);
            self.line(depth, &format!("{el} = {};", self.vector_component(buffer, v)));
            return;
        }
        let idx = self.expr(index);
        let text = match self.storage[buffer] {
            Storage::I64Pairs => format!(
                "{{ let x = {v}; b{buffer}[2i * ({idx})] = x; b{buffer}[2i * ({idx}) + 1i] = select(0i, -1i, x < 0i); }}"
            ),
            Storage::U64Pairs => format!("{{ b{buffer}[2i * ({idx})] = {v}; b{buffer}[2i * ({idx}) + 1i] = 0u; }}"),
            Storage::BoolU32 => format!("b{buffer}[{idx}] = select(0u, 1u, {v});"),
            Storage::F16 => format!("b{buffer}[{idx}] = f16({v});"),
            Storage::F16Packed => {
                packed_store(buffer, &idx, 16, &format!("(pack2x16float(vec2<f32>({v}, 0.0)) & 0xffffu)"))
            }
            Storage::Bf16Packed => packed_store(buffer, &idx, 16, &format!("(bitcast<u32>(kround_bf16({v})) >> 16u)")),
            Storage::NarrowInt { bits, .. } => {
                packed_store(buffer, &idx, bits, &format!("(u32({v}) & {}u)", (1u32 << bits) - 1))
            }
            Storage::Minifloat(d) => {
                let Some(f) = self.minifloat(d) else { return };
                let bits = format!(
                    "kf8_bits({v}, {}u, {}i, {}, {}, {}u, {}u)",
                    f.mantissa_bits,
                    f.bias,
                    f.infinities,
                    f.unsigned_zero,
                    f.bits,
                    f.nan_code()
                );
                packed_store(buffer, &idx, 8, &bits)
            }
            _ => format!("b{buffer}[{idx}] = {v};"),
        };
        if self.single_thread_stores {
            self.line(depth, &format!("if (local == 0i) {{ {text} }}"));
        } else {
            self.line(depth, &text);
        }
    }

    fn reduce_init(&self, op: KReduceOp, ty: &str) -> String {
        match (op, ty) {
            (KReduceOp::Sum, t) => format!("{t}(0)"),
            (KReduceOp::Max | KReduceOp::ArgMax, "f32") => "(-kinf())".into(),
            (KReduceOp::Min | KReduceOp::ArgMin, "f32") => "kinf()".into(),
            (KReduceOp::Max | KReduceOp::ArgMax, "f64") => "f64(-kinf())".into(),
            (KReduceOp::Min | KReduceOp::ArgMin, "f64") => "f64(kinf())".into(),
            (KReduceOp::Max | KReduceOp::ArgMax, "f16") => "f16(-65504.0)".into(),
            (KReduceOp::Min | KReduceOp::ArgMin, "f16") => "f16(65504.0)".into(),
            (KReduceOp::Max | KReduceOp::ArgMax, "u32") => "0u".into(),
            (KReduceOp::Min | KReduceOp::ArgMin, "u32") => "4294967295u".into(),
            (KReduceOp::Max | KReduceOp::ArgMax, _) => "-2147483647i - 1i".into(),
            (KReduceOp::Min | KReduceOp::ArgMin, _) => "2147483647i".into(),
        }
    }

    fn combine(&self, op: KReduceOp, ty: &str, a: &str, b: &str) -> String {
        let float = ty == "f32";
        match op {
            KReduceOp::Sum => format!("({a} + {b})"),
            KReduceOp::Max if float => format!("kmaxf({a}, {b})"),
            KReduceOp::Min if float => format!("kminf({a}, {b})"),
            KReduceOp::Max if ty == "f64" => format!("kmaxd({a}, {b})"),
            KReduceOp::Min if ty == "f64" => format!("kmind({a}, {b})"),
            KReduceOp::Max => format!("max({a}, {b})"),
            _ => format!("min({a}, {b})"),
        }
    }

    /// True when candidate `(v, i)` beats the current best `(bv, bi)`: NaN wins (first NaN stays), then
    /// the extreme value, then the smaller index.
    fn arg_better(&self, op: KReduceOp, ty: &str, v: &str, i: &str, bv: &str, bi: &str) -> String {
        let (nv, nb) = if ty == "f32" {
            (format!("kisnan({v})"), format!("kisnan({bv})"))
        } else if ty == "f64" {
            (format!("kisnand({v})"), format!("kisnand({bv})"))
        } else {
            ("false".into(), "false".into())
        };
        let cmp = if op == KReduceOp::ArgMax { ">" } else { "<" };
        format!(
            "(({nv} && (!{nb} || {i} < {bi})) || (!{nv} && !{nb} && ({v} {cmp} {bv} || ({v} == {bv} && {i} < {bi}))))"
        )
    }

    fn block(&mut self, depth: usize, body: &[Stmt]) {
        for s in body {
            self.stmt(depth, s);
        }
    }

    fn stmt(&mut self, depth: usize, s: &Stmt) {
        match s {
            Stmt::Let { var, dtype, value } => {
                self.var_dtype.insert(*var, *dtype);
                let rhs = self.scalar(*dtype, value);
                let (ty, name) = (self.ty(*dtype), self.var(*var));
                self.line(depth, &format!("let {name}: {ty} = {rhs};"));
            }
            Stmt::BindIndex { sym: s, var, bound } => {
                let b = self.expr(bound);
                let v = self.convert(&self.var(*var), self.dtype_of(*var), DType::I32);
                self.line(depth, &format!("let {} = clamp({v}, 0i, max({b} - 1i, 0i));", sym(*s)));
            }
            Stmt::Store { buffer, index, value } => self.store(depth, *buffer, index, *value),
            Stmt::Fault { cond, site } => {
                let c = self.var(*cond);
                self.line(depth, &format!("if ({c}) {{ atomicMax(&kfault, {}u); }}", site + 1));
            }
            Stmt::Loop { sym: s, extent, mode: LoopMode::Global, body } if self.k.vector_width > 1 => {
                self.vector_loop(depth, *s, extent, body)
            }
            Stmt::Loop { sym: s, extent, mode: LoopMode::Threads, body } if self.persistent() => {
                let saved = (self.pass_sym, self.single_thread_stores);
                self.pass_sym = Some(*s);
                self.single_thread_stores = false;
                self.persistent_pass(depth, *s, extent, body, |_, _| {});
                (self.pass_sym, self.single_thread_stores) = saved;
            }
            Stmt::Loop { sym: s, extent, mode, body } => {
                let (n, i) = (self.expr(extent), sym(*s));
                let t = self.k.launch.threads;
                let header = match mode {
                    LoopMode::Global => {
                        format!("for (var {i}: i32 = group * {t}i + local; {i} < {n}; {i} = {i} + ngroups * {t}i) {{")
                    }
                    LoopMode::Group => format!("for (var {i}: i32 = group; {i} < {n}; {i} = {i} + ngroups) {{"),
                    LoopMode::Threads => format!("for (var {i}: i32 = local; {i} < {n}; {i} = {i} + {t}i) {{"),
                    LoopMode::Serial => format!("for (var {i}: i32 = 0i; {i} < {n}; {i} = {i} + 1i) {{"),
                };
                self.line(depth, &header);
                if *mode == LoopMode::Group {
                    self.fill_row_cache(depth + 1, body);
                }
                let saved_pass = self.pass_sym;
                let saved = self.single_thread_stores;
                match mode {
                    LoopMode::Group => self.single_thread_stores = true,
                    LoopMode::Threads | LoopMode::Global => self.single_thread_stores = false,
                    LoopMode::Serial => {}
                }
                self.block(depth + 1, body);
                self.single_thread_stores = saved;
                self.pass_sym = saved_pass;
                if *mode == LoopMode::Group {
                    self.row_cache.clear();
                }
                self.line(depth, "}");
            }
            Stmt::Reduce { out, dtype, op, sym: s, extent, strategy, body, value } => {
                self.reduce(depth, *out, *dtype, *op, *s, extent, *strategy, body, *value)
            }
            Stmt::MatMul(m) => self.matmul(depth, m),
            Stmt::Gemm(_) => {
                self.fail("this target has no GEMM library (the kernel should be a matmul template)".into())
            }
            Stmt::Attention(a) => self.attention(depth, a),
            // A browser or Vulkan process is a world of one: `graph` compiles its all-reduces away.
            Stmt::AllReduce(_) => self.fail("this target runs no collectives".into()),
        }
    }

    /// A `Global` loop `vector_width` iterations at a time: one vector load per buffer read at the loop
    /// index, the scalar body once per lane, one vector store per buffer written at the loop index.
    fn vector_loop(&mut self, depth: usize, s: SymId, extent: &Expr, body: &[Stmt]) {
        let w = self.k.vector_width;
        let t = self.k.launch.threads;
        let n = self.expr(extent);
        // The vector's number: what lane bodies ([`Kernel::lane_body`]) index by.
        let iv = sym(builtin::VECTOR_INDEX);
        self.line(
            depth,
            &format!(
                "for (var {iv}: i32 = group * {t}i + local; {iv} < ({n}) / {w}i; {iv} = {iv} + ngroups * {t}i) {{"
            ),
        );
        let d = depth + 1;
        self.line(d, &format!("let {}: i32 = {iv} * {w}i;", sym(s)));
        let at_i = |x: &Expr| *x == Expr::sym(s);
        let mut loaded = std::collections::BTreeSet::new();
        let mut stored = std::collections::BTreeSet::new();
        for st in body {
            match st {
                Stmt::Let { var, value: Scalar::Load { buffer, index, .. }, .. } => {
                    self.lane_vars.insert(*var);
                    if at_i(index) && self.vector_buffers.contains(buffer) {
                        loaded.insert(*buffer);
                    }
                }
                Stmt::Let { var, .. } => {
                    self.lane_vars.insert(*var);
                }
                Stmt::Store { buffer, index, .. } if at_i(index) && self.vector_buffers.contains(buffer) => {
                    stored.insert(*buffer);
                }
                _ => {}
            }
        }
        for b in &loaded {
            self.line(d, &format!("let q{b} = b{b}[{iv}];"));
        }
        let ranges = self.k.index_ranges();
        for l in 0..w {
            let lane = self.k.lane_body(s, body, l, &ranges);
            self.lane = Some((l, s));
            self.block(d, &lane);
        }
        self.lane = None;
        for b in &stored {
            let parts: Vec<String> = (0..w).map(|l| format!("out{b}_{l}")).collect();
            let ty = format!("vec{w}<{}>", self.storage[*b].wgsl_element());
            self.line(d, &format!("b{b}[{iv}] = {ty}({});", parts.join(", ")));
        }
        self.line(depth, "}");
    }

    /// Combines a workgroup's partials as the PTX renderer does (one plan, `graph`'s): butterfly
    /// shuffles inside each subgroup of `s` lanes (the target's subgroup size, fixed on the adapters
    /// `graph` is told it of), then every thread folds the subgroups' totals from workgroup memory — two
    /// barriers, against one per halving step of a shared-memory tree. NaN propagates through `kmaxf` /
    /// `kminf` as in the tree (a subgroup max leaves NaN to the driver). Every thread ends with the total.
    fn subgroup_combine(&mut self, depth: usize, op: KReduceOp, ty: &'static str, acc: &str, s: u32) {
        self.subgroups = true;
        let mut offset = s / 2;
        while offset > 0 {
            let c = self.combine(op, ty, acc, &format!("subgroupShuffleXor({acc}, {offset}u)"));
            self.line(depth, &format!("{acc} = {c};"));
            offset /= 2;
        }
        let t = self.k.launch.threads;
        if t <= s || self.k.launch.packed > 1 {
            // One subgroup a group: every lane holds the total (and packed groups must not meet at a
            // barrier).
            return;
        }
        let red = format!("red_{ty}");
        self.red_types.insert(ty);
        self.line(depth, &format!("if (sg_lane == 0u) {{ {red}[sg_id] = {acc}; }}"));
        self.line(depth, "workgroupBarrier();");
        self.line(depth, &format!("{acc} = {red}[0];"));
        for w in 1..t / s {
            let c = self.combine(op, ty, acc, &format!("{red}[{w}]"));
            self.line(depth, &format!("{acc} = {c};"));
        }
        // Nobody may overwrite the totals before every thread has read them.
        self.line(depth, "workgroupBarrier();");
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &mut self,
        depth: usize,
        out: VarId,
        dtype: DType,
        op: KReduceOp,
        s: SymId,
        extent: &Expr,
        strategy: ReduceStrategy,
        body: &[Stmt],
        value: VarId,
    ) {
        let ty = self.ty(dtype);
        let (n, j) = (self.expr(extent), sym(s));
        let t = self.k.launch.threads;
        let arg = matches!(op, KReduceOp::ArgMax | KReduceOp::ArgMin);
        let acc = format!("acc{}", out.0);
        let idx = format!("idx{}", out.0);
        let init = self.reduce_init(op, ty);
        self.line(depth, &format!("var {acc}: {ty} = {init};"));
        if arg {
            self.line(depth, &format!("var {idx}: i32 = 2147483647i;"));
        }
        let grouped = matches!(strategy, ReduceStrategy::Group { .. });
        let persistent = grouped && self.persistent();
        let saved = (self.single_thread_stores, self.pass_sym);
        self.single_thread_stores = false;
        if persistent {
            self.pass_sym = Some(s);
        }
        let step = |w: &mut Self, inner: usize| {
            let v = w.convert(&w.var(value), w.dtype_of(value), dtype);
            if arg {
                let better = w.arg_better(op, ty, "cand", &j, &acc, &idx);
                w.line(inner, &format!("let cand: {ty} = {v};"));
                w.line(inner, &format!("if {better} {{ {acc} = cand; {idx} = {j}; }}"));
            } else {
                let c = w.combine(op, ty, &acc, &v);
                w.line(inner, &format!("{acc} = {c};"));
            }
        };
        if persistent {
            self.persistent_pass(depth, s, extent, body, step);
        } else {
            if grouped {
                self.line(depth, &format!("for (var {j}: i32 = local; {j} < {n}; {j} = {j} + {t}i) {{"));
            } else {
                self.line(depth, &format!("for (var {j}: i32 = 0i; {j} < {n}; {j} = {j} + 1i) {{"));
            }
            self.block(depth + 1, body);
            step(self, depth + 1);
            self.line(depth, "}");
        }
        (self.single_thread_stores, self.pass_sym) = saved;
        if let ReduceStrategy::Group { subgroup: Some(s) } = strategy {
            self.subgroup_combine(depth, op, ty, &acc, s);
        } else if grouped && self.k.launch.packed > 1 {
            self.fail(format!("a {ty} reduction of packed groups: they combine by subgroup shuffles only"));
        } else if grouped {
            let red = format!("red_{ty}");
            self.red_types.insert(ty);
            self.line(depth, &format!("{red}[local] = {acc};"));
            if arg {
                self.red_types.insert("idx");
                self.line(depth, &format!("red_idx[local] = {idx};"));
            }
            self.line(depth, "workgroupBarrier();");
            self.line(depth, &format!("for (var stride: i32 = {}i; stride > 0i; stride = stride / 2i) {{", t / 2));
            self.line(depth + 1, "if (local < stride) {");
            if arg {
                let better = self.arg_better(
                    op,
                    ty,
                    &format!("{red}[local + stride]"),
                    "red_idx[local + stride]",
                    &format!("{red}[local]"),
                    "red_idx[local]",
                );
                self.line(
                    depth + 2,
                    &format!("if {better} {{ {red}[local] = {red}[local + stride]; red_idx[local] = red_idx[local + stride]; }}"),
                );
            } else {
                let c = self.combine(op, ty, &format!("{red}[local]"), &format!("{red}[local + stride]"));
                self.line(depth + 2, &format!("{red}[local] = {c};"));
            }
            self.line(depth + 1, "}");
            self.line(depth + 1, "workgroupBarrier();");
            self.line(depth, "}");
            self.line(depth, &format!("{acc} = {red}[0];"));
            if arg {
                self.line(depth, &format!("{idx} = red_idx[0];"));
            }
            self.line(depth, "workgroupBarrier();");
        }
        if arg {
            self.var_dtype.insert(out, DType::I64);
            self.line(depth, &format!("let v{}: i32 = {idx};", out.0));
        } else {
            self.var_dtype.insert(out, dtype);
            self.line(depth, &format!("let v{}: {ty} = {acc};", out.0));
        }
    }

    /// The matmul template, as its [`kiln_graph::kernel::Tile`] schedules it: each workgroup owns a
    /// `tile.m × tile.n` block of one batch entry's output (a grid-stride loop over blocks) and each
    /// thread the runs of rows and columns the tile gives it, its sums in registers (`run`-wide vectors).
    /// Every step of depth `tile.k`, the threads read the next A and B tiles through the operand code
    /// (transposes, head splits and broadcast batches are index expressions, not copies) into registers
    /// while the previous step's tiles, in workgroup memory, are multiplied; the fused epilogue runs on
    /// each finished element.
    fn matmul(&mut self, depth: usize, m: &MatMul) {
        let [b, i, j, p] = m.syms.map(sym);
        let (bn, mm, nn, kk) = (self.expr(&m.batch), self.expr(&m.m), self.expr(&m.n), self.expr(&m.k));
        let t = self.k.launch.threads;
        if let Some(why) = m.tile.unfit(t) {
            self.fail(format!("matmul schedule: {why}"));
            return;
        }
        let t = i64::from(t);
        let (tm, tn, tk) = (i64::from(m.tile.m), i64::from(m.tile.n), i64::from(m.tile.k));
        let [rows, cols] = m.tile.threads.map(i64::from);
        let run = i64::from(m.tile.run);
        let [rm, rn] = m.tile.per_thread().map(i64::from);
        let acc_ty = self.ty(m.acc_dtype);
        let vty = if run == 1 { acc_ty.to_string() } else { format!("vec{run}<{acc_ty}>") };
        let (sa, sb) = (i64::from(m.tile.a_stride()), i64::from(m.tile.b_stride()));
        let stages = i64::from(m.tile.stages.max(1));
        self.mm_tiles = Some((sa * tk / run * stages, sb * tk / run * stages, vty.clone()));
        // With two stages, step `s` stores and multiplies the tiles at `mm_sa`/`mm_sb` (in vectors):
        // the first or second half of workgroup memory as `s` is even or odd.
        let (stage_a, stage_b) = if stages > 1 { ("mm_sa + ", "mm_sb + ") } else { ("", "") };
        // Elements of each operand's tile a thread reads a step, in slots of registers.
        let [slots_a, slots_b] = m.tile.slots(self.k.launch.threads).map(i64::from);
        // Workgroup memory is written as `run`-wide vectors, a component at a time.
        let at = |stage: &str, x: &str| {
            if run == 1 {
                format!("[{stage}{x}]")
            } else {
                format!("[{stage}({x}) / {run}i][({x}) % {run}i]")
            }
        };
        // Slot `q` of operand `side` (0: A, 1: B): its depth and its row (A) or column (B) within the
        // step's tile, in the order `Tile::depth_fastest` reads it, and its place in workgroup memory
        // (tiles stored [depth][row or column], padded: `Tile::a_stride`, `Tile::b_stride`). Where the
        // slots walk the tile evenly (`Tile::slot_step`), from the thread's first element, computed
        // once (`mm_ad`, `mm_ao`, `mm_aw` and its vector and component `mm_av`, `mm_ac`); else from the
        // slot's element `mm_e`.
        let steps = [0, 1].map(|side| m.tile.slot_step(side, self.k.launch.threads));
        let slot = |side: usize, q: i64, stage: &str| -> (String, String, String) {
            let (x, outer, stride) = if side == 0 { ("a", tm, sa) } else { ("b", tn, sb) };
            match steps[side] {
                Some([dd, step_other]) => {
                    let (dd, step_other) = (i64::from(dd), i64::from(step_other));
                    let c = q * (dd * stride + step_other);
                    let store = if run == 1 {
                        format!("[{stage}mm_{x}w + {c}i]")
                    } else if c % run == 0 {
                        format!("[{stage}mm_{x}v + {}i][mm_{x}c]", c / run)
                    } else {
                        at(stage, &format!("mm_{x}w + {c}i"))
                    };
                    (format!("mm_{x}d + {}i", q * dd), format!("mm_{x}o + {}i", q * step_other), store)
                }
                None => {
                    let (depth, other) = if m.tile.depth_fastest[side] {
                        (format!("mm_e % {tk}i"), format!("mm_e / {tk}i"))
                    } else {
                        (format!("mm_e / {outer}i"), format!("mm_e % {outer}i"))
                    };
                    let store = at(stage, &format!("({depth}) * {stride}i + {other}"));
                    (depth, other, store)
                }
            }
        };
        for (side, (x, outer, stride)) in [("a", tm, sa), ("b", tn, sb)].into_iter().enumerate() {
            if steps[side].is_none() {
                continue;
            }
            let (first_depth, first_other) = if m.tile.depth_fastest[side] {
                (format!("local % {tk}i"), format!("local / {tk}i"))
            } else {
                (format!("local / {outer}i"), format!("local % {outer}i"))
            };
            self.line(depth, &format!("let mm_{x}d: i32 = {first_depth};"));
            self.line(depth, &format!("let mm_{x}o: i32 = {first_other};"));
            self.line(depth, &format!("let mm_{x}w: i32 = mm_{x}d * {stride}i + mm_{x}o;"));
            if run > 1 {
                self.line(depth, &format!("let mm_{x}v: i32 = mm_{x}w / {run}i;"));
                self.line(depth, &format!("let mm_{x}c: i32 = mm_{x}w % {run}i;"));
            }
        }
        let d = depth + 1;
        self.line(depth, &format!("let mm_tiles_m: i32 = ({mm} + {}i) / {tm}i;", tm - 1));
        self.line(depth, &format!("let mm_tiles_n: i32 = ({nn} + {}i) / {tn}i;", tn - 1));
        self.line(depth, &format!("let mm_blocks: i32 = {bn} * mm_tiles_m * mm_tiles_n;"));
        self.line(depth, &format!("let mm_steps: i32 = ({kk} + {}i) / {tk}i;", tk - 1));
        self.line(depth, &format!("let mm_tx: i32 = local % {cols}i;"));
        self.line(depth, &format!("let mm_ty: i32 = local / {cols}i;"));
        self.line(depth, "for (var mm_blk: i32 = group; mm_blk < mm_blocks; mm_blk = mm_blk + ngroups) {");
        self.line(d, &format!("let {b}: i32 = mm_blk / (mm_tiles_m * mm_tiles_n);"));
        self.line(d, &format!("let mm_row0: i32 = ((mm_blk / mm_tiles_n) % mm_tiles_m) * {tm}i;"));
        self.line(d, &format!("let mm_col0: i32 = (mm_blk % mm_tiles_n) * {tn}i;"));
        for r in 0..rm {
            for g in 0..rn / run {
                self.line(d, &format!("var mm_acc_{r}_{g}: {vty} = {vty}(0);"));
            }
        }
        // One register a slot, each slot's code written out: an array indexed in a loop may be left in
        // local memory by a driver's compiler.
        for (slots, name) in [(slots_a, "a"), (slots_b, "b")] {
            for q in 0..slots {
                self.line(d, &format!("var mm_r{name}{q}: {acc_ty};"));
            }
        }
        if stages > 1 {
            // The previous block's last step may still be multiplying the tiles this block's first
            // step overwrites.
            self.line(d, "workgroupBarrier();");
        }
        // Step s stores the tiles read in step s - 1, reads step s's, and multiplies step s - 1's: the
        // reads are in flight while the multiply runs. One more step than the depth has, to finish.
        // With one stage a barrier keeps the stores from the previous step's multiply; with two, the
        // previous step multiplied the other half.
        self.line(d, "for (var mm_s: i32 = 0i; mm_s <= mm_steps; mm_s = mm_s + 1i) {");
        let e = d + 1;
        if stages > 1 {
            self.line(e, &format!("let mm_sa: i32 = (mm_s & 1i) * {}i;", sa * tk / run));
            self.line(e, &format!("let mm_sb: i32 = (mm_s & 1i) * {}i;", sb * tk / run));
        }
        self.line(e, "if (mm_s > 0i) {");
        if stages == 1 {
            self.line(e + 1, "workgroupBarrier();");
        }
        for (side, (slots, len, name, stage)) in
            [(slots_a, tm * tk, "a", stage_a), (slots_b, tk * tn, "b", stage_b)].into_iter().enumerate()
        {
            for q in 0..slots {
                self.line(e + 1, "{");
                self.line(e + 2, &format!("let mm_e: i32 = local + {}i;", q * t));
                let guard = if slots * t > len { format!("if (mm_e < {len}i) ") } else { String::new() };
                let (_, _, store) = slot(side, q, stage);
                self.line(e + 2, &format!("{guard}{{ mm_{name}s{store} = mm_r{name}{q}; }}"));
                self.line(e + 1, "}");
            }
        }
        self.line(e + 1, "workgroupBarrier();");
        self.line(e, "}");
        self.line(e, "if (mm_s < mm_steps) {");
        self.line(e + 1, &format!("let mm_k0: i32 = mm_s * {tk}i;"));
        // A tile: tm rows × tk depths, stored [depth][row] (padded: `Tile::a_stride`); B tile: tk depths × tn
        // columns, [depth][column] (`Tile::b_stride`).
        // Bounds every element passes (`MatMul::whole_tiles`) are not checked.
        let [rows_whole, cols_whole, depth_whole] = m.whole_tiles();
        let bound = |whole: bool, x: &str, n: &str| (!whole).then(|| format!("{x} < {n}"));
        for (slots, len, name) in [(slots_a, tm * tk, "a"), (slots_b, tk * tn, "b")] {
            let f = e + 2;
            for q in 0..slots {
                self.line(e + 1, "{");
                self.line(f, &format!("let mm_e: i32 = local + {}i;", q * t));
                let (operand, mut checks) = if name == "a" {
                    let (a_depth, a_row, _) = slot(0, q, "");
                    self.line(f, &format!("let {i}: i32 = mm_row0 + {a_row};"));
                    self.line(f, &format!("let {p}: i32 = mm_k0 + {a_depth};"));
                    (&m.a, vec![bound(rows_whole, &i, &mm), bound(depth_whole, &p, &kk)])
                } else {
                    let (b_depth, b_col, _) = slot(1, q, "");
                    self.line(f, &format!("let {p}: i32 = mm_k0 + {b_depth};"));
                    self.line(f, &format!("let {j}: i32 = mm_col0 + {b_col};"));
                    (&m.b, vec![bound(depth_whole, &p, &kk), bound(cols_whole, &j, &nn)])
                };
                if slots * t > len {
                    checks.insert(0, Some(format!("mm_e < {len}i")));
                }
                // Checked, the element is read inside an `if` (zero outside the product); else directly.
                let checks: Vec<String> = checks.into_iter().flatten().collect();
                let (inner, dest) = if checks.is_empty() {
                    (f, format!("mm_r{name}{q}"))
                } else {
                    self.line(f, &format!("var mm_v: {acc_ty} = {acc_ty}(0);"));
                    self.line(f, &format!("if ({}) {{", checks.join(" && ")));
                    (f + 1, "mm_v".to_string())
                };
                self.block(inner, &operand.body);
                let v = self.convert(&self.var(operand.value), self.dtype_of(operand.value), m.acc_dtype);
                self.line(inner, &format!("{dest} = {v};"));
                if !checks.is_empty() {
                    self.line(f, "}");
                    self.line(f, &format!("mm_r{name}{q} = mm_v;"));
                }
                self.line(e + 1, "}");
            }
        }
        self.line(e, "}");
        self.line(e, "if (mm_s > 0i) {");
        for step in 0..tk {
            for g in 0..rm / run {
                let x = step * (sa / run) + g * rows;
                self.line(e + 1, &format!("let mm_a{step}_{g}: {vty} = mm_as[{stage_a}{x}i + mm_ty];"));
            }
            for g in 0..rn / run {
                let x = step * (sb / run) + g * cols;
                self.line(e + 1, &format!("let mm_b{step}_{g}: {vty} = mm_bs[{stage_b}{x}i + mm_tx];"));
            }
            for r in 0..rm {
                let a =
                    if run == 1 { format!("mm_a{step}_{r}") } else { format!("mm_a{step}_{}[{}]", r / run, r % run) };
                for g in 0..rn / run {
                    self.line(e + 1, &format!("mm_acc_{r}_{g} = mm_acc_{r}_{g} + {a} * mm_b{step}_{g};"));
                }
            }
        }
        self.line(e, "}");
        self.line(d, "}");
        self.var_dtype.insert(m.acc, m.acc_dtype);
        let saved = self.single_thread_stores;
        self.single_thread_stores = false;
        for r in 0..rm {
            for c in 0..rn {
                let (g, lane) = (c / run, c % run);
                let row = format!("mm_row0 + mm_ty * {run}i + {}i", m.tile.owned(0, r as u32));
                let col = format!("mm_col0 + mm_tx * {run}i + {}i", m.tile.owned(1, c as u32));
                let acc = if run == 1 { format!("mm_acc_{r}_{g}") } else { format!("mm_acc_{r}_{g}[{lane}]") };
                self.line(d, "{");
                self.line(d + 1, &format!("let {i}: i32 = {row};"));
                self.line(d + 1, &format!("let {j}: i32 = {col};"));
                let checks: Vec<String> =
                    [bound(rows_whole, &i, &mm), bound(cols_whole, &j, &nn)].into_iter().flatten().collect();
                let inner = if checks.is_empty() { d + 1 } else { d + 2 };
                if !checks.is_empty() {
                    self.line(d + 1, &format!("if ({}) {{", checks.join(" && ")));
                }
                self.line(inner, &format!("let v{}: {acc_ty} = {acc};", m.acc.0));
                self.block(inner, &m.epilogue);
                if !checks.is_empty() {
                    self.line(d + 1, "}");
                }
                self.line(d, "}");
            }
        }
        self.single_thread_stores = saved;
        self.line(depth, "}");
    }
}

fn sym(s: SymId) -> String {
    if s == ROW_ELEMENT {
        "rowj".into()
    } else if s == builtin::VECTOR_INDEX {
        "vector".into()
    } else if s.0 >= builtin::FIRST_LOCAL {
        match s.0 - builtin::FIRST_LOCAL {
            // `i32` names WGSL's type, and `i8`, `i16`, `i64` are reserved words.
            n @ (8 | 16 | 32 | 64) => format!("i{n}_"),
            n => format!("i{n}"),
        }
    } else {
        format!("sizes.s{}", s.0)
    }
}

/// The binding of a kernel's fault word (when it has checks): after the buffers and the symbol block.
pub fn fault_binding(kernel: &Kernel) -> u32 {
    kernel.buffers.len() as u32 + 1
}

/// The buffers a row with lanes binds as arrays of vectors (see `Writer::row_vectors`): those
/// `Kernel::row_vector_buffers` names, where WGSL has the vector (two or four lanes: eight bf16 lanes,
/// CUDA's, print a slot at a time) and the storage holds one element a word (f32, f16, i32; not packed
/// halves, which a compile report may print for a CUDA plan).
fn row_vector_buffers(kernel: &Kernel, storage: &[Storage]) -> std::collections::HashSet<usize> {
    if !matches!(kernel.row_lanes, 2 | 4) {
        return Default::default();
    }
    let word = |b: &usize| matches!(storage[*b], Storage::F32 | Storage::F16 | Storage::I32 | Storage::U32);
    kernel.row_vector_buffers().into_iter().filter(word).collect()
}

impl<'k> Writer<'k> {
    /// A writer of `k`'s code (a whole kernel, or one part of a combined kernel) over buffers stored as
    /// `storage`.
    fn new(k: &'k Kernel, f16: bool, storage: &[Storage]) -> Writer<'k> {
        Writer {
            k,
            f16,
            out: String::new(),
            var_dtype: HashMap::new(),
            storage: storage.to_vec(),
            single_thread_stores: false,
            red_types: Default::default(),
            mm_tiles: None,
            ranges: k.index_ranges(),
            attention_arrays: Vec::new(),
            attention_vec4: Default::default(),
            error: None,
            lane: None,
            lane_vars: Default::default(),
            row_cache: HashMap::new(),
            unroll_slot: None,
            pass_sym: None,
            vector_buffers: k.vector_buffers().into_iter().collect(),
            row_vectors: row_vector_buffers(k, storage),
            group_lane: None,
            group_loads: HashMap::new(),
            group_stores: HashMap::new(),
            groups: 0,
            subgroups: false,
        }
    }

    /// A combined kernel's part on workgroups `start ..` (its own launch's count of them), written as a
    /// block only those workgroups enter, where `group` and `ngroups` are the part's own (its loops start
    /// and stride as in a launch of its own); the caller closes the block.
    fn enter_part(&mut self, start: &Expr) {
        let (from, groups) = (self.expr(start), self.expr(&self.k.launch.groups));
        self.line(1, &format!("if (kgroup >= {from} && kgroup < {from} + {groups}) {{"));
        self.line(2, &format!("let group = kgroup - {from};"));
        self.line(2, &format!("let ngroups = {groups};"));
    }

    /// The element width of each buffer this writer's code moves as vectors.
    fn vector_widths(&self) -> impl Iterator<Item = (usize, i64)> + '_ {
        self.vector_buffers.iter().chain(&self.row_vectors).map(|&b| (b, self.width_of(b)))
    }
}

/// Renders `kernel` to WGSL for a device with (`f16`) or without native f16. A combined kernel's parts
/// are written one after another, each in a block its workgroups enter.
pub fn render(kernel: &Kernel, f16: bool) -> Result<Shader, RenderError> {
    let storage: Vec<Storage> = kernel.buffers.iter().map(|b| Storage::of(b.dtype, f16)).collect();
    let mut w = Writer::new(kernel, f16, &storage);
    let packed = kernel.launch.packed.max(1);
    w.block(1, &kernel.body);
    w.subgroups |= packed > 1;
    if let Some(msg) = w.error.take() {
        return Err(RenderError { kernel: kernel.name.clone(), msg });
    }
    let mut widths: HashMap<usize, i64> = w.vector_widths().collect();
    for (part, start) in kernel.parts.iter().zip(&kernel.part_offsets()) {
        let mut p = Writer::new(part, f16, &storage);
        p.enter_part(start);
        p.block(2, &part.body);
        p.line(1, "}");
        if let Some(msg) = p.error {
            return Err(RenderError { kernel: kernel.name.clone(), msg: format!("part {}: {msg}", part.name) });
        }
        widths.extend(p.vector_widths());
        w.out.push_str(&p.out);
        w.red_types.extend(p.red_types);
        w.subgroups |= p.subgroups;
    }
    // A combined kernel's parts name their own `group` and `ngroups` from the launch's workgroup.
    let combined = !kernel.parts.is_empty();
    let group = if combined { "kgroup" } else { "group" };
    let mut src = String::new();
    if f16 {
        src.push_str("enable f16;\n\n");
    }
    let _ = writeln!(src, "// {}: generated by kiln from the kernel IR.", kernel.name);
    for (i, (b, st)) in kernel.buffers.iter().zip(&storage).enumerate() {
        let access = if b.access == Access::Read { "read" } else { "read_write" };
        let packed = st.shares_words();
        let elem = if w.attention_vec4.contains(&i) {
            "vec4<f32>".to_string()
        } else if let Some(n) = widths.get(&i) {
            format!("vec{n}<{}>", st.wgsl_element())
        } else if packed && b.access == Access::Write {
            "atomic<u32>".to_string()
        } else {
            st.wgsl_element().to_string()
        };
        let _ = writeln!(src, "@group(0) @binding({i}) var<storage, {access}> b{i}: array<{elem}>;");
    }
    let uses_symbols = !kernel.symbols.is_empty();
    if uses_symbols {
        let fields: Vec<String> = kernel.symbols.iter().map(|s| format!("s{}: i32", s.0)).collect();
        let _ = writeln!(src, "struct Sizes {{ {} }}", fields.join(", "));
        let _ = writeln!(src, "@group(0) @binding({}) var<uniform> sizes: Sizes;", kernel.buffers.len());
    }
    if !kernel.faults.is_empty() {
        // The fault word (kernel IR `Fault`): its binding follows the symbol block's slot.
        let _ = writeln!(
            src,
            "@group(0) @binding({}) var<storage, read_write> kfault: atomic<u32>;",
            fault_binding(kernel)
        );
    }
    let t = kernel.launch.threads;
    let device_threads = kernel.launch.device_threads();
    if let Some((a, b, ty)) = &w.mm_tiles {
        let _ = writeln!(src, "var<workgroup> mm_as: array<{ty}, {a}>;");
        let _ = writeln!(src, "var<workgroup> mm_bs: array<{ty}, {b}>;");
    }
    for (name, len) in &w.attention_arrays {
        let _ = writeln!(src, "var<workgroup> {name}: array<vec4<f32>, {len}>;");
    }
    for ty in &w.red_types {
        let elem = if *ty == "idx" { "i32" } else { ty };
        let _ = writeln!(src, "var<workgroup> red_{ty}: array<{elem}, {t}>;");
    }
    src.push('\n');
    src.push_str(PRELUDE);
    if w.out.contains("kf8_") {
        src.push('\n');
        src.push_str(PRELUDE_F8);
    }
    if w.out.contains("kmaxh(") || w.out.contains("kminh(") {
        src.push('\n');
        src.push_str(PRELUDE_F16);
    }
    if F64_HELPERS.iter().any(|h| w.out.contains(h)) {
        src.push('\n');
        src.push_str(PRELUDE_F64);
    }
    src.push('\n');
    src.push_str(&approximations());
    let _ = writeln!(src, "\n@compute @workgroup_size({device_threads})");
    // Subgroup builtins (no `enable` directive: naga has not implemented `enable subgroups;` and gates
    // them on the device's subgroup feature instead).
    let builtins = if w.subgroups {
        ", @builtin(subgroup_invocation_id) sg_lane: u32, @builtin(subgroup_id) sg_id: u32"
    } else {
        ""
    };
    let _ = writeln!(
        src,
        "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, \
         @builtin(local_invocation_index) lid: u32{builtins}) {{"
    );
    if packed > 1 {
        // Packed groups (`Launch::packed`): the kernel IR's group is a subgroup of the device workgroup,
        // its threads the subgroup's lanes (`graph` packs only where the subgroup size is fixed and is
        // the group's thread count).
        let _ = writeln!(
            src,
            "    let {group} = i32((wid.x + wid.y * nwg.x + wid.z * nwg.x * nwg.y) * {packed}u + sg_id);"
        );
        if !combined {
            let _ = writeln!(src, "    let ngroups = i32(nwg.x * nwg.y * nwg.z * {packed}u);");
        }
        src.push_str("    let local = i32(sg_lane);\n");
    } else {
        let _ = writeln!(src, "    let {group} = i32(wid.x + wid.y * nwg.x + wid.z * nwg.x * nwg.y);");
        if !combined {
            src.push_str("    let ngroups = i32(nwg.x * nwg.y * nwg.z);\n");
        }
        src.push_str("    let local = i32(lid);\n");
    }
    src.push_str(&w.out);
    src.push_str("}\n");
    Ok(Shader { name: kernel.name.clone(), source: src, storage, uses_symbols })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Browsers' WGSL compiler (Tint) rejects a constant expression whose value is NaN or infinite, which
    /// naga accepts: non-finite constants must be made at run time (the prelude's `knan`, `kinf`).
    #[test]
    fn non_finite_constants_are_not_constant_expressions() {
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let text = float_literal(v);
            assert!(!text.contains("bitcast"), "{v}: {text}");
            assert!(text.contains("knan()") || text.contains("kinf()"), "{v}: {text}");
        }
        assert_eq!(float_literal(1.5), "1.5f");
        // The prelude builds them through a function call, never `bitcast<f32>(<literal>)`.
        let literal_bitcast = [PRELUDE, PRELUDE_F8, PRELUDE_F16]
            .iter()
            .flat_map(|p| p.lines())
            .filter(|l| !l.trim_start().starts_with("//"))
            .any(|l| l.contains("bitcast<f32>(0x"));
        assert!(!literal_bitcast, "the prelude bitcasts a literal");
    }

    /// A kernel's 33rd local index was named `i32`, which WGSL reads as the type (a resize with 32
    /// antialiasing taps failed naga's validation).
    #[test]
    fn local_indices_never_take_a_type_or_reserved_name() {
        for n in 0..100 {
            let name = sym(SymId(builtin::FIRST_LOCAL + n));
            assert!(!["i8", "i16", "i32", "i64"].contains(&name.as_str()), "{name}");
        }
        assert_eq!(sym(SymId(builtin::FIRST_LOCAL + 3)), "i3");
    }
}
