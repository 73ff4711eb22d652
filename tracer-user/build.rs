//! Builds the BPF object (`tracer-ebpf`, nightly + bpf-linker) and hands its
//! path to the crate as `LOCKTRACE_BPF_OBJECT`, so plain `cargo build` and
//! `cargo test` produce a complete `locktrace`. scripts/setup.sh installs what
//! this needs.
use std::{env, path::PathBuf, process::Command};

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    let ebpf_dir = root.join("tracer-ebpf");
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let target_dir = root.join("target").join("bpf");

    for watched in ["tracer-ebpf/src", "tracer-ebpf/Cargo.toml", "tracer-ebpf/.cargo/config.toml", "tracer-common/src"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }

    let mut cargo = Command::new("cargo");
    cargo
        .current_dir(&ebpf_dir)
        .args(["+nightly", "build", "--release", "--locked"])
        .env("CARGO_TARGET_DIR", &target_dir);
    // Do not leak the host build's settings (clippy wrapper, host rustflags,
    // the stable toolchain pin) into the nightly BPF build.
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_") && key != "CARGO_HOME" || key.starts_with("RUSTC") || key == "RUSTUP_TOOLCHAIN" || key == "RUSTFLAGS" {
            cargo.env_remove(key.as_ref());
        }
    }
    cargo.env("CARGO_TARGET_DIR", &target_dir);
    let status = cargo.status().unwrap_or_else(|error| {
        panic!("could not run cargo for the BPF crate: {error}; run scripts/setup.sh first")
    });
    if !status.success() {
        panic!("building tracer-ebpf failed; run scripts/setup.sh (nightly rust-src, bpf-linker) and retry");
    }
    let object = target_dir.join("bpfel-unknown-none/release/tracer");
    let copy = out_dir.join("tracer.bpf.o");
    std::fs::copy(&object, &copy).unwrap_or_else(|error| panic!("copying {}: {error}", object.display()));
    println!("cargo:rustc-env=LOCKTRACE_BPF_OBJECT={}", copy.display());
}
