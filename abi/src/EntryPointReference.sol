// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title EntryPointReference
/// @notice Records, immutably, the ERC-4337 EntryPoint address Keel uses on this chain.
contract EntryPointReference {
    /// @notice The ERC-4337 EntryPoint contract.
    address public immutable entryPoint;

    /// @param entryPoint_ The EntryPoint address (not validated).
    constructor(address entryPoint_) {
        entryPoint = entryPoint_;
    }
}
