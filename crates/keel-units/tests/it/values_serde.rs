//! Typed values: checked arithmetic, chain/token binding, serde encodings.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cmp::Ordering;

use keel_units::{
    Address, ChainId, Decimals, GasPrice, NativeAmount, Rounding, TokenAmount, TokenRef, U256,
    UnitsError, Wei,
};
use rust_decimal::Decimal;
use serde_json::json;

const MAINNET: ChainId = ChainId(1);
const OPTIMISM: ChainId = ChainId(10);

fn usdc() -> TokenRef {
    TokenRef::new(
        MAINNET,
        Address::repeat_byte(0xaa),
        Decimals::new(6).unwrap(),
    )
}

fn gwei(chain: ChainId, n: u64) -> GasPrice {
    GasPrice::new(chain, U256::from(n) * U256::from(1_000_000_000u64))
}

#[test]
fn wei_arithmetic_is_checked() {
    let one = Wei::from(1u64);
    assert_eq!(Wei::from(2u64).checked_add(one).unwrap(), Wei::from(3u64));
    assert_eq!(
        Wei::new(U256::MAX).checked_add(one).unwrap_err(),
        UnitsError::Overflow
    );
    assert_eq!(Wei::from(2u64).checked_sub(one).unwrap(), one);
    let err = Wei::ZERO.checked_sub(one).unwrap_err();
    assert_eq!(
        (err.clone(), err.code()),
        (UnitsError::Underflow, "AMOUNT_UNDERFLOW")
    );
    assert_eq!(
        Wei::from(7u64).checked_mul_u64(3).unwrap(),
        Wei::from(21u64)
    );
    assert_eq!(
        Wei::new(U256::MAX).checked_mul_u64(2).unwrap_err(),
        UnitsError::Overflow
    );
}

#[test]
fn wei_ether_strings() {
    let w = Wei::from_ether_str("1.5", Rounding::Exact).unwrap();
    assert_eq!(w, Wei::from(1_500_000_000_000_000_000u64));
    assert_eq!(w.to_ether_string(), "1.5");
    assert_eq!("0x3e8".parse::<Wei>().unwrap(), Wei::from(1000u64));
}

#[test]
fn gas_prices_of_different_chains_do_not_mix() {
    let mismatch = UnitsError::ChainMismatch {
        left: MAINNET,
        right: OPTIMISM,
    };
    assert_eq!(
        gwei(MAINNET, 1).checked_add(gwei(OPTIMISM, 1)).unwrap_err(),
        mismatch
    );
    assert_eq!(
        gwei(MAINNET, 2).checked_sub(gwei(OPTIMISM, 1)).unwrap_err(),
        mismatch
    );
    let err = gwei(MAINNET, 1).try_cmp(&gwei(OPTIMISM, 1)).unwrap_err();
    assert_eq!(err.code(), "CHAIN_MISMATCH");
    assert_eq!(err, mismatch);
    assert_eq!(
        gwei(MAINNET, 1).checked_add(gwei(MAINNET, 2)).unwrap(),
        gwei(MAINNET, 3)
    );
    assert_eq!(
        gwei(MAINNET, 1).try_cmp(&gwei(MAINNET, 2)).unwrap(),
        Ordering::Less
    );
    assert_eq!(
        gwei(MAINNET, 1).checked_sub(gwei(MAINNET, 2)).unwrap_err(),
        UnitsError::Underflow
    );
}

#[test]
fn gas_fee_is_chain_bound_native_amount() {
    let fee = gwei(OPTIMISM, 2).fee_for_gas(21_000).unwrap();
    assert_eq!(
        fee,
        NativeAmount::new(OPTIMISM, Wei::from(42_000_000_000_000u64))
    );
    assert_eq!(
        GasPrice::new(MAINNET, U256::MAX)
            .fee_for_gas(2)
            .unwrap_err(),
        UnitsError::Overflow
    );
}

#[test]
fn native_amounts_of_different_chains_do_not_mix() {
    let a = NativeAmount::new(MAINNET, Wei::from(5u64));
    let b = NativeAmount::new(OPTIMISM, Wei::from(5u64));
    assert!(matches!(
        a.checked_add(b),
        Err(UnitsError::ChainMismatch { .. })
    ));
    assert!(matches!(
        a.checked_sub(b),
        Err(UnitsError::ChainMismatch { .. })
    ));
    assert!(matches!(
        a.try_cmp(&b),
        Err(UnitsError::ChainMismatch { .. })
    ));
    assert_eq!(a.checked_add(a).unwrap().wei, Wei::from(10u64));
}

