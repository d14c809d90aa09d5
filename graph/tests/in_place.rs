//! Concatenations assembled in place (`kiln_graph::in_place`). DenseNet's pattern — each layer's
//! convolution joined to every earlier feature map along the channels — must compile to kernels that write
//! each product into its rows of one buffer and read every concatenation as one stored value (no kernel
//! reads one part by part), with what the reference computes, through the kernel interpreter; on a CUDA
//! target (by kernel rows or not) and on WebGPU's binding rules. A family some kernel would bind both
//! written and read falls back to reading the parts, and is as right.

use kiln_graph::conv::Window;
use kiln_graph::ir::{Graph, NodeId, Op};
use kiln_graph::kernel::Access;
use kiln_graph::{capture, compile_graph, interp, CompiledGraph, DType, Target, Tensor, TensorData, TensorSpec};
use std::collections::BTreeSet;

fn data(spec: &TensorSpec, salt: usize) -> TensorData {
    let n: usize = spec.shape.as_concrete().unwrap().iter().product();
    let values = (0..n).map(|i| (((i * 7919 + salt * 104_729) % 2003) as f64 / 1001.0) - 1.0).collect();
    TensorData::from_f64(values, &spec.shape.as_concrete().unwrap(), DType::F32).unwrap()
}

/// A dense block of three layers over `x` `[2, 8, 6, 6]` (growth 8), then its whole concatenation pooled.
fn dense_block(t: &[Tensor]) -> kiln_graph::Result<Vec<Tensor>> {
    let mut features = vec![t[0].relu()?];
    for w in &t[1..] {
        let refs: Vec<&Tensor> = features.iter().collect();
        let h = if refs.len() == 1 { refs[0].clone() } else { Tensor::concat(&refs, 1)? };
        let h = h.mul(0.5)?.relu()?;
        features.push(h.conv(w, None, &Window::uniform(2, 1, 1, 1), 1)?);
    }
    let refs: Vec<&Tensor> = features.iter().collect();
    Ok(vec![Tensor::concat(&refs, 1)?.relu()?.sum(&[2, 3], false)?])
}

fn dense_specs() -> Vec<TensorSpec> {
    let mut specs = vec![TensorSpec::new(DType::F32, &[2, 8, 6, 6])];
    specs.extend((1..4).map(|l| TensorSpec::new(DType::F32, &[8, 8 * l, 3, 3])));
    specs
}

/// Compiles `g` for `target` and checks the interpreted kernels against the reference.
fn check(g: &Graph, specs: &[TensorSpec], target: &Target) -> CompiledGraph {
    let c = compile_graph(g, target).unwrap();
    let inputs: Vec<_> = specs.iter().enumerate().map(|(i, s)| data(s, i)).collect();
    let refs: Vec<_> = inputs.iter().collect();
    let got = &c.run_interpreted(&refs).unwrap()[0];
    let want = &interp::run(g, &refs).unwrap()[0];
    assert_eq!(got.dims(), want.dims());
    let worst =
        got.values().iter().zip(want.values()).map(|(a, b)| (a - b).abs() / (1.0 + b.abs())).fold(0.0, f64::max);
    assert!(worst < 1e-4, "max rel err {worst}\n{c}");
    c
}

/// The concatenations of the compiled graph, and those some kernel binds as one buffer.
fn concats(c: &CompiledGraph) -> (BTreeSet<NodeId>, BTreeSet<NodeId>) {
    let g = &c.primitive.graph;
    let all: BTreeSet<NodeId> =
        (0..g.nodes.len() as u32).map(NodeId).filter(|&n| matches!(g.node(n).op, Op::Concat { .. })).collect();
    let bound = c.kernels.iter().flat_map(|k| &k.buffers).map(|b| b.node).filter(|n| all.contains(n)).collect();
    (all, bound)
}

#[test]
fn every_concatenation_of_a_dense_block_is_assembled_in_place() {
    let specs = dense_specs();
    let g = capture(&specs, dense_block).unwrap();
    let targets = [
        ("cuda", Target { tf32_convolutions: false, ..Target::cuda(90) }),
        ("cuda by rows", Target { tf32_convolutions: false, conv_row_products_bytes: 1, ..Target::cuda(90) }),
        ("webgpu", Target::webgpu_default()),
    ];
    for (name, target) in targets {
        let c = check(&g, &specs, &target);
        let (all, bound) = concats(&c);
        assert_eq!(all.len(), 3, "{name}: one outermost concatenation per join\n{c}");
        assert_eq!(bound, all, "{name}: every concatenation read as one buffer\n{c}");
        // The three products start past the first feature map; the first map and every concatenation at 0.
        assert_eq!(c.plan.value_offset.len(), 3, "{name}: {:?}\n{c}", c.plan.value_offset);
        // One buffer for the family, never the parts' own.
        let family: BTreeSet<usize> = bound.iter().map(|n| c.plan.value_buffer[n]).collect();
        assert_eq!(family.len(), 1, "{name}");
        // The printed plan says where each part lands.
        assert_eq!(c.to_string().matches("  places: ").count(), 3, "{name}\n{c}");
    }
}

