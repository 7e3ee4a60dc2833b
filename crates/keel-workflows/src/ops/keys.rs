//! The API key lifecycle as an organization's admin key sees it: list, create, revoke,
//! rotate — every call scoped to the caller's organization (another organization's
//! key ids are [`OpsError::NotFound`]). The rules are [`crate::tenancy`]'s.

use crate::error::{OpsError, Result};
use crate::ops::Ops;
use crate::tenancy::{self, ApiKeyView, Caller, Credential, RotatedApiKey, Scopes};
use chrono::{DateTime, Utc};
use std::time::Duration;
use uuid::Uuid;

impl Ops {
    /// Who `caller` records commands as ([`tenancy::caller_actor`]: `USER` for a key
    /// issued to a person, `SERVICE` otherwise; `DEGRADED` when the key's identity can
    /// no longer be fully established), read when the command is recorded.
    ///
    /// # Errors
    /// [`OpsError::Store`].
    pub async fn actor(&self, caller: Caller) -> Result<keel_durable::Actor> {
        tenancy::caller_actor(&self.db, caller).await
    }

    /// Resolves a bearer token to its caller and scopes
    /// ([`tenancy::authenticate_credential`]: read on every call, no cache).
    ///
    /// # Errors
    /// [`OpsError::Unauthenticated`]; [`OpsError::Store`].
    pub async fn authenticate_credential(&self, token: &str) -> Result<Credential> {
        tenancy::authenticate_credential(&self.db, token).await
    }

    /// Up to `limit` keys of the caller's organization (revoked ones included), oldest
    /// first, after the `(created_at, id)` keyset position `after`.
    ///
    /// # Errors
    /// [`OpsError::Store`].
    pub async fn api_keys(
        &self,
        caller: Caller,
        after: Option<(DateTime<Utc>, Uuid)>,
        limit: u32,
    ) -> Result<Vec<ApiKeyView>> {
        tenancy::api_keys(&self.db, caller.organization_id, after, limit).await
    }

    /// Creates a key of the caller's organization holding `scopes`, which must be a
    /// subset of the calling key's own (a key cannot grant what it does not hold).
    /// Returns the key and its token (shown once).
    ///
    /// # Errors
    /// [`OpsError::InsufficientScope`] for a scope the caller lacks;
    /// [`OpsError::InvalidField`] (`label`, `scopes`); [`OpsError::Store`].
    pub async fn create_api_key(
        &self,
        credential: Credential,
        label: &str,
        scopes: Scopes,
    ) -> Result<RotatedApiKey> {
        self.create_api_key_issued(credential, label, scopes, None)
            .await
    }

    /// [`Ops::create_api_key`] for a key issued to the named person `issued_to` (its
    /// commands are recorded as `USER` with that id; see [`tenancy::caller_actor`]).
    ///
    /// # Errors
    /// As [`Ops::create_api_key`]; [`OpsError::InvalidField`] (`issuedTo`).
    pub async fn create_api_key_issued(
        &self,
        credential: Credential,
        label: &str,
        scopes: Scopes,
        issued_to: Option<&str>,
    ) -> Result<RotatedApiKey> {
        if !scopes.is_subset(credential.scopes) {
            return Err(OpsError::InsufficientScope);
        }
        let org = credential.caller.organization_id;
        let new = tenancy::create_api_key_issued(&self.db, org, label, scopes, issued_to).await?;
        let key = tenancy::api_key(&self.db, org, new.id).await?;
        Ok(RotatedApiKey {
            key,
            token: new.token,
        })
    }

    /// Revokes key `id` of the caller's organization ([`tenancy::revoke_api_key`]); the
    /// caller's own key included.
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::Store`].
    pub async fn revoke_api_key(&self, caller: Caller, id: Uuid) -> Result<ApiKeyView> {
        tenancy::revoke_api_key(&self.db, caller.organization_id, id).await
    }

    /// Rotates key `id` of the caller's organization ([`tenancy::rotate_api_key`]),
    /// the old secret working on for `overlap`.
    ///
    /// # Errors
    /// [`OpsError::NotFound`]; [`OpsError::ApiKeyRevoked`];
    /// [`OpsError::InvalidField`]; [`OpsError::Store`].
    pub async fn rotate_api_key(
        &self,
        caller: Caller,
        id: Uuid,
        overlap: Duration,
    ) -> Result<RotatedApiKey> {
        tenancy::rotate_api_key(&self.db, caller.organization_id, id, overlap).await
    }
}
