//! Webhooks (issue 21): the `data` of operations' webhook events is this API's
//! [`crate::dto::Operation`], as `GET /v1/operations/{id}` serves it (one schema, in the
//! OpenAPI document). The binary passes [`operation_renderer`] to
//! [`keel_workflows::OperationEvents`].

use keel_workflows::{OperationView, Renderer};
use std::sync::Arc;

/// The `data` of an `operation.*` webhook event: the operation view as the API's
/// `Operation` JSON.
pub fn operation_data(view: &OperationView) -> serde_json::Value {
    serde_json::to_value(crate::dto::Operation::from(view.clone())).unwrap_or_default()
}

/// [`operation_data`] as a [`Renderer`].
pub fn operation_renderer() -> Renderer {
    Arc::new(operation_data)
}
