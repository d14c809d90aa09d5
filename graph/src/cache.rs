//! The compile cache: compiled graphs keyed by *structure* — ops, dtypes, symbolic shapes, target, fusion
//! mode, kiln version — never by which weights they read or where in the user's code they were traced. A
//! model of 64 identical blocks, or the same function called from two places, compiles once.
//!
//! Two levels: an in-memory map, and a persistent directory (`KILN_CACHE_DIR`, default the OS cache
//! directory; off on the web). A disk entry is checksummed and written atomically; a corrupt, truncated,
//! foreign or stale one is reported, ignored and rewritten — never trusted blindly. The directory is
//! capped (`KILN_CACHE_MAX_BYTES`, default [`DEFAULT_MAX_BYTES`]): past the cap the least recently used
//! entries are evicted (a load refreshes an entry's modification time). `kiln cache stats|clear` shows
//! and empties it.

use crate::fuse::FusionMode;
use crate::ir::Graph;
use crate::pipeline::CompiledGraph;
use crate::target::Target;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex};

/// This build of kiln: its version and a fingerprint of the compiler's source, so entries made by another
/// build (even of the same version) are never served.
const BUILD: &str = concat!(env!("CARGO_PKG_VERSION"), "+", env!("KILN_SOURCE_HASH"));

/// Disk entries' format name and version.
const FORMAT: &str = "kiln-compile-cache";
const VERSION: u32 = 1;

/// What the cache did, for stats and tests.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CacheStats {
    /// Graphs compiled from scratch.
    pub compiled: usize,
    /// Served from memory.
    pub memory_hits: usize,
    /// Loaded from disk.
    pub disk_hits: usize,
    /// Disk entries rejected, each with its reason.
    pub rejected: Vec<String>,
    /// Scans of the persistent directory this thread's stores made (to size it, or to evict).
    pub directory_scans: usize,
}

/// The in-memory level, shared by every thread of the process.
static MEMORY: LazyLock<Mutex<HashMap<String, Arc<CompiledGraph>>>> = LazyLock::new(Mutex::default);

thread_local! {
    /// Counters of what this thread's compiles did (per thread, so a test reads its own).
    static STATS: RefCell<CacheStats> = RefCell::new(CacheStats::default());
}

/// The default cap on the persistent directory: 512 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 512 << 20;

/// Which level of the compile cache served a compile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheLevel {
    /// This process's memory.
    Memory,
    /// The persistent directory (`KILN_CACHE_DIR`).
    Disk,
}

impl std::fmt::Display for CacheLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CacheLevel::Memory => "memory",
            CacheLevel::Disk => "disk",
        })
    }
}

/// This thread's cache counters.
pub fn stats() -> CacheStats {
    STATS.with(|s| s.borrow().clone())
}

/// Forgets the in-memory level (tests use it to exercise the disk level).
pub fn clear_memory() {
    crate::runtime::lock(&MEMORY).clear();
}

/// The structural key of compiling `graph` for `target` in `mode`.
pub fn key(graph: &Graph, target: &Target, mode: FusionMode) -> String {
    let mut g = graph.clone();
    for n in &mut g.nodes {
        n.loc = crate::loc::SourceLoc::internal();
    }
    for i in &mut g.inputs {
        i.kind = crate::ir::InputKind::Lifted;
    }
    let text = serde_json::to_string(&(&g, target, mode, BUILD, crate::lower::wrong_knob()))
        .expect("graphs and targets always serialise");
    blake3::hash(text.as_bytes()).to_hex().to_string()
}

/// The persistent cache directory, if enabled here.
pub fn directory() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("KILN_CACHE_DIR") {
        return (!d.is_empty()).then(|| PathBuf::from(d));
    }
    #[cfg(not(target_arch = "wasm32"))]
    return dirs::cache_dir().map(|d| d.join("kiln"));
    #[cfg(target_arch = "wasm32")]
    return None;
}

#[derive(Serialize, Deserialize)]
struct DiskEntry {
    format: String,
    version: u32,
    kiln: String,
    key: String,
    checksum: String,
    payload: String,
}

fn count(f: impl FnOnce(&mut CacheStats)) {
    STATS.with(|s| f(&mut s.borrow_mut()));
}

fn reject(path: &std::path::Path, why: String) {
    tracing::warn!(target: "kiln::cache", path = %path.display(), reason = %why, "ignoring cache entry; recompiling");
    count(|s| s.rejected.push(why));
}

