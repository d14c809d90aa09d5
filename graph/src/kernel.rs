//! The kernel IR: the loop-level program both renderers print. It is small and explicit on purpose —
//! every decision (what a kernel computes, how it is launched, how a reduction is split across threads,
//! which dtype each value is computed in) is already made by `fuse` and `lower`, so WGSL and PTX writers
//! are straightforward printers.
//!
//! Evaluation rules (the kernel interpreter in `kinterp` is their executable form):
//! - A kernel binds `buffers` (flat arrays of one dtype) and the symbol values in `symbols`.
//! - `Let` defines an SSA scalar of a dtype; every value is rounded to its dtype.
//! - Index expressions are `sym::Expr`s over loop variables, bound index values and shape symbols.
//! - `Loop` modes say how iterations map to threads: `Global` (one iteration per thread of the grid,
//!   grid-stride when the grid is capped), `Group` (one iteration per workgroup), `Threads` (iterations
//!   strided across the threads of the current workgroup), `Serial` (each thread runs every iteration).
//! - Inside a `Group` loop, statements outside any `Threads` loop or `Reduce` run redundantly on every
//!   thread; a `Store` there is performed by thread 0 only.
//! - `Reduce` combines `value` over its loop with the given op; with `ReduceStrategy::Group` the threads
//!   of the group split the loop and combine partials (subgroup shuffles, then shared memory), and every
//!   thread receives the result.
//! - `MatMul` is the matmul template: for every output element `(b, i, j)` it accumulates
//!   `a(b, i, p) * b(b, p, j)` over `p` (operand bodies are evaluated at those indices), binds the sum to
//!   `acc` and runs the epilogue, which ends in stores.
//! - `Gemm` is a whole kernel that a device's GEMM library runs instead of generated code; its operands
//!   are strided views of buffers, its output a row-major buffer. Renderers do not print it.
//! - A combined kernel (`Kernel::parts`, made by `combine`) has no body of its own: part `p` is a whole
//!   kernel over the combined kernel's buffers that runs on workgroups `offset_p .. offset_p + groups_p`
//!   of the launch, seeing them as its workgroups `0 .. groups_p` (its `Group` and `Global` loops start
//!   there and stride by its own count). The kernel a part came from keeps its place in the list as a
//!   kernel that launches nothing (`Kernel::launched_in`).

use crate::dtype::DType;
use crate::ir::{BinaryOp, NodeId, UnaryOp};
use crate::sym::{Expr, SymId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// A kernel a renderer cannot express in its language (every renderer reports it the same way).
#[derive(Debug, thiserror::Error)]
#[error("kernel {kernel}: {msg}")]
pub struct RenderError {
    /// Kernel name.
    pub kernel: String,
    /// What is not expressible.
    pub msg: String,
}

/// A scalar SSA value of a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct VarId(pub u32);

impl fmt::Display for VarId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// What a kernel does with a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// Only loads.
    Read,
    /// Only stores.
    Write,
}

/// A buffer parameter.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BufferParam {
    /// Element type as stored.
    pub dtype: DType,
    /// Elements, possibly symbolic.
    pub len: Expr,
    /// Loads or stores.
    pub access: Access,
    /// The graph value it holds (an input or a stored node); the plan maps values to memory.
    pub node: NodeId,
}

/// A scalar computation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Scalar {
    /// A constant (rounded to the `Let`'s dtype).
    Const {
        /// The value.
        #[serde(with = "crate::numbers")]
        value: f64,
    },
    /// `buffers[buffer][index]`, converted to the `Let`'s dtype; when `guard` is false the value is 0 and
    /// no memory is touched.
    Load {
        /// Kernel buffer number.
        buffer: usize,
        /// Element index.
        index: Expr,
        /// A bool value that must hold for the access to happen.
        guard: Option<VarId>,
    },
    /// The integer value of an index expression.
    Index {
        /// The expression.
        expr: Expr,
    },
    /// A one-input op.
    Unary {
        /// Which.
        op: UnaryOp,
        /// Input.
        a: VarId,
    },
    /// A two-input op (comparisons give bool).
    Binary {
        /// Which.
        op: BinaryOp,
        /// Left.
        a: VarId,
        /// Right.
        b: VarId,
    },
    /// `cond ? a : b`.
    Select {
        /// Bool condition.
        cond: VarId,
        /// Value when true.
        a: VarId,
        /// Value when false.
        b: VarId,
    },
    /// Conversion to the `Let`'s dtype.
    Cast {
        /// Input.
        a: VarId,
    },
    /// `a / b`, rounded as a division is, where `reciprocal` holds `1/b` computed once outside the loop
    /// that computes `a` (a softmax's row sum): a renderer may refine `a * reciprocal` to the rounded
    /// quotient (two fused multiply-adds) instead of dividing per element. f32 only.
    Quotient {
        /// Dividend.
        a: VarId,
        /// Divisor.
        b: VarId,
        /// `1/b`, rounded.
        reciprocal: VarId,
    },
    /// `a op b` on 32-bit patterns: i32 operands and result read as u32 (the integer arithmetic of
    /// counter-based random numbers, [`crate::rng`]).
    Bits {
        /// Which.
        op: BitOp,
        /// Left operand.
        a: VarId,
        /// Right operand.
        b: VarId,
    },
}

/// An operation on 32-bit unsigned patterns ([`Scalar::Bits`]); arithmetic wraps modulo 2^32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BitOp {
    /// Exclusive or.
    Xor,
    /// Sum modulo 2^32.
    Add,
    /// The low 32 bits of the 64-bit product.
    MulLo,
    /// The high 32 bits of the 64-bit product.
    MulHi,
    /// Logical shift right by `b` (0 to 31).
    Shr,
}

impl BitOp {
    /// The op on two 32-bit patterns: the definition every renderer matches.
    pub fn apply(self, a: u32, b: u32) -> u32 {
        match self {
            BitOp::Xor => a ^ b,
            BitOp::Add => a.wrapping_add(b),
            BitOp::MulLo => a.wrapping_mul(b),
            BitOp::MulHi => ((u64::from(a) * u64::from(b)) >> 32) as u32,
            BitOp::Shr => a >> (b & 31),
        }
    }

    /// The name kernel IR prints.
    pub fn name(self) -> &'static str {
        match self {
            BitOp::Xor => "xor",
            BitOp::Add => "add_u32",
            BitOp::MulLo => "mul_lo_u32",
            BitOp::MulHi => "mul_hi_u32",
            BitOp::Shr => "shr_u32",
        }
    }
}

/// The combining op of a kernel reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KReduceOp {
    /// Sum.
    Sum,
    /// Maximum, NaN-propagating.
    Max,
    /// Minimum, NaN-propagating.
    Min,
    /// Index (the loop variable) of the first maximum; NaN counts as maximum.
    ArgMax,
    /// Index of the first minimum; NaN counts as minimum.
    ArgMin,
}

/// Whether a combine of `op` over `dtype` partials can be a subgroup shuffle (both renderers shuffle 32-bit
/// sums, maxima and minima; arg reductions and 64-bit values combine through workgroup memory).
pub fn shuffles(op: KReduceOp, dtype: DType) -> bool {
    matches!(op, KReduceOp::Sum | KReduceOp::Max | KReduceOp::Min) && matches!(dtype, DType::F32 | DType::I32)
}

/// How a reduction's loop is split across threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReduceStrategy {
    /// One thread runs the whole loop (short rows, many of them).
    Serial,
    /// The workgroup's threads stride over the loop; partials combine through subgroup shuffles (when
    /// `subgroup` is set) and then workgroup shared memory.
    Group {
        /// Subgroup size to shuffle within first: set by lowering only where the combine can shuffle
        /// ([`shuffles`], whole power-of-two subgroups), so renderers print it without deciding.
        subgroup: Option<u32>,
    },
}

/// How a loop's iterations map to threads (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoopMode {
    /// One iteration per grid thread.
    Global,
    /// One iteration per workgroup.
    Group,
    /// Strided across the threads of the workgroup.
    Threads,
    /// Every thread runs every iteration.
    Serial,
}

