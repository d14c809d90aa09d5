//! Batches for training loops. A [`Dataset`] hands out samples by index; a [`Loader`] decides which
//! samples each epoch visits and in which order (shuffled from the seed and the epoch alone, split across
//! data-parallel ranks as torch's `DistributedSampler` splits them), then collates each batch and moves it
//! to the device on a background thread, a few batches ahead of the step that needs them: the host's
//! work overlaps the device's, and an epoch can be replayed exactly (resuming from a checkpoint re-draws
//! the same order and skips the batches already trained on).
//!
//! The last batch of an epoch is kept even when it is shorter (no `drop_last` needed): [`crate::fit`]
//! compiles its steps with the batch dim symbolic from the first call when [`Loader::varies`].

use crate::{Error, Result, Runtime, SourceLoc, Tensor, TensorData};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Samples addressed by index, collated into batches on request.
pub trait Dataset: Send + Sync {
    /// Samples held.
    fn len(&self) -> usize;

    /// Whether there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The samples at `indices`, collated: one host tensor per model input, the batch as its first axis.
    fn batch(&self, indices: &[usize]) -> Result<Vec<TensorData>>;

    /// [`Dataset::batch`], collated where it can be into `spare`: byte buffers of batches already
    /// uploaded, whose pages are mapped (a fresh 64 MiB buffer costs more in page faults than its
    /// copy). The [`Loader`] hands its uploaded batches' buffers back this way. By default `batch`.
    fn batch_into(&self, indices: &[usize], spare: &mut Vec<Vec<u8>>) -> Result<Vec<TensorData>> {
        let _ = spare;
        self.batch(indices)
    }
}

/// A dataset held in memory as tensors that share their first axis (inputs, targets, …): sample `i` is
/// row `i` of each.
#[derive(Clone, Debug)]
pub struct TensorDataset {
    columns: Vec<Arc<TensorData>>,
}

fn bad_input(what: String) -> Error {
    Error::Unsupported { what, loc: SourceLoc::internal() }
}

impl TensorDataset {
    /// A dataset of `columns`' rows; every column needs at least one axis and the same first dim.
    pub fn new(columns: Vec<TensorData>) -> Result<TensorDataset> {
        let rows = columns.first().and_then(|c| c.dims().first().copied());
        for (i, c) in columns.iter().enumerate() {
            if c.dims().first().copied() != rows || rows.is_none() {
                return Err(bad_input(format!(
                    "dataset column {i} has dims {:?}; every column needs the first column's first dim ({rows:?})",
                    c.dims()
                )));
            }
        }
        Ok(TensorDataset { columns: columns.into_iter().map(Arc::new).collect() })
    }
}

impl Dataset for TensorDataset {
    fn len(&self) -> usize {
        self.columns.first().map_or(0, |c| c.dims()[0])
    }

    fn batch(&self, indices: &[usize]) -> Result<Vec<TensorData>> {
        self.batch_into(indices, &mut Vec::new())
    }

    fn batch_into(&self, indices: &[usize], spare: &mut Vec<Vec<u8>>) -> Result<Vec<TensorData>> {
        let rows = self.len();
        if let Some(&i) = indices.iter().find(|&&i| i >= rows) {
            return Err(bad_input(format!("sample {i} of a dataset of {rows}")));
        }
        self.columns
            .iter()
            .map(|c| {
                let all = c.le_bytes();
                let row = all.len() / rows.max(1);
                let bytes = gather_rows(all, row, indices, spare.pop().unwrap_or_default());
                let mut dims = c.dims().to_vec();
                dims[0] = indices.len();
                TensorData::from_le_vec(bytes, &dims, c.dtype())
            })
            .collect()
    }
}

/// Bytes a collation copies on one thread; past this, its rows are split across the host's cores (a
/// 64 MiB batch took a single thread longer to gather than a GPU took to train on it).
const GATHER_BYTES_PER_THREAD: usize = 4 << 20;

