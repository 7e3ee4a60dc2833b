//! The send machinery every workflow shares: the chain of an operation, one on-chain
//! write sent as transaction-queue requests (attempts) and waited for, the retry gate
//! between attempts, and the reads after a write lands (its event, the index).
//!
//! Vocabulary: a **write** is one named on-chain write of a workflow (`create-feed`,
//! `mint`, ...); each **attempt** of it is one queue request keyed
//! `op/<operation id>/<write>` (attempt 1) or `op/<operation id>/<write>/<n>`, linked to
//! the operation under its **link** `<write>` or `<write>#<n>` (the `step` column of
//! `operation_tx` and the wire name `step`; not a journal step). Its verdict arrives as
//! the signal `tx.<link>`.

use crate::env::{ChainContext, WorkflowEnv};
use crate::store;
use crate::workflows::contract::{CANCELLED, Failure, Landed, OpFailure, TX_SIGNAL_PREFIX};
use alloy::primitives::Address;
use alloy::sol_types::SolEvent;
use keel_abi::bindings::{AssetFactory, AssetToken, PriceFeed, PriceResolver};
use keel_durable::{SignalOutcome, StepError, WorkflowContext, WorkflowFailure};
use keel_txq::{FailureCode, SettlementVerdict, TxRequest};
use keel_units::{ChainId, Wei};
use std::time::Duration;
use uuid::Uuid;

/// The wake tag of chain `chain_id` (see [`keel_durable::StepError::Unavailable`]):
/// the runner calls [`keel_durable::Engine::wake_suspended`] with it when it starts
/// serving the chain and each time a served chain comes back up after failed probes.
pub fn chain_wake_tag(chain_id: u64) -> String {
    format!("chain:{chain_id}")
}

/// The chain of an operation. A chain this runner has configured but does not serve
/// yet (unreachable, or not bootstrapped; the binary keeps retrying it) suspends the
/// instance with `CHAIN_UNAVAILABLE` (retryable) and the chain's wake tag, so that the
/// runner resumes it the moment the chain is served; a chain this runner does not
/// configure at all suspends it with `CHAIN_NOT_CONFIGURED` and recovery retries (another
/// runner may serve it). Neither fails it.
pub(crate) async fn chain_of<'a>(
    ctx: &mut WorkflowContext,
    p: &'a WorkflowEnv,
    chain_id: u64,
) -> Result<&'a ChainContext, Failure> {
    let configured = p.is_configured(ChainId(chain_id));
    step_ok(
        ctx.step("chain", || async move {
            // Read at each attempt: a chain served between two attempts is taken.
            if p.chain(ChainId(chain_id)).is_some() {
                Ok(chain_id)
            } else if configured {
                Err(StepError::<OpFailure>::unavailable(
                    "CHAIN_UNAVAILABLE",
                    chain_wake_tag(chain_id),
                ))
            } else {
                Err(StepError::<OpFailure>::transient("CHAIN_NOT_CONFIGURED"))
            }
        })
        .await?,
    )?;
    // Journaled as served by an earlier segment on a runner that served the chain,
    // replayed here on one that does not: fail retryably (a retry resumes the journal).
    p.chain(ChainId(chain_id)).ok_or_else(|| {
        WorkflowFailure::Failed(if configured {
            OpFailure::new(
                "CHAIN_UNAVAILABLE",
                true,
                "the asset's chain is configured but not served by this runner yet (unreachable or not bootstrapped)",
            )
        } else {
            OpFailure::new(
                "CHAIN_NOT_CONFIGURED",
                true,
                "the asset's chain is not served by this runner",
            )
        })
    })
}

/// One on-chain write of an operation, as the workflow body names it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Write<'a> {
    /// The operation.
    pub(crate) operation_id: Uuid,
    /// The write's name (`create-feed`, `mint`, ...).
    pub(crate) name: &'a str,
    /// The contract the transaction calls.
    pub(crate) contract: Address,
    /// The funding pause deadline, seconds, when the template enables the pause.
    pub(crate) funding_deadline: Option<u64>,
    /// The sender: the operator key's address, or the template's custody vault.
    pub(crate) sender: Address,
    /// Wei sent with the call (0 for every write but a native distribution's batch).
    pub(crate) value: Wei,
}

