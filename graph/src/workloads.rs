//! The benchmark workloads (W1–W6 of the project's workload list), defined once for the bench, the
//! fusion and cache tests and the explorer: each is a function over tensors plus its input shapes at full
//! size, at the size the bench checks correctness on, and at `--quick` size.

use crate::{DType, Result, Tensor, TensorSpec};

/// One workload.
pub struct Workload {
    /// `W1`...
    pub id: &'static str,
    /// What it is.
    pub what: &'static str,
    /// Input specs at benchmark size.
    pub full: Vec<TensorSpec>,
    /// Input specs for `--quick` runs.
    pub quick: Vec<TensorSpec>,
    /// Input specs small enough for the CPU reference.
    pub check: Vec<TensorSpec>,
    /// The computation.
    pub f: fn(&[Tensor]) -> Result<Vec<Tensor>>,
    /// Whether matmuls dominate (report FLOP/s).
    pub flops: fn(&[TensorSpec]) -> Option<f64>,
}

/// An f32 input spec.
pub fn f32s(d: &[usize]) -> TensorSpec {
    TensorSpec::new(DType::F32, d)
}

/// W1: `gelu(x*1.5 + 0.5) * sigmoid(x) - tanh(x)`.
pub fn w1(t: &[Tensor]) -> Result<Vec<Tensor>> {
    let x = &t[0];
    Ok(vec![x.mul(1.5)?.add(0.5)?.gelu()?.mul(&x.sigmoid()?)?.sub(&x.tanh()?)?])
}

/// W2: softmax over the last axis.
pub fn w2(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].softmax(-1)?])
}

/// W3: GELU of an affine layer norm; inputs x, weight, bias.
pub fn w3(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].layer_norm(1, Some(&t[1]), Some(&t[2]), 1e-5)?.gelu()?])
}

/// LG: `gelu(x @ wᵀ + b)`, one large linear layer with its activation; inputs x, w, b.
pub fn linear_gelu(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].linear(&t[1], Some(&t[2]))?.gelu()?])
}

fn linear_flops(s: &[TensorSpec]) -> Option<f64> {
    let (x, w) = (s[0].shape.as_concrete()?, s[1].shape.as_concrete()?);
    Some(2.0 * x[0] as f64 * x[1] as f64 * w[0] as f64)
}

/// `Linear(10,10)` then 64 × [Linear → ReLU → sigmoid → Linear → ReLU]; inputs x, then (w, b) pairs.
pub fn w4(t: &[Tensor]) -> Result<Vec<Tensor>> {
    let mut h = t[0].linear(&t[1], Some(&t[2]))?;
    for l in 0..64 {
        let p = 3 + 4 * l;
        h = h.linear(&t[p], Some(&t[p + 1]))?.relu()?.sigmoid()?;
        h = h.linear(&t[p + 2], Some(&t[p + 3]))?.relu()?;
    }
    Ok(vec![h])
}

/// W4's inputs: x of `batch` rows, then a weight and bias per linear layer.
pub fn w4_inputs(batch: usize) -> Vec<TensorSpec> {
    let mut v = vec![f32s(&[batch, 10])];
    for _ in 0..129 {
        v.extend([f32s(&[10, 10]), f32s(&[10])]);
    }
    v
}

/// One pre-LN GPT block; `p` holds ln1 w/b, qkv w/b, proj w/b, ln2 w/b, fc1 w/b, fc2 w/b.
#[track_caller]
pub fn gpt_block(x: &Tensor, p: &[Tensor], heads: usize) -> Result<Tensor> {
    gpt_block_train(x, p, heads, None)
}

/// Dropout inside a training GPT block (GPT-2's three sites: the attention weights, the attention's
/// output and the MLP's output, before each residual add).
#[derive(Clone, Copy, Debug)]
pub struct BlockDropout<'a> {
    /// Probability of dropping an element.
    pub p: f64,
    /// The step's key ([`Tensor::rng_key`]).
    pub key: &'a Tensor,
    /// The first of the block's three random streams (each site draws its own).
    pub stream: u32,
}