fn load(dir: &std::path::Path, key: &str) -> Option<CompiledGraph> {
    let path = dir.join(format!("{key}.json"));
    let text = std::fs::read_to_string(&path).ok()?;
    // Recently used: eviction removes the entries loaded longest ago first.
    if let Ok(f) = std::fs::File::options().write(true).open(&path) {
        let _ = f.set_modified(std::time::SystemTime::now());
    }
    match decode(&text, key) {
        Ok(c) => Some(c),
        Err(why) => {
            reject(&path, why);
            None
        }
    }
}

/// A cache entry's text as the compiled graph it holds, or why it cannot be used (another format or
/// build, another key, a checksum mismatch, a payload that does not decode). Never panics, whatever the
/// text (fuzzed: `fuzz/fuzz_targets/cache_entry.rs`).
pub fn decode(text: &str, key: &str) -> std::result::Result<CompiledGraph, String> {
    let entry: DiskEntry = serde_json::from_str(text).map_err(|e| format!("unreadable ({e})"))?;
    if entry.format != FORMAT || entry.version != VERSION || entry.kiln != BUILD {
        return Err(format!("written by {} {} (kiln {})", entry.format, entry.version, entry.kiln));
    }
    if entry.key != key {
        return Err("its key does not match its file name".into());
    }
    if blake3::hash(entry.payload.as_bytes()).to_hex().as_str() != entry.checksum {
        return Err("checksum mismatch (corrupt or truncated)".into());
    }
    serde_json::from_str(&entry.payload).map_err(|e| format!("payload does not decode ({e})"))
}

/// An entry for `key` holding `payload` as this build writes it (with its checksum): what a fuzzer
/// needs to reach the payload's decoding past the checksum.
pub fn encode_entry(key: &str, payload: &str) -> String {
    let entry = DiskEntry {
        format: FORMAT.into(),
        version: VERSION,
        kiln: BUILD.into(),
        key: key.into(),
        checksum: blake3::hash(payload.as_bytes()).to_hex().to_string(),
        payload: payload.into(),
    };
    serde_json::to_string(&entry).unwrap_or_default()
}

fn store(dir: &std::path::Path, key: &str, compiled: &CompiledGraph) {
    let payload = match serde_json::to_string(compiled) {
        Ok(p) => p,
        Err(_) => return,
    };
    let text = encode_entry(key, &payload);
    if text.is_empty() {
        return;
    }
    if write_whole(dir, &format!("{key}.json"), text.as_bytes()) {
        note_stored(dir, text.len() as u64, max_bytes());
    }
}

/// Writes `name` in `dir` through a temporary of this write's own, renamed into place: a reader never
/// sees half a file, and concurrent writers (threads, processes) each leave a whole one.
fn write_whole(dir: &std::path::Path, name: &str, bytes: &[u8]) -> bool {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
    let ok = std::fs::create_dir_all(dir).is_ok() && std::fs::write(&tmp, bytes).is_ok();
    if !ok || std::fs::rename(&tmp, dir.join(name)).is_err() {
        let _ = std::fs::remove_file(&tmp);
        tracing::debug!(target: "kiln::cache", dir = %dir.display(), name, "could not write a cache file");
        return false;
    }
    true
}

/// Bytes a driver kept under `name` in the cache directory with [`store_blob`] (its compiled shaders),
/// if the file is whole: a checksum turns a torn or foreign file into a miss.
pub fn load_blob(name: &str) -> Option<Vec<u8>> {
    let bytes = std::fs::read(directory()?.join(format!("{name}{BLOB}"))).ok()?;
    let (sum, data) = bytes.split_at_checked(32)?;
    (blake3::hash(data).as_bytes() == sum).then(|| data.to_vec())
}

/// Keeps `data` under `name` in the cache directory, checksummed, written whole or not at all.
pub fn store_blob(name: &str, data: &[u8]) {
    let Some(dir) = directory() else { return };
    let mut bytes = blake3::hash(data).as_bytes().to_vec();
    bytes.extend_from_slice(data);
    let file = format!("{name}{BLOB}");
    // A blob stored again (a driver's pipeline cache grows in place) adds only what it grew by.
    let before = std::fs::metadata(dir.join(&file)).map_or(0, |m| m.len());
    if write_whole(&dir, &file, &bytes) {
        note_stored(&dir, (bytes.len() as u64).saturating_sub(before), max_bytes());
    }
}

/// The suffix of a blob's file: blobs count toward the cap, are evicted and cleared like entries.
const BLOB: &str = ".blob";

