//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!` embeds
//! `migrations/` at compile time, and cargo does not watch that folder by itself (a new
//! migration file would otherwise be missing from the binary until the next unrelated
//! change of this crate).
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
