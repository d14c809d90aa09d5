//! What a device can do, as the shared pipeline needs to know it. A backend describes its device with a
//! `Target`; fusion and lowering read it to make every device-dependent decision (how many buffers one
//! kernel may bind, how big a workgroup may be, which reduction strategy, whether f16 is computed natively),
//! so renderers never decide anything themselves.

use crate::{DType, Result, TensorData};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// A device's capabilities.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Target {
    /// A short name for logs, cache keys and kernel listings (`webgpu-default`, `sm_90`).
    pub name: String,
    /// Storage buffers one kernel may bind (WebGPU's default limit is 8 per stage).
    pub max_bindings: u32,
    /// Threads in one workgroup / block.
    pub max_threads_per_group: u32,
    /// Workgroups per grid dimension (WebGPU: 65535; the runtime folds larger grids into 2-D/3-D).
    pub max_groups_per_dim: u64,
    /// Grid dimensions available for folding.
    pub grid_dims: u32,
    /// Subgroup (warp) size, when the device has subgroup operations.
    pub subgroup_size: Option<u32>,
    /// Workgroup (shared) memory per group, in bytes.
    pub shared_memory_bytes: u32,
    /// Computes f16 natively (otherwise f16 is stored as f16 and computed in f32).
    pub f16_compute: bool,
    /// Computes bf16 natively (otherwise stored as bf16 and computed in f32).
    pub bf16_compute: bool,
    /// Has matrix units (tensor cores: `mma.m16n8k16` on f16/bf16) the fused attention template runs on
    /// (see `attention::fits`).
    pub matrix_units: bool,
    /// Renders the f32 attention template that runs on a thread's vector lanes, one query a thread
    /// (`kernel::AttentionUnits::Lanes`; see `attention::lanes_fits`), with this largest work division:
    /// WGSL's renderer does. `None`: it has no such template.
    #[serde(default)]
    pub lane_attention: Option<LaneAttention>,
    /// Plans the f32 attention template whose products run on each thread's registers, tiled
    /// (`kernel::AttentionUnits::Registers`; see `attention::registers_fits`), with this division: on by
    /// default for PTX; WGSL's renderer has it too, off there by default (over NVIDIA Vulkan no faster
    /// than lanes). Where a target has both, registers are planned wherever their tile fits. `None`: not
    /// planned.
    #[serde(default)]
    pub register_attention: Option<RegisterAttention>,
    /// Widest vector load or store, in bytes.
    pub max_vector_bytes: u32,
    /// Most lanes a vectorised loop may have: WGSL's widest vector has four; PTX moves eight 2-byte
    /// elements as one 16-byte access.
    #[serde(default = "default_vector_lanes")]
    pub max_vector_lanes: u32,
    /// 2-byte floats are stored two per 32-bit word that threads share (WGSL without native f16, and bf16
    /// there): kernels touching them are not vectorised.
    #[serde(default)]
    pub packed_half_storage: bool,
    /// Most elements of a row one thread may keep in registers for a one-pass (persistent) row kernel;
    /// 0 turns persistent rows off.
    #[serde(default = "default_row_cache")]
    pub max_row_cache: u32,
    /// Persistent rows keep consecutive elements a thread and move them as vectors
    /// (`Kernel::row_lanes`; the WGSL renderer binds such a row's buffers as arrays of vectors). On for
    /// every target: measured on an H200, W3 over NVIDIA Vulkan 0.0781 → 0.0704 ms and on CUDA 0.0730 →
    /// 0.0698 (`benches/NOTES.md`, sessions 38–39). `KILN_<BACKEND>_VECTOR_ROWS=0` turns it off; a target
    /// stored without the field reads it on, as every target has it.
    #[serde(default = "default_vector_rows")]
    pub vector_rows: bool,
    /// Has a GEMM library (cuBLAS) that large float matmuls go to (see `gemm`).
    #[serde(default)]
    pub library_gemm: bool,
    /// The GEMM library adds a bias and a residual inside the call (cuBLASLt's epilogue), so those adds
    /// after a library GEMM join its region (see `gemm::addend`) instead of starting the next kernel.
    #[serde(default)]
    pub library_epilogue: bool,
    /// f32 convolutions that go to the GEMM library round their operands to TF32 (10 mantissa bits) and
    /// multiply on matrix units, summing in f32: PyTorch's default for convolutions
    /// (`torch.backends.cudnn.allow_tf32 = True`). f32 matmuls keep full precision (PyTorch's default
    /// `float32_matmul_precision("highest")`). See `gemm::tf32_products`.
    #[serde(default)]
    pub tf32_convolutions: bool,
    /// A stride-1 convolution whose input holds at least this many bytes is computed as one product per
    /// kernel row over a matrix that unfolds only the last spatial axis, each row's product reading it at
    /// a shifted offset, instead of one product over the full im2col matrix (`conv::Builder::conv_by_rows`):
    /// a 3x3 kernel's matrix is 3x the input, not 9x, for two more GEMM calls whose sums the library's
    /// epilogue adds (`library_epilogue`; without it, `tuned_by_env` turns this off). 0 keeps the full im2col.
    #[serde(default)]
    pub conv_row_products_bytes: u64,
    /// Threads per row workgroup unless a row needs more to fit in registers (a measured preference:
    /// see `benches/NOTES.md`).
    #[serde(default = "default_row_threads")]
    pub row_threads: u32,
    /// Outputs a column reduction's first pass aims for (a bias gradient's sum over tokens is cut into
    /// pieces summed side by side, `split_reduce`): enough threads, each summing a short piece, to keep
    /// the device's memory busy.
    #[serde(default = "default_column_threads")]
    pub column_threads: u64,
    /// Kernels of at most this many threads (workgroups × threads) leave the device mostly idle for a
    /// launch's fixed cost: independent ones of the same workgroup shape run as one launch
    /// ([`crate::combine`]). 0 launches every kernel alone (`KILN_<BACKEND>_COMBINE_THREADS`).
    #[serde(default = "default_combined_launch_threads")]
    pub combined_launch_threads: u64,
    /// Bytes one buffer may hold.
    #[serde(default = "unlimited")]
    pub max_buffer_bytes: u64,
    /// Bytes one kernel binding may cover.
    #[serde(default = "unlimited")]
    pub max_binding_bytes: u64,
    /// Alignment of a binding's byte offset (fault words of one run share a buffer at this stride).
    #[serde(default = "default_binding_alignment")]
    pub binding_alignment: u64,
    /// Bools are stored as 32-bit words (WGSL has no 8-bit storage); every other dtype is stored as the
    /// host stores it.
    #[serde(default)]
    pub bool_words: bool,
    /// Width of the integers the renderer indexes with: 32 (WGSL's i32/u32, whatever the adapter's
    /// buffer limit) or 64 (PTX, the kernel interpreter).
    #[serde(default = "default_index_bits")]
    pub index_bits: u32,
    /// Width i64 and u64 are computed in: 64 (PTX, the kernel interpreter) or 32 (WGSL, which has no
    /// 64-bit integers: their low words, stored as the host's 64-bit layout). Where 32, an upload
    /// holding a value past that width is a typed error ([`Target::check_upload`]), not a silent wrap.
    #[serde(default = "default_int64_compute_bits")]
    pub int64_compute_bits: u32,
    /// Computes f64 (PTX; a wgpu adapter with `shader-f64`, never a browser's WebGPU). Where false, a
    /// graph holding an f64 value is a typed error at compile time ([`Target::check_dtypes`]) and an f64
    /// upload one too, not f32 in disguise.
    #[serde(default = "yes")]
    pub float64: bool,
    /// Runs collectives across processes (NCCL on CUDA): an [`crate::ir::Op::AllReduce`] is a bucketed
    /// collective call. Elsewhere a process is a world of one and an all-reduce is its input.
    #[serde(default)]
    pub collectives: bool,
    /// How far a bucket of all-reduces is filled before the next starts (see [`crate::bucket`]).
    #[serde(default = "default_bucket_bytes")]
    pub bucket_bytes: u64,
    /// The largest output tile edge the matmul template may take (see [`crate::matmul_tile`]): 128, 64
    /// or 16 (`KILN_<BACKEND>_MATMUL_TILE`).
    #[serde(default = "default_matmul_tile")]
    pub matmul_tile: u32,
    /// Workgroups a product cut into partial products over pieces of its depth aims for
    /// ([`crate::split_k`], which cuts those the matmul template runs on few workgroups or small tiles);
    /// 0 never cuts (`KILN_<BACKEND>_SPLIT_K`). About two a compute unit of a large GPU (an H200 has 132): W6 over
    /// NVIDIA Vulkan took 4.79 ms at 256, 4.90 at 512, 4.97–4.99 at 1,024 and 2,048 (`benches/NOTES.md`,
    /// session 43).
    #[serde(default = "default_split_k_groups")]
    pub split_k_groups: u32,
    /// The matmul template computes the pointwise ops only its operand reads (a batch norm and ReLU
    /// before a convolution) inside its operand loads instead of reading them stored by a kernel of
    /// their own (`fuse`; `KILN_<BACKEND>_MATMUL_PROLOGUE=0|1`). A stored target without the field reads
    /// on, as every target is built.
    #[serde(default = "default_matmul_prologue")]
    pub matmul_prologue: bool,
    /// Operand tiles the matmul template keeps in workgroup memory ([`crate::kernel::Tile::stages`]), 1
    /// or 2; a tile whose two stages do not fit the workgroup memory takes one
    /// (`KILN_<BACKEND>_MATMUL_STAGES`). A stored target without the field reads 1.
    #[serde(default = "default_matmul_stages")]
    pub matmul_stages: u32,
}

