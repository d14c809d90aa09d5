//! The runtime's side of uploads beside the kernels (CUDA's copy stream): a freed buffer keeps the mark
//! its driver gave when it was freed, an upload takes the pooled buffer freed first and hands the driver
//! that mark, and a fresh buffer or an unmarked one is written in the queue's order. Checked through a
//! driver that marks every release (the kernel interpreter underneath does the work).

use kiln_graph::device::{Driver, Launch, Module, Raw};
use kiln_graph::kernel::Kernel;
use kiln_graph::runtime::{lock, Runtime};
use kiln_graph::{DType, KernelInterpreter, Result, Target, TensorData};
use std::sync::{Arc, Mutex};

/// The interpreter, with a mark per release (numbered from 1) and each upload's `free_at` kept.
struct Marking {
    inner: KernelInterpreter,
    marks: Arc<Mutex<u64>>,
    writes: Arc<Mutex<Vec<Option<u64>>>>,
    /// Uploads from this many bytes run "beside the queue".
    beside_from: u64,
}

impl Driver for Marking {
    fn name(&self) -> &'static str {
        "marking"
    }
    fn target(&self) -> &Target {
        self.inner.target()
    }
    fn describe(&self) -> String {
        "the kernel interpreter, marking every release".into()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn alloc(&self, bytes: u64) -> Result<Raw> {
        self.inner.alloc(bytes)
    }
    fn write(&self, dst: &Raw, bytes: &[u8]) -> Result<()> {
        self.inner.write(dst, bytes)
    }
    fn freed(&self, _buffer: &Raw, _bytes: u64, mark: bool) -> Option<u64> {
        let mut m = lock(&self.marks);
        *m += u64::from(mark);
        mark.then_some(*m)
    }
    fn uploads_beside(&self, bytes: u64) -> bool {
        bytes >= self.beside_from
    }
    fn write_after(&self, dst: &Raw, bytes: &[u8], free_at: Option<u64>) -> Result<()> {
        lock(&self.writes).push(free_at);
        self.inner.write(dst, bytes)
    }
    fn read(&self, src: &Raw, bytes: u64) -> Result<Vec<u8>> {
        self.inner.read(src, bytes)
    }
    fn zero(&self, dst: &Raw, offset: u64, bytes: u64) -> Result<()> {
        self.inner.zero(dst, offset, bytes)
    }
    fn copy(&self, src: &Raw, dst: &Raw, bytes: u64) -> Result<()> {
        self.inner.copy(src, dst, bytes)
    }
    fn load(&self, kernel: &Kernel) -> Result<Module> {
        self.inner.load(kernel)
    }
    fn launch(&self, kernel: &Kernel, launch: &Launch) -> Result<()> {
        self.inner.launch(kernel, launch)
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
}

fn tensor(salt: f32) -> TensorData {
    TensorData::new(&[salt; 300], &[300]).unwrap()
}

#[test]
fn an_upload_takes_the_buffer_freed_first_with_its_mark() {
    let writes = Arc::new(Mutex::new(Vec::new()));
    let marks = Arc::new(Mutex::new(0));
    let driver =
        Marking { inner: KernelInterpreter::default(), marks: marks.clone(), writes: writes.clone(), beside_from: 0 };
    let rt = Runtime::new(driver);
    // Fresh buffers: nothing to wait for but the queue's order.
    let (a, b, c) =
        (rt.upload(&tensor(1.0)).unwrap(), rt.upload(&tensor(2.0)).unwrap(), rt.upload(&tensor(3.0)).unwrap());
    assert_eq!(*lock(&writes), [None, None, None]);
    let (b_id, c_id) = (b.buffer.id(), c.buffer.id());
    // No upload has reused a buffer yet: releases are not marked (a call on resident inputs pays nothing).
    drop(b);
    drop(c);
    assert_eq!(*lock(&marks), 0);
    // The first upload into a reused buffer (unmarked) starts the marking.
    let d = rt.upload(&tensor(4.0)).unwrap();
    assert_eq!((d.buffer.id(), lock(&writes)[3]), (c_id, None));
    drop(d); // mark 1
    assert_eq!(*lock(&marks), 1);
    // A marked buffer goes to an upload before an unmarked one, with its mark.
    let e = rt.upload(&tensor(5.0)).unwrap();
    assert_eq!((e.buffer.id(), lock(&writes)[4]), (c_id, Some(1)));
    let f = rt.upload(&tensor(6.0)).unwrap();
    assert_eq!((f.buffer.id(), lock(&writes)[5]), (b_id, None));
    drop(e); // mark 2
    drop(f); // mark 3
    let g = rt.upload(&tensor(7.0)).unwrap();
    assert_eq!((g.buffer.id(), lock(&writes)[6]), (c_id, Some(2)), "the buffer freed first");
    // A kernel's allocation still takes the buffer freed last (likeliest in the device's caches).
    drop(g); // mark 4
    let kernel_buffer = rt.alloc(1200, "a kernel's buffer").unwrap();
    assert_eq!(kernel_buffer.id(), c_id);
    let h = rt.upload(&tensor(8.0)).unwrap();
    assert_eq!((h.buffer.id(), lock(&writes)[7]), (b_id, Some(3)));
    for (t, v) in [(&a, 1.0), (&h, 8.0)] {
        assert_eq!(rt.download(t).unwrap().values(), vec![v; 300]);
    }
    assert_eq!(a.dtype, DType::F32);
}

#[test]
fn uploads_the_driver_keeps_in_order_start_no_marking() {
    let writes = Arc::new(Mutex::new(Vec::new()));
    let marks = Arc::new(Mutex::new(0));
    // 300 f32 are 1200 bytes: below what this driver runs beside its queue.
    let driver = Marking {
        inner: KernelInterpreter::default(),
        marks: marks.clone(),
        writes: writes.clone(),
        beside_from: 4096,
    };
    let rt = Runtime::new(driver);
    for step in 0..4 {
        let t = rt.upload(&tensor(step as f32)).unwrap();
        assert_eq!(rt.download(&t).unwrap().values(), vec![step as f64; 300]);
    }
    assert_eq!(*lock(&marks), 0, "small uploads into reused buffers started the marking");
    assert_eq!(*lock(&writes), [None, None, None, None]);
}
