//! Fused attention: which written-out attentions become one `Attention` kernel (decided in `graph` from the
//! target and the graph), how its operands are read in place, and that the template computes what the
//! written-out form does (through the kernel interpreter, against the f64 reference).

use kiln_graph::kernel::{Attention, AttentionTile, AttentionUnits, Stmt};
use kiln_graph::tolerance::{compare, Expected, Tolerance};
use kiln_graph::workloads::data;
use kiln_graph::{capture, compile_graph, interp, CompiledGraph, DType, Graph, Result, Target, Tensor, TensorSpec};

fn attentions(c: &CompiledGraph) -> Vec<&Attention> {
    c.kernels
        .iter()
        .filter_map(|k| match k.body.as_slice() {
            [Stmt::Attention(a)] => Some(&**a),
            _ => None,
        })
        .collect()
}

/// Compiles `f` for `target`, runs it through the kernel interpreter and checks it against the f64
/// reference of the traced (written-out) graph under kiln's tolerance rule (`tolerance`).
fn checked(specs: &[TensorSpec], f: fn(&[Tensor]) -> Result<Vec<Tensor>>, target: &Target) -> CompiledGraph {
    checked_graph(&capture(specs, f).unwrap(), specs, target)
}

/// [`checked`] for a graph already built (a joint forward and backward graph).
fn checked_graph(g: &Graph, specs: &[TensorSpec], target: &Target) -> CompiledGraph {
    let c = compile_graph(g, target).unwrap();
    let inputs: Vec<_> = specs.iter().enumerate().map(|(i, s)| data(s, i)).collect();
    let refs: Vec<_> = inputs.iter().collect();
    let got = c.run_interpreted(&refs).unwrap();
    let want = interp::run_unrounded(g, &refs).unwrap();
    let tol = Tolerance::of(g).unwrap();
    for (g, w) in got.iter().zip(&want) {
        let outcome = compare(g, &Expected::of(w, "reference"), tol);
        assert!(outcome.correct, "{outcome:?}\n{c}");
    }
    c
}

/// W5's attention: q, k, v split from one projection, heads permuted out, scaled, causal.
fn gpt_attention(t: &[Tensor]) -> Result<Vec<Tensor>> {
    let (b, s, heads, hd) = (2isize, 40isize, 2isize, 32isize);
    let split = |i: usize| -> Result<Tensor> {
        t[0].narrow(-1, i * (heads * hd) as usize, (heads * hd) as usize)?
            .reshape(&[b, s, heads, hd])?
            .permute(&[0, 2, 1, 3])
    };
    let (q, k, v) = (split(0)?, split(1)?, split(2)?);
    let w = q.matmul(&k.transpose(-1, -2)?)?.mul(1.0 / (hd as f64).sqrt())?.causal_mask()?.softmax(-1)?;
    Ok(vec![w.matmul(&v)?.permute(&[0, 2, 1, 3])?.reshape(&[b, s, heads * hd])?])
}

fn qkv_spec(dtype: DType) -> [TensorSpec; 1] {
    [TensorSpec::new(dtype, &[2, 40, 3 * 2 * 32])]
}

