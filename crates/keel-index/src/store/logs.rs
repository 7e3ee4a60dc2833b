//! `index_log`, `index_transfer` and the other projections (`index_asset`,
//! `index_observation`, `index_directory_entry`, `index_token_pause`,
//! `index_staleness_bound`, `index_freeze_event`): bulk writes of raw logs and their
//! projections (shared by tip ingest and history), and their rollback above a block.
//!
//! Rows are encoded for PostgreSQL's binary `COPY` ([`Batch::encode`], pure CPU, so
//! it runs where the logs are fetched, off the writer's path), streamed with `COPY`
//! into per-connection temporary staging tables (`keel_stage_log`,
//! `keel_stage_transfer`, `ON COMMIT DELETE ROWS`) and moved into the real tables with
//! one `INSERT … SELECT … ON CONFLICT (chain_id, block_hash, log_index) DO NOTHING`
//! per table, inside the caller's transaction. Every write is therefore idempotent on
//! `(chain_id, block_hash, log_index)`: a block written twice (tip and history
//! meeting, a range redone after a lease expiry) is stored once.
//!
//! The rare projections (assets, observations, directory entries, pauses, staleness
//! bounds, freeze events) are inserted row by row after the bulk rows, on both write
//! paths (`UNNEST` and `COPY`).

use crate::decode::{FreezeChange, Projection, decode};
use crate::scope::{ScopeKind, to_i64};
use crate::{IndexError, Result};
use alloy::primitives::{Address, B256, U256};
use alloy::rpc::types::Log;
use alloy::sol_types::SolEvent;
use keel_abi::bindings::Directory;
use sqlx::postgres::PgArgumentBuffer;
use sqlx::types::chrono::{DateTime, Utc};
use sqlx::{Encode, PgConnection, Postgres};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Signature of PostgreSQL's binary `COPY` format, flags and header extension length.
const COPY_HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";
/// The binary `COPY` trailer: a tuple with field count -1.
const COPY_TRAILER: &[u8] = &(-1_i16).to_be_bytes();

/// Columns of `index_log`, in the order of the encoded tuples.
const LOG_COLUMNS: &str =
    "chain_id, block_number, block_hash, log_index, tx_hash, address, topics, data";
/// Columns of `index_transfer`, in the order of the encoded tuples.
const TRANSFER_COLUMNS: &str = "chain_id, block_number, block_hash, log_index, tx_hash, token, from_address, to_address, value, block_time";

/// A projection row other than a transfer, with its position.
type Other = (i64, B256, i64, B256, Projection);

/// Logs and their projections encoded for binary `COPY` (tuples only; the header and
/// trailer are added when written). Built where logs are fetched; batches of the same
/// chain can be merged with [`Batch::append`].
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// Encoded `index_log` tuples, in chunks as they were encoded.
    logs: Vec<Vec<u8>>,
    log_rows: u64,
    /// Encoded `index_transfer` tuples.
    transfers: Vec<Vec<u8>>,
    transfer_rows: u64,
    /// Projections written row by row.
    others: Vec<Other>,
    /// The blocks the rows belong to: number → hash (the first hash seen).
    blocks: BTreeMap<u64, B256>,
    /// Two rows of the same block number carried different block hashes (the answers
    /// came from two branches of a reorg).
    forked: bool,
}

/// A binary `COPY` tuple being built in a buffer whose field contents are encoded by
/// sqlx's own PostgreSQL encoders (`Encode<Postgres>`, the same bytes it sends as bind
/// parameters); this module adds only the framing (field count, field lengths).
struct Tuples {
    buf: PgArgumentBuffer,
}

impl Tuples {
    fn new() -> Self {
        Self {
            buf: PgArgumentBuffer::default(),
        }
    }

    /// Starts a tuple of `fields` fields.
    fn start(&mut self, fields: i16) {
        self.buf.extend_from_slice(&fields.to_be_bytes());
    }

    /// One non-null field encoded by sqlx.
    fn field<'q, T: Encode<'q, Postgres>>(&mut self, value: &T) -> Result<()> {
        let at = self.buf.len();
        self.buf.extend_from_slice(&[0; 4]);
        let null = value
            .encode_by_ref(&mut self.buf)
            .map_err(|_| IndexError::Encode)?;
        let len = match null {
            sqlx::encode::IsNull::Yes => {
                self.buf.truncate(at + 4);
                -1
            }
            sqlx::encode::IsNull::No => {
                i32::try_from(self.buf.len() - at - 4).map_err(|_| IndexError::Encode)?
            }
        };
        self.buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
        Ok(())
    }

