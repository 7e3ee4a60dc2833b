//! Shared setup of the Anvil tests: a chain with Keel's platform, the ERC-4337 v0.8
//! reference deployment and a funded SponsorPaymaster; user operations from fresh
//! SimpleAccounts.
#![allow(dead_code, unreachable_pub)]

pub mod flow;

use alloy::network::TransactionBuilder;
use alloy::primitives::{Address, B256, Bytes, U256};
use alloy::providers::{DynProvider, Provider};
use alloy::rpc::types::{TransactionReceipt, TransactionRequest};
use alloy::signers::SignerSync;
use alloy::signers::local::PrivateKeySigner;
use alloy::sol_types::SolCall;
use anvil_tests::keel_abi::bindings::AssetToken;
use anvil_tests::keel_abi::erc4337::{IEntryPointV08, ISimpleAccount, ISimpleAccountFactory};
use anvil_tests::{Deployed, TestChain, confirm, deploy_keel};
use anyhow::Context;
use keel_aa::{
    PackedUserOperation, Resolution, ResolvedEntryPoint, UserOperation, ValidityWindow,
    resolve_entry_point, sign_sponsorship,
};
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_units::{ChainId, Wei};

/// 10^18.
pub const ETHER: u128 = 1_000_000_000_000_000_000;

/// The pool of one upstream at `url`.
pub fn pool(chain: &TestChain, url: &str) -> UpstreamPool {
    UpstreamPool::new(
        ChainId(chain.chain_id()),
        UpstreamConfig::new(vec![url.to_owned()]),
    )
    .unwrap()
}

/// Everything a sponsored-operation test needs.
pub struct AaChain {
    pub chain: TestChain,
    pub deployed: Deployed,
    pub pool: UpstreamPool,
    pub resolution: Resolution,
    pub paymaster: Address,
    pub sponsor: PrivateKeySigner,
    /// An unpaused AssetToken with a fresh price (dev account 0 holds every role).
    pub token: Address,
}

impl AaChain {
    /// A fresh chain: platform + ERC-4337, the EntryPoint resolved through the
    /// Directory, a SponsorPaymaster with 1 ETH of deposit, a mintable asset.
    pub async fn start() -> anyhow::Result<Self> {
        let chain = TestChain::start().await?;
        let deployed = deploy_keel(&chain).await?;
        let pool = pool(&chain, chain.endpoint().as_str());
        let resolution = resolve_entry_point(&pool, deployed.directory).await?;
        let sponsor = PrivateKeySigner::random();
        let pm = anvil_tests::keel_abi::platform::deploy_sponsor_paymaster(
            chain.provider(),
            deployed.directory,
            resolution.resolved.address(),
            sponsor.address(),
            U256::from(ETHER),
        )
        .await?;
        let asset = anvil_tests::deploy_asset_with_feed(&chain, &deployed, "SPON").await?;
        anvil_tests::set_staleness_bound(
            chain.provider(),
            deployed.price_resolver,
            asset.feed,
            86_400,
        )
        .await?;
        anvil_tests::submit_observation(chain.provider(), asset.feed, 100_000_000).await?;
        let token = AssetToken::new(asset.token, chain.provider().clone());
        confirm(&token.unpause()).await.context("unpause")?;
        Ok(Self {
            chain,
            deployed,
            pool,
            resolution,
            paymaster: pm.address,
            sponsor,
            token: asset.token,
        })
    }

    pub fn ep(&self) -> &ResolvedEntryPoint {
        &self.resolution.resolved
    }

    pub fn provider(&self) -> &DynProvider {
        self.chain.provider()
    }

    /// Mints `amount` base units of the asset to `to`.
    pub async fn mint(&self, to: Address, amount: U256) -> anyhow::Result<()> {
        let token = AssetToken::new(self.token, self.provider().clone());
        confirm(&token.mint(to, amount)).await.context("mint")?;
        Ok(())
    }

    pub async fn token_balance(&self, of: Address) -> anyhow::Result<U256> {
        let token = AssetToken::new(self.token, self.provider().clone());
        Ok(token.balanceOf(of).call().await?)
    }

