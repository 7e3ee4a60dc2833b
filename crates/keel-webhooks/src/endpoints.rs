//! Endpoint management (what the Platform API's `/v1/webhook-endpoints` routes call):
//! create (the signing secret is returned once), read, list, change, delete, rotate the
//! secret with an overlap, send a test event, list deliveries with their attempts.

use crate::config::WebhookConfig;
use crate::error::{Result, WebhookError};
use crate::event::{ALL_TYPES, EVENT_TYPES, TEST, payload};
use crate::guard::validate_url;
use crate::sign::generate_secret;
use crate::store::{self, AttemptRow, DeliveryRow, EndpointChange, EndpointRow, NewEndpointRow};
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use std::time::Duration;
use uuid::Uuid;

/// Longest description, characters.
pub const MAX_DESCRIPTION: usize = 256;

/// Longest rotation overlap (7 days).
pub const MAX_OVERLAP: Duration = Duration::from_secs(7 * 24 * 3600);

/// An endpoint as the API shows it (never its secret).
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    /// Endpoint id.
    pub id: Uuid,
    /// Delivery URL.
    pub url: String,
    /// Free text.
    pub description: String,
    /// Subscribed event types (or `*`).
    pub event_types: Vec<String>,
    /// Whether deliveries are made.
    pub enabled: bool,
    /// Why Keel disabled it (`gone`: it answered 410; `failing`: it failed for the
    /// whole retry window).
    pub disabled_reason: Option<String>,
    /// While a rotation overlap runs: when the previous secret stops signing.
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last changed.
    pub updated_at: DateTime<Utc>,
}

impl Endpoint {
    fn of(r: EndpointRow, now: DateTime<Utc>) -> Self {
        Self {
            id: r.id,
            url: r.url,
            description: r.description,
            event_types: r.event_types,
            enabled: r.enabled,
            disabled_reason: r.disabled_reason,
            previous_secret_expires_at: r.previous_secret_expires_at.filter(|t| *t > now),
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

/// A delivery with its attempts.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// The delivery.
    pub delivery: DeliveryRow,
    /// Its attempts, oldest first.
    pub attempts: Vec<AttemptRow>,
}

/// What a create or change sets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointInput {
    /// The URL (see [`crate::guard`]).
    pub url: Option<String>,
    /// Free text, at most [`MAX_DESCRIPTION`] characters.
    pub description: Option<String>,
    /// Types from [`EVENT_TYPES`] or `*`, 1 to 32 of them.
    pub event_types: Option<Vec<String>>,
    /// Enabled flag (a create defaults to true; enabling resets the breaker).
    pub enabled: Option<bool>,
}

/// The endpoint service.
#[derive(Debug, Clone)]
pub struct Webhooks {
    pool: PgPool,
    config: WebhookConfig,
}

fn check_types(types: &[String]) -> Result<()> {
    if types.is_empty() || types.len() > 32 {
        return Err(WebhookError::InvalidField {
            field: "eventTypes",
            reason: "must list 1 to 32 event types",
        });
    }
    if types
        .iter()
        .any(|t| t != ALL_TYPES && !EVENT_TYPES.contains(&t.as_str()))
    {
        return Err(WebhookError::UnknownEventType);
    }
    Ok(())
}

fn check_description(d: &str) -> Result<()> {
    if d.chars().count() > MAX_DESCRIPTION || d.chars().any(char::is_control) {
        return Err(WebhookError::InvalidField {
            field: "description",
            reason: "must be at most 256 printable characters",
        });
    }
    Ok(())
}

impl Webhooks {
    /// The service on `pool`.
    pub fn new(pool: PgPool, config: WebhookConfig) -> Self {
        Self { pool, config }
    }

    /// The settings.
    pub fn config(&self) -> &WebhookConfig {
        &self.config
    }

    async fn now(&self) -> Result<DateTime<Utc>> {
        let (now,): (DateTime<Utc>,) = sqlx::query_as("SELECT now()").fetch_one(&self.pool).await?;
        Ok(now)
    }

    /// Creates an endpoint; returns it and its signing secret (shown only here).
    ///
    /// # Errors
    /// [`WebhookError::InvalidUrl`], [`WebhookError::InvalidField`] (`url` missing,
    /// `eventTypes`, `description`), [`WebhookError::UnknownEventType`],
    /// [`WebhookError::Store`].
    pub async fn create(
        &self,
        organization_id: Uuid,
        input: &EndpointInput,
    ) -> Result<(Endpoint, String)> {
        let url = input.url.as_deref().ok_or(WebhookError::InvalidField {
            field: "url",
            reason: "is required",
        })?;
        let types = input
            .event_types
            .clone()
            .ok_or(WebhookError::InvalidField {
                field: "eventTypes",
                reason: "is required",
            })?;
        check_types(&types)?;
        let description = input.description.clone().unwrap_or_default();
        check_description(&description)?;
        let url = validate_url(url, self.config.policy).await?;
        let secret = generate_secret();
        let row = store::endpoint_insert(
            &self.pool,
            &NewEndpointRow {
                id: Uuid::new_v4(),
                organization_id,
                url: url.as_str(),
                description: &description,
                event_types: &types,
                enabled: input.enabled.unwrap_or(true),
                secret: &secret,
            },
        )
        .await?;
        Ok((Endpoint::of(row, self.now().await?), secret))
    }

    /// Endpoint `id` of the organization.
    ///
    /// # Errors
    /// [`WebhookError::NotFound`], [`WebhookError::Store`].
    pub async fn get(&self, organization_id: Uuid, id: Uuid) -> Result<Endpoint> {
        let row = store::endpoint_get(&self.pool, organization_id, id)
            .await?
            .ok_or(WebhookError::NotFound)?;
        Ok(Endpoint::of(row, self.now().await?))
    }

