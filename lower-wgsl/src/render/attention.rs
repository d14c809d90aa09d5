//! The fused attention template on a thread's vector lanes (`AttentionUnits::Lanes`), spelled in WGSL.
//! `graph` chose the work division (`attention::tile`); this prints it. Each thread owns one query: its
//! row of `q` (pre-scaled into base 2) and its output row live in `vec4` registers, one variable each
//! (an array indexed in a loop may be left in local memory by a driver's compiler). The workgroup streams
//! tiles of keys and values through workgroup memory; every thread reads the same key at the same time
//! (one address: no bank conflicts), scores a chunk of keys, and folds the chunk into its running max,
//! sum and output, with no other thread involved. No `q_len × kv_len` value exists anywhere. Where `graph`
//! split a query across 2 or 4 adjacent lanes (`AttentionTile::split`), each holds that share of its
//! rows and the partial scores meet by subgroup shuffles.

use super::{float_literal, Writer};
use kiln_graph::dtype::DType;
use kiln_graph::kernel::{Attention, AttentionPass, AttentionUnits, RowsOperand};

/// Below any score (a finite stand-in for `-inf`: WGSL may assume values are finite).
const LOWEST: f64 = -3.0e38;

/// Tile loads a thread issues before storing them to workgroup memory: 32 registers of vectors, beside
/// the 128 its query's rows hold.
const LOADS_IN_FLIGHT: u32 = 8;

/// An f32 forward template's operands as printed ([`Writer::attention_operands`]).
pub(super) struct Operands {
    /// The query length.
    pub tq: String,
    /// The key (and value) length.
    pub tk: String,
    /// Row strides of q, k, v and the output.
    pub ld: [String; 4],
    /// Buffers of q, k, v and the output.
    pub buffers: [usize; 4],
}

