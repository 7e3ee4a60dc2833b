import { onchainTable, primaryKey } from "ponder";

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

// Holder balances per token, as Keel's index keeps them (written only with
// PONDER_BALANCES=1; see src/index.ts).
export const balance = onchainTable(
  "balance",
  (t) => ({
    token: t.hex().notNull(),
    holder: t.hex().notNull(),
    amount: t.bigint().notNull(),
  }),
  (table) => ({ pk: primaryKey({ columns: [table.token, table.holder] }) }),
);
