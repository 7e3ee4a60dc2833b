// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

import {BasePaymaster} from "@account-abstraction/contracts/core/BasePaymaster.sol";
import {IEntryPoint} from "@account-abstraction/contracts/interfaces/IEntryPoint.sol";
import {PackedUserOperation} from "@account-abstraction/contracts/interfaces/PackedUserOperation.sol";
import {UserOperationLib} from "@account-abstraction/contracts/core/UserOperationLib.sol";
import {_packValidationData} from "@account-abstraction/contracts/core/Helpers.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {MessageHashUtils} from "@openzeppelin/contracts/utils/cryptography/MessageHashUtils.sol";

/// @title SponsorPaymaster
/// @notice Keel's ERC-4337 (EntryPoint v0.8) verifying paymaster: it pays for a user operation
///         when the platform's sponsor key signed it off chain.
/// @dev `paymasterAndData` layout (bytes):
///        [0, 20)   paymaster address (this contract)
///        [20, 36)  paymasterVerificationGasLimit (uint128)
///        [36, 52)  paymasterPostOpGasLimit (uint128)
///        [52, 58)  validUntil (uint48, unix seconds; 0 = no expiry)
///        [58, 64)  validAfter (uint48, unix seconds)
///        [64, ...) signature (65 bytes r ‖ s ‖ v, or 64 bytes EIP-2098) of the sponsor key over
///                  the EIP-191 personal-sign digest of {getHash}.
///      {getHash} covers every field of the operation except its `signature`, with
///      `paymasterAndData` cut before the paymaster signature (so it includes the validity
///      window), plus the chain id, the EntryPoint and this contract. A wrong signer returns
///      SIG_VALIDATION_FAILED (the EntryPoint reports `AA34 signature error`); a malformed
///      `paymasterAndData` reverts {InvalidPaymasterData} (`AA33 reverted`). The validity
///      window is enforced by the EntryPoint (`AA32 paymaster expired or not due`). No context
///      is returned, so `postOp` is never called.
contract SponsorPaymaster is BasePaymaster {
    using UserOperationLib for PackedUserOperation;

    uint256 private constant VALID_TIMESTAMP_OFFSET = PAYMASTER_DATA_OFFSET;
    uint256 private constant SIGNATURE_OFFSET = VALID_TIMESTAMP_OFFSET + 12;

    /// @notice The address whose signatures this paymaster honours (the platform's sponsor key).
    address public sponsorSigner;

    /// @notice The sponsor key was replaced.
    event SponsorSignerChanged(address previous, address current);

    /// @notice `paymasterAndData` is shorter than the window or its signature is not 64/65 bytes.
    error InvalidPaymasterData(uint256 length);

    /// @notice A required address argument was the zero address.
    error ZeroAddress();

    /// @param entryPoint_ The (resolved) EntryPoint; must implement IEntryPoint (ERC-165 checked).
    /// @param sponsorSigner_ The sponsor key's address; must be non-zero. The deployer becomes owner.
    constructor(IEntryPoint entryPoint_, address sponsorSigner_) BasePaymaster(entryPoint_) {
        if (sponsorSigner_ == address(0)) revert ZeroAddress();
        sponsorSigner = sponsorSigner_;
        emit SponsorSignerChanged(address(0), sponsorSigner_);
    }

    /// @notice Replaces the sponsor key (owner only). Operations signed by the old key fail
    ///         validation from the next block on.
    function setSponsorSigner(address sponsorSigner_) external onlyOwner {
        if (sponsorSigner_ == address(0)) revert ZeroAddress();
        emit SponsorSignerChanged(sponsorSigner, sponsorSigner_);
        sponsorSigner = sponsorSigner_;
    }

    /// @notice The hash the sponsor key signs (EIP-191 personal-sign of this value):
    ///         keccak256(abi.encode(sender, nonce, keccak256(initCode), keccak256(callData),
    ///         accountGasLimits, preVerificationGas, gasFees,
    ///         keccak256(paymasterAndData[:64]), block.chainid, entryPoint, this,
    ///         validUntil, validAfter)).
    function getHash(PackedUserOperation calldata userOp, uint48 validUntil, uint48 validAfter)
        public
        view
        returns (bytes32)
    {
        if (userOp.paymasterAndData.length < SIGNATURE_OFFSET) {
            revert InvalidPaymasterData(userOp.paymasterAndData.length);
        }
        return keccak256(
            abi.encode(
                userOp.sender,
                userOp.nonce,
                keccak256(userOp.initCode),
                keccak256(userOp.callData),
                userOp.accountGasLimits,
                userOp.preVerificationGas,
                userOp.gasFees,
                keccak256(userOp.paymasterAndData[:SIGNATURE_OFFSET]),
                block.chainid,
                address(entryPoint),
                address(this),
                validUntil,
                validAfter
            )
        );
    }

    /// @notice Splits `paymasterAndData` into (validUntil, validAfter, signature).
    function parsePaymasterAndData(bytes calldata paymasterAndData)
        public
        pure
        returns (uint48 validUntil, uint48 validAfter, bytes calldata signature)
    {
        if (paymasterAndData.length < SIGNATURE_OFFSET) {
            revert InvalidPaymasterData(paymasterAndData.length);
        }
        validUntil = uint48(bytes6(paymasterAndData[VALID_TIMESTAMP_OFFSET:VALID_TIMESTAMP_OFFSET + 6]));
        validAfter = uint48(bytes6(paymasterAndData[VALID_TIMESTAMP_OFFSET + 6:SIGNATURE_OFFSET]));
        signature = paymasterAndData[SIGNATURE_OFFSET:];
    }

    function _validatePaymasterUserOp(PackedUserOperation calldata userOp, bytes32, uint256)
        internal
        view
        override
        returns (bytes memory context, uint256 validationData)
    {
        (uint48 validUntil, uint48 validAfter, bytes calldata signature) =
            parsePaymasterAndData(userOp.paymasterAndData);
        if (signature.length != 64 && signature.length != 65) {
            revert InvalidPaymasterData(userOp.paymasterAndData.length);
        }
        bytes32 digest = MessageHashUtils.toEthSignedMessageHash(getHash(userOp, validUntil, validAfter));
        (address recovered, ECDSA.RecoverError err,) = ECDSA.tryRecover(digest, signature);
        if (err != ECDSA.RecoverError.NoError || recovered != sponsorSigner) {
            return ("", _packValidationData(true, validUntil, validAfter));
        }
        return ("", _packValidationData(false, validUntil, validAfter));
    }
}
