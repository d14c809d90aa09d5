//! The `kiln` command: tools around the library. `kiln cache stats` shows what the persistent compile
//! cache holds and its size cap; `kiln cache clear` empties it.

use clap::{Parser, Subcommand};

/// kiln's command-line tools.
#[derive(Parser)]
#[command(name = "kiln", version, about = "kiln, a tensor compiler: command-line tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The persistent compile cache (`KILN_CACHE_DIR`, capped by `KILN_CACHE_MAX_BYTES`).
    Cache {
        #[command(subcommand)]
        action: CacheAction,
    },
}

#[derive(Subcommand)]
enum CacheAction {
    /// Where the cache is, how many entries and bytes it holds, and its cap.
    Stats,
    /// Deletes every entry.
    Clear,
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Cache { action: CacheAction::Stats } => {
            let u = kiln::graph::cache::disk_usage();
            match &u.directory {
                Some(d) => println!("directory: {}", d.display()),
                None => println!("directory: none (the persistent cache is off)"),
            }
            println!("entries:   {}", u.entries);
            println!("bytes:     {} ({:.1} MiB)", u.bytes, u.bytes as f64 / (1u64 << 20) as f64);
            println!(
                "cap:       {} ({:.1} MiB; KILN_CACHE_MAX_BYTES)",
                u.max_bytes,
                u.max_bytes as f64 / (1u64 << 20) as f64
            );
        }
        Command::Cache { action: CacheAction::Clear } => match kiln::graph::cache::clear_disk() {
            Ok(n) => println!("removed {n} entries"),
            Err(e) => {
                eprintln!("kiln cache clear: {e}");
                std::process::exit(1);
            }
        },
    }
}