/// [`gpt_block`] with dropout while training (`None`: evaluation, the same graph as `gpt_block`).
pub fn gpt_block_train(x: &Tensor, p: &[Tensor], heads: usize, dropout: Option<BlockDropout>) -> Result<Tensor> {
    // The batch may be symbolic (-1 in the views below); seq and d are static.
    let dims = Some(x.shape().view_dims())
        .filter(|d| d.len() == 3 && d[1] >= 0 && d[2] > 0 && heads > 0 && d[2] % heads as isize == 0)
        .ok_or_else(|| crate::Error::Unsupported {
            what: format!(
                "a GPT block on {} with {heads} heads: it needs [batch, seq, d] with static seq and d, d a multiple of heads",
                x.shape()
            ),
            loc: crate::SourceLoc::caller(),
        })?;
    if p.len() != 12 {
        return Err(crate::Error::Unsupported {
            what: format!("a GPT block takes 12 parameters, got {}", p.len()),
            loc: crate::SourceLoc::caller(),
        });
    }
    let (b, s, d) = (dims[0], dims[1], dims[2]);
    let hd = d / heads as isize;
    let h = x.layer_norm(1, Some(&p[0]), Some(&p[1]), 1e-5)?;
    let qkv = h.linear(&p[2], Some(&p[3]))?;
    let split = |i: isize| -> Result<Tensor> {
        qkv.narrow(-1, (i * d) as usize, d as usize)?.reshape(&[b, s, heads as isize, hd])?.permute(&[0, 2, 1, 3])
    };
    let (q, k, v) = (split(0)?, split(1)?, split(2)?);
    let drop = |t: Tensor, site: u32| match dropout {
        Some(d) if d.p > 0.0 => t.dropout_in(d.p, d.key, d.stream.wrapping_add(site)),
        _ => Ok(t),
    };
    let weights = q.matmul(&k.transpose(-1, -2)?)?.mul(1.0 / (hd as f64).sqrt())?.causal_mask()?.softmax(-1)?;
    let att = drop(weights, 0)?.matmul(&v)?;
    let att = att.permute(&[0, 2, 1, 3])?.reshape(&[b, s, d])?;
    let x = x.add(&drop(att.linear(&p[4], Some(&p[5]))?, 1)?)?;
    let h = x.layer_norm(1, Some(&p[6]), Some(&p[7]), 1e-5)?;
    x.add(&drop(h.linear(&p[8], Some(&p[9]))?.gelu()?.linear(&p[10], Some(&p[11]))?, 2)?)
}

/// W5 forward: 4 blocks then a final layer norm; inputs x, 4 × 12 block parameters, final w/b.
pub fn w5(t: &[Tensor]) -> Result<Vec<Tensor>> {
    let d = t[0].shape().as_concrete().expect("static")[2];
    let heads = (d / 64).max(1);
    let mut x = t[0].clone();
    for blk in 0..4 {
        x = gpt_block(&x, &t[1 + 12 * blk..13 + 12 * blk], heads)?;
    }
    Ok(vec![x.layer_norm(1, Some(&t[49]), Some(&t[50]), 1e-5)?])
}

/// One block's parameter specs: ln1 w/b, qkv w/b, proj w/b, ln2 w/b, fc1 w/b, fc2 w/b.
pub fn block_params(d: usize) -> Vec<TensorSpec> {
    vec![
        f32s(&[d]),
        f32s(&[d]),
        f32s(&[3 * d, d]),
        f32s(&[3 * d]),
        f32s(&[d, d]),
        f32s(&[d]),
        f32s(&[d]),
        f32s(&[d]),
        f32s(&[4 * d, d]),
        f32s(&[4 * d]),
        f32s(&[d, 4 * d]),
        f32s(&[d]),
    ]
}

/// W5's inputs: x `[b, s, d]`, four blocks' parameters, the final layer norm's weight and bias.
pub fn w5_inputs(b: usize, s: usize, d: usize) -> Vec<TensorSpec> {
    let mut v = vec![f32s(&[b, s, d])];
    for _ in 0..4 {
        v.extend(block_params(d));
    }
    v.extend([f32s(&[d]), f32s(&[d])]);
    v
}

