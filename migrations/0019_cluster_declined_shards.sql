-- Shards a replica declines: it cannot serve a singleton keyed to them right now (e.g. a
-- chain's `txq/<chainId>` while that chain's RPC is unreachable from it). Rendezvous
-- hashing of such a shard skips the replicas that decline it (unless every live replica
-- does), so the shard, and the singletons on it, move to a replica that can serve them.
-- Written with every heartbeat; an older replica that does not know the column leaves
-- the default (declines nothing).
ALTER TABLE cluster_replica
    ADD COLUMN declined_shards INTEGER[] NOT NULL DEFAULT '{}';
