//! Convolutions as one product per kernel row (`Target::conv_row_products_bytes`): the products read one
//! matrix that unfolds only the last spatial axis, at shifted offsets, and add up through the library's
//! epilogue. Checked through the kernel interpreter against the f64 reference, for the geometries the
//! offsets must get right (padding on either side, dilation, a 3-D window, a bias), and for the kernels
//! it must make: no 9x im2col matrix, one call per kernel row, each adding the previous sum inside the call.

use kiln_graph::conv::Window;
use kiln_graph::kernel::Stmt;
use kiln_graph::{capture, compile_graph, interp, CompiledGraph, DType, Target, TensorData, TensorSpec};

/// A CUDA target that computes every stride-1 convolution by rows, at full f32 precision.
fn by_rows() -> Target {
    Target { tf32_convolutions: false, conv_row_products_bytes: 1, ..Target::cuda(90) }
}

fn data(spec: &TensorSpec, salt: usize) -> TensorData {
    let n: usize = spec.shape.as_concrete().unwrap().iter().product();
    let values = (0..n).map(|i| (((i * 7919 + salt * 104_729) % 2003) as f64 / 1001.0) - 1.0).collect();
    TensorData::from_f64(values, &spec.shape.as_concrete().unwrap(), DType::F32).unwrap()
}

/// Matrix products: library calls and template kernels (products too small for the library).
fn products(c: &CompiledGraph) -> usize {
    c.kernels.iter().flat_map(|k| &k.body).filter(|s| matches!(s, Stmt::Gemm(_) | Stmt::MatMul(_))).count()
}

/// Compiles `conv(x, w, bias?)` for `target` and checks the interpreted kernels against the reference;
/// returns the compiled graph.
fn check(x: &[usize], w: &[usize], bias: bool, window: &Window, target: &Target) -> CompiledGraph {
    check_groups(x, w, bias, window, 1, target)
}

/// [`check`] with `groups` groups (`w` is `[O, C/groups, *kernel]`).
fn check_groups(
    x: &[usize],
    w: &[usize],
    bias: bool,
    window: &Window,
    groups: usize,
    target: &Target,
) -> CompiledGraph {
    let mut specs = vec![TensorSpec::new(DType::F32, x), TensorSpec::new(DType::F32, w)];
    if bias {
        specs.push(TensorSpec::new(DType::F32, &[w[0]]));
    }
    let g = capture(&specs, |t| Ok(vec![t[0].conv(&t[1], t.get(2), window, groups)?])).unwrap();
    let c = compile_graph(&g, target).unwrap();
    let inputs: Vec<_> = specs.iter().enumerate().map(|(i, s)| data(s, i)).collect();
    let refs: Vec<_> = inputs.iter().collect();
    let got = &c.run_interpreted(&refs).unwrap()[0];
    let want = &interp::run(&g, &refs).unwrap()[0];
    assert_eq!(got.dims(), want.dims());
    let worst =
        got.values().iter().zip(want.values()).map(|(a, b)| (a - b).abs() / (1.0 + b.abs())).fold(0.0, f64::max);
    assert!(worst < 1e-5, "x {x:?} w {w:?} {window:?}: max rel err {worst}\n{c}");
    c
}

#[test]
fn row_products_match_the_reference_for_every_offset() {
    let cases: [(&[usize], &[usize], bool, Window); 5] = [
        (&[2, 3, 8, 8], &[5, 3, 3, 3], false, Window::uniform(2, 1, 1, 1)),
        (&[2, 3, 10, 10], &[4, 3, 3, 3], true, Window::uniform(2, 1, 0, 1)),
        // Asymmetric padding, a 5x3 kernel dilated along the rows.
        (
            &[1, 2, 12, 8],
            &[3, 2, 5, 3],
            false,
            Window { stride: vec![1, 1], padding: vec![(3, 1), (1, 1)], dilation: vec![2, 1] },
        ),
        // A 3-D window: nine kernel rows over a padded volume.
        (&[2, 2, 5, 6, 8], &[3, 2, 3, 3, 3], true, Window::uniform(3, 1, 1, 1)),
        // One kernel row after all (1xk): a single product.
        (
            &[2, 3, 4, 8],
            &[2, 3, 1, 3],
            false,
            Window { stride: vec![1, 1], padding: vec![(0, 0), (1, 1)], dilation: vec![1, 1] },
        ),
    ];
    let expect_calls = [3, 3, 5, 9, 1];
    for ((x, w, bias, window), calls) in cases.iter().zip(expect_calls) {
        let c = check(x, w, *bias, window, &by_rows());
        assert_eq!(products(&c), calls, "x {x:?} w {w:?}: one product per kernel row\n{c}");
    }
}

