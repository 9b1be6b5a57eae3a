//! `tandem info` on a machine without a desktop session: every adapter listed, and no error
//! from libwayland about the `XDG_RUNTIME_DIR` a headless machine has not set.

use std::process::Command;

#[test]
fn info_lists_the_adapters_without_a_desktop_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .arg("info")
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .expect("tandem info runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("GPU: "), "an adapter is listed: {stdout}");
    assert!(!stderr.contains("XDG_RUNTIME_DIR"), "{stderr}");
}
