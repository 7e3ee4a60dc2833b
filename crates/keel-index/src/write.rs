//! Bulk writes of raw logs and their projections (shared by tip ingest and history).
//! Every insert is idempotent on `(chain_id, block_hash, log_index)`, so a block
//! written twice (tip and history meeting, a range redone after a lease expiry) is
//! stored once.

use crate::decode::{Projection, decode};
use crate::scope::{ScopeKind, to_i64};
use crate::{IndexError, Result};
use alloy::primitives::{Address, B256};
use alloy::rpc::types::Log;
use alloy::sol_types::SolEvent;
use keel_abi::bindings::Directory;
use sqlx::PgConnection;
use std::collections::{BTreeSet, HashMap};

/// Writes `logs` (each carrying its block number, block hash, tx hash and log index)
/// and the projections of those emitted by contracts in `kinds`.
///
/// # Errors
/// [`IndexError::Store`]; [`IndexError::Inconsistent`] for a log without position.
pub(crate) async fn write_logs(
    tx: &mut PgConnection,
    chain: i64,
    logs: &[Log],
    kinds: &HashMap<Address, ScopeKind>,
) -> Result<()> {
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
    for log in logs {
        let (Some(number), Some(hash), Some(idx), Some(txh)) = (
            log.block_number,
            log.block_hash,
            log.log_index,
            log.transaction_hash,
        ) else {
            return Err(IndexError::Inconsistent {
                chain: keel_units::ChainId(u64::try_from(chain).unwrap_or(0)),
                number: log.block_number.unwrap_or(0),
                reason: "a log lacks its block, transaction or index",
            });
        };
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
    let mut transfers = TransferColumns::default();
    let mut touched_names: BTreeSet<(Address, B256)> = BTreeSet::new();
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
            continue;
        }
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
        let q = match p {
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
            Projection::FeedCreated { .. } => continue,
        };
        q.execute(&mut *tx).await?;
    }
    if !transfers.block_number.is_empty() {
        sqlx::query(
            "INSERT INTO index_transfer (chain_id, block_number, block_hash, log_index, tx_hash,
                token, from_address, to_address, value)
             SELECT $1, u.n, u.h, u.i, u.t, u.token, u.f, u.r, u.v::numeric
             FROM unnest($2::bigint[], $3::bytea[], $4::bigint[], $5::bytea[], $6::bytea[],
                         $7::bytea[], $8::bytea[], $9::text[]) AS u(n, h, i, t, token, f, r, v)
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
        .execute(&mut *tx)
        .await?;
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
}
