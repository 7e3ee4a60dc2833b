//! Group commit for the engine's writes: the shared [`keel_store::group_commit`]
//! combiner, and how a lost batch answer becomes a [`DurableError`].

pub(crate) use keel_store::group_commit::{BatchOp, Combiner, Held, rolled_back};

use crate::error::DurableError;

/// The error every caller of a batch gets when the statement failed other than by a
/// database error (see [`keel_store::group_commit::lost`]).
pub(crate) fn lost(e: &sqlx::Error) -> DurableError {
    DurableError::Store(keel_store::group_commit::lost(e))
}
