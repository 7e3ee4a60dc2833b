// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {AssetFactory} from "./AssetFactory.sol";
import {Compliance} from "./Compliance.sol";
import {RegulatedToken} from "./RegulatedToken.sol";

/// @title OrgAssetFactory
/// @notice The asset factory of an organization system: an {AssetFactory} (same `createAsset`,
///         same `AssetCreated` event, same CREATE2 salt) whose tokens are {RegulatedToken}s
///         bound to the system's {Compliance}.
/// @dev Init code: the RegulatedToken creation code followed by `abi.encode(assetId, name,
///      symbol, decimals, tokenAdmin, priceResolver, priceFeed, compliance)`.
contract OrgAssetFactory is AssetFactory {
    /// @notice The compliance contract every token of this factory consults.
    Compliance public immutable compliance;

    /// @param admin Receives `DEFAULT_ADMIN_ROLE` and `DEPLOYER_ROLE`; must be non-zero.
    /// @param priceResolver_ Resolver handed to every deployed token; must be non-zero.
    /// @param compliance_ The system's compliance contract; must be non-zero.
    constructor(address admin, address priceResolver_, Compliance compliance_) AssetFactory(admin, priceResolver_) {
        if (address(compliance_) == address(0)) revert ZeroAddress();
        compliance = compliance_;
    }

    function _initCode(
        bytes32 assetId,
        string calldata name,
        string calldata symbol,
        uint8 decimals,
        address tokenAdmin,
        address priceFeed
    ) internal view override returns (bytes memory) {
        return abi.encodePacked(
            type(RegulatedToken).creationCode,
            abi.encode(assetId, name, symbol, decimals, tokenAdmin, priceResolver, priceFeed, compliance)
        );
    }
}
