// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title AggregatorV3Interface
/// @notice Chainlink-compatible read interface of a price feed, written for Keel.
/// @dev Same function set and return shapes as Chainlink's `AggregatorV3Interface`, so any
///      consumer written against Chainlink feeds can read a Keel {PriceFeed} unchanged.
interface AggregatorV3Interface {
    /// @notice Number of decimals of `answer` (e.g. 8 means 1.00 is reported as 100000000).
    function decimals() external view returns (uint8);

    /// @notice Human-readable description of the feed, e.g. "ETH / USD".
    function description() external view returns (string memory);

    /// @notice Version of the feed implementation.
    function version() external view returns (uint256);

    /// @notice Data of a given round.
    /// @param _roundId The round to read.
    /// @return roundId The round id (equal to `_roundId`).
    /// @return answer The reported answer, scaled by `decimals()`.
    /// @return startedAt Timestamp (seconds) when the round started.
    /// @return updatedAt Timestamp (seconds) when the answer was last updated.
    /// @return answeredInRound The round in which the answer was computed.
    function getRoundData(uint80 _roundId)
        external
        view
        returns (uint80 roundId, int256 answer, uint256 startedAt, uint256 updatedAt, uint80 answeredInRound);

    /// @notice Data of the latest round.
    /// @return roundId The latest round id.
    /// @return answer The reported answer, scaled by `decimals()`.
    /// @return startedAt Timestamp (seconds) when the round started.
    /// @return updatedAt Timestamp (seconds) when the answer was last updated.
    /// @return answeredInRound The round in which the answer was computed.
    function latestRoundData()
        external
        view
        returns (uint80 roundId, int256 answer, uint256 startedAt, uint256 updatedAt, uint80 answeredInRound);
}