/// The lanes attention template's largest work division (`attention::tile` takes fewer keys where
/// these do not fit the shared memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LaneAttention {
    /// Queries (threads) a workgroup: a multiple of 32.
    pub rows: u32,
    /// Keys a tile.
    pub keys: u32,
    /// Keys scored before they are folded in (`kernel::AttentionTile::chunk`).
    pub chunk: u32,
    /// Threads a query is split across (`kernel::AttentionTile::split`), where the target's subgroups
    /// can sum their partial scores (else 1).
    #[serde(default = "one")]
    pub split: u32,
}

fn one() -> u32 {
    1
}

/// The registers attention template's division (`attention::tile`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RegisterAttention {
    /// Queries a thread owns (`kernel::AttentionTile::thread_rows`): 4 or 8. Eight read half the shared
    /// memory per multiply-add that four do, in twice the registers.
    pub thread_rows: u32,
}

impl Default for LaneAttention {
    /// 128 queries a workgroup, tiles of 32 keys (16 KiB of workgroup memory at head dim 64: WebGPU's
    /// guaranteed limit), chunks of 4: the fastest of the 15 divisions measured on an H200 over NVIDIA
    /// Vulkan (W5's four attentions 0.84 ms, against 1.03 at 64,32,8 and 2.02 at 64,64,8: the kernel
    /// waits on latency, and smaller tiles and chunks leave room for more threads; `benches/NOTES.md`,
    /// session 35).
    fn default() -> LaneAttention {
        LaneAttention { rows: 128, keys: 32, chunk: 4, split: 1 }
    }
}