    /// Up to `limit` endpoints, oldest first, after the keyset `(created_at, id)`.
    ///
    /// # Errors
    /// [`WebhookError::Store`].
    pub async fn list(
        &self,
        organization_id: Uuid,
        after: Option<(DateTime<Utc>, Uuid)>,
        limit: i64,
    ) -> Result<Vec<Endpoint>> {
        let now = self.now().await?;
        Ok(
            store::endpoint_list(&self.pool, organization_id, after, limit)
                .await?
                .into_iter()
                .map(|r| Endpoint::of(r, now))
                .collect(),
        )
    }

    /// Changes the fields `input` sets. Disabling (`enabled: false`) cancels the
    /// endpoint's pending deliveries (a disabled endpoint receives nothing; enabling it
    /// again delivers the events written from then on and resets its circuit breaker).
    ///
    /// # Errors
    /// As [`Webhooks::create`]; [`WebhookError::NotFound`].
    pub async fn update(
        &self,
        organization_id: Uuid,
        id: Uuid,
        input: &EndpointInput,
    ) -> Result<Endpoint> {
        if let Some(t) = &input.event_types {
            check_types(t)?;
        }
        if let Some(d) = &input.description {
            check_description(d)?;
        }
        let url = match &input.url {
            Some(u) => Some(validate_url(u, self.config.policy).await?.to_string()),
            None => None,
        };
        let mut tx = self.pool.begin().await?;
        let row = store::endpoint_update(
            &mut *tx,
            organization_id,
            id,
            &EndpointChange {
                url: url.as_deref(),
                description: input.description.as_deref(),
                event_types: input.event_types.as_deref(),
                enabled: input.enabled,
            },
        )
        .await?
        .ok_or(WebhookError::NotFound)?;
        if input.enabled == Some(false) {
            // A disabled endpoint receives nothing: its pending deliveries are
            // cancelled (their events settle, so retention and the oldest-pending gauge
            // do not wait for an endpoint that may never be enabled again).
            store::endpoint_cancel_pending(&mut tx, id).await?;
        }
        tx.commit().await?;
        Ok(Endpoint::of(row, self.now().await?))
    }

    /// Deletes the endpoint; its pending deliveries are cancelled.
    ///
    /// # Errors
    /// [`WebhookError::NotFound`], [`WebhookError::Store`].
    pub async fn delete(&self, organization_id: Uuid, id: Uuid) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        if !store::endpoint_delete(&mut tx, organization_id, id).await? {
            return Err(WebhookError::NotFound);
        }
        tx.commit().await?;
        Ok(())
    }

    /// Rotates the signing secret: returns the endpoint and the new secret (shown only
    /// here); the previous secret keeps signing (both signatures are sent) for
    /// `overlap` (default [`WebhookConfig::rotation_overlap`], at most [`MAX_OVERLAP`];
    /// zero ends it at once).
    ///
    /// # Errors
    /// [`WebhookError::InvalidField`] (`overlapSeconds`), [`WebhookError::NotFound`],
    /// [`WebhookError::Store`].
    pub async fn rotate_secret(
        &self,
        organization_id: Uuid,
        id: Uuid,
        overlap: Option<Duration>,
    ) -> Result<(Endpoint, String)> {
        let overlap = overlap.unwrap_or(self.config.rotation_overlap);
        if overlap > MAX_OVERLAP {
            return Err(WebhookError::InvalidField {
                field: "overlapSeconds",
                reason: "must be at most 604800",
            });
        }
        let secret = generate_secret();
        let row = store::endpoint_rotate(
            &self.pool,
            organization_id,
            id,
            &secret,
            overlap.as_secs_f64(),
        )
        .await?
        .ok_or(WebhookError::NotFound)?;
        Ok((Endpoint::of(row, self.now().await?), secret))
    }

    /// Queues a test event (`webhook.test`, marked as a test) for this endpoint only
    /// (also when it does not subscribe to the type); returns the event id.
    ///
    /// # Errors
    /// [`WebhookError::NotFound`], [`WebhookError::Store`].
    pub async fn send_test(&self, organization_id: Uuid, id: Uuid) -> Result<Uuid> {
        store::endpoint_get(&self.pool, organization_id, id)
            .await?
            .ok_or(WebhookError::NotFound)?;
        let event_id = Uuid::new_v4();
        let now = Utc::now();
        let data = serde_json::json!({"endpointId": id.to_string(), "test": true});
        let body = payload(event_id, TEST, now, organization_id, &data);
        store::test_event_insert(&self.pool, event_id, organization_id, id, &body, now).await?;
        Ok(event_id)
    }

    /// Up to `limit` deliveries of the endpoint, newest first, before the keyset
    /// `(created_at, id)`, each with its attempts.
    ///
    /// # Errors
    /// [`WebhookError::NotFound`], [`WebhookError::Store`].
    pub async fn deliveries(
        &self,
        organization_id: Uuid,
        id: Uuid,
        before: Option<(DateTime<Utc>, Uuid)>,
        limit: i64,
    ) -> Result<Vec<Delivery>> {
        store::endpoint_get(&self.pool, organization_id, id)
            .await?
            .ok_or(WebhookError::NotFound)?;
        let rows = store::deliveries_list(&self.pool, id, before, limit).await?;
        let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
        let mut attempts = store::attempts_of(&self.pool, &ids).await?;
        Ok(rows
            .into_iter()
            .map(|delivery| {
                let (mine, rest): (Vec<_>, Vec<_>) = attempts
                    .drain(..)
                    .partition(|a| a.delivery_id == delivery.id);
                attempts = rest;
                Delivery {
                    delivery,
                    attempts: mine,
                }
            })
            .collect())
    }
}
