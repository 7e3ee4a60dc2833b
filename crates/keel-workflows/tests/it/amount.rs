//! Amount and price parsing edge cases (`keel_workflows::ops::amount`).

use alloy::primitives::U256;
use keel_workflows::OpsError;
use keel_workflows::ops::amount::{above_threshold, format_amount, price_answer, token_amount};

fn code(r: Result<U256, OpsError>) -> &'static str {
    match r {
        Ok(_) => "OK",
        Err(e) => e.code(),
    }
}

#[test]
fn token_amounts_are_exact_and_positive() {
    assert_eq!(
        token_amount("1.5", 6, "amount").unwrap(),
        U256::from(1_500_000u64)
    );
    assert_eq!(
        token_amount("0.000001", 6, "amount").unwrap(),
        U256::from(1u64)
    );
    assert_eq!(token_amount("7", 0, "amount").unwrap(), U256::from(7u64));
    // More fractional digits than the token has: refused, never rounded.
    assert_eq!(
        code(token_amount("0.0000001", 6, "amount")),
        "AMOUNT_PRECISION_LOSS"
    );
    assert_eq!(
        code(token_amount("1.5", 0, "amount")),
        "AMOUNT_PRECISION_LOSS"
    );
    // Zero in any spelling is not an amount.
    for zero in ["0", "0.0", "0.000000"] {
        let e = token_amount(zero, 6, "amount").unwrap_err();
        assert!(
            matches!(
                e,
                OpsError::InvalidField {
                    field: "amount",
                    ..
                }
            ),
            "{zero}: {e:?}"
        );
    }
    assert_eq!(code(token_amount("-1", 6, "amount")), "AMOUNT_NEGATIVE");
    for bad in ["", "abc", "1e5", "1,5", " 1", "0x10", "1.2.3"] {
        assert_eq!(
            code(token_amount(bad, 6, "amount")),
            "AMOUNT_MALFORMED",
            "{bad:?}"
        );
    }
    assert_eq!(
        code(token_amount("1", 37, "amount")),
        "DECIMALS_OUT_OF_RANGE"
    );
    // The largest base-unit value fits; one more does not.
    let max = U256::MAX.to_string();
    assert_eq!(token_amount(&max, 0, "amount").unwrap(), U256::MAX);
    let above = format!("{max}0");
    assert_ne!(code(token_amount(&above, 0, "amount")), "OK");
    // The field is named, the value is not.
    let e = token_amount("SECRET-1", 6, "amount").unwrap_err();
    assert!(!e.to_string().contains("SECRET"), "{e}");
}

#[test]
fn price_answers_fit_a_signed_feed_answer() {
    assert_eq!(price_answer("1.25", 8).unwrap(), U256::from(125_000_000u64));
    let max = i128::MAX.to_string();
    assert_eq!(
        price_answer(&max, 0).unwrap(),
        U256::from(i128::MAX as u128)
    );
    let above = (i128::MAX as u128 + 1).to_string();
    let e = price_answer(&above, 0).unwrap_err();
    assert!(
        matches!(
            e,
            OpsError::InvalidField {
                field: "initialPrice",
                ..
            }
        ),
        "{e:?}"
    );
    let e = price_answer("0", 8).unwrap_err();
    assert!(
        matches!(
            e,
            OpsError::InvalidField {
                field: "initialPrice",
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        code(price_answer("1.123456789", 8)),
        "AMOUNT_PRECISION_LOSS"
    );
    assert_eq!(code(price_answer("-1", 8)), "AMOUNT_NEGATIVE");
}

#[test]
fn thresholds_compare_in_base_units() {
    let amount = |s| token_amount(s, 6, "amount").unwrap();
    assert!(
        !above_threshold(amount("1000"), "1000", 6).unwrap(),
        "equal is not above"
    );
    assert!(above_threshold(amount("1000.000001"), "1000", 6).unwrap());
    // A threshold finer than the token rounds down to what the token can express.
    assert!(!above_threshold(amount("1000"), "1000.0000009", 6).unwrap());
    assert!(above_threshold(amount("1000.000001"), "1000.0000009", 6).unwrap());
    assert!(above_threshold(amount("0.000001"), "0", 6).unwrap());
}

#[test]
fn amounts_format_back_with_the_token_decimals() {
    assert_eq!(format_amount(U256::from(1_500_000u64), 6).unwrap(), "1.5");
    assert_eq!(format_amount(U256::ZERO, 6).unwrap(), "0");
    assert_eq!(format_amount(U256::from(7u64), 0).unwrap(), "7");
    assert_eq!(
        format_amount(U256::from(1u64), 37).unwrap_err().code(),
        "DECIMALS_OUT_OF_RANGE"
    );
}