#[test]
fn a_family_a_kernel_would_bind_written_and_read_reads_its_parts() {
    // The second part is computed from the first: the kernel writing it would read the family's buffer.
    let specs = [TensorSpec::new(DType::F32, &[2, 4, 4, 4]), TensorSpec::new(DType::F32, &[8, 4, 3, 3])];
    let g = capture(&specs, |t| {
        let a = t[0].conv(&t[1], None, &Window::uniform(2, 1, 1, 1), 1)?;
        let b = a.relu()?.mul(2.0)?;
        Ok(vec![Tensor::concat(&[&a, &b], 1)?.exp()?])
    })
    .unwrap();
    let c = check(&g, &specs, &Target { tf32_convolutions: false, ..Target::cuda(90) });
    assert!(c.plan.value_offset.is_empty(), "{:?}\n{c}", c.plan.value_offset);
    for k in &c.kernels {
        let written: BTreeSet<usize> =
            k.buffers.iter().filter(|b| b.access == Access::Write).map(|b| c.plan.value_buffer[&b.node]).collect();
        let read = k.buffers.iter().filter(|b| b.access == Access::Read).map(|b| c.plan.value_buffer[&b.node]);
        assert!(read.into_iter().all(|b| !written.contains(&b)), "kernel {} reads what it writes\n{c}", k.name);
    }
}

#[test]
fn an_empty_part_is_placed_with_the_others() {
    // Two products joined along their last axis, the second with no columns.
    let specs = [
        TensorSpec::new(DType::F32, &[2, 3, 4]),
        TensorSpec::new(DType::F32, &[4, 8]),
        TensorSpec::new(DType::F32, &[4, 0]),
    ];
    let g = capture(&specs, |t| {
        let (a, b) = (t[0].matmul(&t[1])?, t[0].matmul(&t[2])?);
        Ok(vec![Tensor::concat(&[&a, &b], 2)?.exp()?])
    })
    .unwrap();
    let c = check(&g, &specs, &Target { tf32_convolutions: false, ..Target::cuda(90) });
    let (all, bound) = concats(&c);
    assert_eq!(bound, all, "{c}");
    assert_eq!(c.plan.value_offset.len(), 1, "{c}");
    // The empty part still has room for a window past its offset.
    let sizes = c.buffer_bytes(&Default::default(), |d, n| (n * d.size_bytes()) as u64).unwrap();
    let (n, at) = c.plan.value_offset.iter().next().unwrap();
    let slot = c.plan.value_buffer[n];
    assert!(sizes[slot] > at.as_const().unwrap() as u64 * 4, "{sizes:?} {at}");
}

#[test]
fn a_split_product_is_placed_in_its_concatenation() {
    // A 3 × 3 convolution of 128 channels to 32 over 4 × 4 pixels: 32 × 16 outputs over a depth of 1,152,
    // which WebGPU's template cuts into partial products (`split_k`); their sum is the part placed.
    let specs = [TensorSpec::new(DType::F32, &[1, 128, 4, 4]), TensorSpec::new(DType::F32, &[32, 128, 3, 3])];
    let g = capture(&specs, |t| {
        let h = t[0].relu()?;
        let y = h.conv(&t[1], None, &Window::uniform(2, 1, 1, 1), 1)?;
        Ok(vec![Tensor::concat(&[&h, &y], 1)?.exp()?])
    })
    .unwrap();
    let c = check(&g, &specs, &Target::webgpu_default());
    let p = &c.primitive.graph;
    let sums: Vec<NodeId> =
        (0..p.nodes.len() as u32).map(NodeId).filter(|&n| kiln_graph::split_k::is_partial_sum(p, n)).collect();
    assert_eq!(sums.len(), 1, "the product is split\n{c}");
    let (all, bound) = concats(&c);
    assert_eq!(bound, all, "the concatenation read as one buffer\n{c}");
    assert!(c.plan.value_offset.contains_key(&sums[0]), "the sum lands in the family: {:?}\n{c}", c.plan.value_offset);
    // Whole, the product's kernel would read the family (the convolution's input is its first part) and
    // write it: kept apart on WebGPU. Split, the sum's kernel reads only the partials.
    let whole = check(&g, &specs, &Target { split_k_groups: 0, ..Target::webgpu_default() });
    assert!(whole.plan.value_offset.is_empty(), "{whole}");
}
