//! Developer tasks: `cargo xtask bench` (see docs/benchmarks.md).
fn main() -> anyhow::Result<()> {
    anyhow::bail!("usage: cargo xtask bench")
}