fn w5_flops(s: &[TensorSpec]) -> Option<f64> {
    let d = s[0].shape.as_concrete()?;
    let (b, n, d) = (d[0] as f64, d[1] as f64, d[2] as f64);
    // QKV, scores, weighted values, projection, two MLP matmuls; 2 FLOPs per multiply-add.
    let block =
        2.0 * b * n * d * 3.0 * d + 2.0 * 2.0 * b * n * n * d + 2.0 * b * n * d * d + 2.0 * 2.0 * b * n * d * 4.0 * d;
    Some(4.0 * block)
}

/// DenseNet-121's layer counts per dense block (torchvision's `densenet121`: growth 32, bottleneck 4x,
/// 64 initial features, 1000 classes).
const W6_BLOCKS: [usize; 4] = [6, 12, 24, 16];
const W6_GROWTH: usize = 32;

/// A batch norm's four per-channel inputs (weight, bias, running mean, running variance).
fn bn_params(c: usize) -> [TensorSpec; 4] {
    [f32s(&[c]), f32s(&[c]), f32s(&[c]), f32s(&[c])]
}

/// W6's inputs: images `[b, 3, hw, hw]`, then every parameter in the order [`w6`] reads them.
pub fn w6_inputs(b: usize, hw: usize) -> Vec<TensorSpec> {
    let mut v = vec![f32s(&[b, 3, hw, hw]), f32s(&[64, 3, 7, 7])];
    v.extend(bn_params(64));
    let mut c = 64;
    for (i, &layers) in W6_BLOCKS.iter().enumerate() {
        for _ in 0..layers {
            v.extend(bn_params(c));
            v.push(f32s(&[4 * W6_GROWTH, c, 1, 1]));
            v.extend(bn_params(4 * W6_GROWTH));
            v.push(f32s(&[W6_GROWTH, 4 * W6_GROWTH, 3, 3]));
            c += W6_GROWTH;
        }
        if i + 1 < W6_BLOCKS.len() {
            v.extend(bn_params(c));
            v.push(f32s(&[c / 2, c, 1, 1]));
            c /= 2;
        }
    }
    v.extend(bn_params(c));
    v.extend([f32s(&[1000, c]), f32s(&[1000])]);
    v
}

/// Batch norm in eval mode followed by ReLU: `relu(x * s + (b - mean * s))` with
/// `s = w / sqrt(|var| + 1 + 1e-5)` per channel (the variance input is made positive this way, since
/// the bench's inputs are uniform in [-2, 2); the torch peer loads `|var| + 1` as the running variance).
fn bn_relu(x: &Tensor, p: &[Tensor]) -> Result<Tensor> {
    let s = p[0].mul(&p[3].abs()?.add(1.0 + 1e-5)?.rsqrt()?)?;
    let shift = p[1].sub(&p[2].mul(&s)?)?;
    x.mul(&s.reshape(&[1, -1, 1, 1])?)?.add(&shift.reshape(&[1, -1, 1, 1])?)?.relu()
}

/// W6: DenseNet-121 in eval mode (torchvision's layer for layer: each dense layer concatenates every
/// earlier feature map, BN-ReLU-1x1 conv-BN-ReLU-3x3 conv; transitions BN-ReLU-1x1 conv-2x2 average
/// pool), global average pool and the classifier; inputs as [`w6_inputs`] lists them.
pub fn w6(t: &[Tensor]) -> Result<Vec<Tensor>> {
    use crate::conv::Window;
    let mut at = 1;
    let mut take = |n: usize| {
        at += n;
        &t[at - n..at]
    };
    let conv =
        |x: &Tensor, w: &Tensor, stride: usize, pad: usize| x.conv(w, None, &Window::uniform(2, stride, pad, 1), 1);
    let x = conv(&t[0], &take(1)[0], 2, 3)?;
    let x = bn_relu(&x, take(4))?;
    let mut x = x.max_pool(&[3, 3], &Window::uniform(2, 2, 1, 1))?;
    for (i, &layers) in W6_BLOCKS.iter().enumerate() {
        let mut features = vec![x.clone()];
        for _ in 0..layers {
            let refs: Vec<&Tensor> = features.iter().collect();
            let h = if refs.len() == 1 { x.clone() } else { Tensor::concat(&refs, 1)? };
            let h = bn_relu(&h, take(4))?;
            let h = conv(&h, &take(1)[0], 1, 0)?;
            let h = bn_relu(&h, take(4))?;
            features.push(conv(&h, &take(1)[0], 1, 1)?);
        }
        let refs: Vec<&Tensor> = features.iter().collect();
        x = Tensor::concat(&refs, 1)?;
        if i + 1 < W6_BLOCKS.len() {
            let h = bn_relu(&x, take(4))?;
            x = conv(&h, &take(1)[0], 1, 0)?.avg_pool(&[2, 2], &Window::uniform(2, 2, 0, 1), true)?;
        }
    }
    let x = bn_relu(&x, take(4))?.mean(&[2, 3], false)?;
    let head = take(2);
    Ok(vec![x.linear(&head[0], Some(&head[1]))?])
}

