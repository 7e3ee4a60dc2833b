//! Unit tests of [`super`]: approval rules and the accepted kinds.
use super::*;
use crate::workflows::WORKFLOWS;

/// Mints and burns above the threshold, and every role change under a threshold,
/// wait for an approval; transfers and pauses never; without a threshold nothing does.
#[test]
fn approval_policy_follows_the_mint_threshold() {
    use alloy::primitives::U256;
    let units = |n: u64| U256::from(n) * U256::from(1_000_000u64);
    let a = Address::repeat_byte(1);
    let role = TokenAction::GrantRole {
        role: TokenRole::Minter,
        account: a,
    };
    let cases = [
        (
            TokenAction::Mint {
                recipient: a,
                amount: units(101),
            },
            true,
        ),
        (
            TokenAction::Mint {
                recipient: a,
                amount: units(100),
            },
            false,
        ),
        (TokenAction::Burn { amount: units(101) }, true),
        (TokenAction::Burn { amount: units(100) }, false),
        (
            TokenAction::ForcedBurn {
                from: a,
                amount: units(101),
            },
            true,
        ),
        (
            TokenAction::ForcedBurn {
                from: a,
                amount: units(1),
            },
            false,
        ),
        (role.clone(), true),
        (
            TokenAction::RevokeRole {
                role: TokenRole::Burner,
                account: a,
            },
            true,
        ),
        (
            TokenAction::Transfer {
                recipient: a,
                amount: units(1_000),
            },
            false,
        ),
        (TokenAction::Pause, false),
        (TokenAction::Unpause, false),
        (
            TokenAction::SetAddressFrozen {
                account: a,
                frozen: true,
            },
            false,
        ),
        (
            TokenAction::SetAddressFrozen {
                account: a,
                frozen: false,
            },
            true,
        ),
        (
            TokenAction::FreezePartial {
                account: a,
                amount: units(1_000),
            },
            false,
        ),
        (
            TokenAction::UnfreezePartial {
                account: a,
                amount: units(1),
            },
            true,
        ),
        (
            TokenAction::ForcedTransfer {
                from: a,
                recipient: a,
                amount: units(101),
                enforce_compliance: true,
            },
            true,
        ),
        (
            TokenAction::ForcedTransfer {
                from: a,
                recipient: a,
                amount: units(100),
                enforce_compliance: true,
            },
            false,
        ),
        (
            TokenAction::Recover {
                lost: a,
                replacement: a,
            },
            true,
        ),
        (
            TokenAction::BatchMint {
                recipients: vec![
                    crate::workflows::BatchLine {
                        to: a,
                        amount: units(60),
                    },
                    crate::workflows::BatchLine {
                        to: a,
                        amount: units(41),
                    },
                ],
            },
            true,
        ),
        (
            TokenAction::BatchMint {
                recipients: vec![crate::workflows::BatchLine {
                    to: a,
                    amount: units(100),
                }],
            },
            false,
        ),
        (
            TokenAction::BatchTransfer {
                recipients: vec![crate::workflows::BatchLine {
                    to: a,
                    amount: units(1_000),
                }],
            },
            false,
        ),
    ];
    for (action, expected) in cases {
        assert_eq!(
            needs_approval(&action, Some("100"), 6).unwrap(),
            expected,
            "{action:?}"
        );
        assert!(!needs_approval(&action, None, 6).unwrap(), "{action:?}");
    }
    assert!(needs_approval(&TokenAction::Burn { amount: units(1) }, Some("x"), 6).is_err());
}

/// Every operation the API accepts starts a workflow the runner registers.
#[test]
fn every_accepted_kind_is_a_registered_workflow() {
    let kinds = [
        OperationKind::AssetCreate,
        TokenRequest::Mint {
            recipient: Address::ZERO,
            amount: String::new(),
        }
        .kind(),
        TokenRequest::Transfer {
            recipient: Address::ZERO,
            amount: String::new(),
        }
        .kind(),
        TokenRequest::Pause.kind(),
        TokenRequest::Unpause.kind(),
        TokenRequest::Burn {
            from: None,
            amount: String::new(),
        }
        .kind(),
        TokenRequest::GrantRole {
            role: TokenRole::Minter,
            account: Address::ZERO,
        }
        .kind(),
        TokenRequest::RevokeRole {
            role: TokenRole::Minter,
            account: Address::ZERO,
        }
        .kind(),
        TokenRequest::SetCompliance {
            eligible_only: false,
            country_mode: String::new(),
            countries: Vec::new(),
            max_holders: 0,
            max_balance: None,
            lockup_until: 0,
        }
        .kind(),
        TokenRequest::Freeze {
            account: Address::ZERO,
            amount: None,
        }
        .kind(),
        TokenRequest::Unfreeze {
            account: Address::ZERO,
            amount: None,
        }
        .kind(),
        TokenRequest::ForcedTransfer {
            from: Address::ZERO,
            recipient: Address::ZERO,
            amount: String::new(),
        }
        .kind(),
        TokenRequest::Recover {
            lost: Address::ZERO,
            replacement: Address::ZERO,
        }
        .kind(),
        TokenRequest::BatchMint {
            recipients: Vec::new(),
        }
        .kind(),
        TokenRequest::BatchTransfer {
            recipients: Vec::new(),
        }
        .kind(),
        // Accepted by `Ops::distribution_create`.
        OperationKind::DistributionPay,
        // Accepted by `Ops::org_system_deploy`.
        OperationKind::OrgSystemDeploy,
        // Accepted by `Ops::investor_set`.
        OperationKind::InvestorSet,
    ];
    for kind in kinds {
        assert!(WORKFLOWS.contains(&kind.name()), "{kind}");
    }
    assert_eq!(kinds.len(), WORKFLOWS.len());
    assert_eq!(kinds.as_slice(), OperationKind::ALL);
}
