// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {Create2} from "@openzeppelin/contracts/utils/Create2.sol";

import {AssetToken} from "./AssetToken.sol";

/// @title AssetFactory
/// @notice Deploys one {AssetToken} per Keel asset id, at a deterministic CREATE2 address, and
///         remembers it. An asset id can be deployed once only.
/// @dev Salt: `keccak256(abi.encode(assetId))` (see {saltOf}). Init code: the AssetToken creation
///      code followed by `abi.encode(assetId, name, symbol, decimals, tokenAdmin, priceResolver,
///      priceFeed)`, where `priceResolver` is this factory's {priceResolver}. The address
///      therefore depends on every argument of {createAsset}; {predictAddress} computes it.
contract AssetFactory is AccessControl {
    /// @notice Role allowed to call {createAsset}: keccak256("DEPLOYER_ROLE").
    bytes32 public constant DEPLOYER_ROLE = keccak256("DEPLOYER_ROLE");

    /// @notice The {IPriceResolver} given to every token this factory deploys.
    address public immutable priceResolver;

    /// @notice Token deployed for an asset id, or the zero address if none.
    mapping(bytes32 assetId => address token) public tokenOf;

    bytes32[] private _assetIds;

    /// @notice A required address argument was the zero address.
    error ZeroAddress();

    /// @notice {createAsset} was called for an asset id that already has a token.
    /// @param assetId The asset id.
    /// @param token The token already deployed for it.
    error AssetAlreadyDeployed(bytes32 assetId, address token);

    /// @notice A token was deployed for `assetId`.
    event AssetCreated(bytes32 indexed assetId, address indexed token, string symbol, uint8 decimals);

    /// @param admin Receives `DEFAULT_ADMIN_ROLE` and {DEPLOYER_ROLE}; must be non-zero.
    /// @param priceResolver_ Resolver handed to every deployed token; must be non-zero.
    constructor(address admin, address priceResolver_) {
        if (admin == address(0) || priceResolver_ == address(0)) revert ZeroAddress();
        priceResolver = priceResolver_;
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        _grantRole(DEPLOYER_ROLE, admin);
    }

    /// @notice Deploys the {AssetToken} for `assetId` with CREATE2 and records it in {tokenOf}.
    /// @dev Reverts `AssetAlreadyDeployed(assetId, existing)` if `assetId` already has a token;
    ///      bubbles up the token constructor's revert (e.g. `ZeroAddress()`).
    /// @param assetId Keel asset identifier.
    /// @param name ERC-20 name.
    /// @param symbol ERC-20 symbol.
    /// @param decimals ERC-20 decimals.
    /// @param tokenAdmin Receives all roles of the new token.
    /// @param priceFeed The asset's price feed.
    /// @return token Address of the new token (equal to {predictAddress} with the same arguments).
    function createAsset(
        bytes32 assetId,
        string calldata name,
        string calldata symbol,
        uint8 decimals,
        address tokenAdmin,
        address priceFeed
    ) external onlyRole(DEPLOYER_ROLE) returns (address token) {
        address existing = tokenOf[assetId];
        if (existing != address(0)) revert AssetAlreadyDeployed(assetId, existing);
        token = Create2.deploy(0, saltOf(assetId), _initCode(assetId, name, symbol, decimals, tokenAdmin, priceFeed));
        tokenOf[assetId] = token;
        _assetIds.push(assetId);
        emit AssetCreated(assetId, token, symbol, decimals);
    }

    /// @notice Address at which {createAsset} with the same arguments deploys (or deployed) the token.
    function predictAddress(
        bytes32 assetId,
        string calldata name,
        string calldata symbol,
        uint8 decimals,
        address tokenAdmin,
        address priceFeed
    ) external view returns (address) {
        bytes32 initCodeHash = keccak256(_initCode(assetId, name, symbol, decimals, tokenAdmin, priceFeed));
        return Create2.computeAddress(saltOf(assetId), initCodeHash);
    }

    /// @notice CREATE2 salt used for `assetId`: `keccak256(abi.encode(assetId))`.
    function saltOf(bytes32 assetId) public pure returns (bytes32) {
        return keccak256(abi.encode(assetId));
    }

    /// @notice All asset ids deployed by this factory, in deployment order.
    function assetIds() external view returns (bytes32[] memory) {
        return _assetIds;
    }

    function _initCode(
        bytes32 assetId,
        string calldata name,
        string calldata symbol,
        uint8 decimals,
        address tokenAdmin,
        address priceFeed
    ) internal view virtual returns (bytes memory) {
        return abi.encodePacked(
            type(AssetToken).creationCode,
            abi.encode(assetId, name, symbol, decimals, tokenAdmin, priceResolver, priceFeed)
        );
    }
}