/// Convolution and classifier FLOPs of W6 (2 per multiply-add).
fn w6_flops(s: &[TensorSpec]) -> Option<f64> {
    let d = s[0].shape.as_concrete()?;
    let (b, mut hw) = (d[0] as f64, d[2] as f64);
    let conv = |cin: f64, cout: f64, k: f64, out: f64| 2.0 * b * cin * cout * k * k * out * out;
    hw /= 2.0;
    let mut total = conv(3.0, 64.0, 7.0, hw);
    hw /= 2.0;
    let mut c = 64.0;
    for (i, &layers) in W6_BLOCKS.iter().enumerate() {
        for _ in 0..layers {
            total += conv(c, 128.0, 1.0, hw) + conv(128.0, 32.0, 3.0, hw);
            c += 32.0;
        }
        if i + 1 < W6_BLOCKS.len() {
            total += conv(c, c / 2.0, 1.0, hw);
            c /= 2.0;
            hw /= 2.0;
        }
    }
    Some(total + 2.0 * b * c * 1000.0)
}

fn no_flops(_: &[TensorSpec]) -> Option<f64> {
    None
}

/// `specs` with every f32 input turned into `dtype` (the half-precision variants of a workload).
pub fn with_dtype(specs: Vec<TensorSpec>, dtype: DType) -> Vec<TensorSpec> {
    specs.into_iter().map(|s| TensorSpec { dtype: if s.dtype == DType::F32 { dtype } else { s.dtype }, ..s }).collect()
}

