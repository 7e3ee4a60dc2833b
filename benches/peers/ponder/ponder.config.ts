import { createConfig } from "ponder";
import { parseAbiItem } from "viem";

// Everything comes from the environment set by run.mjs (the Keel bench sets it).
const transfer = parseAbiItem(
  "event Transfer(address indexed from, address indexed to, uint256 value)",
);

export default createConfig({
  database: {
    kind: "postgres",
    connectionString: process.env.DATABASE_URL,
  },
  chains: {
    anvil: {
      id: Number(process.env.PONDER_CHAIN_ID ?? 31337),
      rpc: process.env.PONDER_RPC_URL,
      disableCache: true,
      pollingInterval: 1_000,
    },
  },
  contracts: {
    Emitter: {
      chain: "anvil",
      abi: [transfer],
      address: process.env.PONDER_ADDRESS as `0x${string}`,
      startBlock: 0,
    },
  },
});
