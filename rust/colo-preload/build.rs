//! Puts the state the fork handlers write (the input sections named `colo_fork`: see
//! `colo_sys::host`'s `ForkPage`) at the start of a page of its own in the shim, so that it is one
//! page (while it stays under 4096 bytes): each page a process writes after a fork costs it a
//! copy-on-write fault. Without this script the linker still keeps the section whole, at any
//! alignment.
fn main() {
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let script = std::path::Path::new(&out).join("colo_fork.ld");
    std::fs::write(&script, "SECTIONS { colo_fork ALIGN(4096) : { *(colo_fork) } } INSERT AFTER .data;\nSECTIONS { colo_fork_text ALIGN(4096) : { *(colo_fork_text) } } INSERT AFTER .text;\n").expect("write the linker script");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-T,{}", script.display());
    println!("cargo:rerun-if-changed=build.rs");
}
