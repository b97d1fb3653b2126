//! Applies the version script `colo.map` to libcolo.so so that it exports only `colo_*` symbols,
//! with the soname `libcolo.so.0`.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=colo.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/colo.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcolo.so.0");
}
