//! locktrace: per-lock acquisition and contention counts for a live process.
//! The command line lives in the library (`locktrace::cli`).
fn main() -> std::process::ExitCode {
    locktrace::cli::main()
}
