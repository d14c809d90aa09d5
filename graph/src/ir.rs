//! The tensor IR: a graph is an arena of nodes addressed by small ids, in topological order by
//! construction (a node only reads nodes recorded before it). One flat `Op` enum, grouped by family.
//!
//! Invariants the rest of kiln relies on:
//! - pointwise ops read inputs of exactly the node's shape: broadcasting is made explicit with
//!   `Reshape`/`Expand` nodes when tracing, so fusion folds it into index expressions later;
//! - `MatMul` reads `[..., m, k]` and `[..., k, n]` with equal batch dims (also expanded explicitly);
//! - every node carries the user's source location.

use crate::conv::Window;
use crate::dtype::DType;
use crate::loc::SourceLoc;
use crate::shape::Shape;
use crate::sym::{Expr, SymTable};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The address of a node in its graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u32);

impl NodeId {
    /// The arena index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// Pointwise ops of one input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnaryOp {
    /// `-x`
    Neg,
    /// `|x|`
    Abs,
    /// `e^x`
    Exp,
    /// natural log
    Log,
    /// square root
    Sqrt,
    /// `1/sqrt(x)`
    Rsqrt,
    /// sine
    Sin,
    /// cosine
    Cos,
    /// hyperbolic tangent
    Tanh,
    /// `1/(1+e^-x)`
    Sigmoid,
    /// the error function
    Erf,
    /// `max(x, 0)`
    Relu,
    /// `1/x`
    Reciprocal,
    /// round toward -inf
    Floor,
    /// round toward +inf
    Ceil,
    /// round half to even
    Round,
    /// logical not (bool)
    Not,
    /// true where NaN
    IsNan,
}

impl UnaryOp {
    /// Every unary op.
    pub const ALL: [UnaryOp; 18] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Erf,
        UnaryOp::Relu,
        UnaryOp::Reciprocal,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::Not,
        UnaryOp::IsNan,
    ];

    /// Snake-case name, as in exports and kernel names.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Erf => "erf",
            UnaryOp::Relu => "relu",
            UnaryOp::Reciprocal => "reciprocal",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Round => "round",
            UnaryOp::Not => "not",
            UnaryOp::IsNan => "isnan",
        }
    }

    /// Which input dtypes the op accepts, as a rule.
    pub fn accepts(self) -> DTypeRule {
        match self {
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu => DTypeRule::Numeric,
            UnaryOp::Not => DTypeRule::Bool,
            UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::IsNan => DTypeRule::Float,
            _ => DTypeRule::Float,
        }
    }
}

/// Pointwise ops of two inputs (both of one dtype; comparisons yield bool).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b` (floats); floor division for integers
    Div,
    /// `a ^ b`
    Pow,
    /// elementwise maximum, NaN-propagating
    Max,
    /// elementwise minimum, NaN-propagating
    Min,
    /// `a == b`
    Eq,
    /// `a != b`
    Ne,
    /// `a < b`
    Lt,
    /// `a <= b`
    Le,
    /// `a > b`
    Gt,
    /// `a >= b`
    Ge,
    /// logical and (bool)
    And,
    /// logical or (bool)
    Or,
    /// bitwise and of integers (two's complement)
    BitAnd,
    /// bitwise or of integers (two's complement)
    BitOr,
    /// bitwise exclusive or of integers (two's complement)
    BitXor,
    /// `a << b` of integers; a shift amount read as unsigned, past the width clamped to it (all bits out)
    Shl,
    /// `a >> b` of integers, arithmetic for the signed, logical for the unsigned; the shift amount as
    /// `Shl`'s (past the width: 0, or −1 for a negative signed `a`)
    Shr,
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: [BinaryOp; 20] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Eq,
        BinaryOp::Ne,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
        BinaryOp::And,
        BinaryOp::Or,
        BinaryOp::BitAnd,
        BinaryOp::BitOr,
        BinaryOp::BitXor,
        BinaryOp::Shl,
        BinaryOp::Shr,
    ];

    /// Snake-case name.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Max => "maximum",
            BinaryOp::Min => "minimum",
            BinaryOp::Eq => "eq",
            BinaryOp::Ne => "ne",
            BinaryOp::Lt => "lt",
            BinaryOp::Le => "le",
            BinaryOp::Gt => "gt",
            BinaryOp::Ge => "ge",
            BinaryOp::And => "logical_and",
            BinaryOp::Or => "logical_or",
            BinaryOp::BitAnd => "bitwise_and",
            BinaryOp::BitOr => "bitwise_or",
            BinaryOp::BitXor => "bitwise_xor",
            BinaryOp::Shl => "bitwise_left_shift",
            BinaryOp::Shr => "bitwise_right_shift",
        }
    }

    /// True for the comparisons, whose result is bool.
    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge)
    }

    /// Which input dtypes the op accepts.
    pub fn accepts(self) -> DTypeRule {
        match self {
            BinaryOp::And | BinaryOp::Or => DTypeRule::Bool,
            BinaryOp::BitAnd | BinaryOp::BitOr | BinaryOp::BitXor | BinaryOp::Shl | BinaryOp::Shr => DTypeRule::Integer,
            BinaryOp::Eq | BinaryOp::Ne => DTypeRule::Any,
            _ => DTypeRule::Numeric,
        }
    }
}

