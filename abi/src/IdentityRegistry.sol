// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";

/// @title IdentityRegistry
/// @notice An organization system's eligibility registry: which investor addresses may hold the
///         system's regulated assets, with a country code and an expiry. Modelled on ERC-3643's
///         identity registry (`isVerified`, ISO 3166-1 numeric country codes), without on-chain
///         identity contracts: the issuer attests eligibility through {AGENT_ROLE}.
/// @dev Roles: `DEFAULT_ADMIN_ROLE` administers roles; {AGENT_ROLE} writes investors.
contract IdentityRegistry is AccessControl {
    /// @notice Role allowed to write investors: keccak256("AGENT_ROLE").
    bytes32 public constant AGENT_ROLE = keccak256("AGENT_ROLE");

    /// @notice One investor's attributes.
    /// @param registered True once {setInvestor} wrote the address (and until {removeInvestor}).
    /// @param eligible The issuer's attestation that the address may hold.
    /// @param country ISO 3166-1 numeric country code (0 = none given).
    /// @param expiry Unix time (seconds) after which the attestation lapses; 0 = never.
    struct Investor {
        bool registered;
        bool eligible;
        uint16 country;
        uint64 expiry;
    }

    mapping(address investor => Investor) private _investors;

    /// @notice A required address argument was the zero address.
    error ZeroAddress();

    /// @notice `investor`'s attributes were written.
    event InvestorSet(address indexed investor, bool eligible, uint16 country, uint64 expiry);

    /// @notice `investor` was taken out of the registry.
    event InvestorRemoved(address indexed investor);

    /// @param admin Receives `DEFAULT_ADMIN_ROLE` and {AGENT_ROLE}; must be non-zero.
    constructor(address admin) {
        if (admin == address(0)) revert ZeroAddress();
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        _grantRole(AGENT_ROLE, admin);
    }

    /// @notice Writes `investor`'s attributes (replacing earlier ones).
    function setInvestor(address investor, bool eligible, uint16 country, uint64 expiry)
        external
        onlyRole(AGENT_ROLE)
    {
        if (investor == address(0)) revert ZeroAddress();
        _investors[investor] = Investor(true, eligible, country, expiry);
        emit InvestorSet(investor, eligible, country, expiry);
    }

    /// @notice Takes `investor` out of the registry (a no-op for an unknown address).
    function removeInvestor(address investor) external onlyRole(AGENT_ROLE) {
        if (!_investors[investor].registered) return;
        delete _investors[investor];
        emit InvestorRemoved(investor);
    }

    /// @notice `investor`'s attributes (all zero for an unknown address).
    function investorOf(address investor) external view returns (Investor memory) {
        return _investors[investor];
    }

    /// @notice True when `investor` is registered, eligible and not expired at this block.
    function isEligible(address investor) public view returns (bool) {
        Investor memory i = _investors[investor];
        return i.registered && i.eligible && (i.expiry == 0 || i.expiry > block.timestamp);
    }

    /// @notice True when `investor` is registered but its attestation has expired.
    function isExpired(address investor) external view returns (bool) {
        Investor memory i = _investors[investor];
        return i.registered && i.expiry != 0 && i.expiry <= block.timestamp;
    }
}