/// Rows `indices` (each `row` bytes) of `all`, in order, written into `into` (its capacity reused).
fn gather_rows(all: &[u8], row: usize, indices: &[usize], mut into: Vec<u8>) -> Vec<u8> {
    let total = row * indices.len();
    into.clear();
    into.reserve(total);
    let threads =
        std::thread::available_parallelism().map_or(1, |n| n.get()).min(total / GATHER_BYTES_PER_THREAD).min(16);
    if threads <= 1 || row == 0 {
        for &i in indices {
            into.extend_from_slice(&all[i * row..(i + 1) * row]);
        }
        return into;
    }
    let per = indices.len().div_ceil(threads);
    let out = &mut into.spare_capacity_mut()[..total];
    std::thread::scope(|s| {
        for (rows, out) in indices.chunks(per).zip(out.chunks_mut(per * row)) {
            s.spawn(move || {
                for (&i, dst) in rows.iter().zip(out.chunks_exact_mut(row)) {
                    let src = &all[i * row..(i + 1) * row];
                    // SAFETY: `dst` is `row` bytes of the vector's spare capacity, `src` is `row` bytes.
                    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<u8>(), row) };
                }
            });
        }
    });
    // SAFETY: every one of the `total` bytes was written above (the chunks cover `out` exactly).
    unsafe { into.set_len(total) };
    into
}

/// Which samples an epoch visits, in which order: a permutation drawn from `(seed, epoch)` alone (or the
/// natural order), of which rank `rank` of `world` takes every `world`-th entry. As in torch's
/// `DistributedSampler`, the order is first padded by wrapping around so that every rank gets the same
/// number of samples (and so runs the same number of steps) — unless `pad` is off (evaluation: every
/// sample exactly once across the ranks, shares differing by at most one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampler {
    /// Shuffle every epoch.
    pub shuffle: bool,
    /// Seed of the shuffles.
    pub seed: u64,
    /// This process's rank among the data-parallel ones.
    pub rank: usize,
    /// Data-parallel processes.
    pub world: usize,
    /// Pad the order so every rank gets as many samples as the first.
    pub pad: bool,
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler { shuffle: true, seed: 0, rank: 0, world: 1, pad: true }
    }
}

/// SplitMix64: a counter-based stream, so an epoch's order needs nothing but its seed.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Sampler {
    /// This rank's sample indices for `epoch`, of a dataset of `len`.
    pub fn order(&self, len: usize, epoch: u64) -> Vec<usize> {
        let mut all: Vec<usize> = (0..len).collect();
        if self.shuffle {
            let mut state = self.seed ^ epoch.wrapping_mul(0xd1b5_4a32_d192_ed03);
            for i in (1..len).rev() {
                let j = (splitmix(&mut state) % (i as u64 + 1)) as usize;
                all.swap(i, j);
            }
        }
        let world = self.world.max(1);
        let rank = self.rank.min(world - 1);
        if len == 0 {
            return Vec::new();
        }
        if !self.pad {
            return all.into_iter().skip(rank).step_by(world).collect();
        }
        let per_rank = len.div_ceil(world);
        let padded = (0..per_rank * world).map(|i| all[i % len]);
        padded.skip(rank).step_by(world).collect()
    }

    /// How many samples this rank takes of a dataset of `len`.
    pub fn share(&self, len: usize) -> usize {
        let world = self.world.max(1);
        match self.pad {
            true => len.div_ceil(world),
            false => len / world + usize::from(self.rank.min(world - 1) < len % world),
        }
    }
}

/// Batches of a [`Dataset`], epoch by epoch (see the module's documentation).
#[derive(Clone)]
pub struct Loader {
    dataset: Arc<dyn Dataset>,
    batch: usize,
    drop_last: bool,
    sampler: Sampler,
    device: Option<Arc<Runtime>>,
    prefetch: usize,
    /// Host memory of batches uploaded already, collated into again by the next epoch's thread.
    spare: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("samples", &self.dataset.len())
            .field("batch", &self.batch)
            .field("drop_last", &self.drop_last)
            .field("sampler", &self.sampler)
            .field("device", &self.device.as_ref().map(|d| d.name()))
            .field("prefetch", &self.prefetch)
            .finish()
    }
}

/// One collated batch, on the loader's device.
#[derive(Clone, Debug)]
pub struct Batch {
    /// One tensor per dataset column, the batch first.
    pub tensors: Vec<Tensor>,
    /// Samples in it (the last batch of an epoch may have fewer than the loader's batch size).
    pub size: usize,
    /// Its position in the epoch.
    pub index: usize,
}

impl Loader {
    /// Batches of `batch` samples of `dataset`, shuffled with seed 0, kept on the host, two prepared ahead.
    pub fn new(dataset: impl Dataset + 'static, batch: usize) -> Loader {
        Loader {
            dataset: Arc::new(dataset),
            batch: batch.max(1),
            drop_last: false,
            sampler: Sampler::default(),
            device: None,
            prefetch: 2,
            spare: Arc::default(),
        }
    }

