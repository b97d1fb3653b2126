//! Embeds the LD_PRELOAD shim (`libcolo_preload.so`, always a release build) in the `colo`
//! binary, so `colo run` works from wherever the binary is installed.
//!
//! A Cargo package cannot depend on another package's cdylib artifact (artifact dependencies are
//! unstable), so this script builds `colo-preload` with a second cargo invocation into its own
//! target directory (`<target>/colo-embed`, shared by every profile of this workspace; a separate
//! directory because the outer cargo holds the lock on its own). That works the same for
//! `cargo build`, `cargo test`, `cargo clippy` and `cargo install --path rust/colo-cli`.
//! `COLO_EMBED_SHIM=/path/to/libcolo_preload.so` embeds a prebuilt shim instead (packagers).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-env-changed=COLO_EMBED_SHIM");
    let shim = match std::env::var_os("COLO_EMBED_SHIM").filter(|v| !v.is_empty()) {
        Some(p) => {
            let p = PathBuf::from(p);
            println!("cargo:rerun-if-changed={}", p.display());
            p
        }
        None => build_shim(&manifest, &out),
    };
    let bytes = std::fs::read(&shim).unwrap_or_else(|e| panic!("reading the shim {}: {e}", shim.display()));
    assert!(bytes.starts_with(b"\x7fELF"), "{} is not an ELF file", shim.display());
    let dest = out.join("libcolo_preload.so");
    std::fs::write(&dest, &bytes).expect("writing the embedded shim");
    // The file name carries a hash of the contents, so two different shims never share a name in
    // the run-time cache directory, where a copy is trusted by its name, owner, mode and length.
    println!("cargo:rustc-env=COLO_EMBEDDED_SHIM_HASH={:016x}", fnv1a(&bytes));
}

/// Builds colo-preload (release) with a nested cargo and returns the path of the cdylib.
fn build_shim(manifest: &Path, out: &Path) -> PathBuf {
    let ws = manifest.parent().expect("colo-cli lives in the workspace directory");
    for dep in ["colo-preload", "colo", "colo-sys", "colo-ring"] {
        println!("cargo:rerun-if-changed={}", ws.join(dep).join("src").display());
        println!("cargo:rerun-if-changed={}", ws.join(dep).join("Cargo.toml").display());
    }
    println!("cargo:rerun-if-changed={}", ws.join("Cargo.lock").display());
    println!("cargo:rerun-if-changed={}", ws.join("Cargo.toml").display());
    // OUT_DIR is <target>[/<triple>]/<profile>/build/colo-cli-<hash>/out: its fourth ancestor is
    // the target directory (or the triple's directory under it), shared by every profile.
    let target_dir = out.ancestors().nth(4).map(|t| t.join("colo-embed")).unwrap_or_else(|| out.join("colo-embed"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut c = Command::new(cargo);
    c.arg("build").arg("--release").arg("-p").arg("colo-preload")
        .arg("--manifest-path").arg(ws.join("Cargo.toml"))
        .arg("--target-dir").arg(&target_dir);
    // Always for the binary's target, named: the output directory is then known whatever
    // CARGO_BUILD_TARGET or .cargo/config says.
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    c.arg("--target").arg(&target);
    // Lints and coverage wrappers of the outer build are not for the embedded artifact; flags
    // (RUSTFLAGS, the linker) are inherited so the shim matches the binary it goes in.
    // Without debug information: it would multiply the size of every `colo` binary.
    c.env("CARGO_PROFILE_RELEASE_DEBUG", "0").env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo");
    c.env_remove("RUSTC_WORKSPACE_WRAPPER").env_remove("CARGO_TARGET_DIR").env_remove("CARGO_BUILD_TARGET_DIR");
    let status = c.status().expect("running cargo to build colo-preload");
    assert!(status.success(), "building colo-preload for embedding failed ({status})");
    target_dir.join(&target).join("release").join("libcolo_preload.so")
}

/// FNV-1a, 64 bits: names the cached file. It tells builds apart and need not resist forgery:
/// only the user's own `colo` writes names in the user's cache directory (colo_run::embedded).
fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x0000_0100_0000_01b3))
}
