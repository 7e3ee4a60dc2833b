//! The signing stage: prepared requests get consecutive nonces, are signed in groups
//! across senders (the signer may be remote) and each group is committed in one
//! statement ([`store::commit_signed`]) that checks, under the senders' row locks, that
//! nothing moved meanwhile.

use super::attempt::{Fees, SenderPlan, ToSend};
use super::{Signing, TxQueue, metrics};
use crate::store::{self, AttemptRow, NewAttempt};
use crate::{RequestState, Result, TxqError};
use alloy::eips::Encodable2718;
use alloy::primitives::B256;
use tokio_util::sync::CancellationToken;

/// Transactions signed per signing group (one commit statement, across senders).
pub(super) const SIGN_CHUNK: usize = 128;

/// Signatures of one chunk requested at once (the [`crate::TxSigner`] may be remote).
const SIGN_IN_FLIGHT: usize = 16;

/// `len` prepared requests of `plans[plan]` from `start`: one sender's share of a
/// signing group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    plan: usize,
    start: usize,
    len: usize,
}

/// Splits the plans' prepared requests (plans sorted by sender) into signing groups of
/// at most `size` transactions, in order: a sender's requests stay in queue order, each
/// sender appears at most once per group, and a sender's later pieces come in later
/// groups.
fn signing_groups(plans: &[SenderPlan], size: usize) -> Vec<Vec<Piece>> {
    let lens: Vec<usize> = plans.iter().map(|p| p.ready.len()).collect();
    pieces_of(&lens, size)
}

/// [`signing_groups`] over the number of prepared requests of each plan.
fn pieces_of(lens: &[usize], size: usize) -> Vec<Vec<Piece>> {
    let size = size.max(1);
    let mut groups = Vec::new();
    let mut current = Vec::new();
    let mut filled = 0;
    for (plan, &len) in lens.iter().enumerate() {
        let mut start = 0;
        while start < len {
            let take = (size - filled).min(len - start);
            current.push(Piece {
                plan,
                start,
                len: take,
            });
            filled += take;
            start += take;
            if filled == size {
                groups.push(std::mem::take(&mut current));
                filled = 0;
            }
        }
    }
    if !current.is_empty() {
        groups.push(current);
    }
    groups
}

/// A signing group with its signatures: per piece, the signed transactions or `None`
/// when a signature failed (the first such error kept).
struct SignedGroup {
    pieces: Vec<Piece>,
    signed: Vec<Option<Vec<SignedTx>>>,
    error: Option<TxqError>,
}

/// One signed transaction of a group: (nonce, hash, EIP-2718 bytes, gas limit).
type SignedTx = (i64, B256, Vec<u8>, i64);

fn to_i64(n: usize) -> Result<i64> {
    i64::try_from(n).map_err(|_| TxqError::InvalidRequest("nonce"))
}

impl TxQueue {
    /// The signing half of a signing round: signs the prepared requests of `plans`
    /// (sorted by sender) in groups of up to [`SIGN_CHUNK`] transactions across senders
    /// with `fees`, commits each group in one statement, and hands every committed group
    /// to `sink`. Counts and errors go to `out`.
    pub(super) async fn sign_plans(
        &self,
        plans: &[SenderPlan],
        fees: Fees,
        sink: Option<&tokio::sync::mpsc::UnboundedSender<Vec<ToSend>>>,
        out: &mut Signing,
        cancel: &CancellationToken,
    ) {
        // Signing and committing are pipelined: the next group is signed while one
        // commits. A group signed after an earlier group of the same sender failed to
        // commit cannot commit either (its first nonce is not the sender's next).
        let groups = signing_groups(plans, SIGN_CHUNK);
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<SignedGroup>>(1);
        let sign = async move {
            for group in &groups {
                if cancel.is_cancelled() {
                    break;
                }
                let signed = self.sign_group(plans, group, fees).await;
                let stop = signed.is_err();
                if tx.send(signed).await.is_err() || stop {
                    break;
                }
            }
        };
        let commit = async {
            while let Some(signed) = rx.recv().await {
                if cancel.is_cancelled() {
                    // Signed but not committed: discarded unbroadcast, the requests
                    // stay queued.
                    break;
                }
                let committed = match signed {
                    Ok(group) => self.commit_group(plans, group, fees).await,
                    Err(e) => Err(e),
                };
                match committed {
                    Ok((done, err)) => {
                        if let Some(e) = err {
                            out.fail(e);
                        }
                        out.moved += done.len();
                        out.signed += done.len();
                        if let Some(sink) = sink
                            && !done.is_empty()
                        {
                            // Committed: these may be broadcast now. A closed receiver
                            // only means the broadcaster failed; the rows stay `signed`
                            // for the next round.
                            let _ = sink.send(done);
                        }
                    }
                    // The store failed: nothing more is signed this round.
                    Err(e) => {
                        out.fail(e);
                        break;
                    }
                }
            }
        };
        tokio::join!(sign, commit);
    }

