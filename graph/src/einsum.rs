//! `einsum` (`torch.einsum`, `numpy.einsum`, ONNX's Einsum): an equation over labelled axes, composed of
//! kiln's ops so every backend, the reference and autodiff get it. A label repeated within an operand
//! takes its diagonal (a strided slice); a label no other operand and not the output has is summed away
//! first; operands then contract pairwise, left to right, as one batched matmul each (shared kept labels
//! the batch, shared dropped ones the depth), and the result is permuted into the output's order.

use crate::error::{Error, Result};
use crate::loc::SourceLoc;
use crate::shape::Dim;
use crate::trace::Tensor;

/// An axis label: a letter, or the `k`-th axis an ellipsis stands for (counted from its last).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Label {
    /// One of the `...` axes, numbered from the right (0 is the last).
    Ellipsis(usize),
    /// A letter.
    Letter(char),
}

impl std::fmt::Display for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Label::Letter(c) => write!(f, "{c:?}"),
            Label::Ellipsis(k) => write!(f, "the ellipsis's axis {k} from the last"),
        }
    }
}

/// One operand's (or the output's) labels as written: letters and at most one ellipsis.
#[derive(Clone, Debug)]
struct Term {
    before: Vec<char>,
    ellipsis: bool,
    after: Vec<char>,
}

fn bad(msg: String) -> Error {
    Error::InvalidArgument { op: "einsum".into(), msg, loc: SourceLoc::caller() }
}

fn parse_term(t: &str, equation: &str) -> Result<Term> {
    let t: String = t.chars().filter(|c| !c.is_whitespace()).collect();
    let (before, after, ellipsis) = match t.find("...") {
        Some(i) => (&t[..i], &t[i + 3..], true),
        None => (&t[..], "", false),
    };
    let letters = |s: &str| -> Result<Vec<char>> {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphabetic() {
                    Ok(c)
                } else {
                    Err(bad(format!("equation {equation:?}: {c:?} is not a label (letters and one `...`)")))
                }
            })
            .collect()
    };
    Ok(Term { before: letters(before)?, ellipsis, after: letters(after)? })
}

impl Term {
    /// The labels of an operand of rank `rank`, the ellipsis standing for the axes the letters leave.
    fn labels(&self, rank: usize, which: &str) -> Result<Vec<Label>> {
        let letters = self.before.len() + self.after.len();
        if rank < letters || (!self.ellipsis && rank != letters) {
            return Err(bad(format!("{which} has {rank} axes; its term names {letters}")));
        }
        let n = if self.ellipsis { rank - letters } else { 0 };
        let mut v: Vec<Label> = self.before.iter().map(|&c| Label::Letter(c)).collect();
        v.extend((0..n).rev().map(Label::Ellipsis));
        v.extend(self.after.iter().map(|&c| Label::Letter(c)));
        Ok(v)
    }
}

/// A tensor with a label per axis.
#[derive(Clone)]
struct Labelled {
    t: Tensor,
    labels: Vec<Label>,
}

impl Labelled {
    /// Each label once: a repeated label's axes replaced by their diagonal (as the last axis).
    fn diagonals(mut self) -> Result<Labelled> {
        while let Some((a, b)) = repeated(&self.labels) {
            let dims = self.t.shape();
            let (n, m) = (dims.dims()[a].clone(), dims.dims()[b].clone());
            if n != m {
                return Err(bad(format!("label {} spans axes of sizes {n} and {m}", self.labels[a])));
            }
            let rank = self.labels.len();
            let mut perm: Vec<isize> = (0..rank).filter(|&i| i != a && i != b).map(|i| i as isize).collect();
            perm.extend([a as isize, b as isize]);
            let moved = self.t.permute(&perm)?;
            let mut view: Vec<isize> = moved.shape().view_dims()[..rank - 2].to_vec();
            let size = n.as_const().ok_or_else(|| bad(format!("the diagonal of a symbolic axis ({n})")))?;
            view.push((size * size) as isize);
            // Element (i, i) of an n × n block sits at i·(n + 1).
            self.t = moved.reshape(&view)?.slice(-1, 0, None, size as usize + 1)?;
            let label = self.labels[a];
            self.labels = perm[..rank - 2].iter().map(|&i| self.labels[i as usize]).collect();
            self.labels.push(label);
        }
        Ok(self)
    }

    /// Sums away every label not in `keep`.
    fn sum_except(self, keep: &[Label]) -> Result<Labelled> {
        let axes: Vec<isize> =
            (0..self.labels.len()).filter(|&i| !keep.contains(&self.labels[i])).map(|i| i as isize).collect();
        if axes.is_empty() {
            return Ok(self);
        }
        let labels = self.labels.iter().copied().filter(|l| keep.contains(l)).collect();
        Ok(Labelled { t: self.t.sum(&axes, false)?, labels })
    }

    /// Axes reordered to `order` (each of this tensor's labels once).
    fn permuted(&self, order: &[Label]) -> Result<Tensor> {
        let perm: Vec<isize> =
            order.iter().map(|l| self.labels.iter().position(|m| m == l).map_or(0, |i| i as isize)).collect();
        self.t.permute(&perm)
    }

