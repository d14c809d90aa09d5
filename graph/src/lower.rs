//! Lowering: one region becomes one kernel. Every node a kernel reads is *evaluated at a point* — a flat
//! index into the node's shape — so views, broadcasts, slices, pads, concats and gathers turn into index
//! expressions, and fused producers into scalar code, with no copies. Values are memoised per point, and
//! each statement is placed in the outermost loop where everything it reads is defined, so per-row values
//! (a mean, an `rsqrt` of a variance) are computed once per row, not once per element.

use crate::dtype::DType;
use crate::fuse::{Region, RegionKind};
use crate::ir::{ArgReduceOp, AttentionPart, BinaryOp, Graph, NodeId, Op, ReduceOp, UnaryOp};
use crate::kernel::{
    builtin, Access, BufferParam, KReduceOp, Kernel, Launch, LoopMode, MatMul, MatOperand, ReduceStrategy, Scalar,
    Stmt, VarId,
};
use crate::kernel::{
    AllReduce, AllReducePart, Attention, AttentionBatch, AttentionPass, FaultSite, Gemm, GemmBatch, RowLoad,
    RowsOperand,
};
use crate::shape::Shape;
use crate::sym::{Expr, SymId, SymTable};
use crate::target::Target;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Why a region could not be lowered as scheduled.
#[derive(Debug)]
pub enum LowerFailure {
    /// This member reads a reduction at another row than the one being computed, or adds what a library
    /// GEMM's epilogue cannot read: the scheduler must keep it out of the region.
    Refuse(NodeId),
    /// This layout node is a view a GEMM library cannot read in place: the scheduler must store it.
    Materialize(NodeId),
}

/// A place in a node's output: its dims, a flat row-major index, and the multi-index when it is known
/// (recomputing it from the flat index would lose what the loop bounds guarantee, e.g. that `j < C`).
#[derive(Clone, Debug)]
struct Point {
    dims: Vec<Expr>,
    flat: Expr,
    multi: Option<Vec<Expr>>,
}

impl Point {
    fn flat(dims: &[Expr], flat: Expr) -> Point {
        Point { dims: dims.to_vec(), flat, multi: None }
    }

    fn from_multi(dims: &[Expr], multi: &[Expr], t: &SymTable) -> Point {
        let strides = Shape(dims.to_vec()).contiguous_strides();
        let flat = multi.iter().zip(&strides).fold(Expr::from(0usize), |acc, (m, s)| acc + m.clone() * s.clone());
        Point { dims: dims.to_vec(), flat: flat.simplify_in(t), multi: Some(multi.to_vec()) }
    }

    /// The multi-index; the outermost coordinate needs no modulo because the flat index is in range.
    fn multi(&self, t: &SymTable) -> Vec<Expr> {
        if let Some(m) = &self.multi {
            return m.clone();
        }
        let strides = Shape(self.dims.clone()).contiguous_strides();
        (0..self.dims.len())
            .map(|i| {
                let q = self.flat.floor_div(&strides[i]);
                if i == 0 {
                    q.simplify_in(t)
                } else {
                    q.modulo(&self.dims[i]).simplify_in(t)
                }
            })
            .collect()
    }
}

/// The layout nodes another region stores (read from their buffers, not recomputed as views), and every
/// node a lowering asked about: a kernel depends on the set only through those (see [`lower`]).
#[derive(Clone, Copy)]
struct Materialized<'a> {
    set: &'a BTreeSet<NodeId>,
    asked: &'a RefCell<BTreeSet<NodeId>>,
}

impl Materialized<'_> {
    fn contains(&self, n: &NodeId) -> bool {
        self.asked.borrow_mut().insert(*n);
        self.set.contains(n)
    }
}

struct Lowerer<'a> {
    g: &'a Graph,
    target: &'a Target,
    /// Layout nodes another region stores: read from their buffers, not recomputed as views.
    materialized: Materialized<'a>,
    members: BTreeSet<NodeId>,
    buffers: Vec<BufferParam>,
    buffer_index: HashMap<(NodeId, Access), usize>,
    next_var: u32,
    next_sym: u32,
    blocks: Vec<Vec<Stmt>>,
    var_depth: HashMap<VarId, usize>,
    var_dtype: HashMap<VarId, DType>,
    /// Values read from a buffer, with the buffer's dtype: exact in it, so rounding one to it again
    /// (a half cast after a half load computed in f32) is a no-op and is skipped.
    loaded: HashMap<VarId, DType>,
    sym_depth: HashMap<SymId, usize>,
    /// Stand-ins for source positions of padded views ([`Lowerer::position`]): each symbol and the
    /// clamped expression it stands for, substituted back when a statement is emitted.
    positions: BTreeMap<SymId, Expr>,
    /// The stand-in already made for a (position, lower end, extent), so equal reads share memo entries.
    position_of: HashMap<(Expr, Expr, Expr), SymId>,
    memo: HashMap<(NodeId, Expr, Option<VarId>), VarId>,
    guard: Option<VarId>,
    /// Each computed reduction's value and the coordinates (kept axes only) of the row it belongs to.
    reduce_results: HashMap<NodeId, (VarId, Vec<Expr>)>,
    /// Shape-symbol ranges plus every loop variable's `[0, extent)`, for index simplification.
    ranges: SymTable,
    /// Members being evaluated, innermost last (to name the one that reads a reduction wrongly).
    evaluating: Vec<NodeId>,
    /// Run-time checks emitted so far (see [`FaultSite`]).
    faults: Vec<FaultSite>,
    /// The op the test-only knob miscompiles ([`wrong_op`]).
    wrong_op: Option<UnaryOp>,
    /// The knob asks for wrong graph outputs ([`wrong_kernels`]); read once per kernel, as `wrong_op` is.
    wrong_outputs: bool,
}

/// The lowering's `let`, as [`crate::f64_math`] writes through it.
struct F64Lets<'l, 'g>(&'l mut Lowerer<'g>);

impl crate::f64_math::Emit for F64Lets<'_, '_> {
    fn emit(&mut self, dtype: DType, value: Scalar) -> VarId {
        self.0.let_inner(dtype, value)
    }
}

impl<'a> Lowerer<'a> {
    fn new(g: &'a Graph, target: &'a Target, region: &Region, materialized: Materialized<'a>) -> Self {
        Lowerer {
            g,
            target,
            materialized,
            members: region.members.iter().copied().collect(),
            buffers: Vec::new(),
            buffer_index: HashMap::new(),
            next_var: 0,
            next_sym: builtin::FIRST_LOCAL,
            blocks: vec![Vec::new()],
            var_depth: HashMap::new(),
            var_dtype: HashMap::new(),
            loaded: HashMap::new(),
            sym_depth: HashMap::new(),
            positions: BTreeMap::new(),
            position_of: HashMap::new(),
            memo: HashMap::new(),
            guard: None,
            reduce_results: HashMap::new(),
            ranges: g.symbols.clone(),
            evaluating: Vec::new(),
            faults: Vec::new(),
            wrong_op: wrong_op(),
            wrong_outputs: wrong_kernels(),
        }
    }

    /// Whether `fixed` is defined outside the innermost loop that `varying` depends on, so it holds one
    /// value while `varying` takes many.
    fn loop_invariant(&self, fixed: VarId, varying: VarId) -> bool {
        let depth = |v: VarId| self.var_depth.get(&v).copied().unwrap_or(0);
        depth(fixed) < depth(varying)
    }

    /// Emits a run-time check: when `bad` holds (and the current load guard, so values a guarded-off
    /// branch never reads cannot fault), the kernel records a fault naming `node`'s op and `msg`.
    fn fault(&mut self, bad: VarId, node: NodeId, msg: String) {
        let cond = match self.guard {
            Some(g) => self.let_(DType::Bool, Scalar::Binary { op: BinaryOp::And, a: g, b: bad }),
            None => bad,
        };
        let op = self.g.node(node).op.name().to_string();
        let site = FaultSite { op, msg, node };
        let index = match self.faults.iter().position(|f| *f == site) {
            Some(i) => i,
            None => {
                self.faults.push(site);
                self.faults.len() - 1
            }
        };
        let depth = self.var_depth.get(&cond).copied().unwrap_or(0);
        self.blocks[depth].push(Stmt::Fault { cond, site: index as u32 });
    }

    /// `1/d` when node `d` is a constant ±2^k whose reciprocal is a normal f32 (`dtype` f32), so that a
    /// division by it is exactly a multiplication by its reciprocal.
    fn exact_reciprocal(&self, d: NodeId, dtype: DType) -> Option<f64> {
        let Op::Full { value } = self.g.node(d).op else { return None };
        if dtype != DType::F32 {
            return None;
        }
        let bits = value.abs().to_bits();
        let exponent = ((bits >> 52) & 0x7ff) as i64 - 1023;
        let power_of_two = value.is_finite() && value != 0.0 && bits & ((1u64 << 52) - 1) == 0;
        (power_of_two && exponent.abs() <= 126).then(|| 1.0 / value)
    }

    /// Element `flat`'s uniform number under the key `key` holds: [`crate::rng`]'s Philox4x32-10 as
    /// 32-bit kernel IR (the key schedule depends on the key alone, so it is computed outside the loops).
    fn rand(&mut self, key: NodeId, key_dims: &[Expr], flat: &Expr, stream: u32) -> Result<VarId, LowerFailure> {
        use crate::kernel::BitOp;
        use crate::rng::{KEY_STEPS, MULTIPLIERS, ROUNDS};
        let word = |s: &mut Self, w: u32| s.let_(DType::I32, Scalar::Const { value: f64::from(w as i32) });
        let bits = |s: &mut Self, op: BitOp, a: VarId, b: VarId| s.let_(DType::I32, Scalar::Bits { op, a, b });
        let mut key_words = [VarId(0); 2];
        for (i, w) in key_words.iter_mut().enumerate() {
            let v = self.value(key, &Point::flat(key_dims, Expr::from(i)))?;
            *w = self.coerce(v, DType::I32);
        }
        let lo = self.let_(DType::I32, Scalar::Index { expr: flat.clone() });
        let zero = word(self, 0);
        // A target that indexes in 32 bits (WGSL) has no element past 2^32: the high word is 0.
        let hi = if self.target.index_bits <= 32 {
            zero
        } else {
            self.let_(DType::I32, Scalar::Index { expr: flat.floor_div(&Expr::from(1i64 << 32)) })
        };
        let stream = word(self, stream);
        let mut c = [lo, hi, stream, zero];
        let (m0, m1) = (word(self, MULTIPLIERS[0]), word(self, MULTIPLIERS[1]));
        let steps = [word(self, KEY_STEPS[0]), word(self, KEY_STEPS[1])];
        for round in 0..ROUNDS {
            if round > 0 {
                key_words = [0, 1].map(|i| bits(self, BitOp::Add, key_words[i], steps[i]));
            }
            let (hi0, lo0) = (bits(self, BitOp::MulHi, m0, c[0]), bits(self, BitOp::MulLo, m0, c[0]));
            let (hi1, lo1) = (bits(self, BitOp::MulHi, m1, c[2]), bits(self, BitOp::MulLo, m1, c[2]));
            let x0 = bits(self, BitOp::Xor, hi1, c[1]);
            let x2 = bits(self, BitOp::Xor, hi0, c[3]);
            c = [bits(self, BitOp::Xor, x0, key_words[0]), lo1, bits(self, BitOp::Xor, x2, key_words[1]), lo0];
        }
        // The top 24 bits, a nonnegative i32 that f32 holds exactly, times 2^-24.
        let eight = word(self, 8);
        let top = bits(self, BitOp::Shr, c[0], eight);
        let top = self.coerce(top, DType::F32);
        let scale = self.let_(DType::F32, Scalar::Const { value: 1.0 / 16_777_216.0 });
        Ok(self.let_(DType::F32, Scalar::Binary { op: BinaryOp::Mul, a: top, b: scale }))
    }

