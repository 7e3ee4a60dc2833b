//! Stable hashes: key → shard, shard group → lock namespace, rendezvous weights.
//!
//! Every function here is part of the on-disk and cross-process contract: replicas of
//! different versions must agree on them, and work already keyed to a shard must stay
//! there. **They must never change.** Golden values are pinned by unit tests.

use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use uuid::Uuid;

/// The shard of `key` among `shards` shards: the first 8 bytes of `SHA-256(key)`, read
/// as a big-endian `u64`, modulo `shards`. Returns a value in `0..shards`.
///
/// Stable forever (the mapping of existing work depends on it). `shards == 0` is
/// treated as 1 (every key maps to shard 0); configuration validation refuses 0.
pub fn shard_of(key: &[u8], shards: u32) -> u32 {
    let digest = Sha256::digest(key);
    let word = first_u64(&digest);
    // `shards` fits in u32, so the remainder does too.
    u32::try_from(word % u64::from(shards.max(1))).unwrap_or(0)
}

/// The advisory-lock namespace (first key of the two-int `pg_try_advisory_lock(int4,
/// int4)` form) of a shard group: the first 4 bytes of `SHA-256("keel-cluster:" +
/// group)`, big-endian, with the sign bit cleared so it reads the same as `pg_locks.classid`
/// (an unsigned `oid`). Stable forever.
pub fn group_key(group: &str) -> i32 {
    let mut hasher = Sha256::new();
    hasher.update(b"keel-cluster:");
    hasher.update(group.as_bytes());
    let digest = hasher.finalize();
    let word = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]) & 0x7fff_ffff;
    i32::try_from(word).unwrap_or(0)
}

/// The rendezvous (highest-random-weight) weight of `replica` for `shard`: the first
/// 8 bytes of `SHA-256(replica_uuid_bytes ‖ shard_be_u32)` as a big-endian `u64`.
pub fn rendezvous_weight(replica: &Uuid, shard: u32) -> u64 {
    let mut hasher = Sha256::new();
    hasher.update(replica.as_bytes());
    hasher.update(shard.to_be_bytes());
    first_u64(&hasher.finalize())
}

/// The replica among `live` that should own `shard`: the highest
/// [`rendezvous_weight`], ties broken by the larger UUID. `None` when `live` is empty.
///
/// Adding a replica moves to it only the shards it now wins; removing one moves only
/// its shards, each to the runner-up.
pub fn rendezvous_owner(shard: u32, live: &[Uuid]) -> Option<Uuid> {
    live.iter()
        .map(|id| (rendezvous_weight(id, shard), *id))
        .max()
        .map(|(_, id)| id)
}

/// The shards in `0..shards` that `me` should own given the `live` replicas of its group
/// (`me` is counted as live whether or not it is in `live`).
pub fn assignment(me: Uuid, live: &[Uuid], shards: u32) -> BTreeSet<u32> {
    let mut set: Vec<Uuid> = live.to_vec();
    if !set.contains(&me) {
        set.push(me);
    }
    (0..shards)
        .filter(|shard| rendezvous_owner(*shard, &set) == Some(me))
        .collect()
}

/// The shards in `0..shards` that `me` should own when some replicas decline some
/// shards: a shard's owner is the [`rendezvous_owner`] among the live replicas (`me`
/// included, declining `mine`) that do not decline it, or among all of them when every
/// one declines it (someone must hold the shard's other work). `live` pairs each replica
/// with the shards it declines; an entry for `me` in it is replaced by `mine`. With no
/// declines this is [`assignment`].
pub fn assignment_declining(
    me: Uuid,
    mine: &BTreeSet<u32>,
    live: &[(Uuid, BTreeSet<u32>)],
    shards: u32,
) -> BTreeSet<u32> {
    let mut set: Vec<(Uuid, &BTreeSet<u32>)> = live
        .iter()
        .filter(|(id, _)| *id != me)
        .map(|(id, d)| (*id, d))
        .collect();
    set.push((me, mine));
    let all: Vec<Uuid> = set.iter().map(|(id, _)| *id).collect();
    (0..shards)
        .filter(|shard| {
            let willing: Vec<Uuid> = set
                .iter()
                .filter(|(_, d)| !d.contains(shard))
                .map(|(id, _)| *id)
                .collect();
            let pool = if willing.is_empty() { &all } else { &willing };
            rendezvous_owner(*shard, pool) == Some(me)
        })
        .collect()
}

