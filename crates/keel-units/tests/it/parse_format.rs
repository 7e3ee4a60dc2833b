//! Decimal string <-> base unit conversion: syntax, limits, rounding, round trips.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use keel_units::{
    Decimals, MAX_DIGITS, Rounding, U256, UnitsError, format_units, parse_integer, parse_units,
};
use proptest::prelude::*;

const U256_MAX_DEC: &str =
    "115792089237316195423570985008687907853269984665640564039457584007913129639935";
const U256_MAX_PLUS_ONE: &str =
    "115792089237316195423570985008687907853269984665640564039457584007913129639936";

fn d(n: u8) -> Decimals {
    Decimals::new(n).unwrap()
}

fn parse(s: &str, dec: u8, r: Rounding) -> keel_units::Result<U256> {
    parse_units(s, d(dec), r)
}

fn arb_u256() -> impl Strategy<Value = U256> {
    prop_oneof![
        any::<[u64; 4]>().prop_map(U256::from_limbs),
        any::<u64>().prop_map(U256::from),
        Just(U256::ZERO),
        Just(U256::MAX),
    ]
}

proptest! {
    #[test]
    fn format_then_parse_exact_round_trips(v in arb_u256(), dec in 0u8..=36) {
        let s = format_units(v, d(dec));
        prop_assert_eq!(parse(&s, dec, Rounding::Exact)?, v);
    }

    #[test]
    fn format_is_canonical(v in arb_u256(), dec in 0u8..=36) {
        let s = format_units(v, d(dec));
        if let Some((int, frac)) = s.split_once('.') {
            prop_assert!(!frac.is_empty() && !frac.ends_with('0'), "trailing zero in {}", s);
            prop_assert!(int == "0" || !int.starts_with('0'));
        } else {
            prop_assert!(s == "0" || !s.starts_with('0'));
        }
    }

    #[test]
    fn arbitrary_input_never_panics(s in "\\PC{0,100}|[-+0-9.eE x]{0,100}", dec in 0u8..=36) {
        for r in [Rounding::Exact, Rounding::Down, Rounding::Up, Rounding::HalfEven] {
            let _ = parse(&s, dec, r);
        }
        let _ = parse_integer(&s);
    }

    #[test]
    fn up_is_down_or_down_plus_one(int in 0u64.., frac in "[0-9]{1,20}", dec in 0u8..=12) {
        let s = format!("{int}.{frac}");
        let down = parse(&s, dec, Rounding::Down)?;
        let up = parse(&s, dec, Rounding::Up)?;
        let half = parse(&s, dec, Rounding::HalfEven)?;
        let lossy = frac.len() > usize::from(dec) && frac.bytes().skip(usize::from(dec)).any(|b| b != b'0');
        prop_assert_eq!(up, if lossy { down + U256::from(1) } else { down });
        prop_assert!(half == down || half == up);
        // Exact refuses every fractional digit beyond the decimals, zeros included.
        prop_assert_eq!(parse(&s, dec, Rounding::Exact).is_err(), frac.len() > usize::from(dec));
    }
}

#[test]
fn formats_known_values() {
    assert_eq!(format_units(U256::ZERO, d(18)), "0");
    assert_eq!(format_units(U256::ZERO, d(0)), "0");
    assert_eq!(format_units(U256::from(100_500_000u64), d(6)), "100.5");
    assert_eq!(format_units(U256::from(1_000_000u64), d(6)), "1");
    assert_eq!(
        format_units(U256::from(1u64), d(18)),
        "0.000000000000000001"
    );
    assert_eq!(format_units(U256::from(1234u64), d(0)), "1234");
    assert_eq!(format_units(U256::MAX, d(0)), U256_MAX_DEC);
}

