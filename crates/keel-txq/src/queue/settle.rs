//! Settling requests, part of the stages' shared floor: one request or many in one
//! statement, through the settlement sink in the same transaction when one is set;
//! marking accepted broadcasts; opening and keeping funding waits (with the progress
//! sink); and the nonce hand-back of a request no node ever accepted.

use super::attempt::Accepted;
use super::{TxQueue, metrics};
use crate::progress::{Progress, ProgressSink, ProgressSinkError};
use crate::settlement::{Settled, SettlementSinkError};
use crate::store::{self, RequestRow};
use crate::verdict::SettlementVerdict;
use crate::{Result, TxqError};
use std::collections::HashMap;
use uuid::Uuid;

impl TxQueue {
    /// Settles one request with `verdict` (and hands it to the settlement sink in the
    /// same transaction, when one is set); metrics and a log line when it moved. Returns
    /// false when the sink failed (rolled back: the request keeps its state and a later
    /// pass settles it again), true otherwise (settled now, or settled already: a settled
    /// verdict is never overwritten).
    pub(super) async fn settle(&self, id: Uuid, verdict: &SettlementVerdict) -> Result<bool> {
        self.settle_releasing(id, verdict, None).await
    }

    /// [`Self::settle`], and with `release` (the sender and nonce of a request no node
    /// ever accepted, refused for good) its nonce handed back in the same transaction
    /// when nothing above it is signed ([`store::sender_release_nonce`], issue 33 §1):
    /// the next request takes it and no gap-filling self-transfer is needed. Otherwise
    /// nonce recovery fills the gap.
    pub(super) async fn settle_releasing(
        &self,
        id: Uuid,
        verdict: &SettlementVerdict,
        release: Option<(&[u8], i64)>,
    ) -> Result<bool> {
        let json =
            serde_json::to_value(verdict).map_err(|_| TxqError::InvalidRequest("verdict"))?;
        let row = match (&self.sink, release) {
            (None, None) => store::request_settle(&self.db, id, &json, verdict.kind()).await?,
            (sink, _) => {
                let mut tx = self.db.begin().await?;
                let row = store::request_settle(&mut *tx, id, &json, verdict.kind()).await?;
                if let (Some(_), Some((sender, nonce))) = (&row, release)
                    && store::sender_release_nonce(&mut *tx, self.chain_id, sender, nonce).await?
                {
                    tracing::info!(target: "keel::txq", request = %id, nonce, "refused request's nonce handed back; no gap to fill");
                }
                if let (Some(r), Some(sink)) = (&row, sink) {
                    let settled = [Settled {
                        request_id: id,
                        idempotency_key: &r.idempotency_key,
                        verdict,
                    }];
                    if let Err(e) = sink.record(&mut tx, &settled).await {
                        self.sink_failed(&e, 1);
                        return Ok(false);
                    }
                }
                tx.commit().await?;
                row
            }
        };
        if let Some(r) = row {
            metrics::verdicts(self.chain_id, verdict.kind(), 1);
            if !matches!(verdict, SettlementVerdict::Failed { .. }) {
                metrics::time_to_confirmation(self.chain_id, r.secs);
            }
            tracing::info!(target: "keel::txq", request = %id, verdict = verdict.kind(), "request settled");
        }
        Ok(true)
    }

    /// Settles a `waiting_funding` request past its deadline with `verdict` (and hands
    /// it to the settlement sink in the same transaction, when one is set). Returns
    /// whether it moved: false when it is not waiting any more, its deadline has not
    /// passed, or the sink failed (rolled back; a later check settles it again).
    pub(super) async fn settle_expired(
        &self,
        id: Uuid,
        verdict: &SettlementVerdict,
    ) -> Result<bool> {
        let json =
            serde_json::to_value(verdict).map_err(|_| TxqError::InvalidRequest("verdict"))?;
        let moved = match &self.sink {
            None => store::request_expire_funding(&self.db, id, &json, verdict.kind())
                .await?
                .is_some(),
            Some(sink) => {
                let mut tx = self.db.begin().await?;
                let Some(key) =
                    store::request_expire_funding(&mut *tx, id, &json, verdict.kind()).await?
                else {
                    return Ok(false);
                };
                let settled = [Settled {
                    request_id: id,
                    idempotency_key: &key,
                    verdict,
                }];
                if let Err(e) = sink.record(&mut tx, &settled).await {
                    self.sink_failed(&e, 1);
                    return Ok(false);
                }
                tx.commit().await?;
                true
            }
        };
        if moved {
            metrics::verdicts(self.chain_id, verdict.kind(), 1);
        }
        Ok(moved)
    }

