//! Flash attention's backward pass in PTX (`kernel::Attention` with a gradient pass): the probabilities
//! rebuilt from each query's log-sum-exp, tile by tile, on tensor cores. What it prints was decided in
//! `graph`; the pieces (fragments, score tiles, products) are the forward template's.
//!
//! The queries' gradient: each warp owns 16 queries and streams key and value tiles, as the forward
//! does: `s = q kᵀ`, `p = exp(s - lse)`, `dp = dout vᵀ`, `ds = p (dp - delta)`, `dq += ds k`. The keys'
//! and values' gradients: each warp owns 16 keys and streams query tiles (with their output gradients,
//! log-sum-exps and deltas): `sᵀ = k qᵀ`, `pᵀ = exp(sᵀ - lse)`, `dv += pᵀ dout`, and for the keys
//! `dpᵀ = v doutᵀ`, `dsᵀ = pᵀ (dpᵀ - delta)`, `dk += dsᵀ q`; one kernel computes both from one `pᵀ`
//! where `graph` paired them (`Attention::second`). The scale multiplies `dq` and `dk` once, at the end.

use super::attention::{Causal, TileCopy, LOG2_E};
use super::Writer;
use kiln_graph::ir::AttentionPart;
use kiln_graph::kernel::{Attention, AttentionPass, AttentionTile};

