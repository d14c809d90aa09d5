//! What an ONNX value is while a model runs: a kiln tensor, or a small integer tensor known while
//! tracing — shapes and the arithmetic on them (`Shape → Gather → Concat → Reshape`) — whose elements
//! are symbolic expressions, so a dynamic batch folds into symbolic sizes instead of data on the device.

use crate::model::{Constant, Model};
use kiln_graph::sym::Expr;
use kiln_graph::{DType, Result, Tensor};

/// Integer constants larger than this stay tensors: shape arithmetic is small.
const MAX_FOLDED: usize = 4096;

/// A value flowing between nodes.
#[derive(Clone, Debug)]
pub(crate) enum Value {
    /// A kiln tensor (concrete, or recorded in a trace).
    Tensor(Tensor),
    /// An integer tensor known element by element.
    Ints(Ints),
}

/// A row-major integer tensor of symbolic elements.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Ints {
    pub dims: Vec<usize>,
    pub dtype: DType,
    pub values: Vec<Expr>,
}

impl Ints {
    /// A 1-D i64 vector.
    pub fn vector(values: Vec<Expr>) -> Ints {
        Ints { dims: vec![values.len()], dtype: DType::I64, values }
    }

    /// The elements as constants, or `None` when one is symbolic.
    pub fn consts(&self) -> Option<Vec<i64>> {
        self.values.iter().map(Expr::as_const).collect()
    }
}

impl Value {
    /// A model constant: integers small enough to fold are `Ints`, the rest the constant's tensor.
    pub fn constant(c: &Constant) -> Value {
        let d = &c.data;
        if d.dtype().is_int() && d.values().len() <= MAX_FOLDED {
            let values = d.values().iter().map(|&v| Expr::constant(v as i64)).collect();
            return Value::Ints(Ints { dims: d.dims().to_vec(), dtype: d.dtype(), values });
        }
        Value::Tensor(c.tensor.clone())
    }

    /// The value as a kiln tensor: folded integers become a constant tensor, made once per value.
    pub fn into_tensor(self, model: &Model) -> Result<Tensor> {
        match self {
            Value::Tensor(t) => Ok(t),
            Value::Ints(i) => {
                let Some(values) = i.consts() else {
                    return Err(kiln_graph::Error::Unsupported {
                        what: format!(
                            "{}: a symbolic size ({}) used as tensor data",
                            model.name,
                            i.values.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
                        ),
                        loc: kiln_graph::SourceLoc::internal(),
                    });
                };
                Ok(model.constant(values.into_iter().map(|v| v as f64).collect(), &i.dims, i.dtype)?)
            }
        }
    }

    /// The value's dtype.
    pub fn dtype(&self) -> DType {
        match self {
            Value::Tensor(t) => t.dtype(),
            Value::Ints(i) => i.dtype,
        }
    }
}
