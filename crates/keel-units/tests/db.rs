//! The PostgreSQL column types round-trip through a real database, and unreadable
//! stored values fail to decode instead of becoming zero.

use alloy_primitives::{Address, B256};
use keel_store::testing::TestDatabase;
use keel_units::ChainId;
use keel_units::db::{DbAddress, DbHash};

#[tokio::test]
async fn chain_ids_hashes_and_addresses_round_trip_and_bad_values_fail_to_decode() {
    let db = TestDatabase::create().await.expect("database");
    let pool = db.pool();

    let (chain, hash, address): (ChainId, DbHash, DbAddress) = sqlx::query_as("SELECT $1, $2, $3")
        .bind(ChainId(31_337))
        .bind(DbHash(B256::repeat_byte(0xab)))
        .bind(DbAddress(Address::repeat_byte(0x11)))
        .fetch_one(pool)
        .await
        .expect("round trip");
    assert_eq!(chain, ChainId(31_337));
    assert_eq!(hash.0, B256::repeat_byte(0xab));
    assert_eq!(address.0, Address::repeat_byte(0x11));

    // A chain id above i64::MAX cannot be stored.
    let too_big = sqlx::query("SELECT $1")
        .bind(ChainId(u64::MAX))
        .fetch_one(pool)
        .await;
    assert!(too_big.is_err(), "u64::MAX must not encode as a BIGINT");
    assert_eq!(
        ChainId(u64::MAX).to_db().unwrap_err().code(),
        "AMOUNT_OVERFLOW"
    );

    // A negative stored chain id does not decode.
    let negative = sqlx::query_scalar::<_, ChainId>("SELECT (-1)::BIGINT")
        .fetch_one(pool)
        .await;
    assert!(
        matches!(negative, Err(sqlx::Error::ColumnDecode { .. })),
        "{negative:?}"
    );

    // A stored hash of the wrong length is an error, never the zero hash.
    let short = sqlx::query_scalar::<_, DbHash>("SELECT '\\x0102'::BYTEA")
        .fetch_one(pool)
        .await;
    assert!(
        matches!(short, Err(sqlx::Error::ColumnDecode { .. })),
        "{short:?}"
    );
    let long = sqlx::query_scalar::<_, DbAddress>("SELECT decode(repeat('ab', 32), 'hex')")
        .fetch_one(pool)
        .await;
    assert!(
        matches!(long, Err(sqlx::Error::ColumnDecode { .. })),
        "{long:?}"
    );

    // Arrays bind as BIGINT[] / BYTEA[].
    let n: i64 =
        sqlx::query_scalar("SELECT (cardinality($1::BIGINT[]) + cardinality($2::BYTEA[]))::BIGINT")
            .bind(vec![ChainId(1), ChainId(10)])
            .bind(vec![DbHash(B256::ZERO)])
            .fetch_one(pool)
            .await
            .expect("arrays");
    assert_eq!(n, 3);
}
