//! Transactions, vault accounts and the status walk.
//!
//! A create records the transaction (`SUBMITTED`) and starts its worker, which walks
//! `[PENDING_AUTHORIZATION →] QUEUED → PENDING_SIGNATURE → BROADCASTING → CONFIRMING →
//! COMPLETED | FAILED`. Per vault account one worker at a time holds the account's
//! nonce (the provider manages nonces, not the caller): it signs with the account's
//! secp256k1 key, broadcasts, and follows the receipt to the configured confirmation
//! count. Every status change emits a `transaction.status.updated` webhook.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use alloy::eips::Encodable2718;
use alloy::network::{EthereumWallet, NetworkTransactionBuilder, TransactionBuilder};
use alloy::primitives::{Address, B256, Bytes, U256, keccak256};
use alloy::providers::{DynProvider, Provider};
use alloy::rpc::types::TransactionRequest;
use alloy::signers::local::PrivateKeySigner;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::hooks::Hooks;

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What the worker does with a transaction (a fault knob, or the normal walk).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Behavior {
    /// The full walk to COMPLETED (or FAILED on a revert).
    #[default]
    Normal,
    /// Accepted, then `QUEUED` forever; never signed or broadcast (cancel still works).
    SilentDrop,
    /// `REJECTED` with the sub-status (default `REJECTED_BY_USER`).
    Reject,
    /// `BLOCKED` with the sub-status (default `BLOCKED_BY_POLICY`).
    Block,
    /// Broadcast with a gas limit that runs out: reverted on chain, `FAILED`.
    Revert,
    /// `PENDING_AUTHORIZATION` until an admin approve or reject.
    RequireApproval,
}

/// A fault for one transaction.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TxFault {
    /// The transaction it applies to; `None`: the next create without a keyed fault.
    #[serde(default)]
    pub(crate) external_tx_id: Option<String>,
    #[serde(default)]
    pub(crate) behavior: Behavior,
    #[serde(default)]
    pub(crate) sub_status: Option<String>,
    /// The create takes effect but its answer is a 502.
    #[serde(default)]
    pub(crate) lose_response: bool,
    /// Lost hash: reads by provider id never carry the `txHash` (an empty string, even
    /// once `COMPLETED`); the lookup by external id does.
    #[serde(default)]
    pub(crate) lose_hash: bool,
}

/// Faults on the HTTP surface of `/v1`.
#[derive(Clone, Debug, Default)]
pub(crate) struct HttpFaults {
    pub(crate) rate_limit: Option<(u32, u64)>,
    pub(crate) server_error: Option<(u32, u16)>,
    pub(crate) slow: Option<(u32, u64)>,
}

pub(crate) struct Tx {
    pub(crate) id: String,
    pub(crate) external_tx_id: Option<String>,
    pub(crate) vault_id: String,
    pub(crate) asset_id: String,
    pub(crate) to: Address,
    pub(crate) calldata: Bytes,
    pub(crate) value: U256,
    pub(crate) amount: String,
    pub(crate) note: String,
    pub(crate) status: &'static str,
    pub(crate) sub_status: String,
    pub(crate) tx_hash: Option<B256>,
    pub(crate) source_address: Address,
    pub(crate) created_at: u64,
    pub(crate) last_updated: u64,
    pub(crate) confirmations: u64,
    pub(crate) block: Option<(u64, B256)>,
    pub(crate) behavior: Behavior,
    pub(crate) fault_sub_status: Option<String>,
    pub(crate) approval: Option<(bool, Option<String>)>,
    pub(crate) cancel_requested: bool,
    pub(crate) control: Arc<Notify>,
    /// Reads by id omit the hash (the `loseHash` fault).
    pub(crate) lose_hash: bool,
}

impl Tx {
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "externalTxId": self.external_tx_id,
            "status": self.status,
            "subStatus": self.sub_status,
            "txHash": self.tx_hash.map(|h| h.to_string()).unwrap_or_default(),
            "operation": "CONTRACT_CALL",
            "assetId": self.asset_id,
            "source": {"type": "VAULT_ACCOUNT", "id": self.vault_id, "name": ""},
            "destination": {"type": "ONE_TIME_ADDRESS", "id": serde_json::Value::Null},
            "sourceAddress": self.source_address.to_checksum(None),
            "destinationAddress": self.to.to_checksum(None),
            "amount": self.amount,
            "amountInfo": {"amount": self.amount},
            "note": self.note,
            "createdAt": self.created_at,
            "lastUpdated": self.last_updated,
            "numOfConfirmations": self.confirmations,
            "blockInfo": match self.block {
                Some((n, h)) => serde_json::json!({"blockHeight": n.to_string(), "blockHash": h.to_string()}),
                None => serde_json::json!({}),
            },
            "extraParameters": {"contractCallData": format!("0x{}", hex::encode(&self.calldata))},
        })
    }
}