/// Which dtypes an op accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DTypeRule {
    /// f32, f16, bf16.
    Float,
    /// floats and integers.
    Numeric,
    /// bool only.
    Bool,
    /// integers only.
    Integer,
    /// floats, i32 and i64: what products and collectives compute in (narrow integers are cast first).
    Wide,
    /// every dtype.
    Any,
}

impl DTypeRule {
    /// Whether `d` satisfies the rule.
    pub fn allows(self, d: DType) -> bool {
        match self {
            DTypeRule::Float => d.is_float(),
            DTypeRule::Numeric => d.is_float() || d.is_int(),
            DTypeRule::Bool => d == DType::Bool,
            DTypeRule::Integer => d.is_int(),
            DTypeRule::Wide => d.is_float() || matches!(d, DType::I32 | DType::I64),
            DTypeRule::Any => true,
        }
    }

    /// The rule in words, for errors and docs.
    pub fn describe(self) -> &'static str {
        match self {
            DTypeRule::Float => "a float dtype (f32, f64, f16, bf16)",
            DTypeRule::Numeric => "a numeric dtype (float or integer)",
            DTypeRule::Bool => "bool",
            DTypeRule::Integer => "an integer dtype (i32, i64, u32, u64, u8, i8, u16, i16, i4, u4, i2, u2)",
            DTypeRule::Wide => "f32, f64, f16, bf16, i32 or i64 (cast narrow integers to i32 first)",
            DTypeRule::Any => "any dtype",
        }
    }
}

/// Reductions of values over axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReduceOp {
    /// sum (integers and bool sum to i64, as in PyTorch)
    Sum,
    /// maximum, NaN-propagating
    Max,
    /// minimum, NaN-propagating
    Min,
}

impl ReduceOp {
    /// Every value reduction.
    pub const ALL: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min];

    /// Snake-case name.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

/// Reductions to an index along one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArgReduceOp {
    /// index of the first maximum (NaN counts as the maximum)
    ArgMax,
    /// index of the first minimum (NaN counts as the minimum)
    ArgMin,
}

/// Which formula a GELU uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GeluApprox {
    /// `x/2 * (1 + erf(x/sqrt 2))`
    Erf,
    /// `x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))`
    Tanh,
}

/// Which operand of an attention an [`Op::AttentionGrad`] differentiates by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionPart {
    /// `q`.
    Queries,
    /// `k`.
    Keys,
    /// `v`.
    Values,
}

/// The op family, for docs, explain and (next) fusion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpFamily {
    /// inputs and constants
    Source,
    /// elementwise
    Pointwise,
    /// reductions over axes
    Reduce,
    /// views and data movement
    Layout,
    /// matrix products
    Matmul,
    /// composites kept whole until decomposition
    Composite,
    /// collectives across the processes of a data-parallel world
    Collective,
}