/// A statement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Stmt {
    /// Defines `var` of `dtype`.
    Let {
        /// The new value.
        var: VarId,
        /// Its dtype (the compute dtype, which may be wider than the storage dtype).
        dtype: DType,
        /// What it is.
        value: Scalar,
    },
    /// Makes an integer value usable in index expressions as `sym`, clamped into `[0, bound)` so a bad
    /// index can never touch memory outside the buffer.
    BindIndex {
        /// The symbol index expressions use.
        sym: SymId,
        /// The integer value.
        var: VarId,
        /// Exclusive upper bound.
        bound: Expr,
    },
    /// `buffers[buffer][index] = value` (converted to the buffer's dtype).
    Store {
        /// Kernel buffer number.
        buffer: usize,
        /// Element index.
        index: Expr,
        /// The value.
        value: VarId,
    },
    /// `for sym in 0..extent`, mapped to threads by `mode`.
    Loop {
        /// Loop variable.
        sym: SymId,
        /// Trip count.
        extent: Expr,
        /// Thread mapping.
        mode: LoopMode,
        /// Body.
        body: Vec<Stmt>,
    },
    /// `out = reduce(op, value for sym in 0..extent)`.
    Reduce {
        /// Result (ArgMax/ArgMin: an i64 index).
        out: VarId,
        /// Accumulator dtype (the value's dtype for Sum/Max/Min).
        dtype: DType,
        /// Combining op.
        op: KReduceOp,
        /// Loop variable.
        sym: SymId,
        /// Trip count.
        extent: Expr,
        /// Thread split.
        strategy: ReduceStrategy,
        /// Computes `value` for one iteration.
        body: Vec<Stmt>,
        /// The value reduced.
        value: VarId,
    },
    /// The matmul template (see the module docs).
    MatMul(Box<MatMul>),
    /// A matmul the device's GEMM library runs (cuBLAS on CUDA): the kernel is this one call, not code.
    Gemm(Box<Gemm>),
    /// The fused attention template (see [`Attention`]): the kernel's whole body.
    Attention(Box<Attention>),
    /// A bucket of all-reduces across the processes of a data-parallel world (see
    /// [`crate::bucket`]): the kernel's whole body, one collective call (NCCL on CUDA), not code.
    AllReduce(Box<AllReduce>),
    /// When bool `cond` holds, records fault `site` (an index of [`Kernel::faults`]) in the kernel's
    /// fault word; the run then fails with that site's error. Execution goes on (indices are clamped),
    /// so no memory outside a buffer is touched. Sites are numbered so the largest recorded wins.
    Fault {
        /// The bool value that signals the fault.
        cond: VarId,
        /// Which site.
        site: u32,
    },
}

/// A check a kernel performs at run time, which the reference performs too: an index out of range in
/// a gather, an integer division by zero. Renderers write a fault word (WGSL: one `atomic<u32>` binding
/// after the buffers and symbols; PTX: one pointer parameter after the buffers) and the runtime turns a
/// nonzero word into [`crate::Error::Runtime`] naming the op and the user's line.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FaultSite {
    /// The user-level op, e.g. `index_select`.
    pub op: String,
    /// What went wrong, e.g. `an index is out of range for a dim of size 5`.
    pub msg: String,
    /// The primitive-graph node that checks it (its origin gives the user's line).
    pub node: NodeId,
}

/// One operand of the matmul template: statements computing the element at `(b, row, col)` of the
/// operand, where the template binds the three symbols.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MatOperand {
    /// Computes `value`.
    pub body: Vec<Stmt>,
    /// The element.
    pub value: VarId,
}

/// The matmul template's schedule, chosen by `graph` from the target (`matmul_tile`): a workgroup owns an
/// `m × n` block of one batch entry's output and steps through the depth `k` elements at a time; its
/// `threads[0] × threads[1]` threads (row-major: thread `t` is row `t / threads[1]`, column
/// `t % threads[1]`) each keep `m / threads[0] × n / threads[1]` sums in registers. A thread's rows come
/// in runs of `run` consecutive rows spaced `threads[0] · run` apart, its columns likewise: thread
/// `(y, x)` owns rows `g · threads[0] · run + y · run + r` for every run `g` and `r < run` — so the
/// group's threads read a step's operands as `run`-wide vectors of workgroup memory side by side.
/// Renderers print this; each step's operand tiles are read from memory into registers while the
/// previous step's are multiplied (`stages` tiles of each operand in workgroup memory, `shared_bytes`,
/// laid out as `a_stride` and `b_stride` say).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Tile {
    /// Rows of the output tile.
    pub m: u32,
    /// Columns of the output tile.
    pub n: u32,
    /// Depth of one k step.
    pub k: u32,
    /// Threads along the tile's rows and along its columns.
    pub threads: [u32; 2],
    /// Consecutive rows (and columns) one thread owns before the next run (1, 2 or 4).
    pub run: u32,
    /// For A and for B: whether consecutive threads reading a step's tile take consecutive depths (else
    /// consecutive rows of A, columns of B). `graph` picks the axis along which the operand's loads are
    /// contiguous in memory, so the threads' reads coalesce (`matmul_tile::read_order`).
    pub depth_fastest: [bool; 2],
    /// Operand tiles in workgroup memory, 1 or 2. With one, a step waits at a barrier before
    /// overwriting the tiles the previous step multiplied and at another before multiplying the new
    /// ones; with two, step `s` writes the tiles step `s - 1` did not read, and the second barrier alone
    /// keeps them apart (one more a block, before its first step, guards the previous block's last).
    #[serde(default = "one_stage")]
    pub stages: u32,
}

impl Tile {
    /// Sums one thread keeps: rows, columns.
    pub fn per_thread(&self) -> [u32; 2] {
        [self.m / self.threads[0].max(1), self.n / self.threads[1].max(1)]
    }

    /// Elements between consecutive depths of the A tile in workgroup memory: it is stored depth-major
    /// (a thread's rows side by side) with each depth's rows padded by one run, so the threads writing
    /// one row's consecutive depths hit different memory banks (unpadded, a 128-row tile put all of
    /// them in one bank).
    pub fn a_stride(&self) -> u32 {
        self.m + self.run
    }

    /// [`Tile::a_stride`] for B: its columns padded by one run, so threads writing one column's
    /// consecutive depths (`depth_fastest`) hit different banks too.
    pub fn b_stride(&self) -> u32 {
        self.n + self.run
    }

    /// Elements of a step's A and B tiles each of `threads` threads reads (its register slots).
    pub fn slots(&self, threads: u32) -> [u32; 2] {
        let t = threads.max(1);
        [(self.m * self.k).div_ceil(t), (self.n * self.k).div_ceil(t)]
    }

    /// Where a thread's `index`-th row (`axis` 0) or column (`axis` 1) lies in the tile, past the
    /// thread's first (`thread · run`): runs of `run` spaced `threads[axis] · run` apart.
    pub fn owned(&self, axis: usize, index: u32) -> u32 {
        (index / self.run) * self.threads[axis] * self.run + index % self.run
    }

    /// How a thread's register slots of operand `side` (0: A, 1: B) walk a step's tile, where they walk
    /// it evenly: slot `q` of thread `local` reads element `local + q · threads` of the tile, at depth
    /// `d0 + q · dd` and row (A) or column (B) `o0 + q · do`, where `(d0, o0)` is the thread's first
    /// element — `(local % k, local / k)` read depth-fastest, else `(local / outer, local % outer)`.
    /// `Some([dd, do])` when the threads cover whole lines of that order, so a renderer computes
    /// `(d0, o0)` once, not a division a slot a step.
    pub fn slot_step(&self, side: usize, threads: u32) -> Option<[u32; 2]> {
        let outer = if side == 0 { self.m } else { self.n };
        if self.depth_fastest[side] {
            (self.k > 0 && threads % self.k == 0).then(|| [0, threads / self.k])
        } else {
            (outer > 0 && threads % outer == 0).then(|| [threads / outer, 0])
        }
    }

    /// Workgroup memory of the operand tiles (every stage) with elements of `elem_bytes`.
    pub fn shared_bytes(&self, elem_bytes: u32) -> u32 {
        (self.a_stride() + self.b_stride()) * self.k * elem_bytes * self.stages.max(1)
    }

    /// Why the template cannot run this schedule with `threads` threads a workgroup, if it cannot.
    pub fn unfit(&self, threads: u32) -> Option<String> {
        let [ty, tx] = self.threads;
        if ty * tx != threads {
            return Some(format!("a {ty}x{tx} thread tile in a workgroup of {threads} threads"));
        }
        if !matches!(self.run, 1 | 2 | 4) {
            return Some(format!("runs of {} outputs (1, 2 or 4)", self.run));
        }
        if !matches!(self.stages, 1 | 2) {
            return Some(format!("{} stages of operand tiles (1 or 2)", self.stages));
        }
        if self.k == 0 || self.m % (ty * self.run) != 0 || self.n % (tx * self.run) != 0 {
            return Some(format!(
                "a {}x{}x{} tile does not split into runs of {} over {ty}x{tx} threads",
                self.m, self.n, self.k, self.run
            ));
        }
        None
    }
}

/// `out[b, i, j] = epilogue(sum_p a[b, i, p] * b[b, p, j])`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MatMul {
    /// Flattened batch count.
    pub batch: Expr,
    /// Output rows.
    pub m: Expr,
    /// Output columns.
    pub n: Expr,
    /// Reduction depth.
    pub k: Expr,
    /// Batch, row, column and depth symbols.
    pub syms: [SymId; 4],
    /// Left operand, evaluated at `(b, i, p)`.
    pub a: MatOperand,
    /// Right operand, evaluated at `(b, p, j)`.
    pub b: MatOperand,
    /// Accumulator dtype.
    pub acc_dtype: DType,
    /// The accumulated value, visible to the epilogue.
    pub acc: VarId,
    /// Runs per output element, ends in stores.
    pub epilogue: Vec<Stmt>,
    /// Tiling.
    pub tile: Tile,
}

impl MatMul {
    /// Whether the rows, the columns and the depth each split into whole tiles (a known extent, a
    /// multiple of the tile's): there a renderer leaves out the bound checks on that axis, which every
    /// element of every tile passes.
    pub fn whole_tiles(&self) -> [bool; 3] {
        let whole = |e: &Expr, edge: u32| e.as_const().is_some_and(|v| v > 0 && v % i64::from(edge) == 0);
        [whole(&self.m, self.tile.m), whole(&self.n, self.tile.n), whole(&self.k, self.tile.k)]
    }
}