/// Sends `write` with calldata `call` and waits for its verdict (delivered as the
/// signal `tx.<link>`). Confirmed → [`Landed`]; anything else fails the workflow with
/// the verdict's code, except a retryable failure (`GAS_REQUIRED`,
/// `FUNDING_DEADLINE_EXPIRED`) of an operation that was retried since: that sends the
/// write again as a new, separately keyed attempt.
pub(crate) async fn send(
    ctx: &mut WorkflowContext,
    p: &WorkflowEnv,
    chain: &ChainContext,
    write: Write<'_>,
    call: Vec<u8>,
) -> Result<Landed, Failure> {
    let data = p.suffix.append_to(&call);
    let operation_id = write.operation_id;
    let mut attempt: u32 = 1;
    loop {
        // Attempt 1 keeps the plain names; later attempts (after a retryable failure
        // and a retry of the operation) are new, separately keyed requests.
        let (link, key) = if attempt == 1 {
            (
                write.name.to_owned(),
                format!("op/{operation_id}/{}", write.name),
            )
        } else {
            (
                format!("{}#{attempt}", write.name),
                format!("op/{operation_id}/{}/{attempt}", write.name),
            )
        };
        let signal = format!("{TX_SIGNAL_PREFIX}{link}");
        let request = TxRequest {
            sender: write.sender,
            idempotency_key: key,
            to: Some(write.contract),
            value: write.value,
            data: data.clone(),
            gas_limit: None,
            authorization_list: Vec::new(),
        };
        let attempt_of = Attempt {
            operation_id,
            link: &link,
            signal: &signal,
            funding_deadline: write.funding_deadline,
        };
        let verdict = send_attempt(ctx, p, chain, attempt_of, request).await?;
        match verdict {
            SettlementVerdict::Confirmed {
                block,
                hash: tx_hash,
                ..
            } => {
                return Ok(Landed { tx_hash, block });
            }
            SettlementVerdict::Reverted {
                reason,
                revert_data,
                ..
            } => {
                // An organization system's compliance refusal on chain carries the
                // same typed code as the API's pre-check (issue 37 §2).
                let code = revert_data
                    .as_ref()
                    .and_then(|d| crate::compliance::decode_failure(d))
                    .unwrap_or("EXECUTION_REVERTED");
                return Err(WorkflowFailure::Failed(OpFailure {
                    code: code.to_owned(),
                    retryable: false,
                    detail: "the transaction reverted on chain".to_owned(),
                    write: Some(write.name.to_owned()),
                    reason: reason
                        .or_else(|| revert_data.as_ref().and_then(|d| custom_error_name(d))),
                }));
            }
            SettlementVerdict::Failed {
                code,
                reason,
                revert_data,
                ..
            } => {
                // Withdrawn only by a cancel of this operation (before it was signed):
                // the operation ends `cancelled`, whichever of the verdict and the
                // engine's cancel reaches the instance first.
                if code == FailureCode::Withdrawn {
                    return Err(ctx.cancel_self().into());
                }
                let reason =
                    reason.or_else(|| revert_data.as_ref().and_then(|d| custom_error_name(d)));
                // A refusal found by the queue's estimate (never broadcast): the
                // compliance code, as a refusal on chain.
                let refusal = revert_data
                    .as_ref()
                    .and_then(|d| crate::compliance::decode_failure(d));
                let retryable = matches!(
                    code,
                    FailureCode::GasRequired | FailureCode::FundingDeadlineExpired
                );
                if retryable && retried(ctx, p, operation_id, &link, attempt).await? {
                    attempt += 1;
                    continue;
                }
                return Err(WorkflowFailure::Failed(OpFailure {
                    detail: match &code {
                        FailureCode::GasRequired => {
                            "the operator account cannot pay for gas; fund it and retry the operation"
                        }
                        FailureCode::FundingDeadlineExpired => {
                            "the operator account was not funded in time; fund it and retry the operation"
                        }
                        FailureCode::ExecutionReverted => "the transaction would revert",
                        FailureCode::CustodyRejected
                        | FailureCode::CustodyBlocked
                        | FailureCode::CustodyCancelled
                        | FailureCode::CustodyFailed
                        | FailureCode::CustodyRefused => {
                            "the custody provider did not sign the transaction (see reason)"
                        }
                        FailureCode::CustodyTimedOut => {
                            "the custody provider never broadcast the transaction; it was cancelled there"
                        }
                        FailureCode::CustodyApprovalExpired => {
                            "the approval at the custody provider did not come before the vault's deadline; the transaction was cancelled there and nothing reached the chain"
                        }
                        _ => "the transaction did not take effect",
                    }
                    .to_owned(),
                    code: refusal.map_or_else(|| code.to_string(), str::to_owned),
                    retryable,
                    write: Some(write.name.to_owned()),
                    reason,
                }));
            }
            _ => {
                return Err(WorkflowFailure::Failed(OpFailure::new(
                    "VERDICT_UNKNOWN",
                    false,
                    "the settlement verdict has an unknown kind",
                )));
            }
        }
    }
}