/// One node's operation. Output dtype and shape live on the node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Op {
    /// Graph input number `index` (see `Graph::inputs` for where it comes from).
    Input {
        /// Position in `Graph::inputs`.
        index: usize,
    },
    /// Every element equal to `value` (rounded to the node's dtype).
    Full {
        /// The value.
        #[serde(with = "crate::numbers")]
        value: f64,
    },
    /// Each element's index along `axis` (arange is `iota * step + start`).
    Iota {
        /// The counting axis.
        axis: usize,
    },
    /// Uniform random numbers in [0, 1), f32, each element's drawn from its flat index by the
    /// counter-based Philox4x32-10 generator under the key its input holds (an i32 tensor of two
    /// elements): the same key gives the same numbers on every backend, and a new key (a new step)
    /// needs no recompile. See [`crate::rng`].
    Rand {
        /// The counter's third word: draws of one key in different streams are unrelated, so one step's
        /// key serves every dropout site of a model (each its own stream).
        #[serde(default)]
        stream: u32,
    },
    /// A one-input pointwise op.
    Unary {
        /// Which.
        op: UnaryOp,
    },
    /// A two-input pointwise op.
    Binary {
        /// Which.
        op: BinaryOp,
    },
    /// `cond ? a : b`, inputs `[cond, a, b]`.
    Where,
    /// Conversion to the node's dtype (floats to integers truncate toward zero).
    Cast,
    /// Reduction over `axes`.
    Reduce {
        /// Which.
        op: ReduceOp,
        /// Sorted, distinct axes of the input.
        axes: Vec<usize>,
        /// Keep reduced axes as size 1.
        keepdim: bool,
    },
    /// Index of the extreme value along one axis (i64 result).
    ArgReduce {
        /// Which.
        op: ArgReduceOp,
        /// The axis.
        axis: usize,
        /// Keep the axis as size 1.
        keepdim: bool,
    },
    /// Same elements in row-major order, the node's shape.
    Reshape,
    /// Output axis `i` is input axis `perm[i]`.
    Permute {
        /// The permutation.
        perm: Vec<usize>,
    },
    /// Size-1 dims stretched to the node's shape (same rank).
    Expand,
    /// Elements `start, start+step, ...` below `end` along `axis`.
    Slice {
        /// The axis.
        axis: usize,
        /// First index (already clamped into range).
        start: Expr,
        /// One past the last index (already clamped).
        end: Expr,
        /// Positive step.
        step: usize,
    },
    /// Inputs joined along `axis`.
    Concat {
        /// The axis.
        axis: usize,
    },
    /// Constant padding: `pads[i] = (before, after)` for axis `i`.
    Pad {
        /// Per-axis padding.
        pads: Vec<(usize, usize)>,
        /// Fill value.
        #[serde(with = "crate::numbers")]
        value: f64,
    },
    /// `out[.., i, ..] = x[.., index[i], ..]` along `axis`; inputs `[x, index]`, index 1-D integer.
    IndexSelect {
        /// The axis.
        axis: usize,
    },
    /// PyTorch's `gather`: `out[i][j] = x[index[i][j]][j]` for axis 0; index has the output's shape.
    Gather {
        /// The axis.
        axis: usize,
    },
    /// The windows of a convolution or pooling as a new axis: `[N, C, *in]` becomes `[N, C, taps, *out]`,
    /// where tap `t` (row-major over `kernel`) of output position `o` reads input position
    /// `o * stride + tap * dilation - padding_before` on each spatial axis, and `value` outside the input.
    /// A view: it folds into its consumer's index expressions (one division per element for the tap,
    /// not one branch per tap).
    Unfold {
        /// Window size per spatial axis.
        kernel: Vec<usize>,
        /// Stride, padding and dilation per spatial axis (every axis written out).
        window: Window,
        /// What padding reads.
        #[serde(with = "crate::numbers")]
        value: f64,
    },
    /// Batched matrix product `[..., m, k] x [..., k, n]`.
    MatMul,
    /// Scaled dot-product attention over the last two axes, `softmax(q @ kᵀ * scale, -1) @ v` with
    /// `-inf` above the diagonal when `causal`; inputs `[q, k, v]` shaped `[.., tq, d]`, `[.., tk, d]`,
    /// `[.., tk, dv]` with equal batch dims. Decomposition writes it in place of that explicit chain
    /// where the target runs it as one kernel (see `attention`), so no `tq × tk` matrix is stored.
    Attention {
        /// Multiplies the scores before the softmax.
        #[serde(with = "crate::numbers")]
        scale: f64,
        /// Whether key `j` is masked out of query `i`'s row when `j > i`.
        causal: bool,
    },
    /// The log-sum-exp of each query's row of [`Op::Attention`]'s scaled, masked scores,
    /// `log sum_j exp(q_i · k_j * scale)` over the keys the row sees (`-inf` for a row with none); inputs
    /// `[q, k]`, output `[.., tq]` in f32. What the attention's backward pass rebuilds the probabilities
    /// from, so the training step stores one number per query instead of a `tq × tk` matrix.
    AttentionLse {
        /// Multiplies the scores.
        #[serde(with = "crate::numbers")]
        scale: f64,
        /// Whether key `j` is masked out of query `i`'s row when `j > i`.
        causal: bool,
    },
    /// The gradient of [`Op::Attention`]'s output with respect to one of its operands; inputs
    /// `[q, k, v, dout, lse, delta]` (`lse` from [`Op::AttentionLse`], `delta = sum(dout * out, -1)` in
    /// f32, both `[.., tq]`), output shaped like that operand. Flash-attention's backward: the
    /// probabilities are rebuilt from `lse`, never read from memory.
    AttentionGrad {
        /// Multiplies the scores.
        #[serde(with = "crate::numbers")]
        scale: f64,
        /// Whether key `j` is masked out of query `i`'s row when `j > i`.
        causal: bool,
        /// Which operand's gradient.
        part: AttentionPart,
    },
    /// Softmax along `axis`.
    Softmax {
        /// The axis.
        axis: usize,
    },
    /// Log-softmax along `axis`.
    LogSoftmax {
        /// The axis.
        axis: usize,
    },
    /// Layer norm over the last `dims` axes; inputs `[x]` or `[x, weight, bias]`.
    LayerNorm {
        /// How many trailing axes are normalised.
        dims: usize,
        /// Added to the variance.
        #[serde(with = "crate::numbers")]
        eps: f64,
        /// Whether weight and bias inputs follow.
        affine: bool,
    },
    /// GELU.
    Gelu {
        /// Which formula.
        approx: GeluApprox,
    },
    /// `x * sigmoid(x)`.
    Silu,
    /// `x @ w^T (+ b)`; inputs `[x, w]` or `[x, w, b]`, w is `[out, in]`.
    Linear {
        /// Whether a bias input follows.
        bias: bool,
    },
    /// Mean over `axes`.
    Mean {
        /// Sorted, distinct axes.
        axes: Vec<usize>,
        /// Keep reduced axes as size 1.
        keepdim: bool,
    },
    /// Variance over `axes` with `correction` (1 = unbiased).
    Var {
        /// Sorted, distinct axes.
        axes: Vec<usize>,
        /// Subtracted from the count in the denominator.
        correction: usize,
        /// Keep reduced axes as size 1.
        keepdim: bool,
    },
    /// `x` where column <= row in the last two axes, `-inf` above the diagonal.
    CausalMask,
    /// Convolution over the trailing spatial axes; inputs `[x, w]` or `[x, w, b]`, x `[N, C, *in]`,
    /// w `[O, C/groups, *kernel]`, b `[O]` (see `conv`).
    Conv {
        /// Stride, padding and dilation per spatial axis (every axis written out).
        window: Window,
        /// Channel groups (`C` for depthwise).
        groups: usize,
        /// Whether a bias input follows.
        bias: bool,
    },
    /// Max or average pooling over the trailing `kernel.len()` axes.
    Pool {
        /// Max or average, and the average's divisor rule.
        mode: PoolKind,
        /// Window size per spatial axis.
        kernel: Vec<usize>,
        /// Stride, padding and dilation per spatial axis (every axis written out).
        window: Window,
    },
    /// The input combined element by element across every process of the data-parallel world this
    /// process joined (NCCL on CUDA, queued on the device); a process that joined none is a world of
    /// one, where it is the input itself. A compiled data-parallel step averages its gradients with it.
    AllReduce {
        /// Sum or mean over the ranks.
        op: CollectiveOp,
    },
}