/// How one GEMM operand lies in its buffer (element `(r, c)` of one batch entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GemmLayout {
    /// At `offset + r * ld + c`.
    RowMajor,
    /// At `offset + r + c * ld`.
    ColMajor,
}

/// One operand of a library GEMM: a strided view of a kernel buffer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemmOperand {
    /// Kernel buffer number.
    pub buffer: usize,
    /// Element offset of entry `(0, 0)` of batch entry 0.
    pub offset: Expr,
    /// Row- or column-major.
    pub layout: GemmLayout,
    /// Leading dimension, in elements (at least the contiguous extent).
    pub ld: Expr,
}

/// A bucket of all-reduces issued as one collective call: each part reads one whole input buffer and
/// writes one whole output buffer of the same length.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllReduce {
    /// Sum or mean over the ranks.
    pub op: crate::ir::CollectiveOp,
    /// The bucket's tensors, in the order they are issued.
    pub parts: Vec<AllReducePart>,
}

/// One tensor of an [`AllReduce`] bucket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllReducePart {
    /// Kernel buffer read (whole).
    pub input: usize,
    /// Kernel buffer written (whole).
    pub output: usize,
    /// Elements.
    pub len: Expr,
    /// Element type of both.
    pub dtype: DType,
}

/// One batch dimension of a library GEMM, with each operand's stride along it (0: broadcast).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemmBatch {
    /// Entries.
    pub extent: Expr,
    /// Stride in `a`, elements.
    pub a: Expr,
    /// Stride in `b`, elements.
    pub b: Expr,
    /// Stride in the output, elements.
    pub out: Expr,
}

/// `out[batch.., i, j] = sum_p a[batch.., i, p] * b[batch.., p, j]`, accumulated in f32 and rounded once
/// to `dtype`; `out` is row-major (`ld = n`). `graph` chooses it (see `gemm`) only where every operand is
/// a strided view a GEMM library takes as it is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gemm {
    /// Output rows.
    pub m: Expr,
    /// Output columns.
    pub n: Expr,
    /// Reduction depth.
    pub k: Expr,
    /// Batch dimensions, outermost first (empty: one matrix).
    pub batch: Vec<GemmBatch>,
    /// Left operand, `m x k`.
    pub a: GemmOperand,
    /// Right operand, `k x n`.
    pub b: GemmOperand,
    /// Output kernel buffer.
    pub out: usize,
    /// Dtype of both operands, and of the output unless [`Gemm::widened`].
    pub dtype: DType,
    /// What the call adds to the product before its one rounding (empty: nothing).
    #[serde(default)]
    pub epilogue: GemmEpilogue,
    /// f32 operands are rounded to TF32 (`gemm::tf32`) and multiplied on matrix units, the products
    /// summed in f32 (`gemm::tf32_products` says which matmuls).
    #[serde(default)]
    pub tf32: bool,
    /// The output is written in f32, the f32 sum not rounded to `dtype`: the product's one reader widens
    /// it to f32 and must be stored (a collective reads it), so the call writes the wide value itself
    /// instead of a copy kernel widening the narrow one (`fuse`'s library epilogue; no addends then).
    #[serde(default)]
    pub widened: bool,
}

impl Gemm {
    /// The dtype the call writes.
    pub fn out_dtype(&self) -> DType {
        if self.widened {
            DType::F32
        } else {
            self.dtype
        }
    }
}

/// The additions a GEMM library applies to `a·b` inside the call (cuBLASLt's epilogue): the f32 sum
/// `a·b + residual + bias[j]` is rounded once to the output dtype, where the written-out graph would
/// round the product, then each sum. `graph` fuses them (`gemm::addend`) only where the batch folded
/// into the rows or is one strided level, so a library takes them as they are.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GemmEpilogue {
    /// `bias[j]` added to every row: `n` consecutive elements, 16-byte aligned within their buffer.
    pub bias: Option<GemmAddend>,
    /// A tensor laid out as the output (row-major, `ld = n`, the output's batch strides) added to it.
    pub residual: Option<GemmAddend>,
}

impl GemmEpilogue {
    /// True when the call adds nothing.
    pub fn is_empty(&self) -> bool {
        self.bias.is_none() && self.residual.is_none()
    }
}

/// Where a GEMM epilogue's operand starts: kernel buffer and element offset (batch entry 0).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemmAddend {
    /// Kernel buffer number.
    pub buffer: usize,
    /// Element offset.
    pub offset: Expr,
}

/// Rows of a matrix in a kernel buffer: element `(r, c)` of batch entry 0 at `offset + r * ld + c`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RowsOperand {
    /// Kernel buffer number.
    pub buffer: usize,
    /// Element offset of `(0, 0)`.
    pub offset: Expr,
    /// Elements from one row to the next.
    pub ld: Expr,
}

/// No stride: an operand the pass does not read.
fn no_stride() -> Expr {
    Expr::from(0usize)
}

/// One batch dimension of an attention, with each operand's stride along it, in elements.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionBatch {
    /// Entries.
    pub extent: Expr,
    /// Stride in the queries.
    pub q: Expr,
    /// Stride in the keys.
    pub k: Expr,
    /// Stride in the values.
    pub v: Expr,
    /// Stride in the output.
    pub out: Expr,
    /// Stride in the output's gradient (gradient passes).
    #[serde(default = "no_stride")]
    pub dout: Expr,
    /// Stride in the log-sum-exps (gradient passes).
    #[serde(default = "no_stride")]
    pub lse: Expr,
    /// Stride in the deltas (gradient passes).
    #[serde(default = "no_stride")]
    pub delta: Expr,
    /// Stride in the second output (see [`Attention::second`]).
    #[serde(default = "no_stride")]
    pub second: Expr,
}

/// What an [`Attention`] kernel computes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AttentionPass {
    /// The attention's output.
    #[default]
    Forward,
    /// Each query's log-sum-exp of its scaled, masked scores (`out` holds one f32 a row).
    Lse,
    /// One operand's gradient (`dout`, `lse` and `delta` given), the probabilities rebuilt from `lse`.
    Grad(crate::ir::AttentionPart),
}

impl AttentionPass {
    /// The pass an attention node's op asks for, with the op's scale and mask; `None` for other ops.
    pub fn of(op: &crate::ir::Op) -> Option<(AttentionPass, f64, bool)> {
        use crate::ir::Op;
        match *op {
            Op::Attention { scale, causal } => Some((AttentionPass::Forward, scale, causal)),
            Op::AttentionLse { scale, causal } => Some((AttentionPass::Lse, scale, causal)),
            Op::AttentionGrad { scale, causal, part } => Some((AttentionPass::Grad(part), scale, causal)),
            _ => None,
        }
    }

    /// The op of this pass (the inverse of [`AttentionPass::of`]).
    pub fn op(self, scale: f64, causal: bool) -> crate::ir::Op {
        use crate::ir::Op;
        match self {
            AttentionPass::Forward => Op::Attention { scale, causal },
            AttentionPass::Lse => Op::AttentionLse { scale, causal },
            AttentionPass::Grad(part) => Op::AttentionGrad { scale, causal, part },
        }
    }

    /// The pass whose output a kernel of this pass writes as its second ([`Attention::second`]), where one
    /// can: the log-sum-exps beside the forward (the online softmax ends holding each row's max and sum),
    /// the values' gradient beside the keys' (both from the same probabilities).
    pub fn second(self) -> Option<AttentionPass> {
        match self {
            AttentionPass::Forward => Some(AttentionPass::Lse),
            AttentionPass::Grad(crate::ir::AttentionPart::Keys) => {
                Some(AttentionPass::Grad(crate::ir::AttentionPart::Values))
            }
            _ => None,
        }
    }

    /// Whether this pass's output is f32 (the log-sum-exps) rather than the operands' dtype.
    pub fn f32_output(self) -> bool {
        self == AttentionPass::Lse
    }
}

/// What a fused attention's products run on, chosen by `graph` from the target and dtype
/// (`attention::tile`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AttentionUnits {
    /// Matrix-multiply-accumulate instructions (tensor cores) over f16/bf16: a warp owns 16 queries.
    #[default]
    Matrix,
    /// A thread's vector lanes, in f32: each thread owns one query, its row of `q` and of the output in
    /// registers, and reads every key and value of a tile from workgroup memory (one address for all
    /// threads, so no bank conflicts); its softmax needs no other thread. For targets without matrix
    /// units (WGSL), where written out the scores would cross memory three times.
    Lanes,
    /// Each thread's registers, in f32, tiled as a matrix product is: each thread a block of
    /// `thread_rows` queries × 8 keys of the scores and of `thread_rows` queries × `value_dim / 8`
    /// columns of the output, read from the query, key and value tiles in workgroup memory (the queries
    /// and keys transposed, so four of a thread's queries, or of its keys, at one depth are one 16-byte
    /// read); the probabilities pass through workgroup memory to the second product. For targets whose
    /// renderer has it (PTX, WGSL) and whose f32 products would otherwise be written out.
    Registers,
}

/// Threads sharing a query's row in [`AttentionUnits::Registers`]: each holds an eighth of its scores
/// (8 of a 64-key tile) and of its output's columns.
pub const REGISTER_COLUMN_THREADS: u32 = 8;

