//! The kernel-IR validator (`validate`): every kernel of every workload passes it for every target, and
//! a schedule a device cannot run is rejected with the rule it breaks.

use kiln_graph::kernel::{Kernel, Stmt};
use kiln_graph::validate::validate;
use kiln_graph::workloads::{self, f32s};
use kiln_graph::{capture, compile_graph, Result, Target, Tensor, TensorSpec};

fn kernel(spec: TensorSpec, f: fn(&[Tensor]) -> Result<Vec<Tensor>>, target: &Target) -> Kernel {
    let c = compile_graph(&capture(&[spec], f).unwrap(), target).unwrap();
    assert_eq!(c.kernels.len(), 1, "{c}");
    c.kernels[0].clone()
}

fn row_sums(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].sum(&[1], false)?])
}

fn row_argmax(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].argmax(1, false)?])
}

fn rejected(k: &Kernel, target: &Target, words: &str) {
    let e = validate(k, target).expect_err("a bad schedule");
    assert!(e.to_string().contains(words), "{e}");
    assert!(e.to_string().contains(&k.name), "{e}");
}

/// `compile_graph` validates every kernel it lowers: every workload compiles for every target, so no
/// schedule `graph` chooses breaks a rule; and a kernel moved to a target that cannot run it does.
#[test]
fn every_workloads_kernels_pass_and_fail_where_they_cannot_run() {
    for target in [Target::cuda(90), Target::webgpu_default(), Target::interpreter()] {
        for w in workloads::all().into_iter().filter(|w| w.id != "W6") {
            if let Err(e) = compile_graph(&capture(&w.quick, w.f).unwrap(), &target) {
                panic!("{} on {}: {e}", w.id, target.name);
            }
        }
    }
    let w = workloads::all().into_iter().find(|w| w.id == "W5-bf16").expect("W5-bf16");
    let c = compile_graph(&capture(&w.quick, w.f).unwrap(), &Target::cuda(90)).unwrap();
    let tight = Target { max_threads_per_group: 64, ..Target::cuda(90) };
    assert!(
        c.kernels.iter().any(|k| validate(k, &tight).is_err()),
        "kernels of CUDA's 128 and 256 threads on a 64-thread target"
    );
}

#[test]
fn packed_groups_without_subgroups_are_rejected() {
    let mut k = kernel(f32s(&[300, 64]), row_sums, &Target::cuda(90));
    assert_eq!(k.launch.packed, 8, "{k}");
    rejected(&k, &Target::webgpu_default(), "subgroup");
    k.launch.threads = 64;
    rejected(&k, &Target::cuda(90), "subgroup");
}

/// Row sums on CUDA keep four f32 lanes a slot group; moved to a target without vector
/// rows, or given lanes that do not divide its slots, the kernel is rejected.
#[test]
fn rows_with_lanes_are_checked() {
    let mut k = kernel(f32s(&[64, 4096]), row_sums, &Target::cuda(90));
    assert_eq!((k.row_lanes, k.row_cache), (4, Some(16)), "{k}");
    validate(&k, &Target::cuda(90)).unwrap();
    rejected(&k, &Target { vector_rows: false, ..Target::cuda(90) }, "without vector rows");
    k.row_lanes = 32;
    rejected(&k, &Target::cuda(90), "not whole vectors");
    k.row_lanes = 8;
    rejected(&k, &Target { max_vector_lanes: 4, ..Target::cuda(90) }, "past the target's 4");
}

/// The first reduction's strategy, wherever it is nested.
fn first_strategy(body: &mut [Stmt]) -> Option<&mut kiln_graph::kernel::ReduceStrategy> {
    body.iter_mut().find_map(|st| match st {
        Stmt::Reduce { strategy, .. } => Some(strategy),
        Stmt::Loop { body, .. } => first_strategy(body),
        _ => None,
    })
}

