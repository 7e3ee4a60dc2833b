// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

// Test-only ERC-4337 v0.8 entities for Keel's ERC-7562 validation tests
// (crates/keel-aa/tests/validation.rs). Each deployment breaks at most ONE validation
// rule, chosen by its immutable `rule` (see RuleBreaker._breakRule); rule 0 breaks none.
// They check no signature: never deploy them outside a test chain.

import {PackedUserOperation} from "@account-abstraction/contracts/interfaces/PackedUserOperation.sol";

/// A shared helper the entities call to touch foreign storage, destroy, spin, ...
contract RuleHelper {
    mapping(address => uint256) public slots;
    uint256 public plain;

    /// Writes the slot associated with `a` (keccak(a || 0)).
    function write(address a) external {
        slots[a] += 1;
    }

    /// Reads an unassociated slot.
    function readPlain() external view returns (uint256) {
        return plain;
    }

    /// Writes an unassociated slot.
    function writePlain() external {
        plain += 1;
    }

    /// Reads transient slot 0.
    function tread() external view returns (uint256 v) {
        assembly {
            v := tload(0)
        }
    }

    function destroy() external {
        selfdestruct(payable(msg.sender));
    }

    function bad() external pure {
        assembly {
            invalid()
        }
    }

    /// Creates a RuleDummy with CREATE (a utility contract's CREATE, "nested").
    function make() external returns (address) {
        return address(new RuleDummy());
    }

    /// Loops until out of gas.
    function spin(uint256 n) external pure returns (uint256 x) {
        while (n != 1) {
            x += n;
        }
    }

    receive() external payable {}
}

/// Deployed by the CREATE and CREATE2 rules.
contract RuleDummy {}

abstract contract RuleBreaker {
    error Never();

    address public immutable entryPoint;
    RuleHelper public immutable helper;
    uint256 public immutable rule;
    uint256 internal own;

    constructor(address entryPoint_, RuleHelper helper_, uint256 rule_) {
        entryPoint = entryPoint_;
        helper = helper_;
        rule = rule_;
        own = 1;
    }

    function _use(uint256 v) internal pure {
        if (v == 0x1234567890) revert Never();
    }

    /// Stakes at the EntryPoint.
    function stake(uint32 unstakeDelaySec) external payable {
        (bool ok,) = entryPoint.call{value: msg.value}(abi.encodeWithSignature("addStake(uint32)", unstakeDelaySec));
        require(ok, "stake");
    }

    /// Breaks rule `rule`:
    /// 1 TIMESTAMP, 2 NUMBER, 3 ORIGIN, 4 GASPRICE, 5 BLOCKHASH, 6 COINBASE, 7 PREVRANDAO,
    /// 8 GASLIMIT, 9 BASEFEE, 10 GAS not before a call, 11 CREATE, 12 SELFDESTRUCT (in the
    /// helper), 13 BALANCE, 14 SELFBALANCE, 15 INVALID (in the helper), 16 CREATE2,
    /// 17 an EntryPoint call other than depositTo, 18 CALL with value, 19 a call to an
    /// address without code, 20 a foreign unassociated storage read, 21 a foreign
    /// unassociated storage write, 22 out of gas (in the helper), 23 a foreign transient
    /// storage read, 24 BLOBHASH, 25 BLOBBASEFEE, 26 a write of the helper's slot
    /// associated with this contract, 27 a read of this contract's own storage,
    /// 28 EXTCODEHASH of the EntryPoint, 29 EXTCODECOPY of the EntryPoint, 30 EXTCODESIZE
    /// of the EntryPoint not followed by ISZERO, 31 EXTCODESIZE ISZERO of the EntryPoint
    /// (allowed, OP-051), 32 depositTo(this) on the EntryPoint, 33 a call of the
    /// EntryPoint's fallback with 1 wei, 34 CREATE in a contract it calls (the helper).
    /// A RuleAccount also breaks 11 (CREATE), 16 (CREATE2) and 33 (the EntryPoint's
    /// fallback, no value) in its constructor; a RuleFactory with rule 32 deposits to
    /// the account it creates (depositTo(sender), allowed by OP-052).
    function _breakRule() internal {
        uint256 r = rule;
        if (r == 0) return;
        if (r == 1) _use(block.timestamp);
        else if (r == 2) _use(block.number);
        else if (r == 3) _use(uint160(tx.origin));
        else if (r == 4) _use(tx.gasprice);
        else if (r == 5) _use(uint256(blockhash(0)));
        else if (r == 6) _use(uint160(address(block.coinbase)));
        else if (r == 7) _use(block.prevrandao);
        else if (r == 8) _use(block.gaslimit);
        else if (r == 9) _use(block.basefee);
        else if (r == 10) _use(gasleft());
        else if (r == 11) new RuleDummy();
        else if (r == 12) helper.destroy();
        else if (r == 13) _use(address(helper).balance);
        else if (r == 14) _use(address(this).balance);
        else if (r == 15) {
            (bool ok,) = address(helper).call{gas: 20_000}(abi.encodeCall(RuleHelper.bad, ()));
            _use(ok ? 1 : 0);
        } else if (r == 16) new RuleDummy{salt: bytes32(uint256(7))}();
        else if (r == 17) {
            (bool ok,) = entryPoint.staticcall(abi.encodeWithSignature("balanceOf(address)", address(this)));
            _use(ok ? 1 : 0);
        } else if (r == 18) {
            (bool ok,) = address(helper).call{value: 1}("");
            _use(ok ? 1 : 0);
        } else if (r == 19) {
            (bool ok,) = address(0xdead).staticcall("");
            _use(ok ? 1 : 0);
        } else if (r == 20) _use(helper.readPlain());
        else if (r == 21) helper.writePlain();
        else if (r == 22) {
            (bool ok,) = address(helper).call{gas: 30_000}(abi.encodeCall(RuleHelper.spin, (2)));
            _use(ok ? 1 : 0);
        } else if (r == 23) _use(helper.tread());
        else if (r == 24) _use(uint256(blobhash(0)));
        else if (r == 25) _use(block.blobbasefee);
        else if (r == 26) helper.write(address(this));
        else if (r == 27) _use(own);
        else if (r == 28) _use(uint256(entryPoint.codehash));
        else if (r == 29) {
            address ep = entryPoint;
            assembly {
                extcodecopy(ep, 0, 0, 2)
            }
        } else if (r == 30) {
            address ep = entryPoint;
            uint256 len;
            assembly {
                len := extcodesize(ep)
            }
            _use(len);
        } else if (r == 31) {
            address ep = entryPoint;
            uint256 none;
            assembly {
                none := iszero(extcodesize(ep))
            }
            _use(none);
        } else if (r == 32) {
            (bool ok,) = entryPoint.call(abi.encodeWithSignature("depositTo(address)", address(this)));
            _use(ok ? 1 : 0);
        } else if (r == 33) {
            (bool ok,) = entryPoint.call{value: 1}("");
            _use(ok ? 1 : 0);
        } else if (r == 34) _use(uint160(helper.make()));
    }
}

