//! The fused attention templates as PTX: every shape of them `graph` can choose (both half dtypes on
//! matrix units, head dims 16 to 128, causal or not, 16-byte or 2-byte loads, one stage of key and
//! value tiles or two; f32 on registers, head dims 8 to 64, 16-byte or 4-byte loads) assembles with
//! ptxas for sm_80 and sm_90 and fits its registers without spilling. Their results are checked on a
//! GPU by `conformance_cuda`.

use kiln_graph::kernel::{AttentionUnits, Stmt};
use kiln_graph::{capture, compile_graph, DType, Result, Target, Tensor, TensorSpec};

fn causal(t: &[Tensor]) -> Result<Vec<Tensor>> {
    let w = t[0].matmul(&t[1].transpose(-1, -2)?)?.mul(0.125)?.causal_mask()?.softmax(-1)?;
    Ok(vec![w.matmul(&t[2])?])
}

fn plain(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].matmul(&t[1].transpose(-1, -2)?)?.softmax(-1)?.matmul(&t[2])?])
}

/// The attention kernel of `f` over q `[2, 100, d]`, k `[2, 77, d]`, v `[2, 77, dv]`.
fn kernel(f: fn(&[Tensor]) -> Result<Vec<Tensor>>, dtype: DType, d: usize, dv: usize) -> kiln_graph::kernel::Kernel {
    kernel_for(f, dtype, (d, dv), &Target::cuda(90))
}

/// [`kernel`] for `target`.
fn kernel_for(
    f: fn(&[Tensor]) -> Result<Vec<Tensor>>,
    dtype: DType,
    (d, dv): (usize, usize),
    target: &Target,
) -> kiln_graph::kernel::Kernel {
    let specs = [
        TensorSpec::new(dtype, &[2, 100, d]),
        TensorSpec::new(dtype, &[2, 77, d]),
        TensorSpec::new(dtype, &[2, 77, dv]),
    ];
    let c = compile_graph(&capture(&specs, f).unwrap(), target).unwrap();
    c.kernels.into_iter().find(|k| matches!(k.body.as_slice(), [Stmt::Attention(_)])).expect("an attention kernel")
}

#[test]
fn every_attention_template_assembles_without_spilling() {
    let ptxas = kiln_ptx::ptxas::find().unwrap_or_else(|| panic!("{}", kiln_ptx::ptxas::INSTALL_HINT));
    let mut cases = Vec::new();
    for (f, dtype) in [(causal as fn(&[Tensor]) -> Result<Vec<Tensor>>, DType::BF16), (plain, DType::F16)] {
        for (d, dv) in [(16, 16), (32, 48), (64, 64), (128, 128)] {
            cases.push(kernel(f, dtype, d, dv));
        }
    }
    // 2-byte loads: the same kernel with its tile's load width forced down (what unaligned rows get).
    let mut narrow = kernel(causal, DType::BF16, 64, 64);
    if let [Stmt::Attention(a)] = narrow.body.as_mut_slice() {
        assert_eq!(a.tile.stages, 2, "aligned rows copy the next tile while the current one is used");
        (a.tile.vector, a.tile.stages) = (1, 1);
    }
    cases.push(narrow);
    let matrix = cases.len();
    for (f, d, dv) in [(causal as fn(&[Tensor]) -> Result<Vec<Tensor>>, 64, 64), (plain, 32, 48), (causal, 8, 8)] {
        cases.push(kernel(f, DType::F32, d, dv));
    }
    // 4-byte loads of the f32 template.
    let mut narrow = kernel(causal, DType::F32, 64, 64);
    if let [Stmt::Attention(a)] = narrow.body.as_mut_slice() {
        assert_eq!(a.tile.units, AttentionUnits::Registers, "f32 attention on CUDA runs on registers");
        assert_eq!(a.tile.vector, 4, "aligned f32 rows move 16 bytes a load");
        a.tile.vector = 1;
    }
    cases.push(narrow);
    // Eight queries a thread (`Mode::MaxAutotune`'s other candidate), and a head dim of three vectors
    // (the last piece of a copy partial).
    let eight = Target {
        register_attention: Some(kiln_graph::target::RegisterAttention { thread_rows: 8 }),
        ..Target::cuda(90)
    };
    cases.push(kernel_for(causal, DType::F32, (64, 64), &eight));
    cases.push(kernel(plain, DType::F32, 12, 24));
    for (n, k) in cases.iter().enumerate() {
        for sm in [80, 90] {
            let ptx = kiln_ptx::render(k, sm).unwrap().source;
            if n < matrix {
                assert!(ptx.contains("mma.sync.aligned.m16n8k16") && ptx.contains("ldmatrix"), "{ptx}");
            } else {
                assert!(ptx.contains("fma.rn.f32") && !ptx.contains("mma.sync"), "{ptx}");
            }
            let used = kiln_ptx::ptxas::resources(&ptxas, &k.name, &ptx, sm).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(used.spill_stores, 0, "{} spills on sm_{sm}: {used:?}\n{k}", k.name);
            eprintln!("{} sm_{sm}: {used:?}", k.name);
        }
    }
}
