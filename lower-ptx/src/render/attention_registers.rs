//! The f32 attention template on registers (`AttentionUnits::Registers`), in PTX: flash attention's
//! forward pass with both products tiled as a matrix product is on lanes without matrix units. What it
//! prints was decided in `graph` (the tile, the load width); this file only spells it.
//!
//! A workgroup owns 64 queries; its threads form groups of `thread_rows` queries (4 or 8) × 8 threads,
//! each thread a block of `thread_rows` queries × 8 keys of a 64-key tile's scores (keys `4c..4c+4` and
//! `32+4c..`, so the eight threads of a group read 128 consecutive bytes of a key row: no bank
//! conflicts) and of `thread_rows` queries × `dv / 8` output columns. The query block and each key tile
//! lie transposed in shared memory (depth by rows), so four of a thread's queries or keys at one depth
//! are one 16-byte read; the scores,
//! turned into probabilities by the online softmax (a row's max and sum met across its eight threads by
//! shuffles), are written transposed over the key tile they were computed from, and the second product
//! reads them with the value tile as the first read queries and keys. Each product walks its depth in
//! loops of `AttentionTile::chunk` unrolled steps.

use super::Writer;
use kiln_graph::dtype::DType;
use kiln_graph::kernel::{Attention, AttentionPass, AttentionTile, REGISTER_COLUMN_THREADS};

use super::attention::LOG2_E;

/// A vector type suffix for `width` f32 lanes (`""` for one).
fn vec_of(width: u32) -> &'static str {
    match width {
        4 => ".v4",
        2 => ".v2",
        _ => "",
    }
}

/// `{a, b, ..}` for a vector operand, or the one register.
fn braced(regs: &[String]) -> String {
    if regs.len() == 1 {
        regs[0].clone()
    } else {
        format!("{{{}}}", regs.join(", "))
    }
}

