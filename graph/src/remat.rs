//! The backward pass's partitioner: which forward values the backward reads from memory and which it
//! computes again.
//!
//! A vector-Jacobian rule reads the forward values its op was built from. After decomposition those are
//! often wide intermediates of a composite: a bf16 model's GELU, `x·½·(1 + erf(x/√2))` computed in f32,
//! leaves `1 + erf(x/√2)`, `x·½` and `x/√2` for the backward, three f32 tensors the forward kernel must
//! write and the backward kernel read, where `x` itself (bf16, stored anyway) is a quarter of their bytes;
//! an f32 GELU after a `Linear` leaves the same three, each as wide as the product's output, which the
//! forward writes anyway. Over the whole joint graph, a minimum cut (`partition`, as PyTorch's
//! AOTAutograd partitions) chooses the values to read so that the bytes the backward reads, and the
//! forward writes only for it, are fewest; everything between them and the backward's readers is
//! computed again, and fusion computes those copies inside the backward's kernels.

use crate::ir::{Graph, Node, NodeId, Op, OpFamily};
use crate::min_cut::{Network, UNCUTTABLE};
use crate::shape::Shape;
use crate::sym::Expr;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};

/// Nodes one recomputation may copy: a recomputed value whose copy would be longer is kept instead.
const MOST: usize = 24;

/// Bytes below which a value is read rather than computed again (see `choose_saved`).
const SMALL: u64 = 64 << 10;

/// What the partition chose, for reports: the bytes of the forward values the backward reads from
/// memory, against the bytes it would read had every value it uses been kept; and how many forward
/// nodes the backward computes again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Partition {
    /// Bytes of the forward's values the backward reads (graph inputs left out: they are in memory
    /// whatever the partition).
    pub saved_bytes: Expr,
    /// The same, had the backward read every forward value its rules use.
    pub all_bytes: Expr,
    /// Forward nodes computed again in the backward (each copy once, however many readers share it).
    pub recomputed: usize,
}

/// One line: what the backward reads, against keeping every value its rules use.
impl std::fmt::Display for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = |e: &Expr| match e.as_const() {
            Some(b) => format!("{:.1} MiB", b as f64 / 1048576.0),
            None => format!("{e} B"),
        };
        write!(
            f,
            "backward: reads {} of forward values ({} were every value its rules use kept), {} node(s) computed again",
            shown(&self.saved_bytes),
            shown(&self.all_bytes),
            self.recomputed
        )
    }
}

/// `joint` (forward nodes `0..forward_len`, then the backward's) with the backward reading recomputed
/// copies of the forward values that are cheaper to compute again than to read, and what it chose.
///
/// Which values the backward reads is a minimum cut (AOTAutograd's partitioner, on kiln's costs): each
/// forward value the backward's rules use is either read from memory — its bytes once more, twice when
/// the forward would not write it otherwise (`stored_anyway`, `read_across_rows`) — or computed again
/// from values read,
/// which only pointwise, layout and constant nodes may be. So a chain of cheap ops costs the bytes of
/// whatever it is cheapest to cut it at: narrower values (a bf16 model's f32 intermediates come back
/// from its bf16 ones), values the forward stores anyway (a GELU's intermediates from its `Linear`'s
/// output), inputs. A value a backward product reads is given the price of its copy (written, then read
/// by the product), a value a backward comparison reads (see [`compared`]) or smaller than `SMALL` is
/// never computed again, and a copy longer than `MOST` nodes is not made.
pub(crate) fn partition(joint: Graph, forward_len: usize) -> (Graph, Partition) {
    let Graph { nodes, inputs, outputs, symbols } = joint;
    let mut g = Graph { nodes: nodes[..forward_len].to_vec(), inputs, outputs: Vec::new(), symbols };
    let mut map: Vec<NodeId> = (0..forward_len as u32).map(NodeId).collect();
    let exact = compared(&nodes, forward_len);
    let kept = stored_anyway(&g, &outputs);
    let saved = choose_saved(&g, &nodes[forward_len..], &exact[forward_len..], &kept);
    // Readers that compute elementwise or reduce (and views, which their readers compute through) each
    // get copies of their own: every such reader then holds the only reader of its copy, and fusion
    // computes the copy inside that reader's kernel, whichever kernel that is. One copy shared by a layer
    // norm's weight gradient and its input gradient, two kernels, was stored by the forward's kernel
    // instead. A product or an attention reads its operands from memory: one copy is stored for all.
    let mut shared: HashMap<NodeId, NodeId> = HashMap::new();
    let mut recomputed = BTreeSet::new();
    for (i, node) in nodes.iter().enumerate().skip(forward_len) {
        let mut node = node.clone();
        let own = node.op.family() != OpFamily::Matmul;
        let mut mine: HashMap<NodeId, NodeId> = HashMap::new();
        for x in &mut node.inputs {
            *x = if x.index() >= forward_len {
                map[x.index()]
            } else if exact[i] || saved[x.index()] {
                *x
            } else {
                let copies = if own { &mut mine } else { &mut shared };
                copy(&mut g, *x, &saved, copies, &mut recomputed)
            };
        }
        map.push(g.push(node));
    }
    g.outputs = outputs.iter().map(|o| map[o.index()]).collect();
    let report = report(&g, &nodes[forward_len..], forward_len, &saved, recomputed.len());
    (g, report)
}