/// `graph` decides which combines shuffle (renderers print it): a row sum on CUDA shuffles in warps, a
/// row argmax combines through workgroup memory, and a shuffle the target or the op cannot take is
/// rejected before rendering.
#[test]
fn subgroup_shuffles_are_planned_in_graph_and_checked() {
    use kiln_graph::kernel::ReduceStrategy::Group;
    let cuda = Target::cuda(90);
    let mut sums = kernel(f32s(&[8, 4096]), row_sums, &cuda);
    assert_eq!(first_strategy(&mut sums.body).copied(), Some(Group { subgroup: Some(32) }), "{sums}");
    let mut argmax = kernel(f32s(&[8, 4096]), row_argmax, &cuda);
    assert_eq!(first_strategy(&mut argmax.body).copied(), Some(Group { subgroup: None }), "{argmax}");
    *first_strategy(&mut argmax.body).unwrap() = Group { subgroup: Some(32) };
    rejected(&argmax, &cuda, "shuffled");
    *first_strategy(&mut sums.body).unwrap() = Group { subgroup: Some(64) };
    rejected(&sums, &cuda, "subgroups of 64");
}

#[test]
fn packed_groups_that_would_meet_at_a_barrier_are_rejected() {
    let mut k = kernel(f32s(&[300, 64]), row_argmax, &Target::cuda(90));
    assert_eq!(k.launch.packed, 1, "{k}");
    k.launch.packed = 8;
    rejected(&k, &Target::cuda(90), "barrier");
}

#[test]
fn thread_counts_a_combine_or_the_device_cannot_take_are_rejected() {
    let mut k = kernel(f32s(&[300, 1000]), row_sums, &Target::webgpu_default());
    assert!(k.body.iter().any(|s| matches!(s, Stmt::Loop { .. })), "{k}");
    k.launch.threads = 48;
    rejected(&k, &Target::webgpu_default(), "power of two");
    k.launch.threads = 512;
    rejected(&k, &Target::webgpu_default(), "past the target's 256");
}

fn attention(t: &[Tensor]) -> Result<Vec<Tensor>> {
    let q = t[0].narrow(-1, 0, 64)?;
    let k = t[0].narrow(-1, 64, 64)?;
    let v = t[0].narrow(-1, 128, 64)?;
    let w = q.matmul(&k.transpose(-1, -2)?)?.mul(0.125)?.causal_mask()?.softmax(-1)?;
    Ok(vec![w.matmul(&v)?])
}

#[test]
fn attention_tiles_past_the_shared_memory_budget_are_rejected() {
    let spec = TensorSpec::new(kiln_graph::DType::BF16, &[2, 128, 192]);
    let c = compile_graph(&capture(&[spec], attention).unwrap(), &Target::cuda(90)).unwrap();
    let mut k = c.kernels.iter().find(|k| matches!(k.body.as_slice(), [Stmt::Attention(_)])).expect("fused").clone();
    assert_eq!(validate(&k, &Target::cuda(90)), Ok(()));
    let Stmt::Attention(a) = &mut k.body[0] else { unreachable!() };
    assert_eq!((a.tile.keys, a.tile.stages), (64, 2));
    a.tile.vector = 1;
    rejected(&k, &Target::cuda(90), "16-byte pieces");
    let Stmt::Attention(a) = &mut k.body[0] else { unreachable!() };
    (a.tile.vector, a.tile.keys) = (8, 128);
    rejected(&k, &Target::cuda(90), "shared memory");
}

/// An f32 attention on WGSL's target runs on lanes, one query a thread, within WebGPU's 16 KiB of
/// workgroup memory, its rows read 4 elements a load; a chunk that does not divide the tile, a
/// gradient pass or more key tiles than fit are rejected.
#[test]
fn attention_on_lanes_is_checked_like_any_schedule() {
    use kiln_graph::kernel::{AttentionPass, AttentionUnits};
    let web = Target::webgpu_default();
    let c = compile_graph(&capture(&[f32s(&[2, 128, 192])], attention).unwrap(), &web).unwrap();
    let mut k = c.kernels.iter().find(|k| matches!(k.body.as_slice(), [Stmt::Attention(_)])).expect("fused").clone();
    assert_eq!(validate(&k, &web), Ok(()));
    assert_eq!(k.launch.threads, 128, "{k}");
    let Stmt::Attention(a) = &mut k.body[0] else { unreachable!() };
    assert_eq!((a.tile.units, a.tile.keys, a.tile.chunk, a.tile.vector), (AttentionUnits::Lanes, 32, 4, 4));
    a.tile.chunk = 12;
    rejected(&k, &web, "chunks dividing");
    let Stmt::Attention(a) = &mut k.body[0] else { unreachable!() };
    (a.tile.chunk, a.pass) = (4, AttentionPass::Lse);
    rejected(&k, &web, "forward pass");
    let Stmt::Attention(a) = &mut k.body[0] else { unreachable!() };
    (a.pass, a.tile.keys) = (AttentionPass::Forward, 64);
    rejected(&k, &web, "shared memory");
}