    /// The dtype values of a storage dtype are computed in on this target.
    fn compute_dtype(&self, d: DType) -> DType {
        match d {
            DType::F16 if !self.target.f16_compute => DType::F32,
            DType::BF16 if !self.target.bf16_compute => DType::F32,
            d if d.is_narrow_int() => DType::I32,
            d if d.minifloat().is_some() => DType::F32,
            d => d,
        }
    }

    /// A fresh kernel-local symbol ranging over `[0, extent)`.
    fn new_sym(&mut self, extent: &Expr) -> SymId {
        let s = SymId(self.next_sym);
        self.next_sym += 1;
        let hi = extent.simplify_in(&self.ranges);
        self.ranges.set_range(s, 0, hi.as_const().map(|e| e - 1));
        if hi.as_const().is_none() {
            self.ranges.set_extent(s, hi);
        }
        s
    }

    /// Opens a loop body that binds `syms`.
    fn push_block(&mut self, syms: &[SymId]) {
        self.blocks.push(Vec::new());
        for &s in syms {
            self.sym_depth.insert(s, self.blocks.len() - 1);
        }
    }

    /// Closes the innermost block, forgetting values defined in it.
    fn pop_block(&mut self) -> Vec<Stmt> {
        let depth = self.blocks.len() - 1;
        let vd = &self.var_depth;
        self.memo.retain(|_, v| vd.get(v).is_some_and(|&d| d < depth));
        self.blocks.pop().unwrap_or_default()
    }

    fn expr_depth(&self, e: &Expr) -> usize {
        e.symbols().iter().map(|s| self.sym_depth.get(s).copied().unwrap_or(0)).max().unwrap_or(0)
    }

    /// Emits `var = value` in the outermost block where its operands exist.
    fn let_(&mut self, dtype: DType, value: Scalar) -> VarId {
        if dtype == DType::F64 {
            // No device gives f64 transcendentals: written out in f64 arithmetic, once for every renderer.
            match value {
                Scalar::Unary { op, a } if Some(op) != self.wrong_op => {
                    if let Some(v) = crate::f64_math::expand_unary(&mut F64Lets(self), op, a) {
                        return v;
                    }
                }
                Scalar::Binary { op: BinaryOp::Pow, a, b } => {
                    return crate::f64_math::expand_pow(&mut F64Lets(self), a, b)
                }
                _ => {}
            }
        }
        if let Scalar::Unary { op, .. } = &value {
            if Some(*op) == self.wrong_op {
                // The test-only miscompilation: this op's result a quarter too large.
                let v = self.let_inner(dtype, value);
                let bias = self.let_inner(dtype, Scalar::Const { value: 0.25 });
                return self.let_inner(dtype, Scalar::Binary { op: BinaryOp::Add, a: v, b: bias });
            }
        }
        self.let_inner(dtype, value)
    }

    fn let_inner(&mut self, dtype: DType, value: Scalar) -> VarId {
        let value = match value {
            Scalar::Load { buffer, index, guard } => {
                let index = self.resolve(&index.simplify_in(&self.ranges));
                // A guarded load whose index folds to a negative constant is one the guard always turns
                // off (a pad's or concat's other side): load element 0 instead, so no renderer sees an
                // address before the buffer (naga rejects the constant; PTX would read out of bounds).
                let index = match (guard, index.as_const()) {
                    (Some(_), Some(c)) if c < 0 => Expr::from(0usize),
                    _ => index,
                };
                Scalar::Load { buffer, index, guard }
            }
            Scalar::Index { expr } => Scalar::Index { expr: self.resolve(&expr.simplify_in(&self.ranges)) },
            v => v,
        };
        let mut depth = 0;
        let mut dep = |v: &VarId| depth = depth.max(self.var_depth.get(v).copied().unwrap_or(0));
        match &value {
            Scalar::Const { .. } => {}
            Scalar::Load { guard, .. } => guard.iter().for_each(&mut dep),
            Scalar::Index { .. } => {}
            Scalar::Unary { a, .. } | Scalar::Cast { a } => dep(a),
            Scalar::Quotient { a, b, reciprocal } => {
                dep(a);
                dep(b);
                dep(reciprocal)
            }
            Scalar::Binary { a, b, .. } | Scalar::Bits { a, b, .. } => {
                dep(a);
                dep(b)
            }
            Scalar::Select { cond, a, b } => {
                dep(cond);
                dep(a);
                dep(b)
            }
        }
        match &value {
            Scalar::Load { index: e, .. } => {
                // Loads stay inside the kernel's outer loop: above it they would run even when that loop
                // is empty, reading a buffer that may have no elements.
                depth = depth.max(self.expr_depth(e)).max(usize::from(self.blocks.len() > 1));
            }
            Scalar::Index { expr: e } => depth = depth.max(self.expr_depth(e)),
            _ => {}
        }
        let var = VarId(self.next_var);
        self.next_var += 1;
        self.var_depth.insert(var, depth);
        self.var_dtype.insert(var, dtype);
        self.blocks[depth].push(Stmt::Let { var, dtype, value });
        var
    }

    fn coerce(&mut self, v: VarId, dtype: DType) -> VarId {
        if self.var_dtype.get(&v) == Some(&dtype) {
            v
        } else {
            self.let_(dtype, Scalar::Cast { a: v })
        }
    }

    fn buffer(&mut self, n: NodeId, access: Access) -> usize {
        if let Some(&b) = self.buffer_index.get(&(n, access)) {
            return b;
        }
        let node = self.g.node(n);
        self.buffers.push(BufferParam { dtype: node.dtype, len: node.shape.numel(), access, node: n });
        let b = self.buffers.len() - 1;
        self.buffer_index.insert((n, access), b);
        b
    }

    fn store(&mut self, n: NodeId, index: Expr, value: VarId) {
        let index = self.resolve(&index.simplify_in(&self.ranges));
        let value =
            if self.wrong_outputs && self.g.outputs.contains(&n) { self.miscompute(n, &index, value) } else { value };
        let buffer = self.buffer(n, Access::Write);
        let depth = self.blocks.len() - 1;
        self.blocks[depth].push(Stmt::Store { buffer, index, value });
    }

    /// The test-only miscompilation ([`wrong_kernels`]): the last element of a graph output is stored
    /// one larger than it should be.
    fn miscompute(&mut self, n: NodeId, index: &Expr, value: VarId) -> VarId {
        let dtype = self.var_dtype.get(&value).copied().unwrap_or(DType::F32);
        let last = self.g.node(n).shape.numel().sub(&Expr::from(1usize));
        let at = self.let_(DType::I64, Scalar::Index { expr: index.clone() });
        let end = self.let_(DType::I64, Scalar::Index { expr: last });
        let is_last = self.let_(DType::Bool, Scalar::Binary { op: BinaryOp::Eq, a: at, b: end });
        let one = self.let_(dtype, Scalar::Const { value: 1.0 });
        let bumped = self.let_(dtype, Scalar::Binary { op: BinaryOp::Add, a: value, b: one });
        self.let_(dtype, Scalar::Select { cond: is_last, a: bumped, b: value })
    }

    fn in_range(&mut self, e: &Expr, lo: &Expr, hi: &Expr) -> VarId {
        let ev = self.let_(DType::I64, Scalar::Index { expr: e.clone() });
        let lov = self.let_(DType::I64, Scalar::Index { expr: lo.clone() });
        let hiv = self.let_(DType::I64, Scalar::Index { expr: hi.clone() });
        let a = self.let_(DType::Bool, Scalar::Binary { op: BinaryOp::Ge, a: ev, b: lov });
        let b = self.let_(DType::Bool, Scalar::Binary { op: BinaryOp::Lt, a: ev, b: hiv });
        self.let_(DType::Bool, Scalar::Binary { op: BinaryOp::And, a, b })
    }

    /// The source position `at - lo` of a padded view (a pad, a convolution window, a concatenation's
    /// part) that a guard keeps inside `[0, extent)` wherever its value is used. It is returned as a
    /// stand-in symbol ranging over `[0, extent)`, so what reads through it simplifies as an unpadded read
    /// would: a convolution's input read back through a permutation otherwise kept a dozen divisions per
    /// element, its position ranging one past either end. Each statement gets the symbol replaced by
    /// `min(max(at, lo), lo + extent - 1) - lo` ([`Lowerer::resolve`]), which equals `at - lo` inside the
    /// range and stays inside it outside, so every rewrite made under the symbol's range holds for the
    /// clamped value, and no address outside the input is ever formed (the guard turns the read off
    /// there). `at` must be non-negative (an output coordinate), so the clamp is 32-bit arithmetic.
    fn position(&mut self, at: &Expr, lo: &Expr, extent: &Expr) -> Expr {
        let direct = (at.clone() - lo.clone()).simplify_in(&self.ranges);
        let b = self.ranges.bounds(&direct);
        let inside = match extent.simplify_in(&self.ranges).as_const() {
            Some(e) => b.lo.is_some_and(|l| l >= 0) && b.hi.is_some_and(|h| h < e),
            None => false,
        };
        if inside {
            return direct;
        }
        let key = (at.clone(), lo.clone(), extent.clone());
        if let Some(&s) = self.position_of.get(&key) {
            return Expr::sym(s);
        }
        let last = lo.clone() + extent.clone() - Expr::from(1usize);
        let clamped = (at.max(lo).min(&last) - lo.clone()).simplify_in(&self.ranges);
        let clamped = self.resolve(&clamped);
        let depth = self.expr_depth(&clamped);
        let s = self.new_sym(extent);
        self.sym_depth.insert(s, depth);
        self.positions.insert(s, clamped);
        self.position_of.insert(key, s);
        Expr::sym(s)
    }