#[test]
fn token_amounts_of_different_tokens_do_not_mix() {
    let a = TokenAmount::from_decimal_str("1", usdc(), Rounding::Exact).unwrap();
    let other_addr = TokenRef {
        address: Address::repeat_byte(0xbb),
        ..usdc()
    };
    let other_dec = TokenRef {
        decimals: Decimals::new(18).unwrap(),
        ..usdc()
    };
    let other_chain = TokenRef {
        chain: OPTIMISM,
        ..usdc()
    };
    for t in [other_addr, other_dec, other_chain] {
        let b = TokenAmount::from_base_units(t, U256::from(1u64));
        let err = a.checked_add(&b).unwrap_err();
        assert_eq!(
            err,
            UnitsError::TokenMismatch {
                left: usdc(),
                right: t
            }
        );
        assert_eq!(err.code(), "TOKEN_MISMATCH");
        assert!(matches!(
            a.checked_sub(&b),
            Err(UnitsError::TokenMismatch { .. })
        ));
        assert!(matches!(
            a.try_cmp(&b),
            Err(UnitsError::TokenMismatch { .. })
        ));
    }
    let half = TokenAmount::from_decimal_str("0.5", usdc(), Rounding::Exact).unwrap();
    assert_eq!(a.checked_add(&half).unwrap().to_decimal_string(), "1.5");
    assert_eq!(a.checked_sub(&half).unwrap().to_string(), "0.5");
    assert_eq!(half.checked_sub(&a).unwrap_err(), UnitsError::Underflow);
    assert_eq!(a.try_cmp(&half).unwrap(), Ordering::Greater);
}

#[test]
fn token_amount_decimal_conversions() {
    let a = TokenAmount::from_decimal_str("100.5", usdc(), Rounding::Exact).unwrap();
    assert_eq!(a.base_units(), U256::from(100_500_000u64));
    assert_eq!(a.to_decimal().unwrap(), Decimal::new(1005, 1));
    let back =
        TokenAmount::from_decimal(Decimal::new(100_500, 3), usdc(), Rounding::Exact).unwrap();
    assert_eq!(back, a);
    assert_eq!(
        TokenAmount::from_decimal(Decimal::new(-1, 0), usdc(), Rounding::Exact).unwrap_err(),
        UnitsError::Negative
    );
    let tiny = TokenAmount::from_base_units(
        TokenRef {
            decimals: Decimals::new(36).unwrap(),
            ..usdc()
        },
        U256::from(1),
    );
    assert_eq!(
        tiny.to_decimal().unwrap_err().code(),
        "AMOUNT_EXCEEDS_DECIMAL_RANGE"
    );
    let huge = TokenAmount::from_base_units(usdc(), U256::MAX);
    assert_eq!(
        huge.to_decimal().unwrap_err(),
        UnitsError::ExceedsDecimalRange
    );
}

#[test]
fn integers_serialize_as_decimal_strings() {
    assert_eq!(
        serde_json::to_value(
            Wei::from(10u64)
                .checked_mul_u64(100_000_000_000_000_000)
                .unwrap()
        )
        .unwrap(),
        json!("1000000000000000000")
    );
    assert_eq!(serde_json::to_value(MAINNET).unwrap(), json!("1"));
    assert_eq!(
        serde_json::to_value(Wei::new(U256::MAX)).unwrap(),
        json!(U256::MAX.to_string())
    );
    assert_eq!(
        serde_json::to_value(gwei(MAINNET, 30)).unwrap(),
        json!({"chain_id": "1", "wei_per_gas": "30000000000"})
    );
    assert_eq!(
        serde_json::to_value(NativeAmount::new(OPTIMISM, Wei::from(5u64))).unwrap(),
        json!({"chain_id": "10", "wei": "5"})
    );
}

#[test]
fn integers_decode_from_decimal_hex_and_legacy_number() {
    for v in [json!("1000"), json!("0x3e8"), json!(1000)] {
        assert_eq!(
            serde_json::from_value::<Wei>(v.clone()).unwrap(),
            Wei::from(1000u64),
            "{v}"
        );
        assert_eq!(serde_json::from_value::<ChainId>(v).unwrap(), ChainId(1000));
    }
    let g: GasPrice =
        serde_json::from_value(json!({"chain_id": 1, "wei_per_gas": "0x6fc23ac00"})).unwrap();
    assert_eq!(g, gwei(MAINNET, 30));
    let max = Wei::new(U256::MAX);
    assert_eq!(
        serde_json::from_str::<Wei>(&serde_json::to_string(&max).unwrap()).unwrap(),
        max
    );
}

