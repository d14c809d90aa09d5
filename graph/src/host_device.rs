//! The kernel interpreter as a device: host memory behind the [`Driver`] trait, kernels run by
//! [`crate::kinterp`]. It makes the runtime core — pooling, binding, fault words, transfer counters —
//! testable on any machine, with exactly the kernels a GPU would get.

use crate::device::{Driver, Launch, Module, Raw};
use crate::error::{Error, Result};
use crate::kernel::{Access, Kernel};
use crate::kinterp::{run_kernel, Memory};
use crate::runtime::lock;
use crate::target::Target;
use crate::{KernelInterpreter, TensorData};
use std::sync::{Arc, Mutex};

/// One allocation: bytes in the host's little-endian layout, as CUDA holds them.
type HostBytes = Mutex<Vec<u8>>;

fn bytes_of(raw: &Raw) -> &HostBytes {
    // Every allocation of this driver is made by `alloc` below.
    raw.downcast_ref::<HostBytes>().expect("an allocation of the kernel interpreter")
}

/// Each kernel buffer decoded to f64 elements for the interpreter.
struct Decoded(Vec<Vec<f64>>);

impl Memory for Decoded {
    fn slot(&mut self, buffer: usize) -> &mut Vec<f64> {
        &mut self.0[buffer]
    }
}

impl Driver for KernelInterpreter {
    fn name(&self) -> &'static str {
        "cpu-kernels"
    }

    fn target(&self) -> &Target {
        &self.target
    }

    fn describe(&self) -> String {
        format!("the CPU kernel interpreter (target {})", self.target.name)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn alloc(&self, bytes: u64) -> Result<Raw> {
        let oom = || Error::OutOfMemory { device: "cpu-kernels".into(), what: "a buffer".into(), bytes, limit: None };
        let n = usize::try_from(bytes).map_err(|_| oom())?;
        let mut v: Vec<u8> = Vec::new();
        v.try_reserve_exact(n).map_err(|_| oom())?;
        v.resize(n, 0);
        Ok(Box::new(Mutex::new(v)))
    }

    fn write(&self, dst: &Raw, bytes: &[u8]) -> Result<()> {
        lock(bytes_of(dst))[..bytes.len()].copy_from_slice(bytes);
        Ok(())
    }

    fn read(&self, src: &Raw, bytes: u64) -> Result<Vec<u8>> {
        Ok(lock(bytes_of(src))[..bytes as usize].to_vec())
    }

    fn zero(&self, dst: &Raw, offset: u64, bytes: u64) -> Result<()> {
        lock(bytes_of(dst))[offset as usize..(offset + bytes) as usize].fill(0);
        Ok(())
    }

    fn copy(&self, src: &Raw, dst: &Raw, bytes: u64) -> Result<()> {
        let data = self.read(src, bytes)?;
        self.write(dst, &data)
    }

    fn load(&self, _kernel: &Kernel) -> Result<Module> {
        Ok(Arc::new(()))
    }

    fn launch(&self, kernel: &Kernel, launch: &Launch) -> Result<()> {
        // Decode every bound buffer (each lock taken alone: one allocation may be bound twice), run, then
        // write back what the kernel stores.
        let mut arrays = Vec::with_capacity(kernel.buffers.len());
        // A binding is a window of its allocation: from its offset (an assembled concatenation's part
        // starts inside a shared buffer) to the allocation's end.
        for (b, bound) in kernel.buffers.iter().zip(launch.buffers) {
            let bytes =
                lock(bytes_of(bound.raw)).get(bound.offset as usize..).map(<[u8]>::to_vec).ok_or_else(|| {
                    Error::Runtime {
                        op: kernel.name.clone(),
                        msg: format!("a binding at byte {} past its allocation's end", bound.offset),
                        loc: crate::loc::SourceLoc::internal(),
                    }
                })?;
            let n = bytes.len() / b.dtype.size_bytes();
            arrays
                .push(TensorData::from_le_bytes(&bytes[..n * b.dtype.size_bytes()], &[n], b.dtype)?.values().to_vec());
        }
        let mut mem = Decoded(arrays);
        let fault = run_kernel(kernel, &mut mem, launch.bindings)?;
        for ((b, bound), values) in kernel.buffers.iter().zip(launch.buffers).zip(mem.0) {
            if b.access == Access::Write {
                let n = values.len();
                let data = TensorData::from_f64(values, &[n], b.dtype)?;
                let bytes = data.to_le_bytes();
                let at = bound.offset as usize;
                lock(bytes_of(bound.raw))[at..at + bytes.len()].copy_from_slice(&bytes);
            }
        }
        if let (Some(f), true) = (launch.fault, fault > 0) {
            let mut words = lock(bytes_of(f.raw));
            let at = f.offset as usize;
            let old = u32::from_le_bytes([words[at], words[at + 1], words[at + 2], words[at + 3]]);
            words[at..at + 4].copy_from_slice(&old.max(fault).to_le_bytes());
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    /// The interpreter runs each launch as it is enqueued, so the host's clock around the enqueue is the
    /// launch's whole time. (A browser page has no such clock in `std`: there it cannot time itself.)
    fn time(&self, enqueue: &mut dyn FnMut() -> Result<()>) -> Result<Option<f64>> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let start = std::time::Instant::now();
            enqueue()?;
            Ok(Some(start.elapsed().as_secs_f64()))
        }
        #[cfg(target_arch = "wasm32")]
        {
            enqueue()?;
            Ok(None)
        }
    }

    fn timing(&self) -> &'static str {
        "host wall time (the interpreter runs each launch as it is enqueued)"
    }
}