#[test]
fn gpts_attention_is_one_kernel_reading_the_projection_in_place() {
    let c = checked(&qkv_spec(DType::BF16), gpt_attention, &Target::cuda(90));
    let a = attentions(&c);
    assert_eq!(a.len(), 1, "{c}");
    let a = a[0];
    // The scale as the written-out form multiplies by it: a bf16 constant.
    assert!(a.causal && a.scale == DType::BF16.round(1.0 / 32f64.sqrt()), "{}", a.scale);
    assert_eq!((a.head_dim, a.value_dim, a.q_len.as_const(), a.kv_len.as_const()), (32, 32, Some(40), Some(40)));
    // q, k and v are rows of the one projection buffer (row stride 192), at offsets 0, 64 and 128.
    assert_eq!([&a.q, &a.k, &a.v].map(|o| o.buffer), [a.q.buffer; 3]);
    assert_eq!(
        [&a.q, &a.k, &a.v].map(|o| (o.offset.as_const(), o.ld.as_const())),
        [(Some(0), Some(192)), (Some(64), Some(192)), (Some(128), Some(192))]
    );
    // Heads stride 32 elements and batches 40 rows, both multiples of 8: 16-byte loads.
    assert_eq!(a.batch.len(), 2);
    assert_eq!((a.batch[1].q.as_const(), a.batch[0].q.as_const()), (Some(32), Some(40 * 192)));
    // ... and two stages of key and value tiles, the next copied while the current one is used.
    assert_eq!((a.tile.vector, a.tile.stages), (8, 2));
    // Heads go back into rows as the kernel writes them: the permute after the attention is its stored
    // value (row stride heads × hd = 64, heads 32 apart, batches 40 rows), and the reshape of it is the
    // only other kernel (it writes the graph's output). Nothing 40 × 40 is stored.
    assert_eq!(
        (a.out.ld.as_const(), a.batch[1].out.as_const(), a.batch[0].out.as_const()),
        (Some(64), Some(32), Some(40 * 64))
    );
    assert_eq!(c.kernels.len(), 2, "{c}");
    assert!(c.fusion.regions[0].name.contains("attention_permute"), "{c}");
    assert!(c.kernels.iter().all(|k| k.buffers.iter().all(|b| b.len.as_const() != Some(2 * 2 * 40 * 40))), "{c}");
    assert!(c.kernels[0].name.contains("attention"), "{}", c.kernels[0].name);
}

/// [`gpt_attention`]'s output weighted by a second input and summed: a loss to differentiate.
fn gpt_attention_loss(t: &[Tensor]) -> Result<Vec<Tensor>> {
    let out = gpt_attention(&t[..1])?.remove(0);
    Ok(vec![out.mul(&t[1])?.sum(&[0, 1, 2], false)?])
}

#[test]
fn a_training_steps_attention_is_three_kernels_each_writing_what_it_shares() {
    use kiln_graph::ir::AttentionPart;
    use kiln_graph::kernel::AttentionPass;
    let specs = [qkv_spec(DType::BF16)[0].clone(), TensorSpec::new(DType::BF16, &[2, 40, 2 * 32])];
    let joint = kiln_graph::autodiff::grad_graph(&capture(&specs, gpt_attention_loss).unwrap(), &[0]).unwrap();
    let c = checked_graph(&joint, &specs, &Target::cuda(90));
    let a = attentions(&c);
    let pass = |p: AttentionPass| a.iter().copied().find(|a| a.pass == p).unwrap_or_else(|| panic!("no {p:?}: {c}"));
    // The forward writes each query's log-sum-exp beside its output; the queries' gradient is a kernel of
    // its own; the keys' and values' gradients come out of one kernel.
    assert_eq!(a.len(), 3, "{c}");
    let [fwd, dq, dk] =
        [AttentionPass::Forward, AttentionPass::Grad(AttentionPart::Queries), AttentionPass::Grad(AttentionPart::Keys)]
            .map(pass);
    assert_eq!([&fwd.second, &dq.second, &dk.second].map(Option::is_some), [true, false, true], "{c}");
    // Both outputs of the keys' kernel are stored as the permutes that put heads back into rows, as the
    // queries' gradient is (row stride heads × hd = 64). So is the forward's output, although the
    // backward reads it too (its `delta`): that reader reads the permute back through the inverse view,
    // so no kernel copies the output into the layout the projection reads.
    assert!([fwd, dq, dk].iter().all(|a| a.out.ld.as_const() == Some(64)), "{c}");
    let copies = c.fusion.regions.iter().filter(|r| r.members.iter().all(|&m| joint_op(&c, m) == "permute"));
    assert_eq!(copies.count(), 0, "{c}");
    assert_eq!(dk.second.as_ref().and_then(|o| o.ld.as_const()), Some(64), "{c}");
    // Causal passes that own queries take their blocks last first (those have the most keys); the keys'
    // pass, whose first blocks have the most queries, first first.
    assert_eq!([fwd, dq, dk].map(|a| a.last_blocks_first), [true, true, false], "{c}");
    // The log-sum-exps are one f32 a query, in rows of one.
    assert_eq!(fwd.second.as_ref().and_then(|o| o.ld.as_const()), Some(1), "{c}");
}

