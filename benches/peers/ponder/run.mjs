// Runs Ponder (`ponder start`) over the Keel index benchmark's chain and measures how
// long it takes until every expected Transfer is in its table.
//
// Environment: PONDER_RPC_URL, PONDER_CHAIN_ID, PONDER_ADDRESS (the emitter),
// PONDER_EXPECTED (events), DATABASE_URL (a fresh database), optional PONDER_TIMEOUT_S
// (default 3600), optional PONDER_BALANCES=1 (also keep holder balances; see
// src/index.ts). Prints progress to stderr and a last line
// `RESULT events=N events_per_s=X total_s=T startup_s=S first_row_s=F [balance_rows=B]`, where the rate
// is N over the window from Ponder's HTTP server answering /health (build and start-up
// done, sync about to begin) to the last row being visible.
import { spawn } from "node:child_process";
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";

const here = path.dirname(fileURLToPath(import.meta.url));
// node-postgres reads `sslmode=prefer` (which Rust's URL carries) as "require and
// verify"; the local server is plain TCP.
{
  const u = new URL(process.env.DATABASE_URL);
  u.searchParams.delete("sslmode");
  process.env.DATABASE_URL = u.toString();
}
const expected = Number(process.env.PONDER_EXPECTED ?? "0");
const timeoutMs = Number(process.env.PONDER_TIMEOUT_S ?? "3600") * 1000;
const schema = "ponder_bench";

const freePort = () =>
  new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on("error", reject);
  });

const port = await freePort();
const started = performance.now();
const child = spawn(
  path.join(here, "node_modules/.bin/ponder"),
  ["start", "--schema", schema, "--port", String(port), "--log-level", "warn"],
  { cwd: here, env: process.env, stdio: ["ignore", "inherit", "inherit"], detached: true },
);
let exited = null;
child.on("exit", (code, signal) => {
  exited = { code, signal };
});
const stop = () => {
  try {
    process.kill(-child.pid, "SIGTERM");
  } catch {}
};
process.on("exit", stop);

const client = new pg.Client({ connectionString: process.env.DATABASE_URL });
await client.connect();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const secs = (t) => (t - started) / 1000;

let health = null;
let firstRow = null;
let done = null;
let last = 0;
while (performance.now() - started < timeoutMs) {
  if (exited) {
    console.error(`ponder exited early: ${JSON.stringify(exited)}`);
    process.exit(1);
  }
  if (health === null) {
    try {
      const r = await fetch(`http://127.0.0.1:${port}/health`);
      if (r.ok) health = performance.now();
    } catch {}
  }
  try {
    const r = await client.query(`SELECT count(*)::bigint AS n FROM ${schema}.transfer`);
    const n = Number(r.rows[0].n);
    if (n > 0 && firstRow === null) firstRow = performance.now();
    if (n !== last) {
      console.error(`ponder: ${n} rows at ${secs(performance.now()).toFixed(1)} s`);
      last = n;
    }
    if (n >= expected) {
      done = performance.now();
      break;
    }
  } catch {
    // The table does not exist yet.
  }
  await sleep(100);
}
let balances = "";
if (done !== null && process.env.PONDER_BALANCES === "1") {
  const r = await client.query(`SELECT count(*)::bigint AS n FROM ${schema}.balance`);
  balances = ` balance_rows=${r.rows[0].n}`;
}
await client.end();
stop();
if (done === null) {
  console.error(`ponder: timed out with ${last} of ${expected} rows`);
  process.exit(1);
}
const from = health ?? started;
const rate = expected / ((done - from) / 1000);
console.log(
  `RESULT events=${expected} events_per_s=${rate.toFixed(0)} total_s=${secs(done).toFixed(2)} ` +
    `startup_s=${secs(from).toFixed(2)} first_row_s=${firstRow === null ? "n/a" : secs(firstRow).toFixed(2)}` +
    balances,
);
process.exit(0);
