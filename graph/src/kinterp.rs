//! The kernel-IR interpreter: runs kernels on the CPU exactly as the IR's evaluation rules say, so fusion
//! and lowering are tested against the reference without a GPU. Loop modes only say how iterations map to
//! threads; iterations are independent, so running them one after another gives the same result.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::interp::{binary, nan_max, nan_min, unary};
use crate::ir::AttentionPart;
use crate::kernel::{Attention, AttentionPass, Gemm, KReduceOp, Kernel, RowsOperand, Scalar, Stmt, VarId};
use crate::loc::SourceLoc;
use crate::sym::{Bindings, Expr};
use std::collections::HashMap;

/// Memory a kernel runs against: `slot(i)` is the array kernel buffer `i` is bound to.
pub trait Memory {
    /// The array behind kernel buffer `i` of the running kernel.
    fn slot(&mut self, buffer: usize) -> &mut Vec<f64>;
}

struct Env<'k, M: Memory> {
    kernel: &'k Kernel,
    mem: &'k mut M,
    vars: HashMap<VarId, f64>,
    syms: Bindings,
    /// The fault word: the largest site recorded plus one, as devices keep it.
    fault: u32,
}

fn fail(kernel: &Kernel, msg: String) -> Error {
    Error::Runtime { op: kernel.name.clone(), msg, loc: SourceLoc::internal() }
}

