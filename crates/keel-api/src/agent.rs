//! The agent operations of regulated assets (issue 37 §3, ERC-3643 style): freeze and
//! unfreeze an address or part of a balance, forced transfer, wallet recovery, batch
//! mint and batch transfer. Each route starts one operation of the asset (one at a
//! time per asset, in acceptance order), with the same idempotency, approval and
//! `Prefer: wait` rules as every operation-creating `POST`. Only an asset created
//! through an organization system has these controls (`409 ASSET_NOT_REGULATED`).
//!
//! A write the token refuses fails the operation with a typed `error.code`:
//! `ADDRESS_FROZEN`, `INSUFFICIENT_UNFROZEN_BALANCE`, `INVALID_FROZEN_AMOUNT`,
//! `INVALID_BATCH` ([`keel_workflows::compliance::decode_agent_error`]) or a
//! `COMPLIANCE_*` code.

use crate::ApiState;
use crate::extract::{
    Authed, Field, FieldKind, IdempotencyKey, JsonBody, PreferWait, RawPath, RequestBody,
    parse_address,
};
use crate::handlers::{TokenOpAnswers, WriteErrors, token_op};
use crate::problem::Problem;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use keel_workflows::{BatchRecipient, TokenRequest};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The most elements of a batch body's lists the API reads (a template's
/// `batchMaxRecipients` is at most this; above the template's own limit a batch is
/// `422 BATCH_TOO_LARGE`).
pub const MAX_BATCH_ITEMS: usize = 500;

/// The body of `POST /v1/assets/{id}/freeze` and `/unfreeze`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FreezeRequest {
    /// The address: `0x` and 40 hex digits (an EIP-55 checksum is verified when
    /// mixed-case); not the zero address.
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub account: String,
    /// Token units as a decimal string: freeze (or release) this much of the holder's
    /// balance. Absent or null: freeze (or unfreeze) the whole address, which can then
    /// neither send nor receive.
    #[schema(pattern = r"^[0-9]{1,78}(\.[0-9]{1,78})?$", example = "25")]
    #[serde(default)]
    pub amount: Option<String>,
}

impl RequestBody for FreezeRequest {
    const FIELDS: &'static [Field] = &[
        Field {
            name: "account",
            kind: FieldKind::Address,
        },
        Field {
            name: "amount",
            kind: FieldKind::Decimal,
        },
    ];
    const OPTIONAL: &'static [&'static str] = &["amount"];
}

/// The body of `POST /v1/assets/{id}/forced-transfer`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ForcedTransferRequest {
    /// The holder whose tokens move (not the zero address).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub from: String,
    /// The receiver (not the zero address, not `from`).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub recipient: String,
    /// Token units as a decimal string, at most the token's decimals.
    #[schema(pattern = r"^[0-9]{1,78}(\.[0-9]{1,78})?$", example = "10")]
    pub amount: String,
}

impl RequestBody for ForcedTransferRequest {
    const FIELDS: &'static [Field] = &[
        Field {
            name: "from",
            kind: FieldKind::Address,
        },
        Field {
            name: "recipient",
            kind: FieldKind::Address,
        },
        Field {
            name: "amount",
            kind: FieldKind::Decimal,
        },
    ];
}

/// The body of `POST /v1/assets/{id}/recover`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RecoverRequest {
    /// The lost wallet (not the zero address).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub lost_wallet: String,
    /// The investor's new wallet (not the zero address, not `lostWallet`).
    #[schema(pattern = "^0x[0-9a-fA-F]{40}$")]
    pub new_wallet: String,
}

impl RequestBody for RecoverRequest {
    const FIELDS: &'static [Field] = &[
        Field {
            name: "lostWallet",
            kind: FieldKind::Address,
        },
        Field {
            name: "newWallet",
            kind: FieldKind::Address,
        },
    ];
}

/// The body of `POST /v1/assets/{id}/batch-mint` and `/batch-transfer`: two lists of the
/// same length, as the contract's `batchMint(to[], amounts[])` takes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BatchRequest {
    /// The receivers, 1 to the template's `batchMaxRecipients` (at most 500); none the
    /// zero address.
    #[schema(max_items = 500, min_items = 1)]
    pub recipients: Vec<String>,
    /// `amounts[i]` token units (decimal strings) go to `recipients[i]`.
    #[schema(max_items = 500, min_items = 1)]
    pub amounts: Vec<String>,
}

impl RequestBody for BatchRequest {
    const FIELDS: &'static [Field] = &[
        Field {
            name: "recipients",
            kind: FieldKind::TextList {
                max_items: MAX_BATCH_ITEMS,
            },
        },
        Field {
            name: "amounts",
            kind: FieldKind::TextList {
                max_items: MAX_BATCH_ITEMS,
            },
        },
    ];
}

