// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {AssetToken} from "./AssetToken.sol";
import {Compliance} from "./Compliance.sol";
import {IPriceResolver} from "./interfaces/IPriceResolver.sol";

/// @title RegulatedToken
/// @notice The asset token of an organization system: an {AssetToken} whose every mint and
///         transfer is checked by the system's {Compliance} (refused with
///         `ComplianceRefused(code)`), with ERC-3643-style agent controls: freezing an address,
///         freezing part of a balance, forced transfers, wallet recovery, batch mint and batch
///         transfer.
/// @dev {AGENT_ROLE} is granted to the constructor's admin. A frozen address can neither send
///      nor receive; a holder can move only its balance above its frozen amount. A burn is
///      checked for frozen tokens, never for compliance. Forced transfers and recovery move
///      frozen tokens too (the frozen amount follows a recovered wallet).
contract RegulatedToken is AssetToken {
    /// @notice Role allowed to freeze, force transfers and recover wallets: keccak256("AGENT_ROLE").
    bytes32 public constant AGENT_ROLE = keccak256("AGENT_ROLE");

    /// @notice The compliance contract consulted on every mint and transfer.
    Compliance public immutable compliance;

    /// @notice The number of addresses with a non-zero balance (read by {compliance}).
    uint256 public holderCount;

    /// @notice Whether an address is frozen (can neither send nor receive).
    mapping(address account => bool) public isFrozen;

    /// @notice The part of an address's balance that cannot move, in token base units.
    mapping(address account => uint256) public frozenAmount;

    bool private _forcing;
    bool private _skipCompliance;

    /// @notice The move was refused by {compliance}; `code` is {Compliance-check}'s.
    error ComplianceRefused(uint8 code);

    /// @notice `account` is frozen.
    error AddressFrozen(address account);

    /// @notice `account` has `available` unfrozen tokens, less than the move needs.
    error InsufficientUnfrozenBalance(address account, uint256 available);

    /// @notice An unfreeze of more than is frozen, or a freeze above the balance.
    error InvalidFrozenAmount(address account, uint256 frozen, uint256 requested);

    /// @notice Batch arrays of different lengths, or an empty batch.
    error InvalidBatch();

    /// @notice `account` was frozen or unfrozen by `agent`.
    event AddressFrozenSet(address indexed account, bool frozen, address indexed agent);

    /// @notice `amount` more of `account`'s balance was frozen.
    event TokensFrozen(address indexed account, uint256 amount);

    /// @notice `amount` of `account`'s frozen balance was released.
    event TokensUnfrozen(address indexed account, uint256 amount);

    /// @notice `agent` moved `amount` from `from` to `to` without `from`'s consent.
    event ForcedTransfer(address indexed agent, address indexed from, address indexed to, uint256 amount);

    /// @notice `agent` moved `lost`'s whole balance (and frozen state) to `replacement`.
    event RecoverySuccess(address indexed lost, address indexed replacement, address indexed agent);

    /// @param compliance_ The system's compliance contract; must be non-zero.
    /// @dev Other parameters: {AssetToken-constructor}. `admin` also receives {AGENT_ROLE}.
    constructor(
        bytes32 assetId_,
        string memory name_,
        string memory symbol_,
        uint8 decimals_,
        address admin,
        address priceResolver_,
        address priceFeed_,
        Compliance compliance_
    ) AssetToken(assetId_, name_, symbol_, decimals_, admin, priceResolver_, priceFeed_) {
        if (address(compliance_) == address(0)) revert ZeroAddress();
        compliance = compliance_;
        _grantRole(AGENT_ROLE, admin);
    }

    /// @notice Freezes (`frozen = true`) or unfreezes `account` entirely.
    function setAddressFrozen(address account, bool frozen) external onlyRole(AGENT_ROLE) {
        isFrozen[account] = frozen;
        emit AddressFrozenSet(account, frozen, msg.sender);
    }

    /// @notice Freezes `amount` more of `account`'s balance; the total frozen may not exceed
    ///         the balance (`InvalidFrozenAmount`).
    function freezePartialTokens(address account, uint256 amount) external onlyRole(AGENT_ROLE) {
        uint256 total = frozenAmount[account] + amount;
        if (total > balanceOf(account)) revert InvalidFrozenAmount(account, frozenAmount[account], amount);
        frozenAmount[account] = total;
        emit TokensFrozen(account, amount);
    }

    /// @notice Releases `amount` of `account`'s frozen balance (`InvalidFrozenAmount` above it).
    function unfreezePartialTokens(address account, uint256 amount) external onlyRole(AGENT_ROLE) {
        uint256 frozen = frozenAmount[account];
        if (amount > frozen) revert InvalidFrozenAmount(account, frozen, amount);
        frozenAmount[account] = frozen - amount;
        emit TokensUnfrozen(account, amount);
    }

    /// @notice Moves `amount` from `from` to `to` without `from`'s consent, frozen tokens
    ///         first released as needed. Compliance is checked unless `enforceCompliance` is false.
    function forcedTransfer(address from, address to, uint256 amount, bool enforceCompliance)
        external
        onlyRole(AGENT_ROLE)
        whenNotPaused
    {
        _releaseFor(from, amount);
        _forcing = true;
        _skipCompliance = !enforceCompliance;
        _transfer(from, to, amount);
        _forcing = false;
        _skipCompliance = false;
        emit ForcedTransfer(msg.sender, from, to, amount);
    }

    /// @notice Moves `lost`'s whole balance to `replacement`; its frozen amount and frozen flag
    ///         follow (and are cleared on `lost`). Compliance is checked for `replacement`.
    function recoveryAddress(address lost, address replacement) external onlyRole(AGENT_ROLE) whenNotPaused {
        uint256 balance = balanceOf(lost);
        uint256 frozen = frozenAmount[lost];
        bool wasFrozen = isFrozen[lost];
        frozenAmount[lost] = 0;
        isFrozen[lost] = false;
        _forcing = true;
        if (balance > 0) _transfer(lost, replacement, balance);
        _forcing = false;
        frozenAmount[replacement] += frozen;
        if (wasFrozen) isFrozen[replacement] = true;
        emit RecoverySuccess(lost, replacement, msg.sender);
    }

    /// @notice Mints `amounts[i]` to `to[i]` for every i, all or nothing (the checks of {mint}).
    function batchMint(address[] calldata to, uint256[] calldata amounts)
        external
        onlyRole(MINTER_ROLE)
        whenNotPaused
    {
        if (to.length != amounts.length || to.length == 0) revert InvalidBatch();
        if (!IPriceResolver(priceResolver).isFresh(priceFeed)) revert PriceNotFresh(priceFeed);
        for (uint256 i = 0; i < to.length; i++) {
            _mint(to[i], amounts[i]);
        }
    }

    /// @notice Transfers `amounts[i]` from the caller to `to[i]` for every i, all or nothing.
    function batchTransfer(address[] calldata to, uint256[] calldata amounts) external {
        if (to.length != amounts.length || to.length == 0) revert InvalidBatch();
        for (uint256 i = 0; i < to.length; i++) {
            _transfer(msg.sender, to[i], amounts[i]);
        }
    }

    function _releaseFor(address from, uint256 amount) private {
        uint256 balance = balanceOf(from);
        uint256 free = balance - frozenAmount[from];
        if (amount > free) {
            uint256 release = amount - free;
            if (release > frozenAmount[from]) release = frozenAmount[from];
            frozenAmount[from] -= release;
            emit TokensUnfrozen(from, release);
        }
    }

    /// @dev Frozen checks (skipped by agents' forced moves), then compliance (never for a burn),
    ///      then the balance change and the holder count.
    function _update(address from, address to, uint256 value) internal override {
        if (!_forcing) {
            if (from != address(0)) {
                if (isFrozen[from]) revert AddressFrozen(from);
                uint256 free = balanceOf(from) - frozenAmount[from];
                if (value > free) revert InsufficientUnfrozenBalance(from, free);
            }
            if (to != address(0) && isFrozen[to]) revert AddressFrozen(to);
        }
        if (!_skipCompliance && to != address(0)) {
            uint8 code = compliance.check(address(this), from, to, value);
            if (code != 0) revert ComplianceRefused(code);
        }
        bool toWasEmpty = to != address(0) && balanceOf(to) == 0;
        super._update(from, to, value);
        if (value > 0 && from != to) {
            if (toWasEmpty) holderCount += 1;
            if (from != address(0) && balanceOf(from) == 0) holderCount -= 1;
        }
    }
}
