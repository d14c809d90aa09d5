//! `kiln-run --gpus N -- PROGRAM [ARGS…]`: starts one process per GPU with the environment torchrun
//! gives its workers (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`), prefixes each
//! line they print with its rank, and stops the whole world as soon as one process fails: the others
//! are killed and `kiln-run` exits with the failed rank's status, so a crashed rank never leaves the rest
//! waiting on a collective. On several hosts, run it on each with `--nodes`, `--node-rank` and the same
//! `--master-addr`/`--master-port` (rank 0's host).

use clap::Parser;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

#[derive(Parser)]
#[command(about = "Start a data-parallel kiln program: one process per GPU, torchrun's environment")]
struct Args {
    /// Processes (GPUs) on this host.
    #[arg(long, default_value_t = 1)]
    gpus: usize,
    /// Hosts in the world.
    #[arg(long, default_value_t = 1)]
    nodes: usize,
    /// This host's place among them (its processes' ranks start at node_rank × gpus).
    #[arg(long, default_value_t = 0)]
    node_rank: usize,
    /// Rank 0's host, where the rendezvous listens.
    #[arg(long, default_value = "127.0.0.1")]
    master_addr: String,
    /// Rank 0's rendezvous port (default: a free one on this host; give one on several hosts).
    #[arg(long)]
    master_port: Option<u16>,
    /// The program and its arguments.
    #[arg(trailing_var_arg = true, required = true)]
    command: Vec<String>,
}

/// A port free on this host right now (the OS's pick).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

/// Copies `from`'s lines to this process's stdout or stderr with `[rank r] ` in front.
fn forward(from: impl std::io::Read + Send + 'static, rank: usize, to_stderr: bool) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            if to_stderr {
                eprintln!("[rank {rank}] {line}");
            } else {
                println!("[rank {rank}] {line}");
            }
        }
    })
}

/// Kills a rank and everything in its process group, and reaps it.
fn stop(c: &mut Child) {
    #[cfg(unix)]
    if let Ok(pid) = libc::pid_t::try_from(c.id()) {
        // SAFETY: signals the group this launcher created for the child (`process_group(0)`).
        unsafe {
            libc::killpg(pid, libc::SIGKILL);
        }
    }
    let _ = c.kill();
    let _ = c.wait();
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.gpus == 0 || args.nodes == 0 || args.node_rank >= args.nodes {
        eprintln!("kiln-run: --gpus and --nodes must be at least 1 and --node-rank below --nodes");
        return ExitCode::from(2);
    }
    if args.nodes > 1 && args.master_port.is_none() {
        eprintln!("kiln-run: with --nodes > 1, give every host the same --master-port");
        return ExitCode::from(2);
    }
    let port = match args.master_port.map_or_else(free_port, Ok) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("kiln-run: no free port for the rendezvous: {e}");
            return ExitCode::from(2);
        }
    };
    let world = args.gpus * args.nodes;
    let mut children: Vec<(usize, Child)> = Vec::new();
    let mut pipes = Vec::new();
    for local in 0..args.gpus {
        let rank = args.node_rank * args.gpus + local;
        let mut command = Command::new(&args.command[0]);
        // Each rank in its own process group, so stopping it stops what it started too.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let spawned = command
            .args(&args.command[1..])
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("LOCAL_WORLD_SIZE", args.gpus.to_string())
            .env("MASTER_ADDR", &args.master_addr)
            .env("MASTER_PORT", port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        match spawned {
            Ok(mut c) => {
                if let Some(out) = c.stdout.take() {
                    pipes.push(forward(out, rank, false));
                }
                if let Some(err) = c.stderr.take() {
                    pipes.push(forward(err, rank, true));
                }
                children.push((rank, c));
            }
            Err(e) => {
                eprintln!("kiln-run: cannot start {:?} for rank {rank}: {e}", args.command[0]);
                for (_, c) in &mut children {
                    stop(c);
                }
                return ExitCode::from(2);
            }
        }
    }
    // Wait for all; the first failure stops the rest.
    let mut status = ExitCode::SUCCESS;
    let mut running: Vec<(usize, Child)> = children;
    while !running.is_empty() {
        let mut failed = None;
        running.retain_mut(|(rank, c)| match c.try_wait() {
            Ok(Some(s)) if s.success() => false,
            Ok(Some(s)) => {
                failed.get_or_insert((*rank, s));
                false
            }
            Ok(None) => true,
            Err(e) => {
                eprintln!("kiln-run: lost track of rank {rank}: {e}");
                false
            }
        });
        if let Some((rank, s)) = failed {
            eprintln!(
                "kiln-run: rank {rank} {}: stopping the other {} rank(s)",
                match s.code() {
                    Some(code) => format!("exited with status {code}"),
                    None => format!("was killed ({s})"),
                },
                running.len()
            );
            for (_, c) in &mut running {
                stop(c);
            }
            running.clear();
            status = ExitCode::from(s.code().map_or(1, |c| c.clamp(1, 255) as u8));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in pipes {
        let _ = p.join();
    }
    status
}
