//! ERC-4337 EntryPoint v0.8 and `SimpleAccountFactory` at canonical addresses.
//!
//! The reference contracts come from the npm package
//! `@account-abstraction/contracts@0.8.0` (`artifacts/EntryPoint.json`,
//! `artifacts/SimpleAccountFactory.json`, installed by `scripts/setup` under
//! `tools/node_modules`). They are deployed through the deterministic CREATE2 deployer
//! (`0x4e59b448…4956C`, predeployed on Anvil and on most public chains) with the salt the
//! ERC-4337 team uses, which places EntryPoint v0.8 at [`ENTRY_POINT_V08`] on every chain.
//! The deployer's calldata is `salt (32 bytes) ‖ init code`.

use crate::{AbiError, Result};
use alloy::network::TransactionBuilder;
use alloy::primitives::{Address, B256, Bytes, address, b256};
use alloy::providers::Provider;
use alloy::rpc::types::TransactionRequest;
use alloy::sol;
use alloy::sol_types::SolValue;
use std::path::{Path, PathBuf};

/// The deterministic CREATE2 deployer ("Arachnid" proxy) Anvil ships predeployed.
pub const CREATE2_DEPLOYER: Address = address!("0x4e59b44847b379578588920cA78FbF26c0B4956C");
/// Salt of the canonical ERC-4337 v0.8 deployments.
pub const CANONICAL_SALT: B256 =
    b256!("0x0a59dbff790c23c976a548690c27297883cc66b4c67024f9117b0238995e35e9");
/// EntryPoint v0.8's canonical address (same on every chain).
pub const ENTRY_POINT_V08: Address = address!("0x4337084D9E255Ff0702461CF8895CE9E3b5Ff108");

sol!(
    /// The slice of the EntryPoint v0.8 interface Keel uses (ERC-4337 `PackedUserOperation`).
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    interface IEntryPointV08 {
        /// ERC-4337 v0.7+/v0.8 packed user operation.
        struct PackedUserOperation {
            address sender;
            uint256 nonce;
            bytes initCode;
            bytes callData;
            bytes32 accountGasLimits;
            uint256 preVerificationGas;
            bytes32 gasFees;
            bytes paymasterAndData;
            bytes signature;
        }
        /// The hash an account signs: EIP-712 over the operation, the EntryPoint and the chain id (v0.8).
        function getUserOpHash(PackedUserOperation calldata userOp) external view returns (bytes32);
        /// The helper contract that runs `initCode` factories.
        function senderCreator() external view returns (address);
        /// Deposit of `account` in wei.
        function balanceOf(address account) external view returns (uint256);
        /// Next nonce of `sender` under `key` (ERC-4337 two-dimensional nonce).
        function getNonce(address sender, uint192 key) external view returns (uint256 nonce);
        /// Executes a batch of operations, paying the collected fees to `beneficiary`.
        function handleOps(PackedUserOperation[] calldata ops, address payable beneficiary) external;
        /// Adds `msg.value` wei to the deposit of `account`.
        function depositTo(address account) external payable;
        /// ERC-165.
        function supportsInterface(bytes4 interfaceId) external view returns (bool);

        /// One operation was executed (emitted last among its execution logs).
        event UserOperationEvent(
            bytes32 indexed userOpHash,
            address indexed sender,
            address indexed paymaster,
            uint256 nonce,
            bool success,
            uint256 actualGasCost,
            uint256 actualGasUsed
        );
        /// An account was created through the operation's initCode (validation phase).
        event AccountDeployed(bytes32 indexed userOpHash, address indexed sender, address factory, address paymaster);
        /// The operation's callData reverted with non-empty data.
        event UserOperationRevertReason(bytes32 indexed userOpHash, address indexed sender, uint256 nonce, bytes revertReason);
        /// The paymaster's postOp reverted with non-empty data.
        event PostOpRevertReason(bytes32 indexed userOpHash, address indexed sender, uint256 nonce, bytes revertReason);
        /// The prefund did not cover the actual gas cost.
        event UserOperationPrefundTooLow(bytes32 indexed userOpHash, address indexed sender, uint256 nonce);
        /// Emitted once per bundle after validation, before the execution loop.
        event BeforeExecution();
        /// An account's deposit increased.
        event Deposited(address indexed account, uint256 totalDeposit);

        /// Validation of operation `opIndex` failed with an `AAxx` reason.
        error FailedOp(uint256 opIndex, string reason);
        /// Validation of operation `opIndex` failed with an `AAxx` reason and the inner revert data.
        error FailedOpWithRevert(uint256 opIndex, string reason, bytes inner);
        /// The paymaster's postOp reverted.
        error PostOpReverted(bytes returnData);
        /// An aggregator rejected the batch signature.
        error SignatureValidationFailed(address aggregator);
    }
);

sol!(
    /// The slice of `SimpleAccountFactory` (v0.8) Keel uses.
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    interface ISimpleAccountFactory {
        /// Counterfactual address of the account of `owner` with `salt`.
        function getAddress(address owner, uint256 salt) external view returns (address);
        /// The EntryPoint the factory's accounts trust.
        function accountImplementation() external view returns (address);
        /// Creates (or returns) the account of `owner` with `salt`; only the SenderCreator may call it.
        function createAccount(address owner, uint256 salt) external returns (address ret);
    }
);

sol!(
    /// The slice of `SimpleAccount` (v0.8) Keel uses.
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    interface ISimpleAccount {
        /// Calls `dest` with `value` wei and `func` as calldata (EntryPoint or owner only).
        function execute(address dest, uint256 value, bytes calldata func) external;
        /// The account's owner (signs its operations).
        function owner() external view returns (address);
    }
);

