//! The f32 attention template on registers (`AttentionUnits::Registers`), spelled in WGSL: the same
//! division as the PTX renderer's (`graph` chose it, `attention::tile`). A workgroup owns 64 queries;
//! eight threads share a row of them, each thread a block of `thread_rows` queries × 8 keys of a 64-key
//! tile's scores (keys `4c..4c+4` and `32+4c..`) and of `thread_rows` queries × `dv / 8` output columns.
//! The query block (pre-scaled into base 2) and each key tile lie transposed in workgroup memory, so
//! four of a thread's queries or keys at one depth are one `vec4` read; each score tile's row max meets
//! across its eight threads by subgroup shuffles where `graph` planned them (`AttentionTile::row_shuffles`:
//! WGSL's subgroups are optional), else through workgroup memory; the
//! probabilities, written transposed over the key tile, are read back by the second product with the
//! value tile. Forward pass only.

use super::attention::Operands;
use super::{float_literal, Writer};
use kiln_graph::kernel::{Attention, AttentionTile, RegisterColumns, REGISTER_COLUMN_THREADS};

/// Below any score (a finite stand-in for `-inf`: WGSL may assume values are finite).
const LOWEST: f64 = -3.0e38;

/// The thread's output accumulators for `graph`'s column layout (`AttentionTile::register_columns`):
/// one `vec4` a 4-column vector, else one `f32` a column (WGSL reads the value tile as `vec4`s, so a
/// narrower vector is read a lane at a time), with the column each starts at, from `cg * stride`.
fn accumulators(cols: &RegisterColumns) -> Vec<(u32, bool)> {
    if cols.width == 4 {
        cols.offsets.iter().map(|&o| (o, true)).collect()
    } else {
        cols.each().map(|(o, l)| (o + l, false)).collect()
    }
}

