//! Closed sets stored as text: [`text_column!`](crate::text_column) implements sqlx's
//! PostgreSQL `TEXT` column type for an enum in its exact stored spelling, so a row is
//! decoded into the enum where it is read and a stored text outside the set is a decode
//! error naming the column (never a fallback value, never the text itself).

/// A stored text that is not one of its column's values (the value is not shown: it
/// may be anything a hand edit or a newer schema wrote).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{column} holds a value this build does not know")]
pub struct UnknownStoredValue {
    /// The column, as `table.column` (or a name for the set).
    pub column: &'static str,
}

/// Implements `sqlx::Type`, `sqlx::postgres::PgHasArrayType`, `sqlx::Encode` and
/// `sqlx::Decode` for PostgreSQL `TEXT` on an enum that has `ALL` (an array or slice of
/// every value) and a `fn(self) -> &'static str` giving each value's stored text
/// (`as_str` unless named). Decoding a text that no value spells fails with
/// [`UnknownStoredValue`] naming `$column`, after calling `$on_unknown($column)` when
/// given (a crate's logging and metric of undecodable values).
///
/// ```ignore
/// keel_store::text_column!(RunStatus, "durable_instance.status");
/// keel_store::text_column!(OperationKind, "operation.kind", name);
/// keel_store::text_column!(CommandKind, "durable_command.kind", as_str, crate::stored::unknown);
/// ```
///
/// The crate using it depends on `sqlx` (with the `postgres` feature) itself.
#[macro_export]
macro_rules! text_column {
    ($ty:ty, $column:expr) => {
        $crate::text_column!($ty, $column, as_str, |_: &'static str| {});
    };
    ($ty:ty, $column:expr, $text:ident) => {
        $crate::text_column!($ty, $column, $text, |_: &'static str| {});
    };
    ($ty:ty, $column:expr, $text:ident, $on_unknown:expr) => {
        impl ::sqlx::Type<::sqlx::Postgres> for $ty {
            fn type_info() -> ::sqlx::postgres::PgTypeInfo {
                <&str as ::sqlx::Type<::sqlx::Postgres>>::type_info()
            }

            fn compatible(ty: &::sqlx::postgres::PgTypeInfo) -> bool {
                <&str as ::sqlx::Type<::sqlx::Postgres>>::compatible(ty)
            }
        }

        impl ::sqlx::postgres::PgHasArrayType for $ty {
            fn array_type_info() -> ::sqlx::postgres::PgTypeInfo {
                <&str as ::sqlx::postgres::PgHasArrayType>::array_type_info()
            }
        }

        impl ::sqlx::Encode<'_, ::sqlx::Postgres> for $ty {
            fn encode_by_ref(
                &self,
                buf: &mut ::sqlx::postgres::PgArgumentBuffer,
            ) -> ::std::result::Result<::sqlx::encode::IsNull, ::sqlx::error::BoxDynError> {
                <&str as ::sqlx::Encode<'_, ::sqlx::Postgres>>::encode(self.$text(), buf)
            }
        }

        impl<'r> ::sqlx::Decode<'r, ::sqlx::Postgres> for $ty {
            fn decode(
                value: ::sqlx::postgres::PgValueRef<'r>,
            ) -> ::std::result::Result<Self, ::sqlx::error::BoxDynError> {
                let text = <&str as ::sqlx::Decode<'r, ::sqlx::Postgres>>::decode(value)?;
                match <$ty>::ALL.iter().copied().find(|v| v.$text() == text) {
                    Some(v) => Ok(v),
                    None => {
                        let on_unknown: fn(&'static str) = $on_unknown;
                        on_unknown($column);
                        Err(Box::new($crate::UnknownStoredValue { column: $column }))
                    }
                }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::UnknownStoredValue;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Colour {
        Red,
        Blue,
    }

    impl Colour {
        const ALL: [Colour; 2] = [Colour::Red, Colour::Blue];
        fn as_str(self) -> &'static str {
            match self {
                Colour::Red => "red",
                Colour::Blue => "blue",
            }
        }
    }

    crate::text_column!(Colour, "paint.colour");

    #[test]
    fn the_error_names_the_column_and_not_the_value() {
        let e = UnknownStoredValue {
            column: "paint.colour",
        };
        assert_eq!(
            e.to_string(),
            "paint.colour holds a value this build does not know"
        );
        assert_eq!(Colour::ALL.map(Colour::as_str), ["red", "blue"]);
    }
}