impl<M: Memory> Env<'_, M> {
    fn var(&self, v: VarId) -> Result<f64> {
        self.vars.get(&v).copied().ok_or_else(|| fail(self.kernel, format!("{v} is read before it is defined")))
    }

    fn index(&self, e: &Expr) -> Result<i64> {
        Ok(e.eval(&self.syms)?)
    }

    fn scalar(&mut self, dtype: DType, value: &Scalar) -> Result<f64> {
        Ok(match value {
            Scalar::Const { value } => *value,
            Scalar::Load { buffer, index, guard } => {
                if let Some(g) = guard {
                    if self.var(*g)? == 0.0 {
                        return Ok(0.0);
                    }
                }
                let i = self.index(index)?;
                let name = &self.kernel.name;
                let slot = self.mem.slot(*buffer);
                usize::try_from(i).ok().and_then(|i| slot.get(i).copied()).ok_or_else(|| Error::Runtime {
                    op: name.clone(),
                    msg: format!("load b{buffer}[{i}] is out of bounds ({} elements)", slot.len()),
                    loc: SourceLoc::internal(),
                })?
            }
            Scalar::Index { expr } => self.index(expr)? as f64,
            Scalar::Unary { op, a } => unary(*op, self.var(*a)?),
            Scalar::Binary { op, a, b } => {
                let (x, y) = (self.var(*a)?, self.var(*b)?);
                // Integer division floors; the operands' dtype is the result's unless this is a comparison.
                // Division by zero gives 0 here as on devices; the kernel's fault check reports it.
                binary(*op, x, y, dtype.is_int()).unwrap_or(0.0)
            }
            Scalar::Select { cond, a, b } => {
                if self.var(*cond)? != 0.0 {
                    self.var(*a)?
                } else {
                    self.var(*b)?
                }
            }
            Scalar::Cast { a } => self.var(*a)?,
            // The f64 quotient of two f32 values rounds to the correctly rounded f32 quotient.
            Scalar::Quotient { a, b, .. } => self.var(*a)? / self.var(*b)?,
            Scalar::Bits { op, a, b } => {
                let word = crate::rng::word_of;
                f64::from(op.apply(word(self.var(*a)?), word(self.var(*b)?)) as i32)
            }
        })
    }

    fn block(&mut self, body: &[Stmt]) -> Result<()> {
        for s in body {
            self.stmt(s)?;
        }
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt) -> Result<()> {
        match s {
            Stmt::Let { var, dtype, value } => {
                let v = self.scalar(*dtype, value)?;
                self.vars.insert(*var, dtype.round(v));
            }
            Stmt::BindIndex { sym, var, bound } => {
                // Clamped as on devices; a fault check before it reports the bad index.
                let v = self.var(*var)?;
                let b = self.index(bound)?;
                self.syms.bind(*sym, (v as i64).clamp(0, (b - 1).max(0)));
            }
            Stmt::Fault { cond, site } => {
                if self.var(*cond)? != 0.0 {
                    self.fault = self.fault.max(site + 1);
                }
            }
            Stmt::Store { buffer, index, value } => {
                let i = self.index(index)?;
                let v = self.var(*value)?;
                let dtype = self.kernel.buffers[*buffer].dtype;
                let name = self.kernel.name.clone();
                let slot = self.mem.slot(*buffer);
                let len = slot.len();
                let cell = usize::try_from(i).ok().and_then(|i| slot.get_mut(i)).ok_or_else(|| Error::Runtime {
                    op: name,
                    msg: format!("store b{buffer}[{i}] is out of bounds ({len} elements)"),
                    loc: SourceLoc::internal(),
                })?;
                *cell = dtype.round(v);
            }
            Stmt::Loop { sym, extent, body, .. } => {
                for it in 0..self.index(extent)? {
                    self.syms.bind(*sym, it);
                    self.block(body)?;
                }
            }
            Stmt::Reduce { out, dtype, op, sym, extent, body, value, .. } => {
                let mut acc = match op {
                    KReduceOp::Sum => 0.0,
                    KReduceOp::Max | KReduceOp::ArgMax => f64::NEG_INFINITY,
                    KReduceOp::Min | KReduceOp::ArgMin => f64::INFINITY,
                };
                let mut best = 0i64;
                let mut first = true;
                for it in 0..self.index(extent)? {
                    self.syms.bind(*sym, it);
                    self.block(body)?;
                    let v = self.var(*value)?;
                    acc = match op {
                        KReduceOp::Sum => dtype.round(acc + v),
                        KReduceOp::Max => nan_max(acc, v),
                        KReduceOp::Min => nan_min(acc, v),
                        KReduceOp::ArgMax | KReduceOp::ArgMin => {
                            let better = !acc.is_nan()
                                && (first || v.is_nan() || if *op == KReduceOp::ArgMax { v > acc } else { v < acc });
                            if better {
                                best = it;
                                v
                            } else {
                                acc
                            }
                        }
                    };
                    first = false;
                }
                let result = if matches!(op, KReduceOp::ArgMax | KReduceOp::ArgMin) { best as f64 } else { acc };
                self.vars.insert(*out, result);
            }
            Stmt::MatMul(m) => {
                let [bs, is, js, ps] = m.syms;
                let (batch, rows, cols, depth) =
                    (self.index(&m.batch)?, self.index(&m.m)?, self.index(&m.n)?, self.index(&m.k)?);
                for b in 0..batch {
                    self.syms.bind(bs, b);
                    for i in 0..rows {
                        self.syms.bind(is, i);
                        for j in 0..cols {
                            self.syms.bind(js, j);
                            let mut acc = 0.0;
                            for p in 0..depth {
                                self.syms.bind(ps, p);
                                self.block(&m.a.body)?;
                                self.block(&m.b.body)?;
                                let prod = self.var(m.a.value)? * self.var(m.b.value)?;
                                acc = m.acc_dtype.round(acc + prod);
                            }
                            self.vars.insert(m.acc, acc);
                            self.block(&m.epilogue)?;
                        }
                    }
                }
            }
            Stmt::Gemm(g) => self.gemm(g)?,
            Stmt::Attention(a) => self.attention(a)?,
            // The interpreter is one process: a world of one, where each part is its input.
            Stmt::AllReduce(a) => {
                for p in &a.parts {
                    let len = usize::try_from(self.index(&p.len)?).unwrap_or(0);
                    let mut values = self.mem.slot(p.input).clone();
                    values.resize(len, 0.0);
                    *self.mem.slot(p.output) = values;
                }
            }
        }
        Ok(())
    }
}

