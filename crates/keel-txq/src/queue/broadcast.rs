//! The broadcast stage: `signed` requests go out after their commit, outside any
//! transaction, in JSON-RPC batches that each hold one sender's consecutive nonces;
//! the accepted ones are marked `broadcast` in one statement.

use super::attempt::{Accepted, Broadcast, ToSend, error_class};
use super::{TxQueue, metrics};
use crate::store::{self, AttemptRow, RequestRow};
use crate::{RequestState, Result};
use alloy::primitives::{Address, Bytes};
use keel_chain::ChainError;
use std::collections::HashMap;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Signed requests broadcast per marking statement (leftovers of earlier passes).
pub(super) const BROADCAST_CHUNK: usize = 256;

impl TxQueue {
    /// The `signed` requests (of `only`, or of every sender with a signer) with their
    /// attempts, by sender in nonce order.
    pub(super) async fn signed_of(&self, only: Option<Address>) -> Result<Vec<ToSend>> {
        let signed = store::requests_in_flight(
            &self.db,
            self.chain_id,
            only.as_ref().map(|s| s.as_slice()),
            Some(RequestState::Signed.as_str()),
        )
        .await?;
        let signed: Vec<RequestRow> = signed
            .into_iter()
            .filter(|r| self.signers.contains_key(&r.sender.0))
            .collect();
        // A request whose broadcasts keep failing waits out its backoff (issue 32 §8):
        // one failing nonce is not sent to every upstream several times a second. Its
        // later nonces wait behind it anyway (a node holds them until it arrives).
        let before = signed.len();
        let signed: Vec<RequestRow> = signed.into_iter().filter(|r| r.broadcast_due).collect();
        metrics::broadcasts_deferred(self.chain_id, before - signed.len());
        if signed.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = signed.iter().map(|r| r.id).collect();
        let mut attempts: HashMap<Uuid, Vec<AttemptRow>> = HashMap::new();
        for a in store::attempts_of(&self.db, &ids).await? {
            attempts.entry(a.request_id).or_default().push(a);
        }
        Ok(signed
            .into_iter()
            .map(|r| {
                let mine = attempts.remove(&r.id).unwrap_or_default();
                (r, mine)
            })
            .collect())
    }

    /// Broadcasts the latest attempt of every `signed` request of `sender` in nonce
    /// order, a bounded number in flight; those that must be retried stay `signed` and
    /// go out again (same bytes) next pass.
    pub(super) async fn broadcast_signed(
        &self,
        sender: Address,
        cancel: &CancellationToken,
    ) -> Result<usize> {
        let mut moved = 0;
        for chunk in self.signed_of(Some(sender)).await?.chunks(BROADCAST_CHUNK) {
            moved += self.broadcast_many(chunk, cancel).await?;
        }
        Ok(moved)
    }

