//! Fingerprints the compiler's own source so the persistent compile cache never serves an entry made by a
//! different build of kiln (the version number alone does not change between development builds).

use std::path::Path;

fn visit(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                visit(&p, files);
            } else {
                files.push(p);
            }
        }
    }
}

fn main() {
    let mut files = Vec::new();
    visit(Path::new("src"), &mut files);
    files.sort();
    // FNV-1a over paths and contents: stable, and enough to tell builds apart.
    let mut h: u64 = 0xcbf29ce484222325;
    for f in &files {
        for b in f.to_string_lossy().bytes().chain(std::fs::read(f).unwrap_or_default()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    println!("cargo:rustc-env=KILN_SOURCE_HASH={h:016x}");
    println!("cargo:rerun-if-changed=src");
}