impl Writer<'_> {
    /// The whole kernel body of an f32 forward attention on registers.
    pub(super) fn attention_registers(&mut self, a: &Attention) {
        let (d, dv) = (a.head_dim, a.value_dim);
        if a.dtype != DType::F32 || a.pass != AttentionPass::Forward || a.second.is_some() {
            return self.fail(format!(
                "the registers attention template runs an f32 forward pass alone, not {:?} over {}",
                a.pass, a.dtype
            ));
        }
        if let Some(why) = a.tile.registers_unfit(d, dv) {
            return self.fail(why);
        }
        if !a.tile.row_shuffles {
            // A warp is a subgroup of 32: `graph` plans shuffles for every CUDA target.
            return self.fail(format!("attention tile {:?}: this renderer meets a row's threads by shuffles", a.tile));
        }
        let (rows, keys) = (a.tile.rows(), a.tile.keys);
        if self.k.launch.threads != a.tile.threads() {
            return self.fail(format!("attention tile {:?} launched with {} threads", a.tile, self.k.launch.threads));
        }
        let vector = a.tile.vector;
        let name = &self.k.name;
        let [sq, sk, sv] = ["q", "k", "v"].map(|x| format!("{name}_{x}"));
        // The query block transposed (d × rows), the key tile transposed (d × keys) whose place the
        // probabilities (keys × rows) take, the value tile (keys × dv).
        self.extra_shared.push(format!(".shared .align 16 .b8 {sq}[{}];", 4 * rows * d));
        self.extra_shared.push(format!(".shared .align 16 .b8 {sk}[{}];", 4 * keys * d.max(rows)));
        self.extra_shared.push(format!(".shared .align 16 .b8 {sv}[{}];", 4 * keys * dv));
        let (smq, smk, smv) = (self.reg("u32"), self.reg("u32"), self.reg("u32"));
        self.emit(&format!("mov.u32 {smq}, {sq};"));
        self.emit(&format!("mov.u32 {smk}, {sk};"));
        self.emit(&format!("mov.u32 {smv}, {sv};"));
        let (tq, tk) = (self.expr(&a.q_len), self.expr(&a.kv_len));
        let e = self.attention_entry(a, &tq, rows);
        let q0 = e.start.clone();

        // This thread's group of queries (`qg`) and its place among the eight threads of a row (`cg`): a
        // warp holds four groups, each on eight consecutive lanes.
        let (tid, qg, cg) = (self.reg("u32"), self.reg("u32"), self.reg("u32"));
        self.emit(&format!("mov.u32 {tid}, %tid.x;"));
        self.emit(&format!("shr.u32 {qg}, {tid}, 3;"));
        self.emit(&format!("and.b32 {cg}, {tid}, {};", REGISTER_COLUMN_THREADS - 1));
        let thread_rows = a.tile.thread_rows;
        let rq = thread_rows as usize;
        // This thread's query rows (absolute).
        let qrow: Vec<String> = (0..thread_rows)
            .map(|r| {
                let (x, row) = (self.reg("u32"), self.reg("s64"));
                self.emit(&format!("mad.lo.u32 {x}, {qg}, {thread_rows}, {r};"));
                self.emit(&format!("cvt.u64.u32 {row}, {x};"));
                self.emit(&format!("add.s64 {row}, {row}, {q0};"));
                row
            })
            .collect();

        self.stage_f32((&e.ptr[0], &e.ld[0]), (&q0, &tq), (rows, d), &smq, true, &tid, vector);

        // Running state per row: max (base 2), this thread's share of the sum, and the output block.
        let m: Vec<String> = (0..rq).map(|_| self.reg("f32")).collect();
        let lsum: Vec<String> = (0..rq).map(|_| self.reg("f32")).collect();
        for x in &m {
            self.emit(&format!("mov.f32 {x}, 0fFF800000;"));
        }
        for x in &lsum {
            self.emit(&format!("mov.f32 {x}, 0f00000000;"));
        }
        let cols = AttentionTile::register_columns(dv);
        let per_row = cols.count();
        let o: Vec<Vec<String>> = (0..rq).map(|_| (0..per_row).map(|_| self.reg("f32")).collect()).collect();
        for x in o.iter().flatten() {
            self.emit(&format!("mov.f32 {x}, 0f00000000;"));
        }

        // Key tiles to visit: all of them, or (causal) those with a key at or before the block's last query.
        let steps = self.reg("s64");
        self.emit(&format!("add.s64 {steps}, {tk}, {};", keys - 1));
        self.emit(&format!("div.s64 {steps}, {steps}, {keys};"));
        if a.causal {
            let c = self.reg("s64");
            self.emit(&format!("add.s64 {c}, {q0}, {};", rows + keys - 1));
            self.emit(&format!("div.s64 {c}, {c}, {keys};"));
            self.emit(&format!("min.s64 {steps}, {steps}, {c};"));
        }
        // Shared addresses: this group's queries (in the query block and in the probabilities, both
        // rows-innermost), this thread's keys (in the key tile) and columns (in the value tile), and where
        // it writes its probabilities (its first key's row of them, its group's queries).
        let (qa, pa, ka, va) = (self.reg("u32"), self.reg("u32"), self.reg("u32"), self.reg("u32"));
        self.emit(&format!("mad.lo.u32 {qa}, {qg}, {}, {smq};", 4 * thread_rows));
        self.emit(&format!("mad.lo.u32 {pa}, {qg}, {}, {smk};", 4 * thread_rows));
        self.emit(&format!("mad.lo.u32 {ka}, {cg}, 16, {smk};"));
        let pw = self.reg("u32");
        self.emit(&format!("mad.lo.u32 {pw}, {cg}, {}, {pa};", 16 * rows));
        self.emit(&format!("mad.lo.u32 {va}, {cg}, {}, {smv};", 4 * cols.stride));
        let key_offsets = a.tile.register_keys();
        let kc = self.reg("u32");
        self.emit(&format!("shl.b32 {kc}, {cg}, 2;"));
        let scale = super::f32_imm(a.scale * LOG2_E);

        let tiles = self.begin_tiles("0", &steps, keys);
        let k0 = tiles.start.clone();
        self.stage_f32((&e.ptr[1], &e.ld[1]), (&k0, &tk), (keys, d), &smk, true, &tid, vector);
        self.stage_f32((&e.ptr[2], &e.ld[2]), (&k0, &tk), (keys, dv), &smv, false, &tid, vector);
        self.emit("bar.sync 0;");

        // Scores: this thread's `thread_rows` × 8, summed over the depth in order.
        let s: Vec<Vec<String>> = (0..rq).map(|_| (0..8).map(|_| self.reg("f32")).collect()).collect();
        for x in s.iter().flatten() {
            self.emit(&format!("mov.f32 {x}, 0f00000000;"));
        }
        let unroll = a.tile.chunk;
        let (qcur, kcur) = (self.reg("u32"), self.reg("u32"));
        self.emit(&format!("mov.u32 {qcur}, {qa};"));
        self.emit(&format!("mov.u32 {kcur}, {ka};"));
        self.depth_loop(d / unroll, |w| {
            for dd in 0..unroll {
                let qv: Vec<String> = (0..rq).map(|_| w.reg("f32")).collect();
                let kv: Vec<String> = (0..8).map(|_| w.reg("f32")).collect();
                for (j, quad) in qv.chunks(4).enumerate() {
                    w.emit(&format!("ld.shared.v4.f32 {}, [{qcur}+{}];", braced(quad), 4 * rows * dd + 16 * j as u32));
                }
                w.emit(&format!("ld.shared.v4.f32 {}, [{kcur}+{}];", braced(&kv[..4]), 4 * keys * dd));
                w.emit(&format!(
                    "ld.shared.v4.f32 {}, [{kcur}+{}];",
                    braced(&kv[4..]),
                    4 * (keys * dd + key_offsets[4])
                ));
                for (r, row) in s.iter().enumerate() {
                    for (c, x) in row.iter().enumerate() {
                        w.emit(&format!("fma.rn.f32 {x}, {}, {}, {x};", qv[r], kv[c]));
                    }
                }
            }
            w.emit(&format!("add.u32 {qcur}, {qcur}, {};", 4 * rows * unroll));
            w.emit(&format!("add.u32 {kcur}, {kcur}, {};", 4 * keys * unroll));
        });
        for x in s.iter().flatten() {
            self.emit(&format!("mul.f32 {x}, {x}, {scale};"));
        }
        // Masks (keys past the end; with `causal`, keys after the query), only on tiles that need them:
        // each row's bound on a key's offset in the tile, once a tile, against each key's 32-bit offset.
        let unmasked = self.skip_unmasked(&k0, keys, &tk, a.causal.then_some(q0.as_str()));
        let at: Vec<String> = key_offsets
            .iter()
            .map(|off| {
                let x = self.reg("u32");
                self.emit(&format!("add.u32 {x}, {kc}, {off};"));
                x
            })
            .collect();
        for (r, row) in s.iter().enumerate() {
            let lim = self.reg("s64");
            self.emit(&format!("sub.s64 {lim}, {tk}, {k0};"));
            if a.causal {
                let c = self.reg("s64");
                self.emit(&format!("sub.s64 {c}, {}, {k0};", qrow[r]));
                self.emit(&format!("add.s64 {c}, {c}, 1;"));
                self.emit(&format!("min.s64 {lim}, {lim}, {c};"));
            }
            self.emit(&format!("max.s64 {lim}, {lim}, 0;"));
            self.emit(&format!("min.s64 {lim}, {lim}, {keys};"));
            let lim32 = self.reg("u32");
            self.emit(&format!("cvt.u32.u64 {lim32}, {lim};"));
            for (x, off) in row.iter().zip(&at) {
                let p = self.reg("pred");
                self.emit(&format!("setp.ge.u32 {p}, {off}, {lim32};"));
                self.emit(&format!("selp.f32 {x}, 0fFF800000, {x}, {p};"));
            }
        }
        self.place(&unmasked);
        // Online softmax, per row: the row's max over its eight threads, rescale what was summed and the
        // output, exponentials.
        for (r, row) in s.iter().enumerate() {
            let mx = self.reg("f32");
            self.emit(&format!("max.f32 {mx}, {}, {};", row[0], row[1]));
            for x in &row[2..] {
                self.emit(&format!("max.f32 {mx}, {mx}, {x};"));
            }
            let t = self.reg("f32");
            for lanes in [1, 2, 4] {
                self.emit(&format!("shfl.sync.bfly.b32 {t}, {mx}, {lanes}, 31, -1;"));
                self.emit(&format!("max.f32 {mx}, {mx}, {t};"));
            }
            self.emit(&format!("max.f32 {mx}, {mx}, {};", m[r]));
            // A row with every key so far masked keeps -inf; subtracting 0 then keeps exp at 0, not NaN.
            let (base, empty, al) = (self.reg("f32"), self.reg("pred"), self.reg("f32"));
            self.emit(&format!("setp.eq.f32 {empty}, {mx}, 0fFF800000;"));
            self.emit(&format!("selp.f32 {base}, 0f00000000, {mx}, {empty};"));
            self.emit(&format!("sub.f32 {al}, {}, {base};", m[r]));
            self.emit(&format!("ex2.approx.ftz.f32 {al}, {al};"));
            self.emit(&format!("mov.f32 {}, {mx};", m[r]));
            self.emit(&format!("mul.f32 {}, {}, {al};", lsum[r], lsum[r]));
            for x in row {
                self.emit(&format!("sub.f32 {x}, {x}, {base};"));
                self.emit(&format!("ex2.approx.ftz.f32 {x}, {x};"));
                self.emit(&format!("add.f32 {}, {}, {x};", lsum[r], lsum[r]));
            }
            for x in &o[r] {
                self.emit(&format!("mul.f32 {x}, {x}, {al};"));
            }
        }
        // Every thread is done reading the key tile: the probabilities take its place, transposed.
        self.emit("bar.sync 0;");
        for (c, off) in key_offsets.iter().enumerate() {
            // Key `4 cg + off` of the tile, this group's queries.
            let p: Vec<String> = s.iter().map(|row| row[c].clone()).collect();
            for (j, quad) in p.chunks(4).enumerate() {
                self.emit(&format!("st.shared.v4.f32 [{pw}+{}], {};", 4 * rows * off + 16 * j as u32, braced(quad)));
            }
        }
        self.emit("bar.sync 0;");
        // Output += probabilities · values, over the tile's keys in order.
        let (pcur, vcur) = (self.reg("u32"), self.reg("u32"));
        self.emit(&format!("mov.u32 {pcur}, {pa};"));
        self.emit(&format!("mov.u32 {vcur}, {va};"));
        self.depth_loop(keys / unroll, |w| {
            for kk in 0..unroll {
                let pv: Vec<String> = (0..rq).map(|_| w.reg("f32")).collect();
                for (j, quad) in pv.chunks(4).enumerate() {
                    w.emit(&format!("ld.shared.v4.f32 {}, [{pcur}+{}];", braced(quad), 4 * rows * kk + 16 * j as u32));
                }
                let mut vv: Vec<String> = Vec::with_capacity(per_row);
                for &off in &cols.offsets {
                    let part: Vec<String> = (0..cols.width).map(|_| w.reg("f32")).collect();
                    let v = vec_of(cols.width);
                    w.emit(&format!("ld.shared{v}.f32 {}, [{vcur}+{}];", braced(&part), 4 * (kk * dv + off)));
                    vv.extend(part);
                }
                for (r, row) in o.iter().enumerate() {
                    for (x, v) in row.iter().zip(&vv) {
                        w.emit(&format!("fma.rn.f32 {x}, {}, {v}, {x};", pv[r]));
                    }
                }
            }
            w.emit(&format!("add.u32 {pcur}, {pcur}, {};", 4 * rows * unroll));
            w.emit(&format!("add.u32 {vcur}, {vcur}, {};", 4 * dv * unroll));
        });
        self.end_tiles(&tiles);

        // Finish each row: its sum across its eight threads, divide, store. With no keys at all the row
        // is zeros (the written-out form's empty product); a row whose every score is -inf sums to 0
        // and divides into NaN, as the written-out softmax's 0/0 does.
        let no_keys = self.reg("pred");
        self.emit(&format!("setp.eq.s64 {no_keys}, {tk}, 0;"));
        let col0 = self.reg("s64");
        let c32 = self.reg("u32");
        self.emit(&format!("mul.lo.u32 {c32}, {cg}, {};", cols.stride));
        self.emit(&format!("cvt.u64.u32 {col0}, {c32};"));
        let (ptr, ld) = (e.ptr[3].clone(), e.ld[3].clone());
        for r in 0..rq {
            let t = self.reg("f32");
            for lanes in [1, 2, 4] {
                self.emit(&format!("shfl.sync.bfly.b32 {t}, {}, {lanes}, 31, -1;", lsum[r]));
                self.emit(&format!("add.f32 {}, {}, {t};", lsum[r], lsum[r]));
            }
            let inv = self.reg("f32");
            self.emit(&format!("rcp.rn.f32 {inv}, {};", lsum[r]));
            self.emit(&format!("selp.f32 {inv}, 0f00000000, {inv}, {no_keys};"));
            let (skip, out) = (self.label(), self.reg("pred"));
            self.emit(&format!("setp.ge.s64 {out}, {}, {tq};", qrow[r]));
            self.emit(&format!("@{out} bra {skip};"));
            let addr = self.reg("s64");
            self.emit(&format!("mad.lo.s64 {addr}, {}, {ld}, {col0};", qrow[r]));
            self.emit(&format!("mad.lo.s64 {addr}, {addr}, 4, {ptr};"));
            for (x, (off, l)) in o[r].iter().zip(cols.each()) {
                let y = self.reg("f32");
                self.emit(&format!("mul.f32 {y}, {x}, {inv};"));
                self.emit(&format!("st.global.f32 [{addr}+{}], {y};", 4 * (off + l)));
            }
            self.place(&skip);
        }
    }

    /// Emits `body` `count` times as a loop (its counter a register of its own): a product's depth walked
    /// `AttentionTile::chunk` steps an iteration, each step unrolled, so the kernel's PTX stays small
    /// (fully unrolled, W5's took ptxas 0.75 s of its cold compile on the GPU host).
    fn depth_loop(&mut self, count: u32, mut body: impl FnMut(&mut Self)) {
        let (n, top, p) = (self.reg("u32"), self.label(), self.reg("pred"));
        self.emit(&format!("mov.u32 {n}, 0;"));
        self.place(&top);
        body(self);
        self.emit(&format!("add.u32 {n}, {n}, 1;"));
        self.emit(&format!("setp.lt.u32 {p}, {n}, {count};"));
        self.emit(&format!("@{p} bra {top};"));
    }

    /// Copies `rows × cols` f32 elements of `src` (rows from `row0`, those at or past `limit` zeros) into
    /// the shared array at `smem`: as they lie (rows of `cols`), or `transposed` (`cols` rows of `rows`),
    /// every thread of the workgroup taking 4-column pieces `tid`, `tid + threads`, … (in a transposed
    /// copy consecutive threads take consecutive rows, so their scalar stores fall in different banks).
    /// Where a thread's pieces keep one row (transposed) or one column (as they lie), each piece's
    /// addresses are the first's plus a step, computed once.
    #[allow(clippy::too_many_arguments)]
    fn stage_f32(
        &mut self,
        (src, ld): (&str, &str),
        (row0, limit): (&str, &str),
        (rows, cols): (u32, u32),
        smem: &str,
        transposed: bool,
        tid: &str,
        vector: u32,
    ) {
        let threads = self.k.launch.threads;
        let per_row = cols / 4;
        let pieces = rows * per_row;
        let fixed = if transposed { threads % rows == 0 } else { threads % per_row == 0 };
        // The first piece's row and column, each later piece's rows and columns further on.
        let (r, c) = (self.reg("u32"), self.reg("u32"));
        let (row_step, col_step) = match (transposed, fixed) {
            (true, true) => (0, threads / rows),
            (false, true) => (threads / per_row, 0),
            _ => (0, 0),
        };
        let (row, addr, inside, sa) = (self.reg("s64"), self.reg("s64"), self.reg("pred"), self.reg("u32"));
        // Global bytes from one piece to the next (a register: the row stride is a launch value).
        let gstep = self.reg("s64");
        let place = |w: &mut Self, p: &str| {
            if transposed {
                w.emit(&format!("rem.u32 {r}, {p}, {rows};"));
                w.emit(&format!("div.u32 {c}, {p}, {rows};"));
            } else {
                w.emit(&format!("div.u32 {r}, {p}, {per_row};"));
                w.emit(&format!("rem.u32 {c}, {p}, {per_row};"));
            }
            w.emit(&format!("cvt.u64.u32 {row}, {r};"));
            w.emit(&format!("add.s64 {row}, {row}, {row0};"));
            w.emit(&format!("setp.lt.s64 {inside}, {row}, {limit};"));
            let c64 = w.reg("s64");
            w.emit(&format!("cvt.u64.u32 {c64}, {c};"));
            w.emit(&format!("shl.b64 {c64}, {c64}, 2;"));
            w.emit(&format!("mad.lo.s64 {addr}, {row}, {ld}, {c64};"));
            w.emit(&format!("mad.lo.s64 {addr}, {addr}, 4, {src};"));
            if transposed {
                // Element (row r, column 4c + l) at (4c + l) * rows + r.
                w.emit(&format!("mul.lo.u32 {sa}, {c}, {};", 4 * rows));
                w.emit(&format!("add.u32 {sa}, {sa}, {r};"));
                w.emit(&format!("mad.lo.u32 {sa}, {sa}, 4, {smem};"));
            } else {
                w.emit(&format!("mad.lo.u32 {sa}, {r}, {per_row}, {c};"));
                w.emit(&format!("mad.lo.u32 {sa}, {sa}, 16, {smem};"));
            }
        };
        if fixed {
            place(self, tid);
            self.emit(&format!("mul.lo.s64 {gstep}, {ld}, {};", 4 * row_step));
            self.emit(&format!("add.s64 {gstep}, {gstep}, {};", 16 * col_step));
        }
        for i in 0..pieces.div_ceil(threads) {
            let skip = self.label();
            if !fixed || (i + 1) * threads > pieces {
                let p = self.reg("u32");
                self.emit(&format!("add.u32 {p}, {tid}, {};", i * threads));
                if (i + 1) * threads > pieces {
                    let past = self.reg("pred");
                    self.emit(&format!("setp.ge.u32 {past}, {p}, {pieces};"));
                    self.emit(&format!("@{past} bra {skip};"));
                }
                if !fixed {
                    place(self, &p);
                }
            }
            if fixed && i > 0 {
                self.emit(&format!("add.s64 {addr}, {addr}, {gstep};"));
                if row_step > 0 {
                    self.emit(&format!("add.s64 {row}, {row}, {row_step};"));
                    self.emit(&format!("setp.lt.s64 {inside}, {row}, {limit};"));
                }
                // Shared bytes from one piece to the next.
                let step = if transposed { 16 * rows * col_step } else { 4 * cols * row_step };
                self.emit(&format!("add.u32 {sa}, {sa}, {step};"));
            }
            let x: Vec<String> = (0..4).map(|_| self.reg("f32")).collect();
            for v in &x {
                self.emit(&format!("mov.f32 {v}, 0f00000000;"));
            }
            if vector == 4 {
                self.emit(&format!("@{inside} ld.global.nc.v4.f32 {}, [{addr}];", braced(&x)));
            } else {
                for (l, v) in x.iter().enumerate() {
                    self.emit(&format!("@{inside} ld.global.nc.f32 {v}, [{addr}+{}];", 4 * l));
                }
            }
            if transposed {
                for (l, v) in x.iter().enumerate() {
                    self.emit(&format!("st.shared.f32 [{sa}+{}], {v};", 4 * rows * l as u32));
                }
            } else {
                self.emit(&format!("st.shared.v4.f32 [{sa}], {};", braced(&x)));
            }
            self.place(&skip);
        }
    }
}
