//! Reduce-overhead mode: which recording a call replays, and how a new recording binds its buffers.
//!
//! A recording (a CUDA graph) reads and writes fixed buffers. Two kinds of caller make that costly when
//! done naively. An input that lives in a new buffer every call (a batch) is copied into a buffer of the
//! recording's own, as torch does; that copy is small. A training step is the other kind: its outputs
//! (weights, moments) are its next call's inputs, hundreds of megabytes of them, and copying them in and
//! out of one recording costs more than the launches the recording saves. Such a step gets two
//! recordings instead, each reading the other's outputs in place and writing its outputs into the
//! buffers the other reads: the state ping-pongs between two sets of buffers with no copy, and the
//! two share their intermediates (they never run at once: one stream, and the recordings' lock).
//!
//! Nothing is ever overwritten under a holder: before a replay, every output buffer is checked for
//! references beyond the recordings' own ([`Recorded::held_outputs`]); one a caller still holds is left
//! to the caller, and that output is handed out as a copy from then on. Likewise a recording copies a
//! call's input into a buffer of its own only where nobody else holds that buffer (a partner may have
//! handed it out), else another recording serves the call ([`Recorded::reads`]).

use super::{lock, DeviceBuffer, DeviceTensor, Error, Prepared, Result, Runtime, MAX_RECORDINGS};
use crate::pipeline::CompiledGraph;
use std::borrow::Borrow;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A reduce-overhead recording: which graph and symbol values, which inputs it owns a buffer for, and
/// which outputs it hands out as copies.
pub(super) struct Recorded {
    pub(super) compiled: Arc<CompiledGraph>,
    values: Vec<i64>,
    pub(super) prepared: Prepared,
    /// Per input: read from a buffer of the recording's own, into which the caller's is copied.
    private: Vec<bool>,
    /// Per output: handed out as a copy (a caller once held it across a later call).
    copy_out: Vec<bool>,
    /// Its outputs in buffers of its own (neither an input passed through nor handed out as a copy),
    /// with their plan buffers.
    own_outputs: Vec<(usize, usize)>,
    /// Per output: the references the recordings themselves hold to its buffer (this one's, and a
    /// partner's that reads it in place). More than these means someone else holds it.
    kept: Vec<usize>,
    /// Per input: the same for the buffer it is read from (a private one may be a partner's output).
    kept_inputs: Vec<usize>,
    /// Which recording it is (unique in the runtime: indices move as recordings go).
    serial: u64,
    /// When it last served a call (the runtime's count of recorded calls then): the least recently
    /// used goes first past the limit.
    used: u64,
}

impl Recorded {
    /// A recording of `prepared`, its reference counts still to be made ([`Recordings::put`]).
    fn new(
        compiled: Arc<CompiledGraph>,
        values: Vec<i64>,
        prepared: Prepared,
        private: Vec<bool>,
        copy_out: Vec<bool>,
    ) -> Recorded {
        let layout = &prepared.layout;
        // An input passed straight through is never written by a replay (a private one only by a
        // copy-in, which `reads` guards).
        let own_outputs = (layout.outputs.iter().enumerate())
            .filter(|&(o, (b, _, _))| !layout.input_slots.contains(b) && !copy_out[o])
            .map(|(o, (b, _, _))| (o, *b))
            .collect();
        static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        Recorded {
            compiled,
            values,
            prepared,
            private,
            copy_out,
            own_outputs,
            kept: Vec::new(),
            kept_inputs: Vec::new(),
            serial,
            used: 0,
        }
    }

    /// Whether a call with `inputs` can replay this recording: every input it reads in place is in the
    /// buffer it was recorded with, and every other is copied into a buffer nobody else holds (a
    /// private buffer is also its partner's output, which a caller may have kept).
    fn reads<T: Borrow<DeviceTensor>>(&self, slots: &[usize], inputs: &[T]) -> bool {
        (slots.iter().zip(inputs.iter().map(Borrow::borrow)).zip(&self.private).enumerate()).all(
            |(i, ((&s, t), &own))| {
                let b = &self.prepared.buffers[s];
                Arc::ptr_eq(b, &t.buffer) || (own && Arc::strong_count(b) <= self.kept_inputs[i])
            },
        )
    }

