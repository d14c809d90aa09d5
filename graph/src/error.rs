//! The one error type of kiln. Bad user input is a typed error that names the user's line, never a panic.

use crate::dtype::DType;
use crate::loc::SourceLoc;
use crate::sym::SymError;

/// Everything that can go wrong in kiln, with the user's source location where there is one.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Two shapes that do not broadcast under PyTorch's rules.
    #[error("{loc}: `{op}`: shapes {lhs} and {rhs} cannot be broadcast together")]
    Broadcast {
        /// The op being recorded.
        op: String,
        /// Left shape, printed.
        lhs: String,
        /// Right shape, printed.
        rhs: String,
        /// The user's line.
        loc: SourceLoc,
    },
    /// A shape that does not fit what the op needs (other than broadcasting).
    #[error("{loc}: `{op}`: {msg}")]
    Shape {
        /// The op being recorded.
        op: String,
        /// What does not fit, with the shapes involved.
        msg: String,
        /// The user's line.
        loc: SourceLoc,
    },
    /// A dtype the op does not accept.
    #[error("{loc}: `{op}` expects {expected}, got {got}")]
    DType {
        /// The op being recorded.
        op: String,
        /// What it accepts, in words.
        expected: String,
        /// What it got.
        got: DType,
        /// The user's line.
        loc: SourceLoc,
    },
    /// An axis outside `-rank..rank`.
    #[error("{loc}: `{op}`: axis {axis} is out of range for a tensor of rank {rank}")]
    Axis {
        /// The op being recorded.
        op: String,
        /// The axis as the user gave it.
        axis: isize,
        /// The tensor's rank.
        rank: usize,
        /// The user's line.
        loc: SourceLoc,
    },
    /// A reshape whose element counts differ.
    #[error("{loc}: `reshape`: cannot reshape {from} ({from_numel} elements) to {to} ({to_numel} elements)")]
    Reshape {
        /// Source shape, printed.
        from: String,
        /// Its element count, printed (may be symbolic).
        from_numel: String,
        /// Target shape, printed.
        to: String,
        /// Its element count, printed.
        to_numel: String,
        /// The user's line.
        loc: SourceLoc,
    },
    /// Any other invalid argument (bad permutation, negative pad, zero step...).
    #[error("{loc}: `{op}`: {msg}")]
    InvalidArgument {
        /// The op being recorded.
        op: String,
        /// What is wrong.
        msg: String,
        /// The user's line.
        loc: SourceLoc,
    },
    /// Host data whose length does not match the shape given with it.
    #[error("{loc}: tensor data has {len} elements but shape {shape} needs {numel}")]
    DataLength {
        /// Elements supplied.
        len: usize,
        /// The shape, printed.
        shape: String,
        /// Elements the shape needs.
        numel: usize,
        /// The user's line.
        loc: SourceLoc,
    },
    /// A graph break inside a `fullgraph(true)` compile.
    #[error("{loc}: graph break in a fullgraph compile: {reason}")]
    GraphBreak {
        /// Why the trace had to stop (the host read).
        reason: String,
        /// The user's line that read the value.
        loc: SourceLoc,
    },
    /// A value error found while running (an index out of range, a division by zero in a size).
    #[error("{loc}: `{op}`: {msg}")]
    Runtime {
        /// The op that failed.
        op: String,
        /// What went wrong.
        msg: String,
        /// The line that recorded the op.
        loc: SourceLoc,
    },
    /// A size beyond what kiln can address (element counts past 2^60, or an i64 overflow in a size).
    #[error("{loc}: `{op}`: {msg}")]
    TooLarge {
        /// The op being recorded.
        op: String,
        /// What is too large, with the sizes.
        msg: String,
        /// The user's line.
        loc: SourceLoc,
    },
    /// Memory for a tensor or buffer could not be had (host or device), or a buffer exceeds what the
    /// device can hold or bind.
    #[error("{device}: out of memory: {what} needs {bytes} bytes{}", limit.map(|l| format!(" (the limit is {l})")).unwrap_or_default())]
    OutOfMemory {
        /// Where (`host`, `wgpu`, `cuda`).
        device: String,
        /// The tensor or buffer, named.
        what: String,
        /// Bytes asked for.
        bytes: u64,
        /// The device's limit, when a limit (rather than free memory) was the reason.
        limit: Option<u64>,
    },
    /// The device stopped working (a kernel faulted, the driver reset or lost it): what was on it is gone.
    #[error("{device}: device lost while {what}: {msg}")]
    DeviceLost {
        /// Which device (`cuda`, `wgpu`).
        device: String,
        /// What kiln was doing (the kernel or buffer involved).
        what: String,
        /// The driver's words.
        msg: String,
    },
    /// A symbolic-size error (unbound symbol, overflow).
    #[error("symbolic size: {0}")]
    Sym(#[from] SymError),
    /// Something kiln does not support (yet), said plainly.
    #[error("{loc}: unsupported: {what}")]
    Unsupported {
        /// What is not supported.
        what: String,
        /// The user's line.
        loc: SourceLoc,
    },
    /// A data-parallel process group could not form or failed: the launch environment (`RANK`,
    /// `WORLD_SIZE`, …), the rendezvous (a rank that never arrives, mismatched world sizes, a timeout), or
    /// the collective library (NCCL missing or failing). Every rank reports it.
    #[error("distributed (rank {}): {msg}", rank.map_or("?".to_string(), |r| r.to_string()))]
    Distributed {
        /// The reporting process's rank, when known.
        rank: Option<usize>,
        /// What went wrong and what to do about it.
        msg: String,
    },
    /// A device backend failed: no adapter or driver, a rejected kernel, out of memory, device lost.
    #[error("{backend}: {msg}")]
    Backend {
        /// Which backend (`wgpu`, `cuda`).
        backend: String,
        /// What went wrong, with the kernel's name and source where one is involved.
        msg: String,
    },
    /// A node of an imported model (ONNX) that kiln cannot run: an op, opset, attribute or dtype it does
    /// not support (`unsupported`), or a node that breaks the format's rules.
    #[error("{model}: node `{node}` ({op_type}, opset {opset}): {}{msg}", if *unsupported { "unsupported: " } else { "" })]
    Import {
        /// The model file.
        model: String,
        /// The node's name (or its first output's, when it has none).
        node: String,
        /// The node's op type, with its domain when not the default one.
        op_type: String,
        /// The opset the model imports for the node's domain.
        opset: i64,
        /// True when kiln does not support this (yet); false when the node itself is wrong.
        unsupported: bool,
        /// What is wrong.
        msg: String,
    },
    /// A malformed export or import file.
    #[error("malformed {what}: {msg}")]
    Format {
        /// The kind of file.
        what: String,
        /// The parser's message.
        msg: String,
    },
}

/// kiln's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A kernel's source that a validator, assembler or driver rejected, as every codegen error shows it:
/// the kernel, who rejected it and their words, then the source with numbered lines.
pub fn rejected_source(kernel: &str, by: &str, words: &dyn std::fmt::Display, source: &str) -> String {
    let numbered: String = source.lines().enumerate().map(|(i, l)| format!("{:4} | {l}\n", i + 1)).collect();
    format!("kernel {kernel}: {by} rejected it: {words}\n{numbered}")
}
