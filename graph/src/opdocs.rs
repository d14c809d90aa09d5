//! The op reference (`docs/ops.md`) generated from the code, so it cannot drift: a test regenerates it
//! and compares it with the committed file.

use crate::conv::Window;
use crate::ir::{
    ArgReduceOp, AttentionPart, BinaryOp, CollectiveOp, DTypeRule, GeluApprox, Op, OpFamily, PoolKind, ReduceOp,
    UnaryOp,
};
use crate::sym::Expr;

/// One representative of every op kind, in the order the reference lists them.
pub fn catalog() -> Vec<Op> {
    let mut ops = vec![Op::Input { index: 0 }, Op::Full { value: 0.0 }, Op::Iota { axis: 0 }, Op::Rand { stream: 0 }];
    ops.extend(UnaryOp::ALL.iter().map(|&op| Op::Unary { op }));
    ops.extend(BinaryOp::ALL.iter().map(|&op| Op::Binary { op }));
    ops.extend([Op::Where, Op::Cast]);
    ops.extend(ReduceOp::ALL.iter().map(|&op| Op::Reduce { op, axes: vec![], keepdim: false }));
    for op in [ArgReduceOp::ArgMax, ArgReduceOp::ArgMin] {
        ops.push(Op::ArgReduce { op, axis: 0, keepdim: false });
    }
    ops.extend([
        Op::Reshape,
        Op::Permute { perm: vec![] },
        Op::Expand,
        Op::Slice { axis: 0, start: Expr::from(0usize), end: Expr::from(0usize), step: 1 },
        Op::Concat { axis: 0 },
        Op::Pad { pads: vec![], value: 0.0 },
        Op::IndexSelect { axis: 0 },
        Op::Gather { axis: 0 },
        Op::Unfold { kernel: vec![], window: Window::default(), value: 0.0 },
        Op::MatMul,
        Op::Attention { scale: 1.0, causal: false },
        Op::AttentionLse { scale: 1.0, causal: false },
        Op::AttentionGrad { scale: 1.0, causal: false, part: AttentionPart::Queries },
        Op::AttentionGrad { scale: 1.0, causal: false, part: AttentionPart::Keys },
        Op::AttentionGrad { scale: 1.0, causal: false, part: AttentionPart::Values },
        Op::Softmax { axis: 0 },
        Op::LogSoftmax { axis: 0 },
        Op::LayerNorm { dims: 1, eps: 0.0, affine: false },
        Op::Gelu { approx: GeluApprox::Erf },
        Op::Gelu { approx: GeluApprox::Tanh },
        Op::Silu,
        Op::Linear { bias: false },
        Op::Mean { axes: vec![], keepdim: false },
        Op::Var { axes: vec![], correction: 1, keepdim: false },
        Op::CausalMask,
        Op::Conv { window: Window::default(), groups: 1, bias: false },
        Op::Pool { mode: PoolKind::Max, kernel: vec![], window: Window::default() },
        Op::Pool { mode: PoolKind::Avg { count_include_pad: true }, kernel: vec![], window: Window::default() },
        Op::AllReduce { op: CollectiveOp::Sum },
        Op::AllReduce { op: CollectiveOp::Mean },
    ]);
    ops
}