fn default_matmul_tile() -> u32 {
    crate::matmul_tile::LARGEST
}

fn default_matmul_prologue() -> bool {
    true
}

fn default_matmul_stages() -> u32 {
    1
}

fn default_split_k_groups() -> u32 {
    crate::matmul_tile::LARGE_MIN_GROUPS as u32
}

fn default_bucket_bytes() -> u64 {
    crate::bucket::BUCKET_BYTES
}

fn default_index_bits() -> u32 {
    64
}

fn yes() -> bool {
    true
}

fn default_int64_compute_bits() -> u32 {
    64
}

fn unlimited() -> u64 {
    u64::MAX
}

fn default_binding_alignment() -> u64 {
    4
}

fn default_vector_lanes() -> u32 {
    4
}

fn default_row_threads() -> u32 {
    256
}

fn default_vector_rows() -> bool {
    true
}

fn default_row_cache() -> u32 {
    32
}

fn default_column_threads() -> u64 {
    crate::split_reduce::COLUMN_THREADS
}

/// About the threads a large GPU keeps resident (an H200: 132 multiprocessors × 2,048).
fn default_combined_launch_threads() -> u64 {
    1 << 18
}

impl Target {
    /// WebGPU's guaranteed defaults: what any adapter, in any browser, can run.
    pub fn webgpu_default() -> Target {
        Target {
            name: "webgpu-default".into(),
            max_bindings: 8,
            max_threads_per_group: 256,
            max_groups_per_dim: 65535,
            grid_dims: 3,
            subgroup_size: None,
            shared_memory_bytes: 16384,
            f16_compute: false,
            bf16_compute: false,
            matrix_units: false,
            lane_attention: Some(LaneAttention::default()),
            register_attention: None,
            max_vector_bytes: 16,
            max_vector_lanes: default_vector_lanes(),
            packed_half_storage: true,
            max_row_cache: 32,
            vector_rows: true,
            library_gemm: false,
            library_epilogue: false,
            tf32_convolutions: false,
            conv_row_products_bytes: 0,
            row_threads: 256,
            column_threads: default_column_threads(),
            combined_launch_threads: default_combined_launch_threads(),
            max_buffer_bytes: 256 << 20,
            max_binding_bytes: 128 << 20,
            binding_alignment: 256,
            bool_words: true,
            index_bits: 32,
            int64_compute_bits: 32,
            float64: false,
            collectives: false,
            bucket_bytes: default_bucket_bytes(),
            matmul_tile: default_matmul_tile(),
            split_k_groups: default_split_k_groups(),
            matmul_prologue: default_matmul_prologue(),
            // Two stages: one barrier a step, not two (LG over NVIDIA Vulkan 4.64 → 4.42 ms, W5 9.22 →
            // 9.07: `benches/NOTES.md`, session 44); WebGPU's guaranteed 16 KiB takes them for the small
            // tile only, an adapter's larger limit for every tile.
            matmul_stages: 2,
        }
    }

