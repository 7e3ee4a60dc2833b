//! `asset.create`: the token, the price feed, the first observation, the staleness
//! bound and the unpause of a new asset, fail-closed.

use crate::env::WorkflowEnv;
use crate::store;
use crate::workflows::contract::{
    AssetCreateInput, AssetCreateOutput, Failure, OpFailure, onchain_asset_id,
};
use crate::workflows::send::{
    Write, chain_of, index_wait_code, read_event, send, step_ok, wait_indexed,
};
use alloy::primitives::{I256, U256};
use alloy::sol_types::SolCall;
use keel_abi::bindings::{AssetFactory, AssetToken, PriceFeed, PriceFeedFactory, PriceResolver};
use keel_durable::{StepError, Workflow, WorkflowContext, WorkflowFailure};
use serde_json::json;
use std::sync::Arc;

/// `asset.create`: deploys an asset's token and price feed and makes it mintable.
///
/// Order (fail-closed; every write is its own queue request and journaled step):
/// 1. `create-feed` — `PriceFeedFactory.createFeed` (the token's constructor needs the
///    feed's address, so the feed comes first; its address is read from `FeedCreated`);
/// 2. `deploy-token` — `AssetFactory.createAsset` (CREATE2, salt from the asset id; the
///    token starts **paused**; its address is read from `AssetCreated`);
///    With a signer pool (issue 35 §2) the issuer is the pool's next sender (step
///    `choose sender`, before 1); when that is not the operator, `grant-admin` then
///    grants the operator the token's `DEFAULT_ADMIN_ROLE`;
/// 3. `submit-observation` — the first `PriceFeed.submit`;
/// 4. `set-bound` — `PriceResolver.setStalenessBound`, the last feed-phase write: until
///    it lands `isFresh` is false, so no mint can succeed;
/// 5. `unpause` — `AssetToken.unpause`;
/// 6. read-after-write: wait until the index has committed the unpause block and shows
///    the asset.
///
/// A failure before step 5 leaves the token paused and unmintable; the operation's
/// milestones show the hashes that landed. A retry resumes at the first step without a
/// journaled result.
#[derive(Debug, Clone)]
pub struct AssetCreate(pub Arc<WorkflowEnv>);

impl Workflow for AssetCreate {
    const NAME: &'static str = "asset.create";
    /// 2: the issuer of an asset without a custody vault is chosen from the chain's
    /// signer pool (step `choose sender`, issue 35 §2); version-1 instances keep the
    /// operator.
    const VERSION: u32 = 2;
    type Input = AssetCreateInput;
    type Output = AssetCreateOutput;
    type Error = OpFailure;

