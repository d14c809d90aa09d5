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

/// A loop over streamed tiles: its counter, the current tile's first row, and its two labels.
pub(super) struct TileLoop {
    /// The tile's number.
    pub(super) j: String,
    /// The current tile's first row.
    pub(super) start: String,
    top: String,
    done: String,
}

/// The registers naming a thread's place in the template: its thread, warp and lane, its row in an `mma`
/// fragment (`g`) and its column pair (`t4`), and its role in an `ldmatrix` (matrix `mi`, row `mr`).
pub(super) struct Lanes {
    pub(super) tid: String,
    warp: String,
    pub(super) t4: String,
    g: String,
    mr: String,
    mi_lo: String,
    mi_hi: String,
}

/// Where a workgroup's block starts and each operand's entry: byte pointers and row strides of `q, k,
/// v, out, dout, lse, delta, second` (`0` for an operand the pass does not have).
pub(super) struct Entry {
    pub(super) start: String,
    pub(super) ptr: [String; OPERANDS],
    pub(super) ld: [String; OPERANDS],
}

/// How [`Writer::stage_tile`] moves a tile into shared memory.
#[derive(Clone, Copy)]
pub(super) enum TileCopy {
    /// Global loads of this many elements into registers, then shared stores.
    Loads(u32),
    /// `cp.async` copies of 16 bytes (8 elements).
    Async,
}

/// Which scores a causal mask removes, by a tile's columns against a thread's rows ([`Writer::mask_tile`]).
#[derive(Clone, Copy)]
pub(super) enum Causal {
    /// Columns after the row: keys after their query, where rows are queries.
    ColumnsAfterRow,
    /// Columns before the row: queries before their key, where rows are keys.
    ColumnsBeforeRow,
}

/// Operands an attention kernel may bind, in [`Entry`]'s order.
pub(super) const OPERANDS: usize = 8;
use kiln_graph::dtype::DType;
use kiln_graph::kernel::{Attention, AttentionPass, AttentionTile, AttentionUnits, RowsOperand};

/// `log2(e)`: scores are scaled into base 2 once, so each exponential is one `ex2`.
pub(super) const LOG2_E: f64 = std::f64::consts::LOG2_E;

