//! SQL of keel-aa's tables, one module per table: `aa_user_operation`
//! (`migrations/0045_aa_user_operations.sql`),
//! `aa_bundle`, `aa_sponsorship_spend`; `aa_deposit_request`
//! (`migrations/0061_aa_deposit_requests.sql`); the reorg watch's `finalized_at`,
//! `aa_bundle.final_at` and bundle state `reorged` (`migrations/0074_aa_reorg_watch.sql`);
//! `aa_reputation` (0077) and `aa_bundler_control` (0080). Every item is re-exported here.
//!
//! Every function is one statement named noun-first and takes an executor, so the
//! workflow and the bundler compose them in one transaction (a state change and the
//! signal that reports it commit together). Rows come back decoded at the row: a
//! [`ChainId`], [`DbHash`](keel_units::db::DbHash) /
//! [`DbAddress`](keel_units::db::DbAddress) for 32/20-byte hashes and addresses, the
//! [`UserOpState`] / [`BundleState`] enums, decimal strings for uint256 values; a row
//! that does not decode is an error naming its table ([`unreadable`]). Updates are
//! guarded by the state they leave: a repeated call changes nothing and says so
//! (`false` / 0 rows).

mod bundle;
mod bundler_control;
mod deposit_request;
mod reputation;
mod sponsorship_spend;
mod states;
mod user_operation;

pub use bundle::*;
pub use bundler_control::*;
pub use deposit_request::*;
pub use reputation::*;
pub use sponsorship_spend::*;
pub use states::*;
pub use user_operation::*;

use keel_store::StoreError;
use keel_units::ChainId;

/// `Result` of the store functions: every failure is a classified [`StoreError`].
pub type StoreResult<T> = Result<T, StoreError>;

/// The error of a failed statement that reads rows of `table`: a row that does not
/// decode (a state this build does not know, a hash or address of the wrong length, a
/// negative chain id) is logged at ERROR naming the table and the column (never the
/// value), counted in `keel_aa_unreadable_rows_total{table}`, and returned as
/// [`StoreError::Decode`]; never skipped, zeroed or defaulted.
pub fn unreadable(table: &'static str) -> impl Fn(sqlx::Error) -> StoreError {
    move |e| {
        if let sqlx::Error::ColumnDecode { index, .. } = &e {
            metrics::counter!("keel_aa_unreadable_rows_total", "table" => table).increment(1);
            tracing::error!(target: "keel::aa::store", table, column = %index,
                "a stored row does not decode; it is refused");
        } else if matches!(e, sqlx::Error::Decode(_)) {
            metrics::counter!("keel_aa_unreadable_rows_total", "table" => table).increment(1);
            tracing::error!(target: "keel::aa::store", table, "a stored row does not decode; it is refused");
        }
        StoreError::from(e)
    }
}

/// A chain id read from a row, as the store functions take it. It was decoded from the
/// column ([`ChainId::from_db`]), so [`ChainId::to_db`] cannot fail on it.
pub fn stored_chain_id(chain_id: ChainId) -> i64 {
    chain_id.to_db().unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_store::testing::TestDatabase;
    use uuid::Uuid;

    /// Every stored state spelling decodes to its enum value; a state this build does
    /// not know, or a hash of the wrong length, makes the row an error (never a row
    /// with a default, never a skipped row).
    #[tokio::test]
    async fn rows_decode_at_the_row_and_an_unreadable_one_is_an_error() {
        let db = TestDatabase::create().await.unwrap();
        let pool = db.pool();
        for st in UserOpState::ALL {
            let back: UserOpState = sqlx::query_scalar("SELECT $1::text")
                .bind(st)
                .fetch_one(pool)
                .await
                .unwrap();
            assert_eq!(back, st);
            assert_eq!(back, st.as_str());
        }
        for st in BundleState::ALL {
            let back: BundleState = sqlx::query_scalar("SELECT $1::text")
                .bind(st)
                .fetch_one(pool)
                .await
                .unwrap();
            assert_eq!(back, st);
        }
        let hash = [7u8; 32];
        let json = serde_json::json!({});
        let row = NewUserOperation {
            chain_id: 1,
            user_op_hash: &hash,
            organization_id: None,
            sender: &[1u8; 20],
            nonce: "0",
            user_operation: &json,
            resolution: &json,
            instance_id: Uuid::new_v4(),
        };
        assert!(user_operation_insert(pool, &row).await.unwrap());
        let got = user_operation_get(pool, 1, &hash).await.unwrap().unwrap();
        assert_eq!(got.state, UserOpState::Accepted);
        assert_eq!(got.key(), (1, hash.as_slice()));
        // A newer schema's state (the CHECK of this one refuses it).
        sqlx::query("ALTER TABLE aa_user_operation DROP CONSTRAINT aa_user_operation_state_check")
            .execute(pool)
            .await
            .unwrap();
        sqlx::query("UPDATE aa_user_operation SET state = 'parked'")
            .execute(pool)
            .await
            .unwrap();
        assert!(matches!(
            user_operation_get(pool, 1, &hash).await,
            Err(StoreError::Decode)
        ));
        assert!(matches!(
            user_operations_open_of_sender(pool, 1, &[1u8; 20]).await,
            Ok(v) if v.is_empty()
        ));
        assert!(matches!(
            user_operation_by_hash(pool, &hash).await,
            Err(StoreError::Decode)
        ));
    }
}
