//! Index arithmetic in 32 bits where the kernel's index ranges prove it fits (every static-shape kernel
//! under 2^32 elements, and symbolic ones whose guards bound their symbols), divisions by constants with
//! the run-time choice and a 64-bit fallback where they do not. The 64-bit routine is what made DenseNet-121's kernels slow to assemble (ptxas 71 s → 7 s).

use kiln_graph::{capture, compile_graph, DType, Target, TensorSpec};

/// The PTX of `f` over one f32 input of `dims`.
fn ptx(dims: &[usize], f: impl FnOnce(&[kiln_graph::Tensor]) -> kiln_graph::Result<Vec<kiln_graph::Tensor>>) -> String {
    let g = capture(&[TensorSpec::new(DType::F32, dims)], f).unwrap();
    let c = compile_graph(&g, &Target::cuda(90)).unwrap();
    c.kernels.iter().map(|k| kiln_ptx::render(k, 90).unwrap().source).collect::<Vec<_>>().join("\n")
}

/// A permute's output index splits by 5·3 and 3: non-powers of two.
fn permuted(t: &[kiln_graph::Tensor]) -> kiln_graph::Result<Vec<kiln_graph::Tensor>> {
    Ok(vec![t[0].permute(&[2, 0, 1])?.mul(2.0)?])
}

#[test]
fn a_small_static_kernel_divides_in_32_bits_only() {
    let p = ptx(&[5, 3, 7], permuted);
    assert!(p.contains("div.u32"), "{p}");
    assert!(!p.contains("div.s64"), "no 64-bit division where every index fits 32 bits:\n{p}");
    // The whole index in 32-bit arithmetic, widened inside the address's multiply-add.
    // The permuted read's index in 32-bit arithmetic, widened inside the address's multiply-add (the
    // store's index is the loop variable itself).
    assert!(p.contains("mad.wide.u32") && p.contains("mad.lo.u32") && !p.contains("mul.lo.s64 %t"), "{p}");
}

#[test]
fn indices_past_2_to_the_32_keep_the_64_bit_division() {
    // 5 · 3 · 2^30 elements: the flat index reaches 1.6e10 (nothing is allocated; only the PTX is read).
    let p = ptx(&[5, 3, 1 << 30], permuted);
    assert!(p.contains("div.s64"), "a dividend past 2^32 needs the 64-bit path:\n{p}");
    assert!(p.contains("mad.lo.s64") && !p.contains("mad.wide.u32"), "addresses past 2^32 elements in 64 bits:\n{p}");
}

/// DenseNet-121's kernels fit their registers: with 64-bit division fallbacks, 44 of its 68 distinct
/// kernels spilled (the dense blocks' BN + ReLU over the concatenation up to 4.8 KB a thread, a round
/// trip to memory for every element); with 32-bit division, at most a few bytes in any kernel.
#[test]
fn densenet_kernels_do_not_spill_registers() {
    let ptxas = kiln_ptx::ptxas::find().unwrap_or_else(|| panic!("{}", kiln_ptx::ptxas::INSTALL_HINT));
    let w = kiln_graph::workloads::all().into_iter().find(|w| w.id == "W6").expect("W6");
    let c = compile_graph(&capture(&w.full, w.f).unwrap(), &Target::cuda(90)).unwrap();
    let mut seen = std::collections::HashSet::new();
    let mut worst = (0, String::new());
    for k in c.kernels.iter().filter(|k| k.gemm().is_none()) {
        let ptx = kiln_ptx::render(k, 90).unwrap().source;
        if !seen.insert(ptx.replace(&k.name, "kernel")) {
            continue;
        }
        let used = kiln_ptx::ptxas::resources(&ptxas, &k.name, &ptx, 90).unwrap();
        if used.spill_stores > worst.0 {
            worst = (used.spill_stores, k.name.clone());
        }
    }
    assert!(seen.len() > 50, "W6 has its kernels: {}", seen.len());
    assert!(worst.0 <= 64, "{} spills {} bytes a thread", worst.1, worst.0);
}

/// Packed groups (`Launch::packed`): eight rows of 64 to a 256-thread block, each row a warp that
/// combines by shuffles alone; nothing waits at a barrier (rows packed together may run different
/// numbers of iterations) and the block's thread count is declared.
#[test]
fn packed_rows_are_warps_of_one_block_without_barriers() {
    let p = ptx(&[300, 64], |t| Ok(vec![t[0].sum(&[1], false)?]));
    assert!(p.contains(".maxntid 256, 1, 1"), "{p}");
    assert!(p.contains("mad.lo.u32 %u0, %u0, 8, %u7;") && p.contains("rem.u32 %u6, %u6, 32;"), "{p}");
    assert!(p.contains("shfl.sync.bfly.b32") && !p.contains("bar.sync"), "{p}");
    let ptxas = kiln_ptx::ptxas::find().unwrap_or_else(|| panic!("{}", kiln_ptx::ptxas::INSTALL_HINT));
    kiln_ptx::ptxas::assemble(&ptxas, "packed_rows", &p, 90).unwrap();
}
