//! Library GEMMs whose epilogue adds a bias and a residual inside the call: cuBLASLt's `D = A·B + C +
//! bias`, summed in f32 and rounded once (`kiln_graph::kernel::GemmEpilogue`). cuBLAS's plain GEMM has no
//! bias, so these calls go through cuBLASLt; what to add was decided in `graph`, this only describes it.
//! Descriptors and the heuristic's algorithm are made once per call shape and kept: a call then costs
//! one attribute write (the bias address) and the launch.

use crate::gemm::GemmCall;
use crate::runtime::err;
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys::{
    cublasComputeType_t, cublasLtEpilogue_t, cublasLtHandle_t, cublasLtMatmulAlgo_t,
    cublasLtMatmulDescAttributes_t as Desc, cublasLtMatmulDesc_t, cublasLtMatmulPreferenceAttributes_t as Pref,
    cublasLtMatrixLayoutAttribute_t as Layout, cublasLtMatrixLayout_t, cudaDataType, cudaStream_t,
};
use kiln_graph::{DType, Result};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

fn lt_err(what: &str, e: lt::CublasError) -> kiln_graph::Error {
    err(format!("cuBLASLt {what}: {:?}", e.0))
}

/// Device addresses of what the call adds (`GemmCall::plan` resolved them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Addends {
    /// `n` elements added to every row (cuBLAS's column), or none.
    pub(crate) bias: Option<u64>,
    /// A matrix laid out as the output, added with `beta = 1`, or none.
    pub(crate) residual: Option<u64>,
}

/// Everything that selects descriptors and an algorithm: the call's shape, layouts and alignments.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    ops: (u32, u32),
    mnk: (i32, i32, i32),
    lds: (i32, i32, i32),
    strides: (i64, i64, i64),
    batch: i32,
    dtype: DType,
    tf32: bool,
    bias: bool,
    residual: bool,
    /// Largest power of two (up to 256) dividing each of A, B, C and D's addresses: the heuristic only
    /// offers algorithms that work at these alignments.
    align: [u32; 4],
}

impl Key {
    fn of(c: &GemmCall, add: &Addends) -> Key {
        Key {
            ops: (c.op_a as u32, c.op_b as u32),
            mnk: (c.m, c.n, c.k),
            lds: (c.lda, c.ldb, c.ldc),
            strides: (c.stride_a, c.stride_b, c.stride_c),
            batch: c.batch,
            dtype: c.element,
            tf32: c.tf32,
            bias: add.bias.is_some(),
            residual: add.residual.is_some(),
            align: [c.a, c.b, add.residual.unwrap_or(c.c), c.c].map(alignment),
        }
    }
}

/// One call shape's descriptors and chosen algorithm.
struct Plan {
    desc: cublasLtMatmulDesc_t,
    layouts: [cublasLtMatrixLayout_t; 3],
    algo: cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: created in `Plan::new`, owned here, destroyed once.
        unsafe {
            let _ = lt::destroy_matmul_desc(self.desc);
            // A plan that failed half-way holds null layouts it never created.
            for l in self.layouts.into_iter().filter(|l| !l.is_null()) {
                let _ = lt::destroy_matrix_layout(l);
            }
        }
    }
}

fn data_type(d: DType) -> Result<cudaDataType> {
    crate::gemm::cuda_data_type!(cudaDataType, d, "cuBLASLt")
}

fn alignment(ptr: u64) -> u32 {
    1u32 << ptr.trailing_zeros().min(8)
}

/// # Safety
/// `value` must be the attribute's type.
unsafe fn set_desc<T>(desc: cublasLtMatmulDesc_t, attr: Desc, value: &T) -> Result<()> {
    lt::set_matmul_desc_attribute(desc, attr, value as *const T as *const c_void, std::mem::size_of::<T>())
        .map_err(|e| lt_err("setting a matmul attribute", e))
}

