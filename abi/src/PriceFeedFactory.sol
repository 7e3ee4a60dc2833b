// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {PriceFeed} from "./PriceFeed.sol";

/// @title PriceFeedFactory
/// @notice Deploys {PriceFeed} contracts. Permissionless: anyone may call {createFeed}; a feed
///         only matters once an operator installs a staleness bound for it in the
///         {PriceResolver} and references it from an {AssetToken}, both of which are
///         access-controlled. {isFeed} tells whether an address was deployed by this factory.
contract PriceFeedFactory {
    /// @notice True for every feed deployed by this factory.
    mapping(address feed => bool) public isFeed;

    /// @notice A feed was deployed.
    event FeedCreated(address indexed feed, uint8 decimals, string description);

    /// @notice Deploys a {PriceFeed} (plain CREATE).
    /// @param decimals Decimals of the answers.
    /// @param description Human-readable description, e.g. "ETH / USD".
    /// @param admin Receives the feed's `DEFAULT_ADMIN_ROLE`; must be non-zero.
    /// @param updater Receives the feed's `UPDATER_ROLE`; must be non-zero.
    /// @return feed Address of the new feed.
    function createFeed(uint8 decimals, string calldata description, address admin, address updater)
        external
        returns (address feed)
    {
        feed = address(new PriceFeed(decimals, description, admin, updater));
        isFeed[feed] = true;
        emit FeedCreated(feed, decimals, description);
    }
}