impl Writer<'_> {
    /// Copies `rows × cols` elements of `src` (rows from `row0`, at most `limit` of them valid; the rest
    /// are zeros) into the shared array at `smem` (a u32 address, rows of `pitch` elements), every thread
    /// of the workgroup taking its share of pieces: through registers (`TileCopy::Loads`), or as
    /// `cp.async` copies of 16 bytes that land by the `cp.async.wait_group` covering the group they are
    /// committed in, while the threads compute (`TileCopy::Async`).
    ///
    /// Where the workgroup's threads cover whole rows of pieces, a thread's pieces share one column and
    /// sit a fixed number of rows apart, so its addresses are computed once a call and each piece adds a
    /// constant (a loop of 64 × 64 key tiles had spent 150 instructions a tile on addresses).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn stage_tile(
        &mut self,
        (src, ld): (&str, &str),
        row0: &str,
        limit: &str,
        (rows, cols, pitch): (u32, u32, u32),
        smem: &str,
        tid: &str,
        copy: TileCopy,
    ) {
        let (vector, asynchronous) = match copy {
            TileCopy::Loads(vector) => (vector, false),
            TileCopy::Async => (8, true),
        };
        let threads = self.k.launch.threads;
        let per_row = cols / vector;
        let pieces = rows * per_row;
        if threads % per_row != 0 {
            return self.stage_tile_pieces(
                (src, ld),
                (row0, limit),
                (rows, per_row, pitch),
                smem,
                tid,
                (vector, asynchronous),
            );
        }
        // Rows between two pieces of one thread.
        let step = threads / per_row;
        let (r, c) = (self.reg("u32"), self.reg("u32"));
        self.emit(&format!("div.u32 {r}, {tid}, {per_row};"));
        self.emit(&format!("rem.u32 {c}, {tid}, {per_row};"));
        self.emit(&format!("mul.lo.u32 {c}, {c}, {vector};"));
        let sa = self.reg("u32");
        self.emit(&format!("mad.lo.u32 {sa}, {r}, {pitch}, {c};"));
        self.emit(&format!("mad.lo.u32 {sa}, {sa}, 2, {smem};"));
        // The first piece's global row, how far past `limit` it is, and its address.
        let (row, past, c64, addr) = (self.reg("s64"), self.reg("s64"), self.reg("s64"), self.reg("s64"));
        self.emit(&format!("cvt.u64.u32 {row}, {r};"));
        self.emit(&format!("add.s64 {row}, {row}, {row0};"));
        self.emit(&format!("sub.s64 {past}, {row}, {limit};"));
        self.emit(&format!("cvt.u64.u32 {c64}, {c};"));
        self.emit(&format!("mad.lo.s64 {addr}, {row}, {ld}, {c64};"));
        self.emit(&format!("mad.lo.s64 {addr}, {addr}, 2, {src};"));
        // Bytes between a thread's pieces in global memory: a constant where the stride is one.
        let stride = match ld.parse::<u64>() {
            Ok(ld) => (2 * u64::from(step) * ld).to_string(),
            Err(_) => {
                let s = self.reg("s64");
                self.emit(&format!("mul.lo.s64 {s}, {ld}, {};", 2 * step));
                s
            }
        };
        let mut at = addr;
        for i in 0..pieces.div_ceil(threads) {
            let first = i * step;
            let skip = self.label();
            if pieces % threads != 0 {
                // This thread's piece `i` is row `r + first`, past the tile's last row.
                let p = self.reg("pred");
                self.emit(&format!("setp.ge.u32 {p}, {r}, {};", rows - first));
                self.emit(&format!("@{p} bra {skip};"));
            }
            if i > 0 {
                let next = self.reg("s64");
                self.emit(&format!("add.s64 {next}, {at}, {stride};"));
                at = next;
            }
            let outside = self.reg("pred");
            self.emit(&format!("setp.ge.s64 {outside}, {past}, {};", -i64::from(first)));
            let shared = format!("[{sa}+{}]", 2 * first * pitch);
            self.copy_piece((&at, src), &shared, &outside, vector, asynchronous);
            self.place(&skip);
        }
    }

    /// [`Writer::stage_tile`] where a thread's pieces fall in different columns (the workgroup's threads
    /// do not cover whole rows of pieces): each piece's row, column and addresses computed on its own.
    #[allow(clippy::too_many_arguments)]
    fn stage_tile_pieces(
        &mut self,
        (src, ld): (&str, &str),
        (row0, limit): (&str, &str),
        (rows, per_row, pitch): (u32, u32, u32),
        smem: &str,
        tid: &str,
        (vector, asynchronous): (u32, bool),
    ) {
        let threads = self.k.launch.threads;
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
            self.copy_piece((&addr, src), &format!("[{sa}]"), &outside, vector, asynchronous);
            self.place(&skip);
        }
    }

    /// One piece of a tile at global `addr` (a copy of `src`, the operand's start, stands in for it where
    /// `outside`) to the shared address `shared` (`[...]`): as a `cp.async` of 16 bytes that zero-fills
    /// where `outside`, or through registers, `vector` elements (8, or 1), zeros where `outside`.
    fn copy_piece(&mut self, (addr, src): (&str, &str), shared: &str, outside: &str, vector: u32, asynchronous: bool) {
        if asynchronous {
            // A row past the end copies no bytes and zero-fills; its address stays one that exists.
            let (n, a) = (self.reg("u32"), self.reg("s64"));
            self.emit(&format!("selp.u32 {n}, 0, 16, {outside};"));
            self.emit(&format!("selp.b64 {a}, {src}, {addr}, {outside};"));
            self.emit(&format!("cp.async.cg.shared.global {shared}, [{a}], 16, {n};"));
        } else if vector == 8 {
            let v: Vec<String> = (0..4).map(|_| self.reg("b32")).collect();
            for x in &v {
                self.emit(&format!("mov.b32 {x}, 0;"));
            }
            self.emit(&format!("@!{outside} ld.global.nc.v4.b32 {{{}}}, [{addr}];", v.join(", ")));
            self.emit(&format!("st.shared.v4.b32 {shared}, {{{}}};", v.join(", ")));
        } else {
            let h = self.reg("b16");
            self.emit(&format!("mov.b16 {h}, 0;"));
            self.emit(&format!("@!{outside} ld.global.nc.b16 {h}, [{addr}];"));
            self.emit(&format!("st.shared.b16 {shared}, {h};"));
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

    /// The operands' PTX type, or a failure for a dtype the template does not take.
    pub(super) fn attention_type(&mut self, a: &Attention) -> Option<&'static str> {
        match a.dtype {
            DType::BF16 => Some("bf16"),
            DType::F16 => Some("f16"),
            d => {
                self.fail(format!("attention over {d}: the template takes f16 or bf16"));
                None
            }
        }
    }

    /// Which batch entry and which block of `rows` rows (of `len`) this workgroup owns, in the order the
    /// kernel IR states (`Attention::last_blocks_first`), and each operand's pointer at that entry.
    /// Groups past the last block return at once, before any barrier.
    pub(super) fn attention_entry(&mut self, a: &Attention, len: &str, rows: u32) -> Entry {
        let blocks = self.reg("s64");
        self.emit(&format!("add.s64 {blocks}, {len}, {};", rows - 1));
        self.emit(&format!("div.s64 {blocks}, {blocks}, {rows};"));
        let entries = self.reg("s64");
        self.emit(&format!("mov.s64 {entries}, 1;"));
        for b in &a.batch {
            let ext = self.expr(&b.extent);
            self.emit(&format!("mul.lo.s64 {entries}, {entries}, {ext};"));
        }
        let (entry, start) = (self.reg("s64"), self.reg("s64"));
        self.emit(&format!("rem.s64 {entry}, %group, {entries};"));
        self.emit(&format!("div.s64 {start}, %group, {entries};"));
        let past = self.reg("pred");
        self.emit(&format!("setp.ge.s64 {past}, {start}, {blocks};"));
        self.emit(&format!("@{past} ret;"));
        if a.last_blocks_first {
            self.emit(&format!("sub.s64 {start}, {blocks}, {start};"));
            self.emit(&format!("sub.s64 {start}, {start}, 1;"));
        }
        self.emit(&format!("mul.lo.s64 {start}, {start}, {rows};"));
        // Element bytes: the operands' dtype, f32 log-sum-exps and deltas; each output as its pass writes it.
        let el = a.dtype.size_bytes() as u32;
        let bytes = |pass: AttentionPass| if pass.f32_output() { 4 } else { el };
        let operands: [(Option<&RowsOperand>, u32); OPERANDS] = [
            (Some(&a.q), el),
            (Some(&a.k), el),
            (Some(&a.v), el),
            (Some(&a.out), bytes(a.pass)),
            (a.dout.as_ref(), el),
            (a.lse.as_ref(), 4),
            (a.delta.as_ref(), 4),
            (a.second.as_ref(), a.pass.second().map_or(el, bytes)),
        ];
        let mut base: Vec<String> = Vec::with_capacity(OPERANDS);
        for (o, _) in &operands {
            let r = self.reg("s64");
            let off = o.map_or_else(|| "0".to_string(), |o| self.expr(&o.offset));
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
            for (acc, stride) in base.iter().zip([&b.q, &b.k, &b.v, &b.out, &b.dout, &b.lse, &b.delta, &b.second]) {
                let s = self.expr(stride);
                self.emit(&format!("mad.lo.s64 {acc}, {i}, {s}, {acc};"));
            }
        }
        let (mut ptr, mut ld) = (Vec::with_capacity(OPERANDS), Vec::with_capacity(OPERANDS));
        for ((o, bytes), b) in operands.iter().zip(&base) {
            let p = self.reg("s64");
            match o {
                Some(o) => {
                    self.emit(&format!("mad.lo.s64 {p}, {b}, {bytes}, %b{};", o.buffer));
                    ld.push(self.expr(&o.ld));
                }
                None => {
                    self.emit(&format!("mov.s64 {p}, 0;"));
                    ld.push("0".to_string());
                }
            }
            ptr.push(p);
        }
        let arr = |v: Vec<String>| -> [String; OPERANDS] {
            v.try_into().unwrap_or_else(|_| unreachable!("one pointer and stride per operand"))
        };
        Entry { start, ptr: arr(ptr), ld: arr(ld) }
    }

    /// This thread's [`Lanes`].
    pub(super) fn attention_lanes(&mut self) -> Lanes {
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
        Lanes { tid, warp, t4, g, mr, mi_lo, mi_hi }
    }

    /// The warp's 16 rows of a shared block (rows of `pitch` elements, `depth` of them used) as A
    /// fragments, one per 16 columns.
    pub(super) fn a_fragments(&mut self, l: &Lanes, smem: &str, pitch: u32, depth: u32) -> Vec<[String; 4]> {
        // Lane address: row warp*16 + 8*(mi%2) + mr, column 8*(mi/2) (+16 per step).
        let at0 = self.reg("u32");
        self.emit(&format!("shl.b32 {at0}, {}, 4;", l.warp));
        self.emit(&format!("mad.lo.u32 {at0}, {}, 8, {at0};", l.mi_lo));
        self.emit(&format!("add.u32 {at0}, {at0}, {};", l.mr));
        self.emit(&format!("mul.lo.u32 {at0}, {at0}, {pitch};"));
        self.emit(&format!("mad.lo.u32 {at0}, {}, 8, {at0};", l.mi_hi));
        self.emit(&format!("mad.lo.u32 {at0}, {at0}, 2, {smem};"));
        (0..depth / 16)
            .map(|kk| {
                let at = self.reg("u32");
                self.emit(&format!("add.u32 {at}, {at0}, {};", kk * 32));
                self.ldmatrix4(&at, false)
            })
            .collect()
    }

    /// This thread's two rows of the warp's block, absolute: `start + warp*16 + g` and 8 more.
    pub(super) fn attention_rows(&mut self, l: &Lanes, start: &str) -> [String; 2] {
        let rows: [String; 2] = std::array::from_fn(|_| self.reg("s64"));
        let wr = self.reg("u32");
        self.emit(&format!("shl.b32 {wr}, {}, 4;", l.warp));
        self.emit(&format!("add.u32 {wr}, {wr}, {};", l.g));
        self.emit(&format!("cvt.u64.u32 {}, {wr};", rows[0]));
        self.emit(&format!("add.s64 {}, {}, {start};", rows[0], rows[0]));
        self.emit(&format!("add.s64 {}, {}, 8;", rows[1], rows[0]));
        rows
    }

    /// The lane address of B fragments from a shared tile of rows of `pitch` elements: read as they lie
    /// (the tile's rows are the product's columns: row 8*(mi/2) + mr, column 8*(mi%2)) or transposed
    /// (the tile's rows are the product's depth: row 8*(mi%2) + mr, column 8*(mi/2)).
    pub(super) fn b_lane_address(&mut self, l: &Lanes, smem: &str, pitch: u32, trans: bool) -> String {
        let (row_m, col_m) = if trans { (&l.mi_lo, &l.mi_hi) } else { (&l.mi_hi, &l.mi_lo) };
        let at = self.reg("u32");
        self.emit(&format!("mad.lo.u32 {at}, {row_m}, 8, {};", l.mr));
        self.emit(&format!("mul.lo.u32 {at}, {at}, {pitch};"));
        self.emit(&format!("mad.lo.u32 {at}, {col_m}, 8, {at};"));
        self.emit(&format!("mad.lo.u32 {at}, {at}, 2, {smem};"));
        at
    }

    /// `a · tileᵀ` for the warp's 16 rows: `n / 8` f32 tiles of 16 × 8 (`a` the rows' fragments over
    /// `depth`, the tile's rows read through `b` from [`Writer::b_lane_address`], not transposed).
    pub(super) fn score_tiles(
        &mut self,
        ty: &str,
        a: &[[String; 4]],
        b: &str,
        pitch: u32,
        n: u32,
        depth: u32,
    ) -> Vec<Vec<String>> {
        let s: Vec<Vec<String>> = (0..n / 8).map(|_| (0..4).map(|_| self.reg("f32")).collect()).collect();
        for x in s.iter().flatten() {
            self.emit(&format!("mov.f32 {x}, 0f00000000;"));
        }
        for pair in 0..n / 16 {
            for kk in 0..depth / 16 {
                let at = self.reg("u32");
                self.emit(&format!("add.u32 {at}, {b}, {};", 2 * (pair * 16 * pitch + kk * 16)));
                let f = self.ldmatrix4(&at, false);
                self.mma(ty, &s[2 * pair as usize], &a[kk as usize], &f[0..2]);
                self.mma(ty, &s[2 * pair as usize + 1], &a[kk as usize], &f[2..4]);
            }
        }
        s
    }

    /// Score tiles rounded to the dtype as A fragments: step `kk` takes tiles `2kk` and `2kk + 1`, since
    /// an `mma` result's layout for two adjacent 8-column tiles is an A fragment's for one 16-deep step.
    pub(super) fn probability_fragments(&mut self, ty: &str, s: &[Vec<String>]) -> Vec<Vec<String>> {
        (0..s.len() / 2)
            .map(|kk| {
                let (lo, hi) = (&s[2 * kk], &s[2 * kk + 1]);
                [(lo, 0), (lo, 2), (hi, 0), (hi, 2)]
                    .iter()
                    .map(|(tile, e)| {
                        let r = self.reg("b32");
                        // The lower column goes in the low half.
                        self.emit(&format!("cvt.rn.{ty}x2.f32 {r}, {}, {};", tile[e + 1], tile[*e]));
                        r
                    })
                    .collect()
            })
            .collect()
    }

    /// `acc += frags · tile` (`acc` `width / 8` tiles; the tile's rows, the product's depth, read
    /// transposed through `b`).
    pub(super) fn accumulate(
        &mut self,
        ty: &str,
        acc: &[Vec<String>],
        frags: &[Vec<String>],
        b: &str,
        pitch: u32,
        width: u32,
    ) {
        for (kk, frag) in frags.iter().enumerate() {
            for pair in 0..(width / 16) as usize {
                let at = self.reg("u32");
                self.emit(&format!("add.u32 {at}, {b}, {};", 2 * (kk as u32 * 16 * pitch + pair as u32 * 16)));
                let f = self.ldmatrix4(&at, true);
                self.mma(ty, &acc[2 * pair], frag, &f[0..2]);
                self.mma(ty, &acc[2 * pair + 1], frag, &f[2..4]);
            }
        }
    }

    /// Opens the loop over streamed tiles `j` in `first..steps`: the tile's first row (`j * stride`) in
    /// `start`, after a barrier (every warp is done with the previous tiles before they are overwritten).
    pub(super) fn begin_tiles(&mut self, first: &str, steps: &str, stride: u32) -> TileLoop {
        let (j, start) = (self.reg("s64"), self.reg("s64"));
        let (top, done) = (self.label(), self.label());
        self.emit(&format!("mov.s64 {j}, {first};"));
        self.place(&top);
        let p = self.reg("pred");
        self.emit(&format!("setp.ge.s64 {p}, {j}, {steps};"));
        self.emit(&format!("@{p} bra {done};"));
        self.emit(&format!("mul.lo.s64 {start}, {j}, {stride};"));
        self.emit("bar.sync 0;");
        TileLoop { j, start, top, done }
    }

    /// Closes the loop [`Writer::begin_tiles`] opened.
    pub(super) fn end_tiles(&mut self, t: &TileLoop) {
        self.emit(&format!("add.s64 {}, {}, 1;", t.j, t.j));
        self.emit(&format!("bra {};", t.top));
        self.place(&t.done);
    }

    /// Stores the warp's rows of `acc` (this thread's two `rows`, those below `len`), each multiplied by
    /// its `mul`, rounded in pairs to the dtype, at `ptr + (row * ld + column) * 2`.
    pub(super) fn store_rows(
        &mut self,
        ty: &str,
        acc: &[Vec<String>],
        (rows, len): (&[String; 2], &str),
        (ptr, ld): (&str, &str),
        mul: &[String; 2],
        l: &Lanes,
    ) {
        let col = self.reg("s64");
        self.emit(&format!("cvt.u64.u32 {col}, {};", l.t4));
        self.emit(&format!("shl.b64 {col}, {col}, 1;"));
        for (r, row) in rows.iter().enumerate() {
            let skip = self.label();
            let out = self.reg("pred");
            self.emit(&format!("setp.ge.s64 {out}, {row}, {len};"));
            self.emit(&format!("@{out} bra {skip};"));
            let addr = self.reg("s64");
            self.emit(&format!("mad.lo.s64 {addr}, {row}, {ld}, {col};"));
            self.emit(&format!("mad.lo.s64 {addr}, {addr}, 2, {ptr};"));
            for (nt, tile) in acc.iter().enumerate() {
                let (x, y) = (self.reg("f32"), self.reg("f32"));
                self.emit(&format!("mul.f32 {x}, {}, {};", tile[2 * r], mul[r]));
                self.emit(&format!("mul.f32 {y}, {}, {};", tile[2 * r + 1], mul[r]));
                let pk = self.reg("b32");
                self.emit(&format!("cvt.rn.{ty}x2.f32 {pk}, {y}, {x};"));
                self.emit(&format!("st.global.b32 [{addr}+{}], {pk};", 16 * nt));
            }
            self.place(&skip);
        }
    }

    /// The whole kernel body for `a`: the forward pass, its log-sum-exps alone, or a gradient.
    pub(super) fn attention(&mut self, a: &Attention) {
        match a.tile.units {
            AttentionUnits::Matrix => {}
            AttentionUnits::Registers => return self.attention_registers(a),
            // `Target::cuda` does not ask for it (`lane_attention`).
            AttentionUnits::Lanes => {
                return self.fail(format!("attention tile {:?}: this renderer has no lanes template", a.tile));
            }
        }
        if let AttentionPass::Grad(part) = a.pass {
            return self.attention_grad(a, part);
        }
        let Some(ty) = self.attention_type(a) else { return };
        let lse_only = a.pass == AttentionPass::Lse;
        if a.second.is_some() && a.pass.second() != Some(AttentionPass::Lse) {
            return self.fail(format!("a second output beside the {:?} pass", a.pass));
        }
        let AttentionTile { warps, keys, vector, stages, .. } = a.tile;
        let (d, dv) = (a.head_dim, a.value_dim);
        let rows = a.tile.rows();
        let staged = match stages {
            1 => false,
            2 if vector == 8 => true,
            _ => return self.fail(format!("attention tile {:?}: two stages copy 16-byte pieces only", a.tile)),
        };
        if d % 16 != 0 || dv % 16 != 0 || keys % 16 != 0 || self.k.launch.threads != 32 * warps {
            return self.fail(format!("attention tile {:?} does not fit head dims {d}, {dv}", a.tile));
        }
        let (dp, dvp) = (AttentionTile::smem_row(d), AttentionTile::smem_row(dv));
        // One stage's key and value tiles, in bytes.
        let (kbytes, vbytes) = (2 * keys * dp, 2 * keys * dvp);
        let name = &self.k.name;
        let [sq, sk, sv] = ["q", "k", "v"].map(|x| format!("{name}_{x}"));
        self.extra_shared.push(format!(".shared .align 16 .b8 {sq}[{}];", 2 * rows * dp));
        self.extra_shared.push(format!(".shared .align 16 .b8 {sk}[{}];", stages * kbytes));
        if !lse_only {
            self.extra_shared.push(format!(".shared .align 16 .b8 {sv}[{}];", stages * vbytes));
        }
        let (smq, smk, smv) = (self.reg("u32"), self.reg("u32"), self.reg("u32"));
        self.emit(&format!("mov.u32 {smq}, {sq};"));
        self.emit(&format!("mov.u32 {smk}, {sk};"));
        if !lse_only {
            self.emit(&format!("mov.u32 {smv}, {sv};"));
        }
        let (tq, tk) = (self.expr(&a.q_len), self.expr(&a.kv_len));
        let e = self.attention_entry(a, &tq, rows);
        let q0 = e.start.clone();
        let l = self.attention_lanes();
        let tid = l.tid.clone();
        // The query block into shared memory, then into A fragments.
        self.stage_tile((&e.ptr[0], &e.ld[0]), &q0, &tq, (rows, d, dp), &smq, &tid, TileCopy::Loads(vector));
        self.emit("bar.sync 0;");
        let qf = self.a_fragments(&l, &smq, dp, d);

        // Running state: max (base 2) and partial sum of this thread's two rows, and the output tiles.
        let m: [String; 2] = std::array::from_fn(|_| self.reg("f32"));
        let lsum: [String; 2] = std::array::from_fn(|_| self.reg("f32"));
        for x in &m {
            self.emit(&format!("mov.f32 {x}, 0fFF800000;"));
        }
        for x in &lsum {
            self.emit(&format!("mov.f32 {x}, 0f00000000;"));
        }
        let width = if lse_only { 0 } else { dv };
        let o: Vec<Vec<String>> = (0..width / 8).map(|_| (0..4).map(|_| self.reg("f32")).collect()).collect();
        for x in o.iter().flatten() {
            self.emit(&format!("mov.f32 {x}, 0f00000000;"));
        }
        // This thread's query rows (absolute), for the causal mask.
        let qrow = self.attention_rows(&l, &q0);

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
        let ka = self.b_lane_address(&l, &smk, dp, false);
        let va = if lse_only { String::new() } else { self.b_lane_address(&l, &smv, dvp, true) };
        let scale = super::f32_imm(a.scale * LOG2_E);

        if staged {
            // Two stages: tile 0 is copied before the loop, tile j + 1 while tile j is computed on.
            let none = self.label();
            let p = self.reg("pred");
            self.emit(&format!("setp.le.s64 {p}, {steps}, 0;"));
            self.emit(&format!("@{p} bra {none};"));
            self.stage_tile((&e.ptr[1], &e.ld[1]), "0", &tk, (keys, d, dp), &smk, &tid, TileCopy::Async);
            if !lse_only {
                self.stage_tile((&e.ptr[2], &e.ld[2]), "0", &tk, (keys, dv, dvp), &smv, &tid, TileCopy::Async);
            }
            self.place(&none);
            self.emit("cp.async.commit_group;");
        }
        let tiles = self.begin_tiles("0", &steps, keys);
        let k0 = tiles.start.clone();
        let (ka, va) = if staged {
            // This tile's stage (j % 2) and the next one's.
            let (odd, even) = (self.reg("u32"), self.reg("u32"));
            self.emit(&format!("cvt.u32.u64 {odd}, {};", tiles.j));
            self.emit(&format!("and.b32 {odd}, {odd}, 1;"));
            self.emit(&format!("xor.b32 {even}, {odd}, 1;"));
            let at = |w: &mut Self, base: &str, stage: &str, bytes: u32| {
                let r = w.reg("u32");
                w.emit(&format!("mad.lo.u32 {r}, {stage}, {bytes}, {base};"));
                r
            };
            let last = self.label();
            let (next, p) = (self.reg("s64"), self.reg("pred"));
            self.emit(&format!("add.s64 {next}, {}, 1;", tiles.j));
            self.emit(&format!("setp.ge.s64 {p}, {next}, {steps};"));
            self.emit(&format!("@{p} bra {last};"));
            self.emit(&format!("add.s64 {next}, {k0}, {keys};"));
            let nk = at(self, &smk, &even, kbytes);
            self.stage_tile((&e.ptr[1], &e.ld[1]), &next, &tk, (keys, d, dp), &nk, &tid, TileCopy::Async);
            if !lse_only {
                let nv = at(self, &smv, &even, vbytes);
                self.stage_tile((&e.ptr[2], &e.ld[2]), &next, &tk, (keys, dv, dvp), &nv, &tid, TileCopy::Async);
            }
            self.place(&last);
            // Every group but the newest (tile j + 1's, or an empty one) has landed: tile j has.
            self.emit("cp.async.commit_group;");
            self.emit("cp.async.wait_group 1;");
            let ka = at(self, &ka, &odd, kbytes);
            let va = if lse_only { String::new() } else { at(self, &va, &odd, vbytes) };
            (ka, va)
        } else {
            self.stage_tile((&e.ptr[1], &e.ld[1]), &k0, &tk, (keys, d, dp), &smk, &tid, TileCopy::Loads(vector));
            if !lse_only {
                self.stage_tile((&e.ptr[2], &e.ld[2]), &k0, &tk, (keys, dv, dvp), &smv, &tid, TileCopy::Loads(vector));
            }
            (ka, va)
        };
        self.emit("bar.sync 0;");

        // Scores: 16 × keys per warp, `keys / 8` tiles of 16 × 8.
        let s = self.score_tiles(ty, &qf, &ka, dp, keys, d);
        for x in s.iter().flatten() {
            self.emit(&format!("mul.f32 {x}, {x}, {scale};"));
        }
        // Masks (keys past the end; keys after the query), only on tiles that need them.
        let unmasked = self.skip_unmasked(&k0, keys, &tk, a.causal.then_some(q0.as_str()));
        self.mask_tile(&s, &l.t4, &k0, &tk, a.causal.then_some((Causal::ColumnsAfterRow, &qrow)));
        self.place(&unmasked);
        // Online softmax, per row: new max, rescale what was summed, exponentials.
        let mut alpha = Vec::with_capacity(2);
        for (r, (mr_, lr)) in m.iter().zip(&lsum).enumerate() {
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
        if !lse_only {
            for tile in &o {
                for (e, x) in tile.iter().enumerate() {
                    self.emit(&format!("mul.f32 {x}, {x}, {};", alpha[e / 2]));
                }
            }
            // Output += probabilities · values.
            let probs = self.probability_fragments(ty, &s);
            self.accumulate(ty, &o, &probs, &va, dvp, dv);
        }
        self.end_tiles(&tiles);

        for lr in &lsum {
            self.quad("add", lr);
        }
        if lse_only {
            return self.store_lse(&m, &lsum, &qrow, &tq, (&e.ptr[3], &e.ld[3]), &l);
        }
        // Finish each row: divide by the sum, store pairs. With no keys at all the row is zeros (the
        // written-out form's empty product); a row whose every score is -inf sums to 0 and divides into
        // NaN, as the written-out softmax's 0/0 does.
        let no_keys = self.reg("pred");
        self.emit(&format!("setp.eq.s64 {no_keys}, {tk}, 0;"));
        let inv: [String; 2] = std::array::from_fn(|r| {
            let x = self.reg("f32");
            self.emit(&format!("rcp.rn.f32 {x}, {};", lsum[r]));
            self.emit(&format!("selp.f32 {x}, 0f00000000, {x}, {no_keys};"));
            x
        });
        self.store_rows(ty, &o, (&qrow, &tq), (&e.ptr[3], &e.ld[3]), &inv, &l);
        if a.second.is_some() {
            // The log-sum-exps beside the output (`Attention::second`).
            self.store_lse(&m, &lsum, &qrow, &tq, (&e.ptr[7], &e.ld[7]), &l);
        }
    }

    /// Branches past a tile's masks where it needs none: no key of it (from `k0`, `keys` of them) at or past
    /// `tk`, nor, with `causal_q0` (the block's first query), after any of the block's queries. Returns
    /// the label to place after the masks.
    pub(super) fn skip_unmasked(&mut self, k0: &str, keys: u32, tk: &str, causal_q0: Option<&str>) -> String {
        let needs = self.reg("pred");
        let end = self.reg("s64");
        self.emit(&format!("add.s64 {end}, {k0}, {keys};"));
        self.emit(&format!("setp.gt.s64 {needs}, {end}, {tk};"));
        if let Some(q0) = causal_q0 {
            let c = self.reg("pred");
            self.emit(&format!("setp.gt.s64 {c}, {end}, {q0};"));
            self.emit(&format!("or.pred {needs}, {needs}, {c};"));
        }
        let unmasked = self.label();
        self.emit(&format!("@!{needs} bra {unmasked};"));
        unmasked
    }

    /// Sets to `-inf` the scores of a tile whose columns start at `start`: columns at or past `len`, and
    /// with `causal`, those its rule masks against this thread's two rows (absolute). Each score is one
    /// 32-bit compare of its column's offset (a constant) against a bound its row computes once a tile.
    pub(super) fn mask_tile(
        &mut self,
        s: &[Vec<String>],
        t4: &str,
        start: &str,
        len: &str,
        causal: Option<(Causal, &[String; 2])>,
    ) {
        let width = 8 * s.len() as u32;
        // Column offsets count from this thread's first column: the tile's start plus its pair.
        let base = self.reg("s64");
        self.emit(&format!("cvt.u64.u32 {base}, {t4};"));
        self.emit(&format!("shl.b64 {base}, {base}, 1;"));
        self.emit(&format!("add.s64 {base}, {base}, {start};"));
        let room = self.reg("s64");
        self.emit(&format!("neg.s64 {room}, {base};"));
        self.emit(&format!("add.s64 {room}, {room}, {len};"));
        // An offset in 0..=width, so 32 bits hold it.
        let clamp = |w: &mut Self, x: &str| {
            let r = w.reg("s32");
            w.emit(&format!("max.s64 {x}, {x}, 0;"));
            w.emit(&format!("min.s64 {x}, {x}, {width};"));
            w.emit(&format!("cvt.u32.u64 {r}, {x};"));
            r
        };
        // Per row: offsets at or past `hi` are masked, and below `lo` where there is one.
        let mut hi = Vec::with_capacity(2);
        let mut lo = Vec::with_capacity(2);
        for r in 0..2 {
            let h = self.reg("s64");
            self.emit(&format!("mov.s64 {h}, {room};"));
            if let Some((rule, rows)) = causal {
                let x = self.reg("s64");
                self.emit(&format!("sub.s64 {x}, {}, {base};", rows[r]));
                match rule {
                    Causal::ColumnsAfterRow => {
                        self.emit(&format!("add.s64 {x}, {x}, 1;"));
                        self.emit(&format!("min.s64 {h}, {h}, {x};"));
                    }
                    Causal::ColumnsBeforeRow => lo.push(clamp(self, &x)),
                }
            }
            hi.push(clamp(self, &h));
        }
        for (nt, tile) in s.iter().enumerate() {
            for (e, x) in tile.iter().enumerate() {
                // Element e: row e / 2 of the thread's two, column offset 8 nt + e % 2.
                let c = 8 * nt + e % 2;
                let out = self.reg("pred");
                match lo.get(e / 2) {
                    Some(l) => {
                        self.emit(&format!("setp.gt.s32 {out}, {l}, {c};"));
                        self.emit(&format!("setp.le.or.s32 {out}, {}, {c}, {out};", hi[e / 2]));
                    }
                    None => self.emit(&format!("setp.le.s32 {out}, {}, {c};", hi[e / 2])),
                }
                self.emit(&format!("@{out} mov.f32 {x}, 0fFF800000;"));
            }
        }
    }

    /// Each row's log-sum-exp, `(m + log2 l) · ln 2` from its base-2 running max and sum (`-inf` for a
    /// row without keys), stored in f32 by the row's first lane.
    #[allow(clippy::too_many_arguments)]
    fn store_lse(
        &mut self,
        m: &[String; 2],
        lsum: &[String; 2],
        rows: &[String; 2],
        len: &str,
        (ptr, ld): (&str, &str),
        l: &Lanes,
    ) {
        let first = self.reg("pred");
        self.emit(&format!("setp.eq.u32 {first}, {}, 0;", l.t4));
        for r in 0..2 {
            let skip = self.label();
            let out = self.reg("pred");
            self.emit(&format!("setp.ge.s64 {out}, {}, {len};", rows[r]));
            self.emit(&format!("or.pred {out}, {out}, !{first};"));
            self.emit(&format!("@{out} bra {skip};"));
            let x = self.reg("f32");
            self.emit(&format!("lg2.approx.ftz.f32 {x}, {};", lsum[r]));
            self.emit(&format!("add.f32 {x}, {x}, {};", m[r]));
            self.emit(&format!("mul.f32 {x}, {x}, {};", super::f32_imm(std::f64::consts::LN_2)));
            let addr = self.reg("s64");
            self.emit(&format!("mul.lo.s64 {addr}, {}, {ld};", rows[r]));
            self.emit(&format!("mad.lo.s64 {addr}, {addr}, 4, {ptr};"));
            self.emit(&format!("st.global.f32 [{addr}], {x};"));
            self.place(&skip);
        }
    }

    /// `dst = ptr[row * ld]` (f32) times `mul`, or 0 past `len`.
    pub(super) fn load_row_stat(&mut self, ptr: &str, ld: &str, row: &str, len: &str, dst: &str, mul: Option<f64>) {
        let out = self.reg("pred");
        self.emit(&format!("mov.f32 {dst}, 0f00000000;"));
        self.emit(&format!("setp.ge.s64 {out}, {row}, {len};"));
        let addr = self.reg("s64");
        self.emit(&format!("mul.lo.s64 {addr}, {row}, {ld};"));
        self.emit(&format!("mad.lo.s64 {addr}, {addr}, 4, {ptr};"));
        self.emit(&format!("@!{out} ld.global.nc.f32 {dst}, [{addr}];"));
        if let Some(c) = mul {
            self.emit(&format!("mul.f32 {dst}, {dst}, {};", super::f32_imm(c)));
        }
    }

    /// A streamed tile's log-sum-exps (base 2) and deltas into shared memory: `n` f32 of each, rows from
    /// `row0` (0 past `len`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn stage_stats(
        &mut self,
        smem: &str,
        n: u32,
        row0: &str,
        len: &str,
        lse: (&str, &str),
        delta: (&str, &str),
        tid: &str,
    ) {
        let threads = self.k.launch.threads;
        for i in 0..(2 * n).div_ceil(threads) {
            let (piece, skip) = (self.reg("u32"), self.label());
            self.emit(&format!("add.u32 {piece}, {tid}, {};", i * threads));
            let p = self.reg("pred");
            self.emit(&format!("setp.ge.u32 {p}, {piece}, {};", 2 * n));
            self.emit(&format!("@{p} bra {skip};"));
            let (which, r) = (self.reg("pred"), self.reg("u32"));
            self.emit(&format!("setp.ge.u32 {which}, {piece}, {n};"));
            self.emit(&format!("rem.u32 {r}, {piece}, {n};"));
            let row = self.reg("s64");
            self.emit(&format!("cvt.u64.u32 {row}, {r};"));
            self.emit(&format!("add.s64 {row}, {row}, {row0};"));
            let (a, b) = (self.reg("f32"), self.reg("f32"));
            self.load_row_stat(lse.0, lse.1, &row, len, &a, Some(LOG2_E));
            self.load_row_stat(delta.0, delta.1, &row, len, &b, None);
            self.emit(&format!("selp.f32 {a}, {b}, {a}, {which};"));
            let sa = self.reg("u32");
            self.emit(&format!("mad.lo.u32 {sa}, {piece}, 4, {smem};"));
            self.emit(&format!("st.shared.f32 [{sa}], {a};"));
            self.place(&skip);
        }
    }

    /// This thread's columns' staged log-sum-exps and deltas, per score tile: columns `8 nt + 2 t4` and
    /// the next.
    pub(super) fn tile_stats(&mut self, l: &Lanes, smem: &str, n: u32) -> Vec<[(String, String); 2]> {
        let at = self.reg("u32");
        self.emit(&format!("mad.lo.u32 {at}, {}, 8, {smem};", l.t4));
        (0..n / 8)
            .map(|nt| {
                let (l0, l1, d0, d1) = (self.reg("f32"), self.reg("f32"), self.reg("f32"), self.reg("f32"));
                self.emit(&format!("ld.shared.v2.f32 {{{l0}, {l1}}}, [{at}+{}];", 32 * nt));
                self.emit(&format!("ld.shared.v2.f32 {{{d0}, {d1}}}, [{at}+{}];", 4 * n + 32 * nt));
                [(l0, d0), (l1, d1)]
            })
            .collect()
    }
}