/// Per forward node, whether the backward reads it from memory (see [`partition`]): the minimum cut of
/// a network where node `v` is an edge `v_in → v_out` priced at what reading `v` costs, every use of a
/// value an uncuttable edge from its `_out` to its reader's `_in`, the nodes the backward may not compute
/// again tied to the source and every value a backward node reads tied to the sink. A node whose `_in`
/// ends on the source's side and `_out` on the sink's is read; one wholly on the sink's side is computed
/// again.
fn choose_saved(g: &Graph, backward: &[Node], exact: &[bool], kept: &[bool]) -> Vec<bool> {
    let n = g.nodes.len();
    let sizes = representative_sizes(g);
    let bytes = |v: usize| -> u64 {
        let node = &g.nodes[v];
        let numel = node.shape.numel().eval(&sizes).unwrap_or(i64::MAX / 1024).max(0) as u64;
        numel.saturating_mul(node.dtype.size_bytes() as u64).min(UNCUTTABLE / (1024 * n as u64 + 1024))
    };
    let (source, sink) = (2 * n, 2 * n + 1);
    let across = read_across_rows(g);
    let mut read = vec![false; n];
    let mut forced = vec![false; n];
    // Values a backward product reads, directly or through views (the product reads them from memory).
    let mut operand = vec![false; n + backward.len()];
    for (i, node) in backward.iter().enumerate().rev() {
        let family = node.op.family();
        if family == OpFamily::Matmul || (family == OpFamily::Layout && operand[n + i]) {
            for x in &node.inputs {
                operand[x.index()] = true;
            }
        }
    }
    for (node, &exact) in backward.iter().zip(exact) {
        for x in node.inputs.iter().filter(|x| x.index() < n) {
            read[x.index()] = true;
            forced[x.index()] |= exact;
        }
    }
    let by_product = &operand[..n];
    // A small value (a row's statistic, a cast vector) is read, never computed again: its bytes are
    // noise, and computing it again only moves work between kernels (every layer norm's backward computed
    // its reciprocal root again from the variance: one of the two changes in the first cut's +0.45% on
    // W5-train-bf16, `benches/NOTES.md` session 46).
    let recomputable = |v: usize| {
        let node = &g.nodes[v];
        matches!(node.op.family(), OpFamily::Pointwise | OpFamily::Layout | OpFamily::Source)
            && !matches!(node.op, Op::Input { .. })
            && bytes(base(g, v)) >= SMALL
    };
    // Bytes weigh 64 times a node computed again, which only breaks ties: of two cuts reading as many
    // bytes, the one that computes fewer nodes again.
    loop {
        let mut net = Network::new(2 * n + 2);
        for v in 0..n {
            let node = &g.nodes[v];
            let stored = base(g, v);
            let reading = 64 * bytes(stored);
            let in_memory = kept[stored] || across[stored] || matches!(g.nodes[stored].op, Op::Input { .. });
            let cost = if in_memory { reading } else { 2 * reading };
            net.edge(2 * v, 2 * v + 1, cost);
            for x in &node.inputs {
                net.edge(2 * x.index() + 1, 2 * v, UNCUTTABLE);
            }
            if !recomputable(v) || forced[v] {
                net.edge(source, 2 * v, UNCUTTABLE);
            } else if by_product[v] {
                // Computed again, it is written for the product and read by it.
                net.edge(source, 2 * v, 2 * reading + 1);
            } else {
                net.edge(source, 2 * v, 1);
            }
            if read[v] {
                net.edge(2 * v + 1, sink, UNCUTTABLE);
            }
        }
        let side = net.min_cut(source, sink);
        let saved: Vec<bool> = (0..n).map(|v| side[2 * v] && !side[2 * v + 1]).collect();
        // A copy too long to make: that value is read instead, and the cut made again around it.
        let long: Vec<usize> =
            (0..n).filter(|&v| read[v] && !saved[v] && !forced[v] && cone_len(g, v, &saved) > MOST).collect();
        if long.is_empty() {
            return saved;
        }
        for v in long {
            forced[v] = true;
        }
    }
}