impl Plan {
    fn new(handle: cublasLtHandle_t, key: &Key, c: &GemmCall, workspace_bytes: usize) -> Result<Plan> {
        let compute = crate::gemm::compute_type!(cublasComputeType_t, key.tf32);
        let desc = lt::create_matmul_desc(compute, cudaDataType::CUDA_R_32F)
            .map_err(|e| lt_err("creating a matmul descriptor", e))?;
        let mut plan = Plan { desc, layouts: [std::ptr::null_mut(); 3], algo: cublasLtMatmulAlgo_t { data: [0; 8] } };
        let dtype = data_type(c.element)?;
        let layout = |rows: i32, cols: i32, ld: i32, stride: i64| -> Result<cublasLtMatrixLayout_t> {
            let l = lt::create_matrix_layout(dtype, rows as u64, cols as u64, ld as i64)
                .map_err(|e| lt_err("creating a matrix layout", e))?;
            let set = |attr: Layout, v: *const c_void, size: usize| {
                // SAFETY: `l` was just created; `v` points at a value of the attribute's type.
                unsafe { lt::set_matrix_layout_attribute(l, attr, v, size) }
            };
            let batch = c.batch;
            let r = set(Layout::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch as *const i32 as *const c_void, 4).and_then(
                |_| set(Layout::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride as *const i64 as *const c_void, 8),
            );
            if let Err(e) = r {
                // SAFETY: created above, used by nothing else.
                let _ = unsafe { lt::destroy_matrix_layout(l) };
                return Err(lt_err("describing a batch", e));
            }
            Ok(l)
        };
        // The stored matrices, before each operation: an operand read transposed is stored `k x rows`.
        let stored = |op: cublasOperation_t, rows: i32, cols: i32| {
            if op == cublasOperation_t::CUBLAS_OP_N {
                (rows, cols)
            } else {
                (cols, rows)
            }
        };
        let (ar, ac) = stored(c.op_a, c.m, c.k);
        let (br, bc) = stored(c.op_b, c.k, c.n);
        plan.layouts[0] = layout(ar, ac, c.lda, c.stride_a)?;
        plan.layouts[1] = layout(br, bc, c.ldb, c.stride_b)?;
        plan.layouts[2] = layout(c.m, c.n, c.ldc, c.stride_c)?;
        let epilogue = if key.bias {
            cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS
        } else {
            cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT
        };
        // SAFETY: each value has its attribute's type (operations, epilogue enum, data type, i64 stride).
        unsafe {
            set_desc(desc, Desc::CUBLASLT_MATMUL_DESC_TRANSA, &c.op_a)?;
            set_desc(desc, Desc::CUBLASLT_MATMUL_DESC_TRANSB, &c.op_b)?;
            set_desc(desc, Desc::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue)?;
            if key.bias {
                set_desc(desc, Desc::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &dtype)?;
                set_desc(desc, Desc::CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &0i64)?;
            }
        }
        let pref = lt::create_matmul_pref().map_err(|e| lt_err("creating a preference", e))?;
        let chosen = (|| -> Result<cublasLtMatmulAlgo_t> {
            let ws = workspace_bytes as u64;
            let prefs = [
                (Pref::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws),
                (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align[0] as u64),
                (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align[1] as u64),
                (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align[2] as u64),
                (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align[3] as u64),
            ];
            for (attr, v) in prefs {
                // The workspace size is a u64 attribute, the alignments u32.
                let r = if attr == Pref::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES {
                    // SAFETY: `pref` is live; the value is a u64.
                    unsafe { lt::set_matmul_pref_attribute(pref, attr, &v as *const u64 as *const c_void, 8) }
                } else {
                    let v = v as u32;
                    // SAFETY: as above, a u32.
                    unsafe { lt::set_matmul_pref_attribute(pref, attr, &v as *const u32 as *const c_void, 4) }
                };
                r.map_err(|e| lt_err("setting a preference", e))?;
            }
            let [a, b, d] = plan.layouts;
            // SAFETY: every descriptor is live and describes this call.
            let found = unsafe { lt::get_matmul_algo_heuristic(handle, desc, a, b, d, d, pref) }
                .map_err(|e| lt_err("finding an algorithm for this shape", e))?;
            Ok(found.algo)
        })();
        // SAFETY: created above, used by nothing else.
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        plan.algo = chosen?;
        Ok(plan)
    }
}

