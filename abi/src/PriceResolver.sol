// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";

import {AggregatorV3Interface} from "./interfaces/AggregatorV3Interface.sol";
import {IPriceResolver} from "./interfaces/IPriceResolver.sol";

/// @title PriceResolver
/// @notice Holds one staleness bound (in seconds) per price feed and judges feeds fresh or stale.
/// @dev Only `DEFAULT_ADMIN_ROLE` may install or clear bounds.
contract PriceResolver is IPriceResolver, AccessControl {
    mapping(address feed => uint256 boundSeconds) private _bounds;

    /// @notice A required address argument was the zero address.
    error ZeroAddress();

    /// @notice {setStalenessBound} was given a bound of zero seconds.
    error ZeroStalenessBound();

    /// @notice {clearStalenessBound} was called for a feed that has no bound installed.
    error StalenessBoundNotSet(address feed);

    /// @notice A staleness bound was installed or changed for `feed`.
    event StalenessBoundSet(address indexed feed, uint256 boundSeconds);

    /// @notice The staleness bound of `feed` was removed.
    event StalenessBoundCleared(address indexed feed);

    /// @param admin Receives `DEFAULT_ADMIN_ROLE`; must be non-zero.
    constructor(address admin) {
        if (admin == address(0)) revert ZeroAddress();
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
    }

    /// @notice Installs (or replaces) the staleness bound of `feed`.
    /// @param feed The price feed; must be non-zero.
    /// @param boundSeconds Maximum age, in seconds, of a fresh observation; must be > 0.
    function setStalenessBound(address feed, uint256 boundSeconds) external onlyRole(DEFAULT_ADMIN_ROLE) {
        if (feed == address(0)) revert ZeroAddress();
        if (boundSeconds == 0) revert ZeroStalenessBound();
        _bounds[feed] = boundSeconds;
        emit StalenessBoundSet(feed, boundSeconds);
    }

    /// @notice Removes the staleness bound of `feed`; the feed is then never fresh.
    /// @dev Reverts `StalenessBoundNotSet(feed)` if no bound is installed.
    function clearStalenessBound(address feed) external onlyRole(DEFAULT_ADMIN_ROLE) {
        if (_bounds[feed] == 0) revert StalenessBoundNotSet(feed);
        delete _bounds[feed];
        emit StalenessBoundCleared(feed);
    }

    /// @notice The staleness bound of `feed` in seconds, 0 if none is installed.
    function stalenessBound(address feed) external view returns (uint256) {
        return _bounds[feed];
    }

    /// @inheritdoc IPriceResolver
    /// @dev False when: no bound is installed; `feed` has no code; `latestRoundData()` reverts
    ///      (e.g. {PriceFeed}'s `NoObservation()`) or returns malformed data; `updatedAt` is 0
    ///      or in the future; or `block.timestamp - updatedAt > bound`. True otherwise.
    ///      Never reverts.
    function isFresh(address feed) external view returns (bool) {
        uint256 bound = _bounds[feed];
        if (bound == 0 || feed.code.length == 0) return false;
        (bool ok, bytes memory ret) = feed.staticcall(abi.encodeCall(AggregatorV3Interface.latestRoundData, ()));
        if (!ok || ret.length < 160) return false;
        // Decoded as full-width words so that malformed data cannot make abi.decode revert.
        (,,, uint256 updatedAt,) = abi.decode(ret, (uint256, int256, uint256, uint256, uint256));
        if (updatedAt == 0 || updatedAt > block.timestamp) return false;
        return block.timestamp - updatedAt <= bound;
    }
}
