//! The single error type of this crate.

use crate::chain::ChainId;
use crate::token::TokenRef;

/// Result alias used by every fallible function in this crate.
pub type Result<T> = std::result::Result<T, UnitsError>;

/// Everything that can go wrong when parsing, converting or combining units.
///
/// Messages are value-free: they never echo the caller's input string or an
/// amount. They may name schema facts (a token's decimals, the digit limit)
/// and identifiers (chain ids, token addresses), which are not payload.
/// Each variant has a stable machine-readable [`UnitsError::code`] that the
/// API layer can return to clients.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UnitsError {
    /// The input had a leading `-`. Amounts are unsigned. Code `AMOUNT_NEGATIVE`.
    #[error("amount must not be negative")]
    Negative,
    /// Rounding mode was [`crate::Rounding::Exact`] and the input had more
    /// fractional digits than the token's decimals (zeros included). Code `AMOUNT_PRECISION_LOSS`.
    #[error("amount has more fractional digits than the token's {decimals} decimals")]
    PrecisionLoss {
        /// The decimals of the unit the value was scaled to.
        decimals: u8,
    },
    /// The input is not a plain decimal (or `0x` hex, where allowed) string.
    /// `reason` is a fixed description of the rule broken. Code `AMOUNT_MALFORMED`.
    #[error("amount is malformed: {reason}")]
    Malformed {
        /// Which syntax rule the input broke (never the input itself).
        reason: &'static str,
    },
    /// More integer (or fractional) digits than any 256-bit value can need,
    /// rejected before any arithmetic. Code `AMOUNT_TOO_MANY_DIGITS`.
    #[error("amount has more than {max} digits in its integer or fractional part")]
    TooManyDigits {
        /// The limit that was exceeded.
        max: usize,
    },
    /// The result does not fit the target integer (U256 for amounts, u64 for
    /// chain ids). Also returned by checked addition/multiplication. Code `AMOUNT_OVERFLOW`.
    #[error("amount does not fit in the target integer type")]
    Overflow,
    /// A checked subtraction would go below zero. Code `AMOUNT_UNDERFLOW`.
    #[error("amount subtraction would go below zero")]
    Underflow,
    /// A value does not fit `rust_decimal::Decimal` (96-bit mantissa, scale at
    /// most 28). Code `AMOUNT_EXCEEDS_DECIMAL_RANGE`.
    #[error("amount does not fit in a 96-bit decimal")]
    ExceedsDecimalRange,
    /// Token decimals above [`crate::Decimals::MAX`] (36). Code `DECIMALS_OUT_OF_RANGE`.
    #[error("token decimals must be at most 36")]
    DecimalsOutOfRange,
    /// Two chain-bound values (gas prices, native amounts) of different
    /// EIP-155 chains were combined or compared. Code `CHAIN_MISMATCH`.
    #[error("values belong to different chains ({left} and {right})")]
    ChainMismatch {
        /// Chain of the left-hand operand.
        left: ChainId,
        /// Chain of the right-hand operand.
        right: ChainId,
    },
    /// Two token amounts of different tokens (chain, address or decimals
    /// differ) were combined or compared. Code `TOKEN_MISMATCH`.
    #[error("amounts belong to different tokens ({left} and {right})")]
    TokenMismatch {
        /// Token of the left-hand operand.
        left: TokenRef,
        /// Token of the right-hand operand.
        right: TokenRef,
    },
}

impl UnitsError {
    /// Stable, machine-readable code for this error, e.g. `"AMOUNT_OVERFLOW"`.
    /// Codes never change once published; new variants get new codes.
    pub const fn code(&self) -> &'static str {
        match self {
            Self::Negative => "AMOUNT_NEGATIVE",
            Self::PrecisionLoss { .. } => "AMOUNT_PRECISION_LOSS",
            Self::Malformed { .. } => "AMOUNT_MALFORMED",
            Self::TooManyDigits { .. } => "AMOUNT_TOO_MANY_DIGITS",
            Self::Overflow => "AMOUNT_OVERFLOW",
            Self::Underflow => "AMOUNT_UNDERFLOW",
            Self::ExceedsDecimalRange => "AMOUNT_EXCEEDS_DECIMAL_RANGE",
            Self::DecimalsOutOfRange => "DECIMALS_OUT_OF_RANGE",
            Self::ChainMismatch { .. } => "CHAIN_MISMATCH",
            Self::TokenMismatch { .. } => "TOKEN_MISMATCH",
        }
    }

    pub(crate) const fn malformed(reason: &'static str) -> Self {
        Self::Malformed { reason }
    }
}