    /// Signs the pieces of `group` (skipping senders that failed earlier this round)
    /// with consecutive nonces from each sender's next nonce as read. The signatures
    /// are requested concurrently (up to [`SIGN_IN_FLIGHT`] at once; the signer may be
    /// remote); a piece with a failed signature is left out of the commit.
    async fn sign_group(
        &self,
        plans: &[SenderPlan],
        group: &[Piece],
        Fees {
            max_fee_per_gas: max_fee,
            max_priority_fee_per_gas: tip,
        }: Fees,
    ) -> Result<SignedGroup> {
        use futures::StreamExt;
        let pieces: Vec<Piece> = group
            .iter()
            .filter(|p| {
                !plans[p.plan]
                    .failed
                    .load(std::sync::atomic::Ordering::Acquire)
            })
            .copied()
            .collect();
        let mut futures = Vec::new();
        for piece in &pieces {
            let plan = &plans[piece.plan];
            let signer = self
                .signers
                .get(&plan.sender)
                .ok_or(TxqError::UnknownSender)?;
            for (k, r) in plan.ready[piece.start..piece.start + piece.len]
                .iter()
                .enumerate()
            {
                let nonce = plan.first + to_i64(piece.start + k)?;
                let unsigned = r.body.unsigned(
                    self.config.fee_model,
                    self.chain.chain().get(),
                    u64::try_from(nonce).map_err(|_| TxqError::InvalidRequest("nonce"))?,
                    r.gas_limit,
                    Fees {
                        max_fee_per_gas: max_fee,
                        max_priority_fee_per_gas: tip,
                    },
                )?;
                futures.push(signer.sign(unsigned));
            }
        }
        let mut envelopes = futures::stream::iter(futures)
            .buffered(SIGN_IN_FLIGHT)
            .collect::<Vec<_>>()
            .await
            .into_iter();
        // Per piece: (nonce, hash, raw, gas) of each request, or a signing error.
        let mut first_err = None;
        let mut signed: Vec<Option<Vec<SignedTx>>> = Vec::new();
        for piece in &pieces {
            let plan = &plans[piece.plan];
            let mut rows = Some(Vec::with_capacity(piece.len));
            for (k, r) in plan.ready[piece.start..piece.start + piece.len]
                .iter()
                .enumerate()
            {
                let envelope = envelopes.next();
                let Some(list) = rows.as_mut() else {
                    continue;
                };
                match envelope {
                    Some(Ok(envelope)) => list.push((
                        plan.first + to_i64(piece.start + k)?,
                        *envelope.tx_hash(),
                        envelope.encoded_2718(),
                        i64::try_from(r.gas_limit)
                            .map_err(|_| TxqError::InvalidRequest("gas_limit"))?,
                    )),
                    Some(Err(e)) => {
                        // Nothing of this sender's piece is committed: its requests stay
                        // queued, the round reports the error and the rounds back off.
                        metrics::sign_failures(self.chain_id, e.code());
                        tracing::warn!(target: "keel::txq", sender = %plan.sender, reason = e.code(), "signing failed; the requests stay queued");
                        first_err.get_or_insert(TxqError::from(e));
                        rows = None;
                    }
                    None => rows = None,
                }
            }
            signed.push(rows);
        }
        Ok(SignedGroup {
            pieces,
            signed,
            error: first_err,
        })
    }