    /// Shuffle each epoch from `seed` (`None`: the natural order every epoch).
    pub fn shuffle(mut self, seed: Option<u64>) -> Loader {
        self.sampler.shuffle = seed.is_some();
        self.sampler.seed = seed.unwrap_or(0);
        self
    }

    /// Take rank `rank`'s share of `world` data-parallel processes, padded (as `DistributedSampler`)
    /// so every rank runs the same number of equal batches — what a step whose gradients are averaged
    /// across the ranks needs.
    pub fn shard(mut self, rank: usize, world: usize) -> Loader {
        self.sampler.world = world.max(1);
        self.sampler.rank = rank.min(world.max(1) - 1);
        self.sampler.pad = true;
        self
    }

    /// Rank `rank`'s share of `world` with every sample taken exactly once across the ranks (shares
    /// differ by at most one sample, so the ranks' batch counts may too): evaluation, whose sums are
    /// combined once at the end rather than per batch.
    pub fn shard_exactly(mut self, rank: usize, world: usize) -> Loader {
        self = self.shard(rank, world);
        self.sampler.pad = false;
        self
    }

    /// Skip an epoch's last batch when it is shorter than the others (off by default: not needed).
    pub fn drop_last(mut self, on: bool) -> Loader {
        self.drop_last = on;
        self
    }

    /// Move each batch to `device` on the loader's thread, ahead of its step.
    pub fn to(mut self, device: Arc<Runtime>) -> Loader {
        self.device = Some(device);
        self
    }

    /// Batches prepared ahead of the one being trained on (at least one).
    pub fn prefetch(mut self, batches: usize) -> Loader {
        self.prefetch = batches.max(1);
        self
    }

    /// The sampler this loader draws with.
    pub fn sampler(&self) -> Sampler {
        self.sampler
    }

    /// Samples in the dataset.
    pub fn samples(&self) -> usize {
        self.dataset.len()
    }

    /// The size of each batch of an epoch, in order.
    pub fn batch_sizes(&self) -> Vec<usize> {
        // Each rank's share, as `Sampler::order` takes it (no epoch need be drawn to count it).
        let n = self.sampler.share(self.dataset.len());
        let full = n / self.batch;
        let rest = n % self.batch;
        let mut sizes = vec![self.batch; full];
        if rest > 0 && !self.drop_last {
            sizes.push(rest);
        }
        sizes
    }

    /// Tensors in each batch (the dataset's columns), read from one collated sample.
    pub fn columns(&self) -> Result<usize> {
        if self.dataset.is_empty() {
            return Ok(0);
        }
        Ok(self.dataset.batch(&[0])?.len())
    }

    /// Whether an epoch's batches differ in size (a shorter last batch).
    pub fn varies(&self) -> bool {
        let sizes = self.batch_sizes();
        sizes.windows(2).any(|w| w[0] != w[1])
    }

    /// The largest batch.
    pub fn batch_size(&self) -> usize {
        self.batch
    }

    /// Batches of an epoch.
    pub fn batches(&self) -> usize {
        self.batch_sizes().len()
    }

    /// The batches of `epoch`, prepared on a background thread.
    pub fn epoch(&self, epoch: u64) -> Epoch {
        self.epoch_from(epoch, 0)
    }

