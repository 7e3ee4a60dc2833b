//! SQL of the Ledger Index's tables (`migrations/0006_index.sql`, the degraded marker in
//! `0017`), one module per table, shaped like keel-txq's `store.rs`: query functions
//! named noun-first (`chain_take_ownership`, `range_claim`, `blocks_delete_above`),
//! each taking an executor (`impl PgExecutor<'_>`; `&mut PgConnection` where a function
//! needs the same connection for several statements, such as the bulk `COPY`), so
//! callers compose them in one transaction; updates that complete or move a row are
//! guarded (by the owner epoch, the range's attempt, `degraded_at IS NULL`), and rows
//! come back as `FromRow` structs.
//!
//! | module | table(s) |
//! |---|---|
//! | [`chain`] | `index_chain`: owner epoch, checkpoint, degraded marker, tip notifications |
//! | [`block`] | `index_block`: the hash window |
//! | [`scope`] | `index_scope`: watched contracts |
//! | [`range`] | `index_range`: leased history ranges |
//! | [`logs`] | `index_log`, `index_transfer` and the other projections: bulk writes (`COPY`/`UNNEST`), rollback |
//! | [`projection`] | reads of the projection tables (raw rows; [`crate::read`] types them) |
//! | [`ledger`] | `index_holder_balance` (migration `0025`, kept by triggers), `index_holder_change` (`0088`, the same triggers) and `index_transfer`: holders pages, snapshots, transfer pages, supply at a block |
//! | [`snapshot`] | `index_snapshot`, `index_snapshot_holder` (`0088`): snapshot objects, sealing, their pages |
//!
//! The typed reads (the crate's read API) are [`crate::read`], over [`projection`] and [`chain`].

pub(crate) mod block;
pub(crate) mod chain;
pub(crate) mod ledger;
pub(crate) mod logs;
pub(crate) mod projection;
pub(crate) mod range;
pub(crate) mod scope;
pub(crate) mod snapshot;
