//! Token supply from the indexed transfers (`index_transfer`, migration `0006_index.sql`).

use alloy::primitives::{Address, U256};
use keel_store::StoreError;
use keel_units::ChainId;
use sqlx::PgExecutor;

use crate::{IndexError, Result};

/// The supply of `token` on `chain` as the index holds it: the sum of its indexed
/// `Transfer`s from the zero address (mints) minus the sum of those to the zero
/// address (burns), in the token's base units. Zero for a token with no indexed
/// transfer. It reflects the indexed tip ([`crate::read::indexed_tip`]); read both in
/// one `REPEATABLE READ` transaction for a consistent pair. One statement.
///
/// # Errors
/// [`IndexError::Store`]; a chain id above `i64::MAX` or a negative sum (burns above
/// mints, which a conforming token cannot produce) is [`StoreError::Decode`].
pub async fn token_supply(db: impl PgExecutor<'_>, chain: ChainId, token: Address) -> Result<U256> {
    let decode = |_| IndexError::Store(StoreError::Decode);
    let chain_id = i64::try_from(chain.get()).map_err(decode)?;
    let supply: String = sqlx::query_scalar(
        "SELECT (COALESCE(SUM(value) FILTER (WHERE from_address = '\\x0000000000000000000000000000000000000000'::bytea), 0)
               - COALESCE(SUM(value) FILTER (WHERE to_address = '\\x0000000000000000000000000000000000000000'::bytea), 0))::text
           FROM index_transfer WHERE chain_id = $1 AND token = $2",
    )
    .bind(chain_id)
    .bind(token.as_slice())
    .fetch_one(db)
    .await?;
    U256::from_str_radix(&supply, 10).map_err(|_| IndexError::Store(StoreError::Decode))
}

/// The supply of `token` on `chain` as of block `at_block` (mints minus burns at or
/// below it), in base units: the kept supply (`index_holder_balance`, migration `0025`)
/// corrected by the mints and burns above `at_block`. Exact at or below the indexed
/// tip (read both in one `REPEATABLE READ` transaction), as
/// [`crate::read::holders_at`].
///
/// # Errors
/// [`IndexError::Store`]; a negative result is [`StoreError::Decode`].
pub async fn token_supply_at(
    db: impl PgExecutor<'_>,
    chain: ChainId,
    token: Address,
    at_block: u64,
) -> Result<U256> {
    let decode = |_| IndexError::Store(StoreError::Decode);
    let chain_id = i64::try_from(chain.get()).map_err(decode)?;
    let at = i64::try_from(at_block).unwrap_or(i64::MAX);
    let supply = crate::store::ledger::supply_at(db, chain_id, token.as_slice(), at).await?;
    U256::from_str_radix(&supply, 10).map_err(|_| IndexError::Store(StoreError::Decode))
}
