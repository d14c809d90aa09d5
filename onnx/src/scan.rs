//! ONNX's `Scan`, unrolled as `Loop` is: its body runs once per step of the scanned axis, inside the
//! graph, on the carried state and each scan input's slice at that step; the scan outputs are stacked
//! along their axis. Opset 8's form scans every batch item on its own (axis 1, `sequence_lens`); from
//! opset 9 inputs and outputs name their axes and directions.

use crate::model::{node_error, Model, MAX_LOOP_ITERATIONS};
use crate::proto::{self, NodeProto};
use crate::value::Value;
use kiln_graph::{Result, Tensor};
use std::collections::HashMap;

impl Model {
    /// A `Scan` node on `args` (its state values, then its scan inputs; opset 8 first takes the
    /// optional `sequence_lens`).
    pub(crate) fn run_scan(
        &self,
        node: &NodeProto,
        args: &[Option<Value>],
        env: &HashMap<String, Value>,
    ) -> Result<Vec<Value>> {
        let fail = |unsupported: bool, msg: String| node_error(&self.name, self.opset, node, unsupported, msg);
        let attr = |name: &str| node.attribute.iter().find(|a| a.name() == name);
        let body = attr("body").and_then(|a| a.g.as_ref()).ok_or_else(|| fail(false, "no body".into()))?;
        let m = attr("num_scan_inputs").map(|a| a.i()).ok_or_else(|| fail(false, "no num_scan_inputs".into()))?;
        let batched = self.opset < 9;
        let given = if batched { &args[1.min(args.len())..] } else { args };
        let tensors = given
            .iter()
            .map(|a| a.clone().ok_or_else(|| fail(false, "an absent state or scan input".into()))?.into_tensor(self))
            .collect::<Result<Vec<Tensor>>>()?;
        let m = usize::try_from(m).ok().filter(|&m| m >= 1 && m <= tensors.len());
        let m = m.ok_or_else(|| fail(false, format!("num_scan_inputs of {} inputs", tensors.len())))?;
        let (states, scans) = tensors.split_at(tensors.len() - m);
        let n = states.len();
        let k = body.output.len().checked_sub(n).ok_or_else(|| fail(false, "a body of too few outputs".into()))?;
        if body.input.len() != n + m || node.output.len() != n + k {
            return Err(fail(
                false,
                format!("a body of {} inputs for {n} states and {m} scan inputs", body.input.len()),
            ));
        }
        let ints = |name: &str, len: usize| attr(name).map_or(vec![0; len], |a| a.ints.clone());
        let step = Scanner { model: self, node, body, env, n, k };
        if batched {
            if let Some(Some(lens)) = args.first() {
                let lens = lens.clone().into_tensor(self)?.to_data()?.values().to_vec();
                let full = scans[0].shape().as_concrete().and_then(|d| d.get(1).copied()).unwrap_or(0);
                if lens.iter().any(|&l| l as usize != full) {
                    return Err(fail(true, format!("sequence_lens {lens:?} shorter than the sequences ({full})")));
                }
            }
            let directions = ints("directions", m);
            let lens = scans[0].shape().as_concrete().unwrap_or_default();
            let (batch, steps) = (lens.first().copied().unwrap_or(0), lens.get(1).copied().unwrap_or(0));
            if directions.len() != m {
                return Err(fail(false, format!("{} directions for {m} scan inputs", directions.len())));
            }
            if batch.saturating_mul(steps) > MAX_LOOP_ITERATIONS {
                let msg = format!("a scan of {batch} items × {steps} steps (unrolled: {MAX_LOOP_ITERATIONS} at most)");
                return Err(fail(true, msg));
            }
            let mut finals: Vec<Vec<Tensor>> = vec![Vec::new(); n];
            let mut stacked: Vec<Vec<Tensor>> = vec![Vec::new(); k];
            for b in 0..batch {
                let item = |t: &Tensor| t.narrow(0, b, 1)?.squeeze(0);
                let states = states.iter().map(item).collect::<Result<Vec<_>>>()?;
                let scans = scans.iter().map(item).collect::<Result<Vec<_>>>()?;
                let (s, outs) = step.run(states, &scans, &vec![0; m], &directions, &vec![0; k], &vec![0; k])?;
                for (all, t) in finals.iter_mut().zip(s) {
                    all.push(t.unsqueeze(0)?);
                }
                for (all, t) in stacked.iter_mut().zip(outs) {
                    all.push(t.unsqueeze(0)?);
                }
            }
            let cat = |v: Vec<Tensor>| Tensor::concat(&v.iter().collect::<Vec<_>>(), 0).map(Value::Tensor);
            return finals.into_iter().chain(stacked).map(cat).collect();
        }
        let (in_axes, in_dirs) = (ints("scan_input_axes", m), ints("scan_input_directions", m));
        let (out_axes, out_dirs) = (ints("scan_output_axes", k), ints("scan_output_directions", k));
        if in_axes.len() != m || in_dirs.len() != m || out_axes.len() != k || out_dirs.len() != k {
            return Err(fail(false, format!("axes and directions for {m} scan inputs and {k} scan outputs")));
        }
        let (s, outs) = step.run(states.to_vec(), scans, &in_axes, &in_dirs, &out_axes, &out_dirs)?;
        Ok(s.into_iter().chain(outs).map(Value::Tensor).collect())
    }
}