/// The Rust call that records the op, and what it computes.
pub fn describe(op: &Op) -> (&'static str, &'static str) {
    match op {
        Op::Input { .. } => {
            ("(graph input)", "A tensor argument, a lifted weight, or a value carried over a graph break.")
        }
        Op::Full { .. } => {
            ("Tensor::full / zeros / ones / scalar", "Every element equal to one value, rounded to the dtype.")
        }
        Op::Iota { .. } => ("Tensor::arange", "Each element's index along an axis; `arange` scales and shifts it."),
        Op::Rand { .. } => (
            "Tensor::rand / rand_like / dropout (and their `_in` forms, which name a stream)",
            "Uniform numbers in [0, 1) from Philox4x32-10 of each element's index (and a stream number) under an i32 key of two elements: the same on every backend.",
        ),
        Op::Unary { op } => match op {
            UnaryOp::Neg => ("neg", "`-x`"),
            UnaryOp::Abs => ("abs", "`|x|`"),
            UnaryOp::Exp => ("exp", "`e^x`"),
            UnaryOp::Log => ("log", "natural logarithm; `log(0) = -inf`, negative gives NaN"),
            UnaryOp::Sqrt => ("sqrt", "square root; negative gives NaN"),
            UnaryOp::Rsqrt => ("rsqrt", "`1/sqrt(x)`"),
            UnaryOp::Sin => ("sin", "sine"),
            UnaryOp::Cos => ("cos", "cosine"),
            UnaryOp::Tanh => ("tanh", "hyperbolic tangent"),
            UnaryOp::Sigmoid => ("sigmoid", "`1/(1+e^-x)`"),
            UnaryOp::Erf => ("erf", "the error function"),
            UnaryOp::Relu => ("relu", "`max(x, 0)`; NaN stays NaN"),
            UnaryOp::Reciprocal => ("reciprocal", "`1/x`"),
            UnaryOp::Floor => ("floor", "round toward -inf"),
            UnaryOp::Ceil => ("ceil", "round toward +inf"),
            UnaryOp::Round => ("round", "round half to even, as `torch.round`"),
            UnaryOp::Not => ("logical_not", "logical not of a bool tensor"),
            UnaryOp::IsNan => ("isnan", "bool: true where the element is NaN"),
        },
        Op::Binary { op } => match op {
            BinaryOp::Add => ("add", "`a + b`"),
            BinaryOp::Sub => ("sub", "`a - b`"),
            BinaryOp::Mul => ("mul", "`a * b`"),
            BinaryOp::Div => ("div", "`a / b` for floats; floor division for integers (division by zero is an error)"),
            BinaryOp::Pow => ("pow", "`a ^ b`"),
            BinaryOp::Max => ("maximum", "elementwise maximum; NaN if either is NaN"),
            BinaryOp::Min => ("minimum", "elementwise minimum; NaN if either is NaN"),
            BinaryOp::Eq => ("eq", "bool `a == b`"),
            BinaryOp::Ne => ("ne", "bool `a != b`"),
            BinaryOp::Lt => ("lt", "bool `a < b`"),
            BinaryOp::Le => ("le", "bool `a <= b`"),
            BinaryOp::Gt => ("gt", "bool `a > b`"),
            BinaryOp::Ge => ("ge", "bool `a >= b`"),
            BinaryOp::And => ("logical_and", "bool and"),
            BinaryOp::Or => ("logical_or", "bool or"),
            BinaryOp::BitAnd => ("bitwise_and", "bitwise and of integers (two's complement)"),
            BinaryOp::BitOr => ("bitwise_or", "bitwise or of integers (two's complement)"),
            BinaryOp::BitXor => ("bitwise_xor", "bitwise exclusive or of integers (two's complement)"),
            BinaryOp::Shl => (
                "bitwise_left_shift",
                "`a << b` of integers; the shift amount read as unsigned, past the width all bits out",
            ),
            BinaryOp::Shr => (
                "bitwise_right_shift",
                "`a >> b` of integers: arithmetic for signed, logical for unsigned dtypes; past the width 0 (−1 for a negative signed `a`)",
            ),
        },
        Op::Where => ("where_", "`cond ? a : b`, broadcasting all three"),
        Op::Cast => (
            "cast",
            "convert to another dtype; floats to integers truncate toward zero, NaN becomes 0; into an 8-bit \
             float, rounds to nearest even and saturates past the largest finite value (`cast_unsaturated`: \
             ±∞ or NaN there instead, ONNX's `saturate = 0`)",
        ),
        Op::Reduce { op, .. } => match op {
            ReduceOp::Sum => ("sum", "sum over axes (empty list = all); integer and bool sums are i64 (u32 and u64 sums u64)"),
            ReduceOp::Max => ("max", "maximum over axes; NaN-propagating; an empty axis is an error"),
            ReduceOp::Min => ("min", "minimum over axes; NaN-propagating; an empty axis is an error"),
        },
        Op::ArgReduce { op: ArgReduceOp::ArgMax, .. } => {
            ("argmax", "i64 index of the first maximum along an axis (NaN counts as maximum)")
        }
        Op::ArgReduce { op: ArgReduceOp::ArgMin, .. } => {
            ("argmin", "i64 index of the first minimum along an axis (NaN counts as minimum)")
        }
        Op::Reshape => {
            ("reshape / unsqueeze / squeeze", "same elements in row-major order, new shape (one `-1` inferred)")
        }
        Op::Permute { .. } => ("permute / transpose", "reorder axes"),
        Op::Expand => ("expand (and implicit broadcasting)", "stretch size-1 dims, PyTorch rules"),
        Op::Slice { .. } => {
            ("slice / narrow", "Python-style `start:end:step` along one axis; negative indices count from the end")
        }
        Op::Concat { .. } => ("Tensor::concat", "join along an axis"),
        Op::Pad { .. } => ("pad", "constant padding, `(before, after)` per axis from the first axis"),
        Op::IndexSelect { .. } => {
            ("index_select", "pick entries along an axis by a 1-D integer index; out-of-range is an error")
        }
        Op::Gather { .. } => ("gather", "`torch.gather`: index tensor of the output's shape selects along an axis"),
        Op::Unfold { .. } => (
            "(conv and pooling decompositions)",
            "the windows of a convolution as a new axis, `[N, C, *in]` to `[N, C, taps, *out]` (torch's `unfold`); a view",
        ),
        Op::MatMul => ("matmul", "batched matrix product, `torch.matmul` rules (1-D promotion, batch broadcasting)"),
        Op::Attention { .. } => (
            "(recognised in `q.matmul(k.transpose) * s → causal_mask → softmax → matmul(v)`)",
            "`softmax(q @ kᵀ * scale, -1) @ v`, causal or not, as one flash-attention kernel where the target has matrix units (f16/bf16, head dims multiples of 16 up to 128) or renders it on lanes (f32 on WGSL, head dims multiples of 4 up to 64)",
        ),
        Op::AttentionLse { .. } => (
            "(the gradient of an attention)",
            "each query's log-sum-exp of the attention's scaled, masked scores, f32: what the backward pass rebuilds the probabilities from",
        ),
        Op::AttentionGrad { part, .. } => (
            "(the gradient of an attention)",
            match part {
                AttentionPart::Queries => "the attention's gradient by `q`, probabilities rebuilt from the log-sum-exp",
                AttentionPart::Keys => "the attention's gradient by `k`, probabilities rebuilt from the log-sum-exp",
                AttentionPart::Values => "the attention's gradient by `v`, probabilities rebuilt from the log-sum-exp",
            },
        ),
        Op::Softmax { .. } => ("softmax", "composite: `exp(x - max) / sum(exp(x - max))` along an axis"),
        Op::LogSoftmax { .. } => ("log_softmax", "composite: `x - logsumexp(x)` along an axis"),
        Op::LayerNorm { .. } => {
            ("layer_norm", "composite: normalise the last axes (biased variance, eps), optional weight and bias")
        }
        Op::Gelu { approx: GeluApprox::Erf } => ("gelu", "composite: `x/2 * (1 + erf(x/√2))`"),
        Op::Gelu { approx: GeluApprox::Tanh } => {
            ("gelu_tanh", "composite: `x/2 * (1 + tanh(√(2/π) (x + 0.044715 x³)))`")
        }
        Op::Silu => ("silu", "composite: `x * sigmoid(x)`"),
        Op::Linear { .. } => ("linear", "composite: `x @ wᵀ + b`, `w` is `[out, in]`"),
        Op::Mean { .. } => ("mean", "composite: sum over axes divided by the count"),
        Op::Var { .. } => ("var", "composite: variance over axes with a correction (1 = unbiased)"),
        Op::CausalMask => ("causal_mask", "composite: `-inf` above the diagonal of the last two axes"),
        Op::Conv { .. } => (
            "conv",
            "composite: 1-3-D convolution `[N, C, *in]` with `[O, C/groups, *k]` (+ bias), stride/padding/dilation; \
             becomes im2col + one matmul per group",
        ),
        Op::Pool { mode: PoolKind::Max, .. } => ("max_pool", "composite: window max, padding is the dtype's lowest value (`-inf` for floats)"),
        Op::Pool { mode: PoolKind::Avg { .. }, .. } => {
            ("avg_pool", "composite: window mean, padding counted or not (`count_include_pad`)")
        }
        Op::AllReduce { op: CollectiveOp::Sum } => (
            "all_reduce(Sum) / ProcessGroup::all_reduce",
            "collective: the sum over the ranks of the data-parallel world (NCCL, queued on the device, bucketed with \
             its neighbours); a world of one is the value itself",
        ),
        Op::AllReduce { op: CollectiveOp::Mean } => {
            ("all_reduce(Mean) / ProcessGroup::all_reduce", "collective: the mean over the ranks (data-parallel gradients)")
        }
    }
}