    fn size(&self, l: Label) -> Option<Dim> {
        self.labels.iter().position(|&m| m == l).map(|i| self.t.shape().dims()[i].clone())
    }
}

/// Checks every label has one size across the operands, a size-1 axis broadcasting (as torch's), and
/// expands such axes to it so each contraction sees equal sizes.
fn broadcast_sizes(xs: &mut [Labelled]) -> Result<()> {
    let mut sizes: Vec<(Label, Dim, usize)> = Vec::new();
    for (i, x) in xs.iter().enumerate() {
        for (l, d) in x.labels.iter().zip(x.t.shape().dims()) {
            match sizes.iter_mut().find(|(m, ..)| m == l) {
                None => sizes.push((*l, d.clone(), i)),
                Some((_, s, j)) if *s != *d && s.as_const() != Some(1) && d.as_const() != Some(1) => {
                    return Err(bad(format!("label {l} is {s} on operand {j} and {d} on operand {i}")));
                }
                Some((_, s, j)) if s.as_const() == Some(1) => {
                    *s = d.clone();
                    *j = i;
                }
                Some(_) => {}
            }
        }
    }
    for x in xs.iter_mut() {
        let dims = x.t.shape();
        let target: Vec<isize> = x
            .labels
            .iter()
            .zip(dims.dims())
            .map(|(l, d)| match sizes.iter().find(|(m, ..)| m == l).and_then(|(_, s, _)| s.as_const()) {
                Some(n) if d.as_const() == Some(1) => n as isize,
                _ => -1,
            })
            .collect();
        if target.iter().any(|&d| d >= 0) {
            x.t = x.t.expand(&target)?;
        }
    }
    Ok(())
}

/// Two axes with one label, if any.
fn repeated(labels: &[Label]) -> Option<(usize, usize)> {
    (0..labels.len()).find_map(|a| (a + 1..labels.len()).find(|&b| labels[b] == labels[a]).map(|b| (a, b)))
}

/// The merged size of `labels`' axes of `x`, where every one is a constant.
fn merged(x: &Labelled, labels: &[Label]) -> Option<isize> {
    labels.iter().try_fold(1isize, |n, &l| x.size(l)?.as_const().map(|v| n * v as isize))
}

/// Sizes as a reshape target (`-1` for a symbolic one), if at most one is symbolic.
fn view(sizes: impl IntoIterator<Item = Option<Dim>>) -> Option<Vec<isize>> {
    let v: Vec<isize> = sizes.into_iter().map(|d| d.and_then(|d| d.as_const()).map_or(-1, |c| c as isize)).collect();
    (v.iter().filter(|&&d| d < 0).count() <= 1).then_some(v)
}

/// `x` with its axes in `order`'s relative order and a size-1 axis for each label of `order` it lacks.
fn aligned(x: &Labelled, order: &[Label]) -> Result<Tensor> {
    let own: Vec<Label> = order.iter().copied().filter(|l| x.labels.contains(l)).collect();
    let mut t = x.permuted(&own)?;
    for (i, l) in order.iter().enumerate() {
        if !x.labels.contains(l) {
            t = t.unsqueeze(i as isize)?;
        }
    }
    Ok(t)
}

/// `a · b` contracted over their shared labels not in `keep`; shared labels in `keep` are the batch.
fn contract(a: Labelled, b: Labelled, keep: &[Label]) -> Result<Labelled> {
    let shared: Vec<Label> = a.labels.iter().copied().filter(|l| b.labels.contains(l)).collect();
    let batch: Vec<Label> = shared.iter().copied().filter(|l| keep.contains(l)).collect();
    let depth: Vec<Label> = shared.iter().copied().filter(|l| !keep.contains(l)).collect();
    let left: Vec<Label> = a.labels.iter().copied().filter(|l| !shared.contains(l)).collect();
    let right: Vec<Label> = b.labels.iter().copied().filter(|l| !shared.contains(l)).collect();
    let labels: Vec<Label> = batch.iter().chain(&left).chain(&right).copied().collect();
    // One batched matmul: [batch, left merged, depth merged] · [batch, depth merged, right merged], each
    // operand's batch as its own (size-1 axes broadcast in the product).
    let sizes = |x: &Labelled, ls: &[Label]| ls.iter().map(|&l| x.size(l)).collect::<Vec<_>>();
    let product = (|| {
        let (m, k, n) = (merged(&a, &left)?, merged(&a, &depth)?, merged(&b, &right)?);
        let va = view(sizes(&a, &batch).into_iter().chain([Some(Dim::from(m as usize)), Some(Dim::from(k as usize))]))?;
        let vb = view(sizes(&b, &batch).into_iter().chain([Some(Dim::from(k as usize)), Some(Dim::from(n as usize))]))?;
        let broadcast: Vec<Option<Dim>> = batch
            .iter()
            .map(|&l| match (a.size(l), b.size(l)) {
                (Some(x), Some(y)) if x.as_const() == Some(1) => Some(y),
                (Some(x), _) => Some(x),
                (None, y) => y,
            })
            .collect();
        let out = view(broadcast.into_iter().chain(sizes(&a, &left)).chain(sizes(&b, &right)))?;
        Some((va, vb, out))
    })();
    let t = match product {
        Some((va, vb, out)) => {
            let order_a: Vec<Label> = batch.iter().chain(&left).chain(&depth).copied().collect();
            let order_b: Vec<Label> = batch.iter().chain(&depth).chain(&right).copied().collect();
            let ta = a.permuted(&order_a)?.reshape(&va)?;
            let tb = b.permuted(&order_b)?.reshape(&vb)?;
            ta.matmul(&tb)?.reshape(&out)?
        }
        None => {
            // Symbolic sizes a reshape cannot merge: the broadcast product, summed over the depth.
            let order: Vec<Label> = labels.iter().chain(&depth).copied().collect();
            let p = aligned(&a, &order)?.mul(&aligned(&b, &order)?)?;
            let axes: Vec<isize> = (labels.len()..order.len()).map(|i| i as isize).collect();
            if axes.is_empty() {
                p
            } else {
                p.sum(&axes, false)?
            }
        }
    };
    Ok(Labelled { t, labels })
}