struct Vault {
    signer: PrivateKeySigner,
    /// The account's next nonce, read from the chain on first use; the lock is held by
    /// the one worker signing for this account.
    next_nonce: tokio::sync::Mutex<Option<u64>>,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) txs: HashMap<String, Tx>,
    pub(crate) by_external: HashMap<String, String>,
    pub(crate) order: Vec<String>,
    pub(crate) next_faults: VecDeque<TxFault>,
    pub(crate) keyed_faults: HashMap<String, TxFault>,
    pub(crate) http: HttpFaults,
    pub(crate) refused_auth: u64,
    /// Create requests received (counted when the body is in, before any fault delay).
    pub(crate) creates_received: u64,
}

/// Settings of the engine.
pub(crate) struct EngineConfig {
    pub(crate) seed: String,
    pub(crate) vault_keys: HashMap<String, PrivateKeySigner>,
    pub(crate) assets: Vec<String>,
    pub(crate) confirmations: u64,
    pub(crate) step_delay: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) fallback_gas_limit: u64,
}

pub(crate) struct Engine {
    pub(crate) config: EngineConfig,
    pub(crate) chain: DynProvider,
    pub(crate) chain_id: u64,
    pub(crate) state: Mutex<State>,
    vaults: Mutex<HashMap<String, Arc<Vault>>>,
    pub(crate) hooks: Hooks,
}

/// Why a create was refused (HTTP 400 with this message).
pub(crate) struct CreateRefusal(pub(crate) String);

/// A parsed create request.
pub(crate) struct NewTx {
    pub(crate) external_tx_id: Option<String>,
    pub(crate) vault_id: String,
    pub(crate) asset_id: String,
    pub(crate) to: Address,
    pub(crate) calldata: Bytes,
    pub(crate) value: U256,
    pub(crate) amount: String,
    pub(crate) note: String,
}

const CANCELLABLE: [&str; 3] = ["SUBMITTED", "PENDING_AUTHORIZATION", "QUEUED"];