impl Writer<'_> {
    /// The whole body of an f32 forward attention on registers.
    pub(super) fn attention_registers(&mut self, depth: usize, a: &Attention) {
        let t = a.tile;
        let (d, dv) = (a.head_dim, a.value_dim);
        if !self.attention_fits(a, "registers", t.registers_unfit(d, dv)) {
            return;
        }
        let (rows, keys, rq) = (t.rows(), t.keys, t.thread_rows);
        let n = REGISTER_COLUMN_THREADS;
        // `vec4`s in a row of the transposed query block and key tile (and of the probabilities).
        let (qr4, kr4) = (rows / 4, keys / 4);
        self.attention_arrays =
            vec![("ar_qt", rows * d / 4), ("ar_kt", keys * d.max(rows) / 4), ("ar_vt", keys * dv / 4)];
        let l = |w: &mut Self, depth: usize, s: String| w.line(depth, &s);
        let Operands { tq, tk, ld: [ldq, ldk, ldv, ldo], buffers: [bq, bk, bv, bo] } =
            self.attention_operands(depth, a, rows);
        let e = depth + 1;
        let vectors = t.vector == 4;
        if vectors {
            self.attention_vec4.extend([bq, bk, bv]);
        }
        l(self, e, format!("let ar_qg: i32 = local / {n}i;"));
        l(self, e, format!("let ar_cg: i32 = local % {n}i;"));
        l(self, e, format!("let ar_q0: i32 = at_block * {rows}i;"));
        let scale = float_literal(a.scale * std::f64::consts::LOG2_E);
        let q = Staged { buffer: bq, offset: "at_oq", ld: &ldq, row0: "ar_q0", limit: &tq, scale: Some(&scale) };
        self.stage_registers(e, &q, (rows, d), "ar_qt", true, vectors);
        for r in 0..rq {
            l(self, e, format!("var ar_m{r}: f32 = {};", float_literal(LOWEST)));
            l(self, e, format!("var ar_l{r}: f32 = 0.0f;"));
        }
        let cols = AttentionTile::register_columns(dv);
        let acc = accumulators(&cols);
        for r in 0..rq {
            for (j, &(_, vector)) in acc.iter().enumerate() {
                let ty = if vector { "vec4<f32>" } else { "f32" };
                l(self, e, format!("var ar_o{r}_{j}: {ty} = {ty}(0.0f);"));
            }
        }
        let end = if a.causal { format!("min({tk}, ar_q0 + {rows}i)") } else { tk.clone() };
        l(self, e, format!("let ar_end: i32 = {end};"));
        l(self, e, format!("for (var ar_j0: i32 = 0i; ar_j0 < ar_end; ar_j0 = ar_j0 + {keys}i) {{"));
        let f = e + 1;
        l(self, f, "workgroupBarrier();".into());
        let k = Staged { buffer: bk, offset: "at_ok", ld: &ldk, row0: "ar_j0", limit: &tk, scale: None };
        self.stage_registers(f, &k, (keys, d), "ar_kt", true, vectors);
        let v = Staged { buffer: bv, offset: "at_ov", ld: &ldv, row0: "ar_j0", limit: &tk, scale: None };
        self.stage_registers(f, &v, (keys, dv), "ar_vt", false, vectors);
        l(self, f, "workgroupBarrier();".into());
        // Scores: each row's keys `4 cg..` (`a`) and `32 + 4 cg..` (`b`), summed over the depth in order.
        for r in 0..rq {
            l(self, f, format!("var ar_s{r}a: vec4<f32> = vec4<f32>(0.0f);"));
            l(self, f, format!("var ar_s{r}b: vec4<f32> = vec4<f32>(0.0f);"));
        }
        let unroll = t.chunk;
        // The thread's second 4-key vector, after its first (`AttentionTile::register_keys`).
        let second = t.register_keys()[4];
        l(self, f, format!("for (var ar_dd: i32 = 0i; ar_dd < {d}i; ar_dd = ar_dd + {unroll}i) {{"));
        for u in 0..unroll {
            let g = f + 1;
            let qs: Vec<String> =
                (0..rq / 4).map(|j| format!("ar_qt[(ar_dd + {u}i) * {qr4}i + ar_qg * {}i + {j}i]", rq / 4)).collect();
            for (j, x) in qs.iter().enumerate() {
                l(self, g, format!("let ar_q{u}_{j}: vec4<f32> = {x};"));
            }
            l(self, g, format!("let ar_ka{u}: vec4<f32> = ar_kt[(ar_dd + {u}i) * {kr4}i + ar_cg];"));
            l(self, g, format!("let ar_kb{u}: vec4<f32> = ar_kt[(ar_dd + {u}i) * {kr4}i + {}i + ar_cg];", second / 4));
            for r in 0..rq {
                let qv = format!("ar_q{u}_{}[{}]", r / 4, r % 4);
                l(self, g, format!("ar_s{r}a = fma(vec4<f32>({qv}), ar_ka{u}, ar_s{r}a);"));
                l(self, g, format!("ar_s{r}b = fma(vec4<f32>({qv}), ar_kb{u}, ar_s{r}b);"));
            }
        }
        l(self, f, "}".into());
        // Masks: keys past the end and (causal) after the query, as the lowest value.
        let lowest = format!("vec4<f32>({})", float_literal(LOWEST));
        l(self, f, "let ar_ka: vec4<i32> = vec4<i32>(ar_j0 + 4i * ar_cg) + vec4<i32>(0i, 1i, 2i, 3i);".into());
        l(self, f, format!("let ar_kb: vec4<i32> = ar_ka + vec4<i32>({second}i);"));
        for r in 0..rq {
            let lim = if a.causal { format!("min({tk}, ar_q0 + ar_qg * {rq}i + {}i)", r + 1) } else { tk.clone() };
            l(self, f, format!("let ar_lim{r}: vec4<i32> = vec4<i32>({lim});"));
            l(self, f, format!("ar_s{r}a = select({lowest}, ar_s{r}a, ar_ka < ar_lim{r});"));
            l(self, f, format!("ar_s{r}b = select({lowest}, ar_s{r}b, ar_kb < ar_lim{r});"));
        }
        // Each row's max over its eight threads: by subgroup shuffles where `graph` planned them, else
        // through the key tile's memory once every thread is done reading it.
        let slots = rq / 4;
        let own = |r: u32| {
            let half = |h: &str| format!("max(max(ar_s{r}{h}.x, ar_s{r}{h}.y), max(ar_s{r}{h}.z, ar_s{r}{h}.w))");
            format!("max({}, {})", half("a"), half("b"))
        };
        if t.row_shuffles {
            for r in 0..rq {
                l(self, f, format!("var ar_rm{r}: f32 = {};", own(r)));
                for step in [1, 2, 4] {
                    l(self, f, format!("ar_rm{r} = max(ar_rm{r}, subgroupShuffleXor(ar_rm{r}, {step}u));"));
                }
            }
        } else {
            l(self, f, "workgroupBarrier();".into());
            for j in 0..slots {
                let mx: Vec<String> = (4 * j..4 * j + 4).map(own).collect();
                l(self, f, format!("ar_kt[local * {slots}i + {j}i] = vec4<f32>({});", mx.join(", ")));
            }
            l(self, f, "workgroupBarrier();".into());
            for j in 0..slots {
                l(self, f, format!("var ar_mx{j}: vec4<f32> = ar_kt[(ar_qg * {n}i) * {slots}i + {j}i];"));
                for other in 1..n {
                    l(
                        self,
                        f,
                        format!("ar_mx{j} = max(ar_mx{j}, ar_kt[(ar_qg * {n}i + {other}i) * {slots}i + {j}i]);"),
                    );
                }
            }
            for r in 0..rq {
                l(self, f, format!("let ar_rm{r}: f32 = ar_mx{}[{}];", r / 4, r % 4));
            }
        }
        // Every thread is done with the key tile (and the maxes in it) before the probabilities take it.
        l(self, f, "workgroupBarrier();".into());
        // Online softmax: rescale what was summed, exponentials (zero where masked).
        let half = format!("vec4<f32>({})", float_literal(LOWEST / 2.0));
        for r in 0..rq {
            l(self, f, format!("let ar_mc{r}: f32 = max(ar_m{r}, ar_rm{r});"));
            l(self, f, format!("let ar_al{r}: f32 = exp2(ar_m{r} - ar_mc{r});"));
            for h in ["a", "b"] {
                let p = format!("exp2(ar_s{r}{h} - vec4<f32>(ar_mc{r}))");
                l(self, f, format!("ar_s{r}{h} = select(vec4<f32>(0.0f), {p}, ar_s{r}{h} > {half});"));
            }
            l(self, f, format!("ar_l{r} = ar_l{r} * ar_al{r} + dot(ar_s{r}a + ar_s{r}b, vec4<f32>(1.0f));"));
            l(self, f, format!("ar_m{r} = ar_mc{r};"));
            for j in 0..acc.len() {
                l(self, f, format!("ar_o{r}_{j} = ar_o{r}_{j} * ar_al{r};"));
            }
        }
        // The probabilities, transposed (key-major, `rows` queries a key) over the key tile.
        for (h, base) in [("a", 0), ("b", second)] {
            for c in 0..4 {
                for j in 0..slots {
                    let p: Vec<String> = (4 * j..4 * j + 4).map(|r| format!("ar_s{r}{h}[{c}]")).collect();
                    let key = format!("(4i * ar_cg + {}i)", base + c);
                    l(
                        self,
                        f,
                        format!("ar_kt[{key} * {qr4}i + ar_qg * {slots}i + {j}i] = vec4<f32>({});", p.join(", ")),
                    );
                }
            }
        }
        l(self, f, "workgroupBarrier();".into());
        // Output += probabilities · values, over the tile's keys in order.
        l(self, f, format!("for (var ar_kk: i32 = 0i; ar_kk < {keys}i; ar_kk = ar_kk + {unroll}i) {{"));
        for u in 0..unroll {
            let g = f + 1;
            for j in 0..slots {
                l(
                    self,
                    g,
                    format!("let ar_p{u}_{j}: vec4<f32> = ar_kt[(ar_kk + {u}i) * {qr4}i + ar_qg * {slots}i + {j}i];"),
                );
            }
            for (j, &(first, vector)) in acc.iter().enumerate() {
                let at = format!("(ar_kk + {u}i) * {dv}i + ar_cg * {}i + {first}i", cols.stride);
                let (ty, v) = if vector {
                    ("vec4<f32>", format!("ar_vt[({at}) / 4i]"))
                } else {
                    ("f32", format!("ar_vt[({at}) / 4i][({at}) % 4i]"))
                };
                l(self, g, format!("let ar_v{u}_{j}: {ty} = {v};"));
                for r in 0..rq {
                    let p = format!("ar_p{u}_{}[{}]", r / 4, r % 4);
                    let p = if vector { format!("vec4<f32>({p})") } else { p };
                    l(self, g, format!("ar_o{r}_{j} = fma({p}, ar_v{u}_{j}, ar_o{r}_{j});"));
                }
            }
        }
        l(self, f, "}".into());
        l(self, e, "}".into());
        // Each row's sum over its eight threads, as its max was met; then divide and store. A row without
        // keys is zeros (the written-out form's empty product); one whose every score is masked sums
        // to 0 and divides into NaN, as the written-out softmax's 0/0 does.
        if t.row_shuffles {
            for r in 0..rq {
                l(self, e, format!("var ar_sum_{r}: f32 = ar_l{r};"));
                for step in [1, 2, 4] {
                    l(self, e, format!("ar_sum_{r} = ar_sum_{r} + subgroupShuffleXor(ar_sum_{r}, {step}u);"));
                }
            }
        } else {
            l(self, e, "workgroupBarrier();".into());
            for j in 0..slots {
                let sums: Vec<String> = (4 * j..4 * j + 4).map(|r| format!("ar_l{r}")).collect();
                l(self, e, format!("ar_kt[local * {slots}i + {j}i] = vec4<f32>({});", sums.join(", ")));
            }
            l(self, e, "workgroupBarrier();".into());
            for j in 0..slots {
                l(self, e, format!("var ar_sum{j}: vec4<f32> = vec4<f32>(0.0f);"));
                for other in 0..n {
                    l(self, e, format!("ar_sum{j} = ar_sum{j} + ar_kt[(ar_qg * {n}i + {other}i) * {slots}i + {j}i];"));
                }
            }
            for r in 0..rq {
                l(self, e, format!("let ar_sum_{r}: f32 = ar_sum{}[{}];", r / 4, r % 4));
            }
        }
        for r in 0..rq {
            l(self, e, format!("let ar_row{r}: i32 = ar_q0 + ar_qg * {rq}i + {r}i;"));
            l(self, e, format!("if (ar_row{r} < {tq}) {{"));
            let g = e + 1;
            l(self, g, format!("let ar_inv: f32 = select(1.0f / ar_sum_{r}, 0.0f, {tk} == 0i);"));
            l(self, g, format!("let ar_at: i32 = at_oo + ar_row{r} * {ldo};"));
            for (j, &(first, vector)) in acc.iter().enumerate() {
                let col = format!("ar_cg * {}i + {first}i", cols.stride);
                if vector {
                    for c in 0..4 {
                        l(self, g, format!("b{bo}[ar_at + {col} + {c}i] = ar_o{r}_{j}[{c}] * ar_inv;"));
                    }
                } else {
                    l(self, g, format!("b{bo}[ar_at + {col}] = ar_o{r}_{j} * ar_inv;"));
                }
            }
            l(self, e, "}".into());
        }
        l(self, depth, "}".into());
    }

    /// Copies `rows × cols` f32 elements of an operand (rows from `row0`, those at or past `limit` zeros,
    /// each multiplied by `scale` where given) into the workgroup array `name` of `vec4`s: as they lie
    /// (rows of `cols`), or `transposed` (`cols` rows of `rows`, consecutive threads taking consecutive
    /// rows). Every thread issues its loads before its stores, so they are in flight together.
    fn stage_registers(
        &mut self,
        depth: usize,
        s: &Staged,
        (rows, cols): (u32, u32),
        name: &str,
        transposed: bool,
        vectors: bool,
    ) {
        let threads = self.k.launch.threads;
        let per_row = cols / 4;
        let pieces = rows * per_row;
        let count = pieces.div_ceil(threads);
        let Staged { buffer, offset, ld, row0, limit, scale } = *s;
        self.line(depth, "{");
        let d = depth + 1;
        for i in 0..count {
            self.line(d, &format!("let ar_e{i}: i32 = local + {}i;", i * threads));
            let (r, c) = if transposed {
                (format!("(ar_e{i} % {rows}i)"), format!("(ar_e{i} / {rows}i)"))
            } else {
                (format!("(ar_e{i} / {per_row}i)"), format!("(ar_e{i} % {per_row}i)"))
            };
            self.line(d, &format!("let ar_r{i}: i32 = {r};"));
            self.line(d, &format!("let ar_c{i}: i32 = {c};"));
            self.line(d, &format!("var ar_x{i}: vec4<f32> = vec4<f32>(0.0f);"));
            let at = format!("{offset} + ({row0} + ar_r{i}) * {ld} + ar_c{i} * 4i");
            let x = if vectors {
                format!("b{buffer}[({at}) / 4i]")
            } else {
                let xs: Vec<String> = (0..4).map(|l| format!("b{buffer}[{at} + {l}i]")).collect();
                format!("vec4<f32>({})", xs.join(", "))
            };
            let x = match scale {
                Some(m) => format!("{x} * {m}"),
                None => x,
            };
            let inside = if (i + 1) * threads > pieces { format!("ar_e{i} < {pieces}i && ") } else { String::new() };
            self.line(d, &format!("if ({inside}{row0} + ar_r{i} < {limit}) {{ ar_x{i} = {x}; }}"));
        }
        for i in 0..count {
            let mut stores = Vec::new();
            if transposed {
                for l in 0..4 {
                    stores.push(format!(
                        "{name}[(4i * ar_c{i} + {l}i) * {}i + ar_r{i} / 4i][ar_r{i} % 4i] = ar_x{i}[{l}];",
                        rows / 4
                    ));
                }
            } else {
                stores.push(format!("{name}[ar_r{i} * {per_row}i + ar_c{i}] = ar_x{i};"));
            }
            let all = stores.join(" ");
            if (i + 1) * threads > pieces {
                self.line(d, &format!("if (ar_e{i} < {pieces}i) {{ {all} }}"));
            } else {
                self.line(d, &all);
            }
        }
        self.line(depth, "}");
    }
}

/// An operand a workgroup copies into its workgroup memory ([`Writer::stage_registers`]).
struct Staged<'s> {
    buffer: usize,
    offset: &'s str,
    ld: &'s str,
    row0: &'s str,
    limit: &'s str,
    scale: Option<&'s str>,
}
