//! `explain` on the kernel backend shows what each graph compiled to: regions, what they fuse, and the
//! kernel IR — the readable form of W3 (LayerNorm + GELU) as one kernel.

use kiln::{compile, Backend, Tensor};

#[test]
fn explain_prints_the_fused_w3_kernel() {
    let (w, b) =
        (Tensor::from_slice(&[1.5f32; 64], &[64]).unwrap(), Tensor::from_slice(&[0.25f32; 64], &[64]).unwrap());
    let f = compile(|x: &Tensor| x.layer_norm(1, Some(&w), Some(&b), 1e-5)?.gelu()).backend(Backend::Kernels);
    let x = Tensor::from_slice(&(0..256).map(|i| (i as f32 * 0.1).sin()).collect::<Vec<_>>(), &[4, 64]).unwrap();
    let (y, ex) = f.call_explained(&x).unwrap();
    let text = ex.to_string();
    assert!(text.contains("1 kernel(s)"), "{text}");
    assert!(text.contains("region k0_fused_layernorm_gelu"), "{text}");
    assert!(text.contains("reduce Sum over"), "{text}");
    // And it computes what the reference computes.
    let reference = compile(|x: &Tensor| x.layer_norm(1, Some(&w), Some(&b), 1e-5)?.gelu()).backend(Backend::Cpu);
    let (a, r) = (y.to_vec::<f32>().unwrap(), reference.call(&x).unwrap().to_vec::<f32>().unwrap());
    assert_eq!(a.len(), r.len());
    for (p, q) in a.iter().zip(&r) {
        assert!((p - q).abs() <= 1e-5 * (1.0 + q.abs()), "{p} vs {q}");
    }
}
