//! `cargo test` without the `root-tests` feature runs the unit tests and the
//! layering check only; this says how to run the real-BPF tests too.
fn main() {
    if !cfg!(feature = "root-tests") {
        println!(
            "real-BPF integration tests not run: `sudo scripts/test.sh`, or as root `cargo test --workspace --features tracer-user/root-tests -- --test-threads=2`"
        );
    }
}
