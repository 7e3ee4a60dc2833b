//! Closed sets the engine stores as text (`durable_instance.status`,
//! `durable_command.kind`, `durable_command.state`: each has a `CHECK` constraint in
//! `migrations/0002_durable.sql`) are Rust enums decoded at the row, with the stored
//! spelling exactly. A stored text that is none of them (a newer schema, a hand edit)
//! is a decode error, never a fallback: the row is refused
//! (`sqlx::Error::ColumnDecode`, as [`keel_store::StoreError::Decode`] to callers),
//! logged at ERROR naming the column (not the value), and counted in
//! `keel_durable_undecodable_values_total{column}`.

pub use keel_store::UnknownStoredValue;

/// Logs and counts an unknown value of `column` (the decode error is
/// [`UnknownStoredValue`], from [`keel_store::text_column!`]).
pub(crate) fn unknown(column: &'static str) {
    crate::metrics::undecodable(column);
    tracing::error!(target: "keel::durable", column,
        "a stored value is not one this build knows (a newer schema, or a hand edit); its row is refused");
}

/// Implements the sqlx text column type for an enum with `ALL` and `as_str` (see the
/// module docs) through [`keel_store::text_column!`]; `$column` names it in the decode
/// error and the metric.
macro_rules! stored_text {
    ($ty:ty, $column:literal) => {
        keel_store::text_column!($ty, $column, as_str, $crate::stored::unknown);
    };
}

pub(crate) use stored_text;

#[cfg(test)]
mod tests {
    use crate::status::{CommandKind, CommandState, RunStatus};
    use keel_store::testing::TestDatabase;

    /// Every stored spelling round-trips through the column type; any other text is a
    /// decode error (the store's `Decode`), counted by column, never a fallback.
    #[test]
    fn stored_spellings_round_trip_and_an_unknown_one_is_a_counted_decode_error() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    let db = TestDatabase::create().await.unwrap();
                    let pool = db.pool();
                    for s in RunStatus::ALL {
                        let back: RunStatus = sqlx::query_scalar("SELECT $1::text")
                            .bind(s)
                            .fetch_one(pool)
                            .await
                            .unwrap();
                        assert_eq!(back, s);
                        assert_eq!(RunStatus::parse(s.as_str()), Some(s));
                    }
                    for k in CommandKind::ALL {
                        let back: CommandKind = sqlx::query_scalar("SELECT $1::text")
                            .bind(k)
                            .fetch_one(pool)
                            .await
                            .unwrap();
                        assert_eq!(back, k);
                    }
                    for st in CommandState::ALL {
                        let back: CommandState = sqlx::query_scalar("SELECT $1::text")
                            .bind(st)
                            .fetch_one(pool)
                            .await
                            .unwrap();
                        assert_eq!(back, st);
                    }
                    let err = sqlx::query_scalar::<_, RunStatus>("SELECT 'paused'::text")
                        .fetch_one(pool)
                        .await
                        .unwrap_err();
                    assert!(matches!(
                        keel_store::StoreError::from(err),
                        keel_store::StoreError::Decode
                    ));
                    let err = sqlx::query_scalar::<_, CommandKind>("SELECT 'Start'::text")
                        .fetch_one(pool)
                        .await
                        .unwrap_err();
                    assert!(err.to_string().contains("durable_command.kind"), "{err}");
                });
        });
        let counted: Vec<(String, u64)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(k, ..)| k.key().name() == "keel_durable_undecodable_values_total")
            .filter_map(|(k, _, _, v)| match v {
                DebugValue::Counter(n) => k
                    .key()
                    .labels()
                    .find(|l| l.key() == "column")
                    .map(|l| (l.value().to_owned(), n)),
                _ => None,
            })
            .collect();
        let mut counted = counted;
        counted.sort();
        assert_eq!(
            counted,
            vec![
                ("durable_command.kind".to_owned(), 1),
                ("durable_instance.status".to_owned(), 1)
            ]
        );
    }
}
