//! Library GEMMs on CUDA: the strided description `graph` chose (`kiln_graph::kernel::Gemm`) turned into
//! cuBLAS calls. cuBLAS is column-major; a row-major `C = A·B` is the column-major `Cᵀ = Bᵀ·Aᵀ`, so the
//! operands swap and each one's layout picks its transpose flag. Batch dimensions that are strided
//! alike merge; one remaining stride is a strided batched call, two or more levels (attention: batch ×
//! heads over views of one projection) one batched call over device arrays of pointers.

use crate::lt::{Addends, Lt};
use crate::runtime::err;
use cudarc::cublas::result as blas;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasHandle_t, cublasOperation_t, cudaDataType, cudaStream_t,
};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use kiln_graph::kernel::{Gemm, GemmLayout, GemmOperand};
use kiln_graph::sym::Bindings;
use kiln_graph::{DType, Result};
use std::sync::Arc;

/// Workspace handed to cuBLAS, so it never allocates while a CUDA graph is being captured (PyTorch gives
/// Hopper the same 32 MiB).
pub(crate) const WORKSPACE_BYTES: usize = 32 << 20;

fn blas_err(what: &str, e: blas::CublasError) -> kiln_graph::Error {
    err(format!("cuBLAS {what}: {:?}", e.0))
}

/// A cuBLAS handle bound to the runtime's stream, with its workspace.
pub(crate) struct Blas {
    handle: cublasHandle_t,
    _workspace: CudaSlice<u8>,
    /// The workspace's device address, taken once (cuBLASLt gets it with every call).
    workspace_ptr: u64,
    stream: Arc<CudaStream>,
    /// cuBLASLt, for calls with an epilogue (opened with cuBLAS, so never inside a graph capture).
    lt: Lt,
}

impl Blas {
    /// Opens cuBLAS on `stream` (a typed error when libcublas is missing).
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<Blas> {
        stream.context().bind_to_thread().map_err(|e| crate::runtime::driver("binding the context", e))?;
        let handle = blas::create_handle().map_err(|e| blas_err("opening a handle", e))?;
        let open = || -> Result<(CudaSlice<u8>, u64)> {
            // SAFETY: the handle was just created; the stream outlives it (both live in `Cuda`).
            unsafe { blas::set_stream(handle, stream.cu_stream() as cudaStream_t) }
                .map_err(|e| blas_err("setting the stream", e))?;
            // SAFETY: cuBLAS only uses the workspace as scratch; it is never read uninitialised.
            let workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }
                .map_err(|e| crate::runtime::driver("allocating the cuBLAS workspace", e))?;
            let ptr = workspace.device_ptr(stream).0;
            // SAFETY: the workspace lives as long as the handle (same struct).
            unsafe { cudarc::cublas::sys::cublasSetWorkspace_v2(handle, ptr as *mut _, WORKSPACE_BYTES) }
                .result()
                .map_err(|e| blas_err("setting the workspace", e))?;
            Ok((workspace, ptr))
        };
        match open() {
            Ok((w, workspace_ptr)) => match Lt::new() {
                Ok(lt) => Ok(Blas { handle, _workspace: w, workspace_ptr, stream: stream.clone(), lt }),
                Err(e) => {
                    // SAFETY: created above, used by nothing else.
                    let _ = unsafe { blas::destroy_handle(handle) };
                    Err(e)
                }
            },
            Err(e) => {
                // SAFETY: created above, used by nothing else.
                let _ = unsafe { blas::destroy_handle(handle) };
                Err(e)
            }
        }
    }

    /// Warms cuBLASLt's heuristic for calls of `element` (on TF32 matrix units where `tf32`)
    /// ([`crate::lt::Lt::warm`]; cheap once warmed).
    pub(crate) fn warm(&self, element: DType, tf32: bool) {
        self.lt.warm(element, tf32, WORKSPACE_BYTES);
    }

    /// Enqueues one call.
    pub(crate) fn run(&self, c: &GemmCall) -> Result<()> {
        if let Some(add) = &c.addends {
            let stream = self.stream.cu_stream() as cudarc::cublaslt::sys::cudaStream_t;
            return self.lt.run(c, add, stream, (self.workspace_ptr, WORKSPACE_BYTES));
        }
        let (alpha, beta) = (1.0f32, 0.0f32);
        let dtype = data_type(c.element)?;
        let written = data_type(c.written)?;
        let compute = compute_type!(cublasComputeType_t, c.tf32);
        if let Some(p) = &c.arrays {
            // SAFETY: as below; the pointer arrays live in device memory owned by the call.
            return unsafe {
                cudarc::cublas::sys::cublasGemmBatchedEx(
                    self.handle,
                    c.op_a,
                    c.op_b,
                    c.m,
                    c.n,
                    c.k,
                    &alpha as *const f32 as *const _,
                    p.a as *const *const _,
                    dtype,
                    c.lda,
                    p.b as *const *const _,
                    dtype,
                    c.ldb,
                    &beta as *const f32 as *const _,
                    p.c as *const *mut _,
                    written,
                    c.ldc,
                    c.batch,
                    compute,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .result()
            .map_err(|e| blas_err("batched GEMM", e));
        }
        // SAFETY: `GemmCall::plan` derived every pointer, leading dimension and stride from buffers the plan
        // sized for these symbol values, and checked each leading dimension against its extent.
        unsafe {
            blas::gemm_strided_batched_ex(
                self.handle,
                c.op_a,
                c.op_b,
                c.m,
                c.n,
                c.k,
                &alpha as *const f32 as *const _,
                c.a as *const _,
                dtype,
                c.lda,
                c.stride_a,
                c.b as *const _,
                dtype,
                c.ldb,
                c.stride_b,
                &beta as *const f32 as *const _,
                c.c as *mut _,
                written,
                c.ldc,
                c.stride_c,
                c.batch,
                compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| blas_err("strided batched GEMM", e))
    }
}

// SAFETY: a cuBLAS handle may move between threads; the driver uses it behind a mutex, one call at a
// time.
unsafe impl Send for Blas {}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle is owned here and destroyed once.
        let _ = unsafe { blas::destroy_handle(self.handle) };
    }
}