/// Whether operation `operation_id` was retried (`POST /v1/operations/{id}/retry`) at
/// least `attempt` times since attempt `attempt` of a write (linked as `link`) failed
/// retryably: then the write is sent again as attempt `attempt + 1`.
///
/// The retry count is read inside journaled steps named `retried <link> <n>`, so the
/// body reads the database only in steps. A plain journaled read would be wrong here:
/// the count grows *after* the segment that read it has failed (a retry is what makes
/// it grow, and the retry replays this very journal), so a journaled "no" must not bind
/// the replay a retry starts. The rule that keeps replays identical:
/// - a **yes** is final: the count never shrinks, and every replay reads that yes back;
/// - a **no read live** ends the segment: the operation fails, retryably;
/// - a **no read back from the journal** therefore belongs to a segment that ended
///   there, so the gate reads again in its next step (`n + 1`), live.
///
/// A replay without a retry in between reads back exactly the answers of the run it
/// replays; a retry appends at most one gate step per failed attempt. (Journals written
/// before this gate existed hold no gate steps: an instance that was retried past a
/// retryable failure under that version replays into a determinism violation.) A count
/// that cannot be read counts as 0, as before: the operation fails again, retryably.
async fn retried(
    ctx: &mut WorkflowContext,
    p: &WorkflowEnv,
    operation_id: Uuid,
    link: &str,
    attempt: u32,
) -> Result<bool, Failure> {
    let db = &p.db;
    let mut gate: u32 = 1;
    loop {
        let replayed = ctx.is_replaying();
        let yes = step_ok(
            ctx.step(&format!("retried {link} {gate}"), || async move {
                let retries = store::operation_retries_get(db, operation_id)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(0);
                Ok::<bool, StepError<OpFailure>>(retries >= attempt)
            })
            .await?,
        )?;
        if yes || !replayed {
            return Ok(yes);
        }
        gate += 1;
    }
}

/// The name of a custom error of Keel's contracts (or of OpenZeppelin's, which they
/// inherit) from revert data, e.g. `ERC20InsufficientBalance`, `EnforcedPause`,
/// `PriceNotFresh`. The name only: the error's arguments are not copied.
pub fn custom_error_name(data: &[u8]) -> Option<String> {
    let selector: [u8; 4] = data.get(..4)?.try_into().ok()?;
    AssetToken::AssetTokenErrors::name_by_selector(selector)
        .or_else(|| AssetFactory::AssetFactoryErrors::name_by_selector(selector))
        .or_else(|| PriceResolver::PriceResolverErrors::name_by_selector(selector))
        .or_else(|| PriceFeed::PriceFeedErrors::name_by_selector(selector))
        .or_else(|| {
            keel_abi::bindings::RegulatedToken::RegulatedTokenErrors::name_by_selector(selector)
        })
        .map(str::to_owned)
}

/// The identity of one attempt of a write.
#[derive(Debug, Clone, Copy)]
struct Attempt<'a> {
    operation_id: Uuid,
    /// The link (`<write>` or `<write>#<n>`).
    link: &'a str,
    /// The signal its verdict arrives as (`tx.<link>`).
    signal: &'a str,
    funding_deadline: Option<u64>,
}