/// The name of the op of primitive node `m` of `c`.
fn joint_op(c: &CompiledGraph, m: kiln_graph::ir::NodeId) -> &'static str {
    c.primitive.graph.node(m).op.name()
}

#[test]
fn attention_stays_written_out_where_the_target_or_dtype_does_not_fit() {
    // f32 on a target without an f32 template (its renderer has neither lanes nor registers), and bf16 on
    // a device without matrix units.
    let plain = Target { register_attention: None, ..Target::cuda(90) };
    let f32 = checked(&qkv_spec(DType::F32), gpt_attention, &plain);
    assert!(attentions(&f32).is_empty(), "{f32}");
    let web = checked(&qkv_spec(DType::BF16), gpt_attention, &Target::webgpu_default());
    assert!(attentions(&web).is_empty(), "{web}");
    // The eager baseline runs the ops as written.
    let g = capture(&qkv_spec(DType::BF16), gpt_attention).unwrap();
    let eager = kiln_graph::compile_graph_with(&g, &Target::cuda(90), kiln_graph::FusionMode::PerOp).unwrap();
    assert!(attentions(&eager).is_empty());
}

#[test]
fn f32_attention_on_cuda_is_one_kernel_on_registers() {
    // GPT's heads read in place out of the projection (rows 16-byte aligned: 16-byte loads), through the
    // kernel interpreter against the reference.
    let c = checked(&qkv_spec(DType::F32), gpt_attention, &Target::cuda(90));
    let a = attentions(&c);
    assert_eq!(a.len(), 1, "{c}");
    assert_eq!(a[0].tile.units, AttentionUnits::Registers, "{c}");
    assert_eq!((a[0].tile.rows(), a[0].tile.keys, a[0].tile.vector), (64, 64, 4), "{c}");
    assert!(a[0].tile.registers_unfit(32, 32).is_none());
    // The layout both renderers print: a thread's keys, two 4-key vectors half a tile apart, and its
    // output columns, 4-column vectors 32 apart where the row allows, else consecutive columns.
    assert_eq!(a[0].tile.register_keys(), [0, 1, 2, 3, 32, 33, 34, 35]);
    let cols = |dv| {
        let c = AttentionTile::register_columns(dv);
        (c.stride, c.offsets.clone(), c.width, c.count())
    };
    assert_eq!(cols(64), (4, vec![0, 32], 4, 8));
    assert_eq!(cols(48), (6, vec![0, 2, 4], 2, 6));
    assert_eq!(cols(24), (3, vec![0, 1, 2], 1, 3));
    // A head dim past the template's registers stays written out; an unaligned one loads 4 bytes at a time.
    let f32_specs = |tq: usize, tk: usize, d: usize, dv: usize| {
        [[3, tq, d], [3, tk, d], [3, tk, dv]].map(|dims| TensorSpec::new(DType::F32, &dims))
    };
    let wide = checked(&f32_specs(20, 20, 128, 128), variants, &Target::cuda(90));
    assert!(attentions(&wide).is_empty(), "{wide}");
    // Both variants (causal and scaled; neither), more keys than queries, a head dim of three vectors.
    let odd = checked(&f32_specs(20, 70, 12, 24), variants, &Target::cuda(90));
    let a = attentions(&odd);
    assert_eq!(a.len(), 2, "{odd}");
    for a in a {
        assert_eq!((a.tile.units, a.tile.vector, a.tile.chunk), (AttentionUnits::Registers, 4, 4), "{odd}");
    }
}

