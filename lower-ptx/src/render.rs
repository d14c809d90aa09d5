//! Kernel IR → PTX. A printer, like the WGSL one: typed virtual registers, predicated bounds and guards,
//! loops as labelled branches, workgroup reductions through shared memory and `bar.sync`. Floats are
//! computed in f32 (halves are converted on load and rounded on store); transcendental functions use the
//! hardware's approximate instructions only where their error is far inside kiln's tolerance (`ex2`,
//! `lg2` with range-safe scaling); erf and tanh are written out.
//!
//! Persistent rows keep each thread's elements in registers across the row's passes (the loads
//! `RowLoad::of_row` names); workgroup reductions shuffle inside warps before crossing them through
//! shared memory.

use kiln_graph::approx;
use kiln_graph::dtype::{DType, Minifloat};
use kiln_graph::ir::{BinaryOp, UnaryOp};
use kiln_graph::kernel::{
    Access, BitOp, KReduceOp, Kernel, LoopMode, MatMul, ReduceStrategy, RowLoad, Scalar, Stmt, VarId, ROW_ELEMENT,
};
use kiln_graph::sym::{Expr, ExprTree, SymId};
use std::collections::HashMap;
use std::fmt::Write;

pub use kiln_graph::kernel::RenderError;

mod attention;
mod attention_grad;
mod attention_registers;

/// A rendered kernel.
#[derive(Clone, Debug)]
pub struct PtxKernel {
    /// Entry point (the kernel's name).
    pub name: String,
    /// The PTX module text.
    pub source: String,
    /// Compute capability it targets (e.g. 90).
    pub sm: u32,
}

/// The register type values of a dtype are computed in.
fn reg_type(d: DType) -> &'static str {
    match d {
        DType::F32
        | DType::F16
        | DType::BF16
        | DType::F8E4M3
        | DType::F8E5M2
        | DType::F8E4M3FNUZ
        | DType::F8E5M2FNUZ
        | DType::F4E2M1 => "f32",
        DType::I32 | DType::U8 | DType::I8 | DType::U16 | DType::I16 => "s32",
        DType::I4 | DType::U4 | DType::I2 | DType::U2 => "s32",
        DType::F64 => "f64",
        DType::I64 => "s64",
        DType::U32 => "u32",
        DType::U64 => "u64",
        DType::Bool => "pred",
    }
}

/// The memory type of a narrow integer (`ld`/`st`/`cvt` take a 32-bit register beside it: loads
/// zero- or sign-extend, stores and conversions keep the low bits). The 2- and 4-bit integers are held a
/// byte each, sign-extended where signed.
fn narrow_type(d: DType) -> Option<&'static str> {
    match d {
        DType::U8 | DType::U4 | DType::U2 => Some("u8"),
        DType::I8 | DType::I4 | DType::I2 => Some("s8"),
        DType::U16 => Some("u16"),
        DType::I16 => Some("s16"),
        _ => None,
    }
}

fn f32_imm(v: f64) -> String {
    format!("0f{:08X}", (v as f32).to_bits())
}

fn f64_imm(v: f64) -> String {
    format!("0d{:016X}", v.to_bits())
}

/// A thread's first register slot of a matmul operand tile whose slots walk it evenly
/// (`Tile::slot_step`): the walk between slots and the first slot's registers, computed once a kernel.
struct FirstSlot {
    /// Depth and row-or-column steps from one slot to the next.
    walk: [u32; 2],
    /// The first slot's depth within a step's tile.
    depth: String,
    /// The first slot's row (A) or column (B) within the tile.
    other: String,
    /// The first slot's shared-memory address in the first stage.
    at: String,
}

struct Writer<'k> {
    k: &'k Kernel,
    body: String,
    decls: Vec<String>,
    next: usize,
    vars: HashMap<VarId, (String, DType)>,
    syms: HashMap<SymId, String>,
    single_thread_stores: bool,
    shared: std::collections::BTreeSet<&'static str>,
    error: Option<String>,
    /// Persistent rows: each kept load's register per unrolled slot (see `RowLoad`).
    row_cache: HashMap<(usize, DType, Expr), Vec<String>>,
    /// The pass being written in a persistent row: its loop variable and slot.
    pass: Option<(SymId, usize)>,
    /// Whether the statements being written run once per slot of a persistent row (not inside a loop
    /// of their own): addresses there are the first slot's plus a constant.
    in_slot: bool,
    /// The first slot's address of each `(buffer, index, pass variable)` written so far in this row.
    slot_bases: HashMap<(usize, Expr, SymId), String>,
    /// `Kernel::bound_indices`: an index over one of these is never addressed from another slot's.
    bound: std::collections::BTreeSet<SymId>,
    /// `Kernel::index_ranges`: where a dividend provably fits 32 bits, its division is 32-bit alone.
    ranges: kiln_graph::sym::SymTable,
    /// Inside a vectorised loop: the loop variable, the lane being written, each vector-loaded buffer's
    /// lane registers, and each vector-stored buffer's lane values so far.
    lane: Option<(SymId, usize)>,
    vector_loads: HashMap<usize, Vec<String>>,
    vector_stores: HashMap<usize, Vec<String>>,
    /// Inside a slot group of a persistent row with lanes (`Kernel::row_lanes`): the lane being written.
    group_lane: Option<usize>,
    /// The group's vector loads by (buffer, index as the pass writes it): each lane's raw bits.
    group_loads: HashMap<(usize, Expr), Vec<String>>,
    /// The group's vector stores, each lane's bits appended as the lanes are written.
    group_stores: HashMap<(usize, Expr), Vec<String>>,
    /// Shared arrays a template declares (the attention's tiles), printed verbatim.
    extra_shared: Vec<String>,
}

impl<'k> Writer<'k> {
    fn reg(&mut self, ty: &str) -> String {
        self.next += 1;
        let name = format!("%t{}", self.next);
        self.decls.push(format!(".reg .{ty} {name};"));
        name
    }

    fn label(&mut self) -> String {
        self.next += 1;
        format!("L{}", self.next)
    }

    fn emit(&mut self, line: &str) {
        let _ = writeln!(self.body, "    {line}");
    }

    fn place(&mut self, label: &str) {
        let _ = writeln!(self.body, "{label}:");
    }

    fn fail(&mut self, msg: String) {
        self.error.get_or_insert(msg);
    }

    fn sym(&mut self, s: SymId) -> String {
        if let Some(r) = self.syms.get(&s) {
            return r.clone();
        }
        self.fail(format!("symbol {s} is used before it is bound"));
        "0".into()
    }

    /// An index expression into an s64 register.
    fn expr(&mut self, e: &Expr) -> String {
        let t = e.tree();
        self.tree(&t)
    }

    /// An index expression tree into an s64 register. Where the kernel's index ranges prove its value a
    /// non-negative 32-bit one, it is computed in 32-bit arithmetic ([`Writer::tree32`]) and widened once:
    /// 64-bit integer multiplies and adds are several instructions each on the GPU, and index arithmetic
    /// is most of what a memory-bound kernel executes besides its loads and stores.
    fn tree(&mut self, t: &ExprTree) -> String {
        if matches!(t, ExprTree::Const(_) | ExprTree::Sym(_)) || !self.ranges.fits_u32(t) {
            return self.tree64(t);
        }
        let r32 = self.tree32(t);
        let r = self.reg("s64");
        self.emit(&format!("cvt.u64.u32 {r}, {r32};"));
        r
    }

    /// `t` modulo 2^32 in a u32 register. Sums and products wrap, so they are right modulo 2^32 whatever
    /// their operands' sizes; a division, remainder, minimum or maximum is computed in 32 bits only where
    /// its operands provably are exact non-negative 32-bit values, and otherwise in 64 bits and truncated.
    fn tree32(&mut self, t: &ExprTree) -> String {
        let fits = |w: &Self, x: &ExprTree| w.ranges.fits_u32(x);
        match t {
            ExprTree::Const(c) => {
                let r = self.reg("u32");
                self.emit(&format!("mov.u32 {r}, {};", *c as u32));
                r
            }
            ExprTree::Sym(s) => {
                let wide = self.sym(*s);
                let r = self.reg("u32");
                self.emit(&format!("cvt.u32.u64 {r}, {wide};"));
                r
            }
            ExprTree::Add(v) => self.chain(v, "add.u32", "u32", Self::tree32),
            ExprTree::Mul(v) => self.chain(v, "mul.lo.u32", "u32", Self::tree32),
            ExprTree::FloorDiv(a, b) | ExprTree::Mod(a, b)
                if matches!(**b, ExprTree::Const(k) if k > 0 && k <= u32::MAX as i64) && fits(self, a) =>
            {
                let ExprTree::Const(k) = **b else { unreachable!("matched above") };
                let a = self.tree32(a);
                let r = self.reg("u32");
                // Floor is truncation for a non-negative dividend.
                let line = match (matches!(t, ExprTree::FloorDiv(..)), (k as u64).is_power_of_two()) {
                    (true, true) => format!("shr.u32 {r}, {a}, {};", k.trailing_zeros()),
                    (false, true) => format!("and.b32 {r}, {a}, {};", k - 1),
                    (true, false) => format!("div.u32 {r}, {a}, {k};"),
                    (false, false) => format!("rem.u32 {r}, {a}, {k};"),
                };
                self.emit(&line);
                r
            }
            ExprTree::Min(a, b) | ExprTree::Max(a, b) if fits(self, a) && fits(self, b) => {
                let op = if matches!(t, ExprTree::Min(..)) { "min.u32" } else { "max.u32" };
                let (a, b) = (self.tree32(a), self.tree32(b));
                let r = self.reg("u32");
                self.emit(&format!("{op} {r}, {a}, {b};"));
                r
            }
            _ => {
                let wide = self.tree64(t);
                let r = self.reg("u32");
                self.emit(&format!("cvt.u32.u64 {r}, {wide};"));
                r
            }
        }
    }

    /// The terms of a sum or product, each written by `term`, combined left to right by `op` into `ty`
    /// registers.
    fn chain(&mut self, v: &[ExprTree], op: &str, ty: &str, term: fn(&mut Self, &ExprTree) -> String) -> String {
        let mut acc = term(self, &v[0]);
        for x in &v[1..] {
            let y = term(self, x);
            let r = self.reg(ty);
            self.emit(&format!("{op} {r}, {acc}, {y};"));
            acc = r;
        }
        acc
    }

    /// [`Writer::tree`] in 64-bit arithmetic (its operands may still be 32-bit where they fit).
    fn tree64(&mut self, t: &ExprTree) -> String {
        match t {
            ExprTree::Const(c) => {
                let r = self.reg("s64");
                self.emit(&format!("mov.s64 {r}, {c};"));
                r
            }
            ExprTree::Sym(s) => self.sym(*s),
            ExprTree::Add(v) => self.chain(v, "add.s64", "s64", Self::tree),
            ExprTree::Mul(v) => self.chain(v, "mul.lo.s64", "s64", Self::tree),
            // Power-of-two divisors (most strides) are a shift and a mask, exact for negative values
            // under floor semantics: 64-bit division is a long software routine on the GPU.
            ExprTree::FloorDiv(a, b) | ExprTree::Mod(a, b) if matches!(**b, ExprTree::Const(k) if k > 0 && (k as u64).is_power_of_two()) =>
            {
                let ExprTree::Const(k) = **b else { unreachable!("matched above") };
                let a = self.tree(a);
                let r = self.reg("s64");
                if matches!(t, ExprTree::FloorDiv(..)) {
                    self.emit(&format!("shr.s64 {r}, {a}, {};", k.trailing_zeros()));
                } else {
                    self.emit(&format!("and.b64 {r}, {a}, {};", k - 1));
                }
                r
            }
            // Other positive constants, where the dividend may pass 2^32 or be negative (a dividend the
            // ranges prove a non-negative 32-bit value is divided in `tree32`): 32-bit division (which
            // ptxas turns into a multiply and a shift) chosen at run time, with 64-bit division — a long
            // software routine that dominates ptxas's time on kernels with many such indices — past 2^32.
            ExprTree::FloorDiv(a, b) | ExprTree::Mod(a, b) if matches!(**b, ExprTree::Const(k) if k > 0 && k < 1 << 31) =>
            {
                let ExprTree::Const(k) = **b else { unreachable!("matched above") };
                let a = self.tree(a);
                let (small, a32, q32) = (self.reg("pred"), self.reg("u32"), self.reg("u32"));
                let (q, r, neg) = (self.reg("s64"), self.reg("s64"), self.reg("pred"));
                self.emit(&format!("setp.lt.u64 {small}, {a}, 4294967296;"));
                self.emit(&format!("@{small} cvt.u32.u64 {a32}, {a};"));
                self.emit(&format!("@{small} div.u32 {q32}, {a32}, {k};"));
                self.emit(&format!("@{small} cvt.u64.u32 {q}, {q32};"));
                self.emit(&format!("@!{small} div.s64 {q}, {a}, {k};"));
                // Truncation rounds a negative quotient up; floor needs one less when it was inexact.
                self.emit(&format!("mul.lo.s64 {r}, {q}, {k};"));
                self.emit(&format!("sub.s64 {r}, {a}, {r};"));
                self.emit(&format!("setp.lt.s64 {neg}, {r}, 0;"));
                self.emit(&format!("@{neg} sub.s64 {q}, {q}, 1;"));
                self.emit(&format!("@{neg} add.s64 {r}, {r}, {k};"));
                if matches!(t, ExprTree::FloorDiv(..)) {
                    q
                } else {
                    r
                }
            }
            ExprTree::FloorDiv(a, b) | ExprTree::Mod(a, b) => {
                let (a, b) = (self.tree(a), self.tree(b));
                let (q, r) = (self.reg("s64"), self.reg("s64"));
                self.emit(&format!("div.s64 {q}, {a}, {b};"));
                self.emit(&format!("rem.s64 {r}, {a}, {b};"));
                // Floor semantics: when the remainder is nonzero and its sign differs from the divisor's.
                let (p1, p2, p3) = (self.reg("pred"), self.reg("pred"), self.reg("pred"));
                self.emit(&format!("setp.ne.s64 {p1}, {r}, 0;"));
                self.emit(&format!("setp.lt.s64 {p2}, {r}, 0;"));
                self.emit(&format!("setp.lt.s64 {p3}, {b}, 0;"));
                self.emit(&format!("xor.pred {p2}, {p2}, {p3};"));
                self.emit(&format!("and.pred {p1}, {p1}, {p2};"));
                if matches!(t, ExprTree::FloorDiv(..)) {
                    self.emit(&format!("@{p1} sub.s64 {q}, {q}, 1;"));
                    q
                } else {
                    self.emit(&format!("@{p1} add.s64 {r}, {r}, {b};"));
                    r
                }
            }
            ExprTree::Min(a, b) | ExprTree::Max(a, b) => {
                let op = if matches!(t, ExprTree::Min(..)) { "min.s64" } else { "max.s64" };
                let (a, b) = (self.tree(a), self.tree(b));
                let r = self.reg("s64");
                self.emit(&format!("{op} {r}, {a}, {b};"));
                r
            }
        }
    }