/// One attempt of a write: the journaled enqueue (with the link that routes its
/// verdict here), then the wait for its verdict.
async fn send_attempt(
    ctx: &mut WorkflowContext,
    p: &WorkflowEnv,
    chain: &ChainContext,
    a: Attempt<'_>,
    request: TxRequest,
) -> Result<SettlementVerdict, Failure> {
    let instance_id = ctx.instance_id();
    let enqueued: Result<Uuid, OpFailure> = ctx
        .step(&format!("enqueue {}", a.link), || {
            let request = request.clone();
            async move {
                // Only a sender this runner holds a key for (or a custody vault it
                // serves) is ever signed for: a request of another would wait for good.
                if !chain.queue.has_sender(request.sender) {
                    return Err(StepError::Failed(OpFailure::new(
                        "SENDER_UNAVAILABLE",
                        true,
                        "this chain's runner holds no key for the operation's sender (the asset's issuer): \
                         configure it in chains.<name>.senders (or its custody vault) on every runner of the chain, \
                         then retry the operation",
                    )));
                }
                // The operation's row lock orders this enqueue with a cancel: once a
                // cancel was recorded no new write of the operation is queued, and a
                // cancel that comes after sees (and withdraws) the request linked here.
                let Some(mut guard) = store::operation_write_guard(&p.db, a.operation_id)
                    .await
                    .map_err(|_| StepError::transient("DATABASE_UNAVAILABLE"))?
                else {
                    return Err(StepError::Failed(OpFailure::new(
                        CANCELLED,
                        false,
                        "the operation was cancelled before this transaction was queued",
                    )));
                };
                // The request and its link commit together: its verdict, pushed to
                // the instance in the transaction that settles it, always finds the
                // link.
                let id = chain
                    .queue
                    .enqueue_in(
                        &mut guard,
                        &request,
                        &keel_txq::EnqueueOptions {
                            funding_pause: a.funding_deadline.map(Duration::from_secs),
                        },
                    )
                    .await
                    .map_err(|e| {
                        if e.is_retryable() {
                            StepError::transient("TXQ_UNAVAILABLE")
                        } else {
                            StepError::Failed(OpFailure::new(
                                "TX_REQUEST_REFUSED",
                                false,
                                "the transaction queue refused the request",
                            ))
                        }
                    })?;
                store::operation_tx_insert(
                    &mut *guard,
                    &store::NewOperationTxRow {
                        operation_id: a.operation_id,
                        link: a.link,
                        txq_request_id: id,
                        instance_id,
                        signal_name: a.signal,
                    },
                )
                .await
                .map_err(|_| StepError::transient("DATABASE_UNAVAILABLE"))?;
                guard
                    .commit()
                    .await
                    .map_err(|_| StepError::transient("DATABASE_UNAVAILABLE"))?;
                chain.queue.wake();
                Ok(id)
            }
        })
        .await?;
    match enqueued {
        Ok(_) => {}
        // Cancelled before this write was queued: end `cancelled` (the writes of earlier
        // steps, if any, landed and show in the operation's milestones).
        Err(f) if f.code == CANCELLED => return Err(ctx.cancel_self().into()),
        Err(f) => return Err(WorkflowFailure::Failed(f)),
    }
    match ctx.wait_signal::<SettlementVerdict>(a.signal, None).await? {
        SignalOutcome::Received(v) => Ok(v),
        SignalOutcome::Expired => Err(WorkflowFailure::Failed(OpFailure::new(
            "VERDICT_MISSING",
            true,
            "no settlement verdict arrived",
        ))),
    }
}

/// Reads a log of `E` emitted by `emitter` in the receipt of `landed`.
pub(crate) async fn read_event<E: SolEvent>(
    chain: &ChainContext,
    landed: Landed,
    emitter: Address,
) -> Result<E, StepError<OpFailure>> {
    find_events::<E>(chain, landed, emitter)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| {
            StepError::Failed(OpFailure::new(
                "EVENT_MISSING",
                false,
                "the confirmed transaction did not emit the expected event",
            ))
        })
}