/// Device arrays of per-entry pointers, for batches no single stride describes.
#[derive(Debug)]
pub(crate) struct PointerArrays {
    _memory: CudaSlice<u64>,
    a: u64,
    b: u64,
    c: u64,
}

/// One cuBLAS call with everything resolved (column-major terms: `C = op(A)·op(B)`).
#[derive(Debug)]
pub(crate) struct GemmCall {
    pub(crate) op_a: cublasOperation_t,
    pub(crate) op_b: cublasOperation_t,
    pub(crate) m: i32,
    pub(crate) n: i32,
    pub(crate) k: i32,
    pub(crate) a: u64,
    pub(crate) lda: i32,
    pub(crate) stride_a: i64,
    pub(crate) b: u64,
    pub(crate) ldb: i32,
    pub(crate) stride_b: i64,
    pub(crate) c: u64,
    pub(crate) ldc: i32,
    pub(crate) stride_c: i64,
    pub(crate) batch: i32,
    /// The element type of both operands (and of the output unless `written` says otherwise).
    pub(crate) element: DType,
    /// The element type the call writes (`kiln_graph::kernel::Gemm::out_dtype`).
    pub(crate) written: DType,
    /// f32 operands rounded to TF32 on the matrix units (`kiln_graph::kernel::Gemm::tf32`).
    pub(crate) tf32: bool,
    /// Set when the batch has two levels (attention's batch × heads over views): one pointer-array
    /// call instead of one strided call per outer entry.
    arrays: Option<PointerArrays>,
    /// What the call adds to the product (a bias, a residual): a cuBLASLt call.
    addends: Option<Addends>,
}

fn int(name: &str, v: i64) -> Result<i32> {
    i32::try_from(v).map_err(|_| err(format!("GEMM {name} = {v} does not fit cuBLAS's 32-bit sizes")))
}

/// kiln's GEMM element types as a CUDA library's `cudaDataType`, one mapping for both libraries:
/// cuBLAS and cuBLASLt each bind their own copy of the enum. `$library` names the library in the error.
macro_rules! cuda_data_type {
    ($enum:ident, $dtype:expr, $library:literal) => {
        match $dtype {
            DType::F32 => Ok($enum::CUDA_R_32F),
            DType::F16 => Ok($enum::CUDA_R_16F),
            DType::BF16 => Ok($enum::CUDA_R_16BF),
            other => Err(err(format!("{} GEMM of {other}", $library))),
        }
    };
}
pub(crate) use cuda_data_type;

/// The call's compute type in a CUDA library's own copy of `cublasComputeType_t`: f32 accumulation, with
/// operands rounded to TF32 where `graph` marked the GEMM so.
macro_rules! compute_type {
    ($enum:ident, $tf32:expr) => {
        if $tf32 {
            $enum::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            $enum::CUBLAS_COMPUTE_32F
        }
    };
}
pub(crate) use compute_type;

fn data_type(d: DType) -> Result<cudaDataType> {
    cuda_data_type!(cudaDataType, d, "cuBLAS")
}

impl GemmCall {
    /// A 256³ call of `element` (TF32 where `tf32`) at aligned made-up addresses: what
    /// [`crate::lt::Lt::warm`] asks the heuristic about, with a bias of its own (it is never launched).
    pub(crate) fn probe(element: DType, tf32: bool) -> GemmCall {
        let n = 256;
        GemmCall {
            op_a: cublasOperation_t::CUBLAS_OP_N,
            op_b: cublasOperation_t::CUBLAS_OP_N,
            m: n,
            n,
            k: n,
            a: 1 << 20,
            lda: n,
            stride_a: 0,
            b: 2 << 20,
            ldb: n,
            stride_b: 0,
            c: 3 << 20,
            ldc: n,
            stride_c: 0,
            batch: 1,
            element,
            written: element,
            tf32,
            arrays: None,
            addends: None,
        }
    }