    /// An NVIDIA GPU of compute capability `sm` (e.g. 80, 90).
    pub fn cuda(sm: u32) -> Target {
        Target {
            name: format!("sm_{sm}"),
            max_bindings: 64,
            max_threads_per_group: 1024,
            max_groups_per_dim: (1 << 31) - 1,
            grid_dims: 3,
            subgroup_size: Some(32),
            shared_memory_bytes: if sm >= 90 {
                227 * 1024
            } else if sm >= 80 {
                163 * 1024
            } else {
                48 * 1024
            },
            // Half-precision values are computed in f32 inside a fused kernel and rounded where they are
            // stored or cast, as torch.compile's generated code does (and as WGSL does without
            // `shader-f16`): rounding after every op costs two instructions an op and only moves the
            // result away from the exact one. `KILN_CUDA_HALF_ROUNDING=each-op` restores per-op rounding.
            f16_compute: false,
            bf16_compute: false,
            // The template's `mma.m16n8k16` over bf16 needs sm_80 (kiln renders for sm_80 or newer).
            matrix_units: sm >= 80,
            // f32 attention runs as one kernel on the registers template (written out, its two
            // products went to cuBLAS and its scores crossed memory four times); the PTX renderer has
            // no lanes template.
            lane_attention: None,
            // Four queries a thread: eight ran W5's attention kernel 6% faster alone but W5 no faster
            // (6.004–6.007 against 5.993–5.995 ms) and took ptxas twice as long (254 registers; cold
            // compile 399–421 against 146–230 ms): `benches/NOTES.md`, session 42.
            register_attention: Some(RegisterAttention { thread_rows: 4 }),
            max_vector_bytes: 16,
            // Eight bf16 lanes are one 16-byte access, as four f32 lanes are (four took W5-train-bf16's
            // pointwise kernels 8 bytes an access).
            max_vector_lanes: 8,
            packed_half_storage: false,
            max_row_cache: 32,
            vector_rows: true,
            library_gemm: true,
            library_epilogue: true,
            // TF32 matrix units arrived with sm_80 (kiln renders for sm_80 or newer).
            tf32_convolutions: sm >= 80,
            // Where writing and reading a 9x im2col matrix costs more than two more library calls: at
            // ~3 TB/s, the 8x-the-input bytes it saves over a 4 MiB input take ~20 µs, the calls ~5 µs
            // in a CUDA graph (DenseNet's first block, at 8 MiB, spent 84 µs writing its im2col matrix).
            conv_row_products_bytes: 4 << 20,
            row_threads: 256,
            // About the threads an H200 keeps resident (132 × 2,048): a column's first pass is a chain of
            // dependent loads a thread, and twice the default's threads summing half as far took a bf16
            // training step's layer-norm weight gradients from 159 to 68 µs (W5-train-bf16 under Nsight
            // Compute; 1 << 19 measured the same: `benches/NOTES.md`, session 26).
            column_threads: 1 << 18,
            combined_launch_threads: default_combined_launch_threads(),
            max_buffer_bytes: unlimited(),
            max_binding_bytes: unlimited(),
            binding_alignment: default_binding_alignment(),
            bool_words: false,
            index_bits: 64,
            int64_compute_bits: 64,
            float64: true,
            collectives: true,
            bucket_bytes: default_bucket_bytes(),
            matmul_tile: default_matmul_tile(),
            split_k_groups: default_split_k_groups(),
            matmul_prologue: default_matmul_prologue(),
            // One: the PTX template ran LG (`KILN_CUDA_GEMM=kiln`) 1.2% slower with two (session 44).
            matmul_stages: 1,
        }
    }