/// A transient failure of a step's read from chain `chain_id` (its RPC did not answer,
/// or answered without the record): the suspension it ends in carries the chain's wake
/// tag ([`chain_wake_tag`]), so the runner's chain-health task resumes the work when the
/// chain comes back up instead of at its recovery backoff (issue 32 §4).
pub(crate) fn chain_read_unavailable(
    code: &'static str,
    chain_id: ChainId,
) -> StepError<OpFailure> {
    StepError::unavailable(code, chain_wake_tag(chain_id.get()))
}

/// Every log of `E` emitted by `emitter` in the receipt of `landed`, in log order (none
/// is a valid answer: e.g. `grantRole` of a role the account holds emits nothing). An
/// unanswered read is `RPC_UNAVAILABLE`, a missing receipt `RECEIPT_UNAVAILABLE`, both
/// carrying the chain's wake tag ([`chain_read_unavailable`]).
pub(crate) async fn find_events<E: SolEvent>(
    chain: &ChainContext,
    landed: Landed,
    emitter: Address,
) -> Result<Vec<E>, StepError<OpFailure>> {
    let receipts = chain
        .node
        .receipts(&[landed.tx_hash])
        .await
        .map_err(|_| chain_read_unavailable("RPC_UNAVAILABLE", chain.chain_id))?;
    let Some(Some(receipt)) = receipts.into_iter().next() else {
        return Err(chain_read_unavailable(
            "RECEIPT_UNAVAILABLE",
            chain.chain_id,
        ));
    };
    Ok(receipt
        .inner
        .logs()
        .iter()
        .filter(|l| l.address() == emitter)
        .filter_map(|l| E::decode_log_data(l.data()).ok())
        .collect())
}

/// Waits (bounded by `index_wait`) until the index has committed `block`; returns the
/// indexed tip. When the wait runs out, the step's transient code says why:
/// `INDEX_DEGRADED` when the chain's index is marked degraded (it will not reach the
/// block until an operator re-indexes the chain, see [`index_wait_code`]), else
/// `INDEX_BEHIND`.
pub(crate) async fn wait_indexed(
    p: &WorkflowEnv,
    chain: ChainId,
    block: u64,
) -> Result<u64, StepError<OpFailure>> {
    match keel_index::wait_for_block(
        &p.db,
        chain,
        block,
        p.index_wait,
        Duration::from_millis(200),
    )
    .await
    {
        Ok(tip) => Ok(tip.number),
        Err(_) => Err(StepError::transient(index_wait_code(p, chain).await)),
    }
}

/// The transient code of a read-after-write that did not see its block:
/// `INDEX_DEGRADED` when the chain's index is marked degraded, else `INDEX_BEHIND`.
pub(crate) async fn index_wait_code(p: &WorkflowEnv, chain: ChainId) -> &'static str {
    match keel_index::read::chain_health(&p.db, chain).await {
        Ok(h) if h.is_degraded() => "INDEX_DEGRADED",
        _ => "INDEX_BEHIND",
    }
}

