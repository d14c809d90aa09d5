//! The one meeting of a world's processes before any collective runs: every rank connects to rank 0's
//! TCP port and says who it is and how big it believes the world is; rank 0 checks that the world is
//! whole and consistent, then hands every rank the same payload (the collective library's unique id, made
//! only once the world has formed) — or the same error. A rank that never arrives, a rank started with
//! another `WORLD_SIZE`, two processes claiming one rank, or a rank 0 that is gone all end the meeting
//! with an [`Error::Distributed`] on every rank within the timeout (a peer waits a short grace past it
//! for rank 0's verdict).
//!
//! Wire format (all integers little-endian): a peer sends `b"KILN"`, the protocol version, its rank and
//! its world size (`u32` each); rank 0 answers with a status byte (0: the payload follows, 1: an error
//! message follows), a `u32` length and that many bytes.

use super::DistEnv;
use crate::{Error, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"KILN";
const VERSION: u32 = 1;
/// The largest answer accepted (a collective id is 128 bytes; error messages are short).
const MAX_ANSWER: u32 = 1 << 20;
/// How long past its own deadline a peer still waits for rank 0's verdict: rank 0 gives it at *its*
/// deadline (a missing rank is only known then), and that answer must not race the peer's own timeout.
const VERDICT_GRACE: Duration = Duration::from_secs(2);

fn fail(rank: usize, msg: String) -> Error {
    Error::Distributed { rank: Some(rank), msg }
}

/// Meets the rest of `env`'s world and returns the payload every rank now shares: rank 0 calls
/// `payload` once the world has formed (and sends its error instead if it fails); the others receive it.
pub fn rendezvous(env: &DistEnv, payload: impl FnOnce() -> Result<Vec<u8>>) -> Result<Vec<u8>> {
    let deadline = Instant::now() + env.timeout;
    if env.rank == 0 {
        host(env, deadline, payload)
    } else {
        join(env, deadline)
    }
}

fn address(env: &DistEnv) -> Result<SocketAddr> {
    (env.master_addr.as_str(), env.master_port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| fail(env.rank, format!("MASTER_ADDR={} does not resolve", env.master_addr)))
}

/// One peer's hello, read from `s`: `(rank, world)`.
fn read_hello(s: &mut TcpStream) -> std::io::Result<(u32, u32)> {
    let mut b = [0u8; 16];
    s.read_exact(&mut b)?;
    let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    if &b[..4] != MAGIC || word(4) != VERSION {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            "not a kiln rendezvous hello (another program on this port?)",
        ));
    }
    Ok((word(8), word(12)))
}

fn answer(s: &mut TcpStream, ok: bool, bytes: &[u8]) {
    let mut msg = vec![u8::from(!ok)];
    msg.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    msg.extend_from_slice(bytes);
    // A peer that has gone away needs no answer.
    let _ = s.write_all(&msg);
}

