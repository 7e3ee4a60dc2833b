//! The API's JSON shapes (all camelCase): the wire format, owned here.
//!
//! Request bodies are deserialized from these types, and every response is serialized
//! from them: the handlers convert the operations service's views
//! (`keel_workflows::OperationView`, `AssetView`, ...) with the `From` impls of
//! `convert`. The OpenAPI document is generated from the same types, so what is
//! documented is what is served.
//!
//! Naming: the service calls an operation's link to a queue request `link`; the wire
//! name is `step` (`TxMilestone::step`, `OperationWait::step`, `FundingRequest::step`).
//!
//! One module per resource, everything re-exported here (`dto::Operation`,
//! `dto::address_text`, ...): `requests` (asset and token request bodies),
//! `operations`, `assets` (assets, observations, balances), `templates`, `funding`,
//! `api_keys`, `convert` (the `From` impls from the service's views). Schema names are
//! the type names, so moving a type between modules does not change the OpenAPI document.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

mod api_keys;
mod assets;
mod convert;
mod funding;
mod operations;
mod requests;
mod templates;

pub use api_keys::*;
pub use assets::*;
pub use convert::*;
pub use funding::*;
pub use operations::*;
pub use requests::*;
pub use templates::*;

/// `GET /healthz` and `GET /readyz` when healthy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Health {
    /// `ok` (`/healthz`) or `ready` (`/readyz`).
    pub status: String,
}