/// Which dtypes the op accepts, in words.
fn dtypes(op: &Op) -> String {
    match op {
        Op::Unary { op } => op.accepts().describe().to_string(),
        Op::Binary { op } => op.accepts().describe().to_string(),
        Op::Full { .. } | Op::Iota { .. } | Op::Input { .. } | Op::Cast => "any".into(),
        Op::Rand { .. } => "f32 out; i32 key".into(),
        Op::Where => "bool condition, branches of any one dtype".into(),
        Op::Reduce { op: ReduceOp::Sum, .. } => "any".into(),
        Op::Reduce { .. } | Op::ArgReduce { .. } | Op::Pool { mode: PoolKind::Max, .. } => {
            DTypeRule::Numeric.describe().into()
        }
        Op::MatMul | Op::AllReduce { op: CollectiveOp::Sum } | Op::Conv { .. } => DTypeRule::Wide.describe().into(),
        Op::IndexSelect { .. } | Op::Gather { .. } => "any; integer index".into(),
        // Every other layout op moves values without arithmetic.
        op if op.family() == OpFamily::Layout => "any".into(),
        _ => "float".into(),
    }
}

/// Says whether a backend implements an op.
pub type SupportFn<'a> = &'a dyn Fn(&Op) -> bool;

/// The full Markdown reference; `backends` are the names of the backends and a predicate saying
/// whether each implements an op.
pub fn ops_markdown(backends: &[(&str, SupportFn<'_>)]) -> String {
    let mut s = String::from(
        "# kiln ops\n\n\
         Generated from the code by `cargo test -p kiln-graph --test ops_doc` (set `KILN_BLESS=1` to rewrite);\n\
         a test fails when this file and the code disagree. Composites are kept whole in the graph and\n\
         decomposed into primitives before fusion.\n\n",
    );
    let names: Vec<&str> = backends.iter().map(|(n, _)| *n).collect();
    s.push_str(&format!("| op | family | Rust | dtypes | semantics | {} |\n", names.join(" | ")));
    s.push_str(&format!("|---|---|---|---|---|{}\n", "---|".repeat(names.len())));
    for op in catalog() {
        let (call, sem) = describe(&op);
        let marks: Vec<&str> = backends.iter().map(|(_, f)| if f(&op) { "yes" } else { "—" }).collect();
        s.push_str(&format!(
            "| `{}` | {:?} | `{}` | {} | {} | {} |\n",
            op.name(),
            op.family(),
            call,
            dtypes(&op),
            sem,
            marks.join(" | ")
        ));
    }
    s
}
