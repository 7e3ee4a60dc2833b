// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";
import {ERC20Burnable} from "@openzeppelin/contracts/token/ERC20/extensions/ERC20Burnable.sol";
import {ERC20Pausable} from "@openzeppelin/contracts/token/ERC20/extensions/ERC20Pausable.sol";
import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";

import {IPriceResolver} from "./interfaces/IPriceResolver.sol";

/// @title AssetToken
/// @notice ERC-20 token representing one Keel asset. It is deployed paused, can be minted only
///         by holders of {MINTER_ROLE} and only while the asset's price feed is fresh according
///         to the configured {IPriceResolver}.
/// @dev Roles: `DEFAULT_ADMIN_ROLE` administers all roles; {MINTER_ROLE} may mint;
///      {PAUSER_ROLE} may pause and unpause; {BURNER_ROLE} may burn from any holder
///      ({forcedBurn}, a forced redemption). Every holder may burn its own tokens
///      ({ERC20Burnable-burn}) or, with an allowance, another's ({ERC20Burnable-burnFrom}).
///      While paused, every balance change (transfer, mint, burn) reverts with
///      `EnforcedPause()`.
contract AssetToken is ERC20, ERC20Burnable, ERC20Pausable, AccessControl {
    /// @notice Role allowed to call {mint}: keccak256("MINTER_ROLE").
    bytes32 public constant MINTER_ROLE = keccak256("MINTER_ROLE");

    /// @notice Role allowed to call {pause} and {unpause}: keccak256("PAUSER_ROLE").
    bytes32 public constant PAUSER_ROLE = keccak256("PAUSER_ROLE");

    /// @notice Role allowed to call {forcedBurn}: keccak256("BURNER_ROLE"). Granted to nobody at
    ///         deployment: a forced redemption is a capability the admin grants explicitly.
    bytes32 public constant BURNER_ROLE = keccak256("BURNER_ROLE");

    /// @notice Keel identifier of the asset this token represents (set by {AssetFactory}).
    bytes32 public immutable assetId;

    /// @notice Resolver consulted by {mint} to decide whether the price is fresh.
    address public immutable priceResolver;

    /// @notice Price feed of this asset, judged by {priceResolver}.
    address public immutable priceFeed;

    uint8 private immutable _decimals;

    /// @notice A required address argument was the zero address.
    error ZeroAddress();

    /// @notice {mint} was refused because `feed` is not fresh according to {priceResolver}.
    /// @param feed The price feed that was judged stale (or unknown).
    error PriceNotFresh(address feed);

    /// @notice `burner` burned `amount` tokens of `from` without its allowance ({forcedBurn}).
    /// @param burner The caller (a {BURNER_ROLE} holder).
    /// @param from The holder whose tokens were burned.
    /// @param amount Amount in the token's smallest unit.
    event ForcedBurn(address indexed burner, address indexed from, uint256 amount);

    /// @notice Deploys the token, grants `admin` `DEFAULT_ADMIN_ROLE`, {MINTER_ROLE} and
    ///         {PAUSER_ROLE} (not {BURNER_ROLE}) and pauses it.
    /// @param assetId_ Keel asset identifier (opaque to the token).
    /// @param name_ ERC-20 name.
    /// @param symbol_ ERC-20 symbol.
    /// @param decimals_ ERC-20 decimals.
    /// @param admin Receives `DEFAULT_ADMIN_ROLE`, {MINTER_ROLE} and {PAUSER_ROLE}; must be non-zero.
    /// @param priceResolver_ The {IPriceResolver} consulted on mint; must be non-zero.
    /// @param priceFeed_ The asset's price feed; must be non-zero.
    constructor(
        bytes32 assetId_,
        string memory name_,
        string memory symbol_,
        uint8 decimals_,
        address admin,
        address priceResolver_,
        address priceFeed_
    ) ERC20(name_, symbol_) {
        if (admin == address(0) || priceResolver_ == address(0) || priceFeed_ == address(0)) {
            revert ZeroAddress();
        }
        assetId = assetId_;
        _decimals = decimals_;
        priceResolver = priceResolver_;
        priceFeed = priceFeed_;
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        _grantRole(MINTER_ROLE, admin);
        _grantRole(PAUSER_ROLE, admin);
        _pause();
    }

    /// @notice Number of decimals used by the token's amounts (fixed at deployment).
    function decimals() public view override returns (uint8) {
        return _decimals;
    }

    /// @notice Mints `amount` tokens to `to`.
    /// @dev Checks, in order: caller has {MINTER_ROLE} (`AccessControlUnauthorizedAccount`),
    ///      token not paused (`EnforcedPause`), price fresh (`PriceNotFresh(priceFeed)`), then the
    ///      ERC-20 checks of `_mint` (e.g. `ERC20InvalidReceiver` for `to == 0`).
    /// @param to Receiver of the new tokens.
    /// @param amount Amount in the token's smallest unit.
    function mint(address to, uint256 amount) external onlyRole(MINTER_ROLE) whenNotPaused {
        if (!IPriceResolver(priceResolver).isFresh(priceFeed)) {
            revert PriceNotFresh(priceFeed);
        }
        _mint(to, amount);
    }

    /// @notice Burns `amount` tokens of `from` without its allowance (a forced redemption).
    /// @dev Checks, in order: caller has {BURNER_ROLE} (`AccessControlUnauthorizedAccount`),
    ///      token not paused (`EnforcedPause`), then the ERC-20 checks of `_burn`
    ///      (`ERC20InvalidSender` for `from == 0`, `ERC20InsufficientBalance` above the
    ///      balance). Emits `Transfer(from, address(0), amount)` and {ForcedBurn}.
    /// @param from The holder whose tokens are burned.
    /// @param amount Amount in the token's smallest unit.
    function forcedBurn(address from, uint256 amount) external onlyRole(BURNER_ROLE) whenNotPaused {
        _burn(from, amount);
        emit ForcedBurn(msg.sender, from, amount);
    }

    /// @notice Pauses all balance changes. Reverts `EnforcedPause()` if already paused.
    function pause() external onlyRole(PAUSER_ROLE) {
        _pause();
    }

    /// @notice Unpauses balance changes. Reverts `ExpectedPause()` if not paused.
    function unpause() external onlyRole(PAUSER_ROLE) {
        _unpause();
    }

    /// @dev Balance changes go through ERC20Pausable, which refuses them while paused.
    function _update(address from, address to, uint256 value) internal virtual override(ERC20, ERC20Pausable) {
        super._update(from, to, value);
    }
}