impl Writer<'_> {
    /// The body of a gradient pass of `a` for `part`.
    pub(super) fn attention_grad(&mut self, a: &Attention, part: AttentionPart) {
        let Some(ty) = self.attention_type(a) else { return };
        let AttentionTile { warps, keys: stream, vector, stages, .. } = a.tile;
        let (d, dv) = (a.head_dim, a.value_dim);
        let rows = a.tile.rows();
        if a.dout.is_none() || a.lse.is_none() || a.delta.is_none() {
            return self.fail("an attention gradient without its output gradient, log-sum-exp or delta".into());
        }
        if stages != 1 {
            return self.fail(format!("attention tile {:?}: the gradient templates copy one stage", a.tile));
        }
        if d % 16 != 0 || dv % 16 != 0 || stream % 16 != 0 || self.k.launch.threads != 32 * warps {
            return self.fail(format!("attention tile {:?} does not fit head dims {d}, {dv}", a.tile));
        }
        let by_queries = part == AttentionPart::Queries;
        // The keys' gradient with the values' beside it (`Attention::second`): one walk over the query
        // tiles, the probabilities computed once for both.
        let with_values = a.second.is_some();
        if with_values && a.pass.second() != Some(AttentionPass::Grad(AttentionPart::Values)) {
            return self.fail(format!("a second output beside the {part:?} gradient"));
        }
        // The block this workgroup owns (queries, or keys) and the tiles it streams (keys, or queries).
        let (own_len, stream_len) = if by_queries { (&a.q_len, &a.kv_len) } else { (&a.kv_len, &a.q_len) };
        let (own_len, stream_len) = (self.expr(own_len), self.expr(stream_len));
        let e = self.attention_entry(a, &own_len, rows);
        let [pq, pk, pv, _, pdo, plse, pdelta, _] = e.ptr.clone();
        let [lq, lk, lv, lout, ldo, llse, ldelta, _] = e.ld.clone();
        let lanes = self.attention_lanes();
        let name = self.k.name.clone();
        // Shared arrays: the owned block's two operands, the streamed tile's two, and (streaming queries)
        // the tile's log-sum-exps and deltas.
        let (own_a, own_b, str_a, str_b) = if by_queries {
            (
                (pq.clone(), lq.clone(), d),
                (pdo.clone(), ldo.clone(), dv),
                (pk.clone(), lk.clone(), d),
                (pv.clone(), lv.clone(), dv),
            )
        } else {
            (
                (pk.clone(), lk.clone(), d),
                (pv.clone(), lv.clone(), dv),
                (pq.clone(), lq.clone(), d),
                (pdo.clone(), ldo.clone(), dv),
            )
        };
        let pitch = |w: u32| AttentionTile::smem_row(w);
        let mut smem = Vec::new();
        for (x, n, w) in
            [("oa", rows, own_a.2), ("ob", rows, own_b.2), ("sa", stream, str_a.2), ("sb", stream, str_b.2)]
        {
            let arr = format!("{name}_{x}");
            self.extra_shared.push(format!(".shared .align 16 .b8 {arr}[{}];", 2 * n * pitch(w)));
            let r = self.reg("u32");
            self.emit(&format!("mov.u32 {r}, {arr};"));
            smem.push(r);
        }
        let stats = if by_queries {
            None
        } else {
            let arr = format!("{name}_stats");
            self.extra_shared.push(format!(".shared .align 16 .b8 {arr}[{}];", 8 * stream));
            let r = self.reg("u32");
            self.emit(&format!("mov.u32 {r}, {arr};"));
            Some(r)
        };
        let tid = lanes.tid.clone();
        // The owned block into A fragments: the first operand always (q, or k), the second where the
        // pass needs it (the output gradient for dq, the values for dk).
        let needs_b = by_queries || part == AttentionPart::Keys;
        for (operand, sm) in [(&own_a, &smem[0]), (&own_b, &smem[1])].into_iter().take(1 + usize::from(needs_b)) {
            let (ptr, ld, width) = operand;
            self.stage_tile(
                (ptr, ld),
                &e.start,
                &own_len,
                (rows, *width, pitch(*width)),
                sm,
                &tid,
                TileCopy::Loads(vector),
            );
        }
        self.emit("bar.sync 0;");
        let fa = self.a_fragments(&lanes, &smem[0], pitch(own_a.2), own_a.2);
        let fb = if needs_b { self.a_fragments(&lanes, &smem[1], pitch(own_b.2), own_b.2) } else { Vec::new() };
        // This thread's two owned rows (absolute).
        let own_row = self.attention_rows(&lanes, &e.start);
        // Per owned query row (dq): its log-sum-exp in base 2 and its delta.
        let row_stats: Vec<(String, String)> = if by_queries {
            own_row
                .iter()
                .map(|r| {
                    let (l, dl) = (self.reg("f32"), self.reg("f32"));
                    self.load_row_stat(&plse, &llse, r, &own_len, &l, Some(LOG2_E));
                    self.load_row_stat(&pdelta, &ldelta, r, &own_len, &dl, None);
                    (l, dl)
                })
                .collect()
        } else {
            Vec::new()
        };
        let width = match part {
            AttentionPart::Queries | AttentionPart::Keys => d,
            AttentionPart::Values => dv,
        };
        let acc: Vec<Vec<String>> = (0..width / 8).map(|_| (0..4).map(|_| self.reg("f32")).collect()).collect();
        let acc_v: Vec<Vec<String>> =
            (0..if with_values { dv / 8 } else { 0 }).map(|_| (0..4).map(|_| self.reg("f32")).collect()).collect();
        for x in acc.iter().chain(&acc_v).flatten() {
            self.emit(&format!("mov.f32 {x}, 0f00000000;"));
        }
        // Streamed tiles: all, or (causal) for queries those with a key at or before the block's last
        // query, for keys those with a query at or after the block's first key.
        let (first, steps) = (self.reg("s64"), self.reg("s64"));
        self.emit(&format!("mov.s64 {first}, 0;"));
        self.emit(&format!("add.s64 {steps}, {stream_len}, {};", stream - 1));
        self.emit(&format!("div.s64 {steps}, {steps}, {stream};"));
        if a.causal {
            if by_queries {
                let c = self.reg("s64");
                self.emit(&format!("add.s64 {c}, {}, {};", e.start, rows + stream - 1));
                self.emit(&format!("div.s64 {c}, {c}, {stream};"));
                self.emit(&format!("min.s64 {steps}, {steps}, {c};"));
            } else {
                self.emit(&format!("div.s64 {first}, {}, {stream};", e.start));
            }
        }
        let (ba, bb) = (
            self.b_lane_address(&lanes, &smem[2], pitch(str_a.2), false),
            self.b_lane_address(&lanes, &smem[3], pitch(str_b.2), false),
        );
        let ba_t = self.b_lane_address(&lanes, &smem[2], pitch(str_a.2), true);
        let bb_t = self.b_lane_address(&lanes, &smem[3], pitch(str_b.2), true);
        let c = super::f32_imm(a.scale * LOG2_E);

        let tiles = self.begin_tiles(&first, &steps, stream);
        let s0 = tiles.start.clone();
        self.stage_tile(
            (&str_a.0, &str_a.1),
            &s0,
            &stream_len,
            (stream, str_a.2, pitch(str_a.2)),
            &smem[2],
            &tid,
            TileCopy::Loads(vector),
        );
        if needs_b || by_queries || part == AttentionPart::Values {
            self.stage_tile(
                (&str_b.0, &str_b.1),
                &s0,
                &stream_len,
                (stream, str_b.2, pitch(str_b.2)),
                &smem[3],
                &tid,
                TileCopy::Loads(vector),
            );
        }
        if let Some(st) = &stats {
            self.stage_stats(st, stream, &s0, &stream_len, (&plse, &llse), (&pdelta, &ldelta), &tid);
        }
        self.emit("bar.sync 0;");
        // Scores of the owned rows against the tile, in base 2.
        let s = self.score_tiles(ty, &fa, &ba, pitch(str_a.2), stream, own_a.2);
        for x in s.iter().flatten() {
            self.emit(&format!("mul.f32 {x}, {x}, {c};"));
        }
        // Masks: streamed rows past the end, and (causal) keys after their query.
        let needs = self.reg("pred");
        let end = self.reg("s64");
        self.emit(&format!("add.s64 {end}, {s0}, {stream};"));
        self.emit(&format!("setp.gt.s64 {needs}, {end}, {stream_len};"));
        if a.causal {
            let cp = self.reg("pred");
            if by_queries {
                self.emit(&format!("setp.gt.s64 {cp}, {end}, {};", e.start));
            } else {
                let last = self.reg("s64");
                self.emit(&format!("add.s64 {last}, {}, {rows};", e.start));
                self.emit(&format!("setp.lt.s64 {cp}, {s0}, {last};"));
            }
            self.emit(&format!("or.pred {needs}, {needs}, {cp};"));
        }
        let unmasked = self.label();
        self.emit(&format!("@!{needs} bra {unmasked};"));
        // Queries own rows: keys (columns) after their query (row); keys own rows: queries (columns)
        // before their key (row).
        let rule = if by_queries { Causal::ColumnsAfterRow } else { Causal::ColumnsBeforeRow };
        self.mask_tile(&s, &lanes.t4, &s0, &stream_len, a.causal.then_some((rule, &own_row)));
        self.place(&unmasked);
        // Probabilities: exp2(s - lse2) with the row's (dq) or the column's (dk, dv) log-sum-exp.
        let col_stats = stats.as_ref().map(|st| self.tile_stats(&lanes, st, stream));
        for (nt, tile) in s.iter().enumerate() {
            for (el, x) in tile.iter().enumerate() {
                let l = match &col_stats {
                    None => &row_stats[el / 2].0,
                    Some(cs) => &cs[nt][el % 2].0,
                };
                self.emit(&format!("sub.f32 {x}, {x}, {l};"));
                self.emit(&format!("ex2.approx.ftz.f32 {x}, {x};"));
            }
        }
        if part == AttentionPart::Values {
            // dv += pᵀ · dout.
            let frags = self.probability_fragments(ty, &s);
            self.accumulate(ty, &acc, &frags, &bb_t, pitch(str_b.2), width);
        } else {
            if with_values {
                // dv += pᵀ · dout, before the probabilities become the scores' gradient.
                let frags = self.probability_fragments(ty, &s);
                self.accumulate(ty, &acc_v, &frags, &bb_t, pitch(str_b.2), dv);
            }
            // dp = dout · vᵀ (queries own rows) or dpᵀ = v · doutᵀ (keys own rows): the owned second
            // operand's fragments against the tile's second operand.
            let dpt = self.score_tiles(ty, &fb, &bb, pitch(str_b.2), stream, own_b.2);
            for (nt, (pt, dt)) in s.iter().zip(&dpt).enumerate() {
                for (el, (x, y)) in pt.iter().zip(dt).enumerate() {
                    let dl = match &col_stats {
                        None => &row_stats[el / 2].1,
                        Some(cs) => &cs[nt][el % 2].1,
                    };
                    self.emit(&format!("sub.f32 {y}, {y}, {dl};"));
                    self.emit(&format!("mul.f32 {x}, {x}, {y};"));
                }
            }
            // dq += ds · k, or dk += dsᵀ · q: the tile's first operand, read transposed.
            let frags = self.probability_fragments(ty, &s);
            self.accumulate(ty, &acc, &frags, &ba_t, pitch(str_a.2), width);
        }
        self.end_tiles(&tiles);
        let out_scale = super::f32_imm(if part == AttentionPart::Values { 1.0 } else { a.scale });
        let mul: [String; 2] = std::array::from_fn(|_| self.reg("f32"));
        for m in &mul {
            self.emit(&format!("mov.f32 {m}, {out_scale};"));
        }
        self.store_rows(ty, &acc, (&own_row, &own_len), (&e.ptr[3], &lout), &mul, &lanes);
        if with_values {
            for m in &mul {
                self.emit(&format!("mov.f32 {m}, {};", super::f32_imm(1.0)));
            }
            self.store_rows(ty, &acc_v, (&own_row, &own_len), (&e.ptr[7], &e.ld[7]), &mul, &lanes);
        }
    }
}
