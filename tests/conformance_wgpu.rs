//! The conformance suite on wgpu. In CI it runs on lavapipe (Mesa's CPU Vulkan driver); on the lent GPU
//! on NVIDIA Vulkan. With no adapter it fails saying what to install — unless KILN_WGPU_TESTS=skip says,
//! explicitly, that this machine has none.

mod common;
mod conformance;

fn wgpu() -> Option<std::sync::Arc<dyn kiln::graph::Backend>> {
    if common::wgpu_skipped() {
        return None;
    }
    use kiln::graph::IntoBackend;
    match kiln::Backend::Wgpu.into_backend() {
        Ok(b) => Some(b),
        Err(e) => panic!("{e}"),
    }
}

conformance_suite!(backend = wgpu(), random_cases = 2_000, big = true, ieee_nan = false);

#[test]
fn reports_the_adapter() {
    let Some(_) = wgpu() else { return };
    let rt = kiln::Backend::Wgpu.runtime().unwrap().expect("wgpu has a runtime");
    eprintln!("wgpu adapter: {}", rt.driver().describe());
}

/// Where the adapter has subgroups of one fixed size, `graph` is told it and row combines shuffle within
/// subgroups (the rest of this suite then runs them: every op, the edge cases, random graphs). Lavapipe
/// (CI) has them, 8 lanes, so CI runs the subgroup shaders; `KILN_WGPU_LIMITS=webgpu`
/// (`conformance_wgpu_limits`) runs the shared-memory tree.
#[test]
fn row_combines_shuffle_within_subgroups_where_the_adapter_has_them() {
    let Some(_) = wgpu() else { return };
    let rt = kiln::Backend::Wgpu.runtime().unwrap().expect("wgpu has a runtime");
    let (target, adapter) = (rt.target().clone(), rt.driver().describe());
    if adapter.contains("llvmpipe") {
        assert_eq!(target.subgroup_size, Some(8), "{adapter}");
    }
    let Some(s) = target.subgroup_size else {
        eprintln!("{adapter}: no fixed subgroup size, the shared-memory tree only");
        return;
    };
    kiln::register_renderers();
    let x = kiln::Tensor::from_data(
        kiln::TensorData::from_f64(
            (0..64 * 512).map(|i| f64::from(i % 97) / 7.0).collect(),
            &[64, 512],
            kiln::DType::F32,
        )
        .unwrap(),
    );
    let f = kiln::compile(|x: &kiln::Tensor| x.softmax(-1)).backend(kiln::Backend::Wgpu);
    let y = f.call(&x).unwrap();
    let sums: Vec<f32> = y.sum(&[1], false).unwrap().to_vec().unwrap();
    assert!(sums.iter().all(|v| (v - 1.0).abs() < 1e-5), "{sums:?}");
    let report = f.report().to_json();
    assert!(report.contains("subgroupShuffleXor"), "subgroups of {s} on {adapter}, but no shuffle in {report}");
}

/// Rows with lanes are wgpu's default plan (`Target::vector_rows`): W2's softmax and W3's layer norm keep
/// four consecutive f32 elements a thread and bind their rows' buffers as vectors, so the rest of this
/// suite (every op, the edge cases, random programs, the workloads) runs that mapping. Rows without lanes
/// run in `conformance_wgpu_rows`.
#[test]
fn rows_move_as_vectors_by_default() {
    let Some(_) = wgpu() else { return };
    let rt = kiln::Backend::Wgpu.runtime().unwrap().expect("wgpu has a runtime");
    assert!(rt.target().vector_rows, "{}", rt.driver().describe());
    let mut vector_rows = 0;
    for w in kiln::graph::workloads::all().into_iter().filter(|w| ["W2", "W3"].contains(&w.id)) {
        let g = kiln::graph::capture(&w.check, w.f).unwrap();
        for k in kiln::graph::compile_graph(&g, rt.target()).unwrap().kernels.iter().filter(|k| k.row_lanes == 4) {
            vector_rows += 1;
            let src = kiln_wgsl::render(k, false).unwrap().source;
            assert!(src.contains("array<vec4<f32>>"), "{} binds no vector buffer:\n{src}", k.name);
        }
    }
    assert!(vector_rows >= 2, "only {vector_rows} kernels of W2 and W3 planned four-lane rows");
}

/// A tensor near the adapter's storage-binding limit (128 MiB on lavapipe): just below it runs (the
/// pooled buffer is larger, only the used range is bound), just above it is a typed error naming the
/// limit on adapters that have one that small, never a driver panic.
#[test]
fn tensors_at_the_binding_limit() {
    let Some(b) = wgpu() else { return };
    let f = kiln::graph::compile(|x: &kiln::graph::Tensor| x.mul(2.0)).backend(b);
    for n in [(1usize << 25) - 64, (1 << 25) + 16] {
        let x = kiln::graph::Tensor::from_slice(&vec![1.5f32; n], &[n]).unwrap();
        match f.call(&x) {
            Ok(y) => {
                let v: Vec<f32> = y.to_vec().unwrap();
                assert_eq!(v.len(), n);
                assert!(v[0] == 3.0 && v[n / 2] == 3.0 && v[n - 1] == 3.0);
            }
            Err(kiln::Error::OutOfMemory { limit: Some(l), bytes, .. }) => {
                assert!(n > 1 << 25 && bytes > l, "{n} elements should fit: {bytes} bytes vs limit {l}");
            }
            Err(e) => panic!("{n} elements: {e}"),
        }
    }
}