    /// `e` with every position stand-in ([`Lowerer::position`]) replaced by what it stands for.
    fn resolve(&self, e: &Expr) -> Expr {
        if self.positions.is_empty() || !e.symbols().iter().any(|s| self.positions.contains_key(s)) {
            return e.clone();
        }
        e.substitute(&self.positions).simplify_in(&self.ranges)
    }

    /// Evaluates `inner` with `cond` added to the current load guard.
    fn guarded<T>(&mut self, cond: VarId, inner: impl FnOnce(&mut Self) -> T) -> T {
        let saved = self.guard;
        self.guard = Some(match saved {
            Some(g) => self.let_(DType::Bool, Scalar::Binary { op: BinaryOp::And, a: g, b: cond }),
            None => cond,
        });
        let r = inner(self);
        self.guard = saved;
        r
    }

    fn load(&mut self, n: NodeId, index: Expr) -> VarId {
        let node = self.g.node(n);
        let dtype = self.compute_dtype(node.dtype);
        let buffer = self.buffer(n, Access::Read);
        // A guard only keeps a padded view's reads inside its input: a load whose index no guarded
        // position reaches (a channel's scale read inside a padded window) is inside its buffer
        // wherever it runs, and unguarded it is one load per vector, not one per lane.
        let guard = self.guard.filter(|_| index.symbols().iter().any(|s| self.positions.contains_key(s)));
        let v = self.let_(dtype, Scalar::Load { buffer, index, guard });
        self.loaded.insert(v, node.dtype);
        v
    }

    /// The value of node `n` at point `p`.
    fn value(&mut self, n: NodeId, p: &Point) -> Result<VarId, LowerFailure> {
        let key = (n, p.flat.clone(), self.guard);
        if let Some(&v) = self.memo.get(&key) {
            return Ok(v);
        }
        let is_member = self.members.contains(&n);
        let computed_elsewhere = !is_member
            && (crate::fuse::role(self.g, n) != crate::fuse::Role::Transparent || self.materialized.contains(&n));
        let v = if computed_elsewhere {
            self.load(n, p.flat.clone())
        } else {
            if is_member {
                self.evaluating.push(n);
            }
            let v = self.compute(n, p);
            if is_member {
                self.evaluating.pop();
            }
            let v = v?;
            // A narrow integer computed in i32 is wrapped to its width before anything reads it, as the
            // reference rounds every op's result (`300u8` is 44 before it is divided or compared).
            let dtype = self.g.node(n).dtype;
            if dtype.is_narrow_int() && self.var_dtype.get(&v) != Some(&dtype) && !self.loaded.contains_key(&v) {
                self.let_(dtype, Scalar::Cast { a: v })
            } else {
                v
            }
        };
        self.memo.insert(key, v);
        Ok(v)
    }

    /// `prev && c` (just `c` when there is no `prev`).
    fn and(&mut self, prev: Option<VarId>, c: VarId) -> VarId {
        match prev {
            None => c,
            Some(prev) => self.let_(DType::Bool, Scalar::Binary { op: BinaryOp::And, a: prev, b: c }),
        }
    }

    /// `input` at `at` where `cond` holds, `value` elsewhere, touching no memory where it does not: the
    /// read of a padded view (`pad`, `unfold`).
    fn read_or(
        &mut self,
        input: NodeId,
        at: &Point,
        cond: Option<VarId>,
        value: f64,
        cd: DType,
    ) -> Result<VarId, LowerFailure> {
        let pad = self.let_(cd, Scalar::Const { value });
        let Some(c) = cond else { return self.value(input, at) };
        let v = self.guarded(c, |s| s.value(input, at))?;
        let v = self.coerce(v, cd);
        Ok(self.let_(cd, Scalar::Select { cond: c, a: v, b: pad }))
    }

    fn compute(&mut self, n: NodeId, p: &Point) -> Result<VarId, LowerFailure> {
        let node = self.g.node(n);
        let cd = self.compute_dtype(node.dtype);
        let input = |i: usize| node.inputs[i];
        let in_dims = |i: usize| self.g.node(node.inputs[i]).shape.dims().to_vec();
        Ok(match &node.op {
            Op::Input { .. } => self.load(n, p.flat.clone()),
            Op::Full { value } => self.let_(cd, Scalar::Const { value: *value }),
            Op::Iota { axis } => {
                let expr = p.multi(&self.ranges)[*axis].clone();
                self.let_(cd, Scalar::Index { expr })
            }
            Op::Rand { stream } => self.rand(input(0), &in_dims(0), &p.flat, *stream)?,
            Op::Unary { op } => {
                let a = self.value(input(0), p)?;
                let a = self.coerce(a, self.compute_dtype(self.g.node(input(0)).dtype));
                let out = if *op == crate::ir::UnaryOp::IsNan { DType::Bool } else { cd };
                self.let_(out, Scalar::Unary { op: *op, a })
            }
            Op::Binary { op } => {
                let operand_dtype = self.compute_dtype(self.g.node(input(0)).dtype);
                let a = self.value(input(0), p)?;
                let a = self.coerce(a, operand_dtype);
                if *op == BinaryOp::Div {
                    if let Some(r) = self.exact_reciprocal(input(1), operand_dtype) {
                        // Dividing by ±2^k scales exactly, as multiplying by ±2^-k does: one rounding of the
                        // same real number, so the product is the quotient (a mean's `/ 4096`).
                        let r = self.let_(operand_dtype, Scalar::Const { value: r });
                        return Ok(self.let_(cd, Scalar::Binary { op: BinaryOp::Mul, a, b: r }));
                    }
                }
                let b = self.value(input(1), p)?;
                let b = self.coerce(b, operand_dtype);
                if *op == BinaryOp::Div && operand_dtype.is_int() {
                    let zero = self.let_(operand_dtype, Scalar::Const { value: 0.0 });
                    let bad = self.let_(DType::Bool, Scalar::Binary { op: BinaryOp::Eq, a: b, b: zero });
                    self.fault(bad, n, "integer division by zero".into());
                }
                if *op == BinaryOp::Div && operand_dtype == DType::F32 && cd == DType::F32 && self.loop_invariant(b, a)
                {
                    // A divisor fixed across the loop that computes `a` (a softmax's row sum, a mean's
                    // count) is inverted once, outside it; each element's quotient is refined from it
                    // (PTX: a multiply and two fused multiply-adds, the rounded quotient) instead of a
                    // full division (a dozen instructions and a slow path on a GPU).
                    let reciprocal = self.let_(cd, Scalar::Unary { op: UnaryOp::Reciprocal, a: b });
                    return Ok(self.let_(cd, Scalar::Quotient { a, b, reciprocal }));
                }
                self.let_(cd, Scalar::Binary { op: *op, a, b })
            }
            Op::Where => {
                let c = self.value(input(0), p)?;
                let a = self.value(input(1), p)?;
                let b = self.value(input(2), p)?;
                let (a, b) = (self.coerce(a, cd), self.coerce(b, cd));
                self.let_(cd, Scalar::Select { cond: c, a, b })
            }
            Op::Cast => {
                let mut a = self.value(input(0), p)?;
                // A half-precision value computed in f32 becomes a real f16/bf16 before it is converted, so
                // casts round (and overflow) exactly as the reference does. The result keeps its storage
                // dtype so narrowing really rounds; arithmetic widens it again.
                let from = self.g.node(input(0)).dtype;
                if matches!(from, DType::F16 | DType::BF16) && self.loaded.get(&a) != Some(&from) {
                    a = self.coerce(a, from);
                }
                self.let_(node.dtype, Scalar::Cast { a })
            }
            Op::Reshape => self.value(input(0), &Point::flat(&in_dims(0), p.flat.clone()))?,
            Op::Permute { perm } => {
                let m = p.multi(&self.ranges);
                let mut src = vec![Expr::from(0usize); m.len()];
                for (i, &a) in perm.iter().enumerate() {
                    src[a] = m[i].clone();
                }
                self.value(input(0), &Point::from_multi(&in_dims(0), &src, &self.ranges))?
            }
            Op::Expand => {
                let (m, dims) = (p.multi(&self.ranges), in_dims(0));
                let one = Expr::from(1usize);
                let src: Vec<Expr> = m
                    .iter()
                    .zip(&dims)
                    .zip(&p.dims)
                    .map(|((x, d), o)| if *d == one && *o != one { Expr::from(0usize) } else { x.clone() })
                    .collect();
                self.value(input(0), &Point::from_multi(&dims, &src, &self.ranges))?
            }
            Op::Slice { axis, start, step, .. } => {
                let mut m = p.multi(&self.ranges);
                m[*axis] = start.clone() + m[*axis].clone() * Expr::from(*step);
                self.value(input(0), &Point::from_multi(&in_dims(0), &m, &self.ranges))?
            }
            Op::Pad { pads, value } => {
                let (m, dims) = (p.multi(&self.ranges), in_dims(0));
                let mut src = m.clone();
                let mut cond = None;
                for (i, &(before, _)) in pads.iter().enumerate() {
                    if pads[i] == (0, 0) {
                        continue;
                    }
                    let b = Expr::from(before);
                    let c = self.in_range(&m[i], &b, &(b.clone() + dims[i].clone()));
                    cond = Some(self.and(cond, c));
                    src[i] = self.position(&m[i], &b, &dims[i]);
                }
                let at = Point::from_multi(&dims, &src, &self.ranges);
                self.read_or(input(0), &at, cond, *value, cd)?
            }
            Op::Unfold { kernel, window, value } => {
                // [n, c, tap, *out] reads [n, c, *(out * stride + offset * dilation - pad)], the tap's
                // offsets recovered from its row-major number once.
                let (m, dims) = (p.multi(&self.ranges), in_dims(0));
                let mut src = vec![m[0].clone(), m[1].clone()];
                let mut cond = None;
                let mut inner = 1usize;
                let mut offsets = vec![Expr::from(0usize); kernel.len()];
                for a in (0..kernel.len()).rev() {
                    offsets[a] = m[2].clone().floor_div(&Expr::from(inner)).modulo(&Expr::from(kernel[a]));
                    inner *= kernel[a];
                }
                for (a, off) in offsets.into_iter().enumerate() {
                    let (before, after) = window.padding[a];
                    let at = m[3 + a].clone() * Expr::from(window.stride[a]) + off * Expr::from(window.dilation[a]);
                    let before = Expr::from(before);
                    if window.padding[a].0 + after > 0 {
                        let c = self.in_range(&at, &before, &(before.clone() + dims[2 + a].clone()));
                        cond = Some(self.and(cond, c));
                        src.push(self.position(&at, &before, &dims[2 + a]));
                    } else {
                        src.push(at - before);
                    }
                }
                let at = Point::from_multi(&dims, &src, &self.ranges);
                self.read_or(input(0), &at, cond, *value, cd)?
            }
            Op::Concat { axis } => {
                let m = p.multi(&self.ranges);
                let mut offset = Expr::from(0usize);
                let mut parts = Vec::new();
                for (k, &inp) in node.inputs.iter().enumerate() {
                    let dims = in_dims(k);
                    let end = offset.clone() + dims[*axis].clone();
                    let c = self.in_range(&m[*axis], &offset, &end);
                    let mut src = m.clone();
                    src[*axis] = self.position(&m[*axis], &offset, &dims[*axis]);
                    let at = Point::from_multi(&dims, &src, &self.ranges);
                    let v = self.guarded(c, |s| s.value(inp, &at))?;
                    parts.push((c, self.coerce(v, cd)));
                    offset = end;
                }
                let mut acc = parts.pop().map(|(_, v)| v).expect("concat has inputs");
                while let Some((c, v)) = parts.pop() {
                    acc = self.let_(cd, Scalar::Select { cond: c, a: v, b: acc });
                }
                acc
            }
            Op::IndexSelect { axis } | Op::Gather { axis } => {
                let m = p.multi(&self.ranges);
                let index_point = if matches!(node.op, Op::Gather { .. }) {
                    p.clone()
                } else {
                    Point::flat(&in_dims(1), m[*axis].clone())
                };
                let iv = self.value(input(1), &index_point)?;
                let dims = in_dims(0);
                let sym = self.new_sym(&dims[*axis]);
                // Out-of-range indices are the user's error (the reference reports them); the kernel
                // records a fault and clamps, so memory outside the buffer is never touched.
                let wide = self.coerce(iv, DType::I64);
                let zero = self.let_(DType::I64, Scalar::Const { value: 0.0 });
                let end = self.let_(DType::I64, Scalar::Index { expr: dims[*axis].clone() });
                let below = self.let_(DType::Bool, Scalar::Binary { op: BinaryOp::Lt, a: wide, b: zero });
                let above = self.let_(DType::Bool, Scalar::Binary { op: BinaryOp::Ge, a: wide, b: end });
                let bad = self.let_(DType::Bool, Scalar::Binary { op: BinaryOp::Or, a: below, b: above });
                let msg = format!("an index is out of range for a dim of size {}", dims[*axis]);
                self.fault(bad, n, msg);
                let depth = self.var_depth.get(&iv).copied().unwrap_or(0);
                self.sym_depth.insert(sym, depth);
                self.blocks[depth].push(Stmt::BindIndex { sym, var: iv, bound: dims[*axis].clone() });
                let mut src = m.clone();
                src[*axis] = Expr::sym(sym);
                self.value(input(0), &Point::from_multi(&dims, &src, &self.ranges))?
            }
            Op::Reduce { .. } | Op::ArgReduce { .. } => match self.reduce_results.get(&n) {
                Some((v, row)) if *row == kept_coordinates(&node.op, &p.multi(&self.ranges)) => *v,
                _ => {
                    let culprit = self.evaluating.iter().rev().find(|&&m| m != n).copied().unwrap_or(n);
                    return Err(LowerFailure::Refuse(culprit));
                }
            },
            // The accumulator is bound at the output point; reading it anywhere else cannot be fused.
            Op::MatMul
            | Op::Attention { .. }
            | Op::AttentionLse { .. }
            | Op::AttentionGrad { .. }
            | Op::AllReduce { .. } => {
                let culprit = self.evaluating.iter().rev().find(|&&m| m != n).copied().unwrap_or(n);
                return Err(LowerFailure::Refuse(culprit));
            }
            Op::Softmax { .. }
            | Op::LogSoftmax { .. }
            | Op::LayerNorm { .. }
            | Op::Gelu { .. }
            | Op::Silu
            | Op::Linear { .. }
            | Op::Mean { .. }
            | Op::Var { .. }
            | Op::CausalMask
            | Op::Conv { .. }
            | Op::Pool { .. } => unreachable!("lowering runs after decomposition"),
        })
    }