/// Rank 0: wait for every other rank, check them, hand out the payload or the error.
fn host(env: &DistEnv, deadline: Instant, payload: impl FnOnce() -> Result<Vec<u8>>) -> Result<Vec<u8>> {
    let addr = address(env)?;
    // Bound to every interface on the port: MASTER_ADDR is how the others reach this host.
    let listener = TcpListener::bind(("0.0.0.0", addr.port())).map_err(|e| {
        fail(
            0,
            format!(
                "cannot listen on port {} for the rendezvous: {e} (is another job using MASTER_PORT?)",
                addr.port()
            ),
        )
    })?;
    listener.set_nonblocking(true).map_err(|e| fail(0, e.to_string()))?;
    let mut peers: Vec<Option<TcpStream>> = (0..env.world).map(|_| None).collect();
    let mut strays: Vec<TcpStream> = Vec::new();
    let mut problems: Vec<String> = Vec::new();
    let mut arrived = 1;
    while arrived < env.world && problems.is_empty() {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        match listener.accept() {
            Ok((mut s, from)) => {
                let _ = s.set_nonblocking(false);
                let _ =
                    s.set_read_timeout(Some(deadline.saturating_duration_since(now).max(Duration::from_millis(10))));
                match read_hello(&mut s) {
                    Ok((rank, world)) if world as usize != env.world => {
                        problems.push(format!(
                            "rank {rank} (from {from}) was started with WORLD_SIZE={world}, rank 0 with {}",
                            env.world
                        ));
                        strays.push(s);
                    }
                    Ok((rank, _)) if rank == 0 || rank as usize >= env.world => {
                        problems.push(format!("a process from {from} claims rank {rank} of a world of {}", env.world));
                        strays.push(s);
                    }
                    Ok((rank, _)) if peers[rank as usize].is_some() => {
                        problems.push(format!("two processes claim rank {rank} (the second from {from})"));
                        strays.push(s);
                    }
                    Ok((rank, _)) => {
                        peers[rank as usize] = Some(s);
                        arrived += 1;
                    }
                    Err(e) => {
                        tracing::warn!(target: "kiln::dist", %from, error = %e, "ignored a connection to the rendezvous")
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => problems.push(format!("the rendezvous stopped accepting: {e}")),
        }
    }
    if problems.is_empty() && arrived < env.world {
        let missing: Vec<usize> = (1..env.world).filter(|&r| peers[r].is_none()).collect();
        problems.push(format!(
            "rank(s) {missing:?} did not arrive within {:?} (not started, crashed, or MASTER_ADDR/MASTER_PORT differ)",
            env.timeout
        ));
    }
    let outcome = if problems.is_empty() { payload() } else { Err(fail(0, problems.join("; "))) };
    let (ok, bytes) = match &outcome {
        Ok(p) => (true, p.clone()),
        Err(e) => (false, format!("rank 0 ended the rendezvous: {e}").into_bytes()),
    };
    for s in peers.iter_mut().flatten().chain(strays.iter_mut()) {
        answer(s, ok, &bytes);
    }
    // Ranks that arrive late are told what happened rather than left to time out.
    let late =
        if ok { b"the world already formed without this rank (WORLD_SIZE or RANK differ?)".to_vec() } else { bytes };
    std::thread::spawn(move || {
        while Instant::now() < deadline {
            match listener.accept() {
                Ok((mut s, _)) => {
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                    if read_hello(&mut s).is_ok() {
                        answer(&mut s, false, &late);
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    });
    outcome
}

/// Any other rank: reach rank 0 (it may start later), say who this is, wait for the answer.
fn join(env: &DistEnv, deadline: Instant) -> Result<Vec<u8>> {
    let addr = address(env)?;
    let mut last = String::from("no attempt");
    let mut s = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(fail(
                env.rank,
                format!("could not reach rank 0's rendezvous at {addr} within {:?} ({last})", env.timeout),
            ));
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(1))) {
            Ok(s) => break s,
            Err(e) => {
                last = e.to_string();
                std::thread::sleep(Duration::from_millis(20).min(left));
            }
        }
    };
    let mut hello = Vec::with_capacity(16);
    hello.extend_from_slice(MAGIC);
    for v in [VERSION, env.rank as u32, env.world as u32] {
        hello.extend_from_slice(&v.to_le_bytes());
    }
    s.write_all(&hello).map_err(|e| fail(env.rank, format!("rank 0's rendezvous at {addr}: {e}")))?;
    let left = (deadline + VERDICT_GRACE).saturating_duration_since(Instant::now()).max(Duration::from_millis(10));
    let _ = s.set_read_timeout(Some(left));
    let gone = |e: std::io::Error| {
        let why = match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => format!("no answer from rank 0 within {:?}", env.timeout),
            _ => format!("rank 0 closed the rendezvous without an answer ({e}): did it die?"),
        };
        fail(env.rank, why)
    };
    let mut head = [0u8; 5];
    s.read_exact(&mut head).map_err(gone)?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    if len > MAX_ANSWER {
        return Err(fail(env.rank, format!("rank 0's answer claims {len} bytes: not a kiln rendezvous")));
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body).map_err(gone)?;
    match head[0] {
        0 => Ok(body),
        _ => Err(fail(env.rank, String::from_utf8_lossy(&body).into_owned())),
    }
}
