//! # keel-index
//!
//! Keel's Ledger Index: the read model of Keel's contracts on EVM chains, in
//! PostgreSQL (migration `0006_index.sql`).
//!
//! - [`scope`]: the indexing scope (`index_scope`): which contracts of which chain are
//!   watched, by [`ScopeKind`]. Adding an address after ingest passed its
//!   `from_block` schedules its history (an address-only range). Tokens announced by `AssetCreated` and feeds announced
//!   by `FeedCreated` join the scope automatically (and leave it again if the block
//!   that announced them is reorged out).
//! - [`TipIngest`]: one owner per chain follows the head. Taking ownership increments
//!   `index_chain.owner_epoch`; every write transaction first locks the chain row and
//!   checks the epoch, so a late write of a previous owner commits nothing
//!   ([`IndexError::Fenced`]). Each block's parent hash is checked against the stored
//!   predecessor, its logs are fetched **by block hash** and checked to belong to it,
//!   and the block, its raw logs, projections and the checkpoint are written in one
//!   transaction. A mismatch is a reorg: the stored hashes (`index_block`) are
//!   compared with the node's, by bisection, to find the highest stored block still
//!   canonical — the true common ancestor — and every derived row above it is deleted
//!   before re-ingesting. `index_block` keeps the hash of every block from the tip down
//!   to the lower of `hash_window` below the tip and the block Keel recorded as
//!   finalized (`index_chain.finalized_number`, read from the node's `finalized` tag,
//!   else head − `finality_depth`), that block included. So a reorg deeper than the
//!   window but above recorded finality is repaired exactly (the node's *current*
//!   `finalized` block is never trusted for it: after a deep reorg it is on the new
//!   branch). Why not every block's hash or sparse checkpoints below it: a fork at or
//!   below a block Keel recorded as final cannot be repaired by the tip whatever its
//!   exact depth (rows were served as final), so the hashes there would only say how
//!   deep the damage goes; the operator's re-index rebuilds from a block they choose.
//!   Storage stays bounded by the distance between the tip and recorded finality
//!   (about 64-95 blocks on an Ethereum-like chain; it grows while finality stalls).
//!   A reorg that replaced a block at or below the recorded finalized block (or below
//!   every stored hash) is [`IndexError::ReorgTooDeep`] once (fatal, ERROR log, metric
//!   `keel_index_reorg_too_deep_total`): the chain is marked degraded (migration
//!   `0017`, [`read::chain_health`], [`read::degraded_chains`], gauge
//!   `keel_index_chain_degraded`) and every later write of any owner fails with
//!   [`IndexError::Degraded`] until an operator re-indexes the chain.
//! - [`reindex()`]: an operator's re-index of a chain (`keel index reindex --chain NAME
//!   [--from-block N]`, `POST /v1/chains/{chainId}/index/reindex`): one
//!   transaction takes a new epoch (fencing the live owner), deletes the rows at and
//!   above the first block with ordinary deletes (the balance triggers follow),
//!   recomputes the chain's holder balances, clears the checkpoint and the degraded
//!   marker; the indexer role then rebuilds (history planned from the first block, the
//!   tip above it) while reads say `indexRebuilding`.
//! - [`FollowBackoff`]: the pacing of a tip follow loop. A round that finds the node
//!   reporting a head above a block it answers `null` for stops there
//!   ([`RoundOutcome::missing`]); the loop then backs off exponentially (capped), and
//!   counts and logs it (rate-limited), instead of running another round at once.
//! - Projections (all rows carry chain, block number, block hash, tx hash, log index;
//!   inserts are idempotent on `(chain_id, block_hash, log_index)`; bulk rows of a
//!   history range or a big block are written with binary `COPY`, straight into the
//!   tables or, when some are already stored, through temporary staging tables and one
//!   `INSERT … SELECT … ON CONFLICT DO NOTHING` per table; small batches with one
//!   `UNNEST` insert per table):
//!   `index_transfer` (ERC-20 `Transfer` of asset tokens, with the block's time),
//!   `index_holder_balance` (current balance per holder, migration `0025`, kept by
//!   statement triggers on `index_transfer` in the same transaction as every insert and
//!   rollback delete, so it always equals the sum of the transfers; sums commute, so
//!   history ranges written out of order add up) and the `index_balance` view over it,
//!   `index_asset` (`AssetCreated`), `index_observation` (`AnswerUpdated`),
//!   `index_directory_entry` (`EntryChanged`/`EntryRemoved`; removal and replacement
//!   stamp `removed_at_block` instead of deleting; reads show live rows unless asked
//!   for history), `index_token_pause` (`Paused`/`Unpaused`; current state = latest
//!   row), `index_staleness_bound` (`StalenessBoundSet`/`Cleared`; current = latest row),
//!   `index_freeze_event` (RegulatedToken `AddressFrozenSet`, `TokensFrozen`,
//!   `TokensUnfrozen`, `RecoverySuccess`, migration `0093`; a holder's frozen state is
//!   folded on read in chain order, [`read::frozen_at`]).
//! - [`read`]: typed reads of the projections and [`wait_for_block`] (read-after-write,
//!   LISTEN/NOTIFY on checkpoint advance with a poll fallback). The Ledger read API:
//!   [`read::holders_at`] (holders ranked by balance at a block — a record-date
//!   snapshot — with keyset pages), [`read::transfer_page`], [`token_supply_at`] and
//!   [`read::finalized_block`] (the node's finalized block, recorded by the tip ingest
//!   once per round that commits a block). Holders at a block and the snapshots read
//!   the balance history `index_holder_change` (migration `0088`: a holder's net change
//!   per block, kept by the same triggers as `index_holder_balance`).
//! - [`snapshot`]: record-date snapshots as objects: pending until their block is
//!   final, then sealed once with a holder count, a total and a SHA-256 content hash,
//!   pages in O(limit) and a canonical CSV.
//!
//! ## Metrics
//! `keel_index_blocks_total`, `keel_index_logs_total` (counters, label `chain_id`),
//! `keel_index_tip_block`, `keel_index_chain_head_block` (gauges), `keel_index_reorgs_total`,
//! `keel_index_reorg_depth_blocks` (histogram, blocks), `keel_index_reorg_too_deep_total`,
//! `keel_index_reorg_beyond_window_total` (rolled back deeper than the hash window),
//! `keel_index_fenced_total`, `keel_index_chain_degraded` (gauge, 1 degraded),
//! `keel_index_tip_missing_block_total`, `keel_index_tip_round_errors_total`.
//!
//! - [`history`]: leased historical catch-up below the settled height. The owner plans
//!   ranges ([`plan_history`], `index_range`); any replica's [`HistoryWorker`] claims
//!   one (`FOR UPDATE SKIP LOCKED`, lease with expiry, attempt + 1 in the same
//!   statement), fetches logs with adaptive `eth_getLogs` spans (halve on "range too
//!   large", shrink toward ~1,000 logs per answer, double back on success; retry rate
//!   limits and transport failures), and
//!   writes the rows together with a completion guarded by its attempt, so a worker
//!   whose lease expired and was re-claimed commits nothing ([`IndexError::LeaseLost`]).
//!   While it fetches, a worker renews its lease every third of the lease, fenced by
//!   its attempt, so a range that takes longer than the lease is not offered again
//!   while its worker lives; a renewal that finds the range claimed again stops the
//!   fetch at once, and nothing of that attempt is committed.
//!   A range's rows are written only for blocks that are settled (below the hash
//!   window) or that the index holds as canonical: under the chain row's lock, each
//!   row's block hash is checked against `index_block`, and a range whose answer holds
//!   an orphaned block (a reorg after the fetch) or a block above the indexed tip
//!   writes nothing and goes back to pending ([`IndexError::Unsettled`],
//!   `keel_index_history_unsettled_total`), held back per range (250 ms doubling per
//!   refusal up to 5 s, migration `0063`, [`HistoryWorker::with_unsettled_backoff`]) and
//!   warned about at most every 30 s per worker. Ranges are not fetched above the indexed
//!   tip (the tip writes those blocks itself, with the scope it then has).
//!   Contracts discovered inside a range get address-only ranges for the spans that will
//!   not see the new scope (ranges above already claimed or completed, tip blocks above
//!   the planned history).
//!   [`HistoryWorker::drain`] pipelines: the next range is claimed and fetched while
//!   earlier ones are written (by up to [`HistoryWorker::with_write_concurrency`]
//!   writers); within a range, [`HistoryWorker::with_fetch_concurrency`] `eth_getLogs`
//!   spans are in flight, each decoded and encoded for `COPY` in its own task, and the
//!   span adapts to the answers' sizes
//!   ([`HistoryWorker::with_target_logs_per_request`]).
//! - [`TipIngest::wait_for_new_head`]: between rounds, watch the head with
//!   `eth_blockNumber` only, so a new block is ingested within milliseconds while the
//!   full round (with its reorg check of the stored tip) still runs every poll interval.
//!
//! ## Metrics (history)
//! `keel_index_history_logs_total`, `keel_index_history_span_splits_total`,
//! `keel_index_history_leases_lost_total` (a renewal or completion found the range
//! claimed again).
//!
//! ## Benchmark
//! `cargo bench -p keel-index --bench index` (`benches/index.rs`; figures and the
//! Ponder peer in `benches/README.md`): historical catch-up events/s with 1 and 3
//! indexer processes, tip-ingest events/s, tip latency p50/p99 on an Anvil with
//! `--block-time 1`.
//!
//! ## Services and SQL
//! - [`service`]: the crate's background loops on the `keel-service` shape
//!   (`run_once` → report, idle delay, backoff, stop on a cancellation token):
//!   [`TipFollow`] / [`follow_tip`] (the owner's tip loop: degraded hold, history
//!   planning before the first tip block, ownership, rounds paced by [`FollowBackoff`])
//!   and [`HistoryDrain`] / [`work_history`] (a replica's history worker loop while the
//!   chain is served). The `keel` binary only wires them.
//! - The SQL lives in the private `store` module, one module per table (`chain`,
//!   `block`, `scope`, `range`, `logs`, `projection`): noun-first query functions over
//!   `impl PgExecutor`, guarded updates, `FromRow` rows.
//!
//! ## Not yet built
//! - The tip loop ([`follow_tip`]) is paced by [`FollowBackoff`] but does not use
//!   [`TipIngest::wait_for_new_head`] between rounds yet.
//! - Whether the ≥ 10× Ponder target holds depends on the run; see
//!   `benches/README.md`.
//!
//! The `keel` binary's indexer role (through [`follow_tip`]) plans history
//! ([`plan_history`]) below the settled height before a chain's first tip block and
//! starts the tip above it; every replica runs a [`HistoryWorker`] (through
//! [`work_history`]).
//! The multi-process kill -9 test of the tip owner (two `keel run --role indexer`
//! processes, the owner killed, the other takes over with a new epoch and the index
//! equals the chain's logs) is in `crates/keel/tests/it/e2e.rs`.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod decode;
mod error;
mod health;
pub mod history;
pub mod read;
pub mod reindex;
pub mod scope;
pub mod service;
pub mod snapshot;
mod store;
mod supply;
pub mod tip;

