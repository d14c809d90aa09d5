//! W1, softmax, layer norm, matmul and argmax at small sizes on wgpu, against the reference.

use kiln_graph::{compile, CpuReference, Tensor};
use kiln_wgsl::WgpuBackend;

#[test]
fn workloads_match_the_reference_on_wgpu() {
    let backend = WgpuBackend::new().unwrap();
    eprintln!("adapter: {}", backend.gpu().describe());
    let x = Tensor::from_slice(&(0..1000).map(|i| (i as f32 - 500.0) / 100.0).collect::<Vec<_>>(), &[10, 100]).unwrap();
    let f = |x: &Tensor| -> kiln_graph::Result<Vec<Tensor>> {
        let w1 = x.mul(1.5)?.add(0.5)?.gelu()?.mul(&x.sigmoid()?)?.sub(&x.tanh()?)?;
        Ok(vec![
            w1,
            x.softmax(-1)?,
            x.layer_norm(1, None, None, 1e-5)?,
            x.matmul(&x.transpose(0, 1)?)?,
            x.argmax(1, false)?.cast(kiln_graph::DType::F32)?,
        ])
    };
    let got = compile(f).backend(backend).call(&x).unwrap();
    let want = compile(f).backend(CpuReference).call(&x).unwrap();
    for (g, w) in got.iter().zip(&want) {
        let (g, w) = (g.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
        let worst = g.iter().zip(&w).map(|(a, b)| (a - b).abs() / (1.0 + b.abs())).fold(0.0f32, f32::max);
        eprintln!("max rel err {worst}");
        assert!(worst < 1e-4);
    }
}

/// Where the adapter has timestamp queries, a launch is timed on the GPU: a positive time no longer than
/// the wall time around the same timed submission. Elsewhere timing says it cannot.
#[test]
fn timestamps_time_a_launch_where_the_adapter_has_them() {
    use kiln_graph::{capture, compile_graph, workloads::data, DType, TensorSpec};
    let backend = WgpuBackend::new().unwrap();
    let gpu = backend.gpu();
    let spec = TensorSpec::new(DType::F32, &[1 << 16]);
    let g = capture(std::slice::from_ref(&spec), |t| Ok(vec![t[0].exp()?])).unwrap();
    let c = compile_graph(&g, gpu.target()).unwrap();
    let x = data(&spec, 0);
    let p = pollster::block_on(gpu.prepare(&c, &[&x])).unwrap();
    let clock = std::time::Instant::now();
    let timed = gpu.time_launch(&p).unwrap();
    let wall = clock.elapsed().as_secs_f64();
    eprintln!("timestamps: {}, timed {timed:?} s, wall {wall} s", gpu.has_timestamps());
    match timed {
        Some(s) => assert!(s > 0.0 && s <= wall, "{s} s on the GPU, {wall} s around it"),
        None => assert!(!gpu.has_timestamps()),
    }
}