fn invalid(field: &str, reason: &str) -> Problem {
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "INVALID_FIELD",
        format!("field `{field}`: {reason}"),
    )
}

fn freeze_request(body: FreezeRequest, freeze: bool) -> Result<TokenRequest, Problem> {
    let account = parse_address(&body.account, "account")?;
    Ok(if freeze {
        TokenRequest::Freeze {
            account,
            amount: body.amount,
        }
    } else {
        TokenRequest::Unfreeze {
            account,
            amount: body.amount,
        }
    })
}

fn batch_lines(body: BatchRequest) -> Result<Vec<BatchRecipient>, Problem> {
    if body.recipients.len() != body.amounts.len() {
        return Err(invalid(
            "amounts",
            "must have as many elements as `recipients`",
        ));
    }
    body.recipients
        .iter()
        .zip(body.amounts)
        .map(|(to, amount)| {
            Ok(BatchRecipient {
                to: parse_address(to, "recipients")?,
                amount,
            })
        })
        .collect()
}

/// Freeze an address, or part of a holder's balance.
///
/// Starts `asset.freeze`: without `amount`, `RegulatedToken.setAddressFrozen(account,
/// true)` (the address can neither send nor receive); with `amount`,
/// `freezePartialTokens` (that much more of its balance cannot move; the total frozen
/// may not exceed the balance, else the operation fails `INVALID_FROZEN_AMOUNT`). A
/// freeze never waits for an approval. The holders page shows frozen amounts.
#[utoipa::path(
    post,
    path = "/v1/assets/{id}/freeze",
    tag = "assets",
    operation_id = "freeze",
    request_body(content = FreezeRequest, content_type = "application/json"),
    params(
        ("id" = Uuid, Path, description = "Asset id"),
        ("Idempotency-Key" = String, Header, description = "Required. 1 to 255 printable characters."),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(TokenOpAnswers, WriteErrors),
    security(("bearer" = []))
)]
pub(crate) async fn freeze(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    IdempotencyKey(key): IdempotencyKey,
    PreferWait(wait): PreferWait,
    JsonBody(body): JsonBody<FreezeRequest>,
) -> Result<Response, Problem> {
    let req = freeze_request(body, true)?;
    token_op(&state, caller, &id, &key, wait, req).await
}

/// Unfreeze an address, or release part of a holder's frozen balance.
///
/// Starts `asset.unfreeze`: without `amount`, `setAddressFrozen(account, false)`; with
/// `amount`, `unfreezePartialTokens` (more than is frozen fails
/// `INVALID_FROZEN_AMOUNT`). When the template sets a mint approval threshold, every
/// unfreeze waits for an approval (it releases tokens).
#[utoipa::path(
    post,
    path = "/v1/assets/{id}/unfreeze",
    tag = "assets",
    operation_id = "unfreeze",
    request_body(content = FreezeRequest, content_type = "application/json"),
    params(
        ("id" = Uuid, Path, description = "Asset id"),
        ("Idempotency-Key" = String, Header, description = "Required. 1 to 255 printable characters."),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(TokenOpAnswers, WriteErrors),
    security(("bearer" = []))
)]
pub(crate) async fn unfreeze(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    IdempotencyKey(key): IdempotencyKey,
    PreferWait(wait): PreferWait,
    JsonBody(body): JsonBody<FreezeRequest>,
) -> Result<Response, Problem> {
    let req = freeze_request(body, false)?;
    token_op(&state, caller, &id, &key, wait, req).await
}

/// Move a holder's tokens without its consent.
///
/// Starts `asset.forced-transfer`: `RegulatedToken.forcedTransfer(from, recipient,
/// amount, enforceCompliance)`, frozen tokens of `from` released as needed (a frozen
/// address moves too). The asset's compliance rules judge the receiver (checked before
/// acceptance, `422 COMPLIANCE_*`, and on chain) unless the template sets
/// `forcedTransferSkipsCompliance`. Above the template's mint approval threshold it
/// waits for an approval.
#[utoipa::path(
    post,
    path = "/v1/assets/{id}/forced-transfer",
    tag = "assets",
    operation_id = "forcedTransfer",
    request_body(content = ForcedTransferRequest, content_type = "application/json"),
    params(
        ("id" = Uuid, Path, description = "Asset id"),
        ("Idempotency-Key" = String, Header, description = "Required. 1 to 255 printable characters."),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(TokenOpAnswers, WriteErrors),
    security(("bearer" = []))
)]
pub(crate) async fn forced_transfer(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    IdempotencyKey(key): IdempotencyKey,
    PreferWait(wait): PreferWait,
    JsonBody(body): JsonBody<ForcedTransferRequest>,
) -> Result<Response, Problem> {
    let req = TokenRequest::ForcedTransfer {
        from: parse_address(&body.from, "from")?,
        recipient: parse_address(&body.recipient, "recipient")?,
        amount: body.amount,
    };
    token_op(&state, caller, &id, &key, wait, req).await
}