/// A fused concat whose other side is never read at the point computed folds that side's index to a
/// negative constant (`x[0 - 1]`, guarded off): it must still render (naga rejects constant negative
/// indices) and give the value of the side that is read.
#[test]
fn a_concat_whose_other_side_is_dead_renders() {
    let Some(backend) = wgpu() else { return };
    let x = kiln::Tensor::from_slice(&[0.5f32], &[1]).unwrap();
    let f = kiln::compile(|x: &kiln::Tensor| kiln::Tensor::concat(&[x, x], 0)?.narrow(0, 0, 1)?.sin()).backend(backend);
    let y: kiln::Tensor = f.call(&x).unwrap();
    assert!((y.to_vec::<f32>().unwrap()[0] - 0.5f32.sin()).abs() < 1e-6);
}

/// The 3·2^30-element tensors of the CUDA test on wgpu: the reference's values, or a typed error naming
/// the adapter's binding or buffer limit where one 12 GiB tensor exceeds it. Ignored by default: it needs
/// a GPU with tens of GiB (`--include-ignored` on the GPU machine runs it).
#[test]
#[ignore = "needs a GPU with 48 GiB free: run with --include-ignored on the GPU machine"]
fn tensors_of_three_times_two_to_the_30_elements_or_a_limit_error() {
    let Some(b) = wgpu() else { return };
    match conformance::user_cases::three_times_two_to_the_30(&b) {
        Ok(()) => eprintln!("wgpu held 12 GiB tensors and matched the reference"),
        Err(kiln::Error::OutOfMemory { limit: Some(limit), what, .. }) => {
            eprintln!("wgpu refused: {what}, limit {limit} bytes");
            assert!(limit < (3u64 << 32), "a refusal names a limit below the 12 GiB asked for");
        }
        Err(e) => panic!("neither the reference's values nor a limit error: {e}"),
    }
}

/// The suite's products ran with two stages of operand tiles (`Target::matmul_stages`): every adapter
/// kiln meets (lavapipe, NVIDIA's and AMD's Vulkan drivers) holds two of the large tile's 8.25 KiB in
/// its workgroup memory, and a product that takes the large tile is planned with two for it; the
/// WebGPU-limits suite (`conformance_wgpu_limits`) runs the large and medium tiles with one.
#[test]
fn the_adapter_plans_two_stages_of_the_large_tile() {
    use kiln::graph::kernel::Stmt;
    use kiln::graph::{capture, compile_graph, DType, TensorSpec};
    let Some(b) = wgpu() else { return };
    if std::env::var("KILN_WGPU_MATMUL_STAGES").is_ok() || std::env::var("KILN_WGPU_LIMITS").is_ok() {
        eprintln!("KILN_WGPU_MATMUL_STAGES or KILN_WGPU_LIMITS set: the default plan is not what runs");
        return;
    }
    let target = b.target().expect("a wgpu target").clone();
    let specs = [TensorSpec::new(DType::F32, &[4096, 64]), TensorSpec::new(DType::F32, &[64, 4096])];
    let c = compile_graph(&capture(&specs, |t| Ok(vec![t[0].matmul(&t[1])?])).unwrap(), &target).unwrap();
    let tiles: Vec<_> = c
        .kernels
        .iter()
        .flat_map(|k| &k.body)
        .filter_map(|st| match st {
            Stmt::MatMul(m) => Some(m.tile),
            _ => None,
        })
        .collect();
    assert!(
        tiles.iter().any(|t| (t.m, t.n, t.stages) == (128, 128, 2)),
        "{tiles:?} with {} KiB of workgroup memory",
        target.shared_memory_bytes / 1024
    );
}

/// WGSL computes i64 and u64 in 32 bits: a tensor holding a value past that width is a typed error when
/// it goes to the device, not a silently wrapped result; values within it run.
#[test]
fn wide_integers_past_32_bits_are_typed_errors() {
    let Some(_) = wgpu() else { return };
    let f = kiln::compile(|x: &kiln::Tensor| x.add(1)).backend(kiln::Backend::Wgpu);
    for (d, fits, past) in
        [(kiln::DType::I64, -2_147_483_648.0, 2_147_483_648.0), (kiln::DType::U64, 4_294_967_295.0, 4_294_967_296.0)]
    {
        let t = |v: f64| kiln::Tensor::from_data(kiln::TensorData::from_f64(vec![3.0, v], &[2], d).unwrap());
        let y = f.call(&t(fits)).unwrap().to_data().unwrap();
        assert_eq!(y.values()[0], 4.0, "{d}");
        let e = f.call(&t(past)).unwrap_err();
        assert!(matches!(e, kiln::Error::Unsupported { .. }), "{d}: {e}");
        let msg = e.to_string();
        assert!(msg.contains(&format!("a {d} tensor holding {past} (element 1)")) && msg.contains("32 bits"), "{msg}");
    }
}
