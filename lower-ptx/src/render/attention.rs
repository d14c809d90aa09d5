//! The fused attention template (`kernel::Attention`) in PTX: flash-attention's forward pass on tensor
//! cores. Everything it prints was decided in `graph` (tile, warps, load width); this file only spells it.
//!
//! Each warp owns 16 query rows. Its queries sit in registers as `mma.m16n8k16` A fragments for the whole
//! kernel. For each tile of keys, the workgroup copies keys and values into shared memory; each warp
//! computes its 16 × `keys` scores with `mma` (the keys read by `ldmatrix`), scales them into the base-2
//! domain, masks, and updates its rows' running max; the exponentials, rounded to the operands' dtype,
//! become the A fragments of the product with the values (read by `ldmatrix.trans`), because an `mma`
//! result's layout for two adjacent 8-column tiles is exactly an A fragment's for one 16-deep step. Row
//! sums stay per thread until the end (their rescaling is the same for the four threads of a row), then
//! one quad shuffle adds them. Shared-memory rows are padded by 8 elements so the eight rows one
//! `ldmatrix` reads start in different banks.

use super::Writer;
use kiln_graph::dtype::DType;
use kiln_graph::kernel::{Attention, AttentionTile, RowsOperand};

/// `log2(e)`: scores are scaled into base 2 once, so each exponential is one `ex2`.
const LOG2_E: f64 = std::f64::consts::LOG2_E;