    /// Node `node` read in place as a strided view of one buffer: `(buffer, offset, strides)` with its
    /// element at `syms` (one symbol per axis) at `offset + sum(strides[i] * syms[i])`, when its value is
    /// one plain load whose index is affine in `syms` (what a library or template reads without a copy).
    fn strided_view(&mut self, node: NodeId, syms: &[SymId]) -> Option<(usize, Expr, Vec<Expr>)> {
        self.push_block(syms);
        let idx: Vec<Expr> = syms.iter().map(|&s| Expr::sym(s)).collect();
        let g = self.g;
        let at = Point::from_multi(g.node(node).shape.dims(), &idx, &self.ranges);
        let v = self.value(node, &at).ok();
        let body = self.pop_block();
        let (buffer, index) = match (v, body.as_slice()) {
            (Some(v), [Stmt::Let { var, value: Scalar::Load { buffer, index, guard: None }, .. }]) if *var == v => {
                (*buffer, index.simplify_in(&self.ranges))
            }
            _ => return None,
        };
        let (offset, strides) = crate::gemm::affine(&index, syms)?;
        Some((buffer, offset, strides))
    }

    fn symbols(&self) -> Vec<SymId> {
        fn add(out: &mut BTreeSet<SymId>, e: &Expr) {
            out.extend(e.symbols().into_iter().filter(|s| s.0 < builtin::FIRST_LOCAL));
        }
        fn visit(stmts: &[Stmt], out: &mut BTreeSet<SymId>) {
            for s in stmts {
                match s {
                    Stmt::Let { value: Scalar::Load { index: e, .. } | Scalar::Index { expr: e }, .. } => add(out, e),
                    Stmt::Let { .. } | Stmt::Fault { .. } => {}
                    Stmt::BindIndex { bound, .. } => add(out, bound),
                    Stmt::Store { index, .. } => add(out, index),
                    Stmt::Loop { extent, body, .. } | Stmt::Reduce { extent, body, .. } => {
                        add(out, extent);
                        visit(body, out);
                    }
                    Stmt::MatMul(m) => {
                        for e in [&m.batch, &m.m, &m.n, &m.k] {
                            add(out, e);
                        }
                        visit(&m.a.body, out);
                        visit(&m.b.body, out);
                        visit(&m.epilogue, out);
                    }
                    Stmt::Attention(a) => {
                        for e in [&a.q_len, &a.kv_len] {
                            add(out, e);
                        }
                        for o in [&a.q, &a.k, &a.v, &a.out] {
                            add(out, &o.offset);
                            add(out, &o.ld);
                        }
                        for b in &a.batch {
                            for e in [&b.extent, &b.q, &b.k, &b.v, &b.out] {
                                add(out, e);
                            }
                        }
                    }
                    Stmt::AllReduce(a) => {
                        for p in &a.parts {
                            add(out, &p.len);
                        }
                    }
                    Stmt::Gemm(g) => {
                        for e in [&g.m, &g.n, &g.k, &g.a.offset, &g.a.ld, &g.b.offset, &g.b.ld] {
                            add(out, e);
                        }
                        for addend in [&g.epilogue.bias, &g.epilogue.residual].into_iter().flatten() {
                            add(out, &addend.offset);
                        }
                        for b in &g.batch {
                            for e in [&b.extent, &b.a, &b.b, &b.out] {
                                add(out, e);
                            }
                        }
                    }
                }
            }
        }
        let mut out = BTreeSet::new();
        for b in &self.blocks {
            visit(b, &mut out);
        }
        // Buffer lengths are not listed: the runtime sizes buffers from the graph, and a symbol that only
        // sizes a buffer is read by no statement (a renderer would declare a parameter nothing uses).
        out.into_iter().collect()
    }

    fn finish(mut self, name: &str, launch: Launch) -> Kernel {
        let mut symbols: BTreeSet<SymId> = self.symbols().into_iter().collect();
        symbols.extend(launch.groups.symbols().into_iter().filter(|s| s.0 < builtin::FIRST_LOCAL));
        let body = self.blocks.pop().unwrap_or_default();
        let symbols: Vec<SymId> = symbols.into_iter().collect();
        // A symbol the graph does not know (none should reach here) is unbounded: never a false proof.
        let symbol_ranges = symbols.iter().map(|s| self.ranges.range(*s).unwrap_or((i64::MIN, None))).collect();
        Kernel {
            name: name.to_string(),
            buffers: self.buffers,
            symbols,
            symbol_ranges,
            launch,
            vector_width: 1,
            row_cache: None,
            row_lanes: 1,
            body,
            faults: self.faults,
            parts: Vec::new(),
            launched_in: None,
        }
    }
}

/// The coordinates of a reduction's output point along the axes it keeps.
fn kept_coordinates(op: &Op, multi: &[Expr]) -> Vec<Expr> {
    let (axes, keepdim) = match op {
        Op::Reduce { axes, keepdim, .. } => (axes.clone(), *keepdim),
        Op::ArgReduce { axis, keepdim, .. } => (vec![*axis], *keepdim),
        _ => return multi.to_vec(),
    };
    if !keepdim {
        return multi.to_vec();
    }
    multi.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, e)| e.clone()).collect()
}

fn ceil_div(a: &Expr, b: u32) -> Expr {
    (a.clone() + Expr::from(b as i64 - 1)).floor_div(&Expr::from(b as i64))
}

/// Workgroups for a grid-stride loop over `units` (each thread steps by the whole grid): `units` while
/// they fit one dimension of the target's grid, else the fewest that do, each looping the same number
/// of times. Folding more into a 2-D grid (which rounds up to whole rows of idle groups) made W1 on
/// NVIDIA Vulkan 0.22 ms where half the groups looping twice took 0.163 (`benches/NOTES.md`, session 36).
pub(crate) fn grid_stride_groups(target: &Target, units: &Expr) -> Expr {
    let max = Expr::from(target.max_groups_per_dim.clamp(1, i64::MAX as u64) as i64);
    let rounds = (units.clone() + max.clone() - Expr::from(1i64)).floor_div(&max).max(&Expr::from(1i64));
    (units.clone() + rounds.clone() - Expr::from(1i64)).floor_div(&rounds)
}

fn pointwise(mut l: Lowerer, region: &Region) -> Result<Kernel, LowerFailure> {
    let first = region.stored[0];
    let n = l.g.node(first).shape.numel();
    let i = l.new_sym(&n);
    l.push_block(&[i]);
    for &s in &region.stored {
        let dims = l.g.node(s).shape.dims().to_vec();
        let v = l.value(s, &Point::flat(&dims, Expr::sym(i)))?;
        l.store(s, Expr::sym(i), v);
    }
    let body = l.pop_block();
    let width = vector_width(l.target, &l.buffers, &body, i, &n);
    l.blocks[0].push(Stmt::Loop { sym: i, extent: n.clone(), mode: LoopMode::Global, body });
    let threads = 256.min(l.target.max_threads_per_group);
    let groups = grid_stride_groups(l.target, &ceil_div(&n, threads * width));
    let mut k = l.finish(&region.name, Launch::new(groups, threads));
    k.vector_width = width;
    Ok(k)
}

