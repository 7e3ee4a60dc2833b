// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

/// Test only: a stand-in for the OP Stack GasPriceOracle predeploy
/// (0x420000000000000000000000000000000000000F), which Anvil 1.7.1's `--network optimism`
/// does not install (eth_getCode there answers 0x). Tests place its deployed code at the
/// predeploy address with `anvil_setCode` and set the L1 prices with `anvil_setStorageAt`.
/// `getL1Fee` follows the Ecotone formula: the transaction's calldata gas (16 per
/// non-zero byte, 4 per zero byte) plus 68 non-zero bytes for the signature, priced at
/// (16 × baseFeeScalar × l1BaseFee + blobBaseFeeScalar × blobBaseFee) / (16 × 10^6).
contract GasPriceOracleStandIn {
    /// Slot 0: the L1 base fee, wei.
    uint256 public l1BaseFee;
    /// Slot 1: the L1 blob base fee, wei.
    uint256 public blobBaseFee;
    /// Slot 2: the base fee scalar (Ecotone, millionths).
    uint256 public baseFeeScalar;
    /// Slot 3: the blob base fee scalar (Ecotone, millionths).
    uint256 public blobBaseFeeScalar;

    /// The L1 data fee of an unsigned RLP-encoded transaction, wei.
    function getL1Fee(bytes memory _data) external view returns (uint256) {
        uint256 gas = 68 * 16;
        for (uint256 i = 0; i < _data.length; i++) {
            gas += _data[i] == 0 ? 4 : 16;
        }
        uint256 price = 16 * baseFeeScalar * l1BaseFee + blobBaseFeeScalar * blobBaseFee;
        return (gas * price) / (16 * 1e6);
    }
}
