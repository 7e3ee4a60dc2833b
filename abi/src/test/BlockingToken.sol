// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";

/// @title BlockingToken
/// @notice **Test only.** An ERC-20 anyone can mint, whose owner can block addresses: a transfer
///         to or from a blocked address reverts `Blocked(account)` (as a token with a deny list or
///         frozen accounts does). Pays distributions in the tests of a refused recipient.
contract BlockingToken is ERC20 {
    address public immutable owner;
    mapping(address account => bool) public blocked;

    /// @notice `account` is blocked.
    error Blocked(address account);

    /// @notice Only the owner may block.
    error NotOwner();

    constructor(string memory name_, string memory symbol_) ERC20(name_, symbol_) {
        owner = msg.sender;
    }

    /// @notice Mints `amount` base units to `to` (anyone may).
    function mint(address to, uint256 amount) external {
        _mint(to, amount);
    }

    /// @notice Blocks or unblocks `account` (owner only).
    function setBlocked(address account, bool value) external {
        if (msg.sender != owner) revert NotOwner();
        blocked[account] = value;
    }

    function _update(address from, address to, uint256 value) internal override {
        if (blocked[from]) revert Blocked(from);
        if (blocked[to]) revert Blocked(to);
        super._update(from, to, value);
    }
}