    /// Marks the requests of `accepted` `broadcast` (those still `signed`: a first
    /// broadcast) and, with a progress sink, hands the ones that moved to it in the same
    /// transaction. When the sink fails, each request is marked in its own transaction
    /// with the sink, and one it still refuses without the sink (see `crate::progress`).
    /// Returns, per request that moved, the seconds since enqueue.
    pub(super) async fn mark_broadcast(&self, accepted: &[Accepted]) -> Result<Vec<f64>> {
        if accepted.is_empty() {
            return Ok(Vec::new());
        }
        let Some(sink) = &self.progress_sink else {
            let ids: Vec<Uuid> = accepted.iter().map(|a| a.request_id).collect();
            let rows = store::requests_mark_broadcast_many(&self.db, &ids).await?;
            return Ok(rows.iter().map(|r| r.secs).collect());
        };
        match self.mark_broadcast_with(sink.as_ref(), accepted).await? {
            Ok(secs) => Ok(secs),
            Err(e) => {
                self.progress_sink_failed(&e, "broadcast", accepted.len());
                let mut secs = Vec::new();
                for a in accepted {
                    if accepted.len() > 1 {
                        match self
                            .mark_broadcast_with(sink.as_ref(), std::slice::from_ref(a))
                            .await?
                        {
                            Ok(s) => {
                                secs.extend(s);
                                continue;
                            }
                            Err(e) => self.progress_sink_failed(&e, "broadcast", 1),
                        }
                    }
                    let rows =
                        store::requests_mark_broadcast_many(&self.db, &[a.request_id]).await?;
                    secs.extend(rows.iter().map(|r| r.secs));
                }
                Ok(secs)
            }
        }
    }

    /// One marking statement for `accepted` and the progress sink call on the rows that
    /// moved, in one transaction. `Ok(Err(_))`: the sink failed, nothing was marked.
    async fn mark_broadcast_with(
        &self,
        sink: &dyn ProgressSink,
        accepted: &[Accepted],
    ) -> Result<std::result::Result<Vec<f64>, ProgressSinkError>> {
        let ids: Vec<Uuid> = accepted.iter().map(|a| a.request_id).collect();
        let mut tx = self.db.begin().await?;
        let rows = store::requests_mark_broadcast_many(&mut *tx, &ids).await?;
        if !rows.is_empty() {
            let progress: Vec<Progress<'_>> = rows
                .iter()
                .filter_map(|r| {
                    let a = accepted.iter().find(|a| a.request_id == r.id)?;
                    Some(Progress::Broadcast {
                        request_id: r.id,
                        idempotency_key: &r.idempotency_key,
                        hash: a.hash,
                        nonce: a.nonce,
                    })
                })
                .collect();
            if let Err(e) = sink.record(&mut tx, &progress).await {
                return Ok(Err(e));
            }
        }
        tx.commit().await?;
        Ok(Ok(rows.iter().map(|r| r.secs).collect()))
    }

    /// Moves queued request `req` to `waiting_funding` with its funding request
    /// (`required_wei` from `sender`'s shortfall) and, with a progress sink, hands the
    /// opened request to it in the same transaction; when the sink fails, the move is
    /// made without it (see `crate::progress`). False when the request was not moved
    /// (no longer queued, or without a funding pause).
    pub(super) async fn open_funding(
        &self,
        req: &RequestRow,
        required_wei: alloy::primitives::U256,
        gas_limit: i64,
        max_fee_wei: &str,
        l1_fee_wei: Option<&str>,
    ) -> Result<bool> {
        let required = required_wei.to_string();
        if let Some(sink) = &self.progress_sink {
            let mut tx = self.db.begin().await?;
            let Some((key, deadline)) = store::request_wait_funding(
                &mut *tx,
                req.id,
                &required,
                gas_limit,
                max_fee_wei,
                l1_fee_wei,
            )
            .await?
            else {
                return Ok(false);
            };
            let progress = [Progress::FundingRequested {
                request_id: req.id,
                idempotency_key: &key,
                address: req.sender.0,
                required_wei: keel_units::Wei::new(required_wei),
                deadline,
            }];
            match sink.record(&mut tx, &progress).await {
                Ok(()) => {
                    tx.commit().await?;
                    return Ok(true);
                }
                Err(e) => {
                    drop(tx);
                    self.progress_sink_failed(&e, "funding", 1);
                }
            }
        }
        Ok(store::request_wait_funding(
            &self.db,
            req.id,
            &required,
            gas_limit,
            max_fee_wei,
            l1_fee_wei,
        )
        .await?
        .is_some())
    }

    /// Updates the shortfall (`required_wei`) of `w`, still `waiting_funding`, and, with a
    /// progress sink, offers the open funding request to it again in the same
    /// transaction. The sink reports only what its operation has not reported yet, so
    /// this is a no-op once reported; a funding wait whose first report failed, or that
    /// the sink could not yet see as the operation's wait, is reported on the next
    /// funding check instead of only with the operation's next change. When the sink
    /// fails, the shortfall is updated without it.
    pub(super) async fn keep_waiting(
        &self,
        w: &store::FundingRow,
        required_wei: alloy::primitives::U256,
        max_fee_wei: u128,
    ) -> Result<()> {
        let required = required_wei.to_string();
        let max_fee = max_fee_wei.to_string();
        if let Some(sink) = &self.progress_sink {
            let mut tx = self.db.begin().await?;
            store::request_update_funding(&mut *tx, w.id, &required, &max_fee).await?;
            let progress = [Progress::FundingRequested {
                request_id: w.id,
                idempotency_key: &w.idempotency_key,
                address: w.sender.0,
                required_wei: keel_units::Wei::new(required_wei),
                deadline: w.funding_deadline,
            }];
            match sink.record(&mut tx, &progress).await {
                Ok(()) => {
                    tx.commit().await?;
                    return Ok(());
                }
                Err(e) => {
                    drop(tx);
                    self.progress_sink_failed(&e, "funding", 1);
                }
            }
        }
        store::request_update_funding(&self.db, w.id, &required, &max_fee).await
    }