#[test]
fn parses_known_values() {
    let e18 = U256::from(10u64).pow(U256::from(18));
    assert_eq!(
        parse("100.5", 18, Rounding::Exact).unwrap(),
        U256::from(1005u64) * e18 / U256::from(10)
    );
    assert_eq!(
        parse("0.5", 6, Rounding::Exact).unwrap(),
        U256::from(500_000u64)
    );
    assert_eq!(
        parse("5", 6, Rounding::Exact).unwrap(),
        U256::from(5_000_000u64)
    );
    assert_eq!(parse("007", 0, Rounding::Exact).unwrap(), U256::from(7u64));
    assert_eq!(
        parse("1.500000", 6, Rounding::Exact).unwrap(),
        U256::from(1_500_000u64),
        "zeros up to the decimals are exact"
    );
    assert_eq!(
        parse("1.500000000", 6, Rounding::Down).unwrap(),
        U256::from(1_500_000u64),
        "a zero tail rounds to itself"
    );
    assert_eq!(parse(U256_MAX_DEC, 0, Rounding::Exact).unwrap(), U256::MAX);
}

#[test]
fn rejects_malformed_syntax() {
    for s in [
        "", ".5", "5.", "+5", "1e3", "1E3", " 5", "5 ", "1.2.3", "abc", "1_000", "0x10", "1,5", ".",
    ] {
        let err = parse(s, 6, Rounding::Exact).unwrap_err();
        assert!(
            matches!(err, UnitsError::Malformed { .. }),
            "{s:?} gave {err:?}"
        );
        assert_eq!(err.code(), "AMOUNT_MALFORMED");
    }
}

#[test]
fn rejects_negative_input() {
    for s in ["-1", "-0.5", "-0"] {
        let err = parse(s, 6, Rounding::Down).unwrap_err();
        assert_eq!(err, UnitsError::Negative, "{s:?}");
        assert_eq!(err.code(), "AMOUNT_NEGATIVE");
    }
    assert_eq!(parse_integer("-5").unwrap_err(), UnitsError::Negative);
}

#[test]
fn rejects_values_above_u256_max() {
    let cases = [
        (U256_MAX_PLUS_ONE, 0),
        (U256_MAX_DEC, 1),
        (&*"9".repeat(78), 0),
        ("1", 36),
    ];
    for (s, dec) in &cases[..3] {
        let err = parse(s, *dec, Rounding::Exact).unwrap_err();
        assert_eq!(err, UnitsError::Overflow, "{s} @ {dec}");
        assert_eq!(err.code(), "AMOUNT_OVERFLOW");
    }
    // 1 with 36 decimals is 10^36, well inside U256.
    assert!(parse(cases[3].0, cases[3].1, Rounding::Exact).is_ok());
    // Rounding up past U256::MAX overflows instead of wrapping.
    let s = format!("{U256_MAX_DEC}.9");
    assert_eq!(
        parse(&s, 0, Rounding::Up).unwrap_err(),
        UnitsError::Overflow
    );
    assert_eq!(parse(&s, 0, Rounding::Down).unwrap(), U256::MAX);
    assert_eq!(
        parse_integer(U256_MAX_PLUS_ONE).unwrap_err(),
        UnitsError::Overflow
    );
}

#[test]
fn rejects_more_than_78_digits_before_arithmetic() {
    let int79 = format!("1{}", "0".repeat(78));
    let err = parse(&int79, 0, Rounding::Exact).unwrap_err();
    assert_eq!(err, UnitsError::TooManyDigits { max: MAX_DIGITS });
    assert_eq!(err.code(), "AMOUNT_TOO_MANY_DIGITS");
    // Leading zeros count: the limit is on raw input length.
    assert!(matches!(
        parse(&format!("0{}", "0".repeat(78)), 0, Rounding::Exact),
        Err(UnitsError::TooManyDigits { .. })
    ));
    let frac79 = format!("0.{}", "1".repeat(79));
    assert!(matches!(
        parse(&frac79, 6, Rounding::Down),
        Err(UnitsError::TooManyDigits { .. })
    ));
    assert!(matches!(
        parse_integer(&int79),
        Err(UnitsError::TooManyDigits { .. })
    ));
}

