// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";

import {Compliance} from "./Compliance.sol";
import {IdentityRegistry} from "./IdentityRegistry.sol";
import {OrgAssetFactory} from "./OrgAssetFactory.sol";

/// @notice Deploys the {OrgAssetFactory} of a system (kept apart so that {SystemFactory} stays
///         under the EIP-170 code size limit). Anyone may call it; the factory's roles decide.
contract OrgFactoryDeployer {
    /// @notice Deploys an {OrgAssetFactory} with CREATE2 `salt` (scoped to the caller).
    function deploy(bytes32 salt, address admin, address priceResolver, Compliance compliance)
        external
        returns (OrgAssetFactory)
    {
        return new OrgAssetFactory{salt: keccak256(abi.encode(msg.sender, salt))}(admin, priceResolver, compliance);
    }
}

/// @title SystemFactory
/// @notice Deploys organization systems and records them: per (organization, serial) an
///         {IdentityRegistry}, a {Compliance} bound to it and an {OrgAssetFactory} whose tokens
///         consult it, all in one transaction. Registered in the platform `Directory` as
///         `systemFactory`; {systemOf} is the on-chain record of every system.
/// @dev Salt of each contract: `keccak256(abi.encode(organization, serial))`. The system's
///      admin receives the admin roles of the three contracts, `AGENT_ROLE` on the registry and
///      `COMPLIANCE_ROLE`; every `deployers` address receives the factory's `DEPLOYER_ROLE` and
///      the registry's `AGENT_ROLE`. This contract keeps no role on them.
contract SystemFactory is AccessControl {
    /// @notice Role allowed to call {createSystem}: keccak256("DEPLOYER_ROLE").
    bytes32 public constant DEPLOYER_ROLE = keccak256("DEPLOYER_ROLE");

    /// @notice One deployed system.
    struct System {
        address factory;
        address registry;
        address compliance;
    }

    /// @notice The resolver handed to every factory (and so to every token).
    address public immutable priceResolver;

    /// @notice Deploys the systems' asset factories.
    OrgFactoryDeployer public immutable factoryDeployer;

    mapping(bytes32 organization => mapping(uint64 serial => System)) private _systems;

    /// @notice A required address argument was the zero address.
    error ZeroAddress();

    /// @notice {createSystem} was called again for a deployed (organization, serial).
    error SystemAlreadyDeployed(bytes32 organization, uint64 serial, address factory);

    /// @notice A system was deployed.
    event SystemCreated(
        bytes32 indexed organization,
        uint64 indexed serial,
        address factory,
        address registry,
        address compliance,
        address admin
    );

    /// @param admin Receives `DEFAULT_ADMIN_ROLE` and {DEPLOYER_ROLE}; must be non-zero.
    /// @param priceResolver_ Handed to every system's factory; must be non-zero.
    constructor(address admin, address priceResolver_) {
        if (admin == address(0) || priceResolver_ == address(0)) revert ZeroAddress();
        priceResolver = priceResolver_;
        factoryDeployer = new OrgFactoryDeployer();
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        _grantRole(DEPLOYER_ROLE, admin);
    }

    /// @notice Deploys the system `serial` of `organization` (see the contract's notes).
    /// @dev Reverts `SystemAlreadyDeployed` for a deployed pair, `ZeroAddress` for a zero admin.
    function createSystem(bytes32 organization, uint64 serial, address admin, address[] calldata deployers)
        external
        onlyRole(DEPLOYER_ROLE)
        returns (System memory s)
    {
        if (admin == address(0)) revert ZeroAddress();
        System storage existing = _systems[organization][serial];
        if (existing.factory != address(0)) revert SystemAlreadyDeployed(organization, serial, existing.factory);
        bytes32 salt = keccak256(abi.encode(organization, serial));
        IdentityRegistry registry = new IdentityRegistry{salt: salt}(address(this));
        Compliance compliance = new Compliance{salt: salt}(address(this), registry);
        OrgAssetFactory factory = factoryDeployer.deploy(salt, address(this), priceResolver, compliance);

        _handOver(registry, compliance, factory, admin, deployers);
        s = System(address(factory), address(registry), address(compliance));
        _systems[organization][serial] = s;
        emit SystemCreated(organization, serial, s.factory, s.registry, s.compliance, admin);
    }

    function _handOver(
        IdentityRegistry registry,
        Compliance compliance,
        OrgAssetFactory factory,
        address admin,
        address[] calldata deployers
    ) private {
        bytes32 adminRole = 0x00;
        registry.grantRole(adminRole, admin);
        registry.grantRole(registry.AGENT_ROLE(), admin);
        compliance.grantRole(adminRole, admin);
        compliance.grantRole(compliance.COMPLIANCE_ROLE(), admin);
        factory.grantRole(adminRole, admin);
        factory.grantRole(factory.DEPLOYER_ROLE(), admin);
        for (uint256 i = 0; i < deployers.length; i++) {
            factory.grantRole(factory.DEPLOYER_ROLE(), deployers[i]);
            registry.grantRole(registry.AGENT_ROLE(), deployers[i]);
        }
        registry.renounceRole(registry.AGENT_ROLE(), address(this));
        registry.renounceRole(adminRole, address(this));
        compliance.renounceRole(compliance.COMPLIANCE_ROLE(), address(this));
        compliance.renounceRole(adminRole, address(this));
        factory.renounceRole(factory.DEPLOYER_ROLE(), address(this));
        factory.renounceRole(adminRole, address(this));

    }

    /// @notice The system `serial` of `organization` (zero addresses if none).
    function systemOf(bytes32 organization, uint64 serial) external view returns (System memory) {
        return _systems[organization][serial];
    }
}
