//! The convolution family's reference, checked against values worked out by hand (the decomposition and
//! every backend are checked against this reference elsewhere, so it must be right on its own).

use kiln_graph::{CpuReference, Result, Tensor, Window};

fn t(values: &[f32], dims: &[usize]) -> Tensor {
    Tensor::from_slice(values, dims).unwrap()
}

fn eager(f: impl FnOnce() -> Result<Tensor>) -> Vec<f32> {
    kiln_graph::set_eager_backend(Some(std::sync::Arc::new(CpuReference)));
    f().unwrap().to_vec::<f32>().unwrap()
}

#[test]
fn conv1d_with_padding_stride_and_bias() {
    // x = [1 2 3 4 5], w = [1 0 -1], padding 1: y[i] = x[i-1] - x[i+1].
    let x = t(&[1.0, 2.0, 3.0, 4.0, 5.0], &[1, 1, 5]);
    let w = t(&[1.0, 0.0, -1.0], &[1, 1, 3]);
    let b = t(&[10.0], &[1]);
    let pad = Window { padding: vec![(1, 1)], ..Window::default() };
    assert_eq!(eager(|| x.conv(&w, None, &pad, 1)), [-2.0, -2.0, -2.0, -2.0, 4.0]);
    let strided = Window { stride: vec![2], ..pad };
    assert_eq!(eager(|| x.conv(&w, Some(&b), &strided, 1)), [8.0, 8.0, 14.0]);
    // Dilation 2 without padding: y[i] = x[i] - x[i+4].
    let dilated = Window { dilation: vec![2], ..Window::default() };
    assert_eq!(eager(|| x.conv(&w, None, &dilated, 1)), [-4.0]);
}

#[test]
fn conv2d_groups_keep_channels_apart() {
    // Two channels, two groups (depthwise): channel 0 summed by a 2x2 of ones, channel 1 scaled by 2.
    let x = t(&[1.0, 2.0, 3.0, 4.0, 10.0, 20.0, 30.0, 40.0], &[1, 2, 2, 2]);
    let w = t(&[1.0, 1.0, 1.0, 1.0, 2.0, 0.0, 0.0, 0.0], &[2, 1, 2, 2]);
    assert_eq!(eager(|| x.conv(&w, None, &Window::default(), 2)), [10.0, 20.0]);
    // One group: each output channel sums over both input channels.
    let w1 = t(&[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0], &[1, 2, 2, 2]);
    assert_eq!(eager(|| x.conv(&w1, None, &Window::default(), 1)), [41.0]);
}

#[test]
fn pooling_counts_padding_as_asked() {
    let x = t(&[1.0, 2.0, 3.0, 4.0], &[1, 1, 2, 2]);
    let w = Window::uniform(2, 1, 1, 1);
    // 2x2 windows at stride 1 over a 1-padded 2x2 input: 3x3 outputs; the corner window sees one element.
    assert_eq!(eager(|| x.max_pool(&[2, 2], &w)), [1.0, 2.0, 2.0, 3.0, 4.0, 4.0, 3.0, 4.0, 4.0]);
    let counted = eager(|| x.avg_pool(&[2, 2], &w, true));
    assert_eq!(counted, [0.25, 0.75, 0.5, 1.0, 2.5, 1.5, 0.75, 1.75, 1.0]);
    let uncounted = eager(|| x.avg_pool(&[2, 2], &w, false));
    assert_eq!(uncounted, [1.0, 1.5, 2.0, 2.0, 2.5, 3.0, 3.0, 3.5, 4.0]);
}

#[test]
fn bad_geometry_is_a_typed_error() {
    let x = t(&[0.0; 8], &[1, 2, 4]);
    let w = t(&[0.0; 6], &[1, 2, 3]);
    let too_long = t(&[0.0; 12], &[1, 2, 6]);
    assert!(x.conv(&too_long, None, &Window::default(), 1).unwrap_err().to_string().contains("too short"));
    assert!(x.conv(&w, None, &Window::default(), 2).is_err(), "2 groups of 1 channel need a weight [O, 1, k]");
    assert!(x.conv(&w, None, &Window { stride: vec![0], ..Window::default() }, 1).is_err());
    assert!(x.conv(&w, None, &Window { stride: vec![1, 1], ..Window::default() }, 1).is_err());
    assert!(x.max_pool(&[2, 2], &Window::default()).is_err(), "a 2-D pool of a 1-D input");
    let e = t(&[0.0; 4], &[4]).max_pool(&[2], &Window::default()).unwrap_err();
    assert!(e.to_string().contains("[N, C"), "{e}");
}

