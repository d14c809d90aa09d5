//! Data-parallel training's process group, as torchrun and NCCL users know it: one process per GPU,
//! started by `kiln-run --gpus N` (or any launcher that sets the same environment: `RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`), meeting once at a TCP rendezvous on rank 0's address to
//! agree on the world and share the collective library's id. Everything that can go wrong there — a
//! malformed environment, a rank that never arrives or dies, mismatched world sizes — is an
//! [`Error::Distributed`] on every rank within [`DistEnv::timeout`], never a hang.

pub mod group;
pub mod rendezvous;

pub use group::{ProcessGroup, Reduce};

use crate::{Error, Result};
use std::time::Duration;

/// The default for how long a rank waits for the others (`KILN_DIST_TIMEOUT_S` overrides it).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// This process's place in a data-parallel world, read from the launcher's environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DistEnv {
    /// This process's rank, `0..world`.
    pub rank: usize,
    /// Processes in the world.
    pub world: usize,
    /// This process's rank on its host (which GPU it drives).
    pub local_rank: usize,
    /// Rank 0's host, where the rendezvous listens.
    pub master_addr: String,
    /// Rank 0's rendezvous port.
    pub master_port: u16,
    /// How long a rank waits for the others before it fails.
    pub timeout: Duration,
}

fn env_error(rank: Option<usize>, msg: String) -> Error {
    Error::Distributed { rank, msg }
}

impl DistEnv {
    /// The world from this process's environment; `None` when it was not started as part of one (no
    /// `WORLD_SIZE`). A variable that is present but malformed, or inconsistent with the others, is an
    /// error naming it.
    pub fn from_env() -> Result<Option<DistEnv>> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`DistEnv::from_env`] over any variable source.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<DistEnv>> {
        let Some(world) = var("WORLD_SIZE") else { return Ok(None) };
        let number = |name: &str, value: Option<String>, rank: Option<usize>| -> Result<usize> {
            let value = value.ok_or_else(|| env_error(rank, format!("{name} is not set (WORLD_SIZE is {world})")))?;
            value
                .trim()
                .parse::<usize>()
                .map_err(|_| env_error(rank, format!("{name}={value:?} is not a non-negative integer")))
        };
        let world_n = number("WORLD_SIZE", Some(world.clone()), None)?;
        let rank = number("RANK", var("RANK"), None)?;
        if world_n == 0 || rank >= world_n {
            return Err(env_error(Some(rank), format!("RANK={rank} is not below WORLD_SIZE={world_n}")));
        }
        let local_rank = match var("LOCAL_RANK") {
            Some(v) => number("LOCAL_RANK", Some(v), Some(rank))?,
            None => rank,
        };
        let master_addr = var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
        let port = number("MASTER_PORT", var("MASTER_PORT").or(Some("29500".into())), Some(rank))?;
        let master_port = u16::try_from(port)
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| env_error(Some(rank), format!("MASTER_PORT={port} is not a TCP port")))?;
        let timeout = match var("KILN_DIST_TIMEOUT_S") {
            Some(v) => Duration::from_secs(number("KILN_DIST_TIMEOUT_S", Some(v), Some(rank))? as u64),
            None => DEFAULT_TIMEOUT,
        };
        Ok(Some(DistEnv { rank, world: world_n, local_rank, master_addr, master_port, timeout }))
    }
}