    /// One `NUMERIC` field holding a non-negative integer (PostgreSQL's binary numeric:
    /// digit count, weight, sign, display scale, then base-10000 digits, most
    /// significant first). sqlx encodes NUMERIC only with its `bigdecimal` or
    /// `rust_decimal` features (and the latter stops at 96 bits); the base-10000
    /// digits come from `ruint`'s `to_base_le`.
    fn numeric(&mut self, value: U256) -> Result<()> {
        let mut digits: Vec<i16> = value
            .to_base_le(10_000)
            .map(|d| i16::try_from(d).unwrap_or(0))
            .collect();
        while digits.last() == Some(&0) {
            digits.pop(); // leading zeros (none expected)
        }
        // Weight: the power of 10000 of the most significant digit.
        let weight =
            i16::try_from(digits.len().saturating_sub(1)).map_err(|_| IndexError::Encode)?;
        digits.reverse();
        while digits.last() == Some(&0) {
            digits.pop(); // trailing zeros are implied by the weight
        }
        let n = i16::try_from(digits.len()).map_err(|_| IndexError::Encode)?;
        let len = 8 + 2 * i32::from(n);
        self.buf.extend_from_slice(&len.to_be_bytes());
        self.buf.extend_from_slice(&n.to_be_bytes());
        self.buf
            .extend_from_slice(&(if n == 0 { 0 } else { weight }).to_be_bytes());
        self.buf.extend_from_slice(&0_u16.to_be_bytes()); // sign: positive
        self.buf.extend_from_slice(&0_i16.to_be_bytes()); // display scale
        for d in digits {
            self.buf.extend_from_slice(&d.to_be_bytes());
        }
        Ok(())
    }

    fn into_bytes(mut self) -> Vec<u8> {
        let inner: &mut Vec<u8> = &mut self.buf;
        std::mem::take(inner)
    }
}

impl Batch {
    /// Encodes `logs` (each carrying its block number, block hash, tx hash and log
    /// index) of `chain` and the projections of those emitted by contracts in `kinds`.
    ///
    /// # Errors
    /// [`IndexError::Inconsistent`] for a log without position; [`IndexError::Encode`].
    pub(crate) fn encode(
        chain: i64,
        logs: &[Log],
        kinds: &HashMap<Address, ScopeKind>,
    ) -> Result<Self> {
        let mut log_tuples = Tuples::new();
        let mut transfer_tuples = Tuples::new();
        let mut out = Self::default();
        for log in logs {
            let (number, hash, idx, txh) = position(chain, log)?;
            out.note_block(number, hash);
            let (number, idx) = (to_i64(number), to_i64(idx));
            let topics: Vec<&[u8]> = log
                .inner
                .data
                .topics()
                .iter()
                .map(|t| t.as_slice())
                .collect();
            let t = &mut log_tuples;
            t.start(8);
            t.field(&chain)?;
            t.field(&number)?;
            t.field(&hash.as_slice())?;
            t.field(&idx)?;
            t.field(&txh.as_slice())?;
            t.field(&log.inner.address.as_slice())?;
            t.field(&topics)?;
            t.field(&log.inner.data.data.as_ref())?;
            out.log_rows += 1;
            match kinds.get(&log.inner.address).and_then(|k| decode(*k, log)) {
                Some(Projection::Transfer {
                    token,
                    from,
                    to,
                    value,
                }) => {
                    let t = &mut transfer_tuples;
                    t.start(10);
                    t.field(&chain)?;
                    t.field(&number)?;
                    t.field(&hash.as_slice())?;
                    t.field(&idx)?;
                    t.field(&txh.as_slice())?;
                    t.field(&token.as_slice())?;
                    t.field(&from.as_slice())?;
                    t.field(&to.as_slice())?;
                    t.numeric(value)?;
                    t.field(&block_time(log))?;
                    out.transfer_rows += 1;
                }
                Some(p) => out.others.push((number, hash, idx, txh, p)),
                None => {}
            }
        }
        if out.log_rows > 0 {
            out.logs.push(log_tuples.into_bytes());
        }
        if out.transfer_rows > 0 {
            out.transfers.push(transfer_tuples.into_bytes());
        }
        Ok(out)
    }

    fn note_block(&mut self, number: u64, hash: B256) {
        match self.blocks.entry(number) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(hash);
            }
            std::collections::btree_map::Entry::Occupied(o) => self.forked |= *o.get() != hash,
        }
    }

    /// The distinct blocks `(number, hash)` the batch's rows belong to, by number.
    pub(crate) fn blocks(&self) -> &BTreeMap<u64, B256> {
        &self.blocks
    }

    /// True when two rows of one block number carry different block hashes.
    pub(crate) fn forked(&self) -> bool {
        self.forked
    }

    /// Moves the rows of `other` into this batch.
    pub(crate) fn append(&mut self, other: Self) {
        for (number, hash) in other.blocks {
            self.note_block(number, hash);
        }
        self.forked |= other.forked;
        self.logs.extend(other.logs);
        self.log_rows += other.log_rows;
        self.transfers.extend(other.transfers);
        self.transfer_rows += other.transfer_rows;
        self.others.extend(other.others);
    }

    /// Raw log rows in the batch (duplicates included).
    pub(crate) fn log_rows(&self) -> u64 {
        self.log_rows
    }
}

/// Below this many logs, [`logs_insert`] inserts with one `UNNEST` statement per table
/// instead of `COPY`: a statement is one message, while a `COPY` is three, and without
/// `TCP_NODELAY` (sqlx 0.9 does not set it) a small `COPY`'s last message can wait for
/// the server's delayed ACK (~40 ms on Linux): too slow for a tip block.
pub(crate) const COPY_MIN_ROWS: usize = 2_000;

