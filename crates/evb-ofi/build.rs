//! Binds the system libfabric at build time instead of shipping pre-generated
//! bindings: the struct layouts must match the headers of the library we link.
//! The header-inline calls get symbols from a small C shim (csrc/shim.c).

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=csrc/shim.c");
    println!("cargo:rerun-if-changed=csrc/wrapper.h");
    let lib = pkg_config::Config::new()
        .atleast_version("1.17")
        .probe("libfabric")
        .unwrap_or_else(|e| {
            panic!("evb-ofi needs libfabric >= 1.17 and its headers (Debian: apt-get install libfabric-dev; scripts/setup.sh does it): {e}")
        });

    let mut shim = cc::Build::new();
    shim.file("csrc/shim.c").warnings(true);
    for dir in &lib.include_paths {
        shim.include(dir);
    }
    shim.compile("evb_ofi_shim");

    let mut builder = bindgen::Builder::default()
        .header("csrc/wrapper.h")
        .allowlist_function(
            "fi_getinfo|fi_freeinfo|fi_allocinfo|fi_dupinfo|fi_fabric|fi_strerror|evb_fi_.*",
        )
        .allowlist_type("fi_.*|fid_.*|fid|iovec")
        .allowlist_var("FI_.*")
        .derive_default(true)
        .layout_tests(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for dir in &lib.include_paths {
        builder = builder.clang_arg(format!("-I{}", dir.display()));
    }
    let bindings = builder
        .generate()
        .expect("bindgen could not parse the libfabric headers (is libclang-dev installed?)");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("bindings.rs");
    bindings.write_to_file(out).expect("writing bindings.rs");
}
