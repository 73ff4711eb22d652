//! Compiling and talking to the C fixtures the bench runs.
use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, Stdio},
};

use anyhow::{Context, Result, bail};

/// Compiles fixtures/bench/NAME.c with `-DDEFINE`s into `out`.
pub fn compile(root: &Path, out: &Path, name: &str, defines: &[&str]) -> Result<PathBuf> {
    let source = root.join("fixtures/bench").join(format!("{name}.c"));
    let binary = out.join(format!(
        "{name}{}",
        defines.iter().map(|d| format!("-{d}")).collect::<String>()
    ));
    let flags: Vec<String> = defines.iter().map(|d| format!("-D{d}")).collect();
    compile_source(&source, binary, &flags)
}

/// Compiles the C file `source` into `binary` (`-O2 -pthread` and `flags`).
pub fn compile_source(source: &Path, binary: PathBuf, flags: &[String]) -> Result<PathBuf> {
    let output = Command::new("gcc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&binary)
        .arg(source)
        .args(flags)
        .output()
        .context("running gcc")?;
    if !output.status.success() {
        bail!(
            "compiling {}: {}",
            source.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(binary)
}

/// Reads lines until one satisfies `done`; returns that line.
pub fn read_until(
    reader: &mut impl BufRead,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> Result<String> {
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            bail!("{what} ended early");
        }
        if done(line.trim()) {
            return Ok(line.trim().to_string());
        }
    }
}

/// Starts a loop fixture (fixtures/bench/loop.c) for `seconds`, up to its
/// `ready`: it locks once it reads a line on stdin.
pub fn start_loop(binary: &Path, seconds: f64) -> Result<(Child, BufReader<ChildStdout>)> {
    let mut fixture = Command::new(binary)
        .arg(seconds.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let mut out = BufReader::new(fixture.stdout.take().expect("piped"));
    read_until(&mut out, "fixture", |line| line == "ready")?;
    Ok((fixture, out))
}