/// Recover a lost wallet.
///
/// Starts `asset.recover`: when the lost wallet is registered in the organization
/// system's registry, its entry is copied to the new wallet (`copy-investor`); then
/// `RegulatedToken.recoveryAddress(lostWallet, newWallet)` moves the whole balance, the
/// frozen amount and the frozen flag (`recover`); then the lost wallet's entry is
/// removed (`remove-investor`). Each write is sent exactly once, whatever restarts in
/// between. When the template sets a mint approval threshold, a recovery waits for an
/// approval.
#[utoipa::path(
    post,
    path = "/v1/assets/{id}/recover",
    tag = "assets",
    operation_id = "recoverWallet",
    request_body(content = RecoverRequest, content_type = "application/json"),
    params(
        ("id" = Uuid, Path, description = "Asset id"),
        ("Idempotency-Key" = String, Header, description = "Required. 1 to 255 printable characters."),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(TokenOpAnswers, WriteErrors),
    security(("bearer" = []))
)]
pub(crate) async fn recover(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    IdempotencyKey(key): IdempotencyKey,
    PreferWait(wait): PreferWait,
    JsonBody(body): JsonBody<RecoverRequest>,
) -> Result<Response, Problem> {
    let req = TokenRequest::Recover {
        lost: parse_address(&body.lost_wallet, "lostWallet")?,
        replacement: parse_address(&body.new_wallet, "newWallet")?,
    };
    token_op(&state, caller, &id, &key, wait, req).await
}

/// Mint to many recipients in one transaction.
///
/// Starts `asset.batch-mint`: `RegulatedToken.batchMint(recipients, amounts)`, all or
/// nothing. At most the template's `batchMaxRecipients` (`422 BATCH_TOO_LARGE`); each
/// line is checked against the compliance rules before acceptance. Waits for an
/// approval when the total is above the template's mint approval threshold.
#[utoipa::path(
    post,
    path = "/v1/assets/{id}/batch-mint",
    tag = "assets",
    operation_id = "batchMint",
    request_body(content = BatchRequest, content_type = "application/json"),
    params(
        ("id" = Uuid, Path, description = "Asset id"),
        ("Idempotency-Key" = String, Header, description = "Required. 1 to 255 printable characters."),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(TokenOpAnswers, WriteErrors),
    security(("bearer" = []))
)]
pub(crate) async fn batch_mint(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    IdempotencyKey(key): IdempotencyKey,
    PreferWait(wait): PreferWait,
    JsonBody(body): JsonBody<BatchRequest>,
) -> Result<Response, Problem> {
    let req = TokenRequest::BatchMint {
        recipients: batch_lines(body)?,
    };
    token_op(&state, caller, &id, &key, wait, req).await
}

/// Transfer from the issuer's holdings to many recipients in one transaction.
///
/// Starts `asset.batch-transfer`: `RegulatedToken.batchTransfer(recipients, amounts)`
/// from the issuer, all or nothing. At most the template's `batchMaxRecipients`
/// (`422 BATCH_TOO_LARGE`); each line is checked against the compliance rules before
/// acceptance.
#[utoipa::path(
    post,
    path = "/v1/assets/{id}/batch-transfer",
    tag = "assets",
    operation_id = "batchTransfer",
    request_body(content = BatchRequest, content_type = "application/json"),
    params(
        ("id" = Uuid, Path, description = "Asset id"),
        ("Idempotency-Key" = String, Header, description = "Required. 1 to 255 printable characters."),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 `wait=<seconds>` (capped at 60)."),
    ),
    responses(TokenOpAnswers, WriteErrors),
    security(("bearer" = []))
)]
pub(crate) async fn batch_transfer(
    State(state): State<ApiState>,
    Authed(caller): Authed,
    RawPath(id): RawPath<String>,
    IdempotencyKey(key): IdempotencyKey,
    PreferWait(wait): PreferWait,
    JsonBody(body): JsonBody<BatchRequest>,
) -> Result<Response, Problem> {
    let req = TokenRequest::BatchTransfer {
        recipients: batch_lines(body)?,
    };
    token_op(&state, caller, &id, &key, wait, req).await
}