    /// Broadcasts the last attempt of each request of `items` (grouped by sender, each
    /// sender's in nonce order), then marks the accepted ones `broadcast` in one
    /// statement. Returns how many moved (accepted or settled).
    ///
    /// With JSON-RPC batches (`broadcast_batch` > 1), up to `broadcast_in_flight /
    /// broadcast_batch` batches are outstanding at once, each holding one sender's
    /// consecutive nonces; a sender gets more than one of them only when fewer senders
    /// than that have requests here (Anvil 1.7.1 can strand a transaction whose
    /// predecessor arrives concurrently: a sender's nonces arrive in order whenever
    /// the parallelism can come from other senders). Without batches, up to
    /// `broadcast_in_flight` single sends are outstanding (nodes hold a briefly
    /// out-of-order nonce until its predecessor arrives).
    ///
    /// Failed broadcasts are recorded ([`TxQueue::broadcast_failed`]). Nothing is sent
    /// once `cancel` fired, and nothing is written after it fired (sent requests then
    /// stay `signed`; the next owner sends the same bytes again).
    pub(super) async fn broadcast_many(
        &self,
        items: &[ToSend],
        cancel: &CancellationToken,
    ) -> Result<usize> {
        use futures::StreamExt;
        if cancel.is_cancelled() {
            return Ok(0);
        }
        // Each traced request's broadcast span, from the send to its outcome.
        let spans: Vec<Option<tracing::Span>> = items
            .iter()
            .map(|(req, _)| super::trace::request_span("txq.broadcast", req))
            .collect();
        // The futures are built up front (no closure over borrowed rows inside the
        // stream), which keeps this future `Send`.
        let results: Vec<Result<Broadcast>> = if self.config.broadcast_batch > 1 {
            let batch = self.config.broadcast_batch;
            // One lane per run of the same sender.
            let mut lanes: Vec<(usize, &[ToSend])> = Vec::new();
            let mut start = 0;
            for i in 1..=items.len() {
                if i == items.len() || items[i].0.sender != items[start].0.sender {
                    lanes.push((start, &items[start..i]));
                    start = i;
                }
            }
            // Batches in flight at once, shared by the lanes; a lane gets more than one
            // only when there are fewer lanes than that.
            let slots = (self.config.broadcast_in_flight / batch).max(1);
            let per_lane = (slots / lanes.len().max(1)).max(1);
            let lanes: Vec<_> = lanes
                .into_iter()
                .map(|(offset, lane)| async move {
                    let batches: Vec<_> = lane.chunks(batch).map(|c| self.send_batch(c)).collect();
                    let out: Vec<Vec<Result<Broadcast>>> = futures::stream::iter(batches)
                        .buffered(per_lane)
                        .collect()
                        .await;
                    (offset, out.into_iter().flatten().collect::<Vec<_>>())
                })
                .collect();
            let mut done: Vec<(usize, Vec<Result<Broadcast>>)> = futures::stream::iter(lanes)
                .buffer_unordered(slots)
                .collect()
                .await;
            done.sort_by_key(|(offset, _)| *offset);
            done.into_iter().flat_map(|(_, out)| out).collect()
        } else {
            let sends: Vec<_> = items
                .iter()
                .map(|(req, mine)| self.send_last(req, mine))
                .collect();
            futures::stream::iter(sends)
                .buffered(self.config.broadcast_in_flight.max(1))
                .collect()
                .await
        };
        let mut accepted = Vec::new();
        let mut failures = Vec::new();
        let mut moved = 0;
        let mut first_err = None;
        for (((req, mine), r), span) in items.iter().zip(results).zip(&spans) {
            super::trace::record_outcome(
                span.as_ref(),
                match &r {
                    Ok(Broadcast::Accepted) => "accepted",
                    Ok(Broadcast::Settled) => "settled",
                    Ok(Broadcast::Resigned) => "resigned",
                    Ok(Broadcast::Retry(_)) => "retry",
                    Err(_) => "error",
                },
            );
            match r {
                Ok(Broadcast::Accepted) => {
                    if let Some(a) = mine.last() {
                        match Accepted::of(req.id, a) {
                            Ok(a) => accepted.push(a),
                            Err(e) => {
                                first_err.get_or_insert(e);
                            }
                        }
                    }
                }
                Ok(Broadcast::Settled | Broadcast::Resigned) => moved += 1,
                Ok(Broadcast::Retry(Some(class))) => failures.push((req.id, class)),
                Ok(Broadcast::Retry(None)) => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if cancel.is_cancelled() {
            return first_err.map_or(Ok(moved), Err);
        }
        self.broadcast_failed(&failures).await?;
        // A failure here leaves them `signed`: the next pass sends the same bytes
        // again ("already known", or "nonce too low" resolved by their receipts).
        let marked = self.mark_broadcast(&accepted).await?;
        metrics::time_to_broadcast(self.chain_id, &marked);
        metrics::broadcasts(self.chain_id, accepted.len());
        moved += accepted.len();
        match first_err {
            Some(e) => Err(e),
            None => Ok(moved),
        }
    }

    /// [`TxQueue::send_last`] for every item of `items` with one JSON-RPC batch;
    /// one outcome per item, in order.
    async fn send_batch(&self, items: &[ToSend]) -> Vec<Result<Broadcast>> {
        let raws: Vec<Bytes> = items
            .iter()
            .filter_map(|(_, mine)| mine.last().map(|a| Bytes::from(a.raw.clone())))
            .collect();
        let answers = match self.chain.send_raw_transactions(&raws).await {
            Ok(answers) => answers,
            Err(e) => {
                tracing::debug!(target: "keel::txq", error = %e, "batched broadcast failed; the same bytes go out next pass");
                let class = error_class(&e);
                return items
                    .iter()
                    .map(|(_, mine)| Ok(Broadcast::Retry((!mine.is_empty()).then_some(class))))
                    .collect();
            }
        };
        let mut answers = answers.into_iter();
        let mut out = Vec::with_capacity(items.len());
        for (req, mine) in items {
            if mine.is_empty() {
                out.push(Ok(Broadcast::Retry(None)));
                continue;
            }
            let sent = match answers.next() {
                Some(Ok(hash)) => Ok(hash),
                Some(Err(error)) => Err(ChainError::Node {
                    method: "eth_sendRawTransaction",
                    error,
                }),
                None => {
                    out.push(Ok(Broadcast::Retry(None)));
                    continue;
                }
            };
            out.push(self.sent(req, mine, sent).await);
        }
        out
    }

    async fn send_last(&self, req: &RequestRow, mine: &[AttemptRow]) -> Result<Broadcast> {
        match mine.last() {
            Some(last) => self.send(req, last, mine).await,
            None => Ok(Broadcast::Retry(None)),
        }
    }
}