impl<M: Memory> Env<'_, M> {
    /// The attention template: each batch entry's operands gathered through their strides and computed
    /// by the reference's formula for the kernel's pass (in f64; the template's f32 and half-precision
    /// probabilities stay within the dtype's tolerance of it), rounded once to the output's dtype.
    fn attention(&mut self, a: &Attention) -> Result<()> {
        let [tq, tk] = [&a.q_len, &a.kv_len].map(|e| self.index(e));
        let (tq, tk) = (tq?.max(0) as usize, tk?.max(0) as usize);
        let (d, dv) = (a.head_dim as usize, a.value_dim as usize);
        // Operands in the batch's stride order: q, k, v, out, dout, lse, delta, second.
        let ops: [Option<&RowsOperand>; 8] = [
            Some(&a.q),
            Some(&a.k),
            Some(&a.v),
            Some(&a.out),
            a.dout.as_ref(),
            a.lse.as_ref(),
            a.delta.as_ref(),
            a.second.as_ref(),
        ];
        let (mut offs, mut lds) = ([0i64; 8], [0i64; 8]);
        for (i, o) in ops.iter().enumerate() {
            if let Some(o) = o {
                (offs[i], lds[i]) = (self.index(&o.offset)?, self.index(&o.ld)?);
            }
        }
        let mut batch = Vec::with_capacity(a.batch.len());
        for b in &a.batch {
            let mut row = [0i64; 9];
            let strides = [&b.extent, &b.q, &b.k, &b.v, &b.out, &b.dout, &b.lse, &b.delta, &b.second];
            for (x, e) in row.iter_mut().zip(strides) {
                *x = self.index(e)?;
            }
            batch.push(row);
        }
        let entries: i64 = batch.iter().map(|b| b[0]).product();
        let kernel = self.kernel;
        let read = |mem: &mut M, buffer: usize, at: i64, ld: i64, rows: usize, cols: usize| -> Result<Vec<f64>> {
            let slot = mem.slot(buffer);
            let mut v = Vec::with_capacity(rows * cols);
            for r in 0..rows as i64 {
                for c in 0..cols as i64 {
                    let i = at + r * ld + c;
                    let x = usize::try_from(i).ok().and_then(|i| slot.get(i).copied());
                    v.push(x.ok_or_else(|| fail(kernel, format!("attention read b{buffer}[{i}] of {}", slot.len())))?);
                }
            }
            Ok(v)
        };
        let missing = || fail(kernel, "an attention gradient without its output gradient, log-sum-exp or delta".into());
        // Each output's rows, columns and dtype: the pass's own, then the second (`Attention::second`).
        let shape_of = |pass: AttentionPass| {
            let dtype = if pass.f32_output() { DType::F32 } else { a.dtype };
            let (rows, cols) = match pass {
                AttentionPass::Forward => (tq, dv),
                AttentionPass::Lse => (tq, 1),
                AttentionPass::Grad(AttentionPart::Queries) => (tq, d),
                AttentionPass::Grad(AttentionPart::Keys) => (tk, d),
                AttentionPass::Grad(AttentionPart::Values) => (tk, dv),
            };
            (rows, cols, dtype)
        };
        let second_pass = match (a.pass.second(), &a.second) {
            (_, None) => None,
            (Some(pass), Some(o)) => Some((pass, o)),
            (None, Some(_)) => {
                return Err(fail(kernel, format!("an attention {:?} pass with a second output", a.pass)))
            }
        };
        for e in 0..entries {
            let (mut rest, mut at) = (e, offs);
            for b in batch.iter().rev() {
                let i = rest % b[0];
                rest /= b[0];
                for (x, stride) in at.iter_mut().zip(&b[1..]) {
                    *x += i * stride;
                }
            }
            let q = read(self.mem, a.q.buffer, at[0], lds[0], tq, d)?;
            let k = read(self.mem, a.k.buffer, at[1], lds[1], tk, d)?;
            let needs_v = a.pass != AttentionPass::Lse;
            let v = if needs_v { read(self.mem, a.v.buffer, at[2], lds[2], tk, dv)? } else { Vec::new() };
            let grads = match a.pass {
                AttentionPass::Grad(_) => {
                    let [dout, lse, delta] = [&a.dout, &a.lse, &a.delta].map(|o| o.as_ref().map(|o| o.buffer));
                    let (Some(dout), Some(lse), Some(delta)) = (dout, lse, delta) else { return Err(missing()) };
                    let g = read(self.mem, dout, at[4], lds[4], tq, dv)?;
                    let l = read(self.mem, lse, at[5], lds[5], tq, 1)?;
                    let dl = read(self.mem, delta, at[6], lds[6], tq, 1)?;
                    Some((g, l, dl))
                }
                _ => None,
            };
            let compute = |pass: AttentionPass| match (pass, &grads) {
                (AttentionPass::Forward, _) => {
                    Ok(crate::attention::reference(&q, &k, &v, [1, tq, tk, d, dv], a.scale, a.causal))
                }
                (AttentionPass::Lse, _) => {
                    Ok(crate::attention_grad::lse_reference(&q, &k, [1, tq, tk, d], a.scale, a.causal))
                }
                (AttentionPass::Grad(part), Some((g, l, dl))) => {
                    let x = crate::attention_grad::GradOperands { q: &q, k: &k, v: &v, dout: g, lse: l, delta: dl };
                    Ok(crate::attention_grad::grad_reference(&x, [1, tq, tk, d, dv], a.scale, a.causal, part))
                }
                (AttentionPass::Grad(_), None) => Err(missing()),
            };
            let outputs =
                std::iter::once((a.pass, &a.out, at[3], lds[3])).chain(second_pass.map(|(p, o)| (p, o, at[7], lds[7])));
            for (pass, o, at, ld) in outputs {
                let values = compute(pass)?;
                let (rows, cols, dtype) = shape_of(pass);
                let slot = self.mem.slot(o.buffer);
                let len = slot.len();
                for r in 0..rows {
                    for c in 0..cols {
                        let i = at + r as i64 * ld + c as i64;
                        let dst = usize::try_from(i).ok().and_then(|i| slot.get_mut(i));
                        *dst.ok_or_else(|| fail(kernel, format!("attention write b{}[{i}] of {len}", o.buffer)))? =
                            dtype.round(values[r * cols + c]);
                    }
                }
            }
        }
        Ok(())
    }

    /// A library GEMM, as the library computes it: operands rounded to TF32 where the call says so, f32
    /// accumulation, one rounding to the dtype.
    fn gemm(&mut self, g: &Gemm) -> Result<()> {
        let [m, n, k] = [&g.m, &g.n, &g.k].map(|e| self.index(e));
        let (m, n, k) = (m?, n?, k?);
        let (a_off, a_ld, b_off, b_ld) =
            (self.index(&g.a.offset)?, self.index(&g.a.ld)?, self.index(&g.b.offset)?, self.index(&g.b.ld)?);
        let mut batch = Vec::with_capacity(g.batch.len());
        for b in &g.batch {
            batch.push([self.index(&b.extent)?, self.index(&b.a)?, self.index(&b.b)?, self.index(&b.out)?]);
        }
        let entries: i64 = batch.iter().map(|b| b[0]).product();
        let bias = g.epilogue.bias.as_ref().map(|b| Ok::<_, Error>((b.buffer, self.index(&b.offset)?))).transpose()?;
        let residual =
            g.epilogue.residual.as_ref().map(|r| Ok::<_, Error>((r.buffer, self.index(&r.offset)?))).transpose()?;
        let name = self.kernel.name.clone();
        let read = |mem: &mut M, buffer: usize, i: i64| -> Result<f64> {
            let slot = mem.slot(buffer);
            usize::try_from(i).ok().and_then(|i| slot.get(i).copied()).ok_or_else(|| Error::Runtime {
                op: name.clone(),
                msg: format!("gemm read b{buffer}[{i}] is out of bounds ({} elements)", slot.len()),
                loc: SourceLoc::internal(),
            })
        };
        for e in 0..entries {
            // Batch entry `e` as a multi-index, innermost fastest, turned into each operand's base.
            let (mut rest, mut base) = (e, [a_off, b_off, 0]);
            for b in batch.iter().rev() {
                let i = rest % b[0];
                rest /= b[0];
                base = [base[0] + i * b[1], base[1] + i * b[2], base[2] + i * b[3]];
            }
            for i in 0..m {
                for j in 0..n {
                    let mut acc = 0.0;
                    for p in 0..k {
                        let mut x = read(self.mem, g.a.buffer, g.a.element(base[0], a_ld, i, p))?;
                        let mut y = read(self.mem, g.b.buffer, g.b.element(base[1], b_ld, p, j))?;
                        if g.tf32 {
                            (x, y) = (crate::gemm::tf32(x), crate::gemm::tf32(y));
                        }
                        acc = DType::F32.round(acc + x * y);
                    }
                    // The epilogue as cuBLASLt computes it: `a·b + residual + bias`, in f32, rounded once.
                    if let Some((buffer, offset)) = residual {
                        acc = DType::F32.round(acc + read(self.mem, buffer, offset + base[2] + i * n + j)?);
                    }
                    if let Some((buffer, offset)) = bias {
                        acc = DType::F32.round(acc + read(self.mem, buffer, offset + j)?);
                    }
                    let o = usize::try_from(base[2] + i * n + j).unwrap_or(usize::MAX);
                    let slot = self.mem.slot(g.out);
                    let len = slot.len();
                    *slot
                        .get_mut(o)
                        .ok_or_else(|| fail(self.kernel, format!("gemm write b{}[{o}] of {len}", g.out)))? =
                        g.out_dtype().round(acc);
                }
            }
        }
        Ok(())
    }
}

/// Runs `kernel` with shape symbols bound by `bindings`; returns its fault word (0: no check failed,
/// else one more than the largest [`Kernel::faults`] site that did).
///
/// A combined kernel's parts run one after another (their workgroups are independent, as every loop's
/// iterations are), each over the combined kernel's buffers.
pub fn run_kernel<M: Memory>(kernel: &Kernel, mem: &mut M, bindings: &Bindings) -> Result<u32> {
    let mut fault = 0;
    for part in &kernel.parts {
        fault = fault.max(run_kernel(part, mem, bindings)?);
    }
    let mut env = Env { kernel, mem, vars: HashMap::new(), syms: bindings.clone(), fault };
    env.block(&kernel.body)?;
    Ok(env.fault)
}