/// Where one thread's output columns lie in [`AttentionUnits::Registers`]
/// ([`AttentionTile::register_columns`]): `width`-column vectors at `cg * stride + offset` for each
/// offset, `cg` the thread's place among the [`REGISTER_COLUMN_THREADS`] sharing a row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterColumns {
    /// Columns between two neighbouring threads' first columns.
    pub stride: u32,
    /// Each vector's first column, after the thread's own first.
    pub offsets: Vec<u32>,
    /// Columns a vector holds: 4, 2 or 1.
    pub width: u32,
}

impl RegisterColumns {
    /// Columns a thread holds.
    pub fn count(&self) -> usize {
        self.offsets.len() * self.width as usize
    }

    /// Each of the thread's columns, as (its vector's offset, its lane in the vector).
    pub fn each(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.offsets.iter().flat_map(move |&o| (0..self.width).map(move |l| (o, l)))
    }
}

/// How the attention template divides its work, chosen by `graph` from the target and head dims.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AttentionTile {
    /// Groups of 32 threads per workgroup; with matrix units each owns 16 query rows (one matrix
    /// instruction's height), with lanes 32 (one a thread).
    pub warps: u32,
    /// Keys per step: the key and value tiles in shared memory hold this many rows.
    pub keys: u32,
    /// Elements one global load moves: 8 (16 bytes) when every row of every operand starts 16-byte
    /// aligned, else 1.
    pub vector: u32,
    /// Copies of the streamed tiles in shared memory: 2 when the next tile is copied (asynchronously,
    /// 16 bytes a piece, so only with `vector` 8) while the current one is computed on, else 1.
    #[serde(default = "one_stage")]
    pub stages: u32,
    /// What the products run on.
    #[serde(default)]
    pub units: AttentionUnits,
    /// With lanes: keys whose scores a thread computes before it folds them into its running max, sum
    /// and output (one rescale of the output a chunk, not a key); a divisor of `keys`. With registers:
    /// depth steps of each product unrolled in one iteration of its loop; a divisor of `keys` and of
    /// the head dim. 0 otherwise.
    #[serde(default)]
    pub chunk: u32,
    /// With lanes: threads a query is split across (1, 2 or 4), each holding that share of its rows and
    /// their partial scores summed by subgroup shuffles — fewer registers a thread, so more threads fit.
    #[serde(default = "one_stage")]
    pub split: u32,
    /// With registers: queries a thread owns (4 or 8), each with its eight keys of a tile's scores and
    /// its share of the output's columns. 0 otherwise.
    #[serde(default)]
    pub thread_rows: u32,
    /// With registers: the eight threads of a row (adjacent lanes of one subgroup) meet its max and sum
    /// by subgroup shuffles; else through workgroup memory, two barriers more a tile.
    #[serde(default)]
    pub row_shuffles: bool,
}

fn one_stage() -> u32 {
    1
}

impl AttentionTile {
    /// Query rows per workgroup.
    pub fn rows(&self) -> u32 {
        match self.units {
            AttentionUnits::Matrix => 16 * self.warps,
            AttentionUnits::Registers => 32 / REGISTER_COLUMN_THREADS * self.thread_rows * self.warps,
            AttentionUnits::Lanes => self.threads() / self.split.max(1),
        }
    }

    /// Threads per workgroup.
    pub fn threads(&self) -> u32 {
        32 * self.warps
    }

    /// Why this lanes tile (`AttentionUnits::Lanes`) cannot run an attention of head dims `d` and `dv`
    /// on a target with subgroups of `subgroup` lanes, if it cannot: its chunks must divide its keys, the
    /// head dims split into 4-lane vectors per thread of a query, loads of 1 or 4 elements in one stage,
    /// and a query split across 2 or 4 threads only where subgroups can sum their scores. The one rule
    /// `attention::tile` chooses by, the validator checks and the renderer relies on.
    pub fn lanes_unfit(&self, d: u32, dv: u32, subgroup: Option<u32>) -> Option<String> {
        let split = self.split;
        let fits = self.units == AttentionUnits::Lanes
            && self.chunk > 0
            && self.keys % self.chunk == 0
            && matches!(self.vector, 1 | 4)
            && self.stages == 1
            && matches!(split, 1 | 2 | 4)
            && d % (4 * split) == 0
            && dv % (4 * split) == 0
            && (split == 1 || subgroup.is_some_and(|g| g % split == 0));
        (!fits).then(|| {
            format!(
                "lanes tile {self:?} over head dims {d} and {dv} (chunks dividing its keys, 4-lane vectors a \
                 thread, one stage of 1- or 4-element loads, a split of 2 or 4 within subgroups of {subgroup:?})"
            )
        })
    }

    /// Why this registers tile (`AttentionUnits::Registers`) cannot run an attention of head dims `d`
    /// and `dv`, if it cannot: 64 queries a workgroup of 4 or 8 a thread, 64 keys a tile (a thread's
    /// eight scores of a row are two 4-key vectors, 32 keys apart), one stage of 1- or 4-element loads,
    /// `d` a multiple of 4 (rows read as 4-lane vectors) and `dv` of 8 (eight threads share a row's
    /// columns), both at most 64 (a thread's output block and scores in registers). The one rule
    /// `attention::tile` chooses by, the validator checks and the renderers rely on.
    pub fn registers_unfit(&self, d: u32, dv: u32) -> Option<String> {
        let fits = self.units == AttentionUnits::Registers
            && self.keys == 64
            && matches!(self.thread_rows, 4 | 8)
            && self.warps > 0
            && self.rows() == 64
            && self.chunk > 0
            && self.keys % self.chunk == 0
            && d % self.chunk == 0
            && matches!(self.vector, 1 | 4)
            && self.stages == 1
            && d > 0
            && d % 4 == 0
            && d <= 64
            && dv > 0
            && dv % 8 == 0
            && dv <= 64;
        (!fits).then(|| {
            format!(
                "registers tile {self:?} over head dims {d} and {dv} (64 queries, 4 or 8 a thread, 64 keys \
                 a tile, unrolled steps dividing them and the head dim, one stage of 1- or 4-element loads, \
                 head dims multiples of 4 and 8 up to 64)"
            )
        })
    }

    /// With registers: a thread's output columns of a row of `dv`: 4-column vectors 32 apart where `dv`
    /// is a multiple of 32 (the eight threads' reads of one row of values are then consecutive), else
    /// `dv / 8` consecutive columns in the widest vectors dividing them.
    pub fn register_columns(dv: u32) -> RegisterColumns {
        let n = REGISTER_COLUMN_THREADS;
        if dv % (4 * n) == 0 {
            return RegisterColumns { stride: 4, offsets: (0..dv / (4 * n)).map(|h| 4 * n * h).collect(), width: 4 };
        }
        let per = dv / n;
        let width = [4, 2, 1].into_iter().find(|w| per % w == 0).unwrap_or(1);
        RegisterColumns { stride: per, offsets: (0..per / width).map(|i| i * width).collect(), width }
    }

    /// With registers: a thread's eight keys of a tile, after its first (`4 cg`): two 4-key vectors half
    /// a tile apart, so the eight threads of a row read 128 consecutive bytes of a key row.
    pub fn register_keys(&self) -> [u32; 8] {
        std::array::from_fn(|c| (c as u32 % 4) + self.keys / 2 * (c as u32 / 4))
    }

    /// Elements a shared-memory row of head dim `d` takes: 8 more than `d`, so the eight rows one
    /// matrix load reads start in different banks.
    pub fn smem_row(d: u32) -> u32 {
        d + 8
    }

    /// Shared memory the forward template uses for head dims `d` and `dv`: on matrix units the query
    /// block and `stages` key and value tiles of 2-byte elements; on lanes and registers as each arm
    /// says (f32).
    pub fn shared_bytes(&self, d: u32, dv: u32) -> u32 {
        match self.units {
            // f32 key and value tiles, unpadded: every thread reads the same address at once.
            AttentionUnits::Lanes => return 4 * self.keys * (d + dv),
            // f32: the query block transposed, the key tile transposed (the probabilities, keys ×
            // queries, take its place once the scores are computed) and the value tile.
            AttentionUnits::Registers => {
                return 4 * (self.rows() * d + self.keys * d.max(self.rows()) + self.keys * dv);
            }
            AttentionUnits::Matrix => {}
        }
        2 * (self.rows() * Self::smem_row(d) + self.stages * self.keys * (Self::smem_row(d) + Self::smem_row(dv)))
    }

    /// Shared memory the backward templates use: both blocks of the rows a workgroup owns and both
    /// streamed tiles, and the tile's f32 log-sum-exps and deltas.
    pub fn grad_shared_bytes(&self, d: u32, dv: u32) -> u32 {
        2 * (self.rows() + self.keys) * (Self::smem_row(d) + Self::smem_row(dv)) + 8 * self.keys
    }
}

