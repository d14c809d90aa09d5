//! The process group: this process's membership of a data-parallel world, joined once per process —
//! the rendezvous on rank 0's address, then an NCCL communicator on the CUDA device `LOCAL_RANK` picks —
//! and the collectives a training loop (or a loop of the user's own) needs over kiln tensors:
//! all-reduce, broadcast, barrier. Collectives are ordered on the device's one stream, so they never
//! wait on the host; a collective whose peer is gone is ended by a watchdog after the world's timeout
//! and reported as an [`Error::Distributed`] by the next call.

use super::DistEnv;
use crate::{Backend, Error, Result, Tensor};
use std::sync::{Arc, Mutex};

/// How an all-reduce combines the ranks' tensors: the graph's own [`Op::AllReduce`] reduction, so a
/// collective called on concrete tensors and one recorded inside a compiled step are one thing.
///
/// [`Op::AllReduce`]: crate::graph::ir::Op::AllReduce
pub use crate::graph::ir::CollectiveOp as Reduce;

/// This process's rank of a data-parallel world, and the collectives over it.
pub struct ProcessGroup {
    env: DistEnv,
    #[cfg(feature = "cuda")]
    collective: Arc<kiln_ptx::collective::Collective>,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProcessGroup(rank {} of {})", self.env.rank, self.env.world)
    }
}

/// The world this process joined, once (a second rendezvous would meet nobody).
static JOINED: Mutex<Option<Arc<ProcessGroup>>> = Mutex::new(None);

fn fail(rank: usize, msg: impl Into<String>) -> Error {
    Error::Distributed { rank: Some(rank), msg: msg.into() }
}

impl ProcessGroup {
    /// The world this process was launched into (`kiln-run`, or torchrun's environment), joined on
    /// `backend`'s device at the first call and shared by every later one. An error when the process was
    /// not launched as part of a world.
    pub fn from_env(backend: Backend) -> Result<Arc<ProcessGroup>> {
        let mut joined = crate::graph::runtime::lock(&JOINED);
        if let Some(g) = joined.as_ref() {
            return Ok(g.clone());
        }
        let env = DistEnv::from_env()?.ok_or_else(|| Error::Distributed {
            rank: None,
            msg: "data-parallel training needs a launched world: start the program with `kiln-run --gpus N` \
                  (or set torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT)"
                .into(),
        })?;
        let g = Arc::new(ProcessGroup::init(&env, backend)?);
        *joined = Some(g.clone());
        Ok(g)
    }

    /// Joins the world `env` describes on `backend`'s device (CUDA: NCCL runs there). Every rank must
    /// call it; it returns once all have, or fails on every rank within `env.timeout`.
    pub fn init(env: &DistEnv, backend: Backend) -> Result<ProcessGroup> {
        let rt = backend.runtime()?;
        let on_cuda = rt.as_ref().is_some_and(|rt| rt.name() == "cuda");
        if !on_cuda {
            return Err(fail(
                env.rank,
                format!(
                    "data-parallel training runs on NCCL, which needs the CUDA backend; `{backend}` runs on {}",
                    rt.as_ref().map_or("the host", |r| r.name())
                ),
            ));
        }
        Self::join(env, rt)
    }

    #[cfg(feature = "cuda")]
    fn join(env: &DistEnv, rt: Option<Arc<crate::graph::Runtime>>) -> Result<ProcessGroup> {
        use super::rendezvous::rendezvous;
        use kiln_ptx::collective::{new_id, Collective};
        let rt = rt.ok_or_else(|| fail(env.rank, "no device"))?;
        // A rank without NCCL does not arrive (rank 0 then says so to the others); rank 0's own failure to
        // make the id is handed to every rank.
        if env.rank != 0 {
            kiln_ptx::nccl::nccl().map_err(|e| fail(env.rank, e.to_string()))?;
        }
        let id = rendezvous(env, || new_id().map_err(|e| fail(0, e.to_string())))?;
        let collective = Collective::join(&rt, env.world, env.rank, &id, env.timeout)?;
        tracing::info!(target: "kiln::dist", rank = env.rank, world = env.world, "joined the NCCL world");
        Ok(ProcessGroup { env: env.clone(), collective })
    }