/// Every workload the bench knows, in order.
pub fn all() -> Vec<Workload> {
    vec![
        Workload {
            id: "W1",
            what: "gelu(x*1.5 + 0.5) * sigmoid(x) - tanh(x), 2^26 f32",
            full: vec![f32s(&[1 << 26])],
            quick: vec![f32s(&[1 << 20])],
            check: vec![f32s(&[100_003])],
            f: w1,
            flops: no_flops,
        },
        Workload {
            id: "W2",
            what: "softmax(x, -1), 8192 x 8192 f32",
            full: vec![f32s(&[8192, 8192])],
            quick: vec![f32s(&[1024, 1024])],
            check: vec![f32s(&[64, 8192])],
            f: w2,
            flops: no_flops,
        },
        Workload {
            id: "W3",
            what: "gelu(layer_norm(x)), affine, 8192 x 4096 f32",
            full: vec![f32s(&[8192, 4096]), f32s(&[4096]), f32s(&[4096])],
            quick: vec![f32s(&[1024, 1024]), f32s(&[1024]), f32s(&[1024])],
            check: vec![f32s(&[64, 4096]), f32s(&[4096]), f32s(&[4096])],
            f: w3,
            flops: no_flops,
        },
        Workload {
            id: "W4",
            what: "64-layer Linear(10,10) MLP (the regional-compilation recipe), input 10 x 10",
            full: w4_inputs(10),
            quick: w4_inputs(10),
            check: w4_inputs(10),
            f: w4,
            flops: |s| Some(129.0 * 2.0 * (s[0].shape.numel().as_const().unwrap_or(0) as f64) * 10.0),
        },
        Workload {
            id: "W5",
            what: "GPT-2-small-like stack, 4 pre-LN blocks + final LN, forward, f32, batch 8 x seq 512 x d 768",
            full: w5_inputs(8, 512, 768),
            quick: w5_inputs(2, 64, 128),
            check: w5_inputs(1, 16, 128),
            f: w5,
            flops: w5_flops,
        },
        Workload {
            id: "LG",
            what: "gelu(linear(x)), 4096 x 4096 @ 4096 x 4096 + bias, f32 (one large layer, the public-call check)",
            full: vec![f32s(&[4096, 4096]), f32s(&[4096, 4096]), f32s(&[4096])],
            quick: vec![f32s(&[256, 256]), f32s(&[256, 256]), f32s(&[256])],
            check: vec![f32s(&[64, 512]), f32s(&[256, 512]), f32s(&[256])],
            f: linear_gelu,
            flops: linear_flops,
        },
        Workload {
            id: "W5-bf16",
            what: "the W5 stack in bf16 (inputs and weights bf16; matmuls accumulate in f32)",
            full: with_dtype(w5_inputs(8, 512, 768), DType::BF16),
            quick: with_dtype(w5_inputs(2, 64, 128), DType::BF16),
            check: with_dtype(w5_inputs(1, 16, 128), DType::BF16),
            f: w5,
            flops: w5_flops,
        },
        Workload {
            id: "W1-bf16",
            what: "W1 in bf16 (input and output bf16), 2^26",
            full: with_dtype(vec![f32s(&[1 << 26])], DType::BF16),
            quick: with_dtype(vec![f32s(&[1 << 20])], DType::BF16),
            check: with_dtype(vec![f32s(&[100_003])], DType::BF16),
            f: w1,
            flops: no_flops,
        },
        Workload {
            id: "W2-bf16",
            what: "W2 in bf16, 8192 x 8192",
            full: with_dtype(vec![f32s(&[8192, 8192])], DType::BF16),
            quick: with_dtype(vec![f32s(&[1024, 1024])], DType::BF16),
            check: with_dtype(vec![f32s(&[64, 8192])], DType::BF16),
            f: w2,
            flops: no_flops,
        },
        Workload {
            id: "W3-bf16",
            what: "W3 in bf16 (input, weight and bias bf16), 8192 x 4096",
            full: with_dtype(vec![f32s(&[8192, 4096]), f32s(&[4096]), f32s(&[4096])], DType::BF16),
            quick: with_dtype(vec![f32s(&[1024, 1024]), f32s(&[1024]), f32s(&[1024])], DType::BF16),
            check: with_dtype(vec![f32s(&[64, 4096]), f32s(&[4096]), f32s(&[4096])], DType::BF16),
            f: w3,
            flops: no_flops,
        },
        Workload {
            id: "W6",
            what: "DenseNet-121 eval (torchvision's layers), batch 16 x 3 x 128 x 128, f32",
            full: w6_inputs(16, 128),
            quick: w6_inputs(2, 64),
            check: w6_inputs(1, 32),
            f: w6,
            flops: w6_flops,
        },
    ]
}

/// The seeded inputs for `specs`, each salted by its position (the bench, the explorer and the tests all
/// run a workload on these).
pub fn inputs(specs: &[TensorSpec]) -> Vec<crate::TensorData> {
    specs.iter().enumerate().map(|(i, s)| data(s, i)).collect()
}

/// Deterministic, seeded pseudo-random input data for a spec: values uniform in [-2, 2) (a SplitMix64
/// stream seeded by `salt`, so no row repeats another: a kernel that mixed up rows would not pass), weights
/// scaled down so deep stacks stay finite.
pub fn data(spec: &TensorSpec, salt: usize) -> crate::TensorData {
    let dims = spec.shape.as_concrete().expect("workload shapes are static");
    let n: usize = dims.iter().product();
    // Weights scaled like a fan-in initialisation, so deep stacks stay finite and well-conditioned: 2-D
    // (linear) by their input size, 4-D with a kernel of at most 7x7 (convolution) by in-channels x kernel.
    let scale = match dims[..] {
        [_, fan_in] => (1.0 / fan_in as f64).sqrt(),
        [_, c, kh, kw] if kh <= 7 && kw <= 7 => (1.0 / (c * kh * kw) as f64).sqrt(),
        _ => 1.0,
    };
    let mut state = (salt as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5851_F42D_4C95_7F2D;
    let values = (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0) * scale
        })
        .collect();
    crate::TensorData::from_f64(values, &dims, spec.dtype).expect("sizes match")
}
