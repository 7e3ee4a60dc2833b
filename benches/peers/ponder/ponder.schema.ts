import { onchainTable } from "ponder";

// The same columns Keel's index_transfer keeps for a Transfer.
export const transfer = onchainTable("transfer", (t) => ({
  id: t.text().primaryKey(),
  token: t.hex().notNull(),
  from: t.hex().notNull(),
  to: t.hex().notNull(),
  value: t.bigint().notNull(),
  blockNumber: t.bigint().notNull(),
  blockHash: t.hex().notNull(),
  txHash: t.hex().notNull(),
  logIndex: t.integer().notNull(),
}));