pub use error::{IndexError, Result};
pub use health::{ChainHealth, HeadSource, IndexVerdict, index_health};
pub use history::{HistoryConfig, HistoryWorker, RangeDone, RangeLease, plan_history};
pub use read::{IndexedTip, wait_for_block};
pub use reindex::{Reindexed, reindex};
pub use scope::{ScopeEntry, ScopeKind};
pub use service::{
    HistoryDrain, SnapshotSeal, TipFollow, follow_tip, follow_tip_with_heads, seal_snapshots,
    work_history,
};
pub use supply::{token_supply, token_supply_at};
pub use tip::{FollowBackoff, NextRound, RoundOutcome, TipConfig, TipIngest};

/// Describes (`# HELP`, with units) every metric this crate records. Call once after
/// the global metrics recorder is installed.
pub fn describe_metrics() {
    ::metrics::describe_counter!(
        "keel_index_blocks_total",
        ::metrics::Unit::Count,
        "Blocks ingested by the tip indexer (count)."
    );
    ::metrics::describe_counter!(
        "keel_index_bulk_staged_total",
        ::metrics::Unit::Count,
        "Logs staged by bulk history ingest (count)."
    );
    ::metrics::describe_gauge!(
        "keel_index_chain_degraded",
        ::metrics::Unit::Count,
        "1 while the chain’s Ledger Index is degraded (re-index needed) (boolean)."
    );
    ::metrics::describe_counter!(
        "keel_index_fenced_total",
        ::metrics::Unit::Count,
        "Index writes refused (count)."
    );
    ::metrics::describe_counter!(
        "keel_index_history_leases_lost_total",
        ::metrics::Unit::Count,
        "History span leases lost (count)."
    );
    ::metrics::describe_counter!(
        "keel_index_history_logs_total",
        ::metrics::Unit::Count,
        "Logs ingested by history backfill (count)."
    );
    ::metrics::describe_counter!(
        "keel_index_history_span_splits_total",
        ::metrics::Unit::Count,
        "History spans split (count)."
    );
    ::metrics::describe_counter!(
        "keel_index_history_unsettled_total",
        ::metrics::Unit::Count,
        "History spans left unsettled (count)."
    );
    ::metrics::describe_counter!(
        "keel_index_logs_total",
        ::metrics::Unit::Count,
        "Logs ingested by the tip indexer (count)."
    );
    ::metrics::describe_counter!(
        "keel_index_reorg_beyond_window_total",
        ::metrics::Unit::Count,
        "Reorgs deeper than the reorg window (count)."
    );
    ::metrics::describe_histogram!(
        "keel_index_reorg_depth_blocks",
        ::metrics::Unit::Count,
        "Depth of handled reorgs (blocks)."
    );
    ::metrics::describe_counter!(
        "keel_index_reorg_too_deep_total",
        ::metrics::Unit::Count,
        "Reorgs below the finalized block that degraded the chain (count)."
    );
    ::metrics::describe_counter!(
        "keel_index_snapshots_sealed_total",
        ::metrics::Unit::Count,
        "Record-date snapshots sealed as final (count)."
    );
    ::metrics::describe_counter!(
        "keel_index_reindex_total",
        ::metrics::Unit::Count,
        "Operator re-indexes of a chain started (count)."
    );
    ::metrics::describe_counter!(
        "keel_index_reorgs_total",
        ::metrics::Unit::Count,
        "Reorgs handled by the tip indexer (count)."
    );
    ::metrics::describe_gauge!(
        "keel_index_chain_head_block",
        ::metrics::Unit::Count,
        "The chain's head block number as last read from the node by the tip indexer; index lag = this - keel_index_tip_block (block number)."
    );
    ::metrics::describe_gauge!(
        "keel_index_tip_block",
        ::metrics::Unit::Count,
        "Highest block number indexed at the tip (block number)."
    );
    ::metrics::describe_counter!(
        "keel_index_tip_missing_block_total",
        ::metrics::Unit::Count,
        "Tip rounds that found a block missing upstream (count)."
    );
    ::metrics::describe_counter!(
        "keel_index_tip_round_errors_total",
        ::metrics::Unit::Count,
        "Tip ingest rounds that failed (count)."
    );
}