#[test]
fn row_products_write_a_third_of_the_im2col_matrix_and_add_inside_the_calls() {
    // Large enough for the library: each row's product is 32 x 2,112 x 48.
    let (x, w) = ([2, 16, 32, 32], [32, 16, 3, 3]);
    let input: usize = x.iter().product();
    let window = Window::uniform(2, 1, 1, 1);
    let rows = check(&x, &w, false, &window, &by_rows());
    let full = check(&x, &w, false, &window, &Target { conv_row_products_bytes: 0, ..by_rows() });
    let largest = |c: &CompiledGraph| {
        c.kernels.iter().flat_map(|k| &k.buffers).map(|b| b.len.as_const().unwrap() as usize).max().unwrap()
    };
    assert_eq!(largest(&full), 9 * input, "the full im2col matrix\n{full}");
    // Three unfolded columns of the padded 34x32 grid.
    assert_eq!(largest(&rows), 3 * 2 * 16 * 34 * 32, "{rows}");
    let calls: Vec<_> = (rows.kernels.iter().flat_map(|k| &k.body))
        .filter_map(|s| if let Stmt::Gemm(g) = s { Some(g) } else { None })
        .collect();
    // The second and third products add the previous sum as the call's residual: no add kernels.
    assert_eq!(calls.len(), 3, "{rows}");
    assert_eq!(calls.iter().filter(|g| g.epilogue.residual.is_some()).count(), 2, "{rows}");
    // The unfolded matrix, the weights by kernel row, three calls, and the kernel that reads the result
    // back (a graph output is written in its own layout).
    assert_eq!(rows.kernels.len(), 6, "{rows}");
}

#[test]
fn small_inputs_strides_and_groups_keep_the_full_im2col() {
    let cuda = Target { tf32_convolutions: false, ..Target::cuda(90) };
    // 2 x 16 x 32 x 32 f32 is 128 KiB, under CUDA's threshold.
    let small = check(&[2, 16, 32, 32], &[32, 16, 3, 3], false, &Window::uniform(2, 1, 1, 1), &cuda);
    assert_eq!(products(&small), 1, "{small}");
    let strided = check(&[2, 3, 9, 9], &[4, 3, 3, 3], false, &Window::uniform(2, 2, 1, 1), &by_rows());
    assert_eq!(products(&strided), 1, "{strided}");
    let grouped = check_groups(&[2, 4, 16, 16], &[4, 2, 3, 3], true, &Window::uniform(2, 1, 1, 1), 2, &by_rows());
    assert_eq!(products(&grouped), 1, "{grouped}");
    // Without the library's epilogue the row sums would be kernels of their own: a tuned target without
    // it keeps the full im2col (no `KILN_CONVROWSTEST_*` variable is set, so only that rule applies).
    let separate = Target { library_epilogue: false, ..by_rows() };
    assert_eq!(separate.tuned_by_env("CONVROWSTEST").conv_row_products_bytes, 0);
    assert_eq!(by_rows().tuned_by_env("CONVROWSTEST").conv_row_products_bytes, 1);
    // Output rows 5 floats wide start 20 bytes apart: not 16-byte aligned, so no epilogue could add them.
    let narrow = check(&[1, 2, 7, 7], &[2, 2, 3, 3], false, &Window::uniform(2, 1, 0, 1), &by_rows());
    assert_eq!(products(&narrow), 1, "{narrow}");
}
