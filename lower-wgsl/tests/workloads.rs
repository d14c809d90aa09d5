//! W1, softmax, layer norm, matmul and argmax at small sizes on wgpu, against the reference.

use kiln_graph::{compile, CpuReference, Tensor};
use kiln_wgsl::Gpu;

#[test]
fn workloads_match_the_reference_on_wgpu() {
    let backend = Gpu::runtime().unwrap();
    eprintln!("adapter: {}", backend.driver().describe());
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
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        let (g, w) = (g.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
        assert_eq!(g.len(), w.len());
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
    let rt = Gpu::runtime().unwrap();
    let has = rt.driver().timing() == "timestamp queries";
    let spec = TensorSpec::new(DType::F32, &[1 << 16]);
    let g = capture(std::slice::from_ref(&spec), |t| Ok(vec![t[0].exp()?])).unwrap();
    let c = std::sync::Arc::new(compile_graph(&g, rt.target()).unwrap());
    let x = rt.upload(&data(&spec, 0)).unwrap();
    let p = rt.prepare(&c, &[x]).unwrap();
    let timed = rt.driver().time(&mut || rt.launch(&p).map(drop)).unwrap();
    let clock = std::time::Instant::now();
    let again = rt.driver().time(&mut || rt.launch(&p).map(drop)).unwrap();
    let wall = clock.elapsed().as_secs_f64();
    eprintln!("timestamps: {has}, timed {timed:?} then {again:?} s, wall {wall} s");
    let timed = again;
    match timed {
        Some(s) => assert!(s > 0.0 && s <= wall, "{s} s on the GPU, {wall} s around it"),
        None => assert!(!has),
    }
}