    fn var(&mut self, v: VarId) -> (String, DType) {
        if let Some(x) = self.vars.get(&v) {
            return x.clone();
        }
        self.fail(format!("{v} is read before it is defined"));
        ("%t0".into(), DType::F32)
    }

    /// Converts register `x` of dtype `from` to a new register of dtype `to`, rounding to halves.
    fn convert(&mut self, x: &str, from: DType, to: DType) -> String {
        if let (Some(f), true) = (to.minifloat(), from != to) {
            let v =
                if from == DType::F64 { self.f64_to_f32_odd(x) } else { self.convert_register(x, from, DType::F32) };
            return self.f8_round(&v, f);
        }
        let v = self.convert_register(x, from, to);
        match (narrow_type(to), to.narrow_bits()) {
            // Wrapped to the narrow width (`lower` casts every op's result that may leave it): the byte
            // and half-word types by a conversion, the 2- and 4-bit ones by a bit-field extract.
            (Some(t), Some((bits, signed))) if from != to => {
                let r = self.reg("s32");
                if bits >= 8 {
                    self.emit(&format!("cvt.s32.{t} {r}, {v};"));
                } else if signed {
                    self.emit(&format!("bfe.s32 {r}, {v}, 0, {bits};"));
                } else {
                    self.emit(&format!("and.b32 {r}, {v}, {};", (1u32 << bits) - 1));
                }
                r
            }
            _ => v,
        }
    }

    /// `x` in a register of `to`'s compute type, rounded to `to` where it is a half type.
    fn convert_register(&mut self, x: &str, from: DType, to: DType) -> String {
        let (tf, tt) = (reg_type(from), reg_type(to));
        let r = self.reg(tt);
        match (tf, tt) {
            ("f32", "f32") => match to {
                DType::F16 | DType::BF16 if from != to => {
                    let h = self.f32_to_half(x, to);
                    return self.half_to_f32(&h, to);
                }
                _ => self.emit(&format!("mov.f32 {r}, {x};")),
            },
            (a, b) if a == b => self.emit(&format!("mov.{a} {r}, {x};")),
            ("pred", t) => {
                let (one, zero) = match t {
                    "f32" => ("0f3F800000".to_string(), "0f00000000".to_string()),
                    "f64" => (f64_imm(1.0), f64_imm(0.0)),
                    _ => ("1".into(), "0".into()),
                };
                self.emit(&format!("selp.{t} {r}, {one}, {zero}, {x};"));
            }
            ("f32" | "f64", "pred") => {
                let zero = if tf == "f32" { f32_imm(0.0) } else { f64_imm(0.0) };
                self.emit(&format!("setp.neu.{tf} {r}, {x}, {zero};"));
            }
            ("f32", "f64") => self.emit(&format!("cvt.f64.f32 {r}, {x};")),
            ("f64", "f32") => {
                if to == DType::F32 {
                    self.emit(&format!("cvt.rn.f32.f64 {r}, {x};"));
                } else {
                    // A half rounds once from f64, as the reference does: through f32 rounded to odd,
                    // whose extra bits keep the second rounding from ever seeing a false tie.
                    let odd = self.f64_to_f32_odd(x);
                    return self.convert(&odd, DType::F32, to);
                }
            }
            (t, "pred") => self.emit(&format!("setp.ne.{t} {r}, {x}, 0;")),
            ("f32" | "f64", "u32" | "u64") => {
                // A negative value wraps, as the reference's integer cast (through i64); `cvt` into an
                // unsigned type would saturate it to 0. A u64 at or past 2^63 converts as unsigned.
                let (w, big) = (self.reg("s64"), self.reg("pred"));
                self.emit(&format!("cvt.rzi.s64.{tf} {w}, {x};"));
                if tt == "u32" {
                    self.emit(&format!("cvt.u32.s64 {r}, {w};"));
                } else {
                    let two63 =
                        if tf == "f32" { f32_imm(9.223_372_036_854_776e18) } else { f64_imm(9.223_372_036_854_776e18) };
                    self.emit(&format!("mov.b64 {r}, {w};"));
                    self.emit(&format!("setp.ge.{tf} {big}, {x}, {two63};"));
                    self.emit(&format!("@{big} cvt.rzi.u64.{tf} {r}, {x};"));
                }
            }
            ("f32" | "f64", t) => self.emit(&format!("cvt.rzi.{t}.{tf} {r}, {x};")),
            (t, "f64") => self.emit(&format!("cvt.rn.f64.{t} {r}, {x};")),
            (t, "f32") => {
                self.emit(&format!("cvt.rn.f32.{t} {r}, {x};"));
                if matches!(to, DType::F16 | DType::BF16) {
                    return self.convert(&r, DType::F32, to);
                }
            }
            (a, b) => self.emit(&format!("cvt.{b}.{a} {r}, {x};")),
        }
        r
    }

    /// f64 `x` as an f32 rounded to odd: truncated, its last bit set when that dropped anything. A
    /// second rounding from it (to f16, bf16 or an 8-bit float) is then the correct rounding of `x`.
    fn f64_to_f32_odd(&mut self, x: &str) -> String {
        let (t, back, inexact, bits, r) =
            (self.reg("f32"), self.reg("f64"), self.reg("pred"), self.reg("b32"), self.reg("f32"));
        self.emit(&format!("cvt.rz.f32.f64 {t}, {x};"));
        self.emit(&format!("cvt.f64.f32 {back}, {t};"));
        self.emit(&format!("setp.neu.f64 {inexact}, {back}, {x};"));
        self.emit(&format!("mov.b32 {bits}, {t};"));
        self.emit(&format!("@{inexact} or.b32 {bits}, {bits}, 1;"));
        self.emit(&format!("mov.b32 {r}, {bits};"));
        r
    }

    /// The address operand (inside `[...]`) of element `index` of `buffer`. In an unrolled slot of a
    /// persistent row, an index that moves by a constant from slot to slot is the first slot's address
    /// plus an immediate offset: no integer arithmetic per element.
    fn address(&mut self, buffer: usize, index: &Expr) -> String {
        let size = self.k.buffers[buffer].dtype.size_bytes() as i64;
        let fixed = index.symbols().is_disjoint(&self.bound);
        if let (true, Some((s, u)), true) = (self.in_slot, self.pass, fixed) {
            let delta = self.k.row_slot_offset(u as u32);
            let offset = index.shift_by(s, delta).and_then(|d| d.checked_mul(size)).filter(|o| o.abs() < 1 << 31);
            if let Some(offset) = offset {
                let key = (buffer, index.clone(), s);
                let base = match self.slot_bases.get(&key) {
                    Some(b) => b.clone(),
                    None => {
                        // Slot 0's element is `local · row_lanes`; a later slot only runs where slot 0 did (its
                        // element is larger), so the register is set wherever it is read.
                        let own = self.syms.insert(s, self.slot0().into());
                        let b = self.plain_address(buffer, index);
                        match own {
                            Some(r) => self.syms.insert(s, r),
                            None => self.syms.remove(&s),
                        };
                        self.slot_bases.insert(key, b.clone());
                        b
                    }
                };
                return match offset {
                    0 => base,
                    o => format!("{base}+{o}"),
                };
            }
        }
        self.plain_address(buffer, index)
    }

    /// A register holding the address of element `index` of `buffer`.
    fn plain_address(&mut self, buffer: usize, index: &Expr) -> String {
        let size = self.k.buffers[buffer].dtype.size_bytes();
        let t = index.tree();
        let a = self.reg("s64");
        // A plain variable stays a 64-bit multiply-add (widening it first saves nothing: measured on W3's
        // SASS, 424 against 432 instructions).
        if !matches!(t, ExprTree::Const(_) | ExprTree::Sym(_)) && self.ranges.fits_u32(&t) {
            // A 32-bit index widens inside the address's multiply-add.
            let idx = self.tree32(&t);
            self.emit(&format!("mad.wide.u32 {a}, {idx}, {size}, %b{buffer};"));
        } else {
            let idx = self.tree(&t);
            self.emit(&format!("mad.lo.s64 {a}, {idx}, {size}, %b{buffer};"));
        }
        a
    }