    /// Commits a signed group in one statement ([`store::commit_signed`]). Returns the
    /// committed requests with their attempt, ready to broadcast, and the group's first
    /// signing error. A sender whose signature failed, or whose slice did not commit
    /// (its next nonce moved or a request was taken by another process), is marked
    /// failed: its later pieces are not signed this round, and its requests stay
    /// queued.
    async fn commit_group(
        &self,
        plans: &[SenderPlan],
        SignedGroup {
            pieces,
            signed,
            error: first_err,
        }: SignedGroup,
        Fees {
            max_fee_per_gas: max_fee,
            max_priority_fee_per_gas: tip,
        }: Fees,
    ) -> Result<(Vec<ToSend>, Option<TxqError>)> {
        let (max_fee_s, tip_s) = (max_fee.to_string(), tip.to_string());
        let slices: Vec<store::SignedSlice<'_>> = pieces
            .iter()
            .zip(&signed)
            .filter_map(|(piece, rows)| {
                let plan = &plans[piece.plan];
                let rows = rows.as_ref()?;
                Some(store::SignedSlice {
                    sender: plan.sender.as_slice(),
                    first: plan.first + i64::try_from(piece.start).ok()?,
                    attempts: plan.ready[piece.start..piece.start + piece.len]
                        .iter()
                        .zip(rows)
                        .map(|(r, (nonce, hash, raw, gas))| NewAttempt {
                            request_id: r.id,
                            attempt: 1,
                            nonce: *nonce,
                            hash: hash.as_slice(),
                            raw,
                            max_fee: max_fee_s.clone(),
                            priority_fee: tip_s.clone(),
                            gas_limit: *gas,
                        })
                        .collect(),
                })
            })
            .collect();
        let committed: std::collections::HashSet<alloy::primitives::Address> = if slices.is_empty()
        {
            Default::default()
        } else {
            store::commit_signed(&self.db, self.chain_id, &slices)
                .await?
                .into_iter()
                .collect()
        };
        drop(slices);
        let mut done = Vec::new();
        let failed: Vec<usize> = pieces
            .iter()
            .zip(signed)
            .filter_map(|(piece, rows)| {
                let plan = &plans[piece.plan];
                let Some(rows) = rows else {
                    return Some(piece.plan);
                };
                if !committed.contains(&plan.sender) {
                    tracing::debug!(target: "keel::txq", sender = %plan.sender, "next nonce or requests changed meanwhile; nothing committed, retried next round");
                    return Some(piece.plan);
                }
                for (r, (nonce, hash, raw, gas)) in plan.ready
                    [piece.start..piece.start + piece.len]
                    .iter()
                    .zip(rows)
                {
                    let mut row = r.row.clone();
                    row.state = RequestState::Signed;
                    row.nonce = Some(nonce);
                    let attempt = AttemptRow {
                        request_id: r.id,
                        attempt: 1,
                        nonce,
                        tx_hash: keel_units::db::DbHash(hash),
                        raw,
                        max_fee_per_gas: max_fee_s.clone(),
                        max_priority_fee_per_gas: tip_s.clone(),
                        gas_limit: gas,
                        age_ms: 0,
                    };
                    done.push((row, vec![attempt]));
                }
                None
            })
            .collect();
        for plan in failed {
            plans[plan]
                .failed
                .store(true, std::sync::atomic::Ordering::Release);
        }
        metrics::signed(self.chain_id, done.len());
        Ok((done, first_err))
    }
}

#[cfg(test)]
mod tests {
    use super::{Piece, pieces_of};

    fn p(plan: usize, start: usize, len: usize) -> Piece {
        Piece { plan, start, len }
    }

    #[test]
    fn signing_groups_split_senders_in_order_and_never_repeat_one_within_a_group() {
        assert_eq!(
            pieces_of(&[3, 5, 1], 4),
            vec![
                vec![p(0, 0, 3), p(1, 0, 1)],
                vec![p(1, 1, 4)],
                vec![p(2, 0, 1)],
            ]
        );
        // One sender with more than a group: consecutive pieces, in queue order.
        assert_eq!(
            pieces_of(&[9], 4),
            vec![vec![p(0, 0, 4)], vec![p(0, 4, 4)], vec![p(0, 8, 1)]]
        );
        assert!(pieces_of(&[], 4).is_empty());
        // Every request lands in exactly one piece, whatever the sizes.
        for size in 1..7 {
            let lens = [0, 2, 7, 1, 0, 13];
            let groups = pieces_of(&lens, size);
            for g in &groups {
                assert!(g.iter().map(|p| p.len).sum::<usize>() <= size);
                let mut plans: Vec<usize> = g.iter().map(|p| p.plan).collect();
                plans.dedup();
                assert_eq!(plans.len(), g.len(), "a sender once per group");
            }
            for (plan, &len) in lens.iter().enumerate() {
                let covered: Vec<usize> = groups
                    .iter()
                    .flatten()
                    .filter(|p| p.plan == plan)
                    .flat_map(|p| p.start..p.start + p.len)
                    .collect();
                assert_eq!(covered, (0..len).collect::<Vec<_>>());
            }
        }
    }
}
