//! The paymaster deposit runway: Keel's SponsorPaymaster pays for the operations it
//! sponsors out of its **deposit at the EntryPoint** (`EntryPoint.balanceOf(paymaster)`),
//! not out of its own balance. [`RunwayCheck`] (service `aa-runway`, in the `keel`
//! binary the cluster singleton `aa-runway/<chainId>`) reads that deposit every
//! interval through the resolved EntryPoint ([`crate::resolve_entry_point`]) and keeps
//! one funding request per (chain, paymaster) in `aa_deposit_request`:
//!
//! - deposit below the minimum: the request is open (opened, or updated with the
//!   check's figures: deposit, minimum, required = minimum − deposit), WARN logged when
//!   it opens;
//! - deposit at or above the minimum: an open request is closed.
//!
//! The Platform API lists the open ones in `GET /v1/funding-requests`
//! (`entryPointDeposits`): fund them with `EntryPoint.depositTo(paymaster)` (or the
//! paymaster's `deposit()`); a transfer to the paymaster's address does not count.
//!
//! Metrics: `keel_aa_paymaster_deposit_wei{chain_id}` (gauge, the deposit at the last
//! check, wei; a float, so exact only below 2^53), and
//! `keel_aa_deposit_funding_request_open{chain_id}` (gauge, 1 while a request is open).

use crate::bundler::{BundlerError, entry_point_deposit};
use crate::flow::{AaEnv, chain_id_i64};
use crate::store;
use alloy::primitives::{Address, U256};
use keel_service::{BackgroundService, Report};
use keel_units::Wei;
use std::sync::Arc;
use std::time::Duration;

/// What one check saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunwayStatus {
    /// The paymaster's EntryPoint deposit, wei.
    pub deposit: U256,
    /// Whether a funding request is open after the check.
    pub open: bool,
    /// Whether this check opened it.
    pub opened: bool,
}

/// The deposit runway check of one chain's paymaster (see the module docs).
#[derive(Debug)]
pub struct RunwayCheck {
    env: Arc<AaEnv>,
    chain_id: u64,
    paymaster: Address,
    minimum: Wei,
    interval: Duration,
}

impl RunwayCheck {
    /// The check of `paymaster` on `chain_id` (served by `env`) against `minimum` wei,
    /// every `interval`.
    pub fn new(
        env: Arc<AaEnv>,
        chain_id: u64,
        paymaster: Address,
        minimum: Wei,
        interval: Duration,
    ) -> Self {
        Self {
            env,
            chain_id,
            paymaster,
            minimum,
            interval,
        }
    }

    /// One check: reads the deposit through the resolved EntryPoint and opens, updates
    /// or closes the funding request.
    ///
    /// # Errors
    /// [`BundlerError::ChainNotServed`]; [`BundlerError::Corrupt`] when the EntryPoint
    /// does not resolve (network or configuration; retried at the next check);
    /// [`BundlerError::Chain`] / [`BundlerError::Store`].
    pub async fn check(&self) -> Result<RunwayStatus, BundlerError> {
        let chain = self
            .env
            .chain(self.chain_id)
            .ok_or(BundlerError::ChainNotServed(self.chain_id))?;
        let resolution = crate::resolve_entry_point(&chain.pool, chain.directory)
            .await
            .map_err(|_| BundlerError::Corrupt("entry point resolution"))?;
        let ep = resolution.resolved;
        let deposit = entry_point_deposit(&chain.pool, &ep, self.paymaster).await?;
        let label = self.chain_id.to_string();
        metrics::gauge!("keel_aa_paymaster_deposit_wei", "chain_id" => label.clone())
            .set(u128::try_from(deposit).map_or(f64::MAX, |v| v as f64));
        let chain_id = chain_id_i64(self.chain_id);
        let minimum = self.minimum.get();
        let status = if deposit < minimum {
            let opened = store::deposit_request_open(
                &self.env.db,
                chain_id,
                self.paymaster.as_slice(),
                ep.address().as_slice(),
                &deposit.to_string(),
                &minimum.to_string(),
                &(minimum - deposit).to_string(),
            )
            .await?;
            if opened {
                tracing::warn!(target: "keel::aa::runway", chain_id = self.chain_id,
                    paymaster = %self.paymaster, entry_point = %ep.address(),
                    deposit_wei = %deposit, minimum_wei = %minimum,
                    "the paymaster's EntryPoint deposit is below the minimum: funding request opened");
            }
            RunwayStatus {
                deposit,
                open: true,
                opened,
            }
        } else {
            if store::deposit_request_close(
                &self.env.db,
                chain_id,
                self.paymaster.as_slice(),
                &deposit.to_string(),
            )
            .await?
            {
                tracing::info!(target: "keel::aa::runway", chain_id = self.chain_id,
                    paymaster = %self.paymaster, deposit_wei = %deposit,
                    "the paymaster's EntryPoint deposit is funded: funding request closed");
            }
            RunwayStatus {
                deposit,
                open: false,
                opened: false,
            }
        };
        metrics::gauge!("keel_aa_deposit_funding_request_open", "chain_id" => label)
            .set(if status.open { 1.0 } else { 0.0 });
        Ok(status)
    }
}

impl BackgroundService for RunwayCheck {
    type Error = BundlerError;

    fn name(&self) -> &'static str {
        "aa-runway"
    }

    async fn run_once(&mut self) -> Result<Report, BundlerError> {
        let status = self.check().await?;
        Ok(Report::after(u64::from(status.opened), self.interval))
    }

    fn cancel_safe(&self) -> bool {
        true
    }
}
