//! What a distribution pays each holder: the shares of a final snapshot, computed
//! exactly in integers (base units of the paying token), with a named rounding rule.
//!
//! - **Pro rata** (`total` base units split by balance): holder *i* with balance *bᵢ* of
//!   the eligible balances' sum *S* is owed `total · bᵢ / S`, which is rarely an integer.
//!   - [`Rounding::Floor`]: every share is rounded down; the **remainder**
//!     `total − Σ shares` (less than the number of eligible holders, in base units) is not
//!     paid: it stays with the paying account and is reported as the distribution's
//!     `remainder`.
//!   - [`Rounding::LargestRemainder`] (Hamilton's method): shares are rounded down, then
//!     the remainder is handed out one base unit each to the holders with the largest
//!     dropped fractions (ties: the lower address first), so the shares sum to exactly
//!     `total` and the remainder is 0. No holder gets more than one unit above its exact
//!     share.
//! - **Per unit** (`amount` base units per whole unit of the asset, i.e. per
//!   `10^decimals` base units held): holder *i* is owed `⌊bᵢ · amount / 10^decimals⌋`.
//!   Only [`Rounding::Floor`] applies; the total is the sum of the shares, so there is no
//!   remainder (the dropped fractions are below one base unit per holder).
//!
//! Excluded holders (the issuer's treasury, say) are owed nothing and their balances do
//! not count in *S*. A holder whose share rounds to 0 is recorded as `zero` and not paid.
//! The zero address never holds a snapshot balance.

use alloy::primitives::{Address, U256, U512};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// How the amount is split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "basis", content = "amount")]
pub enum Basis {
    /// A total (base units of the paying token) split pro rata.
    ProRata(U256),
    /// An amount (base units of the paying token) per whole unit of the asset held.
    PerUnit(U256),
}

/// The rounding rule, by its API name (`floor`, `largestRemainder`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Rounding {
    /// Every share rounded down; the remainder stays with the payer.
    Floor,
    /// Rounded down, then the remainder one base unit each by largest dropped fraction.
    LargestRemainder,
}

impl Rounding {
    /// The rule's API name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Floor => "floor",
            Self::LargestRemainder => "largestRemainder",
        }
    }

    /// The rule named `name` (exact), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "floor" => Some(Self::Floor),
            "largestRemainder" => Some(Self::LargestRemainder),
            _ => None,
        }
    }
}

/// What one holder of the snapshot is owed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// The holder.
    pub holder: Address,
    /// Its balance at the record date, base units of the asset.
    pub balance: U256,
    /// What it is owed, base units of the paying token (0 when excluded or rounded away).
    pub amount: U256,
    /// Whether it was excluded by the request.
    pub excluded: bool,
}

/// The plan of a distribution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Every holder of the snapshot, in the snapshot's order.
    pub shares: Vec<Share>,
    /// The sum of the shares, base units of the paying token.
    pub total_due: U256,
    /// What the rounding left unpaid (pro rata with [`Rounding::Floor`]; else 0).
    pub remainder: U256,
}

/// Why a plan cannot be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// `largestRemainder` has no remainder to hand out in a per-unit distribution.
    #[error("the rounding rule applies to pro-rata distributions only")]
    RoundingNotApplicable,
    /// The shares overflow 256 bits (a per-unit amount far above any supply).
    #[error("the amount owed overflows 256 bits")]
    Overflow,
}

/// `v` in 256 bits.
fn narrow(v: U512) -> Result<U256, PlanError> {
    let limbs = v.as_limbs();
    if limbs[4..].iter().any(|l| *l != 0) {
        return Err(PlanError::Overflow);
    }
    Ok(U256::from_limbs([limbs[0], limbs[1], limbs[2], limbs[3]]))
}