#[test]
fn decimals_accepts_36_rejects_37() {
    assert_eq!(Decimals::new(36).unwrap().get(), 36);
    let err = Decimals::new(37).unwrap_err();
    assert_eq!(err, UnitsError::DecimalsOutOfRange);
    assert_eq!(err.code(), "DECIMALS_OUT_OF_RANGE");
    assert!(Decimals::try_from(255u8).is_err());
    let s = format!("1.{}1", "0".repeat(35));
    let v = parse(&s, 36, Rounding::Exact).unwrap();
    assert_eq!(v, U256::from(10u64).pow(U256::from(36)) + U256::from(1));
    assert_eq!(format_units(v, d(36)), s);
}

#[test]
fn rounding_modes_on_1_23456789_with_6_decimals() {
    let s = "1.23456789";
    let err = parse(s, 6, Rounding::Exact).unwrap_err();
    assert_eq!(err, UnitsError::PrecisionLoss { decimals: 6 });
    assert_eq!(err.code(), "AMOUNT_PRECISION_LOSS");
    assert_eq!(
        parse(s, 6, Rounding::Down).unwrap(),
        U256::from(1_234_567u64)
    );
    assert_eq!(parse(s, 6, Rounding::Up).unwrap(), U256::from(1_234_568u64));
    assert_eq!(
        parse(s, 6, Rounding::HalfEven).unwrap(),
        U256::from(1_234_568u64)
    );
    assert_eq!(
        parse("1.23456712", 6, Rounding::HalfEven).unwrap(),
        U256::from(1_234_567u64)
    );
}

#[test]
fn half_even_ties_go_to_even() {
    assert_eq!(
        parse("0.0000025", 6, Rounding::HalfEven).unwrap(),
        U256::from(2u64)
    );
    assert_eq!(
        parse("0.0000035", 6, Rounding::HalfEven).unwrap(),
        U256::from(4u64)
    );
    assert_eq!(
        parse("0.00000250", 6, Rounding::HalfEven).unwrap(),
        U256::from(2u64)
    );
    assert_eq!(
        parse("0.00000251", 6, Rounding::HalfEven).unwrap(),
        U256::from(3u64)
    );
    assert_eq!(
        parse("2.5", 0, Rounding::HalfEven).unwrap(),
        U256::from(2u64)
    );
}

#[test]
fn parse_integer_accepts_decimal_and_hex() {
    assert_eq!(parse_integer("1000").unwrap(), U256::from(1000u64));
    assert_eq!(parse_integer("0x3e8").unwrap(), U256::from(1000u64));
    assert_eq!(parse_integer("0X3E8").unwrap(), U256::from(1000u64));
    assert_eq!(parse_integer("0x0").unwrap(), U256::ZERO);
    assert_eq!(
        parse_integer(&format!("0x{}", "f".repeat(64))).unwrap(),
        U256::MAX
    );
    assert_eq!(
        parse_integer(&format!("0x00{}", "f".repeat(64))).unwrap(),
        U256::MAX
    );
    assert_eq!(
        parse_integer(&format!("0x1{}", "0".repeat(64))).unwrap_err(),
        UnitsError::Overflow
    );
    for s in ["0x", "0xg1", "1.0", "", " 1", "+1"] {
        assert!(
            matches!(parse_integer(s), Err(UnitsError::Malformed { .. })),
            "{s:?}"
        );
    }
}

#[test]
fn error_messages_do_not_echo_input() {
    let inputs = [
        "-98765",
        "98765.4321x",
        "98765.43219876",
        U256_MAX_PLUS_ONE,
        "0x98765zz",
    ];
    for s in inputs {
        let err = parse(s, 2, Rounding::Exact)
            .or_else(|_| parse_integer(s))
            .unwrap_err();
        let msg = err.to_string();
        assert!(!msg.contains("98765") && !msg.contains("1157920"), "{msg}");
    }
}