/// The directory's size as this process last scanned it plus what it stored since. Scanning the
/// directory on every store made `n` compiles cost `n²` file stats (10,000 random graphs in a test took
/// minutes of system time); now it is scanned once, and again only when the estimate passes the cap.
/// Other processes' writes are seen at that next scan.
static ESTIMATE: std::sync::Mutex<Option<(PathBuf, u64)>> = std::sync::Mutex::new(None);

fn note_stored(dir: &std::path::Path, bytes: u64, max: u64) {
    let mut est = ESTIMATE.lock().unwrap_or_else(|e| e.into_inner());
    let total = match &*est {
        Some((d, total)) if d == dir => total + bytes,
        _ => entries(dir).iter().map(|(_, b, _)| b).sum(),
    };
    // Evicting to just under the cap made a full cache pass it again at the very next store, so every
    // compile scanned the whole directory (seen: 35,000 entries, random-graph tests 25× slower, mostly
    // system time). Down to the low-water mark instead: one scan per quarter of the cap written.
    let total = if total > max { evict(dir, max / 4 * 3) } else { total };
    *est = Some((dir.to_path_buf(), total));
}

/// The cap on the persistent directory's size (`KILN_CACHE_MAX_BYTES`, else [`DEFAULT_MAX_BYTES`]).
pub fn max_bytes() -> u64 {
    std::env::var("KILN_CACHE_MAX_BYTES").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(DEFAULT_MAX_BYTES)
}

/// What the persistent directory holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DiskUsage {
    /// The directory (`None` when the persistent cache is off).
    pub directory: Option<PathBuf>,
    /// Entries.
    pub entries: usize,
    /// Their bytes.
    pub bytes: u64,
    /// The cap eviction keeps to.
    pub max_bytes: u64,
}

/// Entries of `dir`, oldest use first: (path, bytes, modified).
fn entries(dir: &std::path::Path) -> Vec<(PathBuf, u64, std::time::SystemTime)> {
    count(|s| s.directory_scans += 1);
    let Ok(read) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut v: Vec<_> = read
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.ends_with(".json") || name.ends_with(BLOB)
        })
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some((e.path(), m.len(), m.modified().unwrap_or(std::time::UNIX_EPOCH)))
        })
        .collect();
    v.sort_by_key(|(_, _, t)| *t);
    v
}

/// Removes the least recently used entries of `dir` until it holds at most `max` bytes; returns what
/// it holds then.
fn evict(dir: &std::path::Path, max: u64) -> u64 {
    let list = entries(dir);
    let mut total: u64 = list.iter().map(|(_, b, _)| b).sum();
    for (path, bytes, _) in list {
        if total <= max {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            tracing::debug!(target: "kiln::cache", path = %path.display(), "evicted (cache over its size cap)");
            total -= bytes;
        }
    }
    total
}

/// What the persistent directory holds now.
pub fn disk_usage() -> DiskUsage {
    let directory = directory();
    let list = directory.as_deref().map(entries).unwrap_or_default();
    DiskUsage { entries: list.len(), bytes: list.iter().map(|(_, b, _)| b).sum(), max_bytes: max_bytes(), directory }
}

/// Deletes every entry of the persistent directory (and the in-memory level); returns how many files
/// were removed.
pub fn clear_disk() -> std::io::Result<usize> {
    clear_memory();
    *ESTIMATE.lock().unwrap_or_else(|e| e.into_inner()) = None;
    let Some(dir) = directory() else { return Ok(0) };
    let mut removed = 0;
    for (path, _, _) in entries(&dir) {
        std::fs::remove_file(path)?;
        removed += 1;
    }
    Ok(removed)
}

/// The compiled graph for `key`, from memory or disk, or `compile()`'s result (then cached at both levels).
pub fn get_or_compile(
    key: &str,
    compile: impl FnOnce() -> crate::error::Result<CompiledGraph>,
) -> crate::error::Result<Arc<CompiledGraph>> {
    if let Some(c) = crate::runtime::lock(&MEMORY).get(key).cloned() {
        count(|s| s.memory_hits += 1);
        return Ok(c);
    }
    let dir = directory();
    if let Some(c) = dir.as_deref().and_then(|d| load(d, key)) {
        count(|s| s.disk_hits += 1);
        let c = Arc::new(c);
        crate::runtime::lock(&MEMORY).insert(key.to_string(), c.clone());
        return Ok(c);
    }
    let c = compile()?;
    count(|s| s.compiled += 1);
    if let Some(d) = &dir {
        store(d, key, &c);
    }
    let c = Arc::new(c);
    crate::runtime::lock(&MEMORY).insert(key.to_string(), c.clone());
    Ok(c)
}