fn first_u64(digest: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_of_is_pinned() {
        // Golden values: if these change, every key moves shard. Never update them.
        assert_eq!(shard_of(b"", 1 << 20), GOLDEN_EMPTY);
        assert_eq!(shard_of(b"tip-ingest/1", 64), GOLDEN_TIP);
        assert_eq!(group_key("workflow"), GOLDEN_WORKFLOW);
        assert_eq!(group_key("indexer"), GOLDEN_INDEXER);
    }

    // SHA-256("") = e3b0c44298fc1c14..., 0xe3b0c44298fc1c14 % 2^20 = 0xc1c14.
    const GOLDEN_EMPTY: u32 = 0x000c_1c14;
    const GOLDEN_TIP: u32 = 7;
    const GOLDEN_WORKFLOW: i32 = 169_720_263;
    const GOLDEN_INDEXER: i32 = 1_902_092_464;

    #[test]
    fn shard_of_is_in_range_and_spread() {
        let shards = 16;
        let mut counts = [0u32; 16];
        for i in 0..16_000u32 {
            let s = shard_of(format!("key-{i}").as_bytes(), shards);
            assert!(s < shards);
            counts[s as usize] += 1;
        }
        for c in counts {
            assert!((800..1200).contains(&c), "uneven spread: {counts:?}");
        }
        assert_eq!(shard_of(b"anything", 0), 0);
    }

    #[test]
    fn assignment_partitions_and_moves_minimally() {
        let ids: Vec<Uuid> = (0..4u128)
            .map(|i| Uuid::from_u128(0x1234_5678 + i))
            .collect();
        let shards = 256;
        let three = &ids[..3];
        let mut union = BTreeSet::new();
        let mut total = 0;
        for id in three {
            let a = assignment(*id, three, shards);
            total += a.len();
            union.extend(a);
        }
        assert_eq!(total, shards as usize);
        assert_eq!(union.len(), shards as usize);
        // Adding a fourth replica only moves shards *to* it.
        for id in three {
            let before = assignment(*id, three, shards);
            let after = assignment(*id, &ids, shards);
            assert!(after.is_subset(&before));
        }
        // Each replica gets a fair share (±50%).
        for id in three {
            let n = assignment(*id, three, shards).len();
            assert!((43..=128).contains(&n), "share {n}");
        }
        assert_eq!(rendezvous_owner(0, &[]), None);
    }

    #[test]
    fn declined_shards_move_to_a_willing_replica() {
        let a = Uuid::from_u128(0xaaaa);
        let b = Uuid::from_u128(0xbbbb);
        let shards = 16;
        let none = BTreeSet::new();
        let ids = [a, b];
        // Pick a shard A wins without declines, then let A decline it.
        let won = assignment(a, &ids, shards);
        let shard = *won.iter().next().unwrap();
        let declines: BTreeSet<u32> = [shard].into();
        let live = vec![(a, declines.clone()), (b, none.clone())];
        let a_now = assignment_declining(a, &declines, &live, shards);
        let b_now = assignment_declining(b, &none, &live, shards);
        assert!(!a_now.contains(&shard));
        assert!(b_now.contains(&shard));
        // Nothing else moved; the two still partition every shard.
        assert_eq!(a_now, &won - &declines);
        assert_eq!(a_now.len() + b_now.len(), shards as usize);
        // When every replica declines a shard, the plain owner keeps it.
        let both = vec![(a, declines.clone()), (b, declines.clone())];
        assert!(assignment_declining(a, &declines, &both, shards).contains(&shard));
        assert!(!assignment_declining(b, &declines, &both, shards).contains(&shard));
        // Without declines it is the plain assignment.
        let plain = vec![(a, none.clone()), (b, none.clone())];
        assert_eq!(assignment_declining(a, &none, &plain, shards), won);
    }
}
