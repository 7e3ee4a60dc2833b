import { ponder } from "ponder:registry";
import { balance, transfer } from "ponder:schema";

// PONDER_BALANCES=1 also keeps each holder's balance per token (one upsert for the
// sender and one for the recipient), the work Keel's index does for its holders pages;
// without it only the transfer row is written.
const withBalances = process.env.PONDER_BALANCES === "1";

ponder.on("Emitter:Transfer", async ({ event, context }) => {
  await context.db.insert(transfer).values({
    id: event.id,
    token: event.log.address,
    from: event.args.from,
    to: event.args.to,
    value: event.args.value,
    blockNumber: event.block.number,
    blockHash: event.block.hash,
    txHash: event.transaction.hash,
    logIndex: event.log.logIndex,
  });
  if (withBalances) {
    const token = event.log.address;
    const value = event.args.value;
    await context.db
      .insert(balance)
      .values({ token, holder: event.args.from, amount: -value })
      .onConflictDoUpdate((row) => ({ amount: row.amount - value }));
    await context.db
      .insert(balance)
      .values({ token, holder: event.args.to, amount: value })
      .onConflictDoUpdate((row) => ({ amount: row.amount + value }));
  }
});
