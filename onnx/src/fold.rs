//! Batch normalisation folded into the convolution before it, at load: an inference
//! `BatchNormalization` reading only a `Conv`'s output, with the convolution's weight (and bias) and
//! the normalisation's four parameters all initializers, becomes that convolution with its weight scaled
//! per output channel and its bias shifted — `conv(x, W·s, (b − mean)·s + β)` with `s = γ/√(var + ε)` —
//! computed once on the host in f64. The model then runs one convolution (whose bias the GEMM library
//! adds) where it ran a convolution and a per-channel scale and shift over every activation.

use crate::model::{Constant, Model};
use kiln_graph::{Tensor, TensorData};
use std::sync::Arc;

/// Folds every such pair in the model's top-level nodes; returns how many.
pub(crate) fn fold_batch_norms(model: &mut Model) -> usize {
    let mut folded = 0;
    let mut i = 0;
    while i < model.nodes.len() {
        if let Some((conv, weight, bias)) = foldable(model, i) {
            let bn = model.nodes.remove(i);
            let out = bn.output[0].clone();
            let (w_name, b_name) = (format!("{out}::folded_weight"), format!("{out}::folded_bias"));
            for (name, data) in [(w_name.clone(), weight), (b_name.clone(), bias)] {
                let data = Arc::new(data);
                model.constants.insert(name, Constant { tensor: Tensor::from_data((*data).clone()), data });
            }
            let c = &mut model.nodes[conv];
            c.input.truncate(1);
            c.input.extend([w_name, b_name]);
            c.output = vec![out];
            folded += 1;
        } else {
            i += 1;
        }
    }
    folded
}

/// If node `i` is a foldable normalisation: the index of its convolution and the folded weight and bias.
fn foldable(model: &Model, i: usize) -> Option<(usize, TensorData, TensorData)> {
    let bn = &model.nodes[i];
    let attr = |name: &str| bn.attribute.iter().find(|a| a.name() == name);
    let inference = attr("training_mode").is_none_or(|a| a.i() == 0) && attr("spatial").is_none_or(|a| a.i() == 1);
    if bn.op_type() != "BatchNormalization" || !inference || bn.output.iter().skip(1).any(|o| !o.is_empty()) {
        return None;
    }
    let y = bn.input.first()?;
    let conv =
        model.nodes[..i].iter().position(|n| n.op_type() == "Conv" && n.output.len() == 1 && n.output[0] == *y)?;
    // The convolution's output must have no other reader, nor be a model output; a subgraph (an `If`'s
    // branch, a `Loop`'s body) may read it by name without listing it, so a model with one folds nothing.
    let readers = model.nodes.iter().flat_map(|n| &n.input).filter(|n| *n == y).count();
    let subgraphs = model.nodes.iter().flat_map(|n| &n.attribute).any(|a| a.g.is_some() || !a.graphs.is_empty());
    if readers != 1 || subgraphs || model.outputs.iter().any(|o| o.name == *y) {
        return None;
    }
    let c = &model.nodes[conv];
    let constant = |name: Option<&String>| model.constants.get(name?).map(|c| c.data.clone());
    let w = constant(c.input.get(1))?;
    let b = match c.input.get(2).filter(|n| !n.is_empty()) {
        Some(name) => Some(constant(Some(name))?),
        None => None,
    };
    let [gamma, beta, mean, var] = [1, 2, 3, 4].map(|k| constant(bn.input.get(k)));
    let (gamma, beta, mean, var) = (gamma?, beta?, mean?, var?);
    let m = *w.dims().first()?;
    let per_channel = |t: &TensorData| t.dims() == [m] && t.dtype().is_float();
    if m == 0
        || w.dims().len() < 3
        || !w.dtype().is_float()
        || ![&gamma, &beta, &mean, &var].into_iter().all(|t| per_channel(t))
        || b.as_ref().is_some_and(|b| !per_channel(b))
    {
        return None;
    }
    let eps = attr("epsilon").map_or(1e-5, |a| a.f() as f64);
    let s: Vec<f64> = (0..m).map(|o| gamma.values()[o] / (var.values()[o] + eps).sqrt()).collect();
    let per_filter = w.values().len() / m;
    let weight: Vec<f64> = w.values().iter().enumerate().map(|(k, v)| v * s[k / per_filter]).collect();
    let bias: Vec<f64> = (0..m)
        .map(|o| (b.as_ref().map_or(0.0, |b| b.values()[o]) - mean.values()[o]) * s[o] + beta.values()[o])
        .collect();
    let weight = TensorData::from_f64(weight, w.dims(), w.dtype()).ok()?;
    let bias = TensorData::from_f64(bias, &[m], w.dtype()).ok()?;
    Some((conv, weight, bias))
}
