// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title IPriceResolver
/// @notice Answers whether a price feed currently holds a fresh observation.
/// @dev Implemented by {PriceResolver}; consumed by {AssetToken-mint}.
interface IPriceResolver {
    /// @notice Whether `feed` has an observation that is fresh under the staleness bound
    ///         installed for it.
    /// @dev Must never revert for a misbehaving feed: it returns false instead.
    /// @param feed The price feed (an {AggregatorV3Interface}) to judge.
    /// @return True only if a bound is installed for `feed` and its latest observation is within it.
    function isFresh(address feed) external view returns (bool);
}