/// How an [`Op::AllReduce`] combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveOp {
    /// The sum over the ranks.
    Sum,
    /// The mean over the ranks.
    Mean,
}

/// What a pooling window computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    /// The largest tap (padding is `-inf`).
    Max,
    /// The mean of the taps.
    Avg {
        /// Divide by the kernel size (true) or by the taps inside the input (false).
        count_include_pad: bool,
    },
}

impl Op {
    /// Snake-case name of the op, as in exports, explain and kernel names.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Full { .. } => "full",
            Op::Iota { .. } => "iota",
            Op::Rand { .. } => "rand",
            Op::Unary { op } => op.name(),
            Op::Binary { op } => op.name(),
            Op::Where => "where",
            Op::Cast => "cast",
            Op::Reduce { op, .. } => op.name(),
            Op::ArgReduce { op: ArgReduceOp::ArgMax, .. } => "argmax",
            Op::ArgReduce { op: ArgReduceOp::ArgMin, .. } => "argmin",
            Op::Reshape => "reshape",
            Op::Permute { .. } => "permute",
            Op::Expand => "expand",
            Op::Slice { .. } => "slice",
            Op::Concat { .. } => "concat",
            Op::Pad { .. } => "pad",
            Op::IndexSelect { .. } => "index_select",
            Op::Gather { .. } => "gather",
            Op::Unfold { .. } => "unfold",
            Op::MatMul => "matmul",
            Op::Attention { .. } => "attention",
            Op::AttentionLse { .. } => "attention_lse",
            Op::AttentionGrad { part: AttentionPart::Queries, .. } => "attention_grad_q",
            Op::AttentionGrad { part: AttentionPart::Keys, .. } => "attention_grad_k",
            Op::AttentionGrad { part: AttentionPart::Values, .. } => "attention_grad_v",
            Op::Softmax { .. } => "softmax",
            Op::LogSoftmax { .. } => "log_softmax",
            Op::LayerNorm { .. } => "layer_norm",
            Op::Gelu { approx: GeluApprox::Erf } => "gelu",
            Op::Gelu { approx: GeluApprox::Tanh } => "gelu_tanh",
            Op::Silu => "silu",
            Op::Linear { .. } => "linear",
            Op::Mean { .. } => "mean",
            Op::Var { .. } => "var",
            Op::CausalMask => "causal_mask",
            Op::Conv { .. } => "conv",
            Op::Pool { mode, .. } => mode.name(),
            Op::AllReduce { op: CollectiveOp::Sum } => "all_reduce_sum",
            Op::AllReduce { op: CollectiveOp::Mean } => "all_reduce_mean",
        }
    }

    /// The family the op belongs to.
    pub fn family(&self) -> OpFamily {
        match self {
            Op::Input { .. } | Op::Full { .. } | Op::Iota { .. } | Op::Rand { .. } => OpFamily::Source,
            Op::Unary { .. } | Op::Binary { .. } | Op::Where | Op::Cast => OpFamily::Pointwise,
            Op::Reduce { .. } | Op::ArgReduce { .. } => OpFamily::Reduce,
            Op::Reshape
            | Op::Permute { .. }
            | Op::Expand
            | Op::Slice { .. }
            | Op::Concat { .. }
            | Op::Pad { .. }
            | Op::IndexSelect { .. }
            | Op::Gather { .. }
            | Op::Unfold { .. } => OpFamily::Layout,
            Op::MatMul | Op::Attention { .. } | Op::AttentionLse { .. } | Op::AttentionGrad { .. } => OpFamily::Matmul,
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
            | Op::Pool { .. } => OpFamily::Composite,
            Op::AllReduce { .. } => OpFamily::Collective,
        }
    }
}