impl Writer<'_> {
    /// Whether the f32 forward template `name` can print attention `a`: one forward pass in f32 with no
    /// second output, a tile its rule (`unfit`) accepts, launched on the tile's threads; else the kernel
    /// fails with the reason.
    pub(super) fn attention_fits(&mut self, a: &Attention, name: &str, unfit: Option<String>) -> bool {
        let t = a.tile;
        let why = if a.pass != AttentionPass::Forward || a.dtype != DType::F32 {
            Some(format!("the {name} template computes an f32 forward pass, not {:?} over {}", a.pass, a.dtype))
        } else if a.second.is_some() && t.units == AttentionUnits::Registers {
            Some(format!("the {name} template writes no second output"))
        } else if let Some(why) = unfit {
            Some(why)
        } else if self.k.launch.threads != t.threads() {
            Some(format!("tile {t:?} on {} threads", self.k.launch.threads))
        } else {
            None
        };
        match why {
            Some(why) => {
                self.fail(format!("attention: {why}"));
                false
            }
            None => true,
        }
    }

    /// The whole body of an attention kernel on lanes: its forward pass, and each query's log-sum-exp
    /// where the kernel writes one beside it (`Attention::second`).
    pub(super) fn attention(&mut self, depth: usize, a: &Attention) {
        let t = a.tile;
        let (d, dv) = (a.head_dim, a.value_dim);
        if t.units == AttentionUnits::Registers {
            return self.attention_registers(depth, a);
        }
        if t.units != AttentionUnits::Lanes {
            return self.fail("attention: this target has no matrix units for the matrix-unit template".into());
        }
        // The validator checked the split against the target's subgroups; the rest is the tile's own.
        if !self.attention_fits(a, "lanes", t.lanes_unfit(d, dv, Some(t.split))) {
            return;
        }
        let (d4, v4) = (d / 4, dv / 4);
        let (rows, keys, chunk, split) = (t.rows(), t.keys, t.chunk, t.split);
        let threads = t.threads();
        // Each of a query's `split` threads holds this many of its vectors of `q` and of the output.
        let (dq, vq) = (d4 / split, v4 / split);
        self.attention_arrays = vec![("at_kt", keys * d4), ("at_vt", keys * v4)];
        let l = |w: &mut Self, depth: usize, s: String| w.line(depth, &s);
        let Operands { tq, tk, ld: [ldq, ldk, ldv, ldo], buffers: [bq, bk, bv, bo] } =
            self.attention_operands(depth, a, rows);
        let e = depth + 1;
        // Rows start on multiples of 4 elements (`graph` said so): the operands are bound as vectors.
        let vectors = t.vector == 4;
        if vectors {
            self.attention_vec4.extend([bq, bk, bv, bo]);
        }
        // Four elements from `at` on of buffer `b`, as one vector.
        let load4 = |b: usize, at: &str| {
            if vectors {
                format!("b{b}[({at}) / 4i]")
            } else {
                let x: Vec<String> = (0..4).map(|i| format!("b{b}[{at} + {i}i]")).collect();
                format!("vec4<f32>({})", x.join(", "))
            }
        };
        if split == 1 {
            l(self, e, format!("let at_row: i32 = at_block * {rows}i + local;"));
            l(self, e, "let at_part: i32 = 0i;".into());
        } else {
            // A query's threads are adjacent lanes of one subgroup: their partial scores meet by shuffles.
            l(self, e, format!("let at_row: i32 = at_block * {rows}i + local / {split}i;"));
            l(self, e, format!("let at_part: i32 = local % {split}i;"));
        }
        l(self, e, format!("let at_live: bool = at_row < {tq};"));
        // The query row, times scale · log2(e): scores come out in base 2, for `exp2`.
        let scale = float_literal(a.scale * std::f64::consts::LOG2_E);
        for c in 0..dq {
            l(self, e, format!("var at_q{c}: vec4<f32> = vec4<f32>(0.0f);"));
        }
        for c in 0..vq {
            l(self, e, format!("var at_out{c}: vec4<f32> = vec4<f32>(0.0f);"));
        }
        l(self, e, "if (at_live) {".into());
        l(self, e + 1, format!("let at_at: i32 = at_oq + at_row * {ldq} + at_part * {}i;", 4 * dq));
        for c in 0..dq {
            let x = load4(bq, &format!("at_at + {}i", 4 * c));
            l(self, e + 1, format!("at_q{c} = {x} * {scale};"));
        }
        l(self, e, "}".into());
        l(self, e, format!("var at_m: f32 = {};", float_literal(LOWEST)));
        l(self, e, "var at_l: f32 = 0.0f;".into());
        // Keys the workgroup visits (all, or up to its last query's), and this thread's own.
        let (end, mine) = if a.causal {
            (format!("min({tk}, at_block * {rows}i + {rows}i)"), format!("min({tk}, at_row + 1i)"))
        } else {
            (tk.clone(), tk.clone())
        };
        l(self, e, format!("let at_end: i32 = {end};"));
        l(self, e, format!("let at_mine: i32 = select(0i, {mine}, at_live);"));
        l(self, e, format!("for (var at_j0: i32 = 0i; at_j0 < at_end; at_j0 = at_j0 + {keys}i) {{"));
        let f = e + 1;
        l(self, f, "workgroupBarrier();".into());
        // Each thread copies its share of the key and value tiles, a vector a slot; each slot's code
        // written out and the loads of up to eight slots issued before their stores, so they are in
        // flight together (a loop would wait for each load in turn).
        for (name, buffer, off, ld, width) in [("k", bk, "at_ok", &ldk, d), ("v", bv, "at_ov", &ldv, dv)] {
            let (n, w4) = (keys * width / 4, width / 4);
            let slots = n.div_ceil(threads);
            l(self, f, "{".into());
            for batch in (0..slots).step_by(LOADS_IN_FLIGHT as usize) {
                let batch = batch..(batch + LOADS_IN_FLIGHT).min(slots);
                for q in batch.clone() {
                    let ragged = (q + 1) * threads > n;
                    let inside = if ragged { format!("at_e{name}{q} < {n}i && ") } else { String::new() };
                    l(self, f + 1, format!("let at_e{name}{q}: i32 = local + {}i;", q * threads));
                    l(self, f + 1, format!("var at_x{name}{q}: vec4<f32> = vec4<f32>(0.0f);"));
                    l(self, f + 1, format!("let at_j{name}{q}: i32 = at_j0 + at_e{name}{q} / {w4}i;"));
                    let at = format!("{off} + at_j{name}{q} * {ld} + (at_e{name}{q} % {w4}i) * 4i");
                    let x = load4(buffer, &at);
                    l(self, f + 1, format!("if ({inside}at_j{name}{q} < {tk}) {{ at_x{name}{q} = {x}; }}"));
                }
                for q in batch {
                    let store = format!("at_{name}t[at_e{name}{q}] = at_x{name}{q};");
                    if (q + 1) * threads > n {
                        l(self, f + 1, format!("if (at_e{name}{q} < {n}i) {{ {store} }}"));
                    } else {
                        l(self, f + 1, store);
                    }
                }
            }
            l(self, f, "}".into());
        }
        l(self, f, "workgroupBarrier();".into());
        l(self, f, format!("let at_n: i32 = clamp(at_mine - at_j0, 0i, {keys}i);"));
        let bound = if split > 1 {
            // Shuffles need every lane of the subgroup: the chunks run to the workgroup's last key,
            // each thread masking the keys past its own.
            l(self, f, format!("let at_nall: i32 = clamp(at_end - at_j0, 0i, {keys}i);"));
            "at_nall"
        } else {
            "at_n"
        };
        l(self, f, format!("for (var at_c: i32 = 0i; at_c < {bound}; at_c = at_c + {chunk}i) {{"));
        let g = f + 1;
        l(self, g, format!("let at_kb: i32 = at_c * {d4}i + at_part * {dq}i;"));
        l(self, g, format!("let at_vb: i32 = at_c * {v4}i + at_part * {vq}i;"));
        let lowest = float_literal(LOWEST);
        for u in 0..chunk {
            let dots: Vec<String> = (0..dq).map(|c| format!("dot(at_q{c}, at_kt[at_kb + {}i])", u * d4 + c)).collect();
            l(self, g, format!("var at_s{u}: f32 = {};", dots.join(" + ")));
            // The query's other threads' partial scores (butterfly within adjacent lanes).
            let mut step = 1;
            while step < split {
                l(self, g, format!("at_s{u} = at_s{u} + subgroupShuffleXor(at_s{u}, {step}u);"));
                step *= 2;
            }
        }
        // With one thread a query the chunk's first key is always its own; later ones, or any with a
        // split query's chunks running to the workgroup's last key, may be past its last.
        let valid = |u: u32| if u == 0 && split == 1 { None } else { Some(format!("at_c + {u}i < at_n")) };
        let mut most = "at_m".to_string();
        for u in 0..chunk {
            let s = match valid(u) {
                Some(v) => format!("select({lowest}, at_s{u}, {v})"),
                None => format!("at_s{u}"),
            };
            most = format!("max({most}, {s})");
        }
        l(self, g, format!("let at_mc: f32 = {most};"));
        l(self, g, "let at_alpha: f32 = exp2(at_m - at_mc);".into());
        for u in 0..chunk {
            let p = match valid(u) {
                Some(v) => format!("select(0.0f, exp2(at_s{u} - at_mc), {v})"),
                None => format!("exp2(at_s{u} - at_mc)"),
            };
            l(self, g, format!("let at_p{u}: f32 = {p};"));
        }
        let sum: Vec<String> = (0..chunk).map(|u| format!("at_p{u}")).collect();
        l(self, g, format!("at_l = at_l * at_alpha + ({});", sum.join(" + ")));
        for c in 0..vq {
            let terms: Vec<String> = (0..chunk).map(|u| format!("at_p{u} * at_vt[at_vb + {}i]", u * v4 + c)).collect();
            l(self, g, format!("at_out{c} = at_out{c} * at_alpha + {};", terms.join(" + ")));
        }
        l(self, g, "at_m = at_mc;".into());
        l(self, f, "}".into());
        l(self, e, "}".into());
        // A row without keys is zeros (the written-out form's empty product); one whose every score is
        // -inf sums to 0 and divides into NaN, as the written-out softmax's 0/0 does.
        l(self, e, "if (at_live) {".into());
        l(self, e + 1, format!("let at_inv: f32 = select(1.0f / at_l, 0.0f, {tk} == 0i);"));
        l(self, e + 1, format!("let at_at: i32 = at_oo + at_row * {ldo} + at_part * {}i;", 4 * vq));
        for c in 0..vq {
            if vectors {
                l(self, e + 1, format!("b{bo}[at_at / 4i + {c}i] = at_out{c} * at_inv;"));
            } else {
                for i in 0..4 {
                    l(self, e + 1, format!("b{bo}[at_at + {}i] = at_out{c}[{i}] * at_inv;", 4 * c + i));
                }
            }
        }
        if let Some(s) = &a.second {
            let lds = self.expr(&s.ld);
            let ln2 = float_literal(std::f64::consts::LN_2);
            let lse = format!("b{}[at_os + at_row * {lds}] = (at_m + log2(at_l)) * {ln2};", s.buffer);
            l(self, e + 1, if split > 1 { format!("if (at_part == 0i) {{ {lse} }}") } else { lse });
        }
        l(self, e, "}".into());
        l(self, depth, "}".into());
    }

    /// Opens an f32 forward template's body ([`Writer::attention_entry`] for blocks of `rows` queries) and
    /// returns its operands as printed: the query and key lengths, the row strides of q, k, v and the
    /// output, and their buffers.
    pub(super) fn attention_operands(&mut self, depth: usize, a: &Attention, rows: u32) -> Operands {
        let (tq, tk) = (self.expr(&a.q_len), self.expr(&a.kv_len));
        self.attention_entry(depth, a, rows, &tq);
        let ld = [&a.q, &a.k, &a.v, &a.out].map(|o| self.expr(&o.ld));
        Operands { tq, tk, ld, buffers: [&a.q, &a.k, &a.v, &a.out].map(|o| o.buffer) }
    }

    /// Opens an attention kernel's body: which batch entry and which block of `rows` queries (of `tq`)
    /// this workgroup owns (`at_block`, in the order the kernel IR states), each operand's offset at that
    /// entry (`at_oq`, `at_ok`, `at_ov`, `at_oo`, and `at_os` for a second output), inside an `if` that
    /// groups past the last block skip (uniform in a workgroup, so barriers inside stay uniform). The
    /// caller closes it at `depth`.
    pub(super) fn attention_entry(&mut self, depth: usize, a: &Attention, rows: u32, tq: &str) {
        let mut entries = "1i".to_string();
        for b in &a.batch {
            entries = format!("{entries} * {}", self.expr(&b.extent));
        }
        let l = |w: &mut Self, depth: usize, s: String| w.line(depth, &s);
        l(self, depth, format!("let at_blocks: i32 = ({tq} + {}i) / {rows}i;", rows - 1));
        l(self, depth, format!("let at_entries: i32 = {entries};"));
        l(self, depth, "let at_step: i32 = group / max(at_entries, 1i);".into());
        // Groups past the last block (a folded grid's rounding) skip the whole body: the condition is
        // the same for every thread of a workgroup, so the barriers inside stay in uniform control flow.
        l(self, depth, "if (at_step < at_blocks) {".into());
        let e = depth + 1;
        let block = if a.last_blocks_first { "at_blocks - 1i - at_step" } else { "at_step" };
        l(self, e, format!("let at_block: i32 = {block};"));
        l(self, e, "var at_rest: i32 = group % max(at_entries, 1i);".into());
        // Each operand's offset at this batch entry.
        let operands: Vec<(&str, &RowsOperand)> =
            [("q", Some(&a.q)), ("k", Some(&a.k)), ("v", Some(&a.v)), ("o", Some(&a.out)), ("s", a.second.as_ref())]
                .into_iter()
                .filter_map(|(n, o)| o.map(|o| (n, o)))
                .collect();
        for (n, o) in &operands {
            let off = self.expr(&o.offset);
            l(self, e, format!("var at_o{n}: i32 = {off};"));
        }
        for b in a.batch.iter().rev() {
            let ext = self.expr(&b.extent);
            l(self, e, "{".into());
            l(self, e + 1, format!("let at_i: i32 = at_rest % {ext};"));
            l(self, e + 1, format!("at_rest = at_rest / {ext};"));
            for (n, _) in &operands {
                let stride = match *n {
                    "q" => &b.q,
                    "k" => &b.k,
                    "v" => &b.v,
                    "o" => &b.out,
                    _ => &b.second,
                };
                let s = self.expr(stride);
                l(self, e + 1, format!("at_o{n} = at_o{n} + at_i * {s};"));
            }
            l(self, e, "}".into());
        }
    }
}
