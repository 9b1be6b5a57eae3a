//! Writes every kernel of `tandem_shaders::ALL` to `DIR/<name>.wgsl` (the text the runtime hands
//! the adapter, preludes included), for compilers other than naga to check: `scripts/web.sh
//! test` has headless Chromium's Tint compile each one.
//! Usage: cargo run -p tandem-shaders --example dump_wgsl -- DIR

fn main() {
    let Some(dir) = std::env::args().nth(1) else {
        eprintln!("usage: dump_wgsl DIR");
        std::process::exit(2);
    };
    let dir = std::path::PathBuf::from(dir);
    let written = std::fs::create_dir_all(&dir).and_then(|_| {
        tandem_shaders::ALL
            .iter()
            .try_for_each(|s| std::fs::write(dir.join(format!("{}.wgsl", s.name)), s.source))
    });
    if let Err(e) = written {
        eprintln!("dump_wgsl: cannot write {}: {e}", dir.display());
        std::process::exit(1);
    }
    println!(
        "dump_wgsl: {} shaders in {}",
        tandem_shaders::ALL.len(),
        dir.display()
    );
}