impl Engine {
    pub(crate) fn new(
        config: EngineConfig,
        chain: DynProvider,
        chain_id: u64,
        hooks: Hooks,
    ) -> Self {
        Self {
            config,
            chain,
            chain_id,
            state: Mutex::new(State::default()),
            vaults: Mutex::new(HashMap::new()),
            hooks,
        }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The vault account's key: configured, else derived from the seed
    /// (`keccak256("keel-custody-sim/vault/" || seed || "/" || id)`).
    fn vault(&self, id: &str) -> Option<Arc<Vault>> {
        let mut vaults = self.vaults.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = vaults.get(id) {
            return Some(v.clone());
        }
        let signer = match self.config.vault_keys.get(id) {
            Some(s) => s.clone(),
            None if !self.config.seed.is_empty() => {
                let secret = keccak256(format!("keel-custody-sim/vault/{}/{id}", self.config.seed));
                PrivateKeySigner::from_bytes(&secret).ok()?
            }
            None => return None,
        };
        let vault = Arc::new(Vault {
            signer,
            next_nonce: tokio::sync::Mutex::new(None),
        });
        vaults.insert(id.to_owned(), vault.clone());
        Some(vault)
    }

    pub(crate) fn vault_address(&self, id: &str) -> Option<Address> {
        self.vault(id).map(|v| v.signer.address())
    }

    /// Records a create; returns the id and whether to lose the answer.
    pub(crate) fn create(self: &Arc<Self>, new: NewTx) -> Result<(String, bool), CreateRefusal> {
        if !self.config.assets.iter().any(|a| a == &new.asset_id) {
            return Err(CreateRefusal(format!(
                "Asset {} is not supported",
                new.asset_id
            )));
        }
        let vault = self
            .vault(&new.vault_id)
            .ok_or_else(|| CreateRefusal("Vault account was not found".into()))?;
        let id = uuid::Uuid::new_v4().to_string();
        let (json, lose) = {
            let mut state = self.lock();
            if let Some(ext) = &new.external_tx_id
                && state.by_external.contains_key(ext)
            {
                return Err(CreateRefusal(format!(
                    "Transaction with externalTxId {ext} already exists"
                )));
            }
            let fault = match new
                .external_tx_id
                .as_ref()
                .and_then(|e| state.keyed_faults.remove(e))
            {
                Some(f) => f,
                None => state.next_faults.pop_front().unwrap_or_default(),
            };
            let now = now_ms();
            let tx = Tx {
                id: id.clone(),
                external_tx_id: new.external_tx_id.clone(),
                vault_id: new.vault_id,
                asset_id: new.asset_id,
                to: new.to,
                calldata: new.calldata,
                value: new.value,
                amount: new.amount,
                note: new.note,
                status: "SUBMITTED",
                sub_status: String::new(),
                tx_hash: None,
                source_address: vault.signer.address(),
                created_at: now,
                last_updated: now,
                confirmations: 0,
                block: None,
                behavior: fault.behavior,
                fault_sub_status: fault.sub_status,
                approval: None,
                cancel_requested: false,
                control: Arc::new(Notify::new()),
                lose_hash: fault.lose_hash,
            };
            let json = tx.json();
            if let Some(ext) = &new.external_tx_id {
                state.by_external.insert(ext.clone(), id.clone());
            }
            state.order.push(id.clone());
            state.txs.insert(id.clone(), tx);
            (json, fault.lose_response)
        };
        self.hooks
            .emit("transaction.created", &id, "SUBMITTED", json);
        let engine = self.clone();
        let worker_id = id.clone();
        tokio::spawn(async move { engine.run(worker_id).await });
        Ok((id, lose))
    }

    /// Sets a status (and sub-status) and emits the webhook; `edit` may change more.
    fn set(&self, id: &str, status: &'static str, sub_status: &str, edit: impl FnOnce(&mut Tx)) {
        let json = {
            let mut state = self.lock();
            let Some(tx) = state.txs.get_mut(id) else {
                return;
            };
            tx.status = status;
            tx.sub_status = sub_status.to_owned();
            tx.last_updated = now_ms();
            edit(tx);
            tx.json()
        };
        self.hooks
            .emit("transaction.status.updated", id, status, json);
    }

    /// Moves to `status` unless a cancel was requested (then false: stop).
    fn advance(&self, id: &str, status: &'static str, sub_status: &str) -> bool {
        {
            let state = self.lock();
            match state.txs.get(id) {
                Some(tx) if !tx.cancel_requested => {}
                _ => return false,
            }
        }
        self.set(id, status, sub_status, |_| {});
        true
    }

    pub(crate) fn cancel(self: &Arc<Self>, id: &str) -> Option<bool> {
        let accepted = {
            let mut state = self.lock();
            let tx = state.txs.get_mut(id)?;
            if !CANCELLABLE.contains(&tx.status) || tx.cancel_requested {
                return Some(false);
            }
            tx.cancel_requested = true;
            tx.control.notify_one();
            true
        };
        if accepted {
            self.set(id, "CANCELLING", "", |_| {});
            let engine = self.clone();
            let id = id.to_owned();
            tokio::spawn(async move {
                tokio::time::sleep(engine.config.step_delay).await;
                engine.set(&id, "CANCELLED", "CANCELLED_BY_USER", |_| {});
            });
        }
        Some(accepted)
    }

    pub(crate) fn decide(&self, id: &str, approve: bool, sub_status: Option<String>) -> bool {
        let mut state = self.lock();
        let Some(tx) = state.txs.get_mut(id) else {
            return false;
        };
        if tx.status != "PENDING_AUTHORIZATION" || tx.approval.is_some() {
            return false;
        }
        tx.approval = Some((approve, sub_status));
        tx.control.notify_one();
        true
    }

    async fn run(self: Arc<Self>, id: String) {
        let step = self.config.step_delay;
        tokio::time::sleep(step).await;
        let (behavior, fault_sub, control, vault_id) = {
            let state = self.lock();
            let Some(tx) = state.txs.get(&id) else { return };
            (
                tx.behavior.clone(),
                tx.fault_sub_status.clone(),
                tx.control.clone(),
                tx.vault_id.clone(),
            )
        };
        match behavior {
            Behavior::Reject => {
                let sub = fault_sub.unwrap_or_else(|| "REJECTED_BY_USER".into());
                if self.advance(&id, "PENDING_AUTHORIZATION", "") {
                    tokio::time::sleep(step).await;
                    self.set(&id, "REJECTED", &sub, |_| {});
                }
                return;
            }
            Behavior::Block => {
                let sub = fault_sub.unwrap_or_else(|| "BLOCKED_BY_POLICY".into());
                self.set(&id, "BLOCKED", &sub, |_| {});
                return;
            }
            Behavior::RequireApproval => {
                if !self.advance(&id, "PENDING_AUTHORIZATION", "") {
                    return;
                }
                loop {
                    let decision = {
                        let state = self.lock();
                        let Some(tx) = state.txs.get(&id) else { return };
                        if tx.cancel_requested {
                            return;
                        }
                        tx.approval.clone()
                    };
                    match decision {
                        Some((true, _)) => break,
                        Some((false, sub)) => {
                            let sub = sub.unwrap_or_else(|| "REJECTED_BY_USER".into());
                            self.set(&id, "REJECTED", &sub, |_| {});
                            return;
                        }
                        None => control.notified().await,
                    }
                }
            }
            _ => {}
        }
        if !self.advance(&id, "QUEUED", "") {
            return;
        }
        if behavior == Behavior::SilentDrop {
            tracing::info!(tx = %id, "silent drop: staying QUEUED, never broadcast");
            return;
        }
        let Some(vault) = self.vault(&vault_id) else {
            return;
        };
        let mut nonce_slot = vault.next_nonce.lock().await;
        tokio::time::sleep(step).await;
        if !self.advance(&id, "PENDING_SIGNATURE", "") {
            return;
        }
        let (to, calldata, value) = {
            let state = self.lock();
            let Some(tx) = state.txs.get(&id) else { return };
            (tx.to, tx.calldata.clone(), tx.value)
        };
        let from = vault.signer.address();
        let nonce = match *nonce_slot {
            Some(n) => n,
            None => match self.chain.get_transaction_count(from).pending().await {
                Ok(n) => n,
                Err(_) => {
                    self.set(&id, "FAILED", "NETWORK_ERROR", |_| {});
                    return;
                }
            },
        };
        let request = TransactionRequest::default()
            .with_from(from)
            .with_to(to)
            .with_input(calldata.clone())
            .with_value(value)
            .with_nonce(nonce)
            .with_chain_id(self.chain_id);
        let gas = if behavior == Behavior::Revert {
            intrinsic_gas(&calldata) + 100
        } else {
            match self.chain.estimate_gas(request.clone()).await {
                Ok(g) => g * 12 / 10,
                // An estimate that reverts: broadcast anyway; the receipt tells (FAILED).
                Err(_) => self.config.fallback_gas_limit,
            }
        };
        let fees = match self.chain.estimate_eip1559_fees().await {
            Ok(f) => f,
            Err(_) => {
                self.set(&id, "FAILED", "NETWORK_ERROR", |_| {});
                return;
            }
        };
        let request = request
            .with_gas_limit(gas)
            .with_max_fee_per_gas(fees.max_fee_per_gas)
            .with_max_priority_fee_per_gas(fees.max_priority_fee_per_gas);
        let Ok(envelope) = request
            .build(&EthereumWallet::from(vault.signer.clone()))
            .await
        else {
            self.set(&id, "FAILED", "INTERNAL_ERROR", |_| {});
            return;
        };
        let hash = *envelope.tx_hash();
        self.set(&id, "BROADCASTING", "", |_| {});
        let raw = envelope.encoded_2718();
        if let Err(e) = self.chain.send_raw_transaction(&raw).await {
            let text = e.to_string().to_ascii_lowercase();
            let sub = if text.contains("insufficient funds") {
                "INSUFFICIENT_FUNDS_FOR_FEE"
            } else {
                "NETWORK_ERROR"
            };
            self.set(&id, "FAILED", sub, |_| {});
            return;
        }
        *nonce_slot = Some(nonce + 1);
        drop(nonce_slot);
        self.set(
            &id,
            "CONFIRMING",
            "PENDING_BLOCKCHAIN_CONFIRMATIONS",
            |tx| tx.tx_hash = Some(hash),
        );
        loop {
            tokio::time::sleep(self.config.poll_interval).await;
            let Ok(Some(receipt)) = self.chain.get_transaction_receipt(hash).await else {
                continue;
            };
            let (Some(number), Some(block_hash)) = (receipt.block_number, receipt.block_hash)
            else {
                continue;
            };
            let Ok(head) = self.chain.get_block_number().await else {
                continue;
            };
            let confirmations = head.saturating_sub(number) + 1;
            if confirmations < self.config.confirmations {
                continue;
            }
            let (status, sub) = if receipt.status() {
                ("COMPLETED", "CONFIRMED")
            } else {
                ("FAILED", "SMART_CONTRACT_EXECUTION_FAILED")
            };
            self.set(&id, status, sub, |tx| {
                tx.confirmations = confirmations;
                tx.block = Some((number, block_hash));
            });
            return;
        }
    }
}

/// The intrinsic gas of a call with `calldata` (EIP-2028 costs, EIP-7623 floor).
fn intrinsic_gas(calldata: &[u8]) -> u64 {
    let zeros = calldata.iter().filter(|b| **b == 0).count() as u64;
    let nonzeros = calldata.len() as u64 - zeros;
    let standard = 21_000 + 4 * zeros + 16 * nonzeros;
    let floor = 21_000 + 10 * (zeros + 4 * nonzeros);
    standard.max(floor)
}
