// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @title BatchPay
/// @notice Pays many recipients in one transaction, for Keel's distributions: an ERC-20 pulled
///         from the caller with `transferFrom` (the caller approves this contract first), or
///         native ether sent with the call. All or nothing: when one payment fails the whole call
///         reverts `TransferRefused(index)` naming the first recipient that failed, so the payer
///         can leave that recipient out and pay the others in a new call.
/// @dev Holds no funds and no state; anyone may call it. `batch` is the caller's identifier of
///      the call (Keel: the distribution id's 16 bytes, then the batch number as 16 big-endian
///      bytes), echoed in `BatchPaid` so an auditor can match the event to a batch.
contract BatchPay {
    /// @notice The gas each native payment may use (a plain account needs none; a contract
    ///         wallet's `receive` a few thousand). A recipient that needs more is refused.
    uint256 public constant NATIVE_CALL_GAS = 100_000;

    /// @notice `to` and `amounts` have different lengths.
    error LengthMismatch(uint256 recipients, uint256 amounts);

    /// @notice The ether sent with `payNative` is not the sum of `amounts`.
    error ValueMismatch(uint256 expected, uint256 sent);

    /// @notice The payment to `to[index]` failed: the token reverted or returned false, or the
    ///         recipient did not accept ether.
    error TransferRefused(uint256 index);

    /// @notice The token address holds no code.
    error NotAContract(address token);

    /// @notice One call paid `recipients` recipients `total` base units of `token` (the zero
    ///         address for native ether) from `payer`.
    event BatchPaid(
        bytes32 indexed batch, address indexed payer, address indexed token, uint256 recipients, uint256 total
    );

    /// @notice Pays `amounts[i]` base units of ERC-20 `token` from the caller to `to[i]`, for
    ///         every i, with `transferFrom` (needs the caller's allowance for this contract).
    function payToken(bytes32 batch, address token, address[] calldata to, uint256[] calldata amounts)
        external
    {
        uint256 n = to.length;
        if (n != amounts.length) revert LengthMismatch(n, amounts.length);
        if (token.code.length == 0) revert NotAContract(token);
        uint256 total;
        for (uint256 i; i < n; ++i) {
            // transferFrom(address,address,uint256); a token that returns nothing counts as
            // success (as OpenZeppelin's SafeERC20 does), one that returns anything but true fails.
            (bool ok, bytes memory ret) = token.call(abi.encodeWithSelector(0x23b872dd, msg.sender, to[i], amounts[i]));
            if (!ok || (ret.length != 0 && (ret.length < 32 || abi.decode(ret, (uint256)) != 1))) {
                revert TransferRefused(i);
            }
            total += amounts[i];
        }
        emit BatchPaid(batch, msg.sender, token, n, total);
    }

    /// @notice Pays `amounts[i]` wei to `to[i]`, for every i; `msg.value` must be their sum.
    function payNative(bytes32 batch, address[] calldata to, uint256[] calldata amounts) external payable {
        uint256 n = to.length;
        if (n != amounts.length) revert LengthMismatch(n, amounts.length);
        uint256 total;
        for (uint256 i; i < n; ++i) {
            total += amounts[i];
        }
        if (total != msg.value) revert ValueMismatch(total, msg.value);
        for (uint256 i; i < n; ++i) {
            (bool ok,) = to[i].call{value: amounts[i], gas: NATIVE_CALL_GAS}("");
            if (!ok) revert TransferRefused(i);
        }
        emit BatchPaid(batch, msg.sender, address(0), n, total);
    }
}