/// An account without signature check that breaks `rule` in validateUserOp.
contract RuleAccount is RuleBreaker {
    constructor(address entryPoint_, RuleHelper helper_, uint256 rule_) RuleBreaker(entryPoint_, helper_, rule_) {
        if (rule_ == 11) {
            new RuleDummy();
        } else if (rule_ == 16) {
            new RuleDummy{salt: bytes32(uint256(8))}();
        } else if (rule_ == 33) {
            (bool ok,) = entryPoint_.call("");
            _use(ok ? 1 : 0);
        }
    }

    function validateUserOp(PackedUserOperation calldata, bytes32, uint256 missingAccountFunds)
        external
        returns (uint256)
    {
        require(msg.sender == entryPoint, "not from EntryPoint");
        _breakRule();
        if (missingAccountFunds > 0) {
            (bool ok,) = payable(msg.sender).call{value: missingAccountFunds}("");
            _use(ok ? 1 : 0);
        }
        return 0;
    }

    receive() external payable {}
}

/// A factory of RuleAccounts (CREATE2, salt = the given salt) that breaks `rule` in
/// createAccount.
contract RuleFactory is RuleBreaker {
    constructor(address entryPoint_, RuleHelper helper_, uint256 rule_) RuleBreaker(entryPoint_, helper_, rule_) {}

    function createAccount(uint256 salt, uint256 accountRule) external returns (address) {
        address a = getAddress(salt, accountRule);
        if (a.code.length > 0) return a;
        if (rule == 32) {
            (bool ok,) = entryPoint.call(abi.encodeWithSignature("depositTo(address)", a));
            _use(ok ? 1 : 0);
        } else {
            _breakRule();
        }
        return address(new RuleAccount{salt: bytes32(salt)}(entryPoint, helper, accountRule));
    }

    function getAddress(uint256 salt, uint256 accountRule) public view returns (address) {
        bytes32 h = keccak256(
            abi.encodePacked(
                bytes1(0xff),
                address(this),
                bytes32(salt),
                keccak256(abi.encodePacked(type(RuleAccount).creationCode, abi.encode(entryPoint, helper, accountRule)))
            )
        );
        return address(uint160(uint256(h)));
    }
}

/// A paymaster that pays for everything and breaks `rule` in validatePaymasterUserOp
/// (rule 35: returns a non-empty context, ERC-7562 EREP-050).
contract RulePaymaster is RuleBreaker {
    constructor(address entryPoint_, RuleHelper helper_, uint256 rule_) RuleBreaker(entryPoint_, helper_, rule_) {}

    function validatePaymasterUserOp(PackedUserOperation calldata, bytes32, uint256)
        external
        returns (bytes memory context, uint256 validationData)
    {
        require(msg.sender == entryPoint, "not from EntryPoint");
        if (rule == 35) return ("a context", 0);
        _breakRule();
        return ("", 0);
    }

    function postOp(uint8, bytes calldata, uint256, uint256) external pure {}

    /// Also an account (no signature check, no rule broken): an address that is the
    /// sender of one operation and the paymaster of another (ERC-7562 STO-040).
    function validateUserOp(PackedUserOperation calldata, bytes32, uint256 missingAccountFunds)
        external
        returns (uint256)
    {
        require(msg.sender == entryPoint, "not from EntryPoint");
        if (missingAccountFunds > 0) {
            (bool ok,) = payable(msg.sender).call{value: missingAccountFunds}("");
            _use(ok ? 1 : 0);
        }
        return 0;
    }

    /// Funds this paymaster's EntryPoint deposit.
    function deposit() external payable {
        (bool ok,) = entryPoint.call{value: msg.value}(abi.encodeWithSignature("depositTo(address)", address(this)));
        require(ok, "deposit");
    }

    receive() external payable {}
}