#[test]
fn integer_decoding_rejects_floats_negatives_and_overflow() {
    let float = serde_json::from_value::<Wei>(json!(1.5))
        .unwrap_err()
        .to_string();
    assert!(float.contains("floating-point"), "{float}");
    assert!(serde_json::from_value::<ChainId>(json!(1.0)).is_err());
    let neg = serde_json::from_value::<Wei>(json!(-1))
        .unwrap_err()
        .to_string();
    assert!(neg.contains("negative"), "{neg}");
    assert!(serde_json::from_value::<Wei>(json!("1.0")).is_err());
    assert!(serde_json::from_value::<Wei>(json!("")).is_err());
    let over = serde_json::from_value::<ChainId>(json!("18446744073709551616"))
        .unwrap_err()
        .to_string();
    assert!(
        over.contains("does not fit") && !over.contains("18446744073709551616"),
        "{over}"
    );
    assert_eq!("0xa".parse::<ChainId>().unwrap(), OPTIMISM);
}

#[test]
fn token_amount_serde_round_trip_and_shape() {
    let a = TokenAmount::from_decimal_str("100.5", usdc(), Rounding::Exact).unwrap();
    let v = serde_json::to_value(a).unwrap();
    let addr = format!("0x{}", "aa".repeat(20));
    assert_eq!(
        v,
        json!({"token": {"chain_id": "1", "address": addr, "decimals": 6}, "amount": "100.5"})
    );
    assert_eq!(serde_json::from_value::<TokenAmount>(v).unwrap(), a);
    let legacy = json!({"token": {"chain_id": 1, "address": addr, "decimals": 6}, "amount": 100});
    assert_eq!(
        serde_json::from_value::<TokenAmount>(legacy)
            .unwrap()
            .to_decimal_string(),
        "100"
    );
}

#[test]
fn token_amount_decoding_is_strict() {
    let addr = format!("0x{}", "aa".repeat(20));
    let with = |amount: serde_json::Value, decimals: serde_json::Value| {
        serde_json::from_value::<TokenAmount>(json!({
            "token": {"chain_id": "1", "address": addr, "decimals": decimals}, "amount": amount
        }))
    };
    let lossy = with(json!("1.0000001"), json!(6)).unwrap_err().to_string();
    assert!(
        lossy.contains("6 decimals") && !lossy.contains("1.0000001"),
        "{lossy}"
    );
    assert!(
        with(json!(100.5), json!(6))
            .unwrap_err()
            .to_string()
            .contains("floating-point")
    );
    assert!(
        with(json!("-1"), json!(6))
            .unwrap_err()
            .to_string()
            .contains("negative")
    );
    assert!(
        with(json!("1"), json!(37))
            .unwrap_err()
            .to_string()
            .contains("at most 36")
    );
    assert!(with(json!("1"), json!(36)).is_ok());
}

#[test]
fn serde_u256_helper_for_raw_fields() {
    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Row {
        #[serde(with = "keel_units::serde_u256")]
        base_units: U256,
    }
    let row = Row {
        base_units: U256::from(42u64),
    };
    assert_eq!(
        serde_json::to_value(&row).unwrap(),
        json!({"base_units": "42"})
    );
    assert_eq!(
        serde_json::from_value::<Row>(json!({"base_units": "0x2a"})).unwrap(),
        row
    );
}

#[test]
fn every_error_has_a_stable_code() {
    let codes = [
        (UnitsError::Negative, "AMOUNT_NEGATIVE"),
        (
            UnitsError::PrecisionLoss { decimals: 6 },
            "AMOUNT_PRECISION_LOSS",
        ),
        (UnitsError::Malformed { reason: "x" }, "AMOUNT_MALFORMED"),
        (
            UnitsError::TooManyDigits { max: 78 },
            "AMOUNT_TOO_MANY_DIGITS",
        ),
        (UnitsError::Overflow, "AMOUNT_OVERFLOW"),
        (UnitsError::Underflow, "AMOUNT_UNDERFLOW"),
        (
            UnitsError::ExceedsDecimalRange,
            "AMOUNT_EXCEEDS_DECIMAL_RANGE",
        ),
        (UnitsError::DecimalsOutOfRange, "DECIMALS_OUT_OF_RANGE"),
        (
            UnitsError::ChainMismatch {
                left: MAINNET,
                right: OPTIMISM,
            },
            "CHAIN_MISMATCH",
        ),
        (
            UnitsError::TokenMismatch {
                left: usdc(),
                right: usdc(),
            },
            "TOKEN_MISMATCH",
        ),
    ];
    for (err, code) in codes {
        assert_eq!(err.code(), code);
    }
}