/// A journaled step's typed failure fails the workflow.
pub(crate) fn step_ok<T>(r: Result<T, OpFailure>) -> Result<T, Failure> {
    r.map_err(WorkflowFailure::Failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_durable::{Engine, EngineConfig, ExecutorConfig, InstanceStatus, RunStatus, Workflow};
    use std::sync::Arc;
    use std::time::Instant;

    /// Issue 32 §4: a step's receipt read from a chain whose RPC does not answer (a
    /// served chain gone down) fails `RPC_UNAVAILABLE` with the chain's wake tag, so
    /// the suspension records `chain:<id>` and the chain-health task's wake resumes it.
    #[tokio::test]
    async fn a_receipt_read_from_a_down_chain_carries_the_chain_wake_tag() {
        let db = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://postgres@127.0.0.1:5432/unused")
            .unwrap();
        let chain = down_chain(db);
        let landed = Landed {
            tx_hash: Default::default(),
            block: 1,
        };
        let err = find_events::<AssetFactory::AssetCreated>(&chain, landed, Address::ZERO)
            .await
            .unwrap_err();
        match err {
            StepError::Unavailable { code, wake } => {
                assert_eq!(code, "RPC_UNAVAILABLE");
                assert_eq!(wake, "chain:31337");
            }
            other => panic!("expected an unavailable step error with a wake tag, got {other:?}"),
        }
    }

    /// Chain 31337 served from an RPC that does not answer (a closed port).
    fn down_chain(db: sqlx::PgPool) -> ChainContext {
        let node = Arc::new(
            keel_chain::UpstreamPool::new(
                ChainId(31337),
                keel_chain::UpstreamConfig::new(vec!["http://127.0.0.1:1".to_owned()]),
            )
            .unwrap(),
        );
        let queue =
            keel_txq::TxQueue::new(db, node.clone(), keel_txq::TxQueueConfig::default()).unwrap();
        ChainContext {
            chain_id: ChainId(31337),
            node,
            queue: Arc::new(queue),
            contracts: crate::platform::PlatformAddresses {
                asset_factory: Address::ZERO,
                price_feed_factory: Address::ZERO,
                price_resolver: Address::ZERO,
                batch_pay: None,
                system_factory: None,
            },
            senders: crate::env::SenderPool::new(vec![Address::ZERO]),
        }
    }

    /// A workflow with one step that reads a receipt from its chain, unless `up` says
    /// the chain is back (then the step answers without the read).
    #[derive(Debug, Clone)]
    struct ReadsReceipt {
        chain: ChainContext,
        up: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Workflow for ReadsReceipt {
        const NAME: &'static str = "test.reads-receipt";
        type Input = u32;
        type Output = usize;
        type Error = OpFailure;

        async fn run(&self, ctx: &mut WorkflowContext, _: u32) -> Result<usize, Failure> {
            let (chain, up) = (&self.chain, &self.up);
            step_ok(
                ctx.step("read", || async move {
                    if up.load(std::sync::atomic::Ordering::SeqCst) {
                        return Ok(0);
                    }
                    let landed = Landed {
                        tx_hash: Default::default(),
                        block: 1,
                    };
                    find_events::<AssetFactory::AssetCreated>(chain, landed, Address::ZERO)
                        .await
                        .map(|events| events.len())
                })
                .await?,
            )
        }
    }

    /// Issue 32 §4: an instance suspended by the RPC-unavailable read of a served chain
    /// that went down is resumed by the wake of `chain:<id>` (what the runner's
    /// chain-health task does when the chain comes back up); with a recovery backoff of
    /// an hour only the wake can resume it. A wake of another chain does nothing.
    #[tokio::test]
    async fn work_suspended_by_a_down_chain_read_is_resumed_by_the_chain_wake() {
        let db = keel_store::testing::TestDatabase::create().await.unwrap();
        let pool = db.pool().clone();
        keel_store::migrate(&pool).await.unwrap();
        let up = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let config = EngineConfig {
            step_backoff: keel_durable::Backoff {
                base: Duration::from_millis(1),
                cap: Duration::from_millis(5),
            },
            recovery_backoff: keel_durable::Backoff {
                base: Duration::from_secs(3600),
                cap: Duration::from_secs(3600),
            },
            ..EngineConfig::default()
        };
        let engine = Engine::new(pool.clone(), config)
            .unwrap()
            .register(ReadsReceipt {
                chain: down_chain(pool.clone()),
                up: up.clone(),
            });
        let executor = engine
            .spawn_executor(ExecutorConfig {
                poll_interval: Duration::from_millis(100),
                ..ExecutorConfig::default()
            })
            .unwrap();
        let id = engine
            .start::<ReadsReceipt>("read", &1, Default::default())
            .await
            .unwrap()
            .instance_id;
        let started = Instant::now();
        let suspended = loop {
            let _ = engine.await_idle(Duration::from_millis(200)).await;
            let s = engine.status(id).await.unwrap();
            if s.status == RunStatus::Suspended {
                break s;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "{s:?}");
        };
        assert_eq!(
            suspended.error.expect("the suspension's error").code,
            "RPC_UNAVAILABLE"
        );
        assert_eq!(
            engine
                .wake_suspended("chain:1", "chain-served")
                .await
                .unwrap(),
            0,
            "another chain's wake"
        );
        up.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            engine
                .wake_suspended("chain:31337", "chain-served")
                .await
                .unwrap(),
            1,
            "the suspension recorded the chain's wake tag"
        );
        let done = settled(&engine, id).await;
        assert_eq!(done.status, RunStatus::Completed);
        executor.shutdown().await;
    }

    /// A workflow that passes the retry gate after each of three failing attempts
    /// (links `w`, `w#2`, `w#3`) and completes with the attempt it reached; a gate that
    /// says no fails it `GAS_REQUIRED`, retryably, as `send` does.
    #[derive(Debug, Clone)]
    struct Gate(Arc<WorkflowEnv>);

    impl Workflow for Gate {
        const NAME: &'static str = "test.retry-gate";
        type Input = Uuid;
        type Output = u32;
        type Error = OpFailure;

        async fn run(&self, ctx: &mut WorkflowContext, op: Uuid) -> Result<u32, Failure> {
            for attempt in 1..=3u32 {
                let link = if attempt == 1 {
                    "w".to_owned()
                } else {
                    format!("w#{attempt}")
                };
                if !retried(ctx, &self.0, op, &link, attempt).await? {
                    return Err(WorkflowFailure::Failed(OpFailure::new(
                        "GAS_REQUIRED",
                        true,
                        "gate closed",
                    )));
                }
            }
            Ok(3)
        }
    }

    async fn settled(engine: &Engine, id: Uuid) -> InstanceStatus {
        let started = Instant::now();
        loop {
            let _ = engine.await_idle(Duration::from_millis(200)).await;
            let s = engine.status(id).await.unwrap();
            if matches!(s.status, RunStatus::Failed | RunStatus::Completed) {
                return s;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "{s:?}");
        }
    }

    async fn gate_steps(db: &sqlx::PgPool, id: Uuid) -> Vec<(String, serde_json::Value)> {
        sqlx::query_as(
            "SELECT name, result FROM durable_journal
              WHERE instance_id = $1 AND name LIKE 'retried %' ORDER BY seq",
        )
        .bind(id)
        .fetch_all(db)
        .await
        .unwrap()
    }

    /// Each retry of the operation opens the gate of exactly the attempt that failed,
    /// and a replay without a retry in between takes the path it took before.
    #[tokio::test]
    async fn each_retry_opens_the_gate_of_the_failed_attempt_once() {
        let db = keel_store::testing::TestDatabase::create().await.unwrap();
        let pool = db.pool().clone();
        keel_store::migrate(&pool).await.unwrap();
        let org = crate::tenancy::create_organization(&pool, "o")
            .await
            .unwrap();
        let key = crate::tenancy::create_api_key(&pool, org, "k")
            .await
            .unwrap();
        let template = crate::tenancy::Template {
            id: "t".into(),
            chain_id: 1,
            price_decimals: 8,
            staleness_bound_seconds: 60,
            mint_approval_threshold: None,
            approval_ttl_seconds: 60,
            funding_pause: false,
            funding_deadline_seconds: 60,
            sender: None,
            forced_transfer_skips_compliance: false,
            batch_max_recipients: crate::tenancy::DEFAULT_BATCH_MAX_RECIPIENTS,
        };
        crate::tenancy::upsert_template(&pool, org, &template)
            .await
            .unwrap();
        let asset = Uuid::new_v4();
        store::asset_insert(
            &pool,
            &store::NewAssetRow {
                id: asset,
                organization_id: org,
                template_id: "t",
                chain_id: 1,
                name: "A",
                symbol: "A",
                decimals: 0,
                initial_price: "1",
                system_id: None,
            },
        )
        .await
        .unwrap();
        let op = Uuid::new_v4();
        store::operation_insert(
            &pool,
            &store::NewOperationRow {
                id: op,
                organization_id: org,
                kind: crate::kinds::OperationKind::AssetPause,
                asset_id: Some(asset),
                idempotency_key: "k",
                request_sha256: &[0; 32],
                api_key_id: key.id,
            },
        )
        .await
        .unwrap();
        let env = Arc::new(WorkflowEnv {
            db: pool.clone(),
            operator: Address::ZERO,
            suffix: keel_chain::AttributionSuffix::new(&["keel"]).unwrap(),
            chains: Default::default(),
            later_chains: Default::default(),
            index_wait: Duration::from_secs(1),
        });
        let engine = Engine::new(pool.clone(), EngineConfig::default())
            .unwrap()
            .register(Gate(env));
        let executor = engine
            .spawn_executor(ExecutorConfig {
                poll_interval: Duration::from_millis(100),
                ..ExecutorConfig::default()
            })
            .unwrap();
        let id = engine
            .start::<Gate>("gate", &op, Default::default())
            .await
            .unwrap()
            .instance_id;
        let no = serde_json::json!({"ok": false});
        let yes = serde_json::json!({"ok": true});
        let step = |n: &str| n.to_owned();

        // Never retried: the first gate is closed.
        assert_eq!(settled(&engine, id).await.status, RunStatus::Failed);
        assert_eq!(
            gate_steps(&pool, id).await,
            vec![(step("retried w 1"), no.clone())]
        );

        // Retried once: attempt 1's gate opens (in its second step), attempt 2's stays shut.
        store::operation_retries_increment(&pool, op).await.unwrap();
        engine.retry(id).await.unwrap();
        assert_eq!(settled(&engine, id).await.status, RunStatus::Failed);
        let once = vec![
            (step("retried w 1"), no.clone()),
            (step("retried w 2"), yes.clone()),
            (step("retried w#2 1"), no.clone()),
        ];
        assert_eq!(gate_steps(&pool, id).await, once);

        // A retry without a new count replays the same path (one more closed look).
        engine.retry(id).await.unwrap();
        assert_eq!(settled(&engine, id).await.status, RunStatus::Failed);
        let mut replayed = once.clone();
        replayed.push((step("retried w#2 2"), no.clone()));
        assert_eq!(gate_steps(&pool, id).await, replayed);

        // Two more retries counted: attempts 2 and 3 pass, the workflow completes.
        store::operation_retries_increment(&pool, op).await.unwrap();
        engine.retry(id).await.unwrap();
        assert_eq!(settled(&engine, id).await.status, RunStatus::Failed);
        store::operation_retries_increment(&pool, op).await.unwrap();
        engine.retry(id).await.unwrap();
        let done = settled(&engine, id).await;
        assert_eq!(done.status, RunStatus::Completed, "{done:?}");
        assert_eq!(done.output, Some(serde_json::json!(3)));
        let names: Vec<String> = gate_steps(&pool, id)
            .await
            .into_iter()
            .filter(|(_, r)| *r == yes)
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, ["retried w 2", "retried w#2 3", "retried w#3 2"]);
        executor.shutdown().await;
    }

    /// Issue 32 §2: a read-after-write that does not see its block says
    /// `INDEX_DEGRADED` when the chain's index is marked degraded (it will not get there
    /// without an operator), `INDEX_BEHIND` otherwise.
    #[tokio::test]
    async fn a_wait_on_a_degraded_chain_says_index_degraded() {
        let db = keel_store::testing::TestDatabase::create().await.unwrap();
        let pool = db.pool().clone();
        keel_store::migrate(&pool).await.unwrap();
        let env = WorkflowEnv {
            db: pool.clone(),
            operator: Address::ZERO,
            suffix: keel_chain::AttributionSuffix::new(&["keel"]).unwrap(),
            chains: Default::default(),
            later_chains: Default::default(),
            index_wait: Duration::from_millis(50),
        };
        let code = |r: Result<u64, StepError<OpFailure>>| match r {
            Err(StepError::Transient { code }) => code,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            code(wait_indexed(&env, ChainId(7), 10).await),
            "INDEX_BEHIND"
        );
        // The tip ingest's degraded marker (index_chain, migration 0017).
        sqlx::query(
            "INSERT INTO index_chain (chain_id, tip_number, tip_hash, degraded_at,
                degraded_reason, degraded_block)
             VALUES (7, 5, '\\x0000000000000000000000000000000000000000000000000000000000000005',
                     now(), 'reorg', 5)",
        )
        .execute(&pool)
        .await
        .unwrap();
        assert_eq!(
            code(wait_indexed(&env, ChainId(7), 10).await),
            "INDEX_DEGRADED"
        );
        // Another chain is merely behind.
        assert_eq!(
            code(wait_indexed(&env, ChainId(8), 10).await),
            "INDEX_BEHIND"
        );
    }
}
