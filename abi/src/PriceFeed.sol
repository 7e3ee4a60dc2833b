// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";

import {AggregatorV3Interface} from "./interfaces/AggregatorV3Interface.sol";

/// @title PriceFeed
/// @notice A push price feed readable through the Chainlink-compatible {AggregatorV3Interface}.
///         Holders of {UPDATER_ROLE} submit answers; each submission is a new round.
/// @dev Round ids start at 1 and increase by one per {submit}. For every round
///      `startedAt == updatedAt == block.timestamp` of the submission and
///      `answeredInRound == roundId`. Reads before the first submission, or of an unknown round,
///      revert with `NoObservation()`.
contract PriceFeed is AggregatorV3Interface, AccessControl {
    /// @notice Role allowed to call {submit}: keccak256("UPDATER_ROLE").
    bytes32 public constant UPDATER_ROLE = keccak256("UPDATER_ROLE");

    struct Round {
        int256 answer;
        uint64 updatedAt;
    }

    uint8 private immutable _decimals;
    string private _description;
    uint80 private _latestRoundId;
    mapping(uint80 roundId => Round) private _rounds;

    /// @notice A required address argument was the zero address.
    error ZeroAddress();

    /// @notice There is no observation for the requested round (or none at all yet).
    error NoObservation();

    /// @notice Chainlink's event for a new answer.
    event AnswerUpdated(int256 indexed current, uint256 indexed roundId, uint256 updatedAt);

    /// @notice Chainlink's event for a new round.
    event NewRound(uint256 indexed roundId, address indexed startedBy, uint256 startedAt);

    /// @param decimals_ Decimals of the answers.
    /// @param description_ Human-readable description, e.g. "ETH / USD".
    /// @param admin Receives `DEFAULT_ADMIN_ROLE`; must be non-zero.
    /// @param updater Receives {UPDATER_ROLE}; must be non-zero.
    constructor(uint8 decimals_, string memory description_, address admin, address updater) {
        if (admin == address(0) || updater == address(0)) revert ZeroAddress();
        _decimals = decimals_;
        _description = description_;
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        _grantRole(UPDATER_ROLE, updater);
    }

    /// @notice Records `answer` as a new round timestamped with the current block.
    /// @dev Emits {NewRound} then {AnswerUpdated}.
    /// @param answer The answer, scaled by {decimals}.
    /// @return roundId The id of the new round.
    function submit(int256 answer) external onlyRole(UPDATER_ROLE) returns (uint80 roundId) {
        roundId = _latestRoundId + 1;
        _latestRoundId = roundId;
        _rounds[roundId] = Round({answer: answer, updatedAt: uint64(block.timestamp)});
        emit NewRound(roundId, msg.sender, block.timestamp);
        emit AnswerUpdated(answer, roundId, block.timestamp);
    }

    /// @notice Id of the latest round, 0 before the first {submit}.
    function latestRoundId() external view returns (uint80) {
        return _latestRoundId;
    }

    /// @inheritdoc AggregatorV3Interface
    function decimals() external view override returns (uint8) {
        return _decimals;
    }

    /// @inheritdoc AggregatorV3Interface
    function description() external view override returns (string memory) {
        return _description;
    }

    /// @inheritdoc AggregatorV3Interface
    /// @dev Always 1.
    function version() external pure override returns (uint256) {
        return 1;
    }

    /// @inheritdoc AggregatorV3Interface
    /// @dev Reverts `NoObservation()` for round 0 and rounds not yet submitted.
    function getRoundData(uint80 _roundId)
        external
        view
        override
        returns (uint80 roundId, int256 answer, uint256 startedAt, uint256 updatedAt, uint80 answeredInRound)
    {
        return _round(_roundId);
    }

    /// @inheritdoc AggregatorV3Interface
    /// @dev Reverts `NoObservation()` before the first {submit}.
    function latestRoundData()
        external
        view
        override
        returns (uint80 roundId, int256 answer, uint256 startedAt, uint256 updatedAt, uint80 answeredInRound)
    {
        return _round(_latestRoundId);
    }

    function _round(uint80 id) private view returns (uint80, int256, uint256, uint256, uint80) {
        if (id == 0 || id > _latestRoundId) revert NoObservation();
        Round storage r = _rounds[id];
        return (id, r.answer, r.updatedAt, r.updatedAt, id);
    }
}