    /// How many inputs a replay for `inputs` would copy in (private ones living elsewhere).
    fn copies<T: Borrow<DeviceTensor>>(&self, slots: &[usize], inputs: &[T]) -> usize {
        (slots.iter().zip(inputs.iter().map(Borrow::borrow)).zip(&self.private))
            .filter(|((&s, t), &own)| own && !Arc::ptr_eq(&self.prepared.buffers[s], &t.buffer))
            .count()
    }

    /// The outputs whose buffers someone besides the recordings holds (a caller kept an earlier call's
    /// result, or passes it to this call): replaying would overwrite them under the holder. No
    /// allocation when there are none (this runs on every call).
    fn held_outputs(&self) -> Vec<usize> {
        (self.own_outputs.iter())
            .filter(|&&(o, b)| Arc::strong_count(&self.prepared.buffers[b]) > self.kept[o])
            .map(|&(o, _)| o)
            .collect()
    }

    /// The own output (its plan buffer) that buffer `x` is, if any.
    fn output_slot_of(&self, x: &Arc<DeviceBuffer>) -> Option<usize> {
        self.own_outputs.iter().map(|&(_, b)| b).find(|&b| Arc::ptr_eq(&self.prepared.buffers[b], x))
    }

    /// How many of `inputs` are this recording's own outputs: a step fed its last results.
    fn fed_back<T: Borrow<DeviceTensor>>(&self, inputs: &[T]) -> usize {
        inputs.iter().map(Borrow::borrow).filter(|t| self.output_slot_of(&t.buffer).is_some()).count()
    }
}

/// The runtime's recordings, with each output's count of references held by recordings kept current
/// (a stale count could let a replay overwrite a buffer a caller holds).
#[derive(Default)]
pub(super) struct Recordings {
    list: Vec<Recorded>,
    /// Calls served so far: the clock of [`Recorded::used`].
    calls: u64,
}

impl Recordings {
    /// Removes the recordings `gone` accepts and returns them (for the caller to drop where it likes:
    /// their buffers go back to the pool unless someone else holds them).
    pub(super) fn take(&mut self, mut gone: impl FnMut(&Recorded) -> bool) -> Vec<Recorded> {
        if !self.list.iter().any(&mut gone) {
            return Vec::new();
        }
        let (taken, kept) = std::mem::take(&mut self.list).into_iter().partition(gone);
        self.list = kept;
        self.recount();
        taken
    }

    /// Counts, for every recording's outputs, the references all recordings hold to their buffers.
    fn recount(&mut self) {
        let mut refs: HashMap<u64, usize> = HashMap::new();
        for b in self.list.iter().flat_map(|r| &r.prepared.buffers) {
            *refs.entry(b.id()).or_default() += 1;
        }
        for r in &mut self.list {
            let (buffers, layout) = (&r.prepared.buffers, &r.prepared.layout);
            r.kept = layout.outputs.iter().map(|(b, _, _)| refs[&buffers[*b].id()]).collect();
            r.kept_inputs = layout.input_slots.iter().map(|s| refs[&buffers[*s].id()]).collect();
        }
    }

    /// References the recordings hold to `b`.
    fn refs(&self, b: &DeviceBuffer) -> usize {
        self.list.iter().flat_map(|r| &r.prepared.buffers).filter(|x| x.id() == b.id()).count()
    }

    /// Adds a recording, replacing the one at `replaced` if given; past the limit the least recently
    /// used goes, unless it is recording `partner` (the new one's pair). Returns where it went.
    fn put(&mut self, r: Recorded, replaced: Option<usize>, partner: Option<u64>) -> usize {
        let at = match replaced {
            Some(i) => {
                self.list[i] = r;
                i
            }
            None => {
                if self.list.len() >= MAX_RECORDINGS {
                    let idle = (self.list.iter().enumerate())
                        .filter(|(_, x)| Some(x.serial) != partner)
                        .min_by_key(|(_, x)| x.used)
                        .map_or(0, |(i, _)| i);
                    self.list.remove(idle);
                }
                self.list.push(r);
                self.list.len() - 1
            }
        };
        self.recount();
        at
    }
}

