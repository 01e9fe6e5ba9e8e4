//! Binds the system's UCX (Debian's libucx-dev) at build time: pkg-config finds
//! the headers and libraries, bindgen turns the headers into Rust. Binding the
//! installed headers, rather than a vendored copy, keeps the ABI that of the
//! library loaded at run time.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    let ucx = match pkg_config::Config::new()
        .atleast_version("1.10")
        .probe("ucx")
    {
        Ok(lib) => lib,
        Err(e) => {
            eprintln!("evb-ucx: UCX >= 1.10 development files not found ({e}); on Debian: apt-get install libucx-dev (scripts/setup.sh does)");
            std::process::exit(1);
        }
    };
    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("ucp_.*|uct_query_components|uct_release_component_list|uct_component_query|uct_md_config_read|uct_md_open|uct_md_close|uct_md_query_tl_resources|uct_release_tl_resource_list|uct_config_release|ucs_status_string")
        .allowlist_type("ucp_.*|ucs_status_t|uct_component_attr.*|uct_tl_resource_desc.*|uct_md_resource_desc.*")
        .allowlist_var("UCP_.*|UCS_.*|UCT_COMPONENT_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false);
    for path in &ucx.include_paths {
        builder = builder.clang_arg(format!("-I{}", path.display()));
    }
    let bindings = match builder.generate() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("evb-ucx: bindgen failed on the UCX headers ({e}); it needs libclang: apt-get install libclang-dev clang");
            std::process::exit(1);
        }
    };
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("ucx_bindings.rs"))
        .expect("writing the bindings into OUT_DIR");
}
