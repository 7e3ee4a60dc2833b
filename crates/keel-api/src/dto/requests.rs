//! Request bodies of the asset and token endpoints (`POST /v1/assets`, mint, burn,
//! transfer, roles, the empty body) and the integral-number deserializers.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/assets`: create an asset from one of the organization's templates. The
/// chain, price resolver and staleness bound come from the template, never from the
/// request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({
    "name": "Example Fund Share", "symbol": "EFS", "decimals": 18,
    "templateId": "default", "initialPrice": "1.25"
}))]
pub struct CreateAssetRequest {
    /// ERC-20 name, 1 to 64 printable (non-control) characters.
    #[schema(
        min_length = 1,
        max_length = 64,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$"
    )]
    pub name: String,
    /// ERC-20 symbol, 1 to 16 ASCII letters or digits.
    #[schema(min_length = 1, max_length = 16, pattern = "^[A-Za-z0-9]*$")]
    pub symbol: String,
    /// ERC-20 decimals, 0 to 36. An integral JSON number such as `6.0` is the integer
    /// it denotes (as JSON Schema reads it).
    #[schema(minimum = 0, maximum = 36)]
    #[serde(deserialize_with = "integral_u8")]
    pub decimals: u8,
    /// The id of one of the organization's asset templates.
    pub template_id: String,
    /// Initial price in quote units per token, as a **decimal string** (JSON numbers
    /// are refused): greater than zero, at most 78 digits before and after the point
    /// (the pattern). Two more rules depend on the named template and answer `422`:
    /// at most its price decimals of fractional digits, trailing zeros included
    /// (`AMOUNT_PRECISION_LOSS`), and
    /// the price in base units (times 10^price decimals) at most 2^127-1, the largest
    /// answer the feed holds (`INVALID_FIELD`).
    #[schema(
        pattern = r"^(?=[0-9.]*[1-9])[0-9]{1,78}(\.[0-9]{1,78})?$",
        example = "1.25"
    )]
    pub initial_price: String,
}

/// The integer a JSON number denotes when it has no fractional part (`25` and `25.0`
/// alike, as JSON Schema's `integer` reads them), if it is in `0..=u64::MAX`.
pub fn integral_u64(n: &serde_json::Number) -> Option<u64> {
    n.as_u64().or_else(|| {
        n.as_f64()
            .filter(|f| f.fract() == 0.0 && (0.0..u64::MAX as f64).contains(f))
            .map(|f| f as u64)
    })
}

/// Deserializes a `u8` from an integral JSON number ([`integral_u64`]).
fn integral_u8<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u8, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    integral_u64(&n)
        .and_then(|v| u8::try_from(v).ok())
        .ok_or_else(|| serde::de::Error::custom("must be an integer from 0 to 255"))
}

/// `POST /v1/assets/{id}/mint` and `/transfer`: move `amount` token units to
/// `recipient`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({
    "recipient": "0x70997970C51812dc3A010C7d01b50e0d17dc79C8", "amount": "12.5"
}))]
pub struct TokenAmountRequest {
    /// Receiver: `0x` and 40 hex digits (an EIP-55 checksum is verified when the
    /// digits are mixed-case); not the zero address.
    #[schema(pattern = "^0x(?=[0-9a-fA-F]{0,39}[1-9a-fA-F])[0-9a-fA-F]{40}$")]
    pub recipient: String,
    /// Token units as a **decimal string** (JSON numbers are refused): greater than
    /// zero, at most 78 digits before and after the point (the pattern). Two more rules
    /// depend on the asset and answer `422`: at most the token's decimals of fractional
    /// digits, trailing zeros included (`AMOUNT_PRECISION_LOSS`: `"1.0000000"` of a
    /// 6-decimals token is refused), and at most 2^256-1 base units
    /// (`AMOUNT_OVERFLOW`).
    #[schema(
        pattern = r"^(?=[0-9.]*[1-9])[0-9]{1,78}(\.[0-9]{1,78})?$",
        example = "12.5"
    )]
    pub amount: String,
}

/// `POST /v1/assets/{id}/burn`: burn `amount` token units of the issuer's own holdings,
/// or, with `from`, a forced burn (redemption) of that holder's tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({
    "amount": "12.5", "from": "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
}))]
pub struct BurnRequest {
    /// Token units as a **decimal string** (JSON numbers are refused): greater than
    /// zero, at most 78 digits before and after the point (the pattern). Two more rules
    /// depend on the asset and answer `422`: at most the token's decimals of fractional
    /// digits, trailing zeros included (`AMOUNT_PRECISION_LOSS`: `"1.0000000"` of a
    /// 6-decimals token is refused), and at most 2^256-1 base units
    /// (`AMOUNT_OVERFLOW`).
    #[schema(
        pattern = r"^(?=[0-9.]*[1-9])[0-9]{1,78}(\.[0-9]{1,78})?$",
        example = "12.5"
    )]
    pub amount: String,
    /// The holder whose tokens are burned (a forced burn: `AssetToken.forcedBurn`, which
    /// needs the issuer to hold the token's `burner` role — grant it with
    /// `POST /v1/assets/{id}/grant-role`; without it the operation fails
    /// `EXECUTION_REVERTED` with reason `AccessControlUnauthorizedAccount`). `0x` and 40
    /// hex digits (an EIP-55 checksum is verified when mixed-case); not the zero address.
    /// Absent or null: the issuer burns its own holdings (`AssetToken.burn`).
    #[schema(pattern = "^0x(?=[0-9a-fA-F]{0,39}[1-9a-fA-F])[0-9a-fA-F]{40}$")]
    #[serde(default)]
    pub from: Option<String>,
}

/// `POST /v1/assets/{id}/grant-role` and `/revoke-role`: grant `role` on the asset's
/// token to `account`, or revoke it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({
    "role": "minter", "account": "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
}))]
pub struct RoleRequest {
    /// The token role: `minter` (`MINTER_ROLE`: may mint), `pauser` (`PAUSER_ROLE`: may
    /// pause and unpause) or `burner` (`BURNER_ROLE`: may burn any holder's tokens; held
    /// by nobody until granted). Any other name is `422 UNKNOWN_ROLE`.
    #[schema(schema_with = role_schema)]
    pub role: String,
    /// The account that receives or loses the role: `0x` and 40 hex digits (an EIP-55
    /// checksum is verified when mixed-case); not the zero address.
    #[schema(pattern = "^0x(?=[0-9a-fA-F]{0,39}[1-9a-fA-F])[0-9a-fA-F]{40}$")]
    pub account: String,
}

/// The schema of [`RoleRequest::role`]: a string, one of the roles'
/// API names.
fn role_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(
            keel_workflows::TokenRole::ALL
                .iter()
                .map(|r| r.name())
                .collect::<Vec<_>>(),
        ))
        .description(Some(
            "The token role: `minter` (`MINTER_ROLE`: may mint), `pauser` (`PAUSER_ROLE`: \
             may pause and unpause) or `burner` (`BURNER_ROLE`: may burn any holder's \
             tokens; held by nobody until granted). Any other name is `422 UNKNOWN_ROLE`.",
        ))
        .examples(["minter"])
        .build()
}

/// The body of `pause`, `unpause`, `approve` and `reject`: empty, or `{}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EmptyRequest {}