/// The widest vector access a pointwise loop allows: the trip count a multiple of the width and a body
/// of plain statements. Loads and stores at the loop index move as vectors; any other access (a bias
/// broadcast along the row, a gather) happens per lane.
fn vector_width(target: &Target, buffers: &[BufferParam], body: &[Stmt], i: SymId, n: &Expr) -> u32 {
    if buffers.iter().any(|b| !target.vectorises(b.dtype)) {
        return 1;
    }
    // As wide as the widest element fills one access (2- and 4-byte ones; others move per lane), within
    // the target's lanes: eight bf16 lanes are one 16-byte access, but beside an f32 buffer they would
    // take that buffer two accesses and twice the registers (W5-train-bf16's AdamW kernels gained
    // nothing from eight lanes; its GELU kernels, all bf16, 10-14%).
    let widest = buffers.iter().map(|b| b.dtype.size_bytes() as u32).filter(|s| (2..=4).contains(s)).max().unwrap_or(4);
    let mut width = (target.max_vector_bytes / widest).clamp(1, target.max_vector_lanes.max(1));
    let unit = Expr::sym(i);
    let mut fits = true;
    let (mut at_index, mut per_lane) = (0usize, 0usize);
    for s in body {
        match s {
            Stmt::Let { value: Scalar::Load { index, .. }, .. } | Stmt::Store { index, .. } => {
                if *index == unit {
                    at_index += 1;
                } else {
                    per_lane += 1;
                }
            }
            Stmt::Let { .. } => {}
            _ => fits = false,
        }
    }
    // A body of many per-lane accesses (a concatenation of dozens of inputs, each at its own offset)
    // gains nothing from vectors — its loads are per lane either way — and each lane copies all of
    // them: four times the code, the registers and the driver's compile time.
    if !fits || at_index == 0 || per_lane > 4 * at_index.max(2) {
        return 1;
    }
    if per_lane > at_index {
        // Mostly per-lane loads (a concatenation's parts): more lanes are only more of them a thread
        // (W5-train-bf16's QKV-gradient concatenation was 8% slower at eight lanes than at four).
        width = width.min(4);
    }
    while width > 1 && !n.is_divisible_by(width as i64) {
        width /= 2;
    }
    width
}

/// Elements a thread of a short row's workgroup takes: rows of up to 32 × this many get 32 threads, one
/// subgroup on CUDA (and `split_reduce` sizes a column's last pass by it).
pub(crate) const ROW_ELEMENTS_PER_THREAD: u64 = 8;

/// Decides how a row reduction maps to threads: a workgroup per row when rows are long enough to keep
/// its threads busy (256 threads, more only when a row would not otherwise fit in registers), otherwise
/// one thread per row. Returns (grouped, threads, row cache).
fn row_strategy(target: &Target, row_len: &Expr) -> (bool, u32, Option<u32>) {
    let max = target.max_threads_per_group;
    match row_len.as_const() {
        Some(c) if c < 64 => (false, 256.min(max), None),
        Some(c) => {
            // 64-bit arithmetic: a row may hold 2^32 elements or more (a full reduction of a big tensor);
            // only the thread count, bounded by the target, narrows to u32.
            let c = c as u64;
            let (max64, cache) = (max as u64, target.max_row_cache.max(1) as u64);
            // Short rows get smaller groups, about 8 elements a thread: a 512-wide attention row on 256
            // threads spends its time starting groups, not moving data.
            let fewest = (target.row_threads as u64)
                .min(c.div_ceil(ROW_ELEMENTS_PER_THREAD).next_power_of_two().max(32))
                .min(max64)
                .max(1);
            let whole = c.checked_next_power_of_two().unwrap_or(u64::MAX).max(32);
            let per_cache = c.div_ceil(cache).checked_next_power_of_two().unwrap_or(u64::MAX);
            let threads = per_cache.clamp(fewest, max64.max(fewest)).min(whole);
            let per_thread = c.div_ceil(threads);
            let cached = (target.max_row_cache > 0 && per_thread <= cache).then_some(per_thread as u32);
            (true, threads as u32, cached)
        }
        None => (true, 256.min(max), None),
    }
}

fn rows(mut l: Lowerer, region: &Region, input_shape: &Shape, axes: &[usize]) -> Result<Kernel, LowerFailure> {
    let dims = input_shape.dims().to_vec();
    let kept: Vec<usize> = (0..dims.len()).filter(|a| !axes.contains(a)).collect();
    let kept_dims: Vec<Expr> = kept.iter().map(|&a| dims[a].clone()).collect();
    let red_dims: Vec<Expr> = axes.iter().map(|&a| dims[a].clone()).collect();
    let row_count = Shape(kept_dims.clone()).numel();
    let row_len = Shape(red_dims.clone()).numel();
    let element = |row: &Expr, j: &Expr, t: &SymTable| -> Point {
        let k = Point::flat(&kept_dims, row.clone()).multi(t);
        let r = Point::flat(&red_dims, j.clone()).multi(t);
        let mut m = vec![Expr::from(0usize); dims.len()];
        for (i, &a) in kept.iter().enumerate() {
            m[a] = k[i].clone();
        }
        for (i, &a) in axes.iter().enumerate() {
            m[a] = r[i].clone();
        }
        Point::from_multi(&dims, &m, t)
    };
    // Columns (the innermost axis kept) get a thread each, so neighbouring threads read neighbouring
    // elements; a workgroup each would read one element per row at a stride. Only short ones:
    // `split_reduce` cuts long columns into short ones before fusion wherever the shape allows.
    let column = dims.len().checked_sub(1).is_some_and(|last| !axes.contains(&last))
        && row_len.as_const().is_some_and(|c| c as u64 <= crate::split_reduce::SERIAL_COLUMN);
    let (grouped, threads, row_cache) = if column {
        (false, l.target.row_threads.min(l.target.max_threads_per_group), None)
    } else {
        row_strategy(l.target, &row_len)
    };
    let strategy =
        if grouped { ReduceStrategy::Group { subgroup: l.target.subgroup_size } } else { ReduceStrategy::Serial };
    let row = l.new_sym(&row_count);
    l.push_block(&[row]);
    let row_expr = Expr::sym(row);
    for &r in &region.members {
        let node = l.g.node(r);
        let (op, acc_dtype) = match &node.op {
            Op::Reduce { op, .. } => {
                let k = match op {
                    ReduceOp::Sum => KReduceOp::Sum,
                    ReduceOp::Max => KReduceOp::Max,
                    ReduceOp::Min => KReduceOp::Min,
                };
                // Half-precision sums accumulate in f32 on every target (as PyTorch does): an f16 running sum
                // of a few hundred terms is already wrong in its second digit.
                let acc = if matches!(node.dtype, DType::F16 | DType::BF16) {
                    DType::F32
                } else {
                    l.compute_dtype(node.dtype)
                };
                (k, acc)
            }
            Op::ArgReduce { op, .. } => {
                (if *op == ArgReduceOp::ArgMax { KReduceOp::ArgMax } else { KReduceOp::ArgMin }, DType::I64)
            }
            _ => continue,
        };
        let input = node.inputs[0];
        let j = l.new_sym(&row_len);
        l.push_block(&[j]);
        l.evaluating.push(r);
        let at = element(&row_expr, &Expr::sym(j), &l.ranges);
        let v = l.value(input, &at);
        l.evaluating.pop();
        let mut v = v?;
        if op == KReduceOp::Sum {
            v = l.coerce(v, acc_dtype);
        }
        let body = l.pop_block();
        let out = VarId(l.next_var);
        l.next_var += 1;
        let depth = l.blocks.len() - 1;
        l.var_depth.insert(out, depth);
        l.var_dtype.insert(out, acc_dtype);
        let dtype = if matches!(op, KReduceOp::ArgMax | KReduceOp::ArgMin) {
            l.compute_dtype(l.g.node(input).dtype)
        } else {
            acc_dtype
        };
        l.blocks[depth].push(Stmt::Reduce {
            out,
            dtype,
            op,
            sym: j,
            extent: row_len.clone(),
            strategy,
            body,
            value: v,
        });
        let kept_at = Point::flat(&kept_dims, row_expr.clone()).multi(&l.ranges);
        l.reduce_results.insert(r, (out, kept_at));
    }
    for &s in &region.stored {
        let shape = l.g.node(s).shape.clone();
        if shape == *input_shape {
            let j = l.new_sym(&row_len);
            l.push_block(&[j]);
            let p = element(&row_expr, &Expr::sym(j), &l.ranges);
            let v = l.value(s, &p)?;
            l.store(s, p.flat.clone(), v);
            let body = l.pop_block();
            let mode = if grouped { LoopMode::Threads } else { LoopMode::Serial };
            let depth = l.blocks.len() - 1;
            l.blocks[depth].push(Stmt::Loop { sym: j, extent: row_len.clone(), mode, body });
        } else if shape.numel() == row_count {
            let v = l.value(s, &Point::flat(shape.dims(), row_expr.clone()))?;
            l.store(s, row_expr.clone(), v);
        } else {
            return Err(LowerFailure::Refuse(s));
        }
    }
    let body = l.pop_block();
    let mode = if grouped { LoopMode::Group } else { LoopMode::Global };
    let row_body = body.clone();
    l.blocks[0].push(Stmt::Loop { sym: row, extent: row_count.clone(), mode, body });
    // A persistent row keeps every cached load's elements: with several loads per element (x, weight,
    // bias in a layer norm) more threads share the row so each keeps at most `max_row_cache` values
    // (W3 at 256 threads, 48 registers each: 0.196 ms; at 512, 24 each: 0.156 ms; benches/NOTES.md).
    let (threads, row_cache) = match (row_cache, row_len.as_const()) {
        (Some(_), Some(len)) => {
            let loads = RowLoad::of_row(&row_body).len().max(1) as u64;
            let budget = l.target.max_row_cache.max(1) as u64;
            let (len, mut t) = (len as u64, threads as u64);
            while t < l.target.max_threads_per_group as u64 && len.div_ceil(t) * loads > budget {
                t *= 2;
            }
            // Rows with lanes: fewer threads until each keeps four 16-byte vectors, where the register
            // budget allows and down to four warps. A workgroup's two combines cost the same whatever its
            // row's bytes: W3-bf16 at 256 threads (two vectors a thread) took 0.0547 ms, at 128 (four)
            // 0.0511; W3 in f32 keeps four at 256 (0.0699; 0.0705 at 128) (`benches/NOTES.md`, session 38).
            if l.target.vector_rows {
                let bytes = u64::from(widest_word(&l.buffers));
                while t > 128 && len.div_ceil(t) * bytes < 64 && len.div_ceil(t / 2) * loads <= budget {
                    t /= 2;
                }
            }
            let per_thread = len.div_ceil(t);
            (t as u32, (per_thread * loads <= budget).then_some(per_thread as u32))
        }
        _ => (threads, row_cache),
    };
    let groups = if grouped { row_count } else { grid_stride_groups(l.target, &ceil_div(&row_count, threads)) };
    let target = l.target;
    let mut k = l.finish(&region.name, Launch::new(groups, threads));
    k.row_cache = row_cache;
    if grouped {
        settle_subgroups(&mut k.body, threads);
        k.launch.packed = packed_rows(target, &k);
        k.row_lanes = row_lanes(target, &k);
    }
    Ok(k)
}