/// `out[batch.., i, :] = sum_j p_ij v[batch.., j, :]` with `p_i = softmax_j(q_i · k_j * scale)` over keys
/// `j < kv_len` (and `j <= i` when `causal`), in f32, rounded once to `dtype`. Flash-attention style: each
/// workgroup owns `tile.rows()` queries of one batch entry and streams `tile.keys` keys at a time
/// through shared memory, keeping a running max and sum per query (the online softmax), so no
/// `q_len × kv_len` matrix exists anywhere. Launched as `batch × ceil(q_len / rows)` workgroups of
/// `32 × tile.warps` threads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attention {
    /// Batch dimensions, outermost first.
    pub batch: Vec<AttentionBatch>,
    /// Queries per batch entry.
    pub q_len: Expr,
    /// Keys (and values) per batch entry.
    pub kv_len: Expr,
    /// Elements of a query or key row.
    pub head_dim: u32,
    /// Elements of a value or output row.
    pub value_dim: u32,
    /// Queries, `q_len × head_dim`.
    pub q: RowsOperand,
    /// Keys, `kv_len × head_dim`.
    pub k: RowsOperand,
    /// Values, `kv_len × value_dim`.
    pub v: RowsOperand,
    /// Output: `q_len × value_dim` (forward), `q_len × 1` in f32 (log-sum-exps), or shaped like the
    /// operand a gradient is of.
    pub out: RowsOperand,
    /// The output's gradient, `q_len × value_dim` (gradient passes).
    #[serde(default)]
    pub dout: Option<RowsOperand>,
    /// Each query's log-sum-exp, `q_len × 1` in f32 (gradient passes).
    #[serde(default)]
    pub lse: Option<RowsOperand>,
    /// Each query's `sum(dout * out)`, `q_len × 1` in f32 (gradient passes).
    #[serde(default)]
    pub delta: Option<RowsOperand>,
    /// A second output the same pass writes, where `graph` gave one kernel two attention nodes of the same
    /// operands (`attention::partner`): each query's log-sum-exp (`q_len × 1`, f32) beside the forward's
    /// output, which the online softmax has at its end; or the values' gradient (`kv_len × value_dim`)
    /// beside the keys', which shares its probabilities.
    #[serde(default)]
    pub second: Option<RowsOperand>,
    /// What the kernel computes.
    #[serde(default)]
    pub pass: AttentionPass,
    /// Multiplies the scores.
    #[serde(with = "crate::numbers")]
    pub scale: f64,
    /// Keys after the query are masked out.
    pub causal: bool,
    /// Dtype of every operand (f16 or bf16 on matrix units, f32 on lanes).
    pub dtype: DType,
    /// Work division.
    pub tile: AttentionTile,
    /// Workgroups take blocks in order of their work, every entry's first block before any entry's
    /// second (workgroup `g` owns block `g / entries` of entry `g % entries`); this says the order counts
    /// from the last block: a causal pass that owns queries (the forward, the queries' gradient) has the
    /// most keys in its last blocks, and the device starts workgroups roughly in order, so the longest
    /// run first and the shortest fill the last wave.
    #[serde(default)]
    pub last_blocks_first: bool,
}

/// The symbol persistent-row loads are keyed by: "the element of the row" that every pass shares.
pub const ROW_ELEMENT: SymId = SymId(u32::MAX - 1);

/// A slot group's vector load: buffer, the compute dtype it is read as, index as the pass writes it.
pub type GroupLoad = (usize, DType, Expr);

/// A slot group's vector store: buffer, index as the pass writes it.
pub type GroupStore = (usize, Expr);

/// The passes of a row (the body of its `Group` loop): each grouped reduction and `Threads` loop, with
/// its loop variable and statements.
pub fn row_passes(row: &[Stmt]) -> impl Iterator<Item = (SymId, &[Stmt])> {
    row.iter().filter_map(|st| match st {
        Stmt::Reduce { sym, body, strategy: ReduceStrategy::Group { .. }, .. } => Some((*sym, body.as_slice())),
        Stmt::Loop { sym, body, mode: LoopMode::Threads, .. } => Some((*sym, body.as_slice())),
        _ => None,
    })
}

/// Whether an access to `buffer` at `index` inside a row pass over `pass` moves `lanes` slots as one
/// vector: 2- or 4-byte elements, a buffer of whole vectors, and an index that steps one element per
/// element of the row from a multiple of the lanes (so the vector is aligned, buffers being aligned to
/// 16 bytes). Others move per slot.
pub fn row_vector_access(buffer: &BufferParam, lanes: u32, index: &Expr, pass: SymId) -> bool {
    let lanes = lanes as i64;
    lanes > 1
        && matches!(buffer.dtype.size_bytes(), 2 | 4)
        && buffer.len.is_divisible_by(lanes)
        && index.shift_by(pass, 1) == Some(1)
        && index
            .checked_substitute(&BTreeMap::from([(pass, Expr::from(0i64))]))
            .is_ok_and(|start| start.is_divisible_by(lanes))
}

/// A load a persistent row (`Kernel::row_cache`) performs once per element, before the row's passes:
/// every pass that reads `buffer` at `index` (its loop variable written as [`ROW_ELEMENT`]) with
/// `dtype` reads the kept register instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowLoad {
    /// Kernel buffer number.
    pub buffer: usize,
    /// The compute dtype the load is converted to.
    pub dtype: DType,
    /// Element index, in terms of [`ROW_ELEMENT`].
    pub index: Expr,
}

impl RowLoad {
    /// `index`, read inside a pass over `pass`, as a key of the row's kept loads.
    pub fn key(index: &Expr, pass: SymId) -> Expr {
        index.substitute(&std::collections::BTreeMap::from([(pass, Expr::sym(ROW_ELEMENT))]))
    }

    /// The loads of a row (the body of its `Group` loop) that a persistent row keeps: those indexed by a
    /// pass's loop variable, unguarded, not by an index bound inside the pass (a gather's index does
    /// not exist before the pass runs), and read by two passes or more — a load only one pass reads
    /// (a layer norm's weight and bias) costs the same from memory and would only hold registers, so
    /// fewer threads could share a multiprocessor. Both renderers keep exactly these.
    pub fn of_row(row: &[Stmt]) -> Vec<RowLoad> {
        let mut out: Vec<(RowLoad, usize)> = Vec::new();
        for (pass, inner) in row_passes(row) {
            let bound: std::collections::BTreeSet<SymId> = inner
                .iter()
                .filter_map(|b| if let Stmt::BindIndex { sym, .. } = b { Some(*sym) } else { None })
                .collect();
            let mut this_pass: Vec<RowLoad> = Vec::new();
            for b in inner {
                if let Stmt::Let { dtype, value: Scalar::Load { buffer, index, guard: None }, .. } = b {
                    let syms = index.symbols();
                    if syms.contains(&pass) && syms.is_disjoint(&bound) {
                        let load = RowLoad { buffer: *buffer, dtype: *dtype, index: RowLoad::key(index, pass) };
                        if !this_pass.contains(&load) {
                            this_pass.push(load);
                        }
                    }
                }
            }
            for load in this_pass {
                match out.iter_mut().find(|(l, _)| *l == load) {
                    Some((_, passes)) => *passes += 1,
                    None => out.push((load, 1)),
                }
            }
        }
        out.into_iter().filter(|(_, passes)| *passes > 1).map(|(l, _)| l).collect()
    }

    /// The trip count of a row's passes (they all run over the row's elements), if the row has a pass.
    pub fn row_len(row: &[Stmt]) -> Option<&Expr> {
        row.iter().find_map(|st| match st {
            Stmt::Reduce { extent, strategy: ReduceStrategy::Group { .. }, .. } => Some(extent),
            Stmt::Loop { extent, mode: LoopMode::Threads, .. } => Some(extent),
            _ => None,
        })
    }
}

/// How a kernel is launched.
///
/// `groups` and `threads` are the kernel IR's own: a `Group` loop's iterations and the threads that share
/// one. A device may run several such groups side by side in one of its workgroups (`packed`), each on
/// its own subgroup: a row of 64 elements keeps one warp busy, and a workgroup of one warp per row
/// leaves most of an SM's workgroup slots empty.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Launch {
    /// Workgroups of the kernel IR (the runtime folds the device's count into a 2-D or 3-D grid past the
    /// per-dimension limit).
    pub groups: Expr,
    /// Threads per workgroup of the kernel IR.
    pub threads: u32,
    /// Groups one device workgroup runs, each on its own `threads` consecutive lanes. Above 1 only when
    /// `threads` is the target's subgroup size and every combine of the kernel is a subgroup one: groups
    /// packed together may run different numbers of rows, so nothing may wait at a workgroup barrier.
    #[serde(default = "one_group")]
    pub packed: u32,
}

fn one_lane() -> u32 {
    1
}

fn one_group() -> u32 {
    1
}

impl Launch {
    /// A launch of `groups` workgroups of `threads` threads, one to a device workgroup.
    pub fn new(groups: Expr, threads: u32) -> Launch {
        Launch { groups, threads, packed: 1 }
    }

    /// Threads of one device workgroup.
    pub fn device_threads(&self) -> u32 {
        self.threads * self.packed.max(1)
    }

    /// Device workgroups for `groups` workgroups of the kernel IR.
    pub fn device_groups(&self, groups: u64) -> u64 {
        groups.div_ceil(self.packed.max(1) as u64)
    }
}

/// Special symbols every kernel may read; their ids sit above any shape symbol.
pub mod builtin {
    /// The first id kernels use for their own loop and index symbols.
    pub const FIRST_LOCAL: u32 = 1 << 20;

    /// The variable of a vectorised `Global` loop ([`super::Kernel::vector_width`] > 1): which vector
    /// a thread moves. Lane `l` of vector `v` is element `width * v + l` of the IR's own loop.
    pub const VECTOR_INDEX: crate::sym::SymId = crate::sym::SymId(u32::MAX - 2);
}

