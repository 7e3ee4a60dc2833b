//! SQL of keel-workflows' tables (`migrations/0007_platform_api.sql`, retries in
//! `0011_operation_retries.sql`, cancels in `0020_operation_cancel.sql`): organization,
//! api_key, asset_template, asset, operation, operation_tx.
//!
//! Every function is one statement named noun-first (`operation_insert`,
//! `operation_cancel_request`, ...) and takes an executor, so a caller can compose them
//! in one transaction. Rows come back as `FromRow` structs holding the database types
//! (`i64` chain ids, `i16` decimals, 20-byte `Vec<u8>` addresses); the service layer
//! converts them into its typed views. Updates are guarded: a repeated call changes
//! nothing (`instance_id` is set once, `cancel_requested_at` is set once).
//!
//! ## Vocabulary
//! The column `operation_tx.step` is not a journal step: it names the **link** of one
//! transaction-queue request to its operation, `<write>` for the first attempt of a
//! workflow's on-chain write (`create-feed`, `mint`, ...) and `<write>#<n>` for the n-th
//! (after a retryable failure and a retry of the operation). Rust code calls it `link`;
//! the JSON wire name stays `step`.
//!
//! One module per table, as keel-index's store; everything is re-exported here, so
//! callers name `store::operation_insert`, `store::AssetRow`, ...:
//!
//! | module | table(s) |
//! |---|---|
//! | `organization` | `organization` |
//! | `api_key` | `api_key`: keys, scopes, revocation, rotation |
//! | `asset_template` | `asset_template` |
//! | `asset` | `asset`, read with its `asset.create` operation |
//! | `operation` | `operation`: inserts, reads, lists, guards, retries, cancels, webhook mark |
//! | `operation_tx` | `operation_tx`: the links of queue requests to operations |
//! | `distribution` | `distribution`, `distribution_payment` (migration `0089`): distributions and their payments |
//! | `org_system` | `organization_system`, `organization_system_current` (migration `0091`): organization systems |
//! | `database` | no table: clock, snapshot transactions, ping |

use keel_store::StoreError;

mod api_key;
mod asset;
mod asset_template;
mod database;
mod distribution;
mod operation;
mod operation_tx;
mod org_system;
mod organization;

pub use api_key::*;
pub use asset::*;
pub use asset_template::*;
pub use database::*;
pub use distribution::*;
pub use operation::*;
pub use operation_tx::*;
pub use org_system::*;
pub use organization::*;

/// `Result` of the store functions: every failure is a classified [`StoreError`].
pub type StoreResult<T> = Result<T, StoreError>;