/// Writes `logs` and the projections of those emitted by contracts in `kinds`:
/// small batches (fewer than [`COPY_MIN_ROWS`] logs, e.g. one tip block) with `UNNEST`
/// inserts, bigger ones with [`Batch::encode`] then [`batch_insert`]. Both are
/// idempotent on `(chain_id, block_hash, log_index)`.
///
/// # Errors
/// As [`Batch::encode`] and [`batch_insert`].
pub(crate) async fn logs_insert(
    tx: &mut PgConnection,
    chain: i64,
    logs: &[Log],
    kinds: &HashMap<Address, ScopeKind>,
) -> Result<()> {
    if logs.len() >= COPY_MIN_ROWS {
        let batch = Batch::encode(chain, logs, kinds)?;
        return batch_insert(tx, chain, &batch).await;
    }
    let n = logs.len();
    let (mut block_number, mut block_hash, mut log_index, mut tx_hash) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut address, mut topics, mut data) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let mut projections = Vec::new();
    // Block times of the transfers, in the order of their projections.
    let mut times: Vec<Option<DateTime<Utc>>> = Vec::new();
    for log in logs {
        let (number, hash, idx, txh) = position(chain, log)?;
        block_number.push(to_i64(number));
        block_hash.push(hash.to_vec());
        log_index.push(to_i64(idx));
        tx_hash.push(txh.to_vec());
        address.push(log.inner.address.to_vec());
        // Topics travel as one concatenated BYTEA per log (32 bytes each) and are split
        // back into BYTEA[] in SQL: PostgreSQL has no ragged 2-D arrays.
        topics.push(
            log.inner
                .data
                .topics()
                .iter()
                .flat_map(|t| t.0)
                .collect::<Vec<u8>>(),
        );
        data.push(log.inner.data.data.to_vec());
        if let Some(p) = kinds.get(&log.inner.address).and_then(|k| decode(*k, log)) {
            if matches!(p, Projection::Transfer { .. }) {
                times.push(block_time(log));
            }
            projections.push((to_i64(number), hash, to_i64(idx), txh, p));
        }
    }
    if n > 0 {
        sqlx::query(
            "INSERT INTO index_log (chain_id, block_number, block_hash, log_index, tx_hash, address, topics, data)
             SELECT $1, u.block_number, u.block_hash, u.log_index, u.tx_hash, u.address,
                    ARRAY(SELECT substring(u.topics FROM g * 32 + 1 FOR 32)
                          FROM generate_series(0, octet_length(u.topics) / 32 - 1) AS g ORDER BY g),
                    u.data
             FROM unnest($2::bigint[], $3::bytea[], $4::bigint[], $5::bytea[], $6::bytea[],
                         $7::bytea[], $8::bytea[])
                  AS u(block_number, block_hash, log_index, tx_hash, address, topics, data)
             ON CONFLICT (chain_id, block_hash, log_index) DO NOTHING",
        )
        .bind(chain)
        .bind(&block_number)
        .bind(&block_hash)
        .bind(&log_index)
        .bind(&tx_hash)
        .bind(&address)
        .bind(&topics)
        .bind(&data)
        .execute(&mut *tx)
        .await?;
    }

    // Transfers (the bulk of the rows) go in one UNNEST insert; the rest row by row.
    let mut transfers = TransferColumns {
        block_time: times,
        ..TransferColumns::default()
    };
    let mut others: Vec<Other> = Vec::new();
    for (number, hash, idx, txh, p) in projections {
        if let Projection::Transfer {
            token,
            from,
            to,
            value,
        } = p
        {
            transfers.block_number.push(number);
            transfers.block_hash.push(hash.to_vec());
            transfers.log_index.push(idx);
            transfers.tx_hash.push(txh.to_vec());
            transfers.token.push(token.to_vec());
            transfers.from.push(from.to_vec());
            transfers.to.push(to.to_vec());
            transfers.value.push(value.to_string());
        } else {
            others.push((number, hash, idx, txh, p));
        }
    }
    if !transfers.block_number.is_empty() {
        sqlx::query(
            "INSERT INTO index_transfer (chain_id, block_number, block_hash, log_index, tx_hash,
                token, from_address, to_address, value, block_time)
             SELECT $1, u.n, u.h, u.i, u.t, u.token, u.f, u.r, u.v::numeric, u.bt
             FROM unnest($2::bigint[], $3::bytea[], $4::bigint[], $5::bytea[], $6::bytea[],
                         $7::bytea[], $8::bytea[], $9::text[], $10::timestamptz[])
                  AS u(n, h, i, t, token, f, r, v, bt)
             ON CONFLICT (chain_id, block_hash, log_index) DO NOTHING",
        )
        .bind(chain)
        .bind(&transfers.block_number)
        .bind(&transfers.block_hash)
        .bind(&transfers.log_index)
        .bind(&transfers.tx_hash)
        .bind(&transfers.token)
        .bind(&transfers.from)
        .bind(&transfers.to)
        .bind(&transfers.value)
        .bind(&transfers.block_time)
        .execute(&mut *tx)
        .await?;
    }
    write_others(tx, chain, &others).await
}

/// Creates this connection's staging tables unless they exist (temporary tables live
/// as long as the pooled connection; `ON COMMIT DELETE ROWS` empties them at every
/// commit, and a rollback discards their rows with everything else).
const CREATE_STAGING: &str = "DO $$ BEGIN
    IF to_regclass('pg_temp.keel_stage_log') IS NULL THEN
        CREATE TEMP TABLE keel_stage_log (LIKE index_log) ON COMMIT DELETE ROWS;
    END IF;
    IF to_regclass('pg_temp.keel_stage_transfer') IS NULL THEN
        CREATE TEMP TABLE keel_stage_transfer (LIKE index_transfer) ON COMMIT DELETE ROWS;
    END IF;