impl Writer<'_> {
    /// Copies `rows × cols` elements of `src` (rows from `row0`, at most `limit` of them valid; the rest
    /// are zeros) into the shared array at `smem` (a u32 address, rows of `pitch` elements), every thread
    /// of the workgroup taking its share of `vector`-element pieces.
    #[allow(clippy::too_many_arguments)]
    fn stage_tile(
        &mut self,
        (src, ld): (&str, &str),
        row0: &str,
        limit: &str,
        (rows, cols, pitch): (u32, u32, u32),
        smem: &str,
        tid: &str,
        vector: u32,
    ) {
        let threads = self.k.launch.threads;
        let per_row = cols / vector;
        let pieces = rows * per_row;
        for i in 0..pieces.div_ceil(threads) {
            let (piece, r, c) = (self.reg("u32"), self.reg("u32"), self.reg("u32"));
            self.emit(&format!("add.u32 {piece}, {tid}, {};", i * threads));
            let skip = self.label();
            if pieces % threads != 0 {
                let p = self.reg("pred");
                self.emit(&format!("setp.ge.u32 {p}, {piece}, {pieces};"));
                self.emit(&format!("@{p} bra {skip};"));
            }
            self.emit(&format!("div.u32 {r}, {piece}, {per_row};"));
            self.emit(&format!("rem.u32 {c}, {piece}, {per_row};"));
            self.emit(&format!("mul.lo.u32 {c}, {c}, {vector};"));
            // Shared address of the piece.
            let sa = self.reg("u32");
            self.emit(&format!("mad.lo.u32 {sa}, {r}, {pitch}, {c};"));
            self.emit(&format!("mad.lo.u32 {sa}, {sa}, 2, {smem};"));
            // Global row index and whether it exists.
            let (row, c64) = (self.reg("s64"), self.reg("s64"));
            self.emit(&format!("cvt.u64.u32 {row}, {r};"));
            self.emit(&format!("add.s64 {row}, {row}, {row0};"));
            self.emit(&format!("cvt.u64.u32 {c64}, {c};"));
            let outside = self.reg("pred");
            self.emit(&format!("setp.ge.s64 {outside}, {row}, {limit};"));
            let addr = self.reg("s64");
            self.emit(&format!("mad.lo.s64 {addr}, {row}, {ld}, {c64};"));
            self.emit(&format!("mad.lo.s64 {addr}, {addr}, 2, {src};"));
            if vector == 8 {
                let v: Vec<String> = (0..4).map(|_| self.reg("b32")).collect();
                for x in &v {
                    self.emit(&format!("mov.b32 {x}, 0;"));
                }
                self.emit(&format!("@!{outside} ld.global.nc.v4.b32 {{{}}}, [{addr}];", v.join(", ")));
                self.emit(&format!("st.shared.v4.b32 [{sa}], {{{}}};", v.join(", ")));
            } else {
                let h = self.reg("b16");
                self.emit(&format!("mov.b16 {h}, 0;"));
                self.emit(&format!("@!{outside} ld.global.nc.b16 {h}, [{addr}];"));
                self.emit(&format!("st.shared.b16 [{sa}], {h};"));
            }
            self.place(&skip);
        }
    }

    /// `ldmatrix` of four 8 × 8 matrices into four fresh b32 registers; `row_addr` is this lane's row
    /// address (lanes 8i..8i+7 give matrix i's rows).
    fn ldmatrix4(&mut self, row_addr: &str, trans: bool) -> [String; 4] {
        let r: [String; 4] = std::array::from_fn(|_| self.reg("b32"));
        let t = if trans { ".trans" } else { "" };
        self.emit(&format!("ldmatrix.sync.aligned.m8n8.x4{t}.shared.b16 {{{}}}, [{row_addr}];", r.join(", ")));
        r
    }

    /// `d = a · b + d` on one 16 × 8 × 16 tile.
    fn mma(&mut self, ty: &str, d: &[String], a: &[String], b: &[String]) {
        self.emit(&format!(
            "mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{{d}}}, {{{a}}}, {{{b}}}, {{{d}}};",
            d = d.join(", "),
            a = a.join(", "),
            b = b.join(", ")
        ));
    }

    /// `x` combined by `op` (`max`, `add`) over the four lanes that hold one row's fragments.
    fn quad(&mut self, op: &str, x: &str) {
        let t = self.reg("f32");
        for lane in [1, 2] {
            self.emit(&format!("shfl.sync.bfly.b32 {t}, {x}, {lane}, 31, -1;"));
            self.emit(&format!("{op}.f32 {x}, {x}, {t};"));
        }
    }

    /// The whole kernel body for `a`.
    pub(super) fn attention(&mut self, a: &Attention) {
        let ty = match a.dtype {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            d => return self.fail(format!("attention over {d}: the template takes f16 or bf16")),
        };
        let AttentionTile { warps, keys, vector } = a.tile;
        let (d, dv) = (a.head_dim, a.value_dim);
        let rows = a.tile.rows();
        if d % 16 != 0 || dv % 16 != 0 || keys % 16 != 0 || self.k.launch.threads != 32 * warps {
            return self.fail(format!("attention tile {:?} does not fit head dims {d}, {dv}", a.tile));
        }
        let (dp, dvp) = (AttentionTile::smem_row(d), AttentionTile::smem_row(dv));
        let name = &self.k.name;
        let [sq, sk, sv] = ["q", "k", "v"].map(|x| format!("{name}_{x}"));
        self.extra_shared.push(format!(".shared .align 16 .b8 {sq}[{}];", 2 * rows * dp));
        self.extra_shared.push(format!(".shared .align 16 .b8 {sk}[{}];", 2 * keys * dp));
        self.extra_shared.push(format!(".shared .align 16 .b8 {sv}[{}];", 2 * keys * dvp));
        let (smq, smk, smv) = (self.reg("u32"), self.reg("u32"), self.reg("u32"));
        self.emit(&format!("mov.u32 {smq}, {sq};"));
        self.emit(&format!("mov.u32 {smk}, {sk};"));
        self.emit(&format!("mov.u32 {smv}, {sv};"));

        // Which batch entry and which block of queries: the last blocks of a causal attention have the
        // most keys, so they are handed out first.
        let (tq, tk) = (self.expr(&a.q_len), self.expr(&a.kv_len));
        let blocks = self.reg("s64");
        self.emit(&format!("add.s64 {blocks}, {tq}, {};", rows - 1));
        self.emit(&format!("div.s64 {blocks}, {blocks}, {rows};"));
        let (entry, q0) = (self.reg("s64"), self.reg("s64"));
        self.emit(&format!("div.s64 {entry}, %group, {blocks};"));
        self.emit(&format!("rem.s64 {q0}, %group, {blocks};"));
        self.emit(&format!("sub.s64 {q0}, {blocks}, {q0};"));
        self.emit(&format!("sub.s64 {q0}, {q0}, 1;"));
        self.emit(&format!("mul.lo.s64 {q0}, {q0}, {rows};"));
        let operands: [&RowsOperand; 4] = [&a.q, &a.k, &a.v, &a.out];
        let mut base: Vec<String> = Vec::with_capacity(4);
        for o in operands {
            let off = self.expr(&o.offset);
            let r = self.reg("s64");
            self.emit(&format!("mov.s64 {r}, {off};"));
            base.push(r);
        }
        let rest = self.reg("s64");
        self.emit(&format!("mov.s64 {rest}, {entry};"));
        for b in a.batch.iter().rev() {
            let ext = self.expr(&b.extent);
            let i = self.reg("s64");
            self.emit(&format!("rem.s64 {i}, {rest}, {ext};"));
            self.emit(&format!("div.s64 {rest}, {rest}, {ext};"));
            for (acc, stride) in base.iter().zip([&b.q, &b.k, &b.v, &b.out]) {
                let s = self.expr(stride);
                self.emit(&format!("mad.lo.s64 {acc}, {i}, {s}, {acc};"));
            }
        }
        // Groups past the last entry (a grid folded into more dimensions rounds up) have nothing to do;
        // the whole workgroup leaves together, before any barrier.
        let past = self.reg("pred");
        self.emit(&format!("setp.ne.s64 {past}, {rest}, 0;"));
        self.emit(&format!("@{past} ret;"));
        // Byte pointers to each operand's entry.
        let mut ptr = Vec::with_capacity(4);
        let mut lds = Vec::with_capacity(4);
        for (o, b) in operands.iter().zip(&base) {
            let p = self.reg("s64");
            self.emit(&format!("mad.lo.s64 {p}, {b}, 2, %b{};", o.buffer));
            ptr.push(p);
            lds.push(self.expr(&o.ld));
        }

        let tid = self.reg("u32");
        self.emit(&format!("mov.u32 {tid}, %tid.x;"));
        let (warp, lane, g, t4) = (self.reg("u32"), self.reg("u32"), self.reg("u32"), self.reg("u32"));
        self.emit(&format!("shr.u32 {warp}, {tid}, 5;"));
        self.emit(&format!("and.b32 {lane}, {tid}, 31;"));
        self.emit(&format!("shr.u32 {g}, {lane}, 2;"));
        self.emit(&format!("and.b32 {t4}, {lane}, 3;"));
        // ldmatrix lane roles: matrix `lane / 8`, its row `lane % 8`.
        let (mi, mr) = (self.reg("u32"), self.reg("u32"));
        self.emit(&format!("shr.u32 {mi}, {lane}, 3;"));
        self.emit(&format!("and.b32 {mr}, {lane}, 7;"));
        let (mi_lo, mi_hi) = (self.reg("u32"), self.reg("u32"));
        self.emit(&format!("and.b32 {mi_lo}, {mi}, 1;"));
        self.emit(&format!("shr.u32 {mi_hi}, {mi}, 1;"));

        // The query block into shared memory, then into A fragments.
        self.stage_tile((&ptr[0], &lds[0]), &q0, &tq, (rows, d, dp), &smq, &tid, vector);
        self.emit("bar.sync 0;");
        // Lane address for A fragments: row warp*16 + 8*(mi%2) + mr, column 8*(mi/2) (+16 per step).
        let qa = self.reg("u32");
        self.emit(&format!("shl.b32 {qa}, {warp}, 4;"));
        self.emit(&format!("mad.lo.u32 {qa}, {mi_lo}, 8, {qa};"));
        self.emit(&format!("add.u32 {qa}, {qa}, {mr};"));
        self.emit(&format!("mul.lo.u32 {qa}, {qa}, {dp};"));
        self.emit(&format!("mad.lo.u32 {qa}, {mi_hi}, 8, {qa};"));
        self.emit(&format!("mad.lo.u32 {qa}, {qa}, 2, {smq};"));
        let mut qf: Vec<[String; 4]> = Vec::new();
        for kk in 0..d / 16 {
            let at = self.reg("u32");
            self.emit(&format!("add.u32 {at}, {qa}, {};", kk * 32));
            qf.push(self.ldmatrix4(&at, false));
        }

        // Running state: max (base 2) and partial sum of this thread's two rows, and the output tiles.
        let m: [String; 2] = std::array::from_fn(|_| self.reg("f32"));
        let l: [String; 2] = std::array::from_fn(|_| self.reg("f32"));
        for x in &m {
            self.emit(&format!("mov.f32 {x}, 0fFF800000;"));
        }
        for x in &l {
            self.emit(&format!("mov.f32 {x}, 0f00000000;"));
        }
        let o: Vec<Vec<String>> = (0..dv / 8).map(|_| (0..4).map(|_| self.reg("f32")).collect()).collect();
        for x in o.iter().flatten() {
            self.emit(&format!("mov.f32 {x}, 0f00000000;"));
        }
        // This thread's query rows (absolute), for the causal mask.
        let qrow: [String; 2] = std::array::from_fn(|_| self.reg("s64"));
        let wr = self.reg("u32");
        self.emit(&format!("shl.b32 {wr}, {warp}, 4;"));
        self.emit(&format!("add.u32 {wr}, {wr}, {g};"));
        self.emit(&format!("cvt.u64.u32 {}, {wr};", qrow[0]));
        self.emit(&format!("add.s64 {}, {}, {q0};", qrow[0], qrow[0]));
        self.emit(&format!("add.s64 {}, {}, 8;", qrow[1], qrow[0]));

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
        // Lane addresses for the key B fragments (row 8*(mi/2) + mr, column 8*(mi%2)) and the value
        // B fragments (row 8*(mi%2) + mr, column 8*(mi/2)), relative to the tile and step.
        let (ka, va) = (self.reg("u32"), self.reg("u32"));
        self.emit(&format!("mad.lo.u32 {ka}, {mi_hi}, 8, {mr};"));
        self.emit(&format!("mul.lo.u32 {ka}, {ka}, {dp};"));
        self.emit(&format!("mad.lo.u32 {ka}, {mi_lo}, 8, {ka};"));
        self.emit(&format!("mad.lo.u32 {ka}, {ka}, 2, {smk};"));
        self.emit(&format!("mad.lo.u32 {va}, {mi_lo}, 8, {mr};"));
        self.emit(&format!("mul.lo.u32 {va}, {va}, {dvp};"));
        self.emit(&format!("mad.lo.u32 {va}, {mi_hi}, 8, {va};"));
        self.emit(&format!("mad.lo.u32 {va}, {va}, 2, {smv};"));
        let scale = super::f32_imm(a.scale * LOG2_E);

        let (j, k0) = (self.reg("s64"), self.reg("s64"));
        let (top, done) = (self.label(), self.label());
        self.emit(&format!("mov.s64 {j}, 0;"));
        self.place(&top);
        let p = self.reg("pred");
        self.emit(&format!("setp.ge.s64 {p}, {j}, {steps};"));
        self.emit(&format!("@{p} bra {done};"));
        self.emit(&format!("mul.lo.s64 {k0}, {j}, {keys};"));
        // Every warp is done with the previous tiles before they are overwritten.
        self.emit("bar.sync 0;");
        self.stage_tile((&ptr[1], &lds[1]), &k0, &tk, (keys, d, dp), &smk, &tid, vector);
        self.stage_tile((&ptr[2], &lds[2]), &k0, &tk, (keys, dv, dvp), &smv, &tid, vector);
        self.emit("bar.sync 0;");

        // Scores: 16 × keys per warp, `keys / 8` tiles of 16 × 8.
        let s: Vec<Vec<String>> = (0..keys / 8).map(|_| (0..4).map(|_| self.reg("f32")).collect()).collect();
        for x in s.iter().flatten() {
            self.emit(&format!("mov.f32 {x}, 0f00000000;"));
        }
        for pair in 0..keys / 16 {
            for kk in 0..d / 16 {
                let at = self.reg("u32");
                self.emit(&format!("add.u32 {at}, {ka}, {};", 2 * (pair * 16 * dp + kk * 16)));
                let b = self.ldmatrix4(&at, false);
                self.mma(ty, &s[2 * pair as usize], &qf[kk as usize], &b[0..2]);
                self.mma(ty, &s[2 * pair as usize + 1], &qf[kk as usize], &b[2..4]);
            }
        }
        for x in s.iter().flatten() {
            self.emit(&format!("mul.f32 {x}, {x}, {scale};"));
        }
        // Masks (keys past the end; keys after the query), only on tiles that need them.
        let needs = self.reg("pred");
        let end = self.reg("s64");
        self.emit(&format!("add.s64 {end}, {k0}, {keys};"));
        self.emit(&format!("setp.gt.s64 {needs}, {end}, {tk};"));
        if a.causal {
            let c = self.reg("pred");
            self.emit(&format!("setp.gt.s64 {c}, {end}, {q0};"));
            self.emit(&format!("or.pred {needs}, {needs}, {c};"));
        }
        let unmasked = self.label();
        self.emit(&format!("@!{needs} bra {unmasked};"));
        let key = self.reg("s64");
        let t2 = self.reg("s64");
        self.emit(&format!("cvt.u64.u32 {t2}, {t4};"));
        self.emit(&format!("shl.b64 {t2}, {t2}, 1;"));
        self.emit(&format!("add.s64 {t2}, {t2}, {k0};"));
        for (nt, tile) in s.iter().enumerate() {
            for (e, x) in tile.iter().enumerate() {
                // Element e: row g (e < 2) or g + 8, key 8 nt + 2 t + e % 2.
                self.emit(&format!("add.s64 {key}, {t2}, {};", 8 * nt + e % 2));
                let out = self.reg("pred");
                self.emit(&format!("setp.ge.s64 {out}, {key}, {tk};"));
                if a.causal {
                    let after = self.reg("pred");
                    self.emit(&format!("setp.gt.s64 {after}, {key}, {};", qrow[e / 2]));
                    self.emit(&format!("or.pred {out}, {out}, {after};"));
                }
                self.emit(&format!("@{out} mov.f32 {x}, 0fFF800000;"));
            }
        }
        self.place(&unmasked);
        // Online softmax, per row: new max, rescale what was summed, exponentials.
        let mut probs: Vec<Vec<String>> = Vec::new();
        let mut alpha = Vec::with_capacity(2);
        for (r, (mr_, lr)) in m.iter().zip(&l).enumerate() {
            let mx = self.reg("f32");
            self.emit(&format!("mov.f32 {mx}, {};", s[0][2 * r]));
            for tile in &s {
                for x in &tile[2 * r..2 * r + 2] {
                    self.emit(&format!("max.f32 {mx}, {mx}, {x};"));
                }
            }
            self.quad("max", &mx);
            self.emit(&format!("max.f32 {mx}, {mx}, {mr_};"));
            // A row with every key so far masked keeps -inf; subtracting 0 then keeps exp at 0, not NaN.
            let base = self.reg("f32");
            let empty = self.reg("pred");
            self.emit(&format!("setp.eq.f32 {empty}, {mx}, 0fFF800000;"));
            self.emit(&format!("selp.f32 {base}, 0f00000000, {mx}, {empty};"));
            let al = self.reg("f32");
            self.emit(&format!("sub.f32 {al}, {mr_}, {base};"));
            self.emit(&format!("ex2.approx.ftz.f32 {al}, {al};"));
            self.emit(&format!("mov.f32 {mr_}, {mx};"));
            self.emit(&format!("mul.f32 {lr}, {lr}, {al};"));
            for tile in &s {
                for x in &tile[2 * r..2 * r + 2] {
                    self.emit(&format!("sub.f32 {x}, {x}, {base};"));
                    self.emit(&format!("ex2.approx.ftz.f32 {x}, {x};"));
                    self.emit(&format!("add.f32 {lr}, {lr}, {x};"));
                }
            }
            alpha.push(al);
        }
        for tile in &o {
            for (e, x) in tile.iter().enumerate() {
                self.emit(&format!("mul.f32 {x}, {x}, {};", alpha[e / 2]));
            }
        }
        // Probabilities as A fragments: step kk takes score tiles 2kk and 2kk + 1.
        for kk in 0..(keys / 16) as usize {
            let (lo, hi) = (&s[2 * kk], &s[2 * kk + 1]);
            let frag: Vec<String> = [(lo, 0), (lo, 2), (hi, 0), (hi, 2)]
                .iter()
                .map(|(tile, e)| {
                    let r = self.reg("b32");
                    // The lower column goes in the low half.
                    self.emit(&format!("cvt.rn.{ty}x2.f32 {r}, {}, {};", tile[e + 1], tile[*e]));
                    r
                })
                .collect();
            probs.push(frag);
        }
        // Output += probabilities · values.
        for (kk, frag) in probs.iter().enumerate() {
            for pair in 0..(dv / 16) as usize {
                let at = self.reg("u32");
                self.emit(&format!("add.u32 {at}, {va}, {};", 2 * (kk as u32 * 16 * dvp + pair as u32 * 16)));
                let b = self.ldmatrix4(&at, true);
                self.mma(ty, &o[2 * pair], frag, &b[0..2]);
                self.mma(ty, &o[2 * pair + 1], frag, &b[2..4]);
            }
        }
        self.emit(&format!("add.s64 {j}, {j}, 1;"));
        self.emit(&format!("bra {top};"));
        self.place(&done);

        // Finish each row: the sum over its four lanes, divide, store pairs. With no keys at all the row is
        // zeros (the written-out form's empty product); a row whose every score is -inf sums to 0 and
        // divides into NaN, as the written-out softmax's 0/0 does.
        let no_keys = self.reg("pred");
        self.emit(&format!("setp.eq.s64 {no_keys}, {tk}, 0;"));
        let mut inv = Vec::with_capacity(2);
        for lr in &l {
            self.quad("add", lr);
            let r = self.reg("f32");
            self.emit(&format!("rcp.rn.f32 {r}, {lr};"));
            self.emit(&format!("selp.f32 {r}, 0f00000000, {r}, {no_keys};"));
            inv.push(r);
        }
        let col = self.reg("s64");
        self.emit(&format!("cvt.u64.u32 {col}, {t4};"));
        self.emit(&format!("shl.b64 {col}, {col}, 1;"));
        for (r, row) in qrow.iter().enumerate() {
            let skip = self.label();
            let out = self.reg("pred");
            self.emit(&format!("setp.ge.s64 {out}, {row}, {tq};"));
            self.emit(&format!("@{out} bra {skip};"));
            let addr = self.reg("s64");
            self.emit(&format!("mad.lo.s64 {addr}, {row}, {}, {col};", lds[3]));
            self.emit(&format!("mad.lo.s64 {addr}, {addr}, 2, {};", ptr[3]));
            for (nt, tile) in o.iter().enumerate() {
                let (x, y) = (self.reg("f32"), self.reg("f32"));
                self.emit(&format!("mul.f32 {x}, {}, {};", tile[2 * r], inv[r]));
                self.emit(&format!("mul.f32 {y}, {}, {};", tile[2 * r + 1], inv[r]));
                let pk = self.reg("b32");
                self.emit(&format!("cvt.rn.{ty}x2.f32 {pk}, {y}, {x};"));
                self.emit(&format!("st.global.b32 [{addr}+{}], {pk};", 16 * nt));
            }
            self.place(&skip);
        }
    }
}