impl Runtime {
    /// Reduce-overhead: replays the recording made for this compiled graph and these symbol values
    /// (recording it on first use). Inputs that keep their buffer from call to call (weights) stay bound
    /// in place; an input whose buffer changed (a batch) is given a buffer of the recording's own (one
    /// re-record) and copied into it on every later replay, as torch does for non-static inputs. Inputs
    /// that are the last call's outputs (a training step's state) get a partner recording that reads
    /// them in place and writes into the buffers the first one reads: no copy either way (module docs).
    /// Outputs are the recording's own buffers, which a later replay overwrites: one a caller still
    /// holds at a later call stays the caller's, and that output is handed out as a copy from then on.
    pub fn run_recorded<T: Borrow<DeviceTensor>>(
        &self,
        c: &Arc<CompiledGraph>,
        inputs: &[T],
    ) -> Result<Vec<DeviceTensor>> {
        self.reopen_if_lost()?;
        self.check_inputs(c, inputs)?;
        let layout = self.layout(c, inputs)?;
        let values: Vec<i64> = layout.bindings.iter().map(|(_, v)| v).collect();
        let mut recs = lock(&self.recordings);
        let now = self.generation.load(Ordering::Acquire);
        // Made on a device lost since: dropped (their buffers freed, not pooled), recorded again.
        drop(recs.take(|r| r.prepared.generation != now));
        let slots = &layout.input_slots;
        // Of the recordings that can serve the call, the one that copies least (a step's partner reads
        // the state in place where the other would copy it), the newest among equals.
        let found = (recs.list.iter().enumerate())
            .filter(|(_, r)| Arc::ptr_eq(&r.compiled, c) && r.values == values && r.reads(slots, inputs))
            .min_by_key(|(i, r)| (r.copies(slots, inputs), std::cmp::Reverse(*i)))
            .map(|(i, _)| i);
        let at = match found {
            Some(i) => {
                let held = recs.list[i].held_outputs();
                if held.is_empty() {
                    i
                } else if recs.list[i].fed_back(inputs) > 0 {
                    self.record_partner(&mut recs, c, values, inputs)?
                } else {
                    self.record_with_copies(&mut recs, i, &held)?
                }
            }
            None => self.record_partner(&mut recs, c, values, inputs)?,
        };
        recs.calls += 1;
        let now = recs.calls;
        recs.list[at].used = now;
        let r = &recs.list[at];
        let _gate = self.gate();
        let d = self.driver();
        for ((&s, t), &own) in slots.iter().zip(inputs.iter().map(Borrow::borrow)).zip(&r.private) {
            let n = self.target().storage_bytes(t.dtype, t.numel());
            if own && n > 0 && !Arc::ptr_eq(&r.prepared.buffers[s], &t.buffer) {
                self.seen(d.copy(t.buffer.raw(), r.prepared.buffers[s].raw(), n))?;
                lock(&self.stats).replay_input_copies += 1;
            }
        }
        self.launch_now(&r.prepared)?;
        // The next replay rewrites the recording's fault words as it rewrites its outputs: this replay's
        // results carry a copy of them (a few words; outputs may be carried far by later calls).
        let own = match &r.prepared.faults {
            Some(words) => {
                let n = layout.stride * layout.checked.len() as u64;
                let copy = self.alloc(n, "fault words")?;
                self.seen(d.copy(words.raw(), copy.raw(), n))?;
                Some(self.checks_over(&r.prepared, copy))
            }
            None => None,
        };
        let checks = self.carried(inputs, own)?;
        let mut outs = self.outputs(&r.prepared, &checks);
        for (o, out) in outs.iter_mut().enumerate().filter(|(o, _)| r.copy_out[*o]) {
            let n = self.target().storage_bytes(out.dtype, out.numel());
            let fresh = self.alloc(n, "an output")?;
            if n > 0 {
                let b = layout.outputs[o].0;
                self.seen(d.copy(r.prepared.buffers[b].raw(), fresh.raw(), n))?;
                lock(&self.stats).replay_output_copies += 1;
            }
            out.buffer = fresh;
        }
        self.seen(d.submit())?;
        Ok(outs)
    }