/// One kernel: what a region became.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    /// Says what it fuses, e.g. `k2_fused_layernorm_gelu`.
    pub name: String,
    /// Bound buffers.
    pub buffers: Vec<BufferParam>,
    /// Shape symbols the body reads, whose values are passed at launch (not those that only size a buffer).
    pub symbols: Vec<SymId>,
    /// The range the entry's guards hold each of [`Kernel::symbols`] to, in the same order (`hi` unbounded
    /// when `None`). Part of the kernel's structure: a bounded symbol lets [`Kernel::index_ranges`] prove
    /// index arithmetic over it fits 32 bits, so an entry guarded that way gets other code.
    #[serde(default)]
    pub symbol_ranges: Vec<(i64, Option<i64>)>,
    /// Launch shape.
    pub launch: Launch,
    /// Elements of the `Global` loop one thread may handle at once: the trip count is a multiple of this,
    /// so `vector_width` consecutive iterations touch aligned, consecutive elements of the buffers
    /// [`Kernel::vector_buffers`] names, which move as vectors; other accesses happen once per lane. 1
    /// means scalar.
    pub vector_width: u32,
    /// Row kernels: each thread keeps up to this many elements of its row in registers, so every pass
    /// (each reduction, then the epilogue) reads global memory once in total (a persistent, one-pass row).
    /// `None`: each pass re-reads its elements.
    pub row_cache: Option<u32>,
    /// Persistent rows: consecutive elements a thread keeps per slot group, so a row's accesses move as
    /// vectors (16 bytes: four f32 or eight bf16 lanes) rather than one element a thread. Slot `u` of
    /// thread `t` is element `(⌊u/L⌋·threads + t)·L + u mod L` ([`Kernel::row_slot_offset`]); an access
    /// that steps through the row one element at a time from a multiple of L moves L slots as one vector
    /// ([`Kernel::row_vector_access`]), any other per slot. 1: slot `u` is element `u·threads + t`.
    #[serde(default = "one_lane")]
    pub row_lanes: u32,
    /// The program.
    pub body: Vec<Stmt>,
    /// Run-time checks the body's [`Stmt::Fault`]s signal; empty for most kernels (no fault word bound).
    #[serde(default)]
    pub faults: Vec<FaultSite>,
    /// A combined launch (`crate::combine`): the kernels that run as this one, in workgroup order, each
    /// over this kernel's `buffers` (see the module docs). Empty for most kernels; when not, `body` is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Kernel>,
    /// Set on a region's kernel that runs as a part of another kernel's launch: that kernel's name. Such a
    /// kernel binds nothing and launches no workgroups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launched_in: Option<String>,
}

impl Kernel {
    /// Whether every combine of the kernel is a subgroup one (sums, maxima and minima in f32 or i32,
    /// no arg reduction, no template): what packed groups (`Launch::packed`) need, since they must never
    /// meet at a workgroup barrier.
    pub fn subgroup_combines(&self) -> bool {
        fn visit(body: &[Stmt]) -> bool {
            body.iter().all(|st| match st {
                Stmt::Reduce { op, dtype, body, .. } => shuffles(*op, *dtype) && visit(body),
                Stmt::Loop { body, .. } => visit(body),
                Stmt::MatMul(_) | Stmt::Gemm(_) | Stmt::Attention(_) | Stmt::AllReduce(_) => false,
                _ => true,
            })
        }
        visit(&self.body)
    }

    /// The buffers a vectorised kernel (`vector_width > 1`) moves as vectors: every access to them in its
    /// `Global` loop is at the loop index itself. A buffer also read elsewhere (a bias at `i % n`) is read
    /// per lane. Both renderers vectorise exactly these.
    pub fn vector_buffers(&self) -> std::collections::BTreeSet<usize> {
        let mut at_index = std::collections::BTreeSet::new();
        let mut elsewhere = std::collections::BTreeSet::new();
        if self.vector_width <= 1 {
            return at_index;
        }
        for st in &self.body {
            let Stmt::Loop { sym, mode: LoopMode::Global, body, .. } = st else { continue };
            for b in body {
                if let Stmt::Let { value: Scalar::Load { buffer, index, .. }, .. } | Stmt::Store { buffer, index, .. } =
                    b
                {
                    if *index == Expr::sym(*sym) {
                        at_index.insert(*buffer);
                    } else {
                        elsewhere.insert(*buffer);
                    }
                }
            }
        }
        &at_index - &elsewhere
    }

    /// Whether unrolled slot `u` of a persistent row (elements `local + u · threads`) lies inside a row of
    /// `row_len` elements for every thread of the group: a constant row at least `(u + 1) · threads`
    /// long. Renderers test nothing there.
    pub fn slot_inside_row(&self, u: u32, row_len: &Expr) -> bool {
        let (threads, lanes) = (self.launch.threads as i64, self.row_lanes.max(1) as i64);
        row_len.as_const().is_some_and(|n| (u as i64 / lanes + 1) * threads * lanes <= n)
    }

    /// How far slot `u`'s element of a persistent row lies from slot 0's, in elements (the same for
    /// every thread; slot 0's is `local · row_lanes`).
    pub fn row_slot_offset(&self, u: u32) -> i64 {
        let (threads, lanes) = (self.launch.threads as i64, self.row_lanes.max(1) as i64);
        (u as i64 / lanes) * threads * lanes + u as i64 % lanes
    }

    /// Whether an access to `buffer` at `index` inside a row pass over `pass` moves `row_lanes` slots as
    /// one vector ([`row_vector_access`] with this kernel's lanes). Both renderers vectorise exactly these.
    pub fn row_vector_access(&self, buffer: usize, index: &Expr, pass: SymId) -> bool {
        row_vector_access(&self.buffers[buffer], self.row_lanes, index, pass)
    }

    /// The body of a row kernel's `Group` loop (one row), if the kernel is one.
    pub fn row_body(&self) -> Option<&[Stmt]> {
        match self.body.iter().find(|st| matches!(st, Stmt::Loop { .. })) {
            Some(Stmt::Loop { body, mode: LoopMode::Group, .. }) => Some(body),
            _ => None,
        }
    }

    /// The loads a persistent row keeps in registers ([`RowLoad::of_row`] of its row; none without a
    /// row cache): its passes read these from there, never from memory.
    pub fn row_kept_loads(&self) -> Vec<RowLoad> {
        match (self.row_cache, self.row_body()) {
            (Some(_), Some(row)) => RowLoad::of_row(row),
            _ => Vec::new(),
        }
    }

    /// The top-level loads (unguarded, not among the row's kept loads) and stores of a row pass over
    /// `pass` (statements `body`) that move a slot group as one vector, each once: what a renderer loads
    /// before the group's lanes run and stores after them.
    pub fn row_group_accesses(&self, pass: SymId, body: &[Stmt]) -> (Vec<GroupLoad>, Vec<GroupStore>) {
        self.group_accesses(self.row_lanes, &self.row_kept_loads(), pass, body)
    }

    /// [`Kernel::row_group_accesses`] with `lanes` a slot group and the row's `kept` loads.
    fn group_accesses(
        &self,
        lanes: u32,
        kept: &[RowLoad],
        pass: SymId,
        body: &[Stmt],
    ) -> (Vec<GroupLoad>, Vec<GroupStore>) {
        let vector = |buffer: usize, index: &Expr| row_vector_access(&self.buffers[buffer], lanes, index, pass);
        let (mut loads, mut stores) = (Vec::new(), Vec::new());
        for st in body {
            match st {
                Stmt::Let { dtype, value: Scalar::Load { buffer, index, guard: None }, .. }
                    if vector(*buffer, index) =>
                {
                    let key = RowLoad { buffer: *buffer, dtype: *dtype, index: RowLoad::key(index, pass) };
                    let load = (*buffer, *dtype, index.clone());
                    if !kept.contains(&key) && !loads.contains(&load) {
                        loads.push(load);
                    }
                }
                Stmt::Store { buffer, index, .. } if vector(*buffer, index) => {
                    let store = (*buffer, index.clone());
                    if !stores.contains(&store) {
                        stores.push(store);
                    }
                }
                _ => {}
            }
        }
        (loads, stores)
    }

    /// The buffers a row with lanes touches a vector at a time — its kept loads and its passes' group
    /// accesses (a renderer that binds buffers by element type binds these as vectors).
    pub fn row_vector_buffers(&self) -> std::collections::BTreeSet<usize> {
        self.row_vector_buffers_at(self.row_lanes)
    }

    /// [`Kernel::row_vector_buffers`] were the row's slot groups `lanes` wide: empty where no access of
    /// the row would move as a vector (what `lower` asks before it gives a row lanes).
    pub fn row_vector_buffers_at(&self, lanes: u32) -> std::collections::BTreeSet<usize> {
        let kept = self.row_kept_loads();
        let mut out: std::collections::BTreeSet<usize> = kept
            .iter()
            .filter(|l| row_vector_access(&self.buffers[l.buffer], lanes, &l.index, ROW_ELEMENT))
            .map(|l| l.buffer)
            .collect();
        for (pass, body) in self.row_body().map(row_passes).into_iter().flatten() {
            let (loads, stores) = self.group_accesses(lanes, &kept, pass, body);
            out.extend(loads.iter().map(|l| l.0).chain(stores.iter().map(|s| s.0)));
        }
        out
    }

