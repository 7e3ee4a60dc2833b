import { ponder } from "ponder:registry";
import { transfer } from "ponder:schema";

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
});