    /// Records recording `i` again with its `held` outputs in fresh buffers (the held ones stay their
    /// holders'), handed out as copies from then on; every other buffer stays as it was bound.
    fn record_with_copies(&self, recs: &mut Recordings, i: usize, held: &[usize]) -> Result<usize> {
        let r = &recs.list[i];
        let layout = r.prepared.layout.clone();
        let mut buffers: Vec<Option<Arc<DeviceBuffer>>> = r.prepared.buffers.iter().cloned().map(Some).collect();
        let mut copy_out = r.copy_out.clone();
        for &o in held {
            buffers[layout.outputs[o].0] = None;
        }
        // Outputs sharing a held one's buffer are copies too.
        for (o, (b, _, _)) in layout.outputs.iter().enumerate() {
            copy_out[o] |= buffers[*b].is_none();
        }
        let mut prepared = self.prepare_bound(&r.compiled, layout, buffers)?;
        self.record(&mut prepared)?;
        let r = &recs.list[i];
        let redone = Recorded::new(r.compiled.clone(), r.values.clone(), prepared, r.private.clone(), copy_out);
        Ok(recs.put(redone, Some(i), None))
    }

    /// Records `c` for a call with `inputs` that no recording serves well. Its base is the recording of
    /// the same graph whose outputs the inputs are (a step fed its last results; of any symbol values:
    /// a shorter last batch's step feeds the full batches' and is fed by them), else the newest of these
    /// values. Inputs that are the base's outputs are read in place, and the outputs they become are
    /// written into the buffers the base reads for them (when nobody else holds those and they are large
    /// enough): the two recordings then feed each other. Inputs the base reads in place from the same
    /// buffers stay in place; every other input gets a buffer of its own. Intermediates are the base's
    /// where its sizes are these. A base of these values that feeds nothing is superseded and dropped,
    /// and at most one other recording of these values stays beside the new one.
    fn record_partner<T: Borrow<DeviceTensor>>(
        &self,
        recs: &mut Recordings,
        c: &Arc<CompiledGraph>,
        values: Vec<i64>,
        inputs: &[T],
    ) -> Result<usize> {
        let layout = self.layout(c, inputs)?;
        let same_graph = |i: &usize| Arc::ptr_eq(&recs.list[*i].compiled, c);
        let siblings: Vec<usize> =
            (0..recs.list.len()).filter(same_graph).filter(|&i| recs.list[i].values == values).collect();
        // Most inputs fed back wins, from a recording of any symbol values (a shorter last batch's step
        // hands its state to the full batches' and back); with none fed back, the newest of these values.
        let fed_by = (0..recs.list.len()).filter(same_graph).max_by_key(|&i| (recs.list[i].fed_back(inputs), i));
        let base_at = fed_by.filter(|&i| recs.list[i].fed_back(inputs) > 0).or(siblings.last().copied());
        let base = base_at.map(|i| &recs.list[i]);
        let slots = &layout.input_slots;
        let mut buffers: Vec<Option<Arc<DeviceBuffer>>> = vec![None; layout.sizes.len()];
        let mut private = vec![false; inputs.len()];
        // (input, the base's output buffer it is)
        let mut fed: Vec<(usize, usize)> = Vec::new();
        for (i, (&s, t)) in slots.iter().zip(inputs.iter().map(Borrow::borrow)).enumerate() {
            let Some(base) = base else {
                buffers[s] = Some(t.buffer.clone());
                continue;
            };
            if let Some(b) = base.output_slot_of(&t.buffer) {
                fed.push((i, b));
                buffers[s] = Some(t.buffer.clone());
            } else if !base.private[i] && Arc::ptr_eq(&base.prepared.buffers[s], &t.buffer) {
                buffers[s] = Some(t.buffer.clone());
            } else {
                private[i] = true;
            }
        }
        // Each fed-back output is written where the base reads its input, when nobody else holds that
        // buffer and this recording does not read it; else the input is copied into a buffer of its own.
        let mut paired = 0;
        if let Some(base) = base {
            for &(i, b) in &fed {
                let target = &base.prepared.buffers[slots[i]];
                let bound_here = buffers.iter().flatten().any(|x| Arc::ptr_eq(x, target));
                let free = Arc::strong_count(target) == recs.refs(target);
                // A base of other symbol values read a state of the same dims there (its bytes suffice).
                let fits = layout.sizes[b] <= base.prepared.layout.sizes[slots[i]];
                if free && fits && !bound_here && buffers[b].is_none() {
                    buffers[b] = Some(target.clone());
                    paired += 1;
                } else {
                    private[i] = true;
                    buffers[slots[i]] = None;
                }
            }
        }
        for (i, t) in inputs.iter().map(Borrow::borrow).enumerate().filter(|(i, _)| private[*i]) {
            let n = self.target().storage_bytes(t.dtype, t.numel());
            let own = self.alloc(n, "a recorded input")?;
            // Filled before the recording's first (plain) run, which then computes on this call's
            // values, not on whatever the pooled memory held (an index read from it could fault).
            if n > 0 {
                let _gate = self.gate();
                self.seen(self.driver().copy(t.buffer.raw(), own.raw(), n))?;
            }
            buffers[slots[i]] = Some(own);
        }
        // An output the caller still holds from the base's last replay (and does not feed back) is one
        // it keeps across calls (a loss it logs): handed out as a copy from the start.
        let kept_by_caller = |r: &Recorded, o: usize| {
            r.own_outputs.iter().any(|&(x, b)| {
                x == o && Arc::strong_count(&r.prepared.buffers[b]) > r.kept[o] && !fed.iter().any(|f| f.1 == b)
            })
        };
        let copy_out: Vec<bool> =
            (0..layout.outputs.len()).map(|o| base.is_some_and(|r| r.copy_out[o] || kept_by_caller(r, o))).collect();
        if let Some(base) = base.filter(|r| r.prepared.layout.sizes == layout.sizes) {
            let io: Vec<usize> = slots.iter().copied().chain(layout.outputs.iter().map(|(b, _, _)| *b)).collect();
            for (k, slot) in buffers.iter_mut().enumerate() {
                if slot.is_none() && !io.contains(&k) {
                    *slot = Some(base.prepared.buffers[k].clone());
                }
            }
        }
        let mut prepared = self.prepare_bound(c, layout, buffers)?;
        self.record(&mut prepared)?;
        // A base of these values that feeds nothing is superseded. Beside the new recording, one other
        // of these values stays: the base where it is one (the pair), else the newest.
        let mut kept: Vec<usize> = siblings.clone();
        if paired == 0 {
            kept.retain(|&i| Some(i) != base_at);
        }
        while kept.len() > 1 {
            let oldest = kept.iter().position(|&i| Some(i) != base_at).unwrap_or(0);
            kept.remove(oldest);
        }
        let partner = base_at.filter(|_| paired > 0).map(|i| recs.list[i].serial);
        for i in siblings.into_iter().rev().filter(|i| !kept.contains(i)) {
            recs.list.remove(i);
        }
        Ok(recs.put(Recorded::new(c.clone(), values, prepared, private, copy_out), None, partner))
    }

    /// [`Runtime::prepare`] with some plan buffers given (`Some`), the rest fresh from the pool.
    fn prepare_bound(
        &self,
        c: &Arc<CompiledGraph>,
        layout: Arc<super::Layout>,
        buffers: Vec<Option<Arc<DeviceBuffer>>>,
    ) -> Result<Prepared> {
        let _gate = self.gate();
        let generation = self.generation.load(Ordering::Acquire);
        if layout.generation != generation {
            return Err(Error::DeviceLost {
                device: self.name().into(),
                what: "recording a graph".into(),
                msg: "the device was lost while it was being bound".into(),
            });
        }
        self.bind_buffers(c, layout, buffers, generation)
    }
}