    /// The ranges of the kernel's symbols: shape symbols as the guards hold them
    /// ([`Kernel::symbol_ranges`]), a loop's or a reduction's variable in `0..extent`, a bound index in
    /// `0..bound` (it is clamped there), where the extent or bound is bounded above by those ranges. A
    /// lane whose variable runs past its extent (a masked slot of a row) computes indices it never uses,
    /// so the ranges hold wherever a value matters. Renderers ask it (through
    /// [`crate::sym::SymTable::tree_bounds`]) whether an index division fits 32 bits.
    pub fn index_ranges(&self) -> crate::sym::SymTable {
        fn below(t: &mut crate::sym::SymTable, sym: SymId, extent: &Expr) {
            if let Some(n) = t.bounds(extent).hi.filter(|&n| n > 0) {
                t.set_range(sym, 0, Some(n - 1));
            }
        }
        fn visit(body: &[Stmt], t: &mut crate::sym::SymTable) {
            for st in body {
                match st {
                    Stmt::Loop { sym, extent, body, .. } | Stmt::Reduce { sym, extent, body, .. } => {
                        below(t, *sym, extent);
                        visit(body, t);
                    }
                    Stmt::BindIndex { sym, bound, .. } => below(t, *sym, bound),
                    // The template evaluates its operands and epilogue only at elements inside the
                    // product (their bound checks, or whole tiles: `MatMul::whole_tiles`).
                    Stmt::MatMul(m) => {
                        for (sym, extent) in m.syms.iter().zip([&m.batch, &m.m, &m.n, &m.k]) {
                            below(t, *sym, extent);
                        }
                        visit(&m.a.body, t);
                        visit(&m.b.body, t);
                        visit(&m.epilogue, t);
                    }
                    _ => {}
                }
            }
        }
        let mut t = crate::sym::SymTable::new();
        for (s, (lo, hi)) in self.symbols.iter().zip(&self.symbol_ranges) {
            t.set_range(*s, *lo, *hi);
        }
        visit(&self.body, &mut t);
        if self.vector_width > 1 {
            for st in &self.body {
                if let Stmt::Loop { extent, mode: LoopMode::Global, .. } = st {
                    if let Some(n) = t.bounds(extent).hi.filter(|&n| n > 0) {
                        t.set_range(builtin::VECTOR_INDEX, 0, Some((n - 1) / i64::from(self.vector_width)));
                    }
                }
            }
        }
        t
    }

    /// The body of the vectorised `Global` loop over `i` as lane `lane` runs it: every index expression
    /// but `i` itself (the accesses that move as vectors) rewritten with `i` as `width * VECTOR_INDEX +
    /// lane` and simplified under `ranges` (the kernel's [`Kernel::index_ranges`], which bound the vector's
    /// number). What does not depend on the lane (a row's number, a channel, a padded position's row) then
    /// reads the same in every lane and is computed once per vector instead of once per element:
    /// DenseNet's im2col writers spent most of their instructions dividing each lane's index anew. An
    /// expression the rewriting would make divide more (a symbolic extent the vector's number cannot
    /// prove a bound against) is kept over `i`, which a renderer binds to the lane's element. Both
    /// renderers print these bodies.
    pub fn lane_body(&self, i: SymId, body: &[Stmt], lane: u32, ranges: &crate::sym::SymTable) -> Vec<Stmt> {
        let width = i64::from(self.vector_width.max(1));
        let at =
            BTreeMap::from([(i, Expr::sym(builtin::VECTOR_INDEX) * Expr::from(width) + Expr::from(i64::from(lane)))]);
        let unit = Expr::sym(i);
        let rewrite = |e: &Expr| -> Expr {
            if *e == unit || !e.symbols().contains(&i) {
                return e.clone();
            }
            match e.checked_substitute(&at).map(|x| x.simplify_in(ranges)) {
                Ok(x) if x.divisions() <= e.divisions() => x,
                _ => e.clone(),
            }
        };
        body.iter()
            .map(|st| match st {
                Stmt::Let { var, dtype, value: Scalar::Load { buffer, index, guard } } => Stmt::Let {
                    var: *var,
                    dtype: *dtype,
                    value: Scalar::Load { buffer: *buffer, index: rewrite(index), guard: *guard },
                },
                Stmt::Let { var, dtype, value: Scalar::Index { expr } } => {
                    Stmt::Let { var: *var, dtype: *dtype, value: Scalar::Index { expr: rewrite(expr) } }
                }
                Stmt::Store { buffer, index, value } => {
                    Stmt::Store { buffer: *buffer, index: rewrite(index), value: *value }
                }
                other => other.clone(),
            })
            .collect()
    }

    /// The bucket of all-reduces this kernel is, when it is one (its whole body is the call).
    pub fn all_reduce(&self) -> Option<&AllReduce> {
        match self.body.as_slice() {
            [Stmt::AllReduce(a)] => Some(a),
            _ => None,
        }
    }

    /// Where each of [`Kernel::parts`] starts among the launch's workgroups: the sum of the groups of the
    /// parts before it.
    pub fn part_offsets(&self) -> Vec<Expr> {
        let mut at = Expr::from(0i64);
        let mut offsets = Vec::with_capacity(self.parts.len());
        for p in &self.parts {
            offsets.push(at.clone());
            at = at + p.launch.groups.clone();
        }
        offsets
    }

    /// The library GEMM this kernel is, when it is one (its whole body is the call).
    pub fn gemm(&self) -> Option<&Gemm> {
        match self.body.as_slice() {
            [Stmt::Gemm(g)] => Some(g),
            _ => None,
        }
    }

    /// The symbols the body binds from computed values (`BindIndex`: a gather's index). An index
    /// expression over one of them can change between unrolled copies of a loop body even where its
    /// loop variable moves it by a constant.
    pub fn bound_indices(&self) -> std::collections::BTreeSet<SymId> {
        fn visit(b: &[Stmt], out: &mut std::collections::BTreeSet<SymId>) {
            for s in b {
                match s {
                    Stmt::BindIndex { sym, .. } => {
                        out.insert(*sym);
                    }
                    Stmt::Loop { body, .. } | Stmt::Reduce { body, .. } => visit(body, out),
                    Stmt::MatMul(m) => {
                        visit(&m.a.body, out);
                        visit(&m.b.body, out);
                        visit(&m.epilogue, out);
                    }
                    _ => {}
                }
            }
        }
        let mut out = std::collections::BTreeSet::new();
        visit(&self.body, &mut out);
        out
    }

    /// Number of statements, recursively (a size measure for logs and tests).
    pub fn stmt_count(&self) -> usize {
        fn count(b: &[Stmt]) -> usize {
            b.iter()
                .map(|s| {
                    1 + match s {
                        Stmt::Loop { body, .. } | Stmt::Reduce { body, .. } => count(body),
                        Stmt::MatMul(m) => count(&m.a.body) + count(&m.b.body) + count(&m.epilogue),
                        Stmt::Gemm(_) | Stmt::Attention(_) | Stmt::AllReduce(_) => 0,
                        _ => 0,
                    }
                })
                .sum()
        }
        count(&self.body) + self.parts.iter().map(Kernel::stmt_count).sum::<usize>()
    }
}

fn sym_name(s: SymId) -> String {
    if s.0 >= builtin::FIRST_LOCAL {
        format!("i{}", s.0 - builtin::FIRST_LOCAL)
    } else {
        s.to_string()
    }
}

/// Prints an index expression with kernel-local symbols as `i0, i1, ...`.
pub fn show_expr(e: &Expr) -> String {
    let mut text = e.to_string();
    let mut syms: Vec<SymId> = e.symbols().into_iter().filter(|s| s.0 >= builtin::FIRST_LOCAL).collect();
    // Longest ids first, so `s1048577` is not clobbered by `s104857`.
    syms.sort_by_key(|s| std::cmp::Reverse(s.to_string().len()));
    for s in syms {
        text = text.replace(&s.to_string(), &sym_name(s));
    }
    text
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Const { value } => write!(f, "{value}"),
            Scalar::Load { buffer, index, guard: None } => write!(f, "load b{buffer}[{}]", show_expr(index)),
            Scalar::Load { buffer, index, guard: Some(g) } => {
                write!(f, "load b{buffer}[{}] if {g}", show_expr(index))
            }
            Scalar::Index { expr } => write!(f, "index({})", show_expr(expr)),
            Scalar::Unary { op, a } => write!(f, "{}({a})", op.name()),
            Scalar::Binary { op, a, b } => write!(f, "{}({a}, {b})", op.name()),
            Scalar::Select { cond, a, b } => write!(f, "select({cond}, {a}, {b})"),
            Scalar::Cast { a } => write!(f, "cast({a})"),
            Scalar::Quotient { a, b, reciprocal } => write!(f, "div({a}, {b}; 1/b = {reciprocal})"),
            Scalar::Bits { op, a, b } => write!(f, "{}({a}, {b})", op.name()),
        }
    }
}