END $$";

/// Streams `chunks` (encoded tuples) into `table` with one binary `COPY`, as a single
/// `CopyData` message: sqlx 0.9 does not set `TCP_NODELAY`, so every further small
/// message of the copy would wait for the server's delayed ACK (~40 ms on Linux).
async fn copy_in(
    tx: &mut PgConnection,
    table: &str,
    columns: &str,
    chunks: &[Vec<u8>],
) -> std::result::Result<(), sqlx::Error> {
    let statement = format!("COPY {table} ({columns}) FROM STDIN (FORMAT binary)");
    let len = COPY_HEADER.len() + chunks.iter().map(Vec::len).sum::<usize>() + COPY_TRAILER.len();
    let mut data = Vec::with_capacity(len);
    data.extend_from_slice(COPY_HEADER);
    for chunk in chunks {
        data.extend_from_slice(chunk);
    }
    data.extend_from_slice(COPY_TRAILER);
    let mut copy = tx.copy_in_raw(&statement).await?;
    copy.send(data).await?;
    copy.finish().await?;
    Ok(())
}

/// Writes `batch` inside the caller's transaction, then the other projections row by
/// row, then directory-entry removal stamps.
///
/// The bulk rows are first copied straight into `index_log` and `index_transfer`
/// (binary `COPY`, inside a savepoint): the common case, where none of them is stored
/// yet. If any is (a unique violation on `(chain_id, block_hash, log_index)`: tip and
/// history meeting, a range redone), the savepoint is rolled back and the batch goes
/// through the staging tables instead: one `COPY` and one
/// `INSERT … SELECT … ON CONFLICT DO NOTHING` per table, which stores only the rows
/// that are missing.
///
/// # Errors
/// [`IndexError::Store`].
pub(crate) async fn batch_insert(tx: &mut PgConnection, chain: i64, batch: &Batch) -> Result<()> {
    if batch.log_rows > 0 || batch.transfer_rows > 0 {
        sqlx::raw_sql("SAVEPOINT keel_index_bulk")
            .execute(&mut *tx)
            .await?;
        match copy_direct(tx, batch).await {
            Ok(()) => {
                sqlx::raw_sql("RELEASE SAVEPOINT keel_index_bulk")
                    .execute(&mut *tx)
                    .await?;
            }
            Err(e) if is_unique_violation(&e) => {
                sqlx::raw_sql(
                    "ROLLBACK TO SAVEPOINT keel_index_bulk; RELEASE SAVEPOINT keel_index_bulk",
                )
                .execute(&mut *tx)
                .await?;
                metrics::counter!("keel_index_bulk_staged_total", "chain_id" => chain.to_string())
                    .increment(1);
                copy_staged(tx, batch).await?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    write_others(tx, chain, &batch.others).await
}

/// True for PostgreSQL's `unique_violation` (23505).
fn is_unique_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == "23505")
}

/// `COPY` of the bulk rows straight into the real tables.
async fn copy_direct(tx: &mut PgConnection, batch: &Batch) -> std::result::Result<(), sqlx::Error> {
    if batch.log_rows > 0 {
        copy_in(tx, "index_log", LOG_COLUMNS, &batch.logs).await?;
    }
    if batch.transfer_rows > 0 {
        copy_in(tx, "index_transfer", TRANSFER_COLUMNS, &batch.transfers).await?;
    }
    Ok(())
}

/// The bulk rows through the staging tables, skipping rows already stored.
async fn copy_staged(tx: &mut PgConnection, batch: &Batch) -> Result<()> {
    sqlx::raw_sql(CREATE_STAGING).execute(&mut *tx).await?;
    if batch.log_rows > 0 {
        copy_in(tx, "keel_stage_log", LOG_COLUMNS, &batch.logs).await?;
        sqlx::query(
            "INSERT INTO index_log (chain_id, block_number, block_hash, log_index, tx_hash, address, topics, data)
             SELECT chain_id, block_number, block_hash, log_index, tx_hash, address, topics, data
             FROM keel_stage_log
             ON CONFLICT (chain_id, block_hash, log_index) DO NOTHING",
        )
        .execute(&mut *tx)
        .await?;
    }
    if batch.transfer_rows > 0 {
        copy_in(
            tx,
            "keel_stage_transfer",
            TRANSFER_COLUMNS,
            &batch.transfers,
        )
        .await?;
        sqlx::query(
            "INSERT INTO index_transfer (chain_id, block_number, block_hash, log_index, tx_hash,
                token, from_address, to_address, value, block_time)
             SELECT chain_id, block_number, block_hash, log_index, tx_hash,
                token, from_address, to_address, value, block_time
             FROM keel_stage_transfer
             ON CONFLICT (chain_id, block_hash, log_index) DO NOTHING",
        )
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// Inserts the non-transfer projections row by row (they are rare), then recomputes
/// the removal stamps of every directory entry they touched.
async fn write_others(tx: &mut PgConnection, chain: i64, others: &[Other]) -> Result<()> {
    let mut touched_names: BTreeSet<(Address, B256)> = BTreeSet::new();
    for (number, hash, idx, txh, p) in others {
        let (number, idx) = (*number, *idx);
        // Every projection statement starts with the same five position columns.
        macro_rules! positioned {
            ($sql:expr) => {
                sqlx::query($sql)
                    .bind(chain)
                    .bind(number)
                    .bind(hash.to_vec())
                    .bind(idx)
                    .bind(txh.to_vec())
            };
        }
        let q = match p.clone() {
            Projection::Transfer { .. } => continue,
            Projection::Asset {
                factory,
                asset_id,
                token,
                symbol,
                decimals,
            } => positioned!(
                "INSERT INTO index_asset (chain_id, block_number, block_hash, log_index, tx_hash,
                    factory, asset_id, token, symbol, decimals)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                 ON CONFLICT (chain_id, block_hash, log_index) DO NOTHING"
            )
            .bind(factory.to_vec())
            .bind(asset_id.to_vec())
            .bind(token.to_vec())
            .bind(symbol)
            .bind(i16::from(decimals)),
            Projection::Observation {
                feed,
                round_id,
                answer,
                updated_at,
            } => positioned!(
                "INSERT INTO index_observation (chain_id, block_number, block_hash, log_index, tx_hash,
                    feed, round_id, answer, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7::numeric, $8::numeric, $9::numeric)
                 ON CONFLICT (chain_id, block_hash, log_index) DO NOTHING"
            )
            .bind(feed.to_vec())
            .bind(round_id.to_string())
            .bind(answer)
            .bind(updated_at.to_string()),
            Projection::EntryChanged {
                directory,
                name,
                value,
            } => {
                touched_names.insert((directory, name));
                positioned!(
                    "INSERT INTO index_directory_entry (chain_id, block_number, block_hash, log_index,
                        tx_hash, directory, name, value)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                     ON CONFLICT (chain_id, block_hash, log_index) DO NOTHING"
                )
                .bind(directory.to_vec())
                .bind(name.to_vec())
                .bind(value.to_vec())
            }
            Projection::EntryRemoved { directory, name } => {
                touched_names.insert((directory, name));
                continue;
            }
            Projection::Pause { token, paused } => positioned!(
                "INSERT INTO index_token_pause (chain_id, block_number, block_hash, log_index,
                    tx_hash, token, paused)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (chain_id, block_hash, log_index) DO NOTHING"
            )
            .bind(token.to_vec())
            .bind(paused),
            Projection::StalenessBound {
                resolver,
                feed,
                bound,
            } => positioned!(
                "INSERT INTO index_staleness_bound (chain_id, block_number, block_hash, log_index,
                    tx_hash, resolver, feed, bound_seconds)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8::numeric)
                 ON CONFLICT (chain_id, block_hash, log_index) DO NOTHING"
            )
            .bind(resolver.to_vec())
            .bind(feed.to_vec())
            .bind(bound.map(|b| b.to_string())),
            Projection::Freeze { token, change } => {
                let (replacement, amount, frozen) = match change {
                    FreezeChange::Address { frozen, .. } => (None, None, Some(frozen)),
                    FreezeChange::Freeze { amount, .. } | FreezeChange::Unfreeze { amount, .. } => {
                        (None, Some(amount.to_string()), None)
                    }
                    FreezeChange::Recovery { replacement, .. } => {
                        (Some(replacement.to_vec()), None, None)
                    }
                };
                positioned!(
                    "INSERT INTO index_freeze_event (chain_id, block_number, block_hash, log_index,
                        tx_hash, token, kind, account, replacement, amount, frozen)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::numeric, $11)
                     ON CONFLICT (chain_id, block_hash, log_index) DO NOTHING"
                )
                .bind(token.to_vec())
                .bind(change.kind())
                .bind(change.account().to_vec())
                .bind(replacement)
                .bind(amount)
                .bind(frozen)
            }
            Projection::FeedCreated { .. } => continue,
        };
        q.execute(&mut *tx).await?;
    }
    for (directory, name) in touched_names {
        restamp_entry(&mut *tx, chain, directory, name).await?;
    }
    Ok(())
}