#[test]
fn conv_transpose_by_hand() {
    // x = [1 2], kernel [1 1 1], stride 2: each input spreads over three outputs, overlapping once.
    let x = t(&[1.0, 2.0], &[1, 1, 2]);
    let w = t(&[1.0, 1.0, 1.0], &[1, 1, 3]);
    let s2 = Window { stride: vec![2], ..Window::default() };
    assert_eq!(eager(|| x.conv_transpose(&w, None, &s2, &[], 1)), [1.0, 1.0, 3.0, 2.0, 2.0]);
    // Padding 1 crops one output at each end; output_padding 1 adds one at the end.
    let p1 = Window { stride: vec![2], padding: vec![(1, 1)], ..Window::default() };
    assert_eq!(eager(|| x.conv_transpose(&w, None, &p1, &[1], 1)), [1.0, 3.0, 2.0, 2.0]);
    // An asymmetric kernel is applied flipped relative to conv: x = [1], w = [1 2 3] gives [1 2 3].
    let one = t(&[1.0], &[1, 1, 1]);
    let w3 = t(&[1.0, 2.0, 3.0], &[1, 1, 3]);
    assert_eq!(eager(|| one.conv_transpose(&w3, None, &Window::default(), &[], 1)), [1.0, 2.0, 3.0]);
}

/// The transposed convolution is the adjoint of the convolution with the same weight and window:
/// `<conv(x), y> == <x, conv_transpose(y)>` for every geometry, groups included.
#[test]
fn conv_transpose_is_the_adjoint_of_conv() {
    let cases: [(&[usize], &[usize], Window, usize); 4] = [
        (&[2, 4, 7, 6], &[6, 2, 3, 3], Window::uniform(2, 2, 1, 1), 2),
        (&[1, 3, 9], &[4, 3, 4], Window { stride: vec![3], padding: vec![(2, 1)], dilation: vec![2] }, 1),
        (
            &[1, 2, 5, 5],
            &[2, 1, 2, 3],
            Window { stride: vec![1, 2], padding: vec![(0, 1), (1, 0)], dilation: vec![2, 1] },
            2,
        ),
        (&[2, 2, 4, 4], &[3, 2, 1, 1], Window::uniform(2, 1, 0, 1), 1),
    ];
    for (k, (xd, wd, win, groups)) in cases.into_iter().enumerate() {
        let n = |d: &[usize]| d.iter().product::<usize>();
        let wave = |len: usize, seed: usize| (0..len).map(|i| ((i * 7 + seed) as f32 * 0.37).sin()).collect::<Vec<_>>();
        let x = t(&wave(n(xd), 1), xd);
        let w = t(&wave(n(wd), 2), wd);
        let y_shape: Vec<usize> = x.conv(&w, None, &win, groups).unwrap().shape().as_concrete().unwrap();
        let y = t(&wave(n(&y_shape), 3), &y_shape);
        // conv_transpose's weight is [C_in, C_out/g, k] from the conv's point of view reversed: the
        // conv's [O, C/g, k] read as [in = O, out/g = C/g, k].
        let cx = eager(|| x.conv(&w, None, &win, groups));
        let back_len =
            xd.iter().skip(2).zip(&y_shape[2..]).zip(wd[2..].iter()).enumerate().map(|(a, ((&l, &o), &kk))| {
                let natural =
                    (o - 1) * win.stride[a] - win.padding[a].0 - win.padding[a].1 + win.dilation[a] * (kk - 1) + 1;
                l - natural
            });
        let out_pad: Vec<usize> = back_len.collect();
        let ty = eager(|| y.conv_transpose(&w, None, &win, &out_pad, groups));
        assert_eq!(ty.len(), x.to_vec::<f32>().unwrap().len(), "case {k}: conv_transpose gives the input's size");
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| *p as f64 * *q as f64).sum::<f64>();
        let (lhs, rhs) = (dot(&cx, &y.to_vec::<f32>().unwrap()), dot(&x.to_vec::<f32>().unwrap(), &ty));
        assert!((lhs - rhs).abs() <= 1e-4 * lhs.abs().max(1.0), "case {k}: <conv x, y> = {lhs}, <x, conv_t y> = {rhs}");
    }
}
