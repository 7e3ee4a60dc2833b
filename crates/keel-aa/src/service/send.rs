//! Acceptance: [`AaService::send`]'s synchronous pre-check (the sender and paymaster
//! rules, the replacement of an operation not yet bundled) before the workflow starts.

use super::*;

/// What [`AaService`]'s sender rule found (see `sender_rule`).
pub(super) struct SenderCheck {
    /// The open operation a replacement supersedes.
    replaces: Option<UserOperationRow>,
    /// An open operation of the sender holds the nonce just below (same key).
    predecessor: bool,
}

impl AaService {
    /// Pre-checks `op` ([`crate::validation::validate`]: the ERC-7562 traced `handleOps`
    /// simulation on the resolved EntryPoint, or the plain one in unsafe mode, and the
    /// entities' reputation) and accepts
    /// it ([`flow::submit`], over the same resolution). A resend of an accepted operation is not simulated again
    /// (its nonce may be used by its own inclusion): it answers the same hash.
    ///
    /// # Errors
    /// [`SendError`].
    pub async fn send(
        &self,
        chain_id: u64,
        entry_point: Address,
        op: UserOperation,
        organization_id: Option<Uuid>,
    ) -> Result<Submitted, SendError> {
        let chain = self
            .env
            .chain(chain_id)
            .ok_or(SubmitError::ChainNotServed(chain_id))?;
        let resolution = resolve_entry_point(&chain.pool, chain.directory)
            .await
            .map_err(|e| {
                if e.is_retryable() {
                    SubmitError::Unavailable(e)
                } else {
                    SubmitError::Misconfigured(e)
                }
            })?;
        let mut replaces = None;
        if resolution.accepts_for_submission(entry_point) {
            let hash = op
                .hash_v08(&resolution.resolved)
                .map_err(SubmitError::Malformed)?;
            let known = store::user_operation_get(
                &self.env.db,
                flow::chain_id_i64(chain_id),
                hash.as_slice(),
            )
            .await
            .map_err(SubmitError::Store)?
            .is_some();
            if !known {
                let packed = op.pack().map_err(SubmitError::Malformed)?;
                let view = chain_view(&chain.pool)
                    .await
                    .map_err(|_| SendError::Unavailable)?;
                admission::check_fields(&op, &packed, view, &chain.admission)
                    .map_err(SendError::Refused)?;
                crate::eip7702::check(&op, chain_id).map_err(SendError::Refused)?;
                let sender = self
                    .sender_rule(chain_id, &op, hash, chain, &resolution.resolved)
                    .await?;
                replaces = sender.replaces;
                self.paymaster_deposit_rule(
                    chain_id,
                    chain,
                    &resolution.resolved,
                    &op,
                    replaces.as_ref(),
                )
                .await?;
                match crate::validation::validate(
                    &self.env.db,
                    chain,
                    &resolution.resolved,
                    &op,
                    &packed,
                    crate::validation::Admission::Check,
                )
                .await
                {
                    Ok(None) => {}
                    // Back to back (issue 33 §5): the sender's operation at the nonce
                    // below is still open, so this one cannot validate against the
                    // latest block yet (AA25, or AA20 when that one creates the
                    // account). Accepted; its workflow validates it once that lands.
                    Ok(Some(r)) if sender.predecessor && flow::waits_for_predecessor(&r.reason) => {
                    }
                    Ok(Some(r)) => {
                        return Err(match r.breach {
                            Some(breach) => SendError::Violation {
                                code: r.code,
                                reason: r.reason,
                                breach,
                            },
                            None => SendError::Rejected {
                                code: r.code,
                                reason: r.reason,
                                revert: r.revert,
                            },
                        });
                    }
                    Err(_) => return Err(SendError::Unavailable),
                }
            }
        }
        let submitted = flow::submit_resolved(
            &self.env,
            &self.engine,
            chain_id,
            entry_point,
            op,
            organization_id,
            &resolution,
        )
        .await?;
        if let Some(old) = replaces
            && submitted.created
        {
            self.supersede(&old).await?;
        }
        Ok(submitted)
    }