    /// The CPU kernel interpreter: generous limits, so the kernels it runs are the ones a GPU would get
    /// under `webgpu_default` only where a test asks for that target.
    pub fn interpreter() -> Target {
        Target {
            name: "kernel-interpreter".into(),
            max_bindings: 64,
            // No subgroups: its plans are ones every renderer spells (a compile report shows each kernel
            // in WGSL and PTX, and WGSL has no packed groups). CUDA's subgroup plans run through the
            // interpreter anyway, with the CUDA target (`conformance_ptx`).
            subgroup_size: None,
            max_buffer_bytes: unlimited(),
            max_binding_bytes: unlimited(),
            binding_alignment: default_binding_alignment(),
            bool_words: false,
            index_bits: 64,
            int64_compute_bits: 64,
            float64: true,
            // It runs the fused attention templates too (forward and backward, whose tiles need 48 KiB),
            // so every CI run checks that kernel IR.
            matrix_units: true,
            shared_memory_bytes: 48 * 1024,
            ..Target::webgpu_default()
        }
    }

    /// Shared memory a template (attention, matmul) may take: what a kernel declares statically, 48 KiB
    /// at most.
    pub fn template_shared_bytes(&self) -> u32 {
        self.shared_memory_bytes.min(48 * 1024)
    }

    /// Folds a count of workgroups into a grid within the per-dimension limit, x fastest (kernels
    /// flatten the grid back and tolerate the few extra groups rounding adds), using no more of the
    /// target's `grid_dims` than it needs. `None` past `limit^grid_dims`.
    pub fn fold_grid(&self, groups: u64) -> Option<(u32, u32, u32)> {
        let max = self.max_groups_per_dim.clamp(1, u32::MAX as u64);
        let x = groups.min(max);
        let rest = groups.div_ceil(x.max(1));
        let y = rest.min(max);
        let z = rest.div_ceil(y.max(1));
        let used = if z > 1 {
            3
        } else if y > 1 {
            2
        } else {
            1
        };
        (z <= max && used <= self.grid_dims.max(1)).then_some((x as u32, y as u32, z as u32))
    }

    /// Whether buffers of `d` move as vectors: not 64-bit integers (several targets hold them as pairs of
    /// words), nor narrow integers and 8-bit floats (bytes and 16-bit words a thread would have to
    /// assemble lanes from), nor 2-byte floats where the target packs two per shared word.
    pub fn vectorises(&self, d: DType) -> bool {
        let packed_half = self.packed_half_storage && matches!(d, DType::F16 | DType::BF16);
        !(matches!(d, DType::I64 | DType::U64 | DType::F64)
            || d.is_narrow_int()
            || d.minifloat().is_some()
            || packed_half)
    }