    /// The counterfactual SimpleAccount of `owner` (salt 0).
    pub async fn account_of(&self, owner: Address) -> anyhow::Result<Address> {
        let f = ISimpleAccountFactory::new(
            self.deployed.simple_account_factory,
            self.provider().clone(),
        );
        Ok(f.getAddress(owner, U256::ZERO).call().await?)
    }

    /// An unsigned operation of `sender` (created through initCode when `create`)
    /// calling `token.transfer(to, amount)`.
    pub fn transfer_op(
        &self,
        owner: Address,
        sender: Address,
        nonce: u64,
        create: bool,
        to: Address,
        amount: U256,
    ) -> UserOperation {
        let transfer = AssetToken::transferCall { to, value: amount }.abi_encode();
        let call_data = ISimpleAccount::executeCall {
            dest: self.token,
            value: U256::ZERO,
            func: transfer.into(),
        }
        .abi_encode();
        let factory_data = ISimpleAccountFactory::createAccountCall {
            owner,
            salt: U256::ZERO,
        }
        .abi_encode();
        UserOperation {
            sender,
            nonce: U256::from(nonce),
            factory: create.then_some(self.deployed.simple_account_factory),
            factory_data: if create {
                factory_data.into()
            } else {
                Bytes::new()
            },
            call_data: call_data.into(),
            call_gas_limit: 200_000,
            verification_gas_limit: 500_000,
            pre_verification_gas: U256::from(60_000u64),
            max_fee_per_gas: Wei::from(10_000_000_000u64),
            max_priority_fee_per_gas: Wei::from(1_000_000_000u64),
            paymaster: None,
            paymaster_verification_gas_limit: 100_000,
            paymaster_post_op_gas_limit: 0,
            paymaster_data: Bytes::new(),
            signature: Bytes::new(),
            eip7702_auth: None,
        }
    }

    /// Sponsors `op` with `sponsor` (Keel's key unless a test passes another), then
    /// signs it as `owner`; returns the packed operation and its hash.
    pub async fn sponsor_and_sign(
        &self,
        mut op: UserOperation,
        sponsor: &PrivateKeySigner,
        owner: &PrivateKeySigner,
    ) -> anyhow::Result<(PackedUserOperation, B256)> {
        sign_sponsorship(
            sponsor,
            &mut op,
            self.ep(),
            self.paymaster,
            ValidityWindow {
                valid_until: 0,
                valid_after: 0,
            },
        )
        .await?;
        let hash = op.hash_v08(self.ep())?;
        op.signature = owner.sign_hash_sync(&hash)?.as_bytes().to_vec().into();
        Ok((op.pack()?, hash))
    }

    /// `handleOps(ops, beneficiary)` sent directly by dev account 1 with a fixed gas
    /// limit; the receipt (mined, successful).
    pub async fn handle_ops(
        &self,
        ops: &[PackedUserOperation],
    ) -> anyhow::Result<TransactionReceipt> {
        let bundler = self.chain.provider_for(1)?;
        let call = IEntryPointV08::handleOpsCall {
            ops: ops.iter().map(PackedUserOperation::to_sol).collect(),
            beneficiary: self.chain.account(1)?,
        };
        let tx = TransactionRequest::default()
            .with_from(self.chain.account(1)?)
            .with_to(self.ep().address())
            .with_input(call.abi_encode())
            .with_gas_limit(6_000_000);
        let receipt = bundler.send_transaction(tx).await?.get_receipt().await?;
        anyhow::ensure!(receipt.status(), "handleOps reverted");
        Ok(receipt)
    }

    /// `eth_call` of `handleOps(ops)`: the revert data when it reverts.
    pub async fn handle_ops_revert(
        &self,
        ops: &[PackedUserOperation],
    ) -> anyhow::Result<Option<Bytes>> {
        let ep = IEntryPointV08::new(self.ep().address(), self.provider().clone());
        let call = ep
            .handleOps(
                ops.iter().map(PackedUserOperation::to_sol).collect(),
                self.chain.account(1)?,
            )
            .from(self.chain.account(1)?);
        match call.call().await {
            Ok(_) => Ok(None),
            Err(e) => Ok(e.as_revert_data()),
        }
    }
}
