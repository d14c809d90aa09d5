//! A parsed ONNX model: its opset, inputs and outputs with symbolic dims, constants (initializers and
//! `Constant` nodes, read once into kiln tensors) and the nodes [`Model::run`] interprets.

use crate::proto::{self, tensor_shape_proto::dimension, type_proto, ModelProto, NodeProto};
use crate::tensor::{dtype_of, to_data};
use crate::value::{Ints, Value};
use kiln_graph::{DType, Error, Result, Tensor, TensorData};
use prost::Message;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The oldest and newest default-domain opsets kiln reads.
pub const OPSETS: std::ops::RangeInclusive<i64> = 7..=25;

/// One dim of a model input or output as the file declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DimSpec {
    /// A fixed size.
    Fixed(usize),
    /// A named size (`dim_param`): symbolic in kiln, so every size runs without recompiling.
    Param(String),
    /// Neither (any size).
    Any,
}

impl std::fmt::Display for DimSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DimSpec::Fixed(n) => write!(f, "{n}"),
            DimSpec::Param(p) => write!(f, "{p}"),
            DimSpec::Any => write!(f, "?"),
        }
    }
}

/// A model input or output: name, dtype and declared dims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoSpec {
    /// The value's name in the model.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its dims (`None`: the file gives no shape).
    pub dims: Option<Vec<DimSpec>>,
}

impl std::fmt::Display for IoSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.name, self.dtype)?;
        if let Some(d) = &self.dims {
            let d: Vec<String> = d.iter().map(ToString::to_string).collect();
            write!(f, "[{}]", d.join(", "))?;
        }
        Ok(())
    }
}

/// A constant value of the model: its host data and the kiln tensor made from it once (so a traced call
/// lifts it as the same weight every time and it is uploaded once).
pub(crate) struct Constant {
    pub data: Arc<TensorData>,
    pub tensor: Tensor,
}

/// A made constant's identity: dims, dtype and the bits of each value.
type ConstantKey = (Vec<usize>, DType, Vec<u64>);

/// A loaded ONNX model, ready to run on kiln tensors (eagerly, or traced under `compile`).
pub struct Model {
    /// Where it came from (a path, or the name given to [`crate::load_bytes`]).
    pub name: String,
    /// The default domain's opset the model is read by: its own, or 7 for an older model whose every
    /// op is defined at its opset as at 7.
    pub opset: i64,
    /// The inputs a caller gives, in order (initializers listed as inputs are not among them).
    pub inputs: Vec<IoSpec>,
    /// The outputs, in order.
    pub outputs: Vec<IoSpec>,
    pub(crate) nodes: Vec<NodeProto>,
    pub(crate) constants: HashMap<String, Constant>,
    /// Integer values that shape arithmetic folded and a node then read as data: made into a tensor
    /// once per distinct value, so a traced call sees the same constant each time (no recompiles).
    pub(crate) materialized: Mutex<BTreeMap<ConstantKey, Tensor>>,
}

/// A malformed file: the protobuf does not parse, or the graph breaks ONNX's rules.
pub(crate) fn malformed(name: &str, msg: impl std::fmt::Display) -> Error {
    Error::Format { what: format!("ONNX model {name}"), msg: msg.to_string() }
}

/// The error for `node` of model `model`.
pub(crate) fn node_error(
    model: &str,
    opset: i64,
    node: &NodeProto,
    unsupported: bool,
    msg: impl Into<String>,
) -> Error {
    let name =
        if node.name().is_empty() { node.output.first().cloned().unwrap_or_default() } else { node.name().into() };
    let op_type = match node.domain() {
        "" | "ai.onnx" => node.op_type().to_string(),
        d => format!("{d}.{}", node.op_type()),
    };
    Error::Import { model: model.into(), node: name, op_type, opset, unsupported, msg: msg.into() }
}