    /// This target with the tuning knobs `KILN_<BACKEND>_MAX_THREADS` (a cap on threads per group),
    /// `KILN_<BACKEND>_ROW_THREADS`, `KILN_<BACKEND>_ROW_CACHE` (persistent rows; 0: off), `KILN_<BACKEND>_VECTOR_ROWS=0|1` (`vector_rows`) and
    /// `KILN_<BACKEND>_COLUMN_THREADS` (`column_threads`), `KILN_<BACKEND>_COMBINE_THREADS` (`combined_launch_threads`; 0: no combined launches), `KILN_<BACKEND>_GEMM=kiln` (no GEMM library), `KILN_<BACKEND>_CONV_TF32=0` (f32 convolutions at full
    /// precision, as `torch.backends.cudnn.allow_tf32 = False`), `KILN_<BACKEND>_GEMM_EPILOGUE=separate` (bias and
    /// residual adds as the next kernel, not inside the library call), `KILN_<BACKEND>_ATTENTION=written-out` (no fused
    /// attention on matrix units, lanes or registers),
    /// `KILN_<BACKEND>_LANE_ATTENTION=rows,keys,chunk[,split]` (`lane_attention`),
    /// `KILN_<BACKEND>_REGISTER_ATTENTION_ROWS=0|4|8` (`register_attention`: off, or its queries a
    /// thread) and `KILN_<BACKEND>_HALF_ROUNDING=each-op` (f16/bf16
    /// values rounded after every op rather than where they are stored) applied, for experiments
    /// (`benches/NOTES.md`), `KILN_<BACKEND>_CONV_ROWS=0` (every convolution over a full im2col matrix) and
    /// `KILN_<BACKEND>_BUCKET_MB` (`bucket_bytes`, in MiB), `KILN_<BACKEND>_MATMUL_TILE` (`matmul_tile`),
    /// `KILN_<BACKEND>_SPLIT_K` (`split_k_groups`; 0: never split a product's depth),
    /// `KILN_<BACKEND>_MATMUL_PROLOGUE=0|1` (`matmul_prologue`), `KILN_<BACKEND>_MATMUL_STAGES=1|2`
    /// (`matmul_stages`).
    pub fn tuned_by_env(mut self, backend: &str) -> Target {
        let knob = |k: &str| std::env::var(format!("KILN_{backend}_{k}")).ok().and_then(|v| v.parse::<u32>().ok());
        if let Some(n) = knob("MAX_THREADS") {
            self.max_threads_per_group = self.max_threads_per_group.min(n);
        }
        self.row_threads = knob("ROW_THREADS").unwrap_or(self.row_threads);
        self.max_row_cache = knob("ROW_CACHE").unwrap_or(self.max_row_cache);
        self.vector_rows = knob("VECTOR_ROWS").map_or(self.vector_rows, |v| v != 0);
        self.column_threads = knob("COLUMN_THREADS").map_or(self.column_threads, u64::from);
        self.combined_launch_threads = knob("COMBINE_THREADS").map_or(self.combined_launch_threads, u64::from);
        self.library_gemm &= std::env::var(format!("KILN_{backend}_GEMM")).as_deref() != Ok("kiln");
        self.library_epilogue &= self.library_gemm;
        if self.tf32_convolutions && std::env::var(format!("KILN_{backend}_CONV_TF32")).as_deref() == Ok("0") {
            self.name = format!("{}-conv-f32", self.name);
            self.tf32_convolutions = false;
        }
        self.tf32_convolutions &= self.library_gemm;
        if self.conv_row_products_bytes > 0 && knob("CONV_ROWS") == Some(0) {
            self.name = format!("{}-conv-im2col", self.name);
            self.conv_row_products_bytes = 0;
        }
        if self.library_epilogue && std::env::var(format!("KILN_{backend}_GEMM_EPILOGUE")).as_deref() == Ok("separate")
        {
            self.name = format!("{}-epilogue-separate", self.name);
            self.library_epilogue = false;
        }
        // Row products add up inside the library's calls; without its epilogue each sum is a kernel.
        if !self.library_epilogue {
            self.conv_row_products_bytes = 0;
        }
        if (self.matrix_units || self.lane_attention.is_some() || self.register_attention.is_some())
            && std::env::var(format!("KILN_{backend}_ATTENTION")).as_deref() == Ok("written-out")
        {
            self.name = format!("{}-attention-written-out", self.name);
            (self.matrix_units, self.lane_attention, self.register_attention) = (false, None, None);
        }
        // 0 turns the registers template off; 4 or 8 turns it on (WGSL's renderer has it too).
        if let Some(rows) = knob("REGISTER_ATTENTION_ROWS").filter(|r| matches!(r, 0 | 4 | 8)) {
            let wanted = (rows > 0).then_some(RegisterAttention { thread_rows: rows });
            if wanted != self.register_attention {
                self.register_attention = wanted;
                self.name = format!("{}-register-attention-{rows}", self.name);
            }
        }
        let lanes = std::env::var(format!("KILN_{backend}_LANE_ATTENTION")).ok();
        if let (Some(la), Some(v)) = (self.lane_attention.as_mut(), lanes) {
            let n: Vec<u32> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
            let split = n.get(3).copied().unwrap_or(1);
            if let [rows, keys, chunk, ..] = n[..] {
                *la = LaneAttention { rows, keys, chunk, split };
                self.name = format!("{}-lane-attention-{rows}-{keys}-{chunk}-{split}", self.name);
            }
        }
        if let Some(mb) = knob("BUCKET_MB").filter(|&mb| u64::from(mb) << 20 != self.bucket_bytes) {
            self.name = format!("{}-buckets-{mb}mb", self.name);
            self.bucket_bytes = u64::from(mb.max(1)) << 20;
        }
        if let Some(on) = knob("MATMUL_PROLOGUE").map(|v| v != 0).filter(|&on| on != self.matmul_prologue) {
            self.name = format!("{}-matmul-prologue-{}", self.name, u8::from(on));
            self.matmul_prologue = on;
        }
        if let Some(groups) = knob("SPLIT_K").filter(|&g| g != self.split_k_groups) {
            self.name = format!("{}-split-k-{groups}", self.name);
            self.split_k_groups = groups;
        }
        if let Some(stages) = knob("MATMUL_STAGES").filter(|&s| matches!(s, 1 | 2) && s != self.matmul_stages) {
            self.name = format!("{}-matmul-stages-{stages}", self.name);
            self.matmul_stages = stages;
        }
        if let Some(edge) = knob("MATMUL_TILE").filter(|&e| e != self.matmul_tile) {
            self.name = format!("{}-matmul-tile-{edge}", self.name);
            self.matmul_tile = edge;
        }
        if std::env::var(format!("KILN_{backend}_HALF_ROUNDING")).as_deref() == Ok("each-op") {
            self.name = format!("{}-round-each-op", self.name);
            (self.f16_compute, self.bf16_compute) = (true, true);
        }
        self
    }