    /// The sender rules of acceptance (ERC-7562): a same-nonce operation open and not
    /// bundled is replaced (when the fees rise enough); an unstaked sender has at most
    /// [`crate::admission::AdmissionConfig::same_sender_mempool_count`] open operations
    /// (UREP-010; a staked one is not bounded). Also says whether the operation at the
    /// nonce just below (same key) is open: a back-to-back operation waits for it.
    ///
    /// # Errors
    /// [`SendError::Refused`] (`SENDER_OPERATION_PENDING`, `REPLACEMENT_IN_FLIGHT`,
    /// `REPLACEMENT_UNDERPRICED`), [`SendError::Store`], [`SendError::Unavailable`] (the
    /// stake could not be read).
    pub(super) async fn sender_rule(
        &self,
        chain_id: u64,
        op: &UserOperation,
        hash: B256,
        chain: &flow::AaChain,
        ep: &crate::ResolvedEntryPoint,
    ) -> Result<SenderCheck, SendError> {
        let open = store::user_operations_open_of_sender(
            &self.env.db,
            flow::chain_id_i64(chain_id),
            op.sender.as_slice(),
        )
        .await
        .map_err(SendError::Store)?;
        let mut check = SenderCheck {
            replaces: None,
            predecessor: false,
        };
        let mut others = 0usize;
        for row in open {
            if row.user_op_hash.0 == hash {
                continue;
            }
            let Ok(other) = serde_json::from_value::<UserOperation>(row.user_operation.clone())
            else {
                others += 1;
                continue;
            };
            if other.nonce != op.nonce {
                check.predecessor |= flow::is_predecessor_nonce(other.nonce, op.nonce);
                others += 1;
                continue;
            }
            if row.state == store::state::BUNDLED {
                return Err(SendError::Refused(admission::replacement_in_flight()));
            }
            admission::check_replacement(&other, op, chain.admission.replacement_increase_percent)
                .map_err(SendError::Refused)?;
            check.replaces = Some(row);
        }
        if others >= chain.admission.same_sender_mempool_count
            && !crate::validation::is_staked(&chain.pool, ep.address(), op.sender)
                .await
                .map_err(|_| SendError::Unavailable)?
        {
            return Err(SendError::Refused(admission::sender_pending()));
        }
        Ok(check)
    }

    /// ERC-7562 EREP-010: the paymaster's EntryPoint deposit covers the maximum cost of
    /// its open operations (but the one `replaces` supersedes) and `op`'s
    /// ([`admission::check_paymaster_deposit`]). Nothing to check without a paymaster.
    ///
    /// # Errors
    /// [`SendError::Refused`] (`PAYMASTER_DEPOSIT_TOO_LOW`, -32508), [`SendError::Store`],
    /// [`SendError::Unavailable`] (the deposit could not be read).
    pub(super) async fn paymaster_deposit_rule(
        &self,
        chain_id: u64,
        chain: &flow::AaChain,
        ep: &crate::ResolvedEntryPoint,
        op: &UserOperation,
        replaces: Option<&UserOperationRow>,
    ) -> Result<(), SendError> {
        let Some(paymaster) = op.paymaster else {
            return Ok(());
        };
        let rows = store::user_operations_open_with_paymaster(
            &self.env.db,
            flow::chain_id_i64(chain_id),
            &format!("{paymaster:#x}"),
        )
        .await
        .map_err(SendError::Store)?;
        // Every open operation counts against the deposit: one whose stored JSON does not
        // decode is an error (never left out, which would under-count what is committed).
        let open: Vec<UserOperation> = rows
            .into_iter()
            .filter(|(hash, _)| replaces.is_none_or(|r| &r.user_op_hash != hash))
            .map(|(_, json)| {
                serde_json::from_value(json).map_err(|_| {
                    tracing::error!(target: "keel::aa::store", table = "aa_user_operation",
                        column = "user_operation", "a stored row does not decode; it is refused");
                    SendError::Store(keel_store::StoreError::Decode)
                })
            })
            .collect::<Result<_, _>>()?;
        let deposit = crate::bundler::entry_point_deposit(&chain.pool, ep, paymaster)
            .await
            .map_err(|_| SendError::Unavailable)?;
        admission::check_paymaster_deposit(op, &open, deposit).map_err(SendError::Refused)
    }

    /// Ends `old` as `replaced` (when it is still not bundled) and tells its workflow,
    /// in one transaction, once (the signal is deduplicated).
    pub(super) async fn supersede(&self, old: &UserOperationRow) -> Result<(), SendError> {
        let db = |e: sqlx::Error| SendError::Store(e.into());
        let code = Erc7769Code::InvalidParams.code();
        let mut tx = self.env.db.begin().await.map_err(db)?;
        let (chain_id, old_hash) = old.key();
        if !store::user_operation_replace(&mut *tx, chain_id, old_hash, code)
            .await
            .map_err(SendError::Store)?
        {
            // Bundled meanwhile: it stays in flight; the replacement waits behind it
            // (the bundler never bundles a sender in flight) and fails AA25 once the
            // nonce is used.
            tracing::info!(target: "keel::aa", "replaced user operation was bundled meanwhile; it stays in flight");
            return Ok(());
        }
        let outcome = flow::OutcomeSignal::ended(store::state::REPLACED, code, "REPLACED");
        let payload = serde_json::to_value(&outcome)
            .map_err(|_| SendError::Store(keel_store::StoreError::Decode))?;
        match self
            .engine
            .signal_in_as(
                &mut tx,
                old.instance_id,
                flow::OUTCOME_SIGNAL,
                "replaced",
                &payload,
                &keel_durable::Actor::system(crate::bundler::BUNDLER_ACTOR),
            )
            .await
        {
            Ok(_)
            | Err(
                keel_durable::DurableError::InstanceEnded { .. }
                | keel_durable::DurableError::InstanceNotFound(_),
            ) => {}
            Err(e) => return Err(SendError::Submit(SubmitError::Engine(e))),
        }
        tx.commit().await.map_err(db)?;
        Ok(())
    }
}