    /// The load instruction for `buffer`: a buffer the kernel only reads goes through the read-only
    /// (non-coherent) cache, `ld.global.nc`, which also lets ptxas move its loads above the kernel's
    /// stores — W3's layer norm read its weight and bias one pair per store, sixteen L2 round trips in a
    /// row, until it could. Sound because no kernel reads memory it writes
    /// (`kiln_graph::plan::reads_disjoint_from_writes`, checked as every graph compiles).
    fn ld(&self, buffer: usize) -> &'static str {
        match self.k.buffers[buffer].access {
            Access::Read => "ld.global.nc",
            Access::Write => "ld.global",
        }
    }

    /// Loads buffer element `index` into a register of the buffer's compute type.
    fn load(&mut self, buffer: usize, index: &Expr, guard: Option<&str>) -> (String, DType) {
        let a = self.address(buffer, index);
        let d = self.k.buffers[buffer].dtype;
        let pre = format!("{}{}", guard.map(|g| format!("@{g} ")).unwrap_or_default(), self.ld(buffer));
        let r = self.reg(reg_type(d));
        match d {
            DType::F32 => {
                self.emit(&format!("mov.f32 {r}, 0f00000000;"));
                self.emit(&format!("{pre}.f32 {r}, [{a}];"));
            }
            DType::F64 => {
                self.emit(&format!("mov.f64 {r}, {};", f64_imm(0.0)));
                self.emit(&format!("{pre}.f64 {r}, [{a}];"));
            }
            DType::I32 | DType::I64 | DType::U32 | DType::U64 => {
                let t = reg_type(d);
                self.emit(&format!("mov.{t} {r}, 0;"));
                self.emit(&format!("{pre}.{t} {r}, [{a}];"));
            }
            DType::F16 | DType::BF16 => {
                let h = self.reg("b16");
                self.emit(&format!("mov.b16 {h}, 0;"));
                self.emit(&format!("{pre}.b16 {h}, [{a}];"));
                return (self.half_to_f32(&h, d), d);
            }
            DType::Bool => {
                let w = self.reg("u32");
                self.emit(&format!("mov.u32 {w}, 0;"));
                self.emit(&format!("{pre}.u8 {w}, [{a}];"));
                self.emit(&format!("setp.ne.u32 {r}, {w}, 0;"));
            }
            DType::U8 | DType::I8 | DType::U16 | DType::I16 | DType::I4 | DType::U4 | DType::I2 | DType::U2 => {
                if let Some(t) = narrow_type(d) {
                    self.emit(&format!("mov.s32 {r}, 0;"));
                    self.emit(&format!("{pre}.{t} {r}, [{a}];"));
                }
            }
            DType::F8E4M3 | DType::F8E5M2 | DType::F8E4M3FNUZ | DType::F8E5M2FNUZ | DType::F4E2M1 => {
                if let Some(f) = d.minifloat() {
                    let w = self.reg("b32");
                    self.emit(&format!("mov.b32 {w}, 0;"));
                    self.emit(&format!("{pre}.u8 {w}, [{a}];"));
                    return (self.f8_value(&w, f), d);
                }
            }
        }
        (r, d)
    }

    /// The f32 value of half `h` (16 bits) of dtype `d`.
    fn half_to_f32(&mut self, h: &str, d: DType) -> String {
        let r = self.reg("f32");
        if d == DType::F16 {
            self.emit(&format!("cvt.f32.f16 {r}, {h};"));
        } else {
            let w = self.reg("b32");
            self.emit(&format!("mov.b32 {w}, {{0, {h}}};"));
            self.emit(&format!("mov.b32 {r}, {w};"));
        }
        r
    }

    /// The 16 bits of f32 `x` rounded to half dtype `d`.
    fn f32_to_half(&mut self, x: &str, d: DType) -> String {
        let h = self.reg("b16");
        let cvt = if d == DType::F16 { "cvt.rn.f16.f32" } else { "cvt.rn.bf16.f32" };
        self.emit(&format!("{cvt} {h}, {x};"));
        h
    }

    /// A vector lane's bits (`b16`/`b32`) of value `x`, already of the buffer's dtype `d`.
    fn lane_bits(&mut self, x: &str, d: DType) -> String {
        match d {
            DType::F16 | DType::BF16 => self.f32_to_half(x, d),
            _ => {
                let b = self.reg("b32");
                self.emit(&format!("mov.b32 {b}, {x};"));
                b
            }
        }
    }

    fn store(&mut self, buffer: usize, index: &Expr, value: VarId) {
        let (v, from) = self.var(value);
        let d = self.k.buffers[buffer].dtype;
        let x = self.convert(&v, from, d);
        if self.lane.is_some_and(|(s, _)| *index == Expr::sym(s)) && self.vector_stores.contains_key(&buffer) {
            let bits = self.lane_bits(&x, d);
            self.vector_stores.entry(buffer).or_default().push(bits);
            return;
        }
        let key = (buffer, index.clone());
        if self.group_lane.is_some() && self.in_slot && self.group_stores.contains_key(&key) {
            let bits = self.lane_bits(&x, d);
            self.group_stores.entry(key).or_default().push(bits);
            return;
        }
        let skip = self.label();
        if self.single_thread_stores {
            let p = self.reg("pred");
            self.emit(&format!("setp.ne.s64 {p}, %local, 0;"));
            self.emit(&format!("@{p} bra {skip};"));
        }
        let a = self.address(buffer, index);
        match d {
            DType::F32 => self.emit(&format!("st.global.f32 [{a}], {x};")),
            DType::F64 => self.emit(&format!("st.global.f64 [{a}], {x};")),
            DType::I32 | DType::I64 | DType::U32 | DType::U64 => {
                self.emit(&format!("st.global.{} [{a}], {x};", reg_type(d)))
            }
            DType::F16 | DType::BF16 => {
                let h = self.f32_to_half(&x, d);
                self.emit(&format!("st.global.b16 [{a}], {h};"));
            }
            DType::Bool => {
                let w = self.reg("u16");
                self.emit(&format!("selp.u16 {w}, 1, 0, {x};"));
                self.emit(&format!("st.global.u8 [{a}], {w};"));
            }
            DType::U8 | DType::I8 | DType::U16 | DType::I16 | DType::I4 | DType::U4 | DType::I2 | DType::U2 => {
                if let Some(t) = narrow_type(d) {
                    self.emit(&format!("st.global.{t} [{a}], {x};"));
                }
            }
            DType::F8E4M3 | DType::F8E5M2 | DType::F8E4M3FNUZ | DType::F8E5M2FNUZ | DType::F4E2M1 => {
                if let Some(f) = d.minifloat() {
                    let bits = self.f8_bits(&x, f);
                    self.emit(&format!("st.global.u8 [{a}], {bits};"));
                }
            }
        }
        self.place(&skip);
    }

    /// An f32 register holding the power of two whose biased exponent is register `biased` (`s32`).
    fn power_of_two(&mut self, biased: &str) -> String {
        let (b, r) = (self.reg("b32"), self.reg("f32"));
        self.emit(&format!("shl.b32 {b}, {biased}, 23;"));
        self.emit(&format!("mov.b32 {r}, {b};"));
        r
    }

    /// The f32 value of small float `f` (8 or 4 bits) nearest `x`, ties to even, saturated past its
    /// largest finite value (an infinity too unless `f` has infinities), NaN kept (−0 where `f` has no
    /// NaN): WGSL's `kf8_round`, instruction for
    /// instruction.
    fn f8_round(&mut self, x: &str, f: Minifloat) -> String {
        let m = f.mantissa_bits as i32;
        let (b, ab, e) = (self.reg("b32"), self.reg("b32"), self.reg("s32"));
        self.emit(&format!("mov.b32 {b}, {x};"));
        self.emit(&format!("and.b32 {ab}, {b}, 0x7fffffff;"));
        let nan = self.reg("pred");
        self.emit(&format!("setp.gt.u32 {nan}, {ab}, 0x7f800000;"));
        self.emit(&format!("min.u32 {ab}, {ab}, {};", (f.max as f32).to_bits()));
        self.emit(&format!("shr.u32 {e}, {ab}, 23;"));
        self.emit(&format!("max.s32 {e}, {e}, {};", f.emin() + 127));
        let (se, ie) = (self.reg("s32"), self.reg("s32"));
        self.emit(&format!("sub.s32 {se}, {e}, {m};"));
        self.emit(&format!("sub.s32 {ie}, {}, {e};", 254 + m));
        let (step, inverse) = (self.power_of_two(&se), self.power_of_two(&ie));
        let (a, y) = (self.reg("f32"), self.reg("f32"));
        self.emit(&format!("mov.b32 {a}, {ab};"));
        self.emit(&format!("mul.rn.f32 {y}, {a}, {inverse};"));
        self.emit(&format!("cvt.rni.f32.f32 {y}, {y};"));
        self.emit(&format!("mul.rn.f32 {y}, {y}, {step};"));
        let s = self.reg("b32");
        self.emit(&format!("and.b32 {s}, {b}, 0x80000000;"));
        if f.unsigned_zero {
            // One zero: +0 whatever the sign of what rounded to it.
            let z = self.reg("pred");
            self.emit(&format!("setp.eq.f32 {z}, {y}, 0f00000000;"));
            self.emit(&format!("selp.b32 {s}, 0, {s}, {z};"));
        }
        let r = self.with_sign(&y, &s);
        // NaN stays NaN; a format without NaN (E2M1) takes −0, its code for it.
        let nan_value = if f.nan { x.to_string() } else { "0f80000000".to_string() };
        self.emit(&format!("selp.f32 {r}, {nan_value}, {r}, {nan};"));
        if f.infinities {
            // E5M2's ±inf are values of it (a cast clamps infinities before rounding).
            let (ib, inf) = (self.reg("b32"), self.reg("pred"));
            self.emit(&format!("and.b32 {ib}, {b}, 0x7fffffff;"));
            self.emit(&format!("setp.eq.u32 {inf}, {ib}, 0x7f800000;"));
            self.emit(&format!("selp.f32 {r}, {x}, {r}, {inf};"));
        }
        r
    }

    /// A new f32 register: `v` with sign bit `sign` (a `b32` register, 0 or 0x80000000) or-ed in.
    fn with_sign(&mut self, v: &str, sign: &str) -> String {
        let (vb, r) = (self.reg("b32"), self.reg("f32"));
        self.emit(&format!("mov.b32 {vb}, {v};"));
        self.emit(&format!("or.b32 {vb}, {vb}, {sign};"));
        self.emit(&format!("mov.b32 {r}, {vb};"));
        r
    }

    /// The bits (`b32`, low byte) of small float `f` for `r`, a value of `f` already (a store's value was
    /// converted to the buffer's dtype by `lower`, or loaded from such a buffer): WGSL's `kf8_bits`.
    fn f8_bits(&mut self, r: &str, f: Minifloat) -> String {
        let m = f.mantissa_bits;
        let (b, ab, e) = (self.reg("b32"), self.reg("b32"), self.reg("s32"));
        self.emit(&format!("mov.b32 {b}, {r};"));
        self.emit(&format!("and.b32 {ab}, {b}, 0x7fffffff;"));
        self.emit(&format!("shr.u32 {e}, {ab}, 23;"));
        // Below the smallest normal: the multiple of the smallest step, 2^(emin - m).
        let (a, t, sub) = (self.reg("f32"), self.reg("f32"), self.reg("b32"));
        self.emit(&format!("mov.b32 {a}, {ab};"));
        self.emit(&format!("mul.rn.f32 {t}, {a}, {};", f32_imm(2f64.powi(m as i32 - f.emin()))));
        self.emit(&format!("cvt.rzi.u32.f32 {sub}, {t};"));
        let (en, mm, v) = (self.reg("b32"), self.reg("b32"), self.reg("b32"));
        self.emit(&format!("add.s32 {en}, {e}, {};", f.bias - 127));
        self.emit(&format!("shl.b32 {en}, {en}, {m};"));
        self.emit(&format!("shr.u32 {mm}, {ab}, {};", 23 - m));
        self.emit(&format!("and.b32 {mm}, {mm}, {};", (1u32 << m) - 1));
        self.emit(&format!("or.b32 {v}, {en}, {mm};"));
        let (small, nan) = (self.reg("pred"), self.reg("pred"));
        self.emit(&format!("setp.lt.s32 {small}, {e}, {};", f.emin() + 127));
        self.emit(&format!("selp.b32 {v}, {sub}, {v}, {small};"));
        let s = self.reg("b32");
        self.emit(&format!("shr.u32 {s}, {b}, {};", 32 - f.bits));
        self.emit(&format!("and.b32 {s}, {s}, {};", f.sign_bit()));
        if f.unsigned_zero {
            // One zero: its code unsigned (0x80 is NaN's).
            let z = self.reg("pred");
            self.emit(&format!("setp.eq.u32 {z}, {ab}, 0;"));
            self.emit(&format!("selp.b32 {s}, 0, {s}, {z};"));
        }
        self.emit(&format!("or.b32 {v}, {v}, {s};"));
        if f.infinities {
            // ±inf (E5M2 holds them: a value loaded from such a buffer) as the all-ones exponent.
            let (inf, code) = (self.reg("pred"), self.reg("b32"));
            self.emit(&format!("setp.eq.u32 {inf}, {ab}, 0x7f800000;"));
            self.emit(&format!("or.b32 {code}, {s}, {};", ((1u32 << f.exponent_bits()) - 1) << m));
            self.emit(&format!("selp.b32 {v}, {code}, {v}, {inf};"));
        }
        self.emit(&format!("setp.gt.u32 {nan}, {ab}, 0x7f800000;"));
        self.emit(&format!("selp.b32 {v}, {}, {v}, {nan};", f.nan_code()));
        v
    }

    /// The f32 value of small float bits `c` (`b32`): WGSL's `kf8_value`.
    fn f8_value(&mut self, c: &str, f: Minifloat) -> String {
        let m = f.mantissa_bits;
        let top = (1u32 << f.exponent_bits()) - 1;
        let sign = u32::from(f.sign_bit());
        let (fr, e) = (self.reg("b32"), self.reg("b32"));
        self.emit(&format!("and.b32 {fr}, {c}, {};", (1u32 << m) - 1));
        self.emit(&format!("shr.u32 {e}, {c}, {m};"));
        self.emit(&format!("and.b32 {e}, {e}, {top};"));
        let (ff, sub) = (self.reg("f32"), self.reg("f32"));
        self.emit(&format!("cvt.rn.f32.u32 {ff}, {fr};"));
        self.emit(&format!("mul.rn.f32 {sub}, {ff}, {};", f32_imm(2f64.powi(f.emin() - m as i32))));
        let (nb, fm, v) = (self.reg("b32"), self.reg("b32"), self.reg("f32"));
        self.emit(&format!("add.s32 {nb}, {e}, {};", 127 - f.bias));
        self.emit(&format!("shl.b32 {nb}, {nb}, 23;"));
        self.emit(&format!("shl.b32 {fm}, {fr}, {};", 23 - m));
        self.emit(&format!("or.b32 {nb}, {nb}, {fm};"));
        self.emit(&format!("mov.b32 {v}, {nb};"));
        let p = self.reg("pred");
        self.emit(&format!("setp.eq.u32 {p}, {e}, 0;"));
        self.emit(&format!("selp.f32 {v}, {sub}, {v}, {p};"));
        let (special, q) = (self.reg("pred"), self.reg("pred"));
        if f.unsigned_zero {
            // Every code finite but 0x80, the one NaN (the sign applied below leaves a NaN a NaN).
            self.emit(&format!("setp.eq.u32 {special}, {c}, {sign};"));
            self.emit(&format!("selp.f32 {v}, 0f7FC00000, {v}, {special};"));
        } else if f.infinities {
            self.emit(&format!("setp.eq.u32 {special}, {e}, {top};"));
            self.emit(&format!("setp.eq.u32 {q}, {fr}, 0;"));
            let sv = self.reg("f32");
            self.emit(&format!("selp.f32 {sv}, 0f7F800000, 0f7FC00000, {q};"));
            self.emit(&format!("selp.f32 {v}, {sv}, {v}, {special};"));
        } else if f.nan {
            let low = self.reg("b32");
            self.emit(&format!("and.b32 {low}, {c}, {};", sign - 1));
            self.emit(&format!("setp.eq.u32 {special}, {low}, {};", sign - 1));
            self.emit(&format!("selp.f32 {v}, 0f7FC00000, {v}, {special};"));
        }
        let s = self.reg("b32");
        self.emit(&format!("and.b32 {s}, {c}, {sign};"));
        self.emit(&format!("shl.b32 {s}, {s}, {};", 32 - f.bits));
        self.with_sign(&v, &s)
    }

    /// `e^x` from `ex2` (relative error ~2^-22).
    fn exp(&mut self, x: &str) -> String {
        let (t, r) = (self.reg("f32"), self.reg("f32"));
        self.emit(&format!("mul.f32 {t}, {x}, 0f3FB8AA3B;"));
        self.emit(&format!("ex2.approx.f32 {r}, {t};"));
        r
    }

    /// `e^x` with a subnormal result flushed to zero: inside sigmoid, tanh and erf, where such a value
    /// is added to 1 or scaled by at most 1 (the result is the same) and the guard `ex2` needs for
    /// subnormals (a compare and two multiplies) is wasted.
    fn exp_ftz(&mut self, x: &str) -> String {
        let (t, r) = (self.reg("f32"), self.reg("f32"));
        self.emit(&format!("mul.f32 {t}, {x}, 0f3FB8AA3B;"));
        self.emit(&format!("ex2.approx.ftz.f32 {r}, {t};"));
        r
    }

    /// `1/d` for `d ≥ 1` (within 1 ulp): one hardware reciprocal, where `rcp.rn` adds a Newton step
    /// and a slow path. A result below 2^-126 (d past 2^126: sigmoid(x) for x < -87.3) flushes to 0.
    fn rcp_at_least_one(&mut self, d: &str) -> String {
        let r = self.reg("f32");
        self.emit(&format!("rcp.approx.ftz.f32 {r}, {d};"));
        r
    }

    /// tanh within 2 ulp: libdevice's odd polynomial (`approx::TANH_SMALL`) below |x| = 0.6, where
    /// `1 - 2/(e^{2|x|} + 1)` would cancel, and that form (of |x|) above; both computed and one selected (no divergence), the
    /// sign copied from x. NaN flows through the second form; ±inf gives ±1, ±0 gives ±0.
    fn tanh(&mut self, x: &str) -> String {
        let (s, t) = (self.reg("f32"), self.reg("f32"));
        self.emit(&format!("mul.f32 {s}, {x}, {x};"));
        self.emit(&format!("mul.f32 {t}, {s}, {x};"));
        let p = self.horner(&approx::TANH_SMALL, &s);
        let small = self.reg("f32");
        self.emit(&format!("fma.rn.f32 {small}, {p}, {t}, {x};"));
        let (a, m) = (self.reg("f32"), self.reg("f32"));
        self.emit(&format!("abs.f32 {a}, {x};"));
        self.emit(&format!("add.f32 {m}, {a}, {a};"));
        let e = self.exp_ftz(&m);
        let d = self.reg("f32");
        self.emit(&format!("add.f32 {d}, {e}, 0f3F800000;"));
        let q = self.rcp_at_least_one(&d);
        let (big, lt, pick, r) = (self.reg("f32"), self.reg("pred"), self.reg("f32"), self.reg("f32"));
        self.emit(&format!("fma.rn.f32 {big}, {q}, 0fC0000000, 0f3F800000;"));
        self.emit(&format!("setp.lt.f32 {lt}, {a}, {};", f32_imm(approx::TANH_SPLIT)));
        self.emit(&format!("selp.f32 {pick}, {small}, {big}, {lt};"));
        // x's sign on both forms: the second is |tanh|, and the polynomial turns -0 into +0.
        self.emit(&format!("copysign.f32 {r}, {x}, {pick};"));
        r
    }

    fn f32_unary(&mut self, op: UnaryOp, x: &str) -> String {
        let r = self.reg("f32");
        match op {
            UnaryOp::Neg => self.emit(&format!("neg.f32 {r}, {x};")),
            UnaryOp::Abs => self.emit(&format!("abs.f32 {r}, {x};")),
            UnaryOp::Exp => return self.exp(x),
            UnaryOp::Log => {
                let t = self.reg("f32");
                self.emit(&format!("lg2.approx.f32 {t}, {x};"));
                self.emit(&format!("mul.f32 {r}, {t}, 0f3F317218;"));
            }
            UnaryOp::Sqrt => self.emit(&format!("sqrt.rn.f32 {r}, {x};")),
            UnaryOp::Rsqrt => self.emit(&format!("rsqrt.approx.f32 {r}, {x};")),
            UnaryOp::Sin => self.emit(&format!("sin.approx.f32 {r}, {x};")),
            UnaryOp::Cos => self.emit(&format!("cos.approx.f32 {r}, {x};")),
            UnaryOp::Tanh => return self.tanh(x),
            UnaryOp::Sigmoid => {
                let m = self.reg("f32");
                self.emit(&format!("neg.f32 {m}, {x};"));
                let e = self.exp_ftz(&m);
                let d = self.reg("f32");
                self.emit(&format!("add.f32 {d}, 0f3F800000, {e};"));
                return self.rcp_at_least_one(&d);
            }
            UnaryOp::Erf => return self.erf(x),
            UnaryOp::Relu => self.emit(&format!("max.NaN.f32 {r}, {x}, 0f00000000;")),
            UnaryOp::Reciprocal => self.emit(&format!("rcp.rn.f32 {r}, {x};")),
            UnaryOp::Floor => self.emit(&format!("cvt.rmi.f32.f32 {r}, {x};")),
            UnaryOp::Ceil => self.emit(&format!("cvt.rpi.f32.f32 {r}, {x};")),
            UnaryOp::Round => self.emit(&format!("cvt.rni.f32.f32 {r}, {x};")),
            UnaryOp::Not | UnaryOp::IsNan => unreachable!("bool-valued ops are handled by the caller"),
        }
        r
    }

    /// erf within `approx::ERF_MAX_ULP` (plus `ex2.approx`'s share): `x + x·p(x²)` below
    /// `approx::ERF_SPLIT`, `1 − 2^q(min(|x|, 4))` with x's sign above; both computed, one selected, so a
    /// warp never diverges (W1's and a GELU's inputs straddle the split). 21 instructions, where a Taylor
    /// series beside the Numerical Recipes erfc fit (a reciprocal, an exponential and 16 multiply-adds)
    /// took 35.
    fn erf(&mut self, x: &str) -> String {
        let (a, s) = (self.reg("f32"), self.reg("f32"));
        self.emit(&format!("abs.f32 {a}, {x};"));
        self.emit(&format!("mul.f32 {s}, {x}, {x};"));
        let p = self.horner(&approx::ERF_SMALL, &s);
        let small = self.reg("f32");
        self.emit(&format!("fma.rn.f32 {small}, {p}, {x}, {x};"));
        let t = self.reg("f32");
        self.emit(&format!("min.f32 {t}, {a}, {};", f32_imm(approx::ERF_CLAMP)));
        let q = self.horner(&approx::ERF_LARGE_LOG2, &t);
        let (e, big, signed) = (self.reg("f32"), self.reg("f32"), self.reg("f32"));
        self.emit(&format!("ex2.approx.ftz.f32 {e}, {q};"));
        self.emit(&format!("sub.f32 {big}, 0f3F800000, {e};"));
        self.emit(&format!("copysign.f32 {signed}, {x}, {big};"));
        let (lt, r) = (self.reg("pred"), self.reg("f32"));
        self.emit(&format!("setp.lt.f32 {lt}, {a}, {};", f32_imm(approx::ERF_SPLIT)));
        self.emit(&format!("selp.f32 {r}, {small}, {signed}, {lt};"));
        // NaN in, NaN out (the clamp and the selects above would drop it).
        let nan = self.reg("pred");
        self.emit(&format!("setp.nan.f32 {nan}, {x}, {x};"));
        self.emit(&format!("@{nan} mov.f32 {r}, {x};"));
        r
    }

    /// `c[0] + s·(c[1] + s·(…))` by fused multiply-adds from the last coefficient (`approx::horner`'s
    /// order), the first step on immediates.
    fn horner(&mut self, c: &[f64], s: &str) -> String {
        let n = c.len();
        let mut p = self.reg("f32");
        self.emit(&format!("fma.rn.f32 {p}, {}, {s}, {};", f32_imm(c[n - 1]), f32_imm(c[n - 2])));
        for k in c[..n - 2].iter().rev() {
            let next = self.reg("f32");
            self.emit(&format!("fma.rn.f32 {next}, {p}, {s}, {};", f32_imm(*k)));
            p = next;
        }
        p
    }

    /// An f64 op PTX computes correctly rounded (`graph::f64_math` has written the transcendental ones
    /// out in these).
    fn f64_unary(&mut self, op: UnaryOp, x: &str) -> String {
        let r = self.reg("f64");
        match op {
            UnaryOp::Neg => self.emit(&format!("neg.f64 {r}, {x};")),
            UnaryOp::Abs => self.emit(&format!("abs.f64 {r}, {x};")),
            UnaryOp::Sqrt => self.emit(&format!("sqrt.rn.f64 {r}, {x};")),
            UnaryOp::Rsqrt => {
                let s = self.reg("f64");
                self.emit(&format!("sqrt.rn.f64 {s}, {x};"));
                self.emit(&format!("div.rn.f64 {r}, {}, {s};", f64_imm(1.0)));
            }
            UnaryOp::Reciprocal => self.emit(&format!("rcp.rn.f64 {r}, {x};")),
            UnaryOp::Floor => self.emit(&format!("cvt.rmi.f64.f64 {r}, {x};")),
            UnaryOp::Ceil => self.emit(&format!("cvt.rpi.f64.f64 {r}, {x};")),
            UnaryOp::Round => self.emit(&format!("cvt.rni.f64.f64 {r}, {x};")),
            UnaryOp::Relu => {
                let zero = self.reg("f64");
                self.emit(&format!("mov.f64 {zero}, {};", f64_imm(0.0)));
                self.f64_extreme(true, &r, x, &zero);
            }
            op => self.fail(format!("f64 {op:?} left for the renderer (graph::f64_math writes it out)")),
        }
        r
    }

    /// `r = max(x, y)` (or min), NaN when either is (PTX's f64 `max` returns the other operand).
    fn f64_extreme(&mut self, max: bool, r: &str, x: &str, y: &str) {
        let nan = self.reg("pred");
        self.emit(&format!("{}.f64 {r}, {x}, {y};", if max { "max" } else { "min" }));
        self.emit(&format!("setp.nan.f64 {nan}, {x}, {y};"));
        self.emit(&format!("@{nan} mov.f64 {r}, {};", f64_imm(f64::NAN)));
    }

    fn pow(&mut self, a: &str, b: &str) -> String {
        // |a|^b via lg2/ex2, sign restored for negative a with an odd integer b, NaN for negative a with a
        // fractional b, 1 for b == 0.
        let (abs, l, m) = (self.reg("f32"), self.reg("f32"), self.reg("f32"));
        self.emit(&format!("abs.f32 {abs}, {a};"));
        self.emit(&format!("lg2.approx.f32 {l}, {abs};"));
        self.emit(&format!("mul.f32 {m}, {l}, {b};"));
        let r = self.reg("f32");
        self.emit(&format!("ex2.approx.f32 {r}, {m};"));
        let (neg, int, half, odd) = (self.reg("pred"), self.reg("pred"), self.reg("f32"), self.reg("pred"));
        let (rb, fl) = (self.reg("f32"), self.reg("f32"));
        self.emit(&format!("setp.lt.f32 {neg}, {a}, 0f00000000;"));
        self.emit(&format!("cvt.rni.f32.f32 {rb}, {b};"));
        self.emit(&format!("setp.eq.f32 {int}, {rb}, {b};"));
        self.emit(&format!("mul.f32 {half}, {b}, 0f3F000000;"));
        self.emit(&format!("cvt.rmi.f32.f32 {fl}, {half};"));
        self.emit(&format!("setp.neu.f32 {odd}, {fl}, {half};"));
        let (flip, bad, zero) = (self.reg("pred"), self.reg("pred"), self.reg("pred"));
        self.emit(&format!("and.pred {flip}, {neg}, {odd};"));
        self.emit(&format!("@{flip} neg.f32 {r}, {r};"));
        self.emit(&format!("not.pred {bad}, {int};"));
        self.emit(&format!("and.pred {bad}, {bad}, {neg};"));
        self.emit(&format!("@{bad} mov.f32 {r}, 0f7FC00000;"));
        self.emit(&format!("setp.eq.f32 {zero}, {b}, 0f00000000;"));
        self.emit(&format!("@{zero} mov.f32 {r}, 0f3F800000;"));
        r
    }

    fn scalar(&mut self, dtype: DType, value: &Scalar) -> String {
        let ty = reg_type(dtype);
        match value {
            Scalar::Const { value } => {
                let r = self.reg(ty);
                match ty {
                    "f32" => self.emit(&format!("mov.f32 {r}, {};", f32_imm(*value))),
                    "f64" => self.emit(&format!("mov.f64 {r}, {};", f64_imm(*value))),
                    "pred" => self.emit(&format!("setp.ne.s32 {r}, {}, 0;", i32::from(*value != 0.0))),
                    // Unsigned constants wrap as their dtype's rounding does (u32's −1 is its largest value).
                    "u32" | "u64" => self.emit(&format!("mov.{ty} {r}, {};", dtype.round(*value) as u64)),
                    t => self.emit(&format!("mov.{t} {r}, {};", *value as i64)),
                }
                r
            }
            Scalar::Load { buffer, index, guard } => {
                if let (None, Some((s, lane))) = (guard, self.lane) {
                    if *index == Expr::sym(s) {
                        if let Some(regs) = self.vector_loads.get(buffer) {
                            let raw = regs[lane].clone();
                            return self.widen(&raw, *buffer, dtype);
                        }
                    }
                }
                if let (None, Some((pass, slot))) = (guard, self.pass) {
                    if let Some(regs) = self.row_cache.get(&(*buffer, dtype, RowLoad::key(index, pass))) {
                        return regs[slot].clone();
                    }
                }
                if let (None, Some(lane), true) = (guard, self.group_lane, self.in_slot) {
                    if let Some(regs) = self.group_loads.get(&(*buffer, index.clone())) {
                        let raw = regs[lane].clone();
                        return self.widen(&raw, *buffer, dtype);
                    }
                }
                let g = guard.map(|g| self.var(g).0);
                let (raw, from) = self.load(*buffer, index, g.as_deref());
                self.convert(&raw, from, dtype)
            }
            Scalar::Index { expr } => {
                let e = self.expr(expr);
                self.convert(&e, DType::I64, dtype)
            }
            Scalar::Unary { op, a } => {
                let (x, from) = self.var(*a);
                let r = match (op, reg_type(from)) {
                    (UnaryOp::Not, _) => {
                        let r = self.reg("pred");
                        self.emit(&format!("not.pred {r}, {x};"));
                        return r;
                    }
                    (UnaryOp::IsNan, t @ ("f32" | "f64")) => {
                        let r = self.reg("pred");
                        self.emit(&format!("setp.nan.{t} {r}, {x}, {x};"));
                        return r;
                    }
                    (UnaryOp::IsNan, _) => {
                        let r = self.reg("pred");
                        self.emit(&format!("setp.ne.s32 {r}, 0, 0;"));
                        return r;
                    }
                    (_, "f32") => self.f32_unary(*op, &x),
                    (_, "f64") => return self.f64_unary(*op, &x),
                    (op, t) => {
                        let r = self.reg(t);
                        match op {
                            // PTX negates and takes magnitudes of signed types only.
                            UnaryOp::Neg if from.is_unsigned() => self.emit(&format!("sub.{t} {r}, 0, {x};")),
                            UnaryOp::Abs if from.is_unsigned() => self.emit(&format!("mov.{t} {r}, {x};")),
                            UnaryOp::Neg => self.emit(&format!("neg.{t} {r}, {x};")),
                            UnaryOp::Abs => self.emit(&format!("abs.{t} {r}, {x};")),
                            UnaryOp::Relu => self.emit(&format!("max.{t} {r}, {x}, 0;")),
                            _ => {
                                let f = self.convert(&x, from, DType::F32);
                                let y = self.f32_unary(*op, &f);
                                return self.convert(&y, DType::F32, dtype);
                            }
                        }
                        r
                    }
                };
                // Halves are computed in f32 registers: every value is rounded to its dtype (IR rule).
                if reg_type(dtype) == "f32" && (from != dtype || matches!(dtype, DType::F16 | DType::BF16)) {
                    return self.convert(&r, DType::F32, dtype);
                }
                r
            }
            Scalar::Binary { op, a, b } => {
                let ((x, dx), (y, _)) = (self.var(*a), self.var(*b));
                let r = self.binary(*op, &x, &y, dx);
                if matches!(dtype, DType::F16 | DType::BF16) && !op.is_comparison() {
                    return self.convert(&r, DType::F32, dtype);
                }
                r
            }
            Scalar::Select { cond, a, b } => {
                let ((c, _), (x, _), (y, _)) = (self.var(*cond), self.var(*a), self.var(*b));
                let r = self.reg(ty);
                if ty == "pred" {
                    let (t1, t2, nc) = (self.reg("pred"), self.reg("pred"), self.reg("pred"));
                    self.emit(&format!("and.pred {t1}, {c}, {x};"));
                    self.emit(&format!("not.pred {nc}, {c};"));
                    self.emit(&format!("and.pred {t2}, {nc}, {y};"));
                    self.emit(&format!("or.pred {r}, {t1}, {t2};"));
                } else {
                    self.emit(&format!("selp.{ty} {r}, {x}, {y}, {c};"));
                }
                r
            }
            Scalar::Cast { a } => {
                let (x, from) = self.var(*a);
                self.convert(&x, from, dtype)
            }
            Scalar::Quotient { a, b, reciprocal } => {
                let ((x, _), (y, _), (r, _)) = (self.var(*a), self.var(*b), self.var(*reciprocal));
                self.quotient(&x, &y, &r)
            }
            Scalar::Bits { op, a, b } => {
                let ((x, _), (y, _)) = (self.var(*a), self.var(*b));
                let r = self.reg("s32");
                let ins = match op {
                    BitOp::Xor => "xor.b32",
                    BitOp::Add => "add.u32",
                    BitOp::MulLo => "mul.lo.u32",
                    BitOp::MulHi => "mul.hi.u32",
                    BitOp::Shr => "shr.u32",
                };
                self.emit(&format!("{ins} {r}, {x}, {y};"));
                r
            }
        }
    }

    /// `x / y` from `r = 1/y` (rounded): `q0 = x·r`, then one correction with the exact residual
    /// `x − q0·y` (a fused multiply-add) gives the rounded quotient whenever `q0` and `r` are normal
    /// numbers (Markstein) and the dividend is not so small that the residual underflows (|x| below
    /// ~2^-100, where it may be 1 ulp off); a zero, infinite, NaN or subnormal `q0` or `r` divides
    /// instead, so every special value is IEEE's. Four instructions an element, against a division's
    /// reciprocal, Newton step, range check and slow-path branch.
    fn quotient(&mut self, x: &str, y: &str, r: &str) -> String {
        let (q0, nq, e, q) = (self.reg("f32"), self.reg("f32"), self.reg("f32"), self.reg("f32"));
        let (normal, rn) = (self.reg("pred"), self.reg("pred"));
        self.emit(&format!("mul.rn.f32 {q0}, {x}, {r};"));
        self.emit(&format!("neg.f32 {nq}, {q0};"));
        self.emit(&format!("fma.rn.f32 {e}, {nq}, {y}, {x};"));
        self.emit(&format!("fma.rn.f32 {q}, {e}, {r}, {q0};"));
        self.emit(&format!("testp.normal.f32 {normal}, {q0};"));
        self.emit(&format!("testp.normal.f32 {rn}, {r};"));
        self.emit(&format!("and.pred {normal}, {normal}, {rn};"));
        self.emit(&format!("@!{normal} div.rn.f32 {q}, {x}, {y};"));
        q
    }

    fn binary(&mut self, op: BinaryOp, x: &str, y: &str, operand: DType) -> String {
        let t = reg_type(operand);
        // Bitwise instructions name a width, not a type.
        let bits = if matches!(t, "s64" | "u64") { "b64" } else { "b32" };
        let cmp = |op: BinaryOp| match op {
            BinaryOp::Eq => "eq",
            BinaryOp::Ne if matches!(t, "f32" | "f64") => "neu",
            BinaryOp::Ne => "ne",
            BinaryOp::Lt => "lt",
            BinaryOp::Le => "le",
            BinaryOp::Gt => "gt",
            _ => "ge",
        };
        if op.is_comparison() {
            let r = self.reg("pred");
            if t == "pred" {
                self.emit(&format!("xor.pred {r}, {x}, {y};"));
                if op == BinaryOp::Eq {
                    self.emit(&format!("not.pred {r}, {r};"));
                }
            } else {
                self.emit(&format!("setp.{}.{t} {r}, {x}, {y};", cmp(op)));
            }
            return r;
        }
        if matches!(op, BinaryOp::And | BinaryOp::Or) {
            let r = self.reg("pred");
            let o = if op == BinaryOp::And { "and" } else { "or" };
            self.emit(&format!("{o}.pred {r}, {x}, {y};"));
            return r;
        }
        if op == BinaryOp::Pow {
            if t == "f64" {
                // `graph::f64_math` writes f64 powers out before any renderer sees them.
                self.fail("an f64 pow left for the renderer (graph::f64_math writes it out)".into());
            }
            if t == "f32" {
                return self.pow(x, y);
            }
            let (fx, fy) = (self.convert(x, operand, DType::F32), self.convert(y, operand, DType::F32));
            let p = self.pow(&fx, &fy);
            return self.convert(&p, DType::F32, operand);
        }
        let r = self.reg(t);
        match (op, t) {
            (BinaryOp::Add, _) => self.emit(&format!("add.{t} {r}, {x}, {y};")),
            (BinaryOp::Sub, _) => self.emit(&format!("sub.{t} {r}, {x}, {y};")),
            (BinaryOp::Mul, "f32" | "f64") => self.emit(&format!("mul.{t} {r}, {x}, {y};")),
            (BinaryOp::Mul, _) => self.emit(&format!("mul.lo.{t} {r}, {x}, {y};")),
            (BinaryOp::Div, "f32" | "f64") => self.emit(&format!("div.rn.{t} {r}, {x}, {y};")),
            // Unsigned: truncation is floor.
            (BinaryOp::Div, "u32" | "u64") => self.emit(&format!("div.{t} {r}, {x}, {y};")),
            (BinaryOp::Div, _) => {
                // Floor division, as the reference.
                let (rm, p1, p2, p3) = (self.reg(t), self.reg("pred"), self.reg("pred"), self.reg("pred"));
                self.emit(&format!("div.{t} {r}, {x}, {y};"));
                self.emit(&format!("rem.{t} {rm}, {x}, {y};"));
                self.emit(&format!("setp.ne.{t} {p1}, {rm}, 0;"));
                self.emit(&format!("setp.lt.{t} {p2}, {rm}, 0;"));
                self.emit(&format!("setp.lt.{t} {p3}, {y}, 0;"));
                self.emit(&format!("xor.pred {p2}, {p2}, {p3};"));
                self.emit(&format!("and.pred {p1}, {p1}, {p2};"));
                self.emit(&format!("@{p1} sub.{t} {r}, {r}, 1;"));
            }
            (BinaryOp::Max, "f32") => self.emit(&format!("max.NaN.f32 {r}, {x}, {y};")),
            (BinaryOp::Min, "f32") => self.emit(&format!("min.NaN.f32 {r}, {x}, {y};")),
            (BinaryOp::Max | BinaryOp::Min, "f64") => self.f64_extreme(op == BinaryOp::Max, &r, x, y),
            (BinaryOp::Max, _) => self.emit(&format!("max.{t} {r}, {x}, {y};")),
            (BinaryOp::Min, _) => self.emit(&format!("min.{t} {r}, {x}, {y};")),
            (BinaryOp::BitAnd | BinaryOp::BitOr | BinaryOp::BitXor, _) => {
                let o = match op {
                    BinaryOp::BitAnd => "and",
                    BinaryOp::BitOr => "or",
                    _ => "xor",
                };
                self.emit(&format!("{o}.{bits} {r}, {x}, {y};"));
            }
            (BinaryOp::Shl | BinaryOp::Shr, _) => {
                // The amount as a u32 (a negative one is huge); PTX clamps amounts past the width to it.
                let s = self.reg("u32");
                if bits == "b64" {
                    let clamped = self.reg("u64");
                    self.emit(&format!("min.u64 {clamped}, {y}, 64;"));
                    self.emit(&format!("cvt.u32.u64 {s}, {clamped};"));
                } else {
                    self.emit(&format!("mov.b32 {s}, {y};"));
                }
                match op {
                    BinaryOp::Shl => self.emit(&format!("shl.{bits} {r}, {x}, {s};")),
                    _ => self.emit(&format!("shr.{t} {r}, {x}, {s};")),
                }
            }
            _ => unreachable!("comparisons, logic and pow are handled above"),
        }
        r
    }

    fn block(&mut self, body: &[Stmt]) {
        for s in body {
            self.stmt(s);
        }
    }

    /// A `Global` loop `vector_width` elements at a time (the IR guarantees the trip count divides and
    /// that loads and stores at the loop index are the contiguous ones): 2- and 4-byte buffers read and
    /// written there move as one vector per thread, the body runs once per lane.
    fn vector_loop(&mut self, s: SymId, extent: &Expr, body: &[Stmt]) {
        let w = self.k.vector_width as usize;
        let vectors = extent.floor_div(&Expr::from(w as i64));
        // PTX vectors of 2- and 4-byte elements; other vector buffers are still read per lane.
        let vectors_of = |d: DType| matches!(d.size_bytes(), 2 | 4);
        let buffers: Vec<usize> =
            self.k.vector_buffers().into_iter().filter(|b| vectors_of(self.k.buffers[*b].dtype)).collect();
        let accessed = |store: bool| -> Vec<usize> {
            buffers
                .iter()
                .copied()
                .filter(|b| {
                    body.iter().any(|st| match st {
                        Stmt::Let { value: Scalar::Load { buffer, .. }, .. } => !store && buffer == b,
                        Stmt::Store { buffer, .. } => store && buffer == b,
                        _ => false,
                    })
                })
                .collect()
        };
        let (loads, stores) = (accessed(false), accessed(true));
        let lanes: Vec<Vec<Stmt>> = (0..w as u32).map(|l| self.k.lane_body(s, body, l, &self.ranges)).collect();
        let v = kiln_graph::kernel::builtin::VECTOR_INDEX;
        self.counted_loop(v, "%gstart", "%gstride", &vectors, |w_| {
            let base = w_.reg("s64");
            let vv = w_.sym(v);
            w_.emit(&format!("mul.lo.s64 {base}, {vv}, {w};"));
            for &b in &loads {
                let a = w_.address_of(b, &base);
                let regs = w_.vector_load(b, w, &a);
                w_.vector_loads.insert(b, regs);
            }
            for &b in &stores {
                w_.vector_stores.insert(b, Vec::new());
            }
            for (lane, lane_body) in lanes.iter().enumerate() {
                let i = w_.reg("s64");
                w_.emit(&format!("add.s64 {i}, {base}, {lane};"));
                w_.syms.insert(s, i);
                w_.lane = Some((s, lane));
                w_.block(lane_body);
            }
            w_.lane = None;
            for &b in &stores {
                let a = w_.address_of(b, &base);
                let vals = w_.vector_stores.remove(&b).unwrap_or_default();
                w_.vector_store(b, &a, &vals);
            }
            w_.vector_loads.clear();
        });
    }

    /// Loads the `w` lanes of buffer `b` at address `a` into fresh registers (`b16` or `b32`, as its
    /// elements): one access of up to four elements, or eight 2-byte lanes as one `v4.b32` access whose
    /// words split into halves (`graph` gives eight lanes only where every buffer is 2-byte).
    fn vector_load(&mut self, b: usize, w: usize, a: &str) -> Vec<String> {
        self.vector_load_if(b, w, a, None)
    }

    /// [`Writer::vector_load`] where predicate `inside` holds; zeros elsewhere.
    fn vector_load_if(&mut self, b: usize, w: usize, a: &str, inside: Option<&str>) -> Vec<String> {
        let half = self.k.buffers[b].dtype.size_bytes() == 2;
        let ty = if half { "b16" } else { "b32" };
        let lanes: Vec<String> = (0..w).map(|_| self.reg(ty)).collect();
        let ld = self.ld(b);
        let at = inside.map_or(String::new(), |p| format!("@{p} "));
        if w <= 4 {
            if inside.is_some() {
                for l in &lanes {
                    self.emit(&format!("mov.{ty} {l}, 0;"));
                }
            }
            self.emit(&format!("{at}{ld}.v{w}.{ty} {{{}}}, [{a}];", lanes.join(", ")));
        } else if half && w == 8 {
            let words: Vec<String> = (0..4).map(|_| self.reg("b32")).collect();
            if inside.is_some() {
                for word in &words {
                    self.emit(&format!("mov.b32 {word}, 0;"));
                }
            }
            self.emit(&format!("{at}{ld}.v4.b32 {{{}}}, [{a}];", words.join(", ")));
            for (word, pair) in words.iter().zip(lanes.chunks(2)) {
                self.emit(&format!("mov.b32 {{{}, {}}}, {word};", pair[0], pair[1]));
            }
        } else {
            self.fail(format!("{w} lanes of {}-byte elements: past one 16-byte access", if half { 2 } else { 4 }));
        }
        lanes
    }

    /// Stores lanes `vals` of buffer `b` at address `a`, as [`Writer::vector_load`] loads them.
    fn vector_store(&mut self, b: usize, a: &str, vals: &[String]) {
        let half = self.k.buffers[b].dtype.size_bytes() == 2;
        let w = vals.len();
        if w <= 4 {
            let ty = if half { "b16" } else { "b32" };
            self.emit(&format!("st.global.v{w}.{ty} [{a}], {{{}}};", vals.join(", ")));
        } else if half && w == 8 {
            let words: Vec<String> = vals
                .chunks(2)
                .map(|pair| {
                    let word = self.reg("b32");
                    self.emit(&format!("mov.b32 {word}, {{{}}};", pair.join(", ")));
                    word
                })
                .collect();
            self.emit(&format!("st.global.v4.b32 [{a}], {{{}}};", words.join(", ")));
        } else {
            self.fail(format!("{w} lanes of {}-byte elements: past one 16-byte access", if half { 2 } else { 4 }));
        }
    }

    /// The address of element `index` (a register) of buffer `b`.
    fn address_of(&mut self, b: usize, index: &str) -> String {
        let size = self.k.buffers[b].dtype.size_bytes();
        let a = self.reg("s64");
        self.emit(&format!("mad.lo.s64 {a}, {index}, {size}, %b{b};"));
        a
    }

    /// A vector lane's raw bits (`b16`/`b32`) as a value of `dtype`, via the buffer's dtype.
    fn widen(&mut self, raw: &str, b: usize, dtype: DType) -> String {
        let d = self.k.buffers[b].dtype;
        let r = if matches!(d, DType::F16 | DType::BF16) {
            self.half_to_f32(raw, d)
        } else {
            let r = self.reg(reg_type(d));
            self.emit(&format!("mov.b32 {r}, {raw};"));
            r
        };
        self.convert(&r, d, dtype)
    }

    /// Whether the row being written keeps loads in registers (persistent rows).
    fn persistent(&self) -> bool {
        self.k.row_cache.is_some() && !self.row_cache.is_empty()
    }

    /// The register holding this thread's slot 0 of a persistent row: `local · row_lanes`.
    fn slot0(&self) -> &'static str {
        if self.k.row_lanes > 1 {
            "%rowlane"
        } else {
            "%local"
        }
    }

    /// Where slot `u` of a persistent row starts (`Kernel::row_slot_offset` from slot 0), and a
    /// predicate that it is past the row's end `extent` — none when every thread's slot `u` lies inside a
    /// row of constant length.
    fn slot_element(&mut self, u: u32, extent: &Expr) -> (String, Option<String>) {
        let j = self.reg("s64");
        self.emit(&format!("add.s64 {j}, {}, {};", self.slot0(), self.k.row_slot_offset(u)));
        if self.k.slot_inside_row(u, extent) {
            return (j, None);
        }
        let (n, past) = (self.expr(extent), self.reg("pred"));
        self.emit(&format!("setp.ge.s64 {past}, {j}, {n};"));
        (j, Some(past))
    }

    /// Persistent rows: before the row's passes, each thread loads its elements of the row once into
    /// registers (`RowLoad::of_row` says which loads); the passes read them from there. With lanes, a
    /// load `Kernel::row_vector_access` allows moves each slot group as one vector.
    fn fill_row_cache(&mut self, row: &[Stmt]) {
        let (Some(slots), Some(n)) = (self.k.row_cache, RowLoad::row_len(row)) else { return };
        let loads = RowLoad::of_row(row);
        if loads.is_empty() {
            return;
        }
        let elements: Vec<(String, Option<String>)> = (0..slots).map(|u| self.slot_element(u, n)).collect();
        let (saved_pass, saved_in) = (self.pass, std::mem::replace(&mut self.in_slot, true));
        let lanes = self.k.row_lanes.max(1) as usize;
        for load in loads {
            let mut regs = Vec::with_capacity(elements.len());
            let vector = self.k.row_vector_access(load.buffer, &load.index, ROW_ELEMENT);
            for (u, (j, past)) in elements.iter().enumerate() {
                if vector && u % lanes != 0 {
                    continue;
                }
                let inside = past.as_ref().map(|past| {
                    let inside = self.reg("pred");
                    self.emit(&format!("not.pred {inside}, {past};"));
                    inside
                });
                self.syms.insert(ROW_ELEMENT, j.clone());
                self.pass = Some((ROW_ELEMENT, u));
                if vector {
                    let a = self.address(load.buffer, &load.index);
                    for raw in self.vector_load_if(load.buffer, lanes, &a, inside.as_deref()) {
                        regs.push(self.widen(&raw, load.buffer, load.dtype));
                    }
                } else {
                    let (raw, from) = self.load(load.buffer, &load.index, inside.as_deref());
                    regs.push(self.convert(&raw, from, load.dtype));
                }
            }
            self.row_cache.insert((load.buffer, load.dtype, load.index), regs);
        }
        (self.pass, self.in_slot) = (saved_pass, saved_in);
    }

    /// A pass of a persistent row over `s` (statements `body`), unrolled: `each` runs once per slot with
    /// `s` bound to the slot's element, skipped past the row's end. With lanes, slots go a group at a
    /// time: the body's loads and stores `Kernel::row_group_accesses` names move once a group, as
    /// vectors, and the lanes read and fill them.
    fn slots(&mut self, s: SymId, extent: &Expr, body: &[Stmt], mut each: impl FnMut(&mut Self)) {
        let (saved, saved_in) = (self.pass, std::mem::replace(&mut self.in_slot, true));
        let lanes = self.k.row_lanes.max(1);
        let (loads, stores) = self.k.row_group_accesses(s, body);
        let grouped = !loads.is_empty() || !stores.is_empty();
        let step = if grouped { lanes } else { 1 };
        let slots = self.k.row_cache.unwrap_or(1);
        for first in (0..slots).step_by(step as usize) {
            let (j0, past) = self.slot_element(first, extent);
            let skip = past.map(|past| {
                let skip = self.label();
                self.emit(&format!("@{past} bra {skip};"));
                skip
            });
            if grouped {
                self.syms.insert(s, j0.clone());
                self.pass = Some((s, first as usize));
                for (b, _, index) in &loads {
                    let a = self.address(*b, index);
                    let regs = self.vector_load(*b, lanes as usize, &a);
                    self.group_loads.insert((*b, index.clone()), regs);
                }
                for key in &stores {
                    self.group_stores.insert(key.clone(), Vec::new());
                }
            }
            for lane in 0..step {
                let u = first + lane;
                let j = if lane == 0 {
                    j0.clone()
                } else {
                    let j = self.reg("s64");
                    self.emit(&format!("add.s64 {j}, {j0}, {lane};"));
                    j
                };
                self.syms.insert(s, j);
                self.pass = Some((s, u as usize));
                self.group_lane = grouped.then_some(lane as usize);
                each(self);
            }
            self.group_lane = None;
            if grouped {
                self.syms.insert(s, j0.clone());
                self.pass = Some((s, first as usize));
                for (b, index) in &stores {
                    let vals = self.group_stores.remove(&(*b, index.clone())).unwrap_or_default();
                    let a = self.address(*b, index);
                    self.vector_store(*b, &a, &vals);
                }
                self.group_loads.clear();
            }
            if let Some(skip) = skip {
                self.place(&skip);
            }
        }
        (self.pass, self.in_slot) = (saved, saved_in);
    }

    /// `for sym in start..extent step stride { body }` as labelled branches.
    fn counted_loop(&mut self, s: SymId, start: &str, stride: &str, extent: &Expr, body: impl FnOnce(&mut Self)) {
        // A loop's body is not once per slot: its addresses move with its own variable.
        let saved_in = std::mem::replace(&mut self.in_slot, false);
        let i = self.reg("s64");
        self.syms.insert(s, i.clone());
        let n = self.expr(extent);
        let (top, end) = (self.label(), self.label());
        self.emit(&format!("mov.s64 {i}, {start};"));
        self.place(&top);
        let p = self.reg("pred");
        self.emit(&format!("setp.ge.s64 {p}, {i}, {n};"));
        self.emit(&format!("@{p} bra {end};"));
        body(self);
        self.emit(&format!("add.s64 {i}, {i}, {stride};"));
        self.emit(&format!("bra {top};"));
        self.place(&end);
        self.in_slot = saved_in;
    }

    fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::Let { var, dtype, value } => {
                let r = self.scalar(*dtype, value);
                self.vars.insert(*var, (r, *dtype));
            }
            Stmt::BindIndex { sym, var, bound } => {
                let (v, from) = self.var(*var);
                let x = self.convert(&v, from, DType::I64);
                let b = self.expr(bound);
                let (hi, r) = (self.reg("s64"), self.reg("s64"));
                self.emit(&format!("sub.s64 {hi}, {b}, 1;"));
                self.emit(&format!("min.s64 {r}, {x}, {hi};"));
                self.emit(&format!("max.s64 {r}, {r}, 0;"));
                self.syms.insert(*sym, r);
            }
            Stmt::Store { buffer, index, value } => self.store(*buffer, index, *value),
            Stmt::Fault { cond, site } => {
                let (c, _) = self.var(*cond);
                self.emit(&format!("@{c} red.global.max.u32 [%fault], {};", site + 1));
            }
            Stmt::Loop { sym, extent, mode: LoopMode::Global, body } if self.k.vector_width > 1 => {
                let saved = std::mem::replace(&mut self.single_thread_stores, false);
                self.vector_loop(*sym, extent, body);
                self.single_thread_stores = saved;
            }
            Stmt::Loop { sym, extent, mode, body } => {
                let saved = self.single_thread_stores;
                let (start, stride) = match mode {
                    LoopMode::Global => ("%gstart", "%gstride"),
                    LoopMode::Group => ("%group", "%ngroups"),
                    LoopMode::Threads => ("%local", "%threads"),
                    LoopMode::Serial => ("0", "1"),
                };
                match mode {
                    LoopMode::Group => self.single_thread_stores = true,
                    LoopMode::Threads | LoopMode::Global => self.single_thread_stores = false,
                    LoopMode::Serial => {}
                }
                if *mode == LoopMode::Threads && self.persistent() {
                    self.slots(*sym, extent, body, |w| w.block(body));
                } else if *mode == LoopMode::Group {
                    self.counted_loop(*sym, start, stride, extent, |w| {
                        w.fill_row_cache(body);
                        w.block(body);
                        w.row_cache.clear();
                        w.slot_bases.clear();
                    });
                } else {
                    self.counted_loop(*sym, start, stride, extent, |w| w.block(body));
                }
                self.single_thread_stores = saved;
            }
            Stmt::Reduce { out, dtype, op, sym, extent, strategy, body, value } => {
                self.reduce(*out, *dtype, *op, *sym, extent, *strategy, body, *value)
            }
            Stmt::MatMul(m) => self.matmul(m),
            Stmt::Gemm(_) => self.fail("a library GEMM is a runtime call, not PTX".into()),
            Stmt::AllReduce(_) => self.fail("an all-reduce is a collective call (NCCL), not PTX".into()),
            Stmt::Attention(a) => self.attention(a),
        }
    }

    fn init(&mut self, op: KReduceOp, ty: &str) -> &'static str {
        match (op, ty) {
            (KReduceOp::Sum, "f32") => "0f00000000",
            (KReduceOp::Sum, "f64") => "0d0000000000000000",
            (KReduceOp::Max | KReduceOp::ArgMax, "f64") => "0dFFF0000000000000",
            (KReduceOp::Min | KReduceOp::ArgMin, "f64") => "0d7FF0000000000000",
            (KReduceOp::Sum, _) => "0",
            (KReduceOp::Max | KReduceOp::ArgMax, "f32") => "0fFF800000",
            (KReduceOp::Min | KReduceOp::ArgMin, "f32") => "0f7F800000",
            (KReduceOp::Max | KReduceOp::ArgMax, "s32") => "-2147483648",
            (KReduceOp::Min | KReduceOp::ArgMin, "s32") => "2147483647",
            (KReduceOp::Max | KReduceOp::ArgMax, "u32" | "u64") => "0",
            (KReduceOp::Min | KReduceOp::ArgMin, "u32") => "4294967295",
            (KReduceOp::Min | KReduceOp::ArgMin, "u64") => "18446744073709551615",
            (KReduceOp::Max | KReduceOp::ArgMax, _) => "-9223372036854775808",
            (KReduceOp::Min | KReduceOp::ArgMin, _) => "9223372036854775807",
        }
    }

    fn combine(&mut self, op: KReduceOp, ty: &str, acc: &str, v: &str) {
        match (op, ty) {
            (KReduceOp::Sum, _) => self.emit(&format!("add.{ty} {acc}, {acc}, {v};")),
            (KReduceOp::Max, "f32") => self.emit(&format!("max.NaN.f32 {acc}, {acc}, {v};")),
            (KReduceOp::Min, "f32") => self.emit(&format!("min.NaN.f32 {acc}, {acc}, {v};")),
            (KReduceOp::Max | KReduceOp::Min, "f64") => {
                let r = self.reg("f64");
                self.f64_extreme(op == KReduceOp::Max, &r, acc, v);
                self.emit(&format!("mov.f64 {acc}, {r};"));
            }
            (KReduceOp::Max, _) => self.emit(&format!("max.{ty} {acc}, {acc}, {v};")),
            (KReduceOp::Min, _) => self.emit(&format!("min.{ty} {acc}, {acc}, {v};")),
            _ => unreachable!("arg reductions combine pairs"),
        }
    }

    /// Moves `(v, i)` into `(bv, bi)` when it is better: NaN first (the first NaN stays), then the extreme
    /// value, then the smaller index.
    fn arg_update(&mut self, op: KReduceOp, ty: &str, v: &str, i: &str, bv: &str, bi: &str) {
        let (nv, nb) = (self.reg("pred"), self.reg("pred"));
        if matches!(ty, "f32" | "f64") {
            self.emit(&format!("setp.nan.{ty} {nv}, {v}, {v};"));
            self.emit(&format!("setp.nan.{ty} {nb}, {bv}, {bv};"));
        } else {
            self.emit(&format!("setp.ne.s32 {nv}, 0, 0;"));
            self.emit(&format!("setp.ne.s32 {nb}, 0, 0;"));
        }
        let cmp = if op == KReduceOp::ArgMax { "gt" } else { "lt" };
        let (ext, eq, earlier, a, b, better) = (
            self.reg("pred"),
            self.reg("pred"),
            self.reg("pred"),
            self.reg("pred"),
            self.reg("pred"),
            self.reg("pred"),
        );
        self.emit(&format!("setp.{cmp}.{ty} {ext}, {v}, {bv};"));
        self.emit(&format!("setp.eq.{ty} {eq}, {v}, {bv};"));
        self.emit(&format!("setp.lt.s64 {earlier}, {i}, {bi};"));
        self.emit(&format!("and.pred {eq}, {eq}, {earlier};"));
        self.emit(&format!("or.pred {ext}, {ext}, {eq};"));
        // a: both non-NaN and better; b: v NaN and (best not NaN or earlier).
        self.emit(&format!("or.pred {a}, {nv}, {nb};"));
        self.emit(&format!("not.pred {a}, {a};"));
        self.emit(&format!("and.pred {a}, {a}, {ext};"));
        self.emit(&format!("not.pred {b}, {nb};"));
        self.emit(&format!("or.pred {b}, {b}, {earlier};"));
        self.emit(&format!("and.pred {b}, {b}, {nv};"));
        self.emit(&format!("or.pred {better}, {a}, {b};"));
        self.emit(&format!("@{better} mov.{ty} {bv}, {v};"));
        self.emit(&format!("@{better} mov.s64 {bi}, {i};"));
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &mut self,
        out: VarId,
        dtype: DType,
        op: KReduceOp,
        s: SymId,
        extent: &Expr,
        strategy: ReduceStrategy,
        body: &[Stmt],
        value: VarId,
    ) {
        let ty = reg_type(dtype);
        let arg = matches!(op, KReduceOp::ArgMax | KReduceOp::ArgMin);
        let (acc, idx) = (self.reg(ty), self.reg("s64"));
        let init = self.init(op, ty);
        self.emit(&format!("mov.{ty} {acc}, {init};"));
        self.emit(&format!("mov.s64 {idx}, 9223372036854775807;"));
        let grouped = matches!(strategy, ReduceStrategy::Group { .. });
        let (start, stride) = if grouped { ("%local", "%threads") } else { ("0", "1") };
        let saved = self.single_thread_stores;
        self.single_thread_stores = false;
        let (acc2, idx2) = (acc.clone(), idx.clone());
        let each = |w: &mut Self| {
            w.block(body);
            let (v, from) = w.var(value);
            let v = w.convert(&v, from, dtype);
            if arg {
                let j = w.sym(s);
                w.arg_update(op, ty, &v, &j, &acc2, &idx2);
            } else {
                w.combine(op, ty, &acc2, &v);
            }
        };
        if grouped && self.persistent() {
            self.slots(s, extent, body, each);
        } else {
            self.counted_loop(s, start, stride, extent, each);
        }
        self.single_thread_stores = saved;
        let t = self.k.launch.threads as i64;
        if let ReduceStrategy::Group { subgroup: Some(s) } = strategy {
            if s == 32 {
                self.warp_reduce(op, ty, &acc, t);
            } else {
                self.fail(format!("a combine shuffling in subgroups of {s}: a warp has 32 lanes"));
            }
        } else if grouped && self.k.launch.packed > 1 {
            self.fail(format!("a {ty} reduction of packed groups: they combine by warp shuffles only"));
        } else if grouped {
            let elem = if matches!(ty, "f32" | "s32" | "u32") { 4 } else { 8 };
            // Shared arrays by width: a u32 partial sits in the s32 array, a u64 in the s64 one.
            let shared = match ty {
                "f32" => "red_f32",
                "s32" | "u32" => "red_s32",
                _ => "red_s64",
            };
            self.shared.insert(shared);
            if arg {
                self.shared.insert("red_idx");
            }
            let (base, ibase, a) = (self.reg("s64"), self.reg("s64"), self.reg("s64"));
            self.emit(&format!("mov.u64 {base}, {shared};"));
            self.emit(&format!("mad.lo.s64 {a}, %local, {elem}, {base};"));
            self.emit(&format!("st.shared.{ty} [{a}], {acc};"));
            let ia = self.reg("s64");
            if arg {
                self.emit(&format!("mov.u64 {ibase}, red_idx;"));
                self.emit(&format!("mad.lo.s64 {ia}, %local, 8, {ibase};"));
                self.emit(&format!("st.shared.s64 [{ia}], {idx};"));
            }
            self.emit("bar.sync 0;");
            let mut stride = t / 2;
            while stride > 0 {
                let skip = self.label();
                let p = self.reg("pred");
                self.emit(&format!("setp.ge.s64 {p}, %local, {stride};"));
                self.emit(&format!("@{p} bra {skip};"));
                let (other, x, y) = (self.reg("s64"), self.reg(ty), self.reg(ty));
                self.emit(&format!("add.s64 {other}, {a}, {};", stride * elem));
                self.emit(&format!("ld.shared.{ty} {x}, [{a}];"));
                self.emit(&format!("ld.shared.{ty} {y}, [{other}];"));
                if arg {
                    let (io, ix, iy) = (self.reg("s64"), self.reg("s64"), self.reg("s64"));
                    self.emit(&format!("add.s64 {io}, {ia}, {};", stride * 8));
                    self.emit(&format!("ld.shared.s64 {ix}, [{ia}];"));
                    self.emit(&format!("ld.shared.s64 {iy}, [{io}];"));
                    self.arg_update(op, ty, &y, &iy, &x, &ix);
                    self.emit(&format!("st.shared.s64 [{ia}], {ix};"));
                } else {
                    self.combine(op, ty, &x, &y);
                }
                self.emit(&format!("st.shared.{ty} [{a}], {x};"));
                self.place(&skip);
                self.emit("bar.sync 0;");
                stride /= 2;
            }
            self.emit(&format!("ld.shared.{ty} {acc}, [{base}];"));
            if arg {
                self.emit(&format!("ld.shared.s64 {idx}, [{ibase}];"));
            }
            self.emit("bar.sync 0;");
        }
        if arg {
            self.vars.insert(out, (idx, DType::I64));
        } else {
            self.vars.insert(out, (acc, dtype));
        }
    }

    /// Combines the partials of a workgroup: butterfly shuffles inside each warp, then every thread
    /// folds the warps' results from shared memory (two barriers, against one per halving step of a
    /// shared-memory tree). Every thread ends with the total in `acc`.
    fn warp_reduce(&mut self, op: KReduceOp, ty: &str, acc: &str, threads: i64) {
        for offset in [16, 8, 4, 2, 1] {
            let y = self.reg(ty);
            self.emit(&format!("shfl.sync.bfly.b32 {y}, {acc}, {offset}, 31, -1;"));
            self.combine(op, ty, acc, &y);
        }
        if threads == 32 {
            // One warp: every lane holds the total already (and packed groups must not meet at a barrier).
            return;
        }
        let shared = if ty == "f32" { "red_f32" } else { "red_s32" };
        self.shared.insert(shared);
        let (base, lane, a, skip) = (self.reg("s64"), self.reg("s64"), self.reg("s64"), self.label());
        self.emit(&format!("mov.u64 {base}, {shared};"));
        self.emit(&format!("and.b64 {lane}, %local, 31;"));
        self.emit(&format!("shr.s64 {a}, %local, 5;"));
        self.emit(&format!("mad.lo.s64 {a}, {a}, 4, {base};"));
        let p = self.reg("pred");
        self.emit(&format!("setp.ne.s64 {p}, {lane}, 0;"));
        self.emit(&format!("@{p} bra {skip};"));
        self.emit(&format!("st.shared.{ty} [{a}], {acc};"));
        self.place(&skip);
        self.emit("bar.sync 0;");
        self.emit(&format!("ld.shared.{ty} {acc}, [{base}];"));
        for w in 1..threads / 32 {
            let y = self.reg(ty);
            self.emit(&format!("ld.shared.{ty} {y}, [{base}+{}];", w * 4));
            self.combine(op, ty, acc, &y);
        }
        // Nobody may overwrite the partials before every thread has read them.
        self.emit("bar.sync 0;");
    }

    /// The matmul template, as its [`kiln_graph::kernel::Tile`] schedules it (the WGSL renderer prints the
    /// same schedule): a workgroup per `tile.m × tile.n` block of one batch entry's output (grid-stride
    /// over blocks), each thread its runs of rows and columns with the sums in registers. Every step of
    /// depth `tile.k`, the threads read the next A and B tiles through the operand code into registers
    /// while the previous step's tiles, in shared memory, are multiplied (`run`-wide shared loads).
    /// Matmul regions are meant for cuBLASLt on this backend; this form runs the rest (integer products,
    /// operands no library takes as they lie, `KILN_CUDA_GEMM=kiln`).
    fn matmul(&mut self, m: &MatMul) {
        let threads = self.k.launch.threads;
        if let Some(why) = m.tile.unfit(threads) {
            self.fail(format!("matmul schedule: {why}"));
            return;
        }
        let saved_in = std::mem::replace(&mut self.in_slot, false);
        let [bs, is, js, ps] = m.syms;
        let t = i64::from(threads);
        let (tm, tn, tk) = (i64::from(m.tile.m), i64::from(m.tile.n), i64::from(m.tile.k));
        let [rows, cols] = m.tile.threads.map(i64::from);
        let run = i64::from(m.tile.run);
        let [rm, rn] = m.tile.per_thread().map(|x| x as usize);
        let ty = reg_type(m.acc_dtype);
        let elem: i64 = if matches!(ty, "s64" | "f64") { 8 } else { 4 };
        let sa = i64::from(m.tile.a_stride());
        let stages = i64::from(m.tile.stages.max(1));
        self.extra_shared.push(format!(".shared .align 16 .{ty} mm_as[{}];", sa * tk * stages));
        self.extra_shared
            .push(format!(".shared .align 16 .{ty} mm_bs[{}];", tk * i64::from(m.tile.b_stride()) * stages));
        let (bn, mm, nn, kk) = (self.expr(&m.batch), self.expr(&m.m), self.expr(&m.n), self.expr(&m.k));
        let ceil = |w: &mut Self, x: &str, d: i64| {
            let r = w.reg("s64");
            w.emit(&format!("add.s64 {r}, {x}, {};", d - 1));
            w.emit(&format!("div.s64 {r}, {r}, {d};"));
            r
        };
        let (tiles_m, tiles_n, steps) = (ceil(self, &mm, tm), ceil(self, &nn, tn), ceil(self, &kk, tk));
        let (per_batch, blocks, tx, tyr) = (self.reg("s64"), self.reg("s64"), self.reg("s64"), self.reg("s64"));
        self.emit(&format!("mul.lo.s64 {per_batch}, {tiles_m}, {tiles_n};"));
        self.emit(&format!("mul.lo.s64 {blocks}, {per_batch}, {bn};"));
        self.emit(&format!("rem.s64 {tx}, %local, {cols};"));
        self.emit(&format!("div.s64 {tyr}, %local, {cols};"));
        // Each thread's first shared element of a step's A and B runs; the rest are constant offsets.
        let (a_base, b_base, a_thread, b_thread) = (self.reg("s64"), self.reg("s64"), self.reg("s64"), self.reg("s64"));
        self.emit(&format!("mov.u64 {a_base}, mm_as;"));
        self.emit(&format!("mov.u64 {b_base}, mm_bs;"));
        self.emit(&format!("mad.lo.s64 {a_thread}, {tyr}, {}, {a_base};", elem * run));
        self.emit(&format!("mad.lo.s64 {b_thread}, {tx}, {}, {b_base};", elem * run));
        let sb = i64::from(m.tile.b_stride());
        // Where a thread's slots walk a step's tile evenly (`Tile::slot_step`): the walk, and its first
        // element's depth, row or column and shared address, computed once (else each slot's, every step).
        let mut firsts: [Option<FirstSlot>; 2] = [None, None];
        for (side, (outer, stride, base)) in [(tm, sa, &a_base), (tn, sb, &b_base)].into_iter().enumerate() {
            let Some(walk) = m.tile.slot_step(side, threads) else { continue };
            let (depth, other, at) = (self.reg("s64"), self.reg("s64"), self.reg("s64"));
            let (d_op, o_op, by) = if m.tile.depth_fastest[side] { ("rem", "div", tk) } else { ("div", "rem", outer) };
            self.emit(&format!("{d_op}.s64 {depth}, %local, {by};"));
            self.emit(&format!("{o_op}.s64 {other}, %local, {by};"));
            self.emit(&format!("mad.lo.s64 {at}, {depth}, {stride}, {other};"));
            self.emit(&format!("mad.lo.s64 {at}, {at}, {elem}, {base};"));
            firsts[side] = Some(FirstSlot { walk, depth, other, at });
        }
        let (blk, top, end) = (self.reg("s64"), self.label(), self.label());
        self.emit(&format!("mov.s64 {blk}, %group;"));
        self.place(&top);
        let done = self.reg("pred");
        self.emit(&format!("setp.ge.s64 {done}, {blk}, {blocks};"));
        self.emit(&format!("@{done} bra {end};"));
        let (b, rest, row0, col0) = (self.reg("s64"), self.reg("s64"), self.reg("s64"), self.reg("s64"));
        self.emit(&format!("div.s64 {b}, {blk}, {per_batch};"));
        self.emit(&format!("rem.s64 {rest}, {blk}, {per_batch};"));
        self.emit(&format!("div.s64 {row0}, {rest}, {tiles_n};"));
        self.emit(&format!("mul.lo.s64 {row0}, {row0}, {tm};"));
        self.emit(&format!("rem.s64 {col0}, {rest}, {tiles_n};"));
        self.emit(&format!("mul.lo.s64 {col0}, {col0}, {tn};"));
        self.syms.insert(bs, b);
        let zero = match ty {
            "f32" => "0f00000000",
            "f64" => "0d0000000000000000",
            _ => "0",
        };
        let mut accs = vec![vec![String::new(); rn]; rm];
        for row in accs.iter_mut() {
            for acc in row.iter_mut() {
                *acc = self.reg(ty);
                self.emit(&format!("mov.{ty} {acc}, {zero};"));
            }
        }
        let [slots_a, slots_b] = m.tile.slots(threads);
        let ra: Vec<String> = (0..slots_a).map(|_| self.reg(ty)).collect();
        let rb: Vec<String> = (0..slots_b).map(|_| self.reg(ty)).collect();
        if stages > 1 {
            // The previous block's last step may still be multiplying the tiles this block's first
            // step overwrites.
            self.emit("bar.sync 0;");
        }
        // Step s stores the tiles read in step s - 1, reads step s's, and multiplies step s - 1's.
        let (step, step_top, step_end) = (self.reg("s64"), self.label(), self.label());
        self.emit(&format!("mov.s64 {step}, 0;"));
        self.place(&step_top);
        let past = self.reg("pred");
        self.emit(&format!("setp.gt.s64 {past}, {step}, {steps};"));
        self.emit(&format!("@{past} bra {step_end};"));
        let (first, skip_store) = (self.reg("pred"), self.label());
        self.emit(&format!("setp.eq.s64 {first}, {step}, 0;"));
        self.emit(&format!("@{first} bra {skip_store};"));
        // This step's tiles in workgroup memory: with two stages, the first or second half as the step
        // is even or odd (the previous step multiplied the other half, so one barrier keeps them apart).
        // Stores start from the thread's first element where the slots walk evenly.
        let store_base = |side: usize, base: &String| firsts[side].as_ref().map_or(base.clone(), |f| f.at.clone());
        let (a_store, b_store) = (store_base(0, &a_base), store_base(1, &b_base));
        let bases = [&a_store, &b_store, &a_thread, &b_thread];
        let [a_step, b_step, a_read, b_read] = if stages > 1 {
            let odd = self.reg("s64");
            self.emit(&format!("and.b64 {odd}, {step}, 1;"));
            let mut regs = bases.map(String::clone);
            for (r, (from, bytes)) in regs.iter_mut().zip(bases.into_iter().zip([sa, sb, sa, sb])) {
                *r = self.reg("s64");
                self.emit(&format!("mad.lo.s64 {r}, {odd}, {}, {from};", bytes * tk * elem));
            }
            regs
        } else {
            self.emit("bar.sync 0;");
            bases.map(String::clone)
        };
        // Element e of a step's tile of an operand whose other axis has `outer` elements: its depth and its
        // row (A) or column (B) within the tile, in the order `Tile::depth_fastest` reads it.
        let split = |w: &mut Self, e: &str, depth_fastest: bool, outer: i64| {
            let (depth, other) = (w.reg("s64"), w.reg("s64"));
            let (d_op, o_op, by) = if depth_fastest { ("rem", "div", tk) } else { ("div", "rem", outer) };
            w.emit(&format!("{d_op}.s64 {depth}, {e}, {by};"));
            w.emit(&format!("{o_op}.s64 {other}, {e}, {by};"));
            (depth, other)
        };
        let [a_order, b_order] = m.tile.depth_fastest;
        let sides = [(&ra, tm, a_order, sa, &a_step), (&rb, tn, b_order, sb, &b_step)];
        for (side, (regs, outer, order, stride, base)) in sides.into_iter().enumerate() {
            let len = outer * tk;
            for (q, r) in regs.iter().enumerate() {
                let (e, skip) = (self.reg("s64"), self.label());
                self.emit(&format!("add.s64 {e}, %local, {};", q as i64 * t));
                if regs.len() as i64 * t > len {
                    let p = self.reg("pred");
                    self.emit(&format!("setp.ge.s64 {p}, {e}, {len};"));
                    self.emit(&format!("@{p} bra {skip};"));
                }
                // Stored [depth][row or column], padded (`Tile::a_stride`, `Tile::b_stride`).
                if let Some(FirstSlot { walk: [dd, step_other], .. }) = firsts[side] {
                    let at = q as i64 * (i64::from(dd) * stride + i64::from(step_other)) * elem;
                    self.emit(&format!("st.shared.{ty} [{base}+{at}], {r};"));
                    self.place(&skip);
                    continue;
                }
                let (depth, other) = split(self, &e, order, outer);
                self.emit(&format!("mad.lo.s64 {depth}, {depth}, {stride}, {other};"));
                self.emit(&format!("mad.lo.s64 {depth}, {depth}, {elem}, {base};"));
                self.emit(&format!("st.shared.{ty} [{depth}], {r};"));
                self.place(&skip);
            }
        }
        self.emit("bar.sync 0;");
        self.place(&skip_store);
        let (last, skip_load) = (self.reg("pred"), self.label());
        self.emit(&format!("setp.ge.s64 {last}, {step}, {steps};"));
        self.emit(&format!("@{last} bra {skip_load};"));
        let k0 = self.reg("s64");
        self.emit(&format!("mul.lo.s64 {k0}, {step}, {tk};"));
        // Bounds every element passes (`MatMul::whole_tiles`) are not checked.
        let [rows_whole, cols_whole, depth_whole] = m.whole_tiles();
        let sides = [
            (&ra, tm, a_order, is, &row0, &mm, rows_whole, &m.a),
            (&rb, tn, b_order, js, &col0, &nn, cols_whole, &m.b),
        ];
        for (side, (regs, outer, order, other_sym, other_base, other_bound, other_whole, operand)) in
            sides.into_iter().enumerate()
        {
            let len = outer * tk;
            for (q, r) in regs.iter().enumerate() {
                let (e, skip) = (self.reg("s64"), self.label());
                self.emit(&format!("add.s64 {e}, %local, {};", q as i64 * t));
                self.emit(&format!("mov.{ty} {r}, {zero};"));
                let (depth, other) = match &firsts[side] {
                    Some(FirstSlot { walk: [dd, step_other], depth: d0, other: o0, .. }) => {
                        let (dd, step_other) = (*dd, *step_other);
                        let (depth, other) = (self.reg("s64"), self.reg("s64"));
                        self.emit(&format!("add.s64 {depth}, {d0}, {};", q as i64 * i64::from(dd)));
                        self.emit(&format!("add.s64 {other}, {o0}, {};", q as i64 * i64::from(step_other)));
                        (depth, other)
                    }
                    _ => split(self, &e, order, outer),
                };
                self.emit(&format!("add.s64 {depth}, {depth}, {k0};"));
                self.emit(&format!("add.s64 {other}, {other}, {other_base};"));
                let mut guards = Vec::new();
                if !depth_whole {
                    guards.push((depth.clone(), kk.clone()));
                }
                if !other_whole {
                    guards.push((other.clone(), other_bound.clone()));
                }
                if regs.len() as i64 * t > len {
                    guards.push((e.clone(), len.to_string()));
                }
                for (x, bound) in guards {
                    let p = self.reg("pred");
                    self.emit(&format!("setp.ge.s64 {p}, {x}, {bound};"));
                    self.emit(&format!("@{p} bra {skip};"));
                }
                self.syms.insert(ps, depth);
                self.syms.insert(other_sym, other);
                self.block(&operand.body);
                let (v, from) = self.var(operand.value);
                let v = self.convert(&v, from, m.acc_dtype);
                self.emit(&format!("mov.{ty} {r}, {v};"));
                self.place(&skip);
            }
        }
        self.place(&skip_load);
        let skip_compute = self.label();
        self.emit(&format!("@{first} bra {skip_compute};"));
        // `run`-wide shared loads where PTX has them (v2/v4 of 32-bit values), else one at a time.
        let width = if elem == 4 && run > 1 { run } else { 1 };
        let read = |w: &mut Self, base: &str, offset: i64| -> Vec<String> {
            let mut vals = Vec::new();
            for piece in 0..run / width {
                let regs: Vec<String> = (0..width).map(|_| w.reg(ty)).collect();
                let at = offset + piece * width * elem;
                if width == 1 {
                    w.emit(&format!("ld.shared.{ty} {}, [{base}+{at}];", regs[0]));
                } else {
                    w.emit(&format!("ld.shared.v{width}.{ty} {{{}}}, [{base}+{at}];", regs.join(", ")));
                }
                vals.extend(regs);
            }
            vals
        };
        for depth in 0..tk {
            let mut a_vals = Vec::new();
            for g in 0..rm as i64 / run {
                a_vals.extend(read(self, &a_read, elem * (depth * sa + g * rows * run)));
            }
            let mut b_vals = Vec::new();
            for g in 0..rn as i64 / run {
                b_vals.extend(read(self, &b_read, elem * (depth * sb + g * cols * run)));
            }
            for (r, x) in a_vals.iter().enumerate() {
                for (c, y) in b_vals.iter().enumerate() {
                    let acc = &accs[r][c];
                    if matches!(ty, "f32" | "f64") {
                        self.emit(&format!("fma.rn.{ty} {acc}, {x}, {y}, {acc};"));
                    } else {
                        self.emit(&format!("mad.lo.{ty} {acc}, {x}, {y}, {acc};"));
                    }
                }
            }
        }
        self.place(&skip_compute);
        self.emit(&format!("add.s64 {step}, {step}, 1;"));
        self.emit(&format!("bra {step_top};"));
        self.place(&step_end);
        let saved = self.single_thread_stores;
        self.single_thread_stores = false;
        for (r, row) in accs.iter().enumerate() {
            for (c, acc) in row.iter().enumerate() {
                let (i, j, skip) = (self.reg("s64"), self.reg("s64"), self.label());
                self.emit(&format!("mad.lo.s64 {i}, {tyr}, {run}, {row0};"));
                self.emit(&format!("add.s64 {i}, {i}, {};", m.tile.owned(0, r as u32)));
                self.emit(&format!("mad.lo.s64 {j}, {tx}, {run}, {col0};"));
                self.emit(&format!("add.s64 {j}, {j}, {};", m.tile.owned(1, c as u32)));
                for (x, bound, _) in [(&i, &mm, rows_whole), (&j, &nn, cols_whole)].into_iter().filter(|g| !g.2) {
                    let p = self.reg("pred");
                    self.emit(&format!("setp.ge.s64 {p}, {x}, {bound};"));
                    self.emit(&format!("@{p} bra {skip};"));
                }
                self.syms.insert(is, i);
                self.syms.insert(js, j);
                self.vars.insert(m.acc, (acc.clone(), m.acc_dtype));
                self.block(&m.epilogue);
                self.place(&skip);
            }
        }
        self.single_thread_stores = saved;
        self.emit(&format!("add.s64 {blk}, {blk}, %ngroups;"));
        self.emit(&format!("bra {top};"));
        self.place(&end);
        self.in_slot = saved_in;
    }
}

