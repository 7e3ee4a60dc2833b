//! The bundle pass: ready operations packed into one `handleOps` bundle, simulated and
//! enqueued on the transaction queue; operations that cannot be bundled ended (see the
//! module docs of [`crate::bundler`]).

use super::*;

impl Bundler {
    /// Packs ready operations into one bundle and enqueues it (see the module docs);
    /// the number of operations moved (bundled or ended alone). In the manual mode of
    /// the `debug_bundler_*` namespace ([`crate::debug`]) it does nothing unless a
    /// bundle was asked for, and clears that request once the bundle is enqueued.
    ///
    /// # Errors
    /// [`BundlerError`]; a failure before the commit writes nothing of the bundle.
    pub async fn bundle_pass(&self) -> Result<u64, BundlerError> {
        let chain_id = chain_id_i64(self.chain_id);
        let (manual, send_now) = store::bundler_control_get(&self.env.db, chain_id).await?;
        if manual && !send_now {
            return Ok(0);
        }
        let expired = self.expire_pass().await?;
        let moved = expired + self.pack_and_enqueue().await?;
        if send_now {
            store::bundler_control_send_now(&self.env.db, chain_id, false).await?;
        }
        Ok(moved)
    }

    /// Ends every operation `ready` for longer than [`BundlerConfig::ready_ttl`]
    /// `failed` (`MEMPOOL_EXPIRED`, -32602), reported to its workflow in the same
    /// transaction: an operation that can never be bundled (fees below a base fee that
    /// does not come down) does not wait forever. The number ended.
    async fn expire_pass(&self) -> Result<u64, BundlerError> {
        let ttl = i64::try_from(self.config.ready_ttl.as_secs()).unwrap_or(i64::MAX);
        let rows = store::user_operations_ready_expired(
            &self.env.db,
            chain_id_i64(self.chain_id),
            ttl,
            256,
        )
        .await?;
        let code = crate::Erc7769Code::InvalidParams.code();
        let mut ended = 0u64;
        for row in rows {
            let l = load(row)?;
            self.end(&l, store::state::FAILED, code, MEMPOOL_EXPIRED, "ready-ttl")
                .await?;
            ended += 1;
        }
        if ended > 0 {
            tracing::info!(target: "keel::aa::bundler", chain_id = self.chain_id, ended, "user operations ready for longer than aa.readyTtlSecs ended MEMPOOL_EXPIRED");
            count_ops(self.chain_id, "expired", ended);
        }
        Ok(ended)
    }

