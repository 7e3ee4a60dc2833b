//! `keel config print`: the effective configuration (defaults + file + environment),
//! secrets redacted. It runs before logging and the runtime start ([`super::main`]).

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub(super) enum ConfigCommand {
    /// Print the effective configuration (defaults + file + environment), secrets redacted.
    Print,
}