/// The PTX ISA version to emit for a compute capability: the lowest with every instruction used
/// (`max.NaN`, bf16 conversions: 7.0 on sm_80; sm_90 needs 7.8).
fn isa(sm: u32) -> &'static str {
    if sm >= 90 {
        "7.8"
    } else {
        "7.0"
    }
}

impl<'k> Writer<'k> {
    /// A writer of `k`'s code (a whole kernel, or one part of a combined kernel), naming registers and
    /// labels from `next` on.
    fn new(k: &'k Kernel, next: usize) -> Writer<'k> {
        let mut w = Writer {
            k,
            body: String::new(),
            decls: Vec::new(),
            next,
            vars: HashMap::new(),
            syms: HashMap::new(),
            single_thread_stores: false,
            shared: Default::default(),
            error: None,
            row_cache: HashMap::new(),
            pass: None,
            in_slot: false,
            slot_bases: HashMap::new(),
            bound: k.bound_indices(),
            ranges: k.index_ranges(),
            lane: None,
            vector_loads: HashMap::new(),
            vector_stores: HashMap::new(),
            group_lane: None,
            group_loads: HashMap::new(),
            group_stores: HashMap::new(),
            extra_shared: Vec::new(),
        };
        for s in &k.symbols {
            w.syms.insert(*s, format!("%s{}", s.0));
        }
        w
    }

    /// The start of a combined kernel's part on workgroups `start ..` (its own launch's count of them):
    /// other workgroups go on to `skip`; this part's see the range as their workgroups from 0, so its
    /// loops start and stride as in a launch of its own.
    fn enter_part(&mut self, start: &Expr, skip: &str) {
        let (from, groups) = (self.expr(start), self.expr(&self.k.launch.groups));
        let (end, outside) = (self.reg("s64"), self.reg("pred"));
        self.emit(&format!("add.s64 {end}, {from}, {groups};"));
        self.emit(&format!("setp.lt.s64 {outside}, %group, {from};"));
        self.emit(&format!("@{outside} bra {skip};"));
        self.emit(&format!("setp.ge.s64 {outside}, %group, {end};"));
        self.emit(&format!("@{outside} bra {skip};"));
        self.emit(&format!("sub.s64 %group, %group, {from};"));
        self.emit(&format!("mov.s64 %ngroups, {groups};"));
        self.emit("mad.lo.s64 %gstart, %group, %threads, %local;");
        self.emit("mul.lo.s64 %gstride, %ngroups, %threads;");
        if self.k.row_lanes > 1 {
            self.emit(&format!("mul.lo.s64 %rowlane, %local, {};", self.k.row_lanes));
        }
    }
}

/// Renders `kernel` as a PTX module for `sm_<sm>` (80 or newer). A combined kernel's parts are written
/// one after another, each behind a branch on the workgroup.
pub fn render(kernel: &Kernel, sm: u32) -> Result<PtxKernel, RenderError> {
    let fail = |msg: String| RenderError { kernel: kernel.name.clone(), msg };
    if sm < 80 {
        return Err(fail(format!("sm_{sm} is not supported (sm_80 or newer)")));
    }
    let mut w = Writer::new(kernel, 0);
    w.block(&kernel.body);
    if let Some(msg) = w.error.take() {
        return Err(fail(msg));
    }
    for (part, start) in kernel.parts.iter().zip(&kernel.part_offsets()) {
        let mut p = Writer::new(part, w.next);
        let skip = p.label();
        p.enter_part(start, &skip);
        p.block(&part.body);
        if let Some(msg) = p.error {
            return Err(fail(format!("part {}: {msg}", part.name)));
        }
        p.emit("bra Ldone;");
        p.place(&skip);
        w.next = p.next;
        w.body.push_str(&p.body);
        w.decls.extend(p.decls);
        w.shared.extend(p.shared);
        for sh in p.extra_shared {
            if !w.extra_shared.contains(&sh) {
                w.extra_shared.push(sh);
            }
        }
    }
    if !kernel.parts.is_empty() {
        w.place("Ldone");
    }
    let row_lanes = kernel.row_lanes > 1 || kernel.parts.iter().any(|p| p.row_lanes > 1);
    let t = kernel.launch.threads;
    let mut src = String::new();
    let _ = writeln!(src, "// {}: generated by kiln from the kernel IR.", kernel.name);
    let _ = writeln!(src, ".version {}\n.target sm_{sm}\n.address_size 64\n", isa(sm));
    for sh in &w.shared {
        let (ty, n) = match *sh {
            "red_f32" => ("f32", 4),
            "red_s32" => ("s32", 4),
            _ => ("s64", 8),
        };
        let _ = writeln!(src, ".shared .align {n} .{ty} {sh}[{t}];");
    }
    for sh in &w.extra_shared {
        let _ = writeln!(src, "{sh}");
    }
    let mut params: Vec<String> = (0..kernel.buffers.len()).map(|i| format!("    .param .u64 p_b{i}")).collect();
    params.extend(kernel.symbols.iter().map(|s| format!("    .param .s64 p_s{}", s.0)));
    let faults = !kernel.faults.is_empty();
    if faults {
        // The fault word (kernel IR `Fault`): one u32 the runtime reads after the launch.
        params.push("    .param .u64 p_fault".into());
    }
    let _ = writeln!(
        src,
        ".visible .entry {}(\n{}\n)\n.maxntid {}, 1, 1\n{{",
        kernel.name,
        params.join(",\n"),
        kernel.launch.device_threads()
    );
    for i in 0..kernel.buffers.len() {
        let _ = writeln!(src, "    .reg .s64 %b{i};");
    }
    for s in &kernel.symbols {
        let _ = writeln!(src, "    .reg .s64 %s{};", s.0);
    }
    src.push_str("    .reg .s64 %local, %group, %ngroups, %threads, %gstart, %gstride;\n    .reg .u32 %u<8>;\n");
    for d in &w.decls {
        let _ = writeln!(src, "    {d}");
    }
    for i in 0..kernel.buffers.len() {
        let _ = writeln!(src, "    ld.param.u64 %b{i}, [p_b{i}];");
        let _ = writeln!(src, "    cvta.to.global.u64 %b{i}, %b{i};");
    }
    if faults {
        src.push_str(
            "    .reg .u64 %fault;\n    ld.param.u64 %fault, [p_fault];\n    cvta.to.global.u64 %fault, %fault;\n",
        );
    }
    for s in &kernel.symbols {
        let _ = writeln!(src, "    ld.param.s64 %s{0}, [p_s{0}];", s.0);
    }
    // Flattened workgroup index over a folded 3-D grid, as in every backend.
    src.push_str(
        "    mov.u32 %u0, %ctaid.x;\n    mov.u32 %u1, %ctaid.y;\n    mov.u32 %u2, %ctaid.z;\n\
         \x20   mov.u32 %u3, %nctaid.x;\n    mov.u32 %u4, %nctaid.y;\n    mov.u32 %u5, %nctaid.z;\n\
         \x20   mov.u32 %u6, %tid.x;\n\
         \x20   mad.lo.u32 %u2, %u2, %u4, %u1;\n    mad.lo.u32 %u0, %u2, %u3, %u0;\n",
    );
    let packed = kernel.launch.packed.max(1);
    if packed > 1 {
        // Packed groups (`Launch::packed`): the kernel IR's group is a subgroup of the device workgroup.
        let _ = writeln!(
            src,
            "    div.u32 %u7, %u6, {t};\n    rem.u32 %u6, %u6, {t};\n    mad.lo.u32 %u0, %u0, {packed}, %u7;\n\
             \x20   mul.lo.u32 %u3, %u3, {packed};"
        );
    }
    src.push_str(
        "    cvt.u64.u32 %group, %u0;\n    mul.lo.u32 %u3, %u3, %u4;\n    mul.lo.u32 %u3, %u3, %u5;\n\
         \x20   cvt.u64.u32 %ngroups, %u3;\n    cvt.u64.u32 %local, %u6;\n",
    );
    let _ = writeln!(src, "    mov.s64 %threads, {t};");
    src.push_str("    mad.lo.s64 %gstart, %group, %threads, %local;\n    mul.lo.s64 %gstride, %ngroups, %threads;\n");
    if row_lanes {
        // A persistent row's slot 0 of this thread (`Kernel::row_slot_offset`; a part sets its own).
        let _ = writeln!(src, "    .reg .s64 %rowlane;\n    mul.lo.s64 %rowlane, %local, {};", kernel.row_lanes);
    }
    src.push_str(&w.body);
    src.push_str("    ret;\n}\n");
    Ok(PtxKernel { name: kernel.name.clone(), source: src, sm })
}