    /// Records a failed progress sink call (its transaction rolled back): the metric and
    /// a WARN.
    fn progress_sink_failed(&self, e: &ProgressSinkError, change: &'static str, requests: usize) {
        metrics::progress_sink_failures(self.chain_id, change);
        tracing::warn!(target: "keel::txq", chain_id = self.chain_id, change, requests, error = %e,
            error_source = ?std::error::Error::source(e), "progress sink failed; recording the change again");
    }

    /// Records a failed settlement sink call (its transaction rolled back): the metric,
    /// and a WARN with the number of requests left unsettled.
    pub(super) fn sink_failed(&self, e: &SettlementSinkError, requests: usize) {
        metrics::settlement_sink_failures(self.chain_id);
        tracing::warn!(target: "keel::txq", chain_id = self.chain_id, requests, error = %e,
            error_source = ?std::error::Error::source(e), "settlement sink failed; the requests stay unsettled and settle on a later pass");
    }

    /// Settles many requests in one statement (and, with a settlement sink, hands the
    /// ones that moved to it in the same transaction); metrics and logs for the ones that
    /// moved (a request settled already keeps its verdict and is not counted again).
    /// When the sink fails for the batch, each request is settled in its own transaction
    /// at once, so one the sink refuses does not hold back the others (it stays unsettled
    /// for a later pass). Returns how many moved.
    pub(super) async fn settle_many(
        &self,
        verdicts: &[(Uuid, SettlementVerdict)],
    ) -> Result<usize> {
        if verdicts.is_empty() {
            return Ok(0);
        }
        let mut rows = match self.settle_batch(verdicts).await? {
            Ok(rows) => rows,
            Err(e) if verdicts.len() == 1 => {
                self.sink_failed(&e, 1);
                Vec::new()
            }
            Err(e) => {
                self.sink_failed(&e, verdicts.len());
                let mut rows = Vec::new();
                for v in verdicts {
                    match self.settle_batch(std::slice::from_ref(v)).await? {
                        Ok(moved) => rows.extend(moved),
                        Err(e) => self.sink_failed(&e, 1),
                    }
                }
                rows
            }
        };
        let kinds: Vec<&'static str> = verdicts.iter().map(|(_, v)| v.kind()).collect();
        for r in &mut rows {
            let kind = kinds
                .iter()
                .find(|k| **k == r.kind)
                .copied()
                .unwrap_or("failed");
            metrics::verdicts(self.chain_id, kind, 1);
            if kind != "failed" {
                metrics::time_to_confirmation(self.chain_id, r.secs);
            }
            tracing::info!(target: "keel::txq", request = %r.id, verdict = kind, "request settled");
        }
        Ok(rows.len())
    }

    /// One settling statement for `verdicts` and, with a settlement sink, the sink call
    /// on the rows that moved, in one transaction. `Ok(Err(_))`: the sink failed and
    /// the transaction rolled back (nothing settled).
    async fn settle_batch(
        &self,
        verdicts: &[(Uuid, SettlementVerdict)],
    ) -> Result<std::result::Result<Vec<store::SettledRow>, SettlementSinkError>> {
        let mut ids = Vec::with_capacity(verdicts.len());
        let mut json = Vec::with_capacity(verdicts.len());
        let mut kinds = Vec::with_capacity(verdicts.len());
        for (id, v) in verdicts {
            ids.push(*id);
            json.push(serde_json::to_string(v).map_err(|_| TxqError::InvalidRequest("verdict"))?);
            kinds.push(v.kind());
        }
        let Some(sink) = &self.sink else {
            return Ok(Ok(store::requests_settle_many(
                &self.db, &ids, &json, &kinds,
            )
            .await?));
        };
        let mut tx = self.db.begin().await?;
        let rows = store::requests_settle_many(&mut *tx, &ids, &json, &kinds).await?;
        if !rows.is_empty() {
            let by_id: HashMap<Uuid, &SettlementVerdict> =
                verdicts.iter().map(|(id, v)| (*id, v)).collect();
            let settled: Vec<Settled<'_>> = rows
                .iter()
                .filter_map(|r| {
                    by_id.get(&r.id).map(|v| Settled {
                        request_id: r.id,
                        idempotency_key: &r.idempotency_key,
                        verdict: v,
                    })
                })
                .collect();
            if let Err(e) = sink.record(&mut tx, &settled).await {
                return Ok(Err(e));
            }
        }
        tx.commit().await?;
        Ok(Ok(rows))
    }
}