fn square(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].matmul(&t[0])?])
}

/// The matmul template's schedule is `graph`'s: a large product takes the large tile on a WebGPU target,
/// and a tile that does not split over the workgroup's threads, or takes more workgroup memory than the
/// target has, is rejected.
#[test]
fn matmul_schedules_that_do_not_split_or_fit_are_rejected() {
    let target = Target { matmul_tile: 128, ..Target::webgpu_default() };
    let k = kernel(f32s(&[2048, 2048]), square, &target);
    let Some(Stmt::MatMul(m)) = k.body.iter().find(|s| matches!(s, Stmt::MatMul(_))) else {
        panic!("a matmul template: {k}")
    };
    assert_eq!((m.tile.m, m.tile.n, m.tile.threads, m.tile.run), (128, 128, [16, 16], 4), "{k}");
    assert_eq!(k.launch.threads, 256);
    validate(&k, &target).unwrap();
    let mut odd = k.clone();
    let Some(Stmt::MatMul(m)) = odd.body.iter_mut().find(|s| matches!(s, Stmt::MatMul(_))) else { unreachable!() };
    m.tile.threads = [8, 32];
    m.tile.n = 100;
    rejected(&odd, &target, "does not split");
    rejected(&k, &Target { shared_memory_bytes: 4096, ..target.clone() }, "workgroup memory");
    // A cap on the tile (`KILN_WGPU_MATMUL_TILE`) keeps products at the medium one.
    let capped = kernel(f32s(&[2048, 2048]), square, &Target { matmul_tile: 64, ..target.clone() });
    let Some(Stmt::MatMul(m)) = capped.body.iter().find(|s| matches!(s, Stmt::MatMul(_))) else { panic!("{capped}") };
    assert_eq!(m.tile.m, 64);
    // A transformer's projection (4096 tokens × 768 features) makes 192 large tiles, too few for a large
    // GPU: 384 half ones, 128 × 64, which validate too.
    let projection = kernel(f32s(&[4096, 768]), projection, &target);
    let Some(Stmt::MatMul(m)) = projection.body.iter().find(|s| matches!(s, Stmt::MatMul(_))) else {
        panic!("{projection}")
    };
    assert_eq!((m.tile.m, m.tile.n, m.tile.per_thread()), (128, 64, [8, 4]), "{projection}");
    validate(&projection, &target).unwrap();
}

/// `x · wᵀ` with `w` the first 768 rows of `x`: a 768-wide linear layer over `x`'s rows.
fn projection(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].matmul(&t[0].narrow(0, 0, 768)?.transpose(0, 1)?)?])
}

fn x_wt(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].matmul(&t[0].transpose(0, 1)?)?])
}

fn xt_x(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].transpose(0, 1)?.matmul(&t[0])?])
}

/// Each operand's tile is read along the axis its loads are contiguous in: a linear layer's `x · wᵀ`
/// reads both operands depth-fastest, a weight gradient's `xᵀ · dy` both the other way.
#[test]
fn matmul_operands_are_read_along_their_contiguous_axis() {
    // One product whole: 256 × 256 over 256 makes 16 workgroups, which split-K would cut (`split_k`).
    let target = Target { split_k_groups: 0, ..Target::webgpu_default() };
    for (f, want) in
        [(x_wt as fn(&[Tensor]) -> Result<Vec<Tensor>>, [true, true]), (xt_x, [false, false]), (square, [true, false])]
    {
        let k = kernel(f32s(&[256, 256]), f, &target);
        let Some(Stmt::MatMul(m)) = k.body.iter().find(|s| matches!(s, Stmt::MatMul(_))) else { panic!("{k}") };
        assert_eq!(m.tile.depth_fastest, want, "{k}");
    }
}