/// The value `v` is a view of (itself when it is not a view): a view is its base's bytes (an expanded
/// weight is the weight, a gathered row its table). A concatenation is no view of its first part: its
/// bytes are all its parts', its own.
fn base(g: &Graph, mut v: usize) -> usize {
    while g.nodes[v].op.family() == OpFamily::Layout
        && !matches!(g.nodes[v].op, Op::Concat { .. })
        && !g.nodes[v].inputs.is_empty()
    {
        v = g.nodes[v].inputs[0].index();
    }
    v
}

/// Forward values a reduction reads that another reduction's rows made (a loss summed over a layer
/// norm's output): the layer norm's row kernel writes one of them for the loss's kernel whatever the
/// backward reads, since fusion computes nothing twice across kernels — left unread by the backward, the
/// loss's kernel reads the row kernel's own intermediate (`x − mean`, f32 under a bf16 model) instead,
/// bytes the cut would not see. So the chain's narrowest values count as stored anyway. Sibling
/// reductions over the same rows (a layer norm's two sums) share one kernel and are left out.
fn read_across_rows(g: &Graph) -> Vec<bool> {
    let n = g.nodes.len();
    let domain_of = |v: usize| match &g.nodes[v].op {
        Op::Reduce { axes, .. } => Some((g.nodes[v].inputs[0].index(), axes.clone())),
        _ => None,
    };
    // Per value: the rows (reduced input's shape, axes) of the nearest reduction it is made from
    // through pointwise and layout nodes.
    let mut rows: Vec<Option<(Shape, Vec<usize>)>> = vec![None; n];
    for v in 0..n {
        let node = &g.nodes[v];
        rows[v] = match domain_of(v) {
            Some((input, axes)) => Some((g.nodes[input].shape.clone(), axes)),
            None if matches!(node.op.family(), OpFamily::Pointwise | OpFamily::Layout) => {
                node.inputs.iter().find_map(|x| rows[x.index()].clone())
            }
            None => None,
        };
    }
    let mut across = vec![false; n];
    for r in 0..n {
        let Some((input, axes)) = domain_of(r) else { continue };
        let own = (g.nodes[input].shape.clone(), axes);
        let Some(foreign) = rows[input].clone().filter(|d| *d != own) else { continue };
        // The chain from the other rows to this reduction; the row kernel writes the narrowest of it.
        let mut chain = BTreeSet::new();
        let mut stack = vec![input];
        while let Some(v) = stack.pop() {
            let pointwise = matches!(g.nodes[v].op.family(), OpFamily::Pointwise | OpFamily::Layout);
            if !pointwise || rows[v].as_ref() != Some(&foreign) || !chain.insert(v) {
                continue;
            }
            stack.extend(g.nodes[v].inputs.iter().map(|x| x.index()));
        }
        let narrowest = chain.iter().map(|&v| g.nodes[v].dtype.size_bytes()).min().unwrap_or(0);
        for v in chain {
            across[v] |= g.nodes[v].dtype.size_bytes() == narrowest;
        }
    }
    across
}

/// Every symbol at a size for comparing costs: 1024 within its range (a batch, a sequence).
fn representative_sizes(g: &Graph) -> crate::sym::Bindings {
    let mut b = crate::sym::Bindings::default();
    for i in 0..g.symbols.len() as u32 {
        let s = crate::sym::SymId(i);
        let (lo, hi) = g.symbols.range(s).unwrap_or((1, None));
        b.bind(s, 1024i64.max(lo).min(hi.unwrap_or(i64::MAX)));
    }
    b
}

/// How many nodes computing `v` again copies: its ancestors up to the values read.
fn cone_len(g: &Graph, v: usize, saved: &[bool]) -> usize {
    let mut seen = BTreeSet::new();
    let mut stack = vec![v];
    while let Some(q) = stack.pop() {
        if (saved[q] && q != v) || matches!(g.nodes[q].op, Op::Input { .. }) || !seen.insert(q) {
            continue;
        }
        if seen.len() > MOST {
            break;
        }
        stack.extend(g.nodes[q].inputs.iter().map(|x| x.index()));
    }
    seen.len()
}