/// A cuBLASLt handle with the plans of the call shapes seen so far; it shares cuBLAS's workspace (calls
/// are ordered on one stream).
pub(crate) struct Lt {
    handle: cublasLtHandle_t,
    plans: Mutex<HashMap<Key, Plan>>,
}

impl Lt {
    /// Opens cuBLASLt (a typed error when the library is missing).
    pub(crate) fn new() -> Result<Lt> {
        let handle = lt::create_handle().map_err(|e| lt_err("opening a handle", e))?;
        Ok(Lt { handle, plans: Mutex::new(HashMap::new()) })
    }

    /// Asks the heuristic about one call shape of `element` (TF32 where `tf32`: another compute type;
    /// [`GemmCall::probe`]) and keeps nothing: cuBLASLt's first heuristic query for an element type in
    /// a process costs ~70–150 ms on an H200 (later ones 0.02–0.6 ms; session 37), which this moves off
    /// a graph's first run into its load, beside the ptxas. A failure is logged; the first real call
    /// reports its own.
    pub(crate) fn warm(&self, element: DType, tf32: bool, workspace_bytes: usize) {
        let c = GemmCall::probe(element, tf32);
        let add = Addends { bias: Some(4 << 20), residual: None };
        let clock = std::time::Instant::now();
        let made = Plan::new(self.handle, &Key::of(&c, &add), &c, workspace_bytes);
        let ms = clock.elapsed().as_secs_f64() * 1e3;
        match made {
            Ok(_) => tracing::debug!(target: "kiln::graph", ?element, tf32, ms, "cuBLASLt's heuristic warmed"),
            Err(e) => {
                tracing::debug!(target: "kiln::graph", ?element, tf32, error = %e, "cuBLASLt's heuristic not warmed")
            }
        }
    }

    /// Enqueues `c` (which has addends) on `stream`, using `workspace` (`workspace_bytes` long).
    pub(crate) fn run(
        &self,
        c: &GemmCall,
        add: &Addends,
        stream: cudaStream_t,
        (workspace, workspace_bytes): (u64, usize),
    ) -> Result<()> {
        let key = Key::of(c, add);
        if c.m == 0 || c.n == 0 || c.batch == 0 {
            // An empty output: nothing to write (cuBLASLt rejects empty layouts).
            return Ok(());
        }
        let mut plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        if !plans.contains_key(&key) {
            let clock = std::time::Instant::now();
            let plan = Plan::new(self.handle, &key, c, workspace_bytes)?;
            let ms = clock.elapsed().as_secs_f64() * 1e3;
            tracing::debug!(target: "kiln::graph", m = c.m, n = c.n, k = c.k, batch = c.batch, ms, "cuBLASLt plan made");
            plans.insert(key.clone(), plan);
        }
        let plan = &plans[&key];
        if let Some(bias) = add.bias {
            // SAFETY: the descriptor is live; the value is a device pointer.
            unsafe { set_desc(plan.desc, Desc::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias)? };
        }
        let (alpha, beta) = (1.0f32, if add.residual.is_some() { 1.0f32 } else { 0.0 });
        let [la, lb, ld] = plan.layouts;
        // SAFETY: `GemmCall::plan` derived every address, leading dimension and stride from buffers sized
        // for these symbol values; C is the residual (laid out as D) or D itself with `beta = 0`.
        unsafe {
            lt::matmul(
                self.handle,
                plan.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                c.a as *const c_void,
                la,
                c.b as *const c_void,
                lb,
                add.residual.unwrap_or(c.c) as *const c_void,
                ld,
                c.c as *mut c_void,
                ld,
                &plan.algo,
                workspace as *mut c_void,
                workspace_bytes,
                stream,
            )
        }
        .map_err(|e| lt_err("GEMM with an epilogue", e))
    }
}

// SAFETY: a cuBLASLt handle and its descriptors may move between threads; calls go through `Blas`'s
// mutex one at a time, and the plans behind their own.
unsafe impl Send for Lt {}
unsafe impl Sync for Lt {}

impl Drop for Lt {
    fn drop(&mut self) {
        self.plans.lock().unwrap_or_else(|p| p.into_inner()).clear();
        // SAFETY: the handle is owned here and destroyed once, after the plans made with it.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}