    async fn run(
        &self,
        ctx: &mut WorkflowContext,
        input: AssetCreateInput,
    ) -> Result<AssetCreateOutput, Failure> {
        let p = &*self.0;
        let chain = chain_of(ctx, p, input.chain_id).await?;
        let c = chain.contracts;
        let op = input.operation_id;
        let funding = input.funding_deadline_seconds;
        // The template's custody vault, or the next sender of the chain's signer pool
        // (the operator for instances started before the pool existed): the sender of
        // every write and the asset's issuer, which its later operations are sent by.
        let (issuer, pooled) = match input.sender {
            Some(vault) => (vault, false),
            None if ctx.changed("sender-pool", 2).await? => (
                step_ok(
                    ctx.step("choose sender", || async move {
                        Ok::<_, StepError<OpFailure>>(chain.senders.next().unwrap_or(p.operator))
                    })
                    .await?,
                )?,
                true,
            ),
            None => (p.operator, false),
        };
        let answer = I256::from_dec_str(&input.price_answer).map_err(|_| {
            WorkflowFailure::Failed(OpFailure::new(
                "INVALID_INPUT",
                false,
                "price answer is not an int256",
            ))
        })?;

        ctx.set_progress(json!({ "phase": "create-feed" }));
        let call = PriceFeedFactory::createFeedCall {
            decimals: input.price_decimals,
            description: format!("{} / price", input.symbol),
            admin: issuer,
            updater: issuer,
        }
        .abi_encode();
        let landed = send(
            ctx,
            p,
            chain,
            Write {
                operation_id: op,
                name: "create-feed",
                contract: c.price_feed_factory,
                funding_deadline: funding,
                sender: issuer,
                value: keel_units::Wei::ZERO,
            },
            call,
        )
        .await?;
        let feed = step_ok(
            ctx.step("read feed address", || async move {
                read_event::<PriceFeedFactory::FeedCreated>(chain, landed, c.price_feed_factory)
                    .await
                    .map(|e| e.feed)
            })
            .await?,
        )?;

        // The organization system's factory (issue 37 §1), else the platform's.
        let factory = input.system_factory.unwrap_or(c.asset_factory);
        ctx.set_progress(json!({ "phase": "deploy-token", "feed": feed }));
        let call = AssetFactory::createAssetCall {
            assetId: onchain_asset_id(input.asset_id),
            name: input.name.clone(),
            symbol: input.symbol.clone(),
            decimals: input.decimals,
            tokenAdmin: issuer,
            priceFeed: feed,
        }
        .abi_encode();
        let landed = send(
            ctx,
            p,
            chain,
            Write {
                operation_id: op,
                name: "deploy-token",
                contract: factory,
                funding_deadline: funding,
                sender: issuer,
                value: keel_units::Wei::ZERO,
            },
            call,
        )
        .await?;
        let token = step_ok(
            ctx.step("record token address", || async move {
                let token = read_event::<AssetFactory::AssetCreated>(chain, landed, factory)
                    .await?
                    .token;
                // The issuer sent every write of the asset and administers its
                // token and feed: the asset's issuer.
                store::asset_addresses_set(
                    &p.db,
                    input.asset_id,
                    token.as_slice(),
                    feed.as_slice(),
                    issuer.as_slice(),
                )
                .await
                .map_err(|_| StepError::transient("DATABASE_UNAVAILABLE"))?;
                Ok(token)
            })
            .await?,
        )?;

        // A system's token is put in the index scope by the workflow itself, as a
        // configured entry: it stays indexed when its system is replaced (and its
        // factory leaves the scope), whatever the index discovered first.
        if input.system_factory.is_some() {
            let chain_id = chain.chain_id;
            step_ok(
                ctx.step("scope token", || async move {
                    let entry = keel_index::ScopeEntry {
                        address: token,
                        kind: keel_index::ScopeKind::AssetToken,
                        organization: None,
                        from_block: landed.block,
                    };
                    keel_index::scope::add_scope(&p.db, chain_id, &entry)
                        .await
                        .map_err(|_| StepError::transient("INDEX_UNAVAILABLE"))?;
                    keel_index::scope::pin_scope(&p.db, chain_id, token)
                        .await
                        .map_err(|_| StepError::transient("INDEX_UNAVAILABLE"))?;
                    Ok::<_, StepError<OpFailure>>(())
                })
                .await?,
            )?;
        }

        // A pool sender other than the operator created the token: the operator gets
        // its DEFAULT_ADMIN_ROLE too, so the asset stays administrable (the operator
        // can grant itself any role) if that sender is ever retired.
        if pooled && issuer != p.operator {
            ctx.set_progress(json!({ "phase": "grant-admin", "feed": feed, "token": token }));
            let call = AssetToken::grantRoleCall {
                role: alloy::primitives::B256::ZERO,
                account: p.operator,
            }
            .abi_encode();
            send(
                ctx,
                p,
                chain,
                Write {
                    operation_id: op,
                    name: "grant-admin",
                    contract: token,
                    funding_deadline: funding,
                    sender: issuer,
                    value: keel_units::Wei::ZERO,
                },
                call,
            )
            .await?;
        }

        ctx.set_progress(json!({ "phase": "submit-observation", "feed": feed, "token": token }));
        let call = PriceFeed::submitCall { answer }.abi_encode();
        send(
            ctx,
            p,
            chain,
            Write {
                operation_id: op,
                name: "submit-observation",
                contract: feed,
                funding_deadline: funding,
                sender: issuer,
                value: keel_units::Wei::ZERO,
            },
            call,
        )
        .await?;

        ctx.set_progress(json!({ "phase": "set-bound", "feed": feed, "token": token }));
        let call = PriceResolver::setStalenessBoundCall {
            feed,
            boundSeconds: U256::from(input.staleness_bound_seconds),
        }
        .abi_encode();
        send(
            ctx,
            p,
            chain,
            Write {
                operation_id: op,
                name: "set-bound",
                contract: c.price_resolver,
                funding_deadline: funding,
                sender: issuer,
                value: keel_units::Wei::ZERO,
            },
            call,
        )
        .await?;

        ctx.set_progress(json!({ "phase": "unpause", "feed": feed, "token": token }));
        let call = AssetToken::unpauseCall {}.abi_encode();
        let landed = send(
            ctx,
            p,
            chain,
            Write {
                operation_id: op,
                name: "unpause",
                contract: token,
                funding_deadline: funding,
                sender: issuer,
                value: keel_units::Wei::ZERO,
            },
            call,
        )
        .await?;

        ctx.set_progress(json!({ "phase": "index", "feed": feed, "token": token }));
        let chain_id = chain.chain_id;
        let indexed_block = step_ok(
            ctx.step("wait indexed", || async move {
                let tip = wait_indexed(p, chain_id, landed.block).await?;
                let shown = keel_index::read::assets(&p.db, chain_id)
                    .await
                    .map_err(|_| StepError::transient("INDEX_UNAVAILABLE"))?
                    .iter()
                    .any(|a| a.token == token);
                if shown {
                    Ok(tip)
                } else {
                    Err(StepError::transient(index_wait_code(p, chain_id).await))
                }
            })
            .await?,
        )?;
        ctx.set_progress(
            json!({ "phase": "done", "feed": feed, "token": token, "indexedBlock": indexed_block }),
        );
        Ok(AssetCreateOutput {
            token,
            feed,
            indexed_block,
        })
    }
}
