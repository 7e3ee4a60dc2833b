//! Queries of the `platform_contract` table: Keel's own contracts per chain, as
//! recorded by `keel chain bootstrap`.

use crate::Result;
use sqlx::PgExecutor;

/// One recorded platform contract.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct PlatformContract {
    /// EIP-155 chain id.
    pub chain_id: i64,
    /// Directory name, e.g. `assetFactory` (ASCII, starts with a letter, at most 64).
    pub name: String,
    /// The 20-byte contract address.
    pub address: Vec<u8>,
    /// Hash (32 bytes) of the deploying transaction, when Keel deployed it.
    pub deploy_tx_hash: Option<Vec<u8>>,
    /// Block number of the deployment, when known.
    pub deployed_block: Option<i64>,
}

/// Records `contract`, or replaces the row of the same (chain, name) when the
/// address changed (a re-bootstrap onto a fresh chain). Returns true when a row was
/// inserted or changed.
///
/// # Errors
/// [`crate::StoreError::Permanent`] with SQLSTATE 23514 when the row breaks a CHECK
/// (address not 20 bytes, hash not 32 bytes, bad name); transient errors as classified.
pub async fn platform_contract_upsert(
    db: impl PgExecutor<'_>,
    contract: &PlatformContract,
) -> Result<bool> {
    let result = sqlx::query(
        "INSERT INTO platform_contract (chain_id, name, address, deploy_tx_hash, deployed_block)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (chain_id, name) DO UPDATE
            SET address = EXCLUDED.address,
                deploy_tx_hash = EXCLUDED.deploy_tx_hash,
                deployed_block = EXCLUDED.deployed_block,
                recorded_at = now()
          WHERE platform_contract.address IS DISTINCT FROM EXCLUDED.address",
    )
    .bind(contract.chain_id)
    .bind(&contract.name)
    .bind(&contract.address)
    .bind(&contract.deploy_tx_hash)
    .bind(contract.deployed_block)
    .execute(db)
    .await?;
    Ok(result.rows_affected() == 1)
}

/// Every platform contract recorded for `chain_id`, ordered by name.
///
/// # Errors
/// Transient or permanent [`crate::StoreError`] as classified.
pub async fn platform_contract_list(
    db: impl PgExecutor<'_>,
    chain_id: i64,
) -> Result<Vec<PlatformContract>> {
    Ok(sqlx::query_as::<_, PlatformContract>(
        "SELECT chain_id, name, address, deploy_tx_hash, deployed_block
           FROM platform_contract WHERE chain_id = $1 ORDER BY name",
    )
    .bind(chain_id)
    .fetch_all(db)
    .await?)
}