    /// The call computing `g` for symbol values `b`, with `pointers[i]` the device address of kernel
    /// buffer `i`: strided batched when one stride per operand describes the batch, else batched over
    /// device arrays of pointers (uploaded on `stream`).
    pub(crate) fn plan(g: &Gemm, b: &Bindings, pointers: &[u64], stream: &Arc<CudaStream>) -> Result<GemmCall> {
        let ev = |e: &kiln_graph::sym::Expr| e.eval(b).map_err(kiln_graph::Error::from);
        let (m, n, k) = (ev(&g.m)?, ev(&g.n)?, ev(&g.k)?);
        let mut dims: Vec<[i64; 4]> = Vec::new();
        for d in &g.batch {
            dims.push([ev(&d.extent)?, ev(&d.a)?, ev(&d.b)?, ev(&d.out)?]);
        }
        // Merge an outer dimension into the inner one when all three strides continue it.
        let mut merged: Vec<[i64; 4]> = Vec::new();
        for d in dims {
            if let Some(outer) = merged.last_mut() {
                if (1..4).all(|s| outer[s] == d[s] * d[0]) {
                    *outer = [outer[0] * d[0], d[1], d[2], d[3]];
                    continue;
                }
            }
            merged.push(d);
        }
        let inner = merged.pop().unwrap_or([1, 0, 0, 0]);
        let size = g.dtype.size_bytes() as i64;
        let operand = |o: &GemmOperand| -> Result<(u64, cublasOperation_t, i32)> {
            let base = pointers[o.buffer] as i64 + ev(&o.offset)? * size;
            let op = match o.layout {
                GemmLayout::RowMajor => cublasOperation_t::CUBLAS_OP_N,
                GemmLayout::ColMajor => cublasOperation_t::CUBLAS_OP_T,
            };
            Ok((base as u64, op, int("leading dimension", ev(&o.ld)?)?))
        };
        // Swapped: cuBLAS's A is kiln's b, its B kiln's a.
        let (b_ptr, op_a, lda) = operand(&g.b)?;
        let (a_ptr, op_b, ldb) = operand(&g.a)?;
        let c_ptr = pointers[g.out];
        let addend = |a: &Option<kiln_graph::kernel::GemmAddend>| -> Result<Option<u64>> {
            a.as_ref().map(|a| Ok((pointers[a.buffer] as i64 + ev(&a.offset)? * size) as u64)).transpose()
        };
        let (bias, residual) = (addend(&g.epilogue.bias)?, addend(&g.epilogue.residual)?);
        let addends = (bias.is_some() || residual.is_some()).then_some(Addends { bias, residual });
        if g.widened && addends.is_some() {
            return Err(err("a GEMM written widened with an epilogue: graph widens only plain products"));
        }
        let call = GemmCall {
            op_a,
            op_b,
            m: int("n", n)?,
            n: int("m", m)?,
            k: int("k", k)?,
            a: b_ptr,
            lda,
            stride_a: inner[2],
            b: a_ptr,
            ldb,
            stride_b: inner[1],
            c: c_ptr,
            ldc: int("n", n)?,
            stride_c: inner[3],
            batch: int("batch", inner[0])?,
            element: g.dtype,
            written: g.out_dtype(),
            tf32: g.tf32,
            arrays: None,
            addends,
        };
        let outer: i64 = merged.iter().map(|d| d[0]).product();
        if outer == 1 {
            return Ok(call);
        }
        if call.addends.is_some() {
            return Err(err(format!(
                "a GEMM epilogue over {} batch levels: graph fuses one only where the batch is one strided level",
                merged.len() + 1
            )));
        }
        let mut lists: [Vec<u64>; 3] = Default::default();
        for e in 0..outer * inner[0] {
            // Entry `e` as a multi-index over the outer dimensions and then the inner one.
            let (mut rest, mut off) = (e, [0i64; 3]);
            for d in merged.iter().chain(std::iter::once(&inner)).rev() {
                let i = rest % d[0];
                rest /= d[0];
                off = [off[0] + i * d[1], off[1] + i * d[2], off[2] + i * d[3]];
            }
            let at = |p: u64, elems: i64| (p as i64 + elems * size) as u64;
            lists[0].push(at(b_ptr, off[1]));
            lists[1].push(at(a_ptr, off[0]));
            lists[2].push((c_ptr as i64 + off[2] * g.out_dtype().size_bytes() as i64) as u64);
        }
        let count = lists[0].len();
        let host: Vec<u64> = lists.concat();
        let memory = stream.clone_htod(&host).map_err(|e| crate::runtime::driver("uploading GEMM pointers", e))?;
        let (base, _) = memory.device_ptr(stream);
        let arrays =
            PointerArrays { a: base, b: base + 8 * count as u64, c: base + 16 * count as u64, _memory: memory };
        Ok(GemmCall { batch: int("batch", count as i64)?, arrays: Some(arrays), ..call })
    }
}