/// Creation bytecode read from an npm artifact (`{ "bytecode": "0x…" }`).
#[derive(Debug, Clone)]
pub struct Artifact {
    /// Creation (init) bytecode without constructor arguments.
    pub bytecode: Bytes,
}

impl Artifact {
    /// Reads the `bytecode` field of a Hardhat-format artifact file.
    ///
    /// # Errors
    /// [`AbiError::Artifact`] when the file is missing or has no hex `bytecode`.
    pub fn load(path: &Path) -> Result<Self> {
        let fail = |reason: &str| AbiError::Artifact {
            path: path.display().to_string(),
            reason: reason.to_owned(),
        };
        let text = std::fs::read_to_string(path)
            .map_err(|_| fail("cannot be read (run scripts/setup)"))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|_| fail("is not JSON"))?;
        let hex = json
            .get("bytecode")
            .and_then(|v| v.as_str())
            .ok_or_else(|| fail("has no bytecode"))?;
        let bytecode: Bytes = hex.parse().map_err(|_| fail("bytecode is not hex"))?;
        if bytecode.is_empty() {
            return Err(fail("bytecode is empty"));
        }
        Ok(Self { bytecode })
    }
}

/// Where the `@account-abstraction/contracts` artifacts live: `$KEEL_AA_ARTIFACTS` when
/// set, else `<workspace>/tools/node_modules/@account-abstraction/contracts/artifacts`
/// relative to `workspace_root`.
pub fn artifacts_dir(workspace_root: &Path) -> PathBuf {
    std::env::var_os("KEEL_AA_ARTIFACTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            workspace_root.join("tools/node_modules/@account-abstraction/contracts/artifacts")
        })
}

/// The address CREATE2 through [`CREATE2_DEPLOYER`] gives `init_code` under `salt`.
pub fn create2_address(salt: B256, init_code: &[u8]) -> Address {
    CREATE2_DEPLOYER.create2_from_code(salt, init_code)
}

/// Deploys `init_code` through [`CREATE2_DEPLOYER`] unless code is already at its
/// address; returns the address and whether this call deployed it. Idempotent: a
/// retried call finds the code and sends nothing.
///
/// # Errors
/// [`AbiError::Rpc`] for failed requests, [`AbiError::NoCode`] when the transaction
/// mined but left no code (out of gas, or a reverting constructor).
pub async fn deploy_create2<P: Provider>(
    provider: &P,
    from: Address,
    salt: B256,
    init_code: &[u8],
    step: &'static str,
) -> Result<(Address, bool)> {
    let target = create2_address(salt, init_code);
    let rpc = |source| AbiError::Rpc {
        step,
        source: Box::new(alloy::contract::Error::TransportError(source)),
    };
    if !provider.get_code_at(target).await.map_err(rpc)?.is_empty() {
        return Ok((target, false));
    }
    let mut input = Vec::with_capacity(32 + init_code.len());
    input.extend_from_slice(salt.as_slice());
    input.extend_from_slice(init_code);
    let tx = TransactionRequest::default()
        .with_from(from)
        .with_to(CREATE2_DEPLOYER)
        .with_input(Bytes::from(input));
    let receipt = provider
        .send_transaction(tx)
        .await
        .map_err(rpc)?
        .get_receipt()
        .await
        .map_err(|e| AbiError::Rpc {
            step,
            source: Box::new(alloy::contract::Error::PendingTransactionError(e)),
        })?;
    if !receipt.status() {
        return Err(AbiError::Reverted { step });
    }
    if provider.get_code_at(target).await.map_err(rpc)?.is_empty() {
        return Err(AbiError::NoCode { step });
    }
    Ok((target, true))
}

/// Addresses of the ERC-4337 v0.8 reference deployment on one chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Erc4337Deployment {
    /// EntryPoint v0.8 (always [`ENTRY_POINT_V08`]).
    pub entry_point: Address,
    /// `SimpleAccountFactory` bound to that EntryPoint.
    pub simple_account_factory: Address,
}

/// Deploys EntryPoint v0.8 and `SimpleAccountFactory(entryPoint)` through the CREATE2
/// deployer from the npm artifacts in `artifacts`, skipping whatever is already there.
///
/// # Errors
/// [`AbiError::Artifact`] when the artifacts are missing; [`AbiError::Mismatch`] when the
/// EntryPoint does not land at [`ENTRY_POINT_V08`] (different bytecode than the canonical
/// build); RPC errors as in [`deploy_create2`].
pub async fn deploy_v08<P: Provider>(
    provider: &P,
    from: Address,
    artifacts: &Path,
) -> Result<Erc4337Deployment> {
    let entry_point_code = Artifact::load(&artifacts.join("EntryPoint.json"))?;
    let (entry_point, _) = deploy_create2(
        provider,
        from,
        CANONICAL_SALT,
        &entry_point_code.bytecode,
        "deploy EntryPoint v0.8",
    )
    .await?;
    if entry_point != ENTRY_POINT_V08 {
        return Err(AbiError::Mismatch(
            "EntryPoint artifact does not produce the canonical v0.8 address",
        ));
    }
    let factory = Artifact::load(&artifacts.join("SimpleAccountFactory.json"))?;
    let mut init = factory.bytecode.to_vec();
    init.extend_from_slice(&entry_point.abi_encode());
    let (simple_account_factory, _) = deploy_create2(
        provider,
        from,
        CANONICAL_SALT,
        &init,
        "deploy SimpleAccountFactory",
    )
    .await?;
    Ok(Erc4337Deployment {
        entry_point,
        simple_account_factory,
    })
}