fn io_spec(model: &str, v: &proto::ValueInfoProto) -> Result<IoSpec> {
    let bad = |msg: String| malformed(model, format!("value {:?}: {msg}", v.name()));
    let Some(type_proto::Value::TensorType(t)) = v.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return Err(Error::Unsupported {
            what: format!(
                "{model}: input or output {:?} is not a tensor (sequences, maps and optionals are not supported)",
                v.name()
            ),
            loc: kiln_graph::SourceLoc::internal(),
        });
    };
    let dtype = dtype_of(t.elem_type()).map_err(|m| Error::Unsupported {
        what: format!("{model}: input or output {:?} has {m}", v.name()),
        loc: kiln_graph::SourceLoc::internal(),
    })?;
    let dims = t.shape.as_ref().map(|s| {
        s.dim
            .iter()
            .map(|d| match &d.value {
                Some(dimension::Value::DimValue(n)) if *n >= 0 => Ok(DimSpec::Fixed(*n as usize)),
                Some(dimension::Value::DimValue(n)) => Err(bad(format!("dimension {n}"))),
                Some(dimension::Value::DimParam(p)) if !p.is_empty() => Ok(DimSpec::Param(p.clone())),
                _ => Ok(DimSpec::Any),
            })
            .collect::<Result<Vec<_>>>()
    });
    Ok(IoSpec { name: v.name().into(), dtype, dims: dims.transpose()? })
}

/// Unknown ops and domains are found at load, not at the first call: `node`'s, and those of the
/// branches of an `If`.
fn check_supported(name: &str, opset: i64, node: &NodeProto) -> Result<()> {
    if let Some(why) = crate::ops::unknown(node.domain(), node.op_type()) {
        return Err(node_error(name, opset, node, true, why));
    }
    for g in node.attribute.iter().filter_map(|a| a.g.as_ref()) {
        g.node.iter().try_for_each(|n| check_supported(name, opset, n))?;
    }
    Ok(())
}

/// The most iterations a `Loop` is unrolled to.
pub const MAX_LOOP_ITERATIONS: usize = 4096;

impl Model {
    /// Parses a model from its bytes; `dir` is where its external data lives.
    pub(crate) fn parse(bytes: &[u8], name: &str, dir: Option<&Path>) -> Result<Model> {
        let m = ModelProto::decode(bytes).map_err(|e| malformed(name, e))?;
        let mut opset = None;
        let mut training = false;
        for o in &m.opset_import {
            match o.domain() {
                "" | "ai.onnx" => opset = Some(o.version()),
                d if d == crate::ops::optimizers::DOMAIN => training = o.version() == 1,
                _ => {}
            }
        }
        // IR version 3 and older imply opset 1 when none is named; kiln starts at 7. A model of the
        // training domain's optimizers alone imports no default opset: its rules are the newest's.
        let declared = opset.unwrap_or(if training { *OPSETS.end() } else { 1 });
        let g = m.graph.ok_or_else(|| malformed(name, "no graph"))?;
        let unsupported = |why: String| Error::Unsupported {
            what: format!("{name}: opset {declared} (kiln reads opsets {} to {}{why})", OPSETS.start(), OPSETS.end()),
            loc: kiln_graph::SourceLoc::internal(),
        };
        // An older model whose every op is defined as at opset 7 is read as opset 7.
        let opset = match declared {
            1..7 => match crate::old_opsets::first_changed(&g.node, declared) {
                None => *OPSETS.start(),
                Some((op, Some(v))) => {
                    return Err(unsupported(format!(
                        ", and older models whose ops are defined as at 7: `{op}` changed at opset {v}"
                    )))
                }
                Some((op, None)) => return Err(unsupported(format!(": `{op}` is not an op of opset 7 or older"))),
            },
            _ => declared,
        };
        if !OPSETS.contains(&opset) {
            return Err(unsupported(String::new()));
        }
        let mut constants = HashMap::new();
        for init in &g.initializer {
            let data = to_data(init, dir).map_err(|msg| match dtype_of(init.data_type()) {
                Err(_) => Error::Unsupported {
                    what: format!("{name}: initializer {:?}: {msg}", init.name()),
                    loc: kiln_graph::SourceLoc::internal(),
                },
                Ok(_) => malformed(name, format!("initializer {:?}: {msg}", init.name())),
            })?;
            let data = Arc::new(data);
            constants.insert(init.name().to_string(), Constant { tensor: Tensor::from_data((*data).clone()), data });
        }
        let inputs = g
            .input
            .iter()
            .filter(|v| !constants.contains_key(v.name()))
            .map(|v| io_spec(name, v))
            .collect::<Result<Vec<_>>>()?;
        let outputs = g.output.iter().map(|v| io_spec(name, v)).collect::<Result<Vec<_>>>()?;
        let mut model = Model {
            name: name.into(),
            opset,
            inputs,
            outputs,
            nodes: Vec::with_capacity(g.node.len()),
            constants,
            materialized: Mutex::default(),
        };
        for node in g.node {
            if node.op_type() == "Constant" && matches!(node.domain(), "" | "ai.onnx") {
                let data = crate::ops::constant_node(&node)
                    .map_err(|(unsupported, msg)| node_error(name, opset, &node, unsupported, msg))?;
                let data = Arc::new(data);
                let out = node.output.first().cloned().unwrap_or_default();
                model.constants.insert(out, Constant { tensor: Tensor::from_data((*data).clone()), data });
                continue;
            }
            check_supported(name, opset, &node)?;
            model.nodes.push(node);
        }
        crate::fold::fold_batch_norms(&mut model);
        Ok(model)
    }