/// Lanes of a persistent row (`Kernel::row_lanes`): as many as fill one 16-byte access with the row's
/// widest element, fewer until they divide the row and each thread's slots, and 1 unless some access of
/// the row moves as a vector. Rows of one element a thread read 2-byte elements 64 bytes a warp
/// instruction: W3-bf16 reached 52% of the copy rate where f32's 4-byte reads reached 88%.
fn row_lanes(target: &Target, k: &Kernel) -> u32 {
    let (Some(slots), true, 1) = (k.row_cache, target.vector_rows, k.launch.packed.max(1)) else { return 1 };
    if k.buffers.iter().any(|b| !target.vectorises(b.dtype)) {
        return 1;
    }
    let Some(row) = k.row_body() else { return 1 };
    let Some(len) = RowLoad::row_len(row).and_then(Expr::as_const) else { return 1 };
    // Arg reductions keep the first index among equals by the order a thread meets its elements.
    let arg = row.iter().any(|s| matches!(s, Stmt::Reduce { op: KReduceOp::ArgMax | KReduceOp::ArgMin, .. }));
    if arg {
        return 1;
    }
    let mut lanes = (target.max_vector_bytes / widest_word(&k.buffers)).clamp(1, target.max_vector_lanes.max(1));
    while lanes > 1 && (slots % lanes != 0 || len % lanes as i64 != 0) {
        lanes /= 2;
    }
    if k.row_vector_buffers_at(lanes).is_empty() {
        1
    } else {
        lanes
    }
}

/// The widest 2- or 4-byte element among `buffers` (4 where none is either): what a row's 16-byte
/// vectors are counted in.
fn widest_word(buffers: &[BufferParam]) -> u32 {
    buffers.iter().map(|b| b.dtype.size_bytes() as u32).filter(|s| (2..=4).contains(s)).max().unwrap_or(4)
}

/// Keeps a grouped reduction's subgroup only where its combine can shuffle: a 32-bit sum, max or min
/// ([`crate::kernel::shuffles`]) over whole subgroups of a power-of-two size. The others combine through
/// workgroup memory; renderers print whichever the strategy says.
fn settle_subgroups(body: &mut [Stmt], threads: u32) {
    for st in body {
        match st {
            Stmt::Reduce { op, dtype, strategy: ReduceStrategy::Group { subgroup }, body, .. } => {
                let whole = |s: u32| s.is_power_of_two() && threads % s == 0;
                if subgroup.is_some_and(|s| !(whole(s) && crate::kernel::shuffles(*op, *dtype))) {
                    *subgroup = None;
                }
                settle_subgroups(body, threads);
            }
            Stmt::Reduce { body, .. } | Stmt::Loop { body, .. } => settle_subgroups(body, threads),
            _ => {}
        }
    }
}

/// How many rows of `k` one device workgroup takes (`Launch::packed`): a row on a subgroup of its own,
/// as many to a workgroup as the target's `row_threads` holds, when a row needs no more threads than a
/// subgroup has and every combine of the row is a subgroup one (packed rows never wait at a barrier).
/// A workgroup per 32-thread row of 64 elements left an H200's SMs at a quarter of their resident
/// threads (32 workgroups an SM): the attention's `delta` moved 0.4 TB/s.
fn packed_rows(target: &Target, k: &Kernel) -> u32 {
    match target.subgroup_size {
        Some(s) if s == k.launch.threads && k.subgroup_combines() => (target.row_threads / s).max(1),
        _ => 1,
    }
}

fn matmul(mut l: Lowerer, region: &Region, node: NodeId) -> Result<Kernel, LowerFailure> {
    let mm = l.g.node(node);
    let (a_node, b_node) = (mm.inputs[0], mm.inputs[1]);
    let dims = mm.shape.dims().to_vec();
    let r = dims.len();
    let batch_dims = dims[..r - 2].to_vec();
    let (m, n) = (dims[r - 2].clone(), dims[r - 1].clone());
    let k = l.g.node(a_node).shape.dims()[r - 1].clone();
    let batch = Shape(batch_dims.clone()).numel();
    let syms = [l.new_sym(&batch), l.new_sym(&m), l.new_sym(&n), l.new_sym(&k)];
    let [bs, is, js, ps] = syms.map(Expr::sym);
    let batch_idx = Point::flat(&batch_dims, bs.clone()).multi(&l.ranges);
    let at = |x: &Expr, y: &Expr| {
        let mut v = batch_idx.clone();
        v.push(x.clone());
        v.push(y.clone());
        v
    };
    let operand = |l: &mut Lowerer, node: NodeId, idx: Vec<Expr>, bound: [SymId; 3]| {
        l.push_block(&bound);
        let dims = l.g.node(node).shape.dims().to_vec();
        let at = Point::from_multi(&dims, &idx, &l.ranges);
        let v = l.value(node, &at);
        let body = l.pop_block();
        v.map(|value| MatOperand { body, value })
    };
    let a = operand(&mut l, a_node, at(&is, &ps), [syms[0], syms[1], syms[3]])?;
    let b = operand(&mut l, b_node, at(&ps, &js), [syms[0], syms[3], syms[2]])?;
    let acc_dtype = match mm.dtype {
        DType::F64 => DType::F64,
        d if d.is_float() => DType::F32,
        _ => DType::I64,
    };
    l.push_block(&[syms[0], syms[1], syms[2]]);
    let acc = VarId(l.next_var);
    l.next_var += 1;
    l.var_depth.insert(acc, 1);
    l.var_dtype.insert(acc, acc_dtype);
    let out = Point::from_multi(&dims, &at(&is, &js), &l.ranges);
    l.memo.insert((node, out.flat.clone(), None), acc);
    for &s in &region.stored {
        let v = l.value(s, &out)?;
        l.store(s, out.flat.clone(), v);
    }
    let epilogue = l.pop_block();
    let order = crate::matmul_tile::read_order(&a, &b, syms);
    let tile = crate::matmul_tile::choose(l.target, &batch, &m, &n, acc_dtype.size_bytes() as u32, order);
    let groups = batch.clone() * ceil_div(&m, tile.m) * ceil_div(&n, tile.n);
    let threads = tile.threads[0] * tile.threads[1];
    l.blocks[0].push(Stmt::MatMul(Box::new(MatMul { batch, m, n, k, syms, a, b, acc_dtype, acc, epilogue, tile })));
    Ok(l.finish(&region.name, Launch::new(groups, threads)))
}

/// The view to store so that GEMM operand `node` becomes a strided view: `node` itself, unless it is a
/// slice (under reshapes) of a view that other nodes slice too, as a convolution's row products slice
/// one shared matrix (`conv::Builder::conv_by_rows`). Then that view is stored once, whole, and every
/// slice of it is read in place, instead of each slice being copied on its own. The walk continues
/// through the sliced view's own reshapes to the layout node beneath them, so the kernel that produces
/// the values writes them in that layout.
fn shared_source(l: &Lowerer, node: NodeId) -> NodeId {
    let view = |n: NodeId| crate::fuse::role(l.g, n) == crate::fuse::Role::Transparent && !l.materialized.contains(&n);
    let readers = |n: NodeId| l.g.nodes.iter().filter(|x| x.inputs.contains(&n)).count();
    let mut n = node;
    while matches!(l.g.node(n).op, Op::Reshape) && view(l.g.node(n).inputs[0]) {
        n = l.g.node(n).inputs[0];
    }
    if !matches!(l.g.node(n).op, Op::Slice { .. }) {
        return node;
    }
    let mut source = l.g.node(n).inputs[0];
    if !view(source) || readers(source) < 2 {
        return node;
    }
    while matches!(l.g.node(source).op, Op::Reshape) && view(l.g.node(source).inputs[0]) {
        source = l.g.node(source).inputs[0];
    }
    source
}