/// One `Scan` node's body and what it runs in.
struct Scanner<'a> {
    model: &'a Model,
    node: &'a NodeProto,
    body: &'a proto::GraphProto,
    env: &'a HashMap<String, Value>,
    /// State values, scan outputs.
    n: usize,
    k: usize,
}

impl Scanner<'_> {
    /// Runs the body over every step of `scans` from `states`, each scan input along its axis (last step
    /// first where its direction is 1): the final states and the scan outputs, each stacked along its
    /// axis (last step first where its direction is 1).
    fn run(
        &self,
        mut states: Vec<Tensor>,
        scans: &[Tensor],
        in_axes: &[i64],
        in_dirs: &[i64],
        out_axes: &[i64],
        out_dirs: &[i64],
    ) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        let (model, node) = (self.model, self.node);
        let fail = |unsupported: bool, msg: String| node_error(&model.name, model.opset, node, unsupported, msg);
        let axis = |a: i64, rank: usize| {
            let r = rank as i64;
            (-r..r)
                .contains(&a)
                .then(|| a.rem_euclid(r) as usize)
                .ok_or_else(|| fail(false, format!("axis {a} of rank {rank}")))
        };
        let mut len = None;
        let mut axes = Vec::with_capacity(scans.len());
        for (x, &a) in scans.iter().zip(in_axes) {
            let dims = x.shape().as_concrete().ok_or_else(|| fail(true, "a scan over symbolic dims".into()))?;
            let a = axis(a, dims.len())?;
            if len.is_some_and(|l| l != dims[a]) {
                return Err(fail(false, "scan inputs of different lengths".into()));
            }
            len = Some(dims[a]);
            axes.push(a);
        }
        let len = len.unwrap_or(0);
        if len > MAX_LOOP_ITERATIONS {
            return Err(fail(true, format!("a scan of more than {MAX_LOOP_ITERATIONS} steps (unrolled)")));
        }
        let mut stacked: Vec<Vec<Tensor>> = vec![Vec::new(); self.k];
        for t in 0..len {
            let mut inner = self.env.clone();
            for (input, v) in self.body.input.iter().zip(&states) {
                inner.insert(input.name().to_string(), Value::Tensor(v.clone()));
            }
            for (j, x) in scans.iter().enumerate() {
                let at = if in_dirs[j] == 1 { len - 1 - t } else { t };
                let slice = x.narrow(axes[j] as isize, at, 1)?.squeeze(axes[j] as isize)?;
                inner.insert(self.body.input[self.n + j].name().to_string(), Value::Tensor(slice));
            }
            let outs = model.run_subgraph(node, self.body, "body", &mut inner)?;
            let mut outs = outs.into_iter().map(|v| v.into_tensor(model));
            states =
                (0..self.n).map(|_| outs.next().expect("the body's outputs were counted")).collect::<Result<_>>()?;
            for scan in stacked.iter_mut() {
                scan.push(outs.next().expect("the body's outputs were counted")?);
            }
        }
        let mut outputs = Vec::with_capacity(self.k);
        for (j, mut steps) in stacked.into_iter().enumerate() {
            if steps.is_empty() {
                return Err(fail(true, "a scan output of a scan of no steps".into()));
            }
            if out_dirs[j] == 1 {
                steps.reverse();
            }
            let a = axis(out_axes[j], steps[0].shape().rank() + 1)?;
            let steps = steps.iter().map(|s| s.unsqueeze(a as isize)).collect::<Result<Vec<_>>>()?;
            outputs.push(Tensor::concat(&steps.iter().collect::<Vec<_>>(), a as isize)?);
        }
        Ok((states, outputs))
    }
}