/// Recomputes `removed_at_block` of every row of directory entry `name` from the raw
/// logs: a row is removed (or replaced) at the block of the next `EntryChanged` or
/// `EntryRemoved` of the same name. Deriving it from stored logs makes the stamp
/// independent of the order in which blocks or ranges are written.
async fn restamp_entry(
    tx: &mut PgConnection,
    chain: i64,
    directory: Address,
    name: B256,
) -> Result<()> {
    sqlx::query(
        "UPDATE index_directory_entry e SET removed_at_block = (
             SELECT min(l.block_number) FROM index_log l
             WHERE l.chain_id = e.chain_id AND l.address = e.directory
               AND l.topics[1] = ANY($4::bytea[]) AND l.topics[2] = e.name
               AND (l.block_number, l.log_index) > (e.block_number, e.log_index))
         WHERE e.chain_id = $1 AND e.directory = $2 AND e.name = $3",
    )
    .bind(chain)
    .bind(directory.as_slice())
    .bind(name.as_slice())
    .bind(vec![
        Directory::EntryChanged::SIGNATURE_HASH.to_vec(),
        Directory::EntryRemoved::SIGNATURE_HASH.to_vec(),
    ])
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Column arrays of a bulk `index_transfer` insert.
#[derive(Default)]
struct TransferColumns {
    block_number: Vec<i64>,
    block_hash: Vec<Vec<u8>>,
    log_index: Vec<i64>,
    tx_hash: Vec<Vec<u8>>,
    token: Vec<Vec<u8>>,
    from: Vec<Vec<u8>>,
    to: Vec<Vec<u8>>,
    value: Vec<String>,
    block_time: Vec<Option<DateTime<Utc>>>,
}