/// The region of matmul `node` as one library GEMM call, when `gemm` chose the library for it, with the
/// adds its region took (`fuse`: a bias, a residual) as the call's epilogue. Each operand must be a
/// strided view of a buffer the library reads in place; a view that is not (heads permuted back into
/// rows) is sent back to the scheduler to be stored first, as `.contiguous()` would. Batch levels that
/// continue the rows (a linear layer's `[batch, tokens, features]` input) fold into `m`: one larger call.
/// `None` leaves the region to the template.
fn library_matmul(mut l: Lowerer, region: &Region, node: NodeId, tf32: bool) -> Result<Option<Kernel>, LowerFailure> {
    if !crate::gemm::wants_library(l.target, l.g, node) {
        return Ok(None);
    }
    // The epilogue chain, product first: each member adds one thing to the one before.
    let mut chain = vec![node];
    let mut addends = Vec::new();
    // Or the product widened to f32 as the call writes it (`fuse`'s library epilogue).
    let widening = region.members.iter().copied().find(|&c| {
        let n = l.g.node(c);
        crate::fuse::widens(l.g, n) && n.inputs[0] == node
    });
    let widened = widening.is_some();
    chain.extend(widening);
    while chain.len() < region.members.len() {
        let tip = chain[chain.len() - 1];
        let next = region.members.iter().find_map(|&c| crate::gemm::addend(l.g, c, tip).map(|a| (c, a)));
        let Some((c, addend)) = next.filter(|(c, _)| !chain.contains(c) && !widened) else { return Ok(None) };
        chain.push(c);
        addends.push(addend);
    }
    if region.stored != [chain[chain.len() - 1]] {
        return Ok(None);
    }
    let mm = l.g.node(node);
    let (a_node, b_node, dtype) = (mm.inputs[0], mm.inputs[1], mm.dtype);
    let dims = mm.shape.dims().to_vec();
    let r = dims.len();
    let (mut m, n) = (dims[r - 2].clone(), dims[r - 1].clone());
    let k = l.g.node(a_node).shape.dims()[r - 1].clone();
    let batch_syms: Vec<SymId> = dims[..r - 2].iter().map(|d| l.new_sym(d)).collect();
    let [is, js, ps] = [&m, &n, &k].map(|e| l.new_sym(e));
    let operand = |l: &mut Lowerer, node: NodeId, row: SymId, col: SymId, extents: (&Expr, &Expr)| {
        let mut syms = batch_syms.clone();
        syms.extend([row, col]);
        let (buffer, offset, strides) = l.strided_view(node, &syms)?;
        let (rs, cs) = (&strides[strides.len() - 2], &strides[strides.len() - 1]);
        let op = crate::gemm::operand(buffer, offset, extents, (rs, cs), &l.ranges)?;
        Some((op, strides[..strides.len() - 2].to_vec()))
    };
    let view = |l: &Lowerer, n: NodeId| {
        crate::fuse::role(l.g, n) == crate::fuse::Role::Transparent && !l.materialized.contains(&n)
    };
    let a = operand(&mut l, a_node, is, ps, (&m, &k));
    let b = operand(&mut l, b_node, ps, js, (&k, &n));
    let ((a, a_batch), (b, b_batch)) = match (a, b) {
        (Some(a), Some(b)) => (a, b),
        (None, _) if view(&l, a_node) => return Err(LowerFailure::Materialize(shared_source(&l, a_node))),
        (_, None) if view(&l, b_node) => return Err(LowerFailure::Materialize(shared_source(&l, b_node))),
        _ => return Ok(None),
    };
    let mut out_stride = m.clone() * n.clone();
    let mut batch = Vec::with_capacity(r - 2);
    for d in (0..r - 2).rev() {
        batch.push(GemmBatch {
            extent: dims[d].clone(),
            a: a_batch[d].clone(),
            b: b_batch[d].clone(),
            out: out_stride.clone(),
        });
        out_stride = out_stride * dims[d].clone();
    }
    batch.reverse();
    // The output's batch strides before folding: a residual must have exactly these.
    let out_strides: Vec<Expr> = batch.iter().map(|d| d.out.clone()).collect();
    // Innermost batch levels that continue `a`'s rows while `b` stays put are more rows.
    while let Some(last) = batch.last() {
        let rows = m.clone() * a.ld.clone();
        let continues = a.layout == crate::kernel::GemmLayout::RowMajor
            && last.b.as_const() == Some(0)
            && l.ranges.known_eq(&last.a, &rows) == Some(true);
        if !continues {
            break;
        }
        m = m * last.extent.clone();
        batch.pop();
    }
    let mut syms = batch_syms.clone();
    syms.extend([is, js]);
    // cuBLASLt picks its algorithm for the operands' alignment; kiln hands it only 16-byte aligned
    // matrices (buffer starts are), so every call with an epilogue finds the vectorised kernels.
    let per_16 = crate::gemm::EPILOGUE_ALIGN_BYTES / dtype.size_bytes() as i64;
    let aligned = |l: &Lowerer, offset: &Expr, ld: &Expr| {
        l.ranges.known_divisible(offset, per_16) && l.ranges.known_divisible(ld, per_16)
    };
    let operands_aligned = aligned(&l, &a.offset, &a.ld)
        && aligned(&l, &b.offset, &b.ld)
        && l.ranges.known_divisible(&n, per_16)
        && batch.iter().all(|d| [&d.a, &d.b, &d.out].iter().all(|s| l.ranges.known_divisible(s, per_16)));
    // An empty reduction would leave the library's epilogue without a product to add to.
    let deep = l.ranges.known_ge(&k, &Expr::from(1i64)) == Some(true);
    let library_adds = operands_aligned && deep;
    if !addends.is_empty() && !library_adds {
        return Err(LowerFailure::Refuse(chain[1]));
    }
    let mut epilogue = crate::kernel::GemmEpilogue::default();
    // An addend the library cannot take as it is goes back to the scheduler: a residual view is stored
    // first, anything else leaves the chain from that add on (it becomes the next kernel's).
    for (&(kind, other), &add) in addends.iter().zip(&chain[1..]) {
        let Some((buffer, offset, strides)) = l.strided_view(other, &syms) else {
            return if view(&l, other) && kind == crate::gemm::Addend::Residual {
                Err(LowerFailure::Materialize(other))
            } else {
                Err(LowerFailure::Refuse(add))
            };
        };
        let (row, col) = (&strides[strides.len() - 2], &strides[strides.len() - 1]);
        let zero = |e: &Expr| e.as_const() == Some(0);
        let addend = crate::kernel::GemmAddend { buffer, offset: offset.clone() };
        match kind {
            crate::gemm::Addend::Bias => {
                let vector = strides[..strides.len() - 1].iter().all(zero) && col.as_const() == Some(1);
                if !(vector && l.ranges.known_divisible(&offset, per_16)) {
                    return Err(LowerFailure::Refuse(add));
                }
                epilogue.bias = Some(addend);
            }
            crate::gemm::Addend::Residual => {
                // Laid out as the output: row-major rows of `n`, the output's batch strides.
                let as_out = |s: &Expr, want: &Expr| l.ranges.known_eq(s, want) == Some(true);
                let rows_ok = as_out(row, &n) && col.as_const() == Some(1) && l.ranges.known_divisible(&offset, per_16);
                let plain = out_strides.iter().zip(&strides).all(|(want, s)| as_out(s, want));
                if !(rows_ok && plain) {
                    return Err(if view(&l, other) {
                        LowerFailure::Materialize(other)
                    } else {
                        LowerFailure::Refuse(add)
                    });
                }
                epilogue.residual = Some(addend);
            }
        }
    }
    if !epilogue.is_empty() && batch.len() > 1 {
        // The library's epilogue takes one strided batch level.
        return Err(if view(&l, a_node) { LowerFailure::Materialize(a_node) } else { LowerFailure::Refuse(chain[1]) });
    }
    // Scalars the region's constants left while its operands' views were read are dead here: the call
    // reads buffers only, and a kernel is a library GEMM only when the call is its whole body
    // (`Kernel::gemm`); else the PTX renderer would be handed the call.
    l.blocks[0].retain(|s| !matches!(s, Stmt::Let { .. }));
    if !l.blocks[0].is_empty() {
        return Ok(None);
    }
    let out = l.buffer(chain[chain.len() - 1], Access::Write);
    l.blocks[0].push(Stmt::Gemm(Box::new(Gemm { m, n, k, batch, a, b, out, dtype, epilogue, tf32, widened })));
    Ok(Some(l.finish(&region.name, Launch::new(Expr::from(1usize), 1))))
}

/// The region of attention `node` (the forward pass, its log-sum-exps or a gradient) as the fused
/// attention template. Each operand is read in place as rows (unit column stride); a view that is not (a
/// transposed key) is sent back to the scheduler to be stored first, as `.contiguous()` would.
fn attention(mut l: Lowerer, region: &Region, node: NodeId, partner: Option<NodeId>) -> Result<Kernel, LowerFailure> {
    let n = l.g.node(node);
    let Some((pass, scale, causal)) = AttentionPass::of(&n.op) else { return Err(LowerFailure::Refuse(node)) };
    // Only the node's own partner (`attention::partner`) may share its kernel; any other is refused and
    // scheduled alone in the next round.
    if let Some(p) = partner.filter(|&p| crate::attention::partner(l.g, node) != Some(p)) {
        return Err(LowerFailure::Refuse(p));
    }
    let inputs = n.inputs.clone();
    let (qn, kn) = (inputs[0], inputs[1]);
    // The log-sum-exps read no values: the keys stand in (nothing is loaded through them).
    let vn = inputs.get(2).copied().unwrap_or(kn);
    let dtype = l.g.node(qn).dtype;
    let qdims = l.g.node(qn).shape.dims().to_vec();
    let r = qdims.len();
    let (q_len, kv_len) = (qdims[r - 2].clone(), l.g.node(kn).shape.dims()[r - 2].clone());
    let head = |x: NodeId| l.g.node(x).shape.dims()[r - 1].as_const().and_then(|c| u32::try_from(c).ok());
    let (Some(d), Some(dv)) = (head(qn), head(vn)) else { return Err(LowerFailure::Refuse(node)) };
    let batch_syms: Vec<SymId> = qdims[..r - 2].iter().map(|e| l.new_sym(e)).collect();
    // Row operands: q, k, v, then (gradients) the output's gradient; per-query vectors: lse and delta.
    let mut row_operands = vec![(qn, q_len.clone(), d), (kn, kv_len.clone(), d), (vn, kv_len.clone(), dv)];
    let mut vectors = Vec::new();
    if let AttentionPass::Grad(_) = pass {
        row_operands.push((inputs[3], q_len.clone(), dv));
        vectors = vec![inputs[4], inputs[5]];
    }
    let mut views = Vec::with_capacity(row_operands.len());
    for (x, rows, cols) in row_operands {
        let mut syms = batch_syms.clone();
        syms.extend([l.new_sym(&rows), l.new_sym(&Expr::from(cols as usize))]);
        match l.strided_view(x, &syms) {
            Some((buffer, offset, strides)) if strides[r - 1].as_const() == Some(1) => {
                let ld = strides[r - 2].clone();
                views.push((RowsOperand { buffer, offset, ld }, strides[..r - 2].to_vec()));
            }
            _ if crate::fuse::role(l.g, x) == crate::fuse::Role::Transparent && !l.materialized.contains(&x) => {
                return Err(LowerFailure::Materialize(x));
            }
            _ => return Err(LowerFailure::Refuse(node)),
        }
    }
    let mut stats = Vec::with_capacity(2);
    for x in vectors {
        let mut syms = batch_syms.clone();
        syms.push(l.new_sym(&q_len));
        let Some((buffer, offset, strides)) = l.strided_view(x, &syms) else { return Err(LowerFailure::Refuse(node)) };
        stats.push((RowsOperand { buffer, offset, ld: strides[r - 2].clone() }, strides[..r - 2].to_vec()));
    }
    let (out, out_strides) = attention_output(&mut l, region, node)?;
    let second = match partner {
        Some(p) => Some(attention_output(&mut l, region, p)?),
        None => None,
    };
    let zero = || Expr::from(0usize);
    let batch: Vec<AttentionBatch> = (0..r - 2)
        .map(|a| {
            let [q, k, v] = [0, 1, 2].map(|i| views[i].1[a].clone());
            let dout = views.get(3).map_or_else(zero, |x| x.1[a].clone());
            let [lse, delta] = [0, 1].map(|i| stats.get(i).map_or_else(zero, |x| x.1[a].clone()));
            let second = second.as_ref().map_or_else(zero, |x| x.1[a].clone());
            AttentionBatch { extent: qdims[a].clone(), q, k, v, out: out_strides[a].clone(), dout, lse, delta, second }
        })
        .collect();
    // 16-byte loads where every row of every operand starts on a multiple of 8 (half) or 4 (f32) elements.
    let multiple = |n: i64| {
        let of_n = |e: &Expr| e.as_const().is_some_and(|c| c % n == 0);
        views.iter().all(|(o, strides)| of_n(&o.offset) && of_n(&o.ld) && strides.iter().all(of_n))
    };
    let align = [8, 4].into_iter().find(|&n| multiple(n)).unwrap_or(1);
    let tile = match pass {
        AttentionPass::Grad(_) => crate::attention::grad_tile(l.target, d, dv, align == 8),
        _ => crate::attention::tile(l.target, dtype, d, dv, align as u32),
    };
    let Some(tile) = tile else { return Err(LowerFailure::Refuse(node)) };
    // A workgroup owns a block of queries, or (the keys' and values' gradients) of keys.
    let owned = match pass {
        AttentionPass::Grad(AttentionPart::Keys | AttentionPart::Values) => &kv_len,
        _ => &q_len,
    };
    let groups = batch.iter().fold(ceil_div(owned, tile.rows()), |g, b| g * b.extent.clone());
    let [q, k, v] = [0, 1, 2].map(|i| views[i].0.clone());
    let rows_of = |buffer: usize, strides: &[Expr]| RowsOperand {
        buffer,
        offset: Expr::from(0usize),
        ld: strides[r - 2].clone(),
    };
    let out = rows_of(out, &out_strides);
    let second = second.as_ref().map(|(b, s)| rows_of(*b, s));
    let threads = tile.threads();
    let dout = views.get(3).map(|x| x.0.clone());
    let [lse, delta] = [0, 1].map(|i| stats.get(i).map(|x| x.0.clone()));
    let a = Attention {
        batch,
        q_len,
        kv_len,
        head_dim: d,
        value_dim: dv,
        q,
        k,
        v,
        out,
        dout,
        lse,
        delta,
        second,
        pass,
        scale,
        causal,
        dtype,
        tile,
        last_blocks_first: causal && !matches!(pass, AttentionPass::Grad(AttentionPart::Keys | AttentionPart::Values)),
    };
    l.blocks[0].push(Stmt::Attention(Box::new(a)));
    Ok(l.finish(&region.name, Launch::new(groups, threads)))
}