    #[cfg(not(feature = "cuda"))]
    fn join(env: &DistEnv, _rt: Option<Arc<crate::graph::Runtime>>) -> Result<ProcessGroup> {
        Err(fail(env.rank, "this build of kiln has no `cuda` feature (NCCL runs on the CUDA backend)"))
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.env.rank
    }

    /// Processes in the world.
    pub fn world(&self) -> usize {
        self.env.world
    }

    /// The launch environment the world was joined from.
    pub fn env(&self) -> &DistEnv {
        &self.env
    }

    /// Whether this is rank 0 (the one that logs and writes checkpoints).
    pub fn is_main(&self) -> bool {
        self.env.rank == 0
    }

    /// `Ok` unless a collective failed (a peer died, or one ran past the timeout).
    pub fn healthy(&self) -> Result<()> {
        #[cfg(feature = "cuda")]
        return self.collective.healthy();
        #[cfg(not(feature = "cuda"))]
        Ok(())
    }

    /// Each of `xs` combined across the world by `op`, as new tensors on this process's device (one
    /// NCCL group, queued on the device: it does not wait). Inside a compiled function (traced
    /// tensors) each is an op of the graph ([`Tensor::all_reduce`]), bucketed by the compiler.
    pub fn all_reduce(&self, xs: &[Tensor], op: Reduce) -> Result<Vec<Tensor>> {
        if xs.iter().any(|t| t.value().is_none()) {
            return xs.iter().map(|t| t.all_reduce(op)).collect();
        }
        #[cfg(feature = "cuda")]
        {
            let out = self.collective.all_reduce(&self.on_device(xs)?, op.into())?;
            Ok(wrap(out))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (xs, op);
            Err(fail(self.env.rank, "no `cuda` feature"))
        }
    }

    /// Each of `xs` as rank `root` holds it, on every rank (one NCCL group, queued on the device).
    pub fn broadcast(&self, xs: &[Tensor], root: usize) -> Result<Vec<Tensor>> {
        #[cfg(feature = "cuda")]
        return Ok(wrap(self.collective.broadcast(&self.on_device(xs)?, root)?));
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (xs, root);
            Err(fail(self.env.rank, "no `cuda` feature"))
        }
    }

    /// Returns once every rank has reached it (an all-reduce of one number, waited for).
    pub fn barrier(&self) -> Result<()> {
        let one = Tensor::scalar(1.0, crate::DType::I32)?;
        let summed = self.all_reduce(&[one], Reduce::Sum)?;
        let arrived: i32 = summed[0].item()?;
        self.healthy()?;
        if arrived as usize != self.world() {
            return Err(fail(self.rank(), format!("a barrier counted {arrived} ranks of {}", self.world())));
        }
        Ok(())
    }

    /// `xs` as device tensors on the communicator's device (a host tensor is uploaded).
    #[cfg(feature = "cuda")]
    fn on_device(&self, xs: &[Tensor]) -> Result<Vec<crate::graph::runtime::DeviceTensor>> {
        let rt = self.collective.runtime();
        xs.iter()
            .map(|t| {
                let v = t.value().ok_or_else(|| {
                    fail(
                        self.rank(),
                        "a collective on a traced tensor: call it outside `compile` (on concrete tensors)",
                    )
                })?;
                Ok(v.on(rt)?.into_owned())
            })
            .collect()
    }
}

#[cfg(feature = "cuda")]
fn wrap(out: Vec<crate::graph::runtime::DeviceTensor>) -> Vec<Tensor> {
    out.into_iter().map(|d| Tensor::from_value(crate::graph::value::Value::from_device(d))).collect()
}
