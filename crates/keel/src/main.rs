//! The `keel` binary: a thin dispatcher over [`cli`], one module per subcommand
//! (`keel migrate`, `keel config print`, `keel run --role …`, `keel chain bootstrap`,
//! `keel index reindex`, `keel org`, `keel api-key`, `keel template`, `keel dev`,
//! `keel ops …`). What the commands run lives in the `keel` library and the crates
//! below it.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
