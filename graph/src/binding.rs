//! What a driver makes once for a kernel bound to particular buffers and symbol values — a wgpu bind
//! group, a cuBLAS call plan with its device pointer arrays — kept here, once for every driver, so a
//! run that binds the same buffers again (pooled buffers recur from call to call) makes nothing.
//!
//! Keys are the loaded module (by address: an entry holds the module, so the address is not reused
//! while it is kept), each binding's allocation id, offset and size, and the symbol values. Allocation
//! ids are never reused (a pooled buffer keeps its id when handed out again), so a stale entry can
//! never be found for a new allocation; entries hold driver objects that may keep memory alive, so the
//! runtime drops them all when it frees pooled memory, and past a cap.

use crate::device::{Binding, Launch, Module};
use crate::error::{Error, Result};
use crate::runtime::lock;
use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Bindings kept before the cache is emptied at the start of the next run.
const MAX_BINDINGS: usize = 4096;

thread_local! {
    /// The bindings a recording on this thread used: a recording replays with them (a GEMM plan's
    /// device pointer arrays), so it keeps them alive itself — the cache may be emptied meanwhile.
    static USED_WHILE_RECORDING: std::cell::RefCell<Vec<Binding>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Takes the bindings this thread's launches used since the last call, while recording.
pub(crate) fn take_recorded() -> Vec<Binding> {
    USED_WHILE_RECORDING.with(|u| std::mem::take(&mut *u.borrow_mut()))
}

/// Module address; (allocation id, offset, bytes) of each binding, the fault word's last; symbol values.
type Key = (usize, Vec<(u64, u64, u64)>, Vec<i64>);

/// The runtime's cache of drivers' bindings (see the module docs).
#[derive(Default)]
pub struct BindingCache {
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    map: HashMap<Key, (Module, Binding)>,
    made: u64,
    reused: u64,
}

impl BindingCache {
    /// Bindings made and bindings found again, so far.
    pub fn counts(&self) -> (u64, u64) {
        let k = lock(&self.kept);
        (k.made, k.reused)
    }

    /// Drops every binding (their driver objects with them).
    pub(crate) fn clear(&self) {
        let dropped = std::mem::take(&mut lock(&self.kept).map);
        // Dropped outside the lock: a driver object's drop may wait on the device.
        drop(dropped);
    }

    /// Empties the cache when it has grown past its cap.
    pub(crate) fn trim(&self) {
        if lock(&self.kept).map.len() > MAX_BINDINGS {
            self.clear();
        }
    }
}

impl Launch<'_> {
    /// What the driver needs to launch this kernel with exactly these buffers and symbol values, made
    /// by `make` the first time and found again after. Inside a recording nothing may be made (it would
    /// be recorded instead of done): the runtime runs once before it records, so a miss there is a bug,
    /// reported as an error.
    pub fn binding<B: Any + Send + Sync>(&self, make: impl FnOnce() -> Result<B>) -> Result<Arc<B>> {
        let module = Arc::as_ptr(self.module) as *const () as usize;
        let mut key: Key = (module, Vec::with_capacity(self.buffers.len() + 1), self.symbols.to_vec());
        key.1.extend(self.buffers.iter().chain(&self.fault).map(|b| (b.id, b.offset, b.bytes)));
        let found = {
            let mut k = lock(&self.cache.kept);
            let found = k.map.get(&key).map(|(_, b)| b.clone());
            k.reused += u64::from(found.is_some());
            found
        };
        let kept = match found {
            Some(b) => {
                if crate::runtime::recording() {
                    USED_WHILE_RECORDING.with(|u| u.borrow_mut().push(b.clone()));
                }
                b
            }
            None if crate::runtime::recording() => {
                return Err(Error::Backend {
                    backend: "runtime".into(),
                    msg: "a launch's binding was first made while recording a graph".into(),
                });
            }
            None => {
                let made: Binding = Arc::new(make()?);
                let mut k = lock(&self.cache.kept);
                k.made += 1;
                k.map.insert(key, (self.module.clone(), made.clone()));
                made
            }
        };
        kept.downcast::<B>()
            .map_err(|_| Error::Backend { backend: "runtime".into(), msg: "a binding made by another driver".into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Bound, Raw};

    thread_local! {
        static MODULE: Module = Arc::new(());
    }

    /// Binds `ids` (4 bytes each) with `symbols` and asks for a binding of one module: what it got, and
    /// whether `make` was called.
    fn bind(cache: &BindingCache, raw: &Raw, ids: &[u64], symbols: &[i64]) -> (Arc<u64>, bool) {
        let bound: Vec<Bound> = ids.iter().map(|&id| Bound { raw, id, bytes: 4, offset: 0 }).collect();
        let bindings = Default::default();
        let module = MODULE.with(Arc::clone);
        let launch = Launch {
            buffers: &bound,
            symbols,
            bindings: &bindings,
            fault: None,
            groups: 1,
            module: &module,
            cache,
            wait: false,
        };
        let mut made = false;
        let b = launch
            .binding(|| {
                made = true;
                Ok(ids.iter().sum::<u64>())
            })
            .unwrap();
        (b, made)
    }

    #[test]
    fn a_binding_is_made_once_per_buffers_and_symbols() {
        let cache = BindingCache::default();
        let raw: Raw = Box::new(0u8);
        assert_eq!(bind(&cache, &raw, &[1, 2], &[5]), (Arc::new(3), true));
        assert_eq!(bind(&cache, &raw, &[1, 2], &[5]), (Arc::new(3), false), "found again");
        assert!(bind(&cache, &raw, &[1, 3], &[5]).1, "another buffer is another binding");
        assert!(bind(&cache, &raw, &[1, 2], &[6]).1, "other symbol values too");
        let other: Module = Arc::new(());
        let bound = [Bound { raw: &raw, id: 1, bytes: 4, offset: 0 }, Bound { raw: &raw, id: 2, bytes: 4, offset: 0 }];
        let bindings = Default::default();
        let launch = Launch {
            buffers: &bound,
            symbols: &[5],
            bindings: &bindings,
            fault: None,
            groups: 1,
            module: &other,
            cache: &cache,
            wait: false,
        };
        assert_eq!(*launch.binding(|| Ok(9u64)).unwrap(), 9, "another module is another binding");
        assert_eq!(cache.counts(), (4, 1));
        cache.clear();
        assert!(bind(&cache, &raw, &[1, 2], &[5]).1, "cleared: made again");
    }

    #[test]
    fn the_cache_empties_past_its_cap() {
        let cache = BindingCache::default();
        let raw: Raw = Box::new(0u8);
        for id in 0..=MAX_BINDINGS as u64 {
            bind(&cache, &raw, &[id], &[]);
        }
        assert!(!bind(&cache, &raw, &[0], &[]).1);
        cache.trim();
        assert!(bind(&cache, &raw, &[0], &[]).1, "trimmed past the cap");
    }

    #[test]
    fn a_binding_of_another_type_is_an_error() {
        let cache = BindingCache::default();
        let raw: Raw = Box::new(0u8);
        bind(&cache, &raw, &[1], &[]);
        let bound = [Bound { raw: &raw, id: 1, bytes: 4, offset: 0 }];
        let bindings = Default::default();
        let module = MODULE.with(Arc::clone);
        let launch = Launch {
            buffers: &bound,
            symbols: &[],
            bindings: &bindings,
            fault: None,
            groups: 1,
            module: &module,
            cache: &cache,
            wait: false,
        };
        assert!(launch.binding(|| Ok("text")).is_err());
    }
}