    /// The batches of `epoch` from its `first`-th on (a resumed run skips those it trained on).
    pub fn epoch_from(&self, epoch: u64, first: usize) -> Epoch {
        let order = self.sampler.order(self.dataset.len(), epoch);
        let sizes = self.batch_sizes();
        let (tx, rx) = sync_channel(self.prefetch);
        let (dataset, device, batch) = (self.dataset.clone(), self.device.clone(), self.batch);
        let kept = self.spare.clone();
        let worker = std::thread::Builder::new().name(format!("kiln-loader-epoch-{epoch}")).spawn(move || {
            // Uploaded batches' host memory, collated into again (see `Dataset::batch_into`): the last
            // batch's, one buffer a column, handed on to the next epoch.
            let mut spare: Vec<Vec<u8>> = std::mem::take(&mut *crate::graph::runtime::lock(&kept));
            for (index, &size) in sizes.iter().enumerate().skip(first) {
                let indices = &order[index * batch..index * batch + size];
                let made = dataset.batch_into(indices, &mut spare).and_then(|cols| {
                    let mut tensors = Vec::with_capacity(cols.len());
                    let mut uploaded = Vec::with_capacity(cols.len());
                    for d in cols {
                        tensors.push(match &device {
                            Some(rt) => {
                                let on = rt.upload(&d)?;
                                uploaded.push(d.into_le_bytes());
                                Tensor::from_value(crate::graph::value::Value::from_device(on))
                            }
                            None => Tensor::from_data(d),
                        });
                    }
                    // One buffer a column, kept so that column `i` pops its own next time (a dataset that
                    // collates elsewhere leaves them unused: never more than a batch's worth).
                    spare.clear();
                    spare.extend(uploaded.into_iter().rev());
                    Ok(Batch { tensors, size, index })
                });
                let failed = made.is_err();
                // The trainer stopped listening (early stop, an error): nothing more to prepare.
                if tx.send(made).is_err() || failed {
                    break;
                }
            }
            *crate::graph::runtime::lock(&kept) = spare;
        });
        match worker {
            Ok(handle) => Epoch { rx: Some(rx), worker: Some(handle) },
            Err(e) => {
                let (tx, rx) = sync_channel(1);
                let _ = tx.send(Err(bad_input(format!("the loader's thread could not start: {e}"))));
                Epoch { rx: Some(rx), worker: None }
            }
        }
    }
}

/// An epoch's batches, in order, as the loader's thread prepares them.
pub struct Epoch {
    rx: Option<Receiver<Result<Batch>>>,
    worker: Option<JoinHandle<()>>,
}

impl Iterator for Epoch {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        self.rx.as_ref()?.recv().ok()
    }
}

impl Drop for Epoch {
    fn drop(&mut self) {
        // Dropping the receiver first unblocks a thread waiting to hand over a batch.
        self.rx.take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// Integer class labels as a dataset column (`i64`, shape `[n]`).
pub fn labels(values: &[i64]) -> Result<TensorData> {
    TensorData::new(values, &[values.len()])
}

/// Rows of f32 features as a dataset column (shape `[n, width]`).
pub fn features(values: &[f32], width: usize) -> Result<TensorData> {
    if width == 0 || values.len() % width != 0 {
        return Err(bad_input(format!("{} feature values do not make rows of {width}", values.len())));
    }
    TensorData::new(values, &[values.len() / width, width])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows gathered on several threads (past `GATHER_BYTES_PER_THREAD`) and into a reused buffer equal
    /// the rows copied one by one.
    #[test]
    fn rows_gathered_on_threads_into_reused_memory_are_the_rows() {
        let (rows, row) = (12_000, 1024);
        let all: Vec<u8> = (0..rows * row).map(|i| (i * 31 % 251) as u8).collect();
        let indices: Vec<usize> = (0..9_000).map(|i| i * 7919 % rows).collect();
        let want: Vec<u8> = indices.iter().flat_map(|&i| all[i * row..(i + 1) * row].iter().copied()).collect();
        assert!(want.len() > 2 * GATHER_BYTES_PER_THREAD, "the case must take the threaded path");
        let reused = vec![7u8; 3 * want.len()];
        let got = gather_rows(&all, row, &indices, reused);
        assert_eq!(got, want);
        let small = gather_rows(&all, row, &indices[..3], got);
        assert_eq!(small, want[..3 * row]);
    }

    /// A dataset's batches collated into the memory of earlier ones are the batches it collates afresh.
    #[test]
    fn batches_collated_into_spare_memory_match_fresh_ones() {
        let x: Vec<f32> = (0..40 * 6).map(|i| i as f32).collect();
        let y: Vec<i64> = (0..40).collect();
        let ds = TensorDataset::new(vec![features(&x, 6).unwrap(), labels(&y).unwrap()]).unwrap();
        let mut spare = vec![vec![1u8; 5], vec![2u8; 1000]];
        for indices in [vec![3, 1, 4], vec![39, 0], vec![5; 7]] {
            let fresh = ds.batch(&indices).unwrap();
            let reused = ds.batch_into(&indices, &mut spare).unwrap();
            assert_eq!(fresh.len(), reused.len());
            for (f, r) in fresh.iter().zip(&reused) {
                assert_eq!((f.dims(), f.dtype(), f.le_bytes()), (r.dims(), r.dtype(), r.le_bytes()));
            }
            spare.extend(reused.into_iter().map(TensorData::into_le_bytes));
        }
    }
}
