// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";

import {IdentityRegistry} from "./IdentityRegistry.sol";

/// @notice What a token reports to its {Compliance}.
interface IHolderCount {
    /// @notice The number of addresses with a non-zero balance.
    function holderCount() external view returns (uint256);
}

/// @title Compliance
/// @notice An organization system's compliance contract: per-token transfer rules that the
///         system's {RegulatedToken}s consult on every mint and transfer (ERC-3643's modular
///         compliance, with the rules Keel offers built in). A burn is never refused.
/// @dev Refusal codes returned by {check} (0 = allowed), also the argument of the token's
///      `ComplianceRefused(code)`:
///      1 recipient not eligible (unregistered or attested ineligible), 2 recipient's
///      attestation expired, 3 recipient's country not allowed, 4 maximum holder count
///      reached, 5 recipient's balance would exceed the per-holder maximum, 6 transfers locked
///      up until a date (mints are not locked).
contract Compliance is AccessControl {
    /// @notice Role allowed to set rules: keccak256("COMPLIANCE_ROLE").
    bytes32 public constant COMPLIANCE_ROLE = keccak256("COMPLIANCE_ROLE");

    uint8 public constant OK = 0;
    uint8 public constant NOT_ELIGIBLE = 1;
    uint8 public constant EXPIRED = 2;
    uint8 public constant COUNTRY_NOT_ALLOWED = 3;
    uint8 public constant MAX_HOLDERS = 4;
    uint8 public constant MAX_BALANCE = 5;
    uint8 public constant LOCKED_UP = 6;

    /// @notice Country list modes of {Rules}.
    uint8 public constant COUNTRIES_ANY = 0;
    uint8 public constant COUNTRIES_ALLOW = 1;
    uint8 public constant COUNTRIES_DENY = 2;

    /// @notice A token's rules. Zero values switch a rule off.
    /// @param eligibleOnly Recipients must be eligible in {registry}.
    /// @param countryMode {COUNTRIES_ANY}, {COUNTRIES_ALLOW} (recipient's country must be listed)
    ///        or {COUNTRIES_DENY} (must not be listed).
    /// @param maxHolders Maximum number of addresses with a balance (0 = no maximum).
    /// @param maxBalance Maximum balance per holder in token base units (0 = no maximum).
    /// @param lockupUntil Unix time (seconds) before which holder-to-holder transfers are refused.
    struct Rules {
        bool eligibleOnly;
        uint8 countryMode;
        uint32 maxHolders;
        uint256 maxBalance;
        uint64 lockupUntil;
    }

    /// @notice The registry recipients are checked against.
    IdentityRegistry public immutable registry;

    mapping(address token => Rules) private _rules;
    mapping(address token => uint16[]) private _countries;
    mapping(address token => mapping(uint16 country => bool)) private _listed;

    /// @notice A required address argument was the zero address.
    error ZeroAddress();

    /// @notice A country mode outside 0..2.
    error InvalidCountryMode(uint8 mode);

    /// @notice `token`'s rules were replaced.
    event RulesSet(address indexed token, Rules rules, uint16[] countries);

    /// @param admin Receives `DEFAULT_ADMIN_ROLE` and {COMPLIANCE_ROLE}; must be non-zero.
    /// @param registry_ The eligibility registry; must be non-zero.
    constructor(address admin, IdentityRegistry registry_) {
        if (admin == address(0) || address(registry_) == address(0)) revert ZeroAddress();
        registry = registry_;
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        _grantRole(COMPLIANCE_ROLE, admin);
    }

    /// @notice Replaces `token`'s rules and country list.
    function setRules(address token, Rules calldata rules, uint16[] calldata countries)
        external
        onlyRole(COMPLIANCE_ROLE)
    {
        if (token == address(0)) revert ZeroAddress();
        if (rules.countryMode > COUNTRIES_DENY) revert InvalidCountryMode(rules.countryMode);
        uint16[] storage old = _countries[token];
        for (uint256 i = 0; i < old.length; i++) {
            _listed[token][old[i]] = false;
        }
        delete _countries[token];
        for (uint256 i = 0; i < countries.length; i++) {
            if (!_listed[token][countries[i]]) {
                _listed[token][countries[i]] = true;
                _countries[token].push(countries[i]);
            }
        }
        _rules[token] = rules;
        emit RulesSet(token, rules, countries);
    }

    /// @notice `token`'s rules and country list.
    function rulesOf(address token) external view returns (Rules memory rules, uint16[] memory countries) {
        return (_rules[token], _countries[token]);
    }

    /// @notice Whether `token` may move `amount` from `from` to `to` now: 0, or the refusal code
    ///         (see the contract's notes). `from == 0` is a mint, `to == 0` a burn. Reads the
    ///         token's balances and {IHolderCount-holderCount} as they are before the move.
    function check(address token, address from, address to, uint256 amount) public view returns (uint8) {
        if (to == address(0) || amount == 0 || from == to) return OK;
        Rules memory r = _rules[token];
        if (from != address(0) && block.timestamp < r.lockupUntil) return LOCKED_UP;
        if (r.eligibleOnly) {
            if (registry.isExpired(to)) return EXPIRED;
            if (!registry.isEligible(to)) return NOT_ELIGIBLE;
        }
        if (r.countryMode != COUNTRIES_ANY) {
            bool listed = _listed[token][registry.investorOf(to).country];
            if ((r.countryMode == COUNTRIES_ALLOW) != listed) return COUNTRY_NOT_ALLOWED;
        }
        uint256 toBalance = IERC20(token).balanceOf(to);
        if (r.maxBalance != 0 && toBalance + amount > r.maxBalance) return MAX_BALANCE;
        if (r.maxHolders != 0 && toBalance == 0) {
            uint256 holders = IHolderCount(token).holderCount() + 1;
            if (from != address(0) && IERC20(token).balanceOf(from) == amount) holders -= 1;
            if (holders > r.maxHolders) return MAX_HOLDERS;
        }
        return OK;
    }
}
