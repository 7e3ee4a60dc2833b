// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {EnumerableSet} from "@openzeppelin/contracts/utils/structs/EnumerableSet.sol";

/// @title Directory
/// @notice Per-chain registry of named addresses (e.g. the EntryPoint, the factories).
/// @dev Name encoding: a name is its ASCII bytes, left-aligned and zero-padded to 32 bytes,
///      i.e. `bytes32("entryPoint")` in Solidity, `B256::right_padding_from(b"entryPoint")` in
///      Rust/alloy, `ethers.encodeBytes32String("entryPoint")` in JS. Names are therefore at most
///      32 bytes long; the all-zero name is invalid. Only `DEFAULT_ADMIN_ROLE` may change entries.
contract Directory is AccessControl {
    using EnumerableSet for EnumerableSet.Bytes32Set;

    mapping(bytes32 name => address value) private _entries;
    EnumerableSet.Bytes32Set private _names;

    /// @notice A required address argument was the zero address.
    error ZeroAddress();

    /// @notice The all-zero name was given.
    error ZeroName();

    /// @notice {remove} was called for a name that has no entry.
    error UnknownName(bytes32 name);

    /// @notice Entry `name` was set; `previous` is the zero address for a new entry.
    event EntryChanged(bytes32 indexed name, address previous, address current);

    /// @notice Entry `name` was removed.
    event EntryRemoved(bytes32 indexed name, address previous);

    /// @param admin Receives `DEFAULT_ADMIN_ROLE`; must be non-zero.
    constructor(address admin) {
        if (admin == address(0)) revert ZeroAddress();
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
    }

    /// @notice Sets (creates or replaces) entry `name`. Setting the same value again is allowed
    ///         and emits {EntryChanged} with `previous == current`.
    /// @param name Encoded name (see contract docs); must be non-zero.
    /// @param value Address to record; must be non-zero.
    function set(bytes32 name, address value) external onlyRole(DEFAULT_ADMIN_ROLE) {
        if (name == bytes32(0)) revert ZeroName();
        if (value == address(0)) revert ZeroAddress();
        address previous = _entries[name];
        _entries[name] = value;
        _names.add(name);
        emit EntryChanged(name, previous, value);
    }

    /// @notice Removes entry `name`. Reverts `UnknownName(name)` if it has no entry.
    function remove(bytes32 name) external onlyRole(DEFAULT_ADMIN_ROLE) {
        address previous = _entries[name];
        if (previous == address(0)) revert UnknownName(name);
        delete _entries[name];
        _names.remove(name);
        emit EntryRemoved(name, previous);
    }

    /// @notice The address recorded under `name`, or the zero address if none.
    function get(bytes32 name) external view returns (address) {
        return _entries[name];
    }

    /// @notice Names of all current entries. The order is unspecified (it changes on removal).
    function names() external view returns (bytes32[] memory) {
        return _names.values();
    }
}