/// The plan for `holders` (a final snapshot's rows: distinct holders, positive
/// balances) of an asset with `decimals`, paying by `basis` under `rounding`, leaving
/// out `excluded`. A pro-rata split over no eligible balance owes nothing and leaves the
/// whole total as the remainder.
///
/// # Errors
/// [`PlanError::RoundingNotApplicable`] for a per-unit basis with
/// [`Rounding::LargestRemainder`]; [`PlanError::Overflow`].
pub fn plan(
    holders: &[(Address, U256)],
    decimals: u8,
    basis: Basis,
    rounding: Rounding,
    excluded: &HashSet<Address>,
) -> Result<Plan, PlanError> {
    let mut shares: Vec<Share> = holders
        .iter()
        .map(|&(holder, balance)| Share {
            holder,
            balance,
            amount: U256::ZERO,
            excluded: excluded.contains(&holder),
        })
        .collect();
    match basis {
        Basis::PerUnit(per_unit) => {
            if rounding != Rounding::Floor {
                return Err(PlanError::RoundingNotApplicable);
            }
            let unit = U512::from(10u64).pow(U512::from(decimals));
            let mut total = U256::ZERO;
            for s in shares.iter_mut().filter(|s| !s.excluded) {
                let owed = U512::from(s.balance) * U512::from(per_unit) / unit;
                s.amount = narrow(owed)?;
                total = total.checked_add(s.amount).ok_or(PlanError::Overflow)?;
            }
            Ok(Plan {
                shares,
                total_due: total,
                remainder: U256::ZERO,
            })
        }
        Basis::ProRata(total) => {
            let sum: U512 = shares
                .iter()
                .filter(|s| !s.excluded)
                .map(|s| U512::from(s.balance))
                .fold(U512::ZERO, |a, b| a + b);
            if sum.is_zero() {
                return Ok(Plan {
                    shares,
                    total_due: U256::ZERO,
                    remainder: total,
                });
            }
            let total_wide = U512::from(total);
            let mut paid = U256::ZERO;
            // (dropped fraction's numerator, index) of every eligible holder.
            let mut fractions: Vec<(U512, usize)> = Vec::new();
            for (i, s) in shares.iter_mut().enumerate().filter(|(_, s)| !s.excluded) {
                let exact = total_wide * U512::from(s.balance);
                let (q, r) = exact.div_rem(sum);
                // q ≤ total < 2^256.
                s.amount = narrow(q)?;
                paid += s.amount;
                fractions.push((r, i));
            }
            let mut remainder = total - paid;
            if rounding == Rounding::LargestRemainder && !remainder.is_zero() {
                fractions.sort_by(|(ra, ia), (rb, ib)| {
                    rb.cmp(ra)
                        .then_with(|| shares[*ia].holder.cmp(&shares[*ib].holder))
                });
                // The remainder is below the number of eligible holders (each dropped
                // fraction is below one unit), so one pass hands all of it out.
                for (_, i) in fractions {
                    if remainder.is_zero() {
                        break;
                    }
                    shares[i].amount += U256::from(1u8);
                    remainder -= U256::from(1u8);
                }
            }
            Ok(Plan {
                shares,
                total_due: total - remainder,
                remainder,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(n: u8) -> Address {
        Address::repeat_byte(n)
    }

    fn u(n: u64) -> U256 {
        U256::from(n)
    }

    fn amounts(p: &Plan) -> Vec<u64> {
        p.shares.iter().map(|s| s.amount.to::<u64>()).collect()
    }

    /// 100 over balances 1:1:1 floors to 33 each and leaves 1; largest remainder gives
    /// the unit to the lowest address (all fractions tie).
    #[test]
    fn pro_rata_floor_leaves_a_remainder_and_largest_remainder_hands_it_out() {
        let holders = [(addr(1), u(5)), (addr(2), u(5)), (addr(3), u(5))];
        let none = HashSet::new();
        let floor = plan(&holders, 0, Basis::ProRata(u(100)), Rounding::Floor, &none).unwrap();
        assert_eq!(amounts(&floor), [33, 33, 33]);
        assert_eq!(floor.remainder, u(1));
        assert_eq!(floor.total_due, u(99));
        let lr = plan(
            &holders,
            0,
            Basis::ProRata(u(100)),
            Rounding::LargestRemainder,
            &none,
        )
        .unwrap();
        assert_eq!(amounts(&lr), [34, 33, 33]);
        assert_eq!(lr.remainder, U256::ZERO);
        assert_eq!(lr.total_due, u(100));
    }

    /// The unit goes to the largest dropped fraction, not the largest holder.
    #[test]
    fn largest_remainder_follows_the_fractions() {
        // 10 split 1:2:4 (S = 7): exact 1.43, 2.86, 5.71 → floor 1, 2, 5 (sum 8), then
        // fractions .43, .86, .71 → the two largest (2 and 3) get a unit.
        let holders = [(addr(1), u(1)), (addr(2), u(2)), (addr(3), u(4))];
        let p = plan(
            &holders,
            0,
            Basis::ProRata(u(10)),
            Rounding::LargestRemainder,
            &HashSet::new(),
        )
        .unwrap();
        assert_eq!(amounts(&p), [1, 3, 6]);
        assert_eq!(p.total_due, u(10));
    }

    /// Exclusions are owed nothing and do not dilute the others.
    #[test]
    fn exclusions_take_no_share() {
        let holders = [(addr(1), u(50)), (addr(2), u(25)), (addr(9), u(25))];
        let excluded: HashSet<_> = [addr(1)].into();
        let p = plan(
            &holders,
            0,
            Basis::ProRata(u(1_000)),
            Rounding::Floor,
            &excluded,
        )
        .unwrap();
        assert_eq!(amounts(&p), [0, 500, 500]);
        assert!(p.shares[0].excluded);
        assert_eq!(p.remainder, U256::ZERO);
        // Everyone excluded: nothing is owed, the total is the remainder.
        let all: HashSet<_> = holders.iter().map(|h| h.0).collect();
        let p = plan(&holders, 0, Basis::ProRata(u(1_000)), Rounding::Floor, &all).unwrap();
        assert_eq!(p.total_due, U256::ZERO);
        assert_eq!(p.remainder, u(1_000));
    }

    /// Per unit: balance · amount / 10^decimals, rounded down; no remainder; the
    /// largest-remainder rule is refused.
    #[test]
    fn per_unit_pays_each_whole_unit() {
        // 6 decimals: 1.5 units and 0.000001 units at 0.02 (2e16 wei) per unit.
        let holders = [(addr(1), u(1_500_000)), (addr(2), u(1))];
        let p = plan(
            &holders,
            6,
            Basis::PerUnit(u(20_000_000_000_000_000)),
            Rounding::Floor,
            &HashSet::new(),
        )
        .unwrap();
        assert_eq!(amounts(&p), [30_000_000_000_000_000, 20_000_000_000]);
        assert_eq!(p.total_due, u(30_000_020_000_000_000));
        assert_eq!(
            plan(
                &holders,
                6,
                Basis::PerUnit(u(1)),
                Rounding::LargestRemainder,
                &HashSet::new()
            ),
            Err(PlanError::RoundingNotApplicable)
        );
        // A share that rounds to nothing is 0.
        let p = plan(
            &holders,
            6,
            Basis::PerUnit(u(1)),
            Rounding::Floor,
            &HashSet::new(),
        )
        .unwrap();
        assert_eq!(amounts(&p), [1, 0]);
    }

    /// Balances and totals near 2^256 do not overflow; the per-unit overflow is typed.
    #[test]
    fn wide_values_are_exact() {
        let big = U256::MAX / u(2);
        let holders = [(addr(1), big), (addr(2), big)];
        let p = plan(
            &holders,
            0,
            Basis::ProRata(U256::MAX),
            Rounding::Floor,
            &HashSet::new(),
        )
        .unwrap();
        assert_eq!(p.shares[0].amount, U256::MAX / u(2));
        assert_eq!(p.total_due + p.remainder, U256::MAX);
        assert_eq!(
            plan(
                &holders,
                0,
                Basis::PerUnit(u(4)),
                Rounding::Floor,
                &HashSet::new()
            ),
            Err(PlanError::Overflow)
        );
    }

    /// For random balances and totals: Σ shares + remainder = total, every share is
    /// within one unit of exact, and largest remainder leaves nothing.
    #[test]
    fn shares_always_add_up() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..200 {
            let n = (next() % 40 + 1) as usize;
            let holders: Vec<_> = (0..n)
                .map(|i| {
                    let mut a = [0u8; 20];
                    a[..8].copy_from_slice(&(i as u64).to_be_bytes());
                    (Address::from(a), u(next() % 1_000_000 + 1))
                })
                .collect();
            let total = u(next() % 10_000_000);
            for rounding in [Rounding::Floor, Rounding::LargestRemainder] {
                let p = plan(
                    &holders,
                    0,
                    Basis::ProRata(total),
                    rounding,
                    &HashSet::new(),
                )
                .unwrap();
                let sum: U256 = p.shares.iter().map(|s| s.amount).sum();
                assert_eq!(sum, p.total_due);
                assert_eq!(sum + p.remainder, total);
                assert!(p.remainder < u(n as u64));
                if rounding == Rounding::LargestRemainder {
                    assert_eq!(p.remainder, U256::ZERO);
                }
                let s: U256 = holders.iter().map(|h| h.1).sum();
                for sh in &p.shares {
                    let floor = total * sh.balance / s;
                    assert!(sh.amount == floor || sh.amount == floor + u(1));
                }
            }
        }
    }
}