/// Where a graph input's data comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum InputKind {
    /// Argument number `index` of the compiled function.
    Arg {
        /// Position among the tensor arguments.
        index: usize,
    },
    /// A concrete tensor the function reads but was not given (a weight): lifted, never baked in.
    Lifted,
    /// A value an earlier graph of the same call computed (the graph before a break).
    Carried {
        /// Which earlier graph.
        from_graph: usize,
    },
}

/// One node: an op, its inputs, its result type and the user's line that recorded it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// The operation.
    #[serde(flatten)]
    pub op: Op,
    /// Input nodes, in the op's order.
    pub inputs: Vec<NodeId>,
    /// Result dtype.
    pub dtype: DType,
    /// Result shape.
    pub shape: Shape,
    /// The user's line.
    pub loc: SourceLoc,
}

/// A graph input: its node and where its data comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphInput {
    /// The `Input` node.
    pub node: NodeId,
    /// Its origin.
    pub kind: InputKind,
}

/// A captured straight-line stretch of user code.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    /// The node arena, in topological order.
    pub nodes: Vec<Node>,
    /// The inputs, in `Op::Input::index` order.
    pub inputs: Vec<GraphInput>,
    /// The nodes whose values leave the graph.
    pub outputs: Vec<NodeId>,
    /// The symbols that dims may mention, with their ranges.
    pub symbols: SymTable,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a node and returns its id.
    pub fn push(&mut self, node: Node) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(node);
        id
    }

    /// The node behind an id.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    /// Adds an input node of the given type and origin.
    pub fn add_input(&mut self, dtype: DType, shape: Shape, kind: InputKind, loc: SourceLoc) -> NodeId {
        let index = self.inputs.len();
        let node = self.push(Node { op: Op::Input { index }, inputs: vec![], dtype, shape, loc });
        self.inputs.push(GraphInput { node, kind });
        node
    }

    /// Number of nodes that compute something (not inputs).
    pub fn op_count(&self) -> usize {
        self.nodes.iter().filter(|n| !matches!(n.op, Op::Input { .. })).count()
    }

    /// The graph without nodes no output depends on (inputs always stay, so input numbering holds), and
    /// for each kept node the id it had before.
    pub fn without_dead_nodes(&self) -> (Graph, Vec<NodeId>) {
        let mut live = vec![false; self.nodes.len()];
        for gi in &self.inputs {
            live[gi.node.index()] = true;
        }
        let mut stack: Vec<NodeId> = self.outputs.clone();
        while let Some(n) = stack.pop() {
            if !std::mem::replace(&mut live[n.index()], true) || matches!(self.node(n).op, Op::Input { .. }) {
                stack.extend(self.node(n).inputs.iter().copied());
            }
        }
        let mut remap = vec![NodeId(u32::MAX); self.nodes.len()];
        let mut kept = Vec::new();
        let mut out = Graph { symbols: self.symbols.clone(), ..Graph::default() };
        for (i, node) in self.nodes.iter().enumerate() {
            if !live[i] {
                continue;
            }
            let mut node = node.clone();
            node.inputs = node.inputs.iter().map(|a| remap[a.index()]).collect();
            remap[i] = out.push(node);
            kept.push(NodeId(i as u32));
        }
        out.inputs =
            self.inputs.iter().map(|gi| GraphInput { node: remap[gi.node.index()], kind: gi.kind.clone() }).collect();
        out.outputs = self.outputs.iter().map(|o| remap[o.index()]).collect();
        (out, kept)
    }

    /// Op names with how often each occurs, sorted by name (for explain).
    pub fn op_histogram(&self) -> Vec<(&'static str, usize)> {
        let mut counts = std::collections::BTreeMap::new();
        for n in &self.nodes {
            if !matches!(n.op, Op::Input { .. }) {
                *counts.entry(n.op.name()).or_insert(0usize) += 1;
            }
        }
        counts.into_iter().collect()
    }
}

impl fmt::Display for Graph {
    /// A readable listing: one line per node, `%3 = add(%1, %2) : f32[8, 16]  @ file:line`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, n) in self.nodes.iter().enumerate() {
            let args: Vec<String> = n.inputs.iter().map(|a| a.to_string()).collect();
            let attrs = crate::export::op_attrs(&n.op);
            let attrs = if attrs.is_empty() { String::new() } else { format!("{{{attrs}}}") };
            writeln!(f, "%{i} = {}{attrs}({}) : {}{}  @ {}", n.op.name(), args.join(", "), n.dtype, n.shape, n.loc)?;
        }
        let outs: Vec<String> = self.outputs.iter().map(|o| o.to_string()).collect();
        writeln!(f, "return ({})", outs.join(", "))
    }
}