    /// The body of [`Bundler::bundle_pass`].
    async fn pack_and_enqueue(&self) -> Result<u64, BundlerError> {
        let db = &self.env.db;
        let chain = self.chain()?;
        let max = self.config.max_operations.max(1);
        let rows = store::user_operations_ready(
            db,
            chain_id_i64(self.chain_id),
            i64::try_from(max.saturating_mul(4)).unwrap_or(i64::MAX),
        )
        .await?;
        if rows.is_empty() {
            return Ok(0);
        }
        // The bundle gas budget: min(configured maximum, latest block gas limit − margin),
        // below the gas of a bundle the queue refused for the block gas limit.
        let view = crate::service::chain_view(&chain.pool).await?;
        let overhead = self.overhead();
        let mut budget = admission::bundle_gas_budget(&chain.admission, view.block_gas_limit);
        let ceiling = self.gas_ceiling.load(std::sync::atomic::Ordering::Relaxed);
        if ceiling > 0 {
            budget = budget.min(ceiling);
        }
        let mut senders = HashSet::new();
        let mut chosen: Vec<Loaded> = Vec::new();
        let mut entry_point: Option<Address> = None;
        let mut gas = overhead;
        let mut moved = 0u64;
        for row in rows {
            let l = load(row)?;
            let ep = l.resolution.resolved.address();
            // A sender's oldest ready operation only (its later ones wait behind it), and
            // never an address that is another chosen operation's sender and paymaster or
            // factory (ERC-7562 STO-040).
            if *entry_point.get_or_insert(ep) != ep
                || crate::validation::entity_conflict(chosen.iter().map(|c| &c.op), &l.op)
                || !senders.insert(l.op.sender)
            {
                continue;
            }
            let op_gas = admission::operation_gas(&l.op);
            if op_gas.saturating_add(overhead) > budget {
                // Can never fit a bundle now: ended with a typed reason, never bundled.
                let (code, reason) = too_large();
                self.end(&l, store::state::FAILED, code, reason, "bundle-gas")
                    .await?;
                count_ops(self.chain_id, "failed", 1);
                moved += 1;
                continue;
            }
            if l.op.max_fee_per_gas.get() < alloy::primitives::U256::from(view.base_fee_per_gas) {
                // Its fees would not cover the base fee: the operator would pay the
                // difference. It waits (ready) for the base fee to come down.
                continue;
            }
            if gas.saturating_add(op_gas) > budget {
                continue; // the next bundle
            }
            gas = gas.saturating_add(op_gas);
            chosen.push(l);
            if chosen.len() == max {
                break;
            }
        }
        let Some(first) = chosen.first() else {
            return Ok(moved);
        };
        let ep = first.resolution.resolved;
        // Simulate; an operation the EntryPoint names fails alone.
        loop {
            let packed: Vec<PackedUserOperation> =
                chosen.iter().map(|l| l.packed.clone()).collect();
            let authorizations = crate::eip7702::authorization_list(chosen.iter().map(|l| &l.op));
            match simulate_handle_ops(&chain.pool, &ep, &packed, chain.bundler, authorizations)
                .await?
            {
                None => break,
                Some(rejection) if rejection.op_index < chosen.len() && rejection.aa.is_some() => {
                    let l = chosen.remove(rejection.op_index);
                    crate::validation::penalise_bundle_failure(db, chain, &l.op, rejection.aa)
                        .await?;
                    let f = rejection_failure(&rejection);
                    self.end(
                        &l,
                        store::state::FAILED,
                        f.code,
                        &f.reason,
                        "bundle-simulation",
                    )
                    .await?;
                    count_ops(self.chain_id, "failed", 1);
                    moved += 1;
                    if chosen.is_empty() {
                        return Ok(moved);
                    }
                }
                Some(_) => return Err(BundlerError::Unexplained),
            }
        }
        let packed: Vec<PackedUserOperation> = chosen.iter().map(|l| l.packed.clone()).collect();
        let hashes: Vec<Vec<u8>> = chosen.iter().map(|l| l.hash.to_vec()).collect();
        // Within the budget by construction (operations removed by the simulation only
        // lower it).
        let gas: u64 = chosen
            .iter()
            .map(|l| admission::operation_gas(&l.op))
            .fold(overhead, u64::saturating_add);
        let id = Uuid::new_v4();
        let request = TxRequest {
            sender: chain.bundler,
            idempotency_key: format!("aa-bundle:{id}"),
            to: Some(ep.address()),
            value: Wei::ZERO,
            data: handle_ops_calldata(&packed, chain.beneficiary()),
            gas_limit: Some(gas),
            // A type-4 (EIP-7702) transaction when an operation carries an authorization;
            // its intrinsic cost is in that operation's preVerificationGas.
            authorization_list: crate::eip7702::authorization_list(chosen.iter().map(|l| &l.op))
                .unwrap_or_default(),
        };
        let chain_id = chain_id_i64(self.chain_id);
        let mut tx = db.begin().await?;
        let request_id = chain
            .queue
            .enqueue_in(&mut tx, &request, &EnqueueOptions::default())
            .await?;
        store::bundle_insert(
            &mut *tx,
            id,
            chain_id,
            ep.address().as_slice(),
            request_id,
            &hashes,
        )
        .await?;
        let n = store::user_operations_bundle(&mut *tx, chain_id, &hashes, id).await?;
        if n != hashes.len() as u64 {
            // Another bundler moved some of them meanwhile (not a singleton): write nothing.
            tx.rollback().await?;
            return Ok(moved);
        }
        tx.commit().await?;
        chain.queue.wake();
        count_bundle(self.chain_id, "submitted");
        tracing::info!(
            target: "keel::aa::bundler",
            chain_id = self.chain_id,
            operations = n,
            "bundle enqueued"
        );
        Ok(moved + n)
    }
}
