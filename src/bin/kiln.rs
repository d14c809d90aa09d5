//! The `kiln` command: tools around the library. `kiln cache stats` shows what the persistent compile
//! cache holds and its size cap; `kiln cache clear` empties it. `kiln check` runs workloads, saved graphs
//! or minimized cases on every backend here against the f64 reference, and shrinks what fails.

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
    /// Runs graphs on every backend and mode here against the f64 reference; exits 1 if any is wrong.
    Check(CheckArgs),
}

#[derive(clap::Args)]
struct CheckArgs {
    /// Saved graphs (`kiln-case/1` files written by `--minimize`, or graph JSON with concrete input dims,
    /// run on seeded inputs).
    files: Vec<std::path::PathBuf>,
    /// Built-in workloads to check at their check size (`W1,W3`; `all`).
    #[arg(long)]
    workload: Option<String>,
    /// Backends to hold to the reference: `all` (every one here that compiles kernels), or a list of
    /// `kernels`, `wgpu`, `cuda`.
    #[arg(long, default_value = "all")]
    backend: String,
    /// Shrink each failing graph and write it here as `<name>.json` with a Rust test replaying it.
    #[arg(long)]
    minimize: Option<std::path::PathBuf>,
    /// Candidates the minimizer may try per failing graph.
    #[arg(long, default_value_t = 2000)]
    budget: usize,
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
        Command::Check(args) => match check(&args) {
            Ok(true) => {}
            Ok(false) => std::process::exit(1),
            Err(e) => {
                eprintln!("kiln check: {e}");
                std::process::exit(2);
            }
        },
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

/// `kiln check`: every case, each report printed; whether all passed.
fn check(args: &CheckArgs) -> kiln::Result<bool> {
    use kiln::graph::minimize::Case;
    use kiln::graph::IntoBackend;
    let targets = if args.backend == "all" {
        kiln::check_targets()
    } else {
        args.backend
            .split(',')
            .map(|b| match b.trim() {
                "kernels" => kiln::Backend::Kernels.into_backend(),
                "wgpu" => kiln::Backend::Wgpu.into_backend(),
                "cuda" => kiln::Backend::Cuda.into_backend(),
                other => Err(kiln::Error::Unsupported {
                    what: format!("backend `{other}` (kernels, wgpu, cuda or all)"),
                    loc: kiln::SourceLoc::internal(),
                }),
            })
            .collect::<kiln::Result<Vec<_>>>()?
    };
    let names: Vec<&str> = targets.iter().map(|t| t.name()).collect();
    println!("checking against the f64 reference on: {}", names.join(", "));
    let mut cases: Vec<(String, Case)> = Vec::new();
    for path in &args.files {
        let text = std::fs::read_to_string(path)
            .map_err(|e| kiln::Error::Format { what: path.display().to_string(), msg: e.to_string() })?;
        let case = match Case::from_json(&text) {
            Ok(c) => c,
            Err(_) => {
                let graph = kiln::graph::export::from_json(&text)?;
                let inputs = kiln::graph::check::seeded_inputs(&graph)?;
                Case { graph, inputs }
            }
        };
        cases.push((path.display().to_string(), case));
    }
    if let Some(list) = &args.workload {
        for w in kiln::graph::workloads::all() {
            if list == "all" || list.split(',').any(|x| x.trim().eq_ignore_ascii_case(w.id)) {
                let inputs: Vec<kiln::Tensor> =
                    kiln::graph::workloads::inputs(&w.check).into_iter().map(kiln::Tensor::from_data).collect();
                let f = w.f;
                for (i, (case, _)) in
                    kiln::check(move |x: Vec<kiln::Tensor>| f(&x), inputs, &[])?.into_iter().enumerate()
                {
                    cases.push((format!("{} graph {i}", w.id), case));
                }
            }
        }
    }
    let mut all_passed = true;
    for (name, case) in cases {
        let report = case.check(&targets)?;
        println!("\n== {name} ({} op(s))\n{report}", case.ops());
        if report.passed() {
            continue;
        }
        all_passed = false;
        let what = report.first_failure().unwrap_or_default();
        if let Some(dir) = &args.minimize {
            let small = kiln::check::minimize(case, &targets, args.budget);
            let stem: String =
                name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect();
            let stem = format!("minimized_{}", stem.trim_matches('_'));
            let (json, rs) = kiln::graph::minimize::write_reproducer(&small, &what, dir, &stem)?;
            println!("minimized to {} op(s): {} and {}\n{}", small.ops(), json.display(), rs.display(), small.graph);
        }
    }
    println!("\n{}", if all_passed { "every graph matches the reference" } else { "MISMATCHES (above)" });
    Ok(all_passed)
}
