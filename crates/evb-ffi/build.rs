//! libevb.so carries its soname (libevb.so.0: the C interface's major
//! version), so that programs linked with `-levb` find it after an
//! upgrade that keeps the interface.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libevb.so.0");
}
