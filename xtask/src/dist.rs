//! `cargo xtask dist`: a tarball to copy to a server that has no Rust
//! toolchain. One static `locktrace` (glibc linked in with `crt-static`,
//! the BPF object embedded as in every build), its man pages and shell
//! completions (generated from the command's own definition), the licences,
//! the README with the `docs/` pages it links to, and the Prometheus rules.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

const TARGET: &str = "x86_64-unknown-linux-gnu";

/// Builds the tarball; returns its path.
pub fn run(root: &Path) -> Result<PathBuf> {
    let binary = build_static(root)?;
    let name = format!("locktrace-{}-x86_64-linux", env!("CARGO_PKG_VERSION"));
    let out = root.join("target/dist");
    let stage = out.join(&name);
    if stage.exists() {
        std::fs::remove_dir_all(&stage).context("clearing the staging folder")?;
    }
    for dir in ["bin", "man/man1", "completions", "docs/prometheus"] {
        std::fs::create_dir_all(stage.join(dir))?;
    }
    std::fs::copy(&binary, stage.join("bin/locktrace")).context("copying locktrace")?;
    write_man_pages(&stage.join("man/man1"))?;
    write_completions(&stage.join("completions"))?;
    for file in [
        "README.md",
        "CONTRIBUTING.md",
        "LICENSE-MIT",
        "LICENSE-APACHE",
        "LICENSE-GPL-2.0",
    ] {
        std::fs::copy(root.join(file), stage.join(file))
            .with_context(|| format!("copying {file}"))?;
    }
    // The README's links into docs/ work in the unpacked tarball too.
    for entry in std::fs::read_dir(root.join("docs"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|ext| ext == "md") {
            let name = path.file_name().context("a docs page without a name")?;
            std::fs::copy(&path, stage.join("docs").join(name))
                .with_context(|| format!("copying {}", path.display()))?;
        }
    }
    for entry in std::fs::read_dir(root.join("docs/prometheus"))? {
        let entry = entry?;
        std::fs::copy(
            entry.path(),
            stage.join("docs/prometheus").join(entry.file_name()),
        )?;
    }
    let tarball = out.join(format!("{name}.tar.gz"));
    let status = Command::new("tar")
        .arg("czf")
        .arg(&tarball)
        .arg("-C")
        .arg(&out)
        .arg(&name)
        .status()
        .context("running tar")?;
    if !status.success() {
        bail!("tar failed");
    }
    println!("{}", tarball.display());
    Ok(tarball)
}

/// `locktrace` linked statically (it then runs on any x86-64 Linux with
/// BPF, whatever its libc), in a target folder of its own.
fn build_static(root: &Path) -> Result<PathBuf> {
    let target_dir = root.join("target/dist-build");
    let status = Command::new(env!("CARGO"))
        .args(["build", "--release", "--locked", "-p", "tracer-user"])
        .args(["--target", TARGET])
        .arg("--target-dir")
        .arg(&target_dir)
        // Only the target's code: build scripts and the BPF build stay as usual.
        .env(
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
            "-C target-feature=+crt-static",
        )
        .current_dir(root)
        .status()
        .context("building locktrace")?;
    if !status.success() {
        bail!("building the static locktrace failed");
    }
    Ok(target_dir.join(TARGET).join("release/locktrace"))
}

fn write_man_pages(dir: &Path) -> Result<()> {
    let command = locktrace::cli::command();
    clap_mangen::generate_to(command, dir).context("writing the man pages")?;
    Ok(())
}

fn write_completions(dir: &Path) -> Result<()> {
    use clap_complete::Shell;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut command = locktrace::cli::command();
        clap_complete::generate_to(shell, &mut command, "locktrace", dir)
            .with_context(|| format!("writing the {shell} completion"))?;
    }
    Ok(())
}