/// The time of a log's block when the node reported it (`blockTimestamp`, Unix
/// seconds; tip ingest fills it from the block header).
fn block_time(log: &Log) -> Option<DateTime<Utc>> {
    log.block_timestamp
        .and_then(|s| i64::try_from(s).ok())
        .and_then(|s| DateTime::from_timestamp(s, 0))
}

/// A log's (block number, block hash, log index, transaction hash); a log without them
/// (a pending log) is an inconsistent node answer.
fn position(chain: i64, log: &Log) -> Result<(u64, B256, u64, B256)> {
    match (
        log.block_number,
        log.block_hash,
        log.log_index,
        log.transaction_hash,
    ) {
        (Some(number), Some(hash), Some(idx), Some(txh)) => Ok((number, hash, idx, txh)),
        _ => Err(IndexError::Inconsistent {
            chain: keel_units::ChainId(u64::try_from(chain).unwrap_or(0)),
            number: log.block_number.unwrap_or(0),
            reason: "a log lacks its block, transaction or index",
        }),
    }
}

/// The projection tables a rollback deletes from (every one has `block_number`).
const ROLLED_BACK: [&str; 8] = [
    "index_log",
    "index_transfer",
    "index_asset",
    "index_observation",
    "index_directory_entry",
    "index_token_pause",
    "index_staleness_bound",
    "index_freeze_event",
];