/// Where attention node `x` of an attention region writes its rows: the buffer of the value the region
/// stores for it (the node, or the permute it is stored as, `attention::stored_as`, whose buffer is
/// contiguous) and, per axis of `x`, the stride there.
fn attention_output(l: &mut Lowerer, region: &Region, x: NodeId) -> Result<(usize, Vec<Expr>), LowerFailure> {
    let rank = l.g.node(x).shape.rank();
    let permute = region.stored.iter().copied().find(|&p| p != x && l.g.node(p).inputs.first() == Some(&x));
    let (stored, inv) = match permute {
        None if region.stored.contains(&x) => (x, (0..rank).collect()),
        Some(p) => match &l.g.node(p).op {
            Op::Permute { perm } => {
                let mut inv = vec![0; rank];
                for (k, &a) in perm.iter().enumerate() {
                    inv[a] = k;
                }
                (p, inv)
            }
            _ => return Err(LowerFailure::Refuse(x)),
        },
        None => return Err(LowerFailure::Refuse(x)),
    };
    let stored_dims = l.g.node(stored).shape.dims().to_vec();
    let mut contiguous = vec![Expr::from(1usize); rank];
    for k in (0..rank.saturating_sub(1)).rev() {
        contiguous[k] = contiguous[k + 1].clone() * stored_dims[k + 1].clone();
    }
    let strides = (0..rank).map(|a| contiguous[inv[a]].clone()).collect();
    Ok((l.buffer(stored, Access::Write), strides))
}

/// Lowers one region of `graph` to a kernel for `target`; `materialized` lists the layout nodes other
/// regions store (see `fuse::Feedback`). Also returns the nodes the lowering asked `materialized` about:
/// the same region lowers to the same kernel under any set that agrees with this one on those nodes, so a
/// scheduling round that only stores more views elsewhere keeps the kernels it already has (`pipeline`).
pub fn lower(
    graph: &Graph,
    region: &Region,
    target: &Target,
    materialized: &BTreeSet<NodeId>,
    tf32: &BTreeSet<NodeId>,
) -> (Result<Kernel, LowerFailure>, BTreeSet<NodeId>) {
    let asked = RefCell::new(BTreeSet::new());
    let m = Materialized { set: materialized, asked: &asked };
    let kernel = lower_region(graph, region, target, m, tf32);
    (kernel, asked.into_inner())
}

fn lower_region(
    graph: &Graph,
    region: &Region,
    target: &Target,
    materialized: Materialized,
    tf32: &BTreeSet<NodeId>,
) -> Result<Kernel, LowerFailure> {
    let mut l = Lowerer::new(graph, target, region, materialized);
    // Nothing to compute when every output is empty: the kernel binds its outputs and does no work.
    if region.stored.iter().all(|&s| graph.node(s).shape.numel().as_const() == Some(0)) {
        for &s in &region.stored {
            l.buffer(s, Access::Write);
        }
        return Ok(l.finish(&region.name, Launch::new(Expr::from(0usize), 1)));
    }
    match &region.kind {
        RegionKind::Pointwise => pointwise(l, region),
        RegionKind::Rows { input_shape, axes } => rows(l, region, input_shape, axes),
        RegionKind::Attention { node, partner } => attention(l, region, *node, *partner),
        RegionKind::Collective => all_reduce(l, region),
        RegionKind::MatMul { node } => {
            let tf32 = tf32.contains(node);
            match library_matmul(Lowerer::new(graph, target, region, materialized), region, *node, tf32)? {
                Some(k) => Ok(k),
                None => matmul(l, region, *node),
            }
        }
    }
}

/// A bucket of all-reduces: one collective call, each part reading its input's whole buffer (through
/// reshapes, which keep the bytes) and writing its own.
fn all_reduce(mut l: Lowerer, region: &Region) -> Result<Kernel, LowerFailure> {
    let mut op = None;
    let mut parts = Vec::with_capacity(region.members.len());
    for &m in &region.members {
        let node = l.g.node(m);
        let Op::AllReduce { op: this } = node.op else { return Err(LowerFailure::Refuse(m)) };
        if op.is_some_and(|o| o != this) {
            return Err(LowerFailure::Refuse(m));
        }
        op = Some(this);
        let transparent =
            |n| crate::fuse::role(l.g, n) == crate::fuse::Role::Transparent && !l.materialized.contains(&n);
        let source = match crate::bucket::source(l.g, m, transparent) {
            Some(s) => s,
            None => return Err(LowerFailure::Materialize(node.inputs[0])),
        };
        let (len, dtype) = (node.shape.numel(), node.dtype);
        let input = l.buffer(source, Access::Read);
        let output = l.buffer(m, Access::Write);
        parts.push(AllReducePart { input, output, len, dtype });
    }
    let Some(op) = op else { return Err(LowerFailure::Refuse(region.members[0])) };
    l.blocks[0].push(Stmt::AllReduce(Box::new(AllReduce { op, parts })));
    // One call (a launch of zero groups would be skipped).
    Ok(l.finish(&region.name, Launch::new(Expr::from(1usize), 1)))
}

/// The views that library GEMMs of `graph` cannot read in place, found before scheduling: each matmul
/// the library takes is tried alone, as its region would be, and what it sends back to be stored is
/// stored from the first round on. Scheduling finds the same views by failing (every region is lowered,
/// the failures stored, and the round repeated), but a CNN's convolutions each send one back, and the
/// round they cost lowered every kernel of the graph again.
pub fn library_views_to_store(graph: &Graph, target: &Target, materialized: &BTreeSet<NodeId>) -> BTreeSet<NodeId> {
    let mut store = materialized.clone();
    for (i, node) in graph.nodes.iter().enumerate() {
        let n = NodeId(i as u32);
        if node.op != Op::MatMul || !crate::gemm::wants_library(target, graph, n) {
            continue;
        }
        let region =
            Region { name: String::new(), kind: RegionKind::MatMul { node: n }, members: vec![n], stored: vec![n] };
        // An operand may need two views stored (one beneath the other): at most as many tries as operands.
        for _ in 0..2 {
            let asked = RefCell::new(BTreeSet::new());
            let m = Materialized { set: &store, asked: &asked };
            match library_matmul(Lowerer::new(graph, target, &region, m), &region, n, false) {
                Err(LowerFailure::Materialize(v)) if store.insert(v) => {}
                _ => break,
            }
        }
    }
    store
}

/// The test-only knob `KILN_TEST_WRONG_KERNEL` that seeds a wrong lowering, so the checks can be shown to
/// catch one: any value but `op:NAME` makes every kernel writing a graph output store its last element
/// one too large (the bench's output checks, in every mode); `op:NAME` (`op:tanh`) makes every kernel
/// computing that unary op get it a quarter too large (`kiln check` and its minimizer). Its value is part
/// of the compile cache's key, so a wrong kernel is never served to a run without it.
pub fn wrong_knob() -> Option<String> {
    std::env::var("KILN_TEST_WRONG_KERNEL").ok().filter(|v| !v.is_empty())
}

/// Whether the knob asks for wrong graph outputs ([`wrong_knob`]).
pub fn wrong_kernels() -> bool {
    wrong_knob().is_some_and(|v| !v.starts_with("op:"))
}

/// The unary op the knob miscompiles, if it names one ([`wrong_knob`]).
pub fn wrong_op() -> Option<UnaryOp> {
    let name = wrong_knob()?.strip_prefix("op:")?.to_string();
    serde_json::from_value(serde_json::Value::String(name)).ok()
}

#[cfg(test)]
mod tests {
    use super::grid_stride_groups;
    use crate::sym::{Bindings, Expr, SymTable};
    use crate::Target;

    #[test]
    fn a_symbolic_grid_stride_count_fits_one_dimension_evenly() {
        let mut table = SymTable::new();
        let n = table.new_symbol("n", 0, None);
        let groups = grid_stride_groups(&Target::webgpu_default(), &Expr::sym(n));
        for (units, want) in [(0, 0), (1, 1), (65_535, 65_535), (65_536, 32_768), (200_000, 50_000), (131_071, 43_691)]
        {
            let got = groups.eval(&Bindings::new().with(n, units)).expect("evaluates");
            assert_eq!(got, want, "{units} units");
            let rounds = (units + got - 1) / got.max(1);
            assert!(got <= 65_535 && got * rounds >= units, "{units} units: {got} groups × {rounds} rounds");
        }
    }
}