fn write_block(f: &mut fmt::Formatter<'_>, body: &[Stmt], depth: usize) -> fmt::Result {
    let pad = "  ".repeat(depth);
    for s in body {
        match s {
            Stmt::Let { var, dtype, value } => writeln!(f, "{pad}{var}: {dtype} = {value}")?,
            Stmt::BindIndex { sym, var, bound } => {
                writeln!(f, "{pad}{} = clamp({var}, 0, {})", sym_name(*sym), show_expr(bound))?
            }
            Stmt::Store { buffer, index, value } => writeln!(f, "{pad}b{buffer}[{}] = {value}", show_expr(index))?,
            Stmt::Fault { cond, site } => writeln!(f, "{pad}fault {site} if {cond}")?,
            Stmt::Loop { sym, extent, mode, body } => {
                writeln!(f, "{pad}for {} in 0..{} ({mode:?}) {{", sym_name(*sym), show_expr(extent))?;
                write_block(f, body, depth + 1)?;
                writeln!(f, "{pad}}}")?;
            }
            Stmt::Reduce { out, dtype, op, sym, extent, strategy, body, value } => {
                writeln!(
                    f,
                    "{pad}{out}: {dtype} = reduce {op:?} over {} in 0..{} ({strategy:?}) {{",
                    sym_name(*sym),
                    show_expr(extent)
                )?;
                write_block(f, body, depth + 1)?;
                writeln!(f, "{pad}  yield {value}")?;
                writeln!(f, "{pad}}}")?;
            }
            Stmt::MatMul(m) => {
                let [b, i, j, p] = m.syms.map(sym_name);
                writeln!(
                    f,
                    "{pad}matmul [{b} < {}, {i} < {}, {j} < {}] over {p} < {} (tile {}x{}x{}, threads {}x{}, runs of {}{}, read {}/{}, acc {}) {{",
                    show_expr(&m.batch),
                    show_expr(&m.m),
                    show_expr(&m.n),
                    show_expr(&m.k),
                    m.tile.m,
                    m.tile.n,
                    m.tile.k,
                    m.tile.threads[0],
                    m.tile.threads[1],
                    m.tile.run,
                    if m.tile.stages > 1 { format!(", {} stages", m.tile.stages) } else { String::new() },
                    if m.tile.depth_fastest[0] { p.as_str() } else { i.as_str() },
                    if m.tile.depth_fastest[1] { p.as_str() } else { j.as_str() },
                    m.acc_dtype
                )?;
                writeln!(f, "{pad}  a({b}, {i}, {p}):")?;
                write_block(f, &m.a.body, depth + 2)?;
                writeln!(f, "{pad}    yield {}", m.a.value)?;
                writeln!(f, "{pad}  b({b}, {p}, {j}):")?;
                write_block(f, &m.b.body, depth + 2)?;
                writeln!(f, "{pad}    yield {}", m.b.value)?;
                writeln!(f, "{pad}  epilogue ({} = acc):", m.acc)?;
                write_block(f, &m.epilogue, depth + 2)?;
                writeln!(f, "{pad}}}")?;
            }
            Stmt::Attention(a) => {
                let rows =
                    |o: &RowsOperand| format!("b{}[{} + r * {}]", o.buffer, show_expr(&o.offset), show_expr(&o.ld));
                let batch: Vec<String> = a
                    .batch
                    .iter()
                    .map(|b| {
                        let [e, q, k, v, o] = [&b.extent, &b.q, &b.k, &b.v, &b.out].map(show_expr);
                        format!("{e} (strides {q}, {k}, {v}, {o})")
                    })
                    .collect();
                let second = match (&a.second, a.pass.second()) {
                    (Some(o), Some(AttentionPass::Lse)) => format!(", log-sum-exps {}", rows(o)),
                    (Some(o), Some(pass)) => format!(", {pass:?} {}", rows(o)),
                    (Some(o), None) => format!(", second output {} (no pass writes one)", rows(o)),
                    (None, _) => String::new(),
                };
                let head = match a.pass {
                    AttentionPass::Forward => String::new(),
                    AttentionPass::Lse => "log-sum-exp of ".to_string(),
                    AttentionPass::Grad(part) => {
                        let extra = [&a.dout, &a.lse, &a.delta].map(|o| o.as_ref().map_or("?".into(), rows));
                        format!("{part:?} gradient (dout {}, lse {}, delta {}) of ", extra[0], extra[1], extra[2])
                    }
                };
                writeln!(
                    f,
                    "{pad}attention {}{second} = {head}softmax({} · {}ᵀ * {}{}) @ {} ({}: tq {}, tk {}, d {}, dv {}; batch [{}]; \
                     {} warps{}, {} rows a step, loads of {})",
                    rows(&a.out),
                    rows(&a.q),
                    rows(&a.k),
                    a.scale,
                    if a.causal { ", causal" } else { "" },
                    rows(&a.v),
                    a.dtype,
                    show_expr(&a.q_len),
                    show_expr(&a.kv_len),
                    a.head_dim,
                    a.value_dim,
                    batch.join(", "),
                    a.tile.warps,
                    match a.tile.units {
                        AttentionUnits::Matrix => String::new(),
                        AttentionUnits::Registers => {
                            format!(" on registers, {} queries × 8 keys a thread", a.tile.thread_rows)
                        }
                        AttentionUnits::Lanes => {
                            format!(" on lanes, a query each {} threads, {} keys a chunk", a.tile.split, a.tile.chunk)
                        }
                    },
                    a.tile.keys,
                    a.tile.vector
                )?;
            }
            Stmt::AllReduce(a) => {
                let parts: Vec<String> = a
                    .parts
                    .iter()
                    .map(|p| format!("b{} = b{} ({} {})", p.output, p.input, show_expr(&p.len), p.dtype.name()))
                    .collect();
                writeln!(f, "{pad}all-reduce {:?} across the world: {}", a.op, parts.join(", "))?;
            }
            Stmt::Gemm(g) => {
                let operand = |o: &GemmOperand| {
                    format!("b{}[{} + {:?} ld {}]", o.buffer, show_expr(&o.offset), o.layout, show_expr(&o.ld))
                };
                let batch: Vec<String> = g
                    .batch
                    .iter()
                    .map(|b| {
                        let [e, sa, sb, so] = [&b.extent, &b.a, &b.b, &b.out].map(show_expr);
                        format!("{e} (strides {sa}, {sb}, {so})")
                    })
                    .collect();
                writeln!(
                    f,
                    "{pad}gemm library b{} = {} @ {}{}{} ({}: m {}, n {}, k {}; batch [{}])",
                    g.out,
                    operand(&g.a),
                    operand(&g.b),
                    g.epilogue.residual.as_ref().map_or(String::new(), |r| format!(
                        " + b{}[{} + RowMajor ld {}]",
                        r.buffer,
                        show_expr(&r.offset),
                        show_expr(&g.n)
                    )),
                    g.epilogue.bias.as_ref().map_or(String::new(), |b| format!(
                        " + bias b{}[{} + j]",
                        b.buffer,
                        show_expr(&b.offset)
                    )),
                    match (g.tf32, g.widened) {
                        (true, _) => "f32 as tf32".to_string(),
                        (false, true) => format!("{} written as f32", g.dtype.name()),
                        (false, false) => g.dtype.name().to_string(),
                    },
                    show_expr(&g.m),
                    show_expr(&g.n),
                    show_expr(&g.k),
                    batch.join(", ")
                )?;
            }
        }
    }
    Ok(())
}

impl Kernel {
    /// Writes the kernel indented by `depth`; its buffer list only when `buffers` (a combined kernel's
    /// parts bind the list it prints once).
    fn write(&self, f: &mut fmt::Formatter<'_>, depth: usize, buffers: bool) -> fmt::Result {
        let (head, pad) = ("  ".repeat(depth), "  ".repeat(depth + 1));
        writeln!(
            f,
            "{head}kernel {} — {} workgroup(s) of {} thread(s)",
            self.name,
            show_expr(&self.launch.groups),
            self.launch.threads
        )?;
        if self.launch.packed > 1 {
            writeln!(f, "{pad}packed: {} workgroups to a device workgroup, one a subgroup", self.launch.packed)?;
        }
        for (i, b) in self.buffers.iter().enumerate().filter(|_| buffers) {
            writeln!(f, "{pad}b{i}: {:?} {}[{}] (value {})", b.access, b.dtype, show_expr(&b.len), b.node)?;
        }
        if !self.symbols.is_empty() {
            let s: Vec<String> = self.symbols.iter().map(|s| s.to_string()).collect();
            writeln!(f, "{pad}symbols: {}", s.join(", "))?;
        }
        if self.vector_width > 1 {
            writeln!(f, "{pad}vector width: {}", self.vector_width)?;
        }
        if let Some(n) = self.row_cache {
            writeln!(f, "{pad}persistent rows: up to {n} element(s) per thread kept in registers")?;
        }
        if self.row_lanes > 1 {
            writeln!(f, "{pad}row lanes: {} consecutive elements a slot group, moved as vectors", self.row_lanes)?;
        }
        if let Some(k) = &self.launched_in {
            writeln!(f, "{pad}runs inside {k}'s launch")?;
        }
        for (p, at) in self.parts.iter().zip(self.part_offsets()) {
            writeln!(f, "{pad}part from workgroup {}:", show_expr(&at))?;
            p.write(f, depth + 1, false)?;
        }
        write_block(f, &self.body, depth + 1)
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write(f, 0, true)
    }
}