/// The copy of forward value `p` the backward reads (pushed onto `g`): `p`'s ancestors back to the
/// values read, copied in id order. `copies` remembers each forward node's copy, so a reader's (or the
/// products') copies share their common part.
fn copy(
    g: &mut Graph,
    p: NodeId,
    saved: &[bool],
    copies: &mut HashMap<NodeId, NodeId>,
    recomputed: &mut BTreeSet<NodeId>,
) -> NodeId {
    let mut cone = BTreeSet::new();
    let mut stack = vec![p];
    while let Some(q) = stack.pop() {
        let stop = saved[q.index()] || matches!(g.node(q).op, Op::Input { .. }) || copies.contains_key(&q);
        if stop || !cone.insert(q) {
            continue;
        }
        stack.extend(g.node(q).inputs.iter().copied());
    }
    // In id order: each copy's producers are copied (or read) before it.
    for q in cone {
        let mut node: Node = g.node(q).clone();
        for x in &mut node.inputs {
            if let Some(&c) = copies.get(x) {
                *x = c;
            }
        }
        copies.insert(q, g.push(node));
        recomputed.insert(q);
    }
    copies.get(&p).copied().unwrap_or(p)
}

/// The partition's figures (see [`Partition`]): each value counted once at its base's bytes (a view is
/// the tensor it views), graph inputs left out.
fn report(g: &Graph, backward: &[Node], forward_len: usize, saved: &[bool], recomputed: usize) -> Partition {
    let bases = |vs: &mut dyn Iterator<Item = usize>| -> BTreeSet<usize> {
        vs.map(|v| base(g, v)).filter(|&b| !matches!(g.nodes[b].op, Op::Input { .. })).collect()
    };
    let sum = |vs: BTreeSet<usize>| {
        vs.into_iter()
            .fold(Expr::from(0i64), |acc, v| acc + g.nodes[v].shape.numel() * Expr::from(g.nodes[v].dtype.size_bytes()))
    };
    let used = &mut backward.iter().flat_map(|n| &n.inputs).map(|x| x.index()).filter(|&x| x < forward_len);
    Partition {
        saved_bytes: sum(bases(&mut (0..forward_len).filter(|&v| saved[v]))),
        all_bytes: sum(bases(used)),
        recomputed,
    }
}

/// For each node, whether a backward comparison reads its inputs' exact forward values, directly or
/// through layout nodes: a max's gradient tests `x == max(x)`, and a copy of `x` computed in another
/// kernel may round differently (a multiply-add contracted in one kernel and not the other), which would
/// silently zero the gradient of a whole row.
fn compared(nodes: &[Node], forward_len: usize) -> Vec<bool> {
    let mut exact = vec![false; nodes.len()];
    for i in (forward_len..nodes.len()).rev() {
        let comparison = matches!(&nodes[i].op, crate::ir::Op::Binary { op } if op.is_comparison());
        if comparison || (exact[i] && nodes[i].op.family() == OpFamily::Layout) {
            exact[i] = true;
            for x in &nodes[i].inputs {
                if x.index() >= forward_len && nodes[x.index()].op.family() == OpFamily::Layout {
                    exact[x.index()] = true;
                }
            }
        }
    }
    exact
}

/// For each forward node, whether the forward writes its value whatever the backward reads: a graph
/// output, a value (or a view of it) read by a product, an attention or a collective (they read their
/// operands from memory; a reduction's row kernel computes its own), or a product with the adds a library GEMM
/// performs inside its call ([`crate::gemm::addend`]: a bias, a residual), whose last sum the call
/// writes. Other pointwise values are written only when some other kernel reads them.
fn stored_anyway(g: &Graph, outputs: &[NodeId]) -> Vec<bool> {
    let (nodes, forward_len) = (&g.nodes, g.nodes.len());
    let mut kept = vec![false; forward_len];
    let mut readers: Vec<Vec<NodeId>> = vec![Vec::new(); forward_len];
    for (i, n) in nodes[..forward_len].iter().enumerate() {
        for x in &n.inputs {
            readers[x.index()].push(NodeId(i as u32));
        }
    }
    for o in outputs {
        if o.index() < forward_len {
            kept[o.index()] = true;
        }
    }
    // Readers come after what they read: walking backwards, a view is kept once any reader of it is.
    for i in (0..forward_len).rev() {
        let n = &nodes[i];
        let family = n.op.family();
        if family == OpFamily::Matmul {
            let (mut tip, mut kinds) = (NodeId(i as u32), Vec::new());
            while let [c] = readers[tip.index()][..] {
                match crate::gemm::addend(g, c, tip) {
                    Some((kind, _)) if !kinds.contains(&kind) => {
                        kinds.push(kind);
                        tip = c;
                    }
                    _ => break,
                }
            }
            kept[tip.index()] = true;
        }
        // A reduction is left out: its row kernel computes the pointwise values it reduces.
        if !matches!(family, OpFamily::Pointwise | OpFamily::Layout | OpFamily::Reduce)
            || (family == OpFamily::Layout && kept[i])
        {
            for x in &n.inputs {
                kept[x.index()] = true;
            }
        }
    }
    kept
}