impl Tensor {
    /// Einstein summation over `operands` as `equation` says (`torch.einsum`'s rules): `"bij,bjk->bik"`,
    /// `"ii->i"` (a diagonal), `"ij->"` (a sum), `"...ij,...jk"` (an ellipsis broadcasts); without `->`
    /// the output is the labels used once, in alphabetical order, after the ellipsis's axes.
    #[track_caller]
    pub fn einsum(equation: &str, operands: &[&Tensor]) -> Result<Tensor> {
        SourceLoc::attributed(SourceLoc::caller(), || einsum(equation, operands))
    }
}

fn einsum(equation: &str, operands: &[&Tensor]) -> Result<Tensor> {
    let (inputs, output) = match equation.split_once("->") {
        Some((i, o)) => (i, Some(o)),
        None => (equation, None),
    };
    let terms: Vec<Term> = inputs.split(',').map(|t| parse_term(t, equation)).collect::<Result<_>>()?;
    if terms.len() != operands.len() || operands.is_empty() {
        return Err(bad(format!(
            "equation {equation:?} names {} operands; {} were given",
            terms.len(),
            operands.len()
        )));
    }
    let mut xs = Vec::with_capacity(operands.len());
    let mut ellipsis_axes = 0;
    for (i, (term, t)) in terms.iter().zip(operands).enumerate() {
        let labels = term.labels(t.rank(), &format!("operand {i}"))?;
        ellipsis_axes = ellipsis_axes.max(labels.iter().filter(|l| matches!(l, Label::Ellipsis(_))).count());
        xs.push(Labelled { t: (*t).clone(), labels }.diagonals()?);
    }
    broadcast_sizes(&mut xs)?;
    let out: Vec<Label> = match output {
        Some(o) => {
            let term = parse_term(o, equation)?;
            let letters = term.before.len() + term.after.len();
            let labels = term.labels(letters + if term.ellipsis { ellipsis_axes } else { 0 }, "the output")?;
            if let Some((a, _)) = repeated(&labels) {
                return Err(bad(format!("equation {equation:?}: output label {} appears twice", labels[a])));
            }
            labels
        }
        None => {
            let mut once: Vec<Label> = Vec::new();
            let all: Vec<Label> =
                terms.iter().flat_map(|t| t.before.iter().chain(&t.after)).map(|&c| Label::Letter(c)).collect();
            for l in &all {
                if all.iter().filter(|m| *m == l).count() == 1 {
                    once.push(*l);
                }
            }
            once.sort();
            let mut labels: Vec<Label> = (0..ellipsis_axes).rev().map(Label::Ellipsis).collect();
            labels.extend(once);
            labels
        }
    };
    if let Some(l) = out.iter().find(|l| !xs.iter().any(|x| x.labels.contains(l))) {
        return Err(bad(format!("equation {equation:?}: output label {l} is on no operand")));
    }
    // Sum away what only one operand has and the output drops, then contract left to right.
    let needed = |xs: &[Labelled], skip: usize| -> Vec<Label> {
        let mut keep = out.clone();
        for (j, x) in xs.iter().enumerate() {
            if j != skip {
                keep.extend(&x.labels);
            }
        }
        keep
    };
    let mut rest: Vec<Labelled> = Vec::new();
    for i in 0..xs.len() {
        let keep = needed(&xs, i);
        rest.push(xs[i].clone().sum_except(&keep)?);
    }
    let mut rest = rest.into_iter();
    let mut acc = rest.next().ok_or_else(|| bad("no operands".into()))?;
    let later: Vec<Labelled> = rest.collect();
    for (i, b) in later.iter().enumerate() {
        let mut keep = out.clone();
        for x in &later[i + 1..] {
            keep.extend(&x.labels);
        }
        acc = contract(acc, b.clone(), &keep)?.sum_except(&keep)?;
    }
    let acc = acc.sum_except(&out)?;
    acc.permuted(&out)
}