/// Deletes every raw log and projection row of `chain` above block `above` and clears
/// the directory-entry removal stamps above it, inside the caller's (fenced)
/// transaction.
///
/// # Errors
/// [`IndexError::Store`].
pub(crate) async fn projections_delete_above(
    tx: &mut PgConnection,
    chain: i64,
    above: i64,
) -> Result<()> {
    for table in ROLLED_BACK {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE chain_id = $1 AND block_number > $2"
        )))
        .bind(chain)
        .bind(above)
        .execute(&mut *tx)
        .await?;
    }
    sqlx::query(
        "UPDATE index_directory_entry SET removed_at_block = NULL
         WHERE chain_id = $1 AND removed_at_block > $2",
    )
    .bind(chain)
    .bind(above)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy::primitives::{LogData, address, b256};
    use keel_abi::bindings::AssetToken;
    use keel_store::testing::TestDatabase;

    const TOKEN: Address = address!("0x00000000000000000000000000000000000000aa");

    /// A `Transfer(from, to, value)` log of `TOKEN` at (`block`, `index`).
    fn transfer(block: u64, index: u64, value: U256) -> Log {
        let from = B256::left_padding_from(&[1]);
        let to = B256::left_padding_from(&index.to_be_bytes());
        event(
            block,
            index,
            LogData::new_unchecked(
                vec![AssetToken::Transfer::SIGNATURE_HASH, from, to],
                value.to_be_bytes::<32>().to_vec().into(),
            ),
        )
    }

    /// A log of `TOKEN` carrying `data` at (`block`, `index`).
    fn event(block: u64, index: u64, data: LogData) -> Log {
        let hash = B256::from(U256::from(block) + U256::from(0xb10c_u64));
        Log {
            inner: alloy::primitives::Log {
                address: TOKEN,
                data,
            },
            block_hash: Some(hash),
            block_number: Some(block),
            block_timestamp: None,
            transaction_hash: Some(b256!(
                "0x1111111111111111111111111111111111111111111111111111111111111111"
            )),
            transaction_index: Some(0),
            log_index: Some(index),
            removed: false,
        }
    }

    fn kinds() -> HashMap<Address, ScopeKind> {
        HashMap::from([(TOKEN, ScopeKind::AssetToken)])
    }

    /// Every stored row of `chain`, as text, in key order.
    async fn rows(db: &TestDatabase, chain: i64) -> anyhow::Result<Vec<String>> {
        let logs: Vec<String> = sqlx::query_scalar(
            "SELECT concat_ws('|', block_number, encode(block_hash, 'hex'), log_index,
                    encode(tx_hash, 'hex'), encode(address, 'hex'), topics::text, encode(data, 'hex'))
             FROM index_log WHERE chain_id = $1 ORDER BY block_number, log_index",
        )
        .bind(chain)
        .fetch_all(db.pool())
        .await?;
        let transfers: Vec<String> = sqlx::query_scalar(
            "SELECT concat_ws('|', block_number, encode(block_hash, 'hex'), log_index,
                    encode(tx_hash, 'hex'), encode(token, 'hex'), encode(from_address, 'hex'),
                    encode(to_address, 'hex'), value::text)
             FROM index_transfer WHERE chain_id = $1 ORDER BY block_number, log_index",
        )
        .bind(chain)
        .fetch_all(db.pool())
        .await?;
        Ok(logs.into_iter().chain(transfers).collect())
    }

    async fn write(db: &TestDatabase, chain: i64, logs: &[Log]) -> anyhow::Result<()> {
        let batch = Batch::encode(chain, logs, &kinds())?;
        let mut tx = db.pool().begin().await?;
        batch_insert(&mut tx, chain, &batch).await?;
        tx.commit().await?;
        Ok(())
    }

    fn values() -> Vec<U256> {
        let mut v = vec![
            U256::ZERO,
            U256::from(1),
            U256::from(9_999),
            U256::from(10_000),
            U256::from(10_001),
            U256::from(100_000_000),
            U256::from(1_000_000_000_000_u64),
            U256::from_str_radix("123456789012345678901234567890", 10).unwrap_or_default(),
            U256::MAX,
        ];
        v.extend((0..40).map(|i| U256::from(7_u64).pow(U256::from(i))));
        v
    }

    #[tokio::test]
    async fn copied_rows_equal_the_values_and_the_unnest_path() -> anyhow::Result<()> {
        let db = TestDatabase::create().await?;
        let logs: Vec<Log> = values()
            .into_iter()
            .enumerate()
            .map(|(i, v)| transfer(1 + i as u64 / 10, i as u64, v))
            .collect();
        // The COPY path on chain 1, the UNNEST path (small batch) on chain 2.
        write(&db, 1, &logs).await?;
        let mut tx = db.pool().begin().await?;
        logs_insert(&mut tx, 2, &logs, &kinds()).await?;
        tx.commit().await?;
        let copied = rows(&db, 1).await?;
        assert_eq!(copied.len(), logs.len() * 2);
        assert_eq!(copied, rows(&db, 2).await?);
        let stored: Vec<String> = sqlx::query_scalar(
            "SELECT value::text FROM index_transfer WHERE chain_id = 1 ORDER BY block_number, log_index",
        )
        .fetch_all(db.pool())
        .await?;
        let expected: Vec<String> = values().iter().map(U256::to_string).collect();
        assert_eq!(stored, expected);
        Ok(())
    }

    #[tokio::test]
    async fn a_batch_written_twice_or_overlapping_is_stored_once() -> anyhow::Result<()> {
        let db = TestDatabase::create().await?;
        let all: Vec<Log> = (0..3_000)
            .map(|i| transfer(10 + i / 1_000, i % 1_000, U256::from(i + 1)))
            .collect();
        write(&db, 7, &all[..2_000]).await?;
        let first = rows(&db, 7).await?;
        assert_eq!(first.len(), 4_000);
        // The same batch again (a range redone): nothing changes.
        write(&db, 7, &all[..2_000]).await?;
        assert_eq!(rows(&db, 7).await?, first);
        // An overlapping batch (half stored already) adds only the missing rows.
        write(&db, 7, &all[1_000..]).await?;
        assert_eq!(rows(&db, 7).await?.len(), 6_000);
        // The same through `logs_insert` in one transaction with a duplicate inside.
        let mut dup = all[2_500..].to_vec();
        dup.extend_from_slice(&all[2_990..]);
        let mut tx = db.pool().begin().await?;
        logs_insert(&mut tx, 7, &dup, &kinds()).await?;
        tx.commit().await?;
        assert_eq!(rows(&db, 7).await?.len(), 6_000);
        Ok(())
    }

    #[tokio::test]
    async fn a_rolled_back_bulk_write_leaves_nothing_behind() -> anyhow::Result<()> {
        let db = TestDatabase::create().await?;
        let logs: Vec<Log> = (0..2_500)
            .map(|i| transfer(5 + i / 500, i % 500, U256::from(i)))
            .collect();
        // Half of it stored, then a write that takes the staged path is rolled back.
        write(&db, 3, &logs[..1_000]).await?;
        let before = rows(&db, 3).await?;
        let batch = Batch::encode(3, &logs, &kinds())?;
        let mut tx = db.pool().begin().await?;
        batch_insert(&mut tx, 3, &batch).await?;
        tx.rollback().await?;
        assert_eq!(rows(&db, 3).await?, before);
        // The staging tables of the pooled connections are empty for the next write.
        write(&db, 3, &logs).await?;
        assert_eq!(rows(&db, 3).await?.len(), 5_000);
        Ok(())
    }

    /// RegulatedToken freeze events of `TOKEN` over blocks 10..=13 (log indexes from
    /// 5000 up, clear of the padding transfers' 0..2000).
    fn freeze_events() -> Vec<Log> {
        use keel_abi::bindings::RegulatedToken as R;
        let (a, b, c, agent) = (
            FA,
            FB,
            FC,
            address!("0x00000000000000000000000000000000000000ee"),
        );
        let amount = U256::from;
        vec![
            event(
                10,
                5_000,
                R::TokensFrozen {
                    account: a,
                    amount: amount(100),
                }
                .encode_log_data(),
            ),
            event(
                10,
                5_001,
                R::AddressFrozenSet {
                    account: a,
                    frozen: true,
                    agent,
                }
                .encode_log_data(),
            ),
            event(
                10,
                5_002,
                R::AddressFrozenSet {
                    account: b,
                    frozen: true,
                    agent,
                }
                .encode_log_data(),
            ),
            event(
                11,
                5_000,
                R::TokensUnfrozen {
                    account: a,
                    amount: amount(40),
                }
                .encode_log_data(),
            ),
            event(
                11,
                5_001,
                R::TokensFrozen {
                    account: c,
                    amount: amount(5),
                }
                .encode_log_data(),
            ),
            event(
                12,
                5_000,
                R::RecoverySuccess {
                    lost: a,
                    replacement: c,
                    agent,
                }
                .encode_log_data(),
            ),
            event(
                12,
                5_001,
                R::AddressFrozenSet {
                    account: b,
                    frozen: false,
                    agent,
                }
                .encode_log_data(),
            ),
            event(
                13,
                5_000,
                R::TokensUnfrozen {
                    account: c,
                    amount: amount(65),
                }
                .encode_log_data(),
            ),
            event(
                13,
                5_001,
                R::AddressFrozenSet {
                    account: c,
                    frozen: false,
                    agent,
                }
                .encode_log_data(),
            ),
        ]
    }

    const FA: Address = address!("0x000000000000000000000000000000000000f00a");
    const FB: Address = address!("0x000000000000000000000000000000000000f00b");
    const FC: Address = address!("0x000000000000000000000000000000000000f00c");

    /// The frozen state `freeze_events` leaves as of each block 9..=13.
    fn expected_frozen(block: u64) -> BTreeMap<Address, crate::read::FrozenState> {
        let st = |amount: u64, address_frozen| crate::read::FrozenState {
            amount: U256::from(amount),
            address_frozen,
        };
        match block {
            ..=9 => BTreeMap::new(),
            10 => BTreeMap::from([(FA, st(100, true)), (FB, st(0, true))]),
            11 => BTreeMap::from([(FA, st(60, true)), (FB, st(0, true)), (FC, st(5, false))]),
            12 => BTreeMap::from([(FC, st(65, true))]),
            _ => BTreeMap::new(),
        }
    }

    async fn frozen(
        db: &TestDatabase,
        chain: i64,
        at: u64,
    ) -> anyhow::Result<BTreeMap<Address, crate::read::FrozenState>> {
        let chain = keel_units::ChainId(u64::try_from(chain)?);
        Ok(crate::read::frozen_at(db.pool(), chain, TOKEN, at).await?)
    }

    async fn freeze_rows(db: &TestDatabase, chain: i64) -> anyhow::Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT count(*) FROM index_freeze_event WHERE chain_id = $1")
                .bind(chain)
                .fetch_one(db.pool())
                .await?,
        )
    }

    async fn insert(db: &TestDatabase, chain: i64, logs: &[Log]) -> anyhow::Result<()> {
        let mut tx = db.pool().begin().await?;
        logs_insert(&mut tx, chain, logs, &kinds()).await?;
        tx.commit().await?;
        Ok(())
    }

    #[tokio::test]
    async fn freeze_events_fold_at_a_block_on_both_paths_and_roll_back() -> anyhow::Result<()> {
        let db = TestDatabase::create().await?;
        let events = freeze_events();
        // Chain 1: the row-by-row path (a small batch), newest block first (the write
        // order does not matter: the state is folded on read).
        let mut reversed = events.clone();
        reversed.reverse();
        assert!(reversed.len() < COPY_MIN_ROWS);
        insert(&db, 1, &reversed).await?;
        insert(&db, 1, &reversed).await?;
        // Chain 2: the COPY path (padded with transfers to `COPY_MIN_ROWS` logs),
        // through `logs_insert` and then `Batch::encode` + `batch_insert` again.
        let mut big: Vec<Log> = (0..COPY_MIN_ROWS as u64)
            .map(|i| transfer(10 + i % 4, i, U256::from(i + 1)))
            .collect();
        big.extend(events.iter().cloned());
        insert(&db, 2, &big).await?;
        write(&db, 2, &big).await?;
        for chain in [1, 2] {
            // Written twice, stored once.
            assert_eq!(
                freeze_rows(&db, chain).await?,
                events.len() as i64,
                "chain {chain}"
            );
            for at in 9..=14 {
                assert_eq!(
                    frozen(&db, chain, at).await?,
                    expected_frozen(at),
                    "chain {chain} at {at}"
                );
            }
        }
        // Another token's events are not folded in.
        assert!(
            crate::read::frozen_at(db.pool(), keel_units::ChainId(1), FA, 14)
                .await?
                .is_empty()
        );

        // Rollbacks: the state at the tip is the state at the ancestor.
        for chain in [1, 2] {
            for above in [12, 10, 9] {
                let mut tx = db.pool().begin().await?;
                projections_delete_above(&mut tx, chain, above).await?;
                tx.commit().await?;
                let above = u64::try_from(above)?;
                assert_eq!(frozen(&db, chain, u64::MAX).await?, expected_frozen(above));
                assert_eq!(frozen(&db, chain, above).await?, expected_frozen(above));
            }
            assert_eq!(freeze_rows(&db, chain).await?, 0);
        }
        // Rewritten after the rollback (the reorg's new branch, here the same blocks).
        insert(&db, 1, &events).await?;
        assert_eq!(frozen(&db, 1, 11).await?, expected_frozen(11));
        assert_eq!(frozen(&db, 1, 13).await?, expected_frozen(13));
        Ok(())
    }
}