    /// Device bytes of `n` elements of `dtype`.
    pub fn storage_bytes(&self, dtype: DType, n: usize) -> u64 {
        let wide = self.bool_words && dtype == DType::Bool;
        (n * if wide { 4 } else { dtype.size_bytes() }) as u64
    }

    /// Host data in the device's layout: the host's own bytes (no copy) but for bools stored as words.
    pub fn encode<'a>(&self, data: &'a TensorData) -> Cow<'a, [u8]> {
        match self.bool_words && data.dtype() == DType::Bool {
            true => Cow::Owned(data.le_bytes().iter().flat_map(|&b| u32::from(b != 0).to_le_bytes()).collect()),
            false => Cow::Borrowed(data.le_bytes()),
        }
    }

    /// Whether `data` can go to this target's device as it is: where 64-bit integers are computed in 32
    /// bits, an i64 past i32's range or a u64 past u32's would be read as its low word — an error naming
    /// the first such element instead.
    pub fn check_upload(&self, data: &TensorData) -> Result<()> {
        if data.dtype() == DType::F64 && !self.float64 {
            return Err(self.no_float64(crate::SourceLoc::internal()));
        }
        if self.int64_compute_bits >= 64 || !matches!(data.dtype(), DType::I64 | DType::U64) {
            return Ok(());
        }
        // Read from the bytes being uploaded (the f64 view would be a second copy of the tensor): an
        // element fits when its high word is its low word's sign (i64) or zero (u64).
        let signed = data.dtype() == DType::I64;
        let fits = |w: &[u8]| {
            let x = i64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
            if signed {
                i32::try_from(x).is_ok()
            } else {
                u32::try_from(x).is_ok()
            }
        };
        let Some(i) = data.le_bytes().chunks_exact(8).position(|w| !fits(w)) else { return Ok(()) };
        let word: [u8; 8] = data.le_bytes()[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]);
        let value = if signed { i64::from_le_bytes(word).to_string() } else { u64::from_le_bytes(word).to_string() };
        Err(crate::Error::Unsupported {
            what: format!(
                "a {d} tensor holding {value} (element {i}) on {}, which computes {d} in {} bits: run it on CUDA \
                 or the CPU reference",
                self.name,
                self.int64_compute_bits,
                d = data.dtype(),
            ),
            loc: crate::SourceLoc::internal(),
        })
    }

    /// A typed error when `graph` computes an f64 value and this target cannot, naming the user's line
    /// of the first such op.
    pub fn check_dtypes(&self, graph: &crate::ir::Graph) -> Result<()> {
        if self.float64 {
            return Ok(());
        }
        // The first op computing an f64 names the user's line; an f64 input only where nothing does.
        let f64s = || graph.nodes.iter().filter(|n| n.dtype == DType::F64);
        let op = f64s().find(|n| !matches!(n.op, crate::ir::Op::Input { .. }));
        match op.or_else(|| f64s().next()) {
            Some(n) => Err(self.no_float64(n.loc.clone())),
            None => Ok(()),
        }
    }

    fn no_float64(&self, loc: crate::SourceLoc) -> crate::Error {
        crate::Error::Unsupported {
            what: format!(
                "f64 on {}, which has no f64 arithmetic (`shader-f64`; WebGPU has none): run it on CUDA, a \
                 Vulkan adapter with shaderFloat64, or the CPU reference, or cast to f32",
                self.name
            ),
            loc,
        }
    }

    /// Device bytes of `dims` elements of `dtype` back to host data.
    pub fn decode(&self, bytes: &[u8], dims: &[usize], dtype: DType) -> Result<TensorData> {
        if !(self.bool_words && dtype == DType::Bool) {
            return TensorData::from_le_bytes(bytes, dims, dtype);
        }
        let n: usize = dims.iter().product();
        let bools: Vec<u8> = bytes.chunks_exact(4).take(n).map(|w| u8::from(w != [0, 0, 0, 0])).collect();
        TensorData::from_le_bytes(&bools, dims, dtype)
    }

    /// This target with a different binding limit (tests of the splitting logic use tiny limits).
    pub fn with_max_bindings(mut self, n: u32) -> Target {
        self.max_bindings = n;
        self.name = format!("{}-bind{n}", self.name);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_fold_into_the_dimensions_a_target_has() {
        let t = Target { max_groups_per_dim: 100, ..Target::webgpu_default() };
        assert_eq!(t.fold_grid(50), Some((50, 1, 1)));
        assert_eq!(t.fold_grid(250), Some((100, 3, 1)));
        assert_eq!(t.fold_grid(20_000), Some((100, 100, 2)));
        assert_eq!(t.fold_grid(1_000_001), None);
        let two = Target { grid_dims: 2, ..t.clone() };
        assert_eq!(two.fold_grid(250), Some((100, 3, 1)));
        assert_eq!(two.fold_grid(20_000), None, "a third dimension the target lacks");
        let one = Target { grid_dims: 1, ..t };
        assert_eq!(one.fold_grid(100), Some((100, 1, 1)));
        assert_eq!(one.fold_grid(101), None);
    }
}