    /// A constant tensor the conversion makes (folded sizes read as data, resize indices and weights):
    /// made once per distinct value, so a traced call lifts the same tensor every time.
    pub(crate) fn constant(&self, values: Vec<f64>, dims: &[usize], dtype: DType) -> Result<Tensor> {
        let key = (dims.to_vec(), dtype, values.iter().map(|v| v.to_bits()).collect());
        let mut cache = self.materialized.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = cache.get(&key) {
            return Ok(t.clone());
        }
        let t = Tensor::from_data(TensorData::from_f64(values, dims, dtype)?);
        cache.insert(key, t.clone());
        Ok(t)
    }

    /// Whether some node of the graph has op type `op_type` (`"Conv"`).
    pub fn has_op(&self, op_type: &str) -> bool {
        self.nodes.iter().any(|n| n.op_type.as_deref() == Some(op_type))
    }

    /// Runs the model on `inputs` (in [`Model::inputs`] order) with kiln ops: eagerly on concrete
    /// tensors, or recorded into one graph when called inside `compile`.
    pub fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.check_inputs(inputs)?;
        let mut env: HashMap<String, Value> = HashMap::new();
        for (spec, t) in self.inputs.iter().zip(inputs) {
            env.insert(spec.name.clone(), Value::Tensor(t.clone()));
        }
        self.run_nodes(&self.nodes, &mut env)?;
        self.outputs
            .iter()
            .map(|o| match self.value_of(&env, &o.name) {
                Some(v) => v.into_tensor(self),
                None => Err(malformed(&self.name, format!("output {:?} is never computed", o.name))),
            })
            .collect()
    }

    /// Runs `nodes` in order on the values of `env`, adding each node's outputs to it.
    fn run_nodes(&self, nodes: &[NodeProto], env: &mut HashMap<String, Value>) -> Result<()> {
        for node in nodes {
            let outs = match node.op_type() {
                // A branch's constants (the main graph's were lifted at load).
                "Constant" => {
                    let data = crate::ops::constant_node(node)
                        .map_err(|(unsupported, msg)| node_error(&self.name, self.opset, node, unsupported, msg))?;
                    vec![self.made_constant(data)?]
                }
                _ => {
                    let args = self.args(node, env)?;
                    match node.op_type() {
                        "If" => self.run_if(node, &args, env)?,
                        "Loop" => self.run_loop(node, &args, env)?,
                        "Scan" => self.run_scan(node, &args, env)?,
                        _ => crate::ops::run_node(self, node, &args)?,
                    }
                }
            };
            for (name, v) in node.output.iter().zip(outs) {
                if !name.is_empty() {
                    env.insert(name.clone(), v);
                }
            }
        }
        Ok(())
    }

    /// `node`'s inputs from `env` or the constants (absent optional inputs are `None`).
    fn args(&self, node: &NodeProto, env: &HashMap<String, Value>) -> Result<Vec<Option<Value>>> {
        node.input
            .iter()
            .map(|n| {
                if n.is_empty() {
                    return Ok(None);
                }
                match self.value_of(env, n) {
                    Some(v) => Ok(Some(v)),
                    None => Err(node_error(
                        &self.name,
                        self.opset,
                        node,
                        false,
                        format!("reads {n:?}, which no earlier node or initializer defines"),
                    )),
                }
            })
            .collect()
    }

    /// A one-element value known while tracing (a constant, folded shape arithmetic, or data read on
    /// the host: a graph break under `compile`), else a typed error naming `what`.
    fn known_scalar(&self, node: &NodeProto, v: Option<&Value>, what: &str) -> Result<f64> {
        let known = match v {
            Some(Value::Ints(v)) if v.values.len() == 1 => v.consts().map(|c| c[0] as f64),
            Some(Value::Tensor(t)) if t.shape().numel().as_const() == Some(1) => Some(t.to_data()?.values()[0]),
            _ => None,
        };
        known.ok_or_else(|| {
            node_error(&self.name, self.opset, node, true, format!("{what} that is not one known value"))
        })
    }

    /// A `Loop` whose trip count and condition are known while tracing (as an `If`'s condition is),
    /// unrolled: each iteration runs the body inside the graph on the carried values, its scan
    /// outputs stacked along a new first axis. At most [`MAX_LOOP_ITERATIONS`] iterations.
    fn run_loop(&self, node: &NodeProto, args: &[Option<Value>], env: &HashMap<String, Value>) -> Result<Vec<Value>> {
        let fail = |msg: String| node_error(&self.name, self.opset, node, false, msg);
        let body = node
            .attribute
            .iter()
            .find(|a| a.name() == "body")
            .and_then(|a| a.g.as_ref())
            .ok_or_else(|| fail("no body".into()))?;
        let trip = match args.first() {
            Some(Some(v)) => Some(self.known_scalar(node, Some(v), "a trip count")?),
            _ => None,
        };
        let mut cond = match args.get(1) {
            Some(Some(v)) => self.known_scalar(node, Some(v), "a condition")? != 0.0,
            _ => true,
        };
        let mut carried: Vec<Value> = args
            .iter()
            .skip(2)
            .map(|a| a.clone().ok_or_else(|| fail("an absent loop-carried value".into())))
            .collect::<Result<_>>()?;
        let (n, k) = (carried.len(), body.output.len().saturating_sub(1 + carried.len()));
        if body.input.len() != 2 + n || body.output.len() != 1 + n + k || node.output.len() != n + k {
            return Err(fail(format!(
                "a body of {} inputs and {} outputs for {n} carried values",
                body.input.len(),
                body.output.len()
            )));
        }
        let limit = trip.unwrap_or(f64::INFINITY);
        let mut scans: Vec<Vec<Tensor>> = vec![Vec::new(); k];
        let mut i = 0usize;
        while cond && (i as f64) < limit {
            if i == MAX_LOOP_ITERATIONS {
                return Err(node_error(
                    &self.name,
                    self.opset,
                    node,
                    true,
                    format!("a loop of more than {MAX_LOOP_ITERATIONS} iterations (unrolled)"),
                ));
            }
            let mut inner = env.clone();
            let iteration =
                Ints { dims: vec![], dtype: DType::I64, values: vec![kiln_graph::sym::Expr::constant(i as i64)] };
            inner.insert(body.input[0].name().to_string(), Value::Ints(iteration));
            inner.insert(body.input[1].name().to_string(), Value::Tensor(self.constant(vec![1.0], &[], DType::Bool)?));
            for (input, v) in body.input[2..].iter().zip(&carried) {
                inner.insert(input.name().to_string(), v.clone());
            }
            let mut out = self.run_subgraph(node, body, "body", &mut inner)?.into_iter();
            let mut next = |what: &str| out.next().ok_or_else(|| fail(format!("no {what} from the body")));
            cond = self.known_scalar(node, Some(&next("condition")?), "a body condition")? != 0.0;
            carried = (0..n).map(|_| next("carried value")).collect::<Result<_>>()?;
            for scan in scans.iter_mut() {
                scan.push(next("scan output")?.into_tensor(self)?.unsqueeze(0)?);
            }
            i += 1;
        }
        let mut outs = carried;
        for scan in scans {
            if scan.is_empty() {
                return Err(node_error(
                    &self.name,
                    self.opset,
                    node,
                    true,
                    "a scan output of a loop that ran no iteration",
                ));
            }
            outs.push(Value::Tensor(Tensor::concat(&scan.iter().collect::<Vec<_>>(), 0)?));
        }
        Ok(outs)
    }

    /// An `If` whose condition is known while tracing (a constant, folded shape arithmetic, or data
    /// read on the host — a graph break under `compile`, as for shapes given as data): the branch it
    /// picks runs as part of the graph, seeing every value defined outside it.
    fn run_if(&self, node: &NodeProto, args: &[Option<Value>], env: &HashMap<String, Value>) -> Result<Vec<Value>> {
        let fail = |msg: String| node_error(&self.name, self.opset, node, false, msg);
        let cond = self.known_scalar(node, args.first().and_then(Option::as_ref), "a condition")? != 0.0;
        let branch = if cond { "then_branch" } else { "else_branch" };
        let g = node
            .attribute
            .iter()
            .find(|a| a.name() == branch)
            .and_then(|a| a.g.as_ref())
            .ok_or_else(|| fail(format!("no {branch}")))?;
        if g.output.len() != node.output.len() {
            return Err(fail(format!("{branch} gives {} outputs for {}", g.output.len(), node.output.len())));
        }
        self.run_subgraph(node, g, branch, &mut env.clone())
    }

    /// Runs subgraph `g` of `node` (a branch, a loop's body, named `what`) on `env` — the values
    /// outside it and its own inputs — with its initializers: its outputs.
    pub(crate) fn run_subgraph(
        &self,
        node: &NodeProto,
        g: &proto::GraphProto,
        what: &str,
        env: &mut HashMap<String, Value>,
    ) -> Result<Vec<Value>> {
        let fail = |msg: String| node_error(&self.name, self.opset, node, false, msg);
        for init in &g.initializer {
            let data = to_data(init, None).map_err(|m| fail(format!("{what} initializer {:?}: {m}", init.name())))?;
            env.insert(init.name().to_string(), self.made_constant(data)?);
        }
        self.run_nodes(&g.node, env)?;
        g.output
            .iter()
            .map(|o| {
                self.value_of(env, o.name())
                    .ok_or_else(|| fail(format!("{what} output {:?} is never computed", o.name())))
            })
            .collect()
    }

    /// The value named `name`: computed (in `env`) or a model constant.
    fn value_of(&self, env: &HashMap<String, Value>, name: &str) -> Option<Value> {
        env.get(name).cloned().or_else(|| self.constants.get(name).map(Value::constant))
    }

    /// A constant a subgraph defines, as the main graph's are lifted (one tensor per distinct value).
    fn made_constant(&self, data: TensorData) -> Result<Value> {
        let tensor = self.constant(data.values().to_vec(), data.dims(), data.dtype())?;
        Ok(Value::constant(&Constant { data: Arc::new(data), tensor }))
    }

    /// Checks the caller's tensors against the declared inputs: count, dtype, rank and fixed dims.
    pub fn check_inputs(&self, inputs: &[Tensor]) -> Result<()> {
        let bad = |msg: String| Error::InvalidArgument {
            op: "onnx model".into(),
            msg,
            loc: kiln_graph::SourceLoc::internal(),
        };
        if inputs.len() != self.inputs.len() {
            let want: Vec<String> = self.inputs.iter().map(ToString::to_string).collect();
            return Err(bad(format!(
                "{} takes {} input(s) ({}), {} given",
                self.name,
                want.len(),
                want.join(", "),
                inputs.len()
            )));
        }
        for (spec, t) in self.inputs.iter().zip(inputs) {
            let shape = t.shape();
            let fits = spec.dims.as_ref().is_none_or(|dims| {
                dims.len() == shape.rank()
                    && dims.iter().zip(shape.dims()).all(|(d, s)| match d {
                        DimSpec::Fixed(n) => s.as_const().is_none_or(|v| v == *n as i64),
                        _ => true,
                    })
            });
            if t.dtype() != spec.dtype || !fits {
                return Err(bad(format!("{}: input {spec} was given a {} {shape}", self.name, t.dtype())));
            }
        }
        Ok(())
    }
}