fn heads(t: &[Tensor]) -> [Tensor; 3] {
    [t[0].clone(), t[1].clone(), t[2].clone()]
}

/// Mask before scale, the scale a division, no causal mask on the second output.
fn variants(t: &[Tensor]) -> Result<Vec<Tensor>> {
    let [q, k, v] = heads(t);
    let kt = k.transpose(-1, -2)?;
    let a = q.matmul(&kt)?.causal_mask()?.div(4.0)?.softmax(-1)?.matmul(&v)?;
    let b = q.matmul(&k.transpose(-1, -2)?)?.softmax(-1)?.matmul(&v)?;
    Ok(vec![a, b])
}

fn att_specs(tq: usize, tk: usize, d: usize, dv: usize) -> [TensorSpec; 3] {
    [
        TensorSpec::new(DType::F16, &[3, tq, d]),
        TensorSpec::new(DType::F16, &[3, tk, d]),
        TensorSpec::new(DType::F16, &[3, tk, dv]),
    ]
}

#[test]
fn scale_and_mask_in_either_order_and_unmasked_attention_fuse() {
    // Rows past one tile, fewer keys than queries, a value dim unlike the head dim.
    let c = checked(&att_specs(70, 33, 16, 48), variants, &Target::cuda(80));
    let a = attentions(&c);
    assert_eq!(a.len(), 2, "{c}");
    assert!(a.iter().any(|a| a.causal && a.scale == 0.25), "{c}");
    assert!(a.iter().any(|a| !a.causal && a.scale == 1.0), "{c}");
}

/// The probabilities are an output too: they must be stored, so nothing fuses.
fn probabilities_read_twice(t: &[Tensor]) -> Result<Vec<Tensor>> {
    let [q, k, v] = heads(t);
    let p = q.matmul(&k.transpose(-1, -2)?)?.softmax(-1)?;
    Ok(vec![p.matmul(&v)?, p])
}

/// A softmax over the wrong axis, and a score matrix that is not `q @ kᵀ`.
fn not_attention(t: &[Tensor]) -> Result<Vec<Tensor>> {
    let [q, k, v] = heads(t);
    let s = q.matmul(&k.transpose(-1, -2)?)?;
    let wrong_axis = s.softmax(-2)?.matmul(&v)?;
    let no_transpose = q.matmul(&k.transpose(-1, -2)?)?.add(1.0)?.softmax(-1)?.matmul(&v)?;
    Ok(vec![wrong_axis, no_transpose])
}

#[test]
fn only_attention_whose_intermediates_nothing_else_reads_fuses() {
    let specs = att_specs(24, 24, 16, 16);
    let c = checked(&specs, probabilities_read_twice, &Target::cuda(90));
    assert!(attentions(&c).is_empty(), "{c}");
    let c = checked(&specs, not_attention, &Target::cuda(90));
    assert!(attentions(&c).is_empty(), "{c}");
}

#[test]
fn head_dims_the_template_cannot_hold_stay_written_out() {
    // 24 is not a multiple of 16; 144 is past the register budget.
    for d in [24, 144] {
        let g = capture(&att_specs(16, 16, d, 16), variants).unwrap();
        let c = compile_graph(&g, &Target::cuda(90)).unwrap();
        assert!(attentions(&c).is_empty(), "d {d}: {c}");
    }
    let c = checked(&att_specs(16, 16, 128, 128), variants, &Target::cuda(90));
    let a = attentions(&c);
    assert_eq!(a.len(), 2, "{c}");
    assert!(a.iter().all(|a| a.tile.keys == 32 && a.tile.shared_bytes(128, 128) <= 48 * 1024), "{c}");
}
