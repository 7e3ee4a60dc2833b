#!/usr/bin/env python3
"""Drives Keel's demo once `scripts/demo` has set up the chain, the database, an
organization and an API key: starts the api, runner and indexer roles as separate
processes, creates and mints an asset through the HTTP API, shows its holders at a
record date and now (Ledger read API), transfers from its issuer, pays 1 ETH pro rata
to the holders of a final record-date snapshot (POST /v1/distributions, checked on chain), kills the runner
(SIGKILL) in the middle of a second asset's feed phase, restarts it, checks the chain,
lists assets, operations (page by page) and templates, sends one ERC-4337 transfer from a
smart account with no ETH that Keel sponsors (bundler route: paymaster stub, gas estimate,
paymaster data, eth_sendUserOperation, receipt), and stops everything with SIGTERM. A custody leg starts keel-custody-sim (a local Fireblocks-compatible
provider) as a fourth process, creates an asset through a template whose sender is the
simulator's vault account, and mints once through it: the mint waits for an approval at
the provider, is approved through the simulator's admin call and completes via its
signed webhook. It also registers a webhook endpoint served by a tiny receiver
it starts, verifies every delivery's Standard Webhooks signature, and prints the events
of the first asset's operation in the order they arrived. Standard library only.

Environment: KEEL_BIN, KEEL_API_URL, KEEL_API_KEY, KEEL_RPC_URL, KEEL_LOG_DIR, KEEL_SIM_BIN,
KEEL_SIM_URL, KEEL_SIM_ARGS, and the KEEL__* configuration the roles read.
"""

import base64
import hashlib
import hmac
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import json
import os
import shlex
import socket
import threading
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

KEEL = os.environ["KEEL_BIN"]
API = os.environ["KEEL_API_URL"]
KEY = os.environ["KEEL_API_KEY"]
ORG = os.environ["KEEL_ORG_ID"]
RPC = os.environ["KEEL_RPC_URL"]
LOGS = os.environ["KEEL_LOG_DIR"]
SIM_BIN = os.environ["KEEL_SIM_BIN"]
SIM = os.environ["KEEL_SIM_URL"]
SIM_ARGS = shlex.split(os.environ["KEEL_SIM_ARGS"])
TRANSFER = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"  # Transfer(address,address,uint256)
ZERO_TOPIC = "0x" + "0" * 64
# The custody vault's address (Anvil's dev account 5, held by the simulator's vault 7).
VAULT = "0x9965507D1a55bcC2695C58ba16FB37d819B0A4dc"

# keccak256 of the event signatures (topic 0), from abi/src.
ASSET_CREATED = "0xdc647a4f8dd581a4b6e212975dc926f303bfc702ad2276f4f1c25ea6573b634b"  # AssetCreated(bytes32,address,string,uint8)
FEED_CREATED = "0xccb5b6e5743f688dc568f900f084c4b6543607a98d3a7387df4d4dad33235790"  # FeedCreated(address,uint8,string)
ANSWER_UPDATED = "0x0559884fd3a460db3073b7fc896cc77986f16e378210ded43186175bf646fc5f"  # AnswerUpdated(int256,uint256,uint256)
BOUND_SET = "0xa91978b9c8c6e2cd82882f86430d672ab44b1135e562721287584a35b456f1a6"  # StalenessBoundSet(address,uint256)
UNPAUSED = "0x5db9ee0a495bf2e6ff9c91a7834c1ba4fdd244a5e8aa4e537bd38aeae4b073aa"  # Unpaused(address)

# Anvil's dev account 2 (public test mnemonic): the mint's recipient.
HOLDER = "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"
# Dev accounts 3 and 4: the record-date holders. The operator (issuer): the KMS key
# scripts/demo configured (KEEL_OPERATOR_ADDRESS), else dev account 0.
HOLDER2 = "0x90F79bf6EB2c4f870365E785982E1f101E93b906"
HOLDER3 = "0x15d34AAf54267DB7D7c367839AAf71A00a2C6A65"
OPERATOR = os.environ.get("KEEL_OPERATOR_ADDRESS", "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266")
# Dev account 5: owner of the demo's smart account (it signs; the account holds no ETH).
AA_OWNER = "0x9965507D1a55bcC2695C58ba16FB37d819B0A4dc"
USER_OPERATION_EVENT = "UserOperationEvent(bytes32,address,address,uint256,bool,uint256,uint256)"

procs = {}

# The webhook receiver: every delivery (deduplicated by webhook-id), in arrival order.
received = []
received_ids = set()
received_lock = threading.Lock()
webhook_secret = []


def verify(secret, msg_id, timestamp, body, header):
    """Standard Webhooks: any `v1,<base64 HMAC-SHA256(key, id.timestamp.body)>` matches."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    expected = base64.b64encode(hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(s.partition(",")[2], expected) for s in header.split(" ") if s.startswith("v1,"))


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        msg_id = self.headers.get("webhook-id", "")
        ok = bool(webhook_secret) and verify(
            webhook_secret[0], msg_id, self.headers.get("webhook-timestamp", ""), body,
            self.headers.get("webhook-signature", ""))
        if not ok:
            self.send_response(400)
            self.end_headers()
            return
        with received_lock:
            if msg_id not in received_ids:
                received_ids.add(msg_id)
                received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def start_receiver():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/keel-webhooks"


def events_of(op_id):
    with received_lock:
        return [e for e in received if isinstance(e.get("data"), dict) and e["data"].get("id") == op_id]


def say(msg):
    print(f"demo: {msg}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The api role's Prometheus endpoint (the custody leg reads its webhook counter).
API_METRICS = f"127.0.0.1:{free_port()}"


def spawn(role):
    log = open(os.path.join(LOGS, f"{role}.log"), "a")
    env = dict(os.environ)
    if role == "api":
        env["KEEL__TELEMETRY__METRICSADDRESS"] = API_METRICS
    procs[role] = subprocess.Popen(
        [KEEL, "run", "--role", role, "--termination-grace-seconds", "10"],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env=env,
    )
    say(f"started {role:<7} (pid {procs[role].pid})")


def spawn_sim():
    """keel-custody-sim, the fourth process: the custody provider of the vault sender."""
    log = open(os.path.join(LOGS, "sim.log"), "a")
    listen = SIM.removeprefix("http://")
    p = subprocess.Popen(
        [SIM_BIN, "--listen", listen, "--rpc-url", RPC, "--webhook-url", f"{API}/v1/custody/webhooks/fireblocks",
         *SIM_ARGS],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    procs["sim"] = p
    line = p.stdout.readline().strip()
    if line != f"keel-custody-sim listening on {SIM}":
        fail(f"keel-custody-sim did not start: {line!r}")
    say(f"started sim     (pid {p.pid}) keel-custody-sim on {SIM}, webhooks to the api")


def sim_admin(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(SIM + path, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"null")


def custody_webhooks_counted():
    """keel_api_custody_webhooks_total by result, from the api role's metrics."""
    with urllib.request.urlopen(f"http://{API_METRICS}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("keel_api_custody_webhooks_total{") and 'result="' in line:
            result = line.split('result="')[1].split('"')[0]
            out[result] = out.get(result, 0) + float(line.rsplit(" ", 1)[1])
    return out


def stop_all():
    for role, p in procs.items():
        if p.poll() is None:
            # The simulator stops gracefully on SIGINT; the roles on SIGTERM.
            p.send_signal(signal.SIGINT if role == "sim" else signal.SIGTERM)
    for role, p in procs.items():
        try:
            code = p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            code = p.wait()
        say(f"stopped {role:<7} exit code {code}")


def http(method, path, body=None, idem=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(API + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {KEY}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if idem:
        req.add_header("Idempotency-Key", idem)
    try:
        with urllib.request.urlopen(req, timeout=70) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def rpc(method, params):
    req = urllib.request.Request(
        RPC,
        data=json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())["result"]


def logs(address, topic0, topic1=None):
    topics = [topic0] if topic1 is None else [topic0, topic1]
    return rpc("eth_getLogs", [{"fromBlock": "0x0", "toBlock": "latest", "address": address, "topics": topics}])


def bundler(method, params):
    """One JSON-RPC call of Keel's bundler route (ERC-7769 / ERC-7677); the result."""
    status, r = http("POST", "/v1/chains/31337/bundler", {"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    if status != 200 or "error" in r:
        fail(f"{method} answered {status}: {r}")
    return r["result"]


def selector(signature):
    return rpc("web3_sha3", ["0x" + signature.encode().hex()])[:10]


def word(address):
    return address[2:].lower().rjust(64, "0")


def uint(n):
    return format(n, "064x")


def aa_leg(asset, token, recipient, base_units):
    """A fresh SimpleAccount of dev account 5 (created by the operation's initCode, no
    ETH) receives 10 ACME, then transfers `base_units` of them to `recipient` in a user
    operation Keel sponsors: paymaster stub, gas estimate, paymaster data, the owner's
    EIP-712 signature (through Anvil), eth_sendUserOperation, the receipt. Returns the
    account, the operation hash and its receipt."""
    factory = json.loads(os.environ["KEEL_CONTRACTS"])["simpleAccountFactory"]
    ep = bundler("eth_supportedEntryPoints", [])[0]
    account = "0x" + rpc("eth_call", [{"to": factory, "data": selector("getAddress(address,uint256)") + word(AA_OWNER) + uint(0)}, "latest"])[-40:]
    token_op(asset, "mint", {"recipient": account, "amount": "10"}, "demo-mint-aa")
    if int(rpc("eth_getBalance", [account, "latest"]), 16) != 0 or rpc("eth_getCode", [account, "latest"]) != "0x":
        fail("the smart account is not fresh (it has ETH or code)")
    say(f"account    {account}: a SimpleAccount of {AA_OWNER} not deployed yet, 0 ETH, 10 ACME")
    transfer = (selector("transfer(address,uint256)") + word(recipient) + uint(base_units))[2:]
    call_data = (selector("execute(address,uint256,bytes)") + word(token) + uint(0) + uint(96)
                 + uint(len(transfer) // 2) + transfer.ljust((len(transfer) + 63) // 64 * 64, "0"))
    op = {
        "sender": account,
        "nonce": "0x0",
        "factory": factory,
        "factoryData": selector("createAccount(address,uint256)") + word(AA_OWNER) + uint(0),
        "callData": call_data,
        "maxFeePerGas": hex(int(rpc("eth_gasPrice", []), 16) * 2 + 10**9),
        "maxPriorityFeePerGas": hex(10**9),
    }
    chain = "0x7a69"
    op.update({k: v for k, v in bundler("pm_getPaymasterStubData", [op, ep, chain, {}]).items()
               if k in ("paymaster", "paymasterData", "paymasterVerificationGasLimit", "paymasterPostOpGasLimit")})
    gas = bundler("eth_estimateUserOperationGas", [op, ep])
    op.update({k: gas[k] for k in ("preVerificationGas", "verificationGasLimit", "callGasLimit")})
    op["paymasterData"] = bundler("pm_getPaymasterData", [op, ep, chain, {}])["paymasterData"]
    say(f"sponsor    paymaster {op['paymaster']} signed the operation (gas: verification {int(op['verificationGasLimit'], 16)},"
        f" call {int(op['callGasLimit'], 16)}, pre-verification {int(op['preVerificationGas'], 16)})")

    def h128(a, b):
        return "0x" + format(int(a, 16), "032x") + format(int(b, 16), "032x")

    packed = {
        "sender": account,
        "nonce": "0",
        "initCode": op["factory"] + op["factoryData"][2:],
        "callData": op["callData"],
        "accountGasLimits": h128(op["verificationGasLimit"], op["callGasLimit"]),
        "preVerificationGas": str(int(op["preVerificationGas"], 16)),
        "gasFees": h128(op["maxPriorityFeePerGas"], op["maxFeePerGas"]),
        "paymasterAndData": op["paymaster"] + format(int(op["paymasterVerificationGasLimit"], 16), "032x")
        + format(int(op["paymasterPostOpGasLimit"], 16), "032x") + op["paymasterData"][2:],
    }
    typed = {
        "types": {
            "EIP712Domain": [{"name": "name", "type": "string"}, {"name": "version", "type": "string"},
                             {"name": "chainId", "type": "uint256"}, {"name": "verifyingContract", "type": "address"}],
            "PackedUserOperation": [{"name": n, "type": t} for n, t in (
                ("sender", "address"), ("nonce", "uint256"), ("initCode", "bytes"), ("callData", "bytes"),
                ("accountGasLimits", "bytes32"), ("preVerificationGas", "uint256"), ("gasFees", "bytes32"),
                ("paymasterAndData", "bytes"))],
        },
        "primaryType": "PackedUserOperation",
        "domain": {"name": "ERC4337", "version": "1", "chainId": 31337, "verifyingContract": ep},
        "message": packed,
    }
    op["signature"] = rpc("eth_signTypedData_v4", [AA_OWNER, json.dumps(typed)])
    user_op_hash = bundler("eth_sendUserOperation", [op, ep])
    say(f"userOp     {user_op_hash} accepted by the bundler route")
    deadline = time.time() + 120
    receipt = None
    while time.time() < deadline and receipt is None:
        receipt = bundler("eth_getUserOperationReceipt", [user_op_hash])
        if receipt is None:
            time.sleep(0.5)
    if receipt is None:
        fail("the user operation was not included within 120 s")
    events = logs(ep, rpc("web3_sha3", ["0x" + USER_OPERATION_EVENT.encode().hex()]), user_op_hash)
    if not receipt["success"] or len(events) != 1:
        fail(f"the user operation did not land exactly once: {receipt['success']}, {len(events)} events")
    if int(rpc("eth_getBalance", [account, "latest"]), 16) != 0:
        fail("the smart account paid gas")
    return account, user_op_hash, receipt


def wait_ready():
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(API + "/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.2)
    fail("the api did not become ready")


def fail(msg):
    say(f"FAILED: {msg}")
    for role in procs:
        path = os.path.join(LOGS, f"{role}.log")
        say(f"--- last lines of {role}.log")
        with open(path) as f:
            print("".join(f.readlines()[-15:]))
    stop_all()
    sys.exit(1)


def follow(op_id, on_phase=None, timeout=180):
    """Polls the operation, printing each milestone and phase as it appears."""
    seen = set()
    deadline = time.time() + timeout
    while time.time() < deadline:
        status, view = http("GET", f"/v1/operations/{op_id}")
        if status != 200:
            fail(f"GET operation answered {status}: {view}")
        phase = (view.get("progress") or {}).get("phase")
        if phase and ("phase", phase) not in seen:
            seen.add(("phase", phase))
            say(f"  phase      {phase}")
            if on_phase:
                on_phase(phase)
        for m in view["milestones"]["submitted"]:
            k = ("submitted", m["step"])
            if k not in seen and m.get("txHash"):
                seen.add(k)
                how = f"nonce {m['nonce']}" if m.get("nonce") is not None else "(signed and broadcast by the custody provider)"
                say(f"  submitted  {m['step']:<19} tx {m['txHash']} {how}")
        for m in view["milestones"]["confirmed"]:
            k = ("confirmed", m["step"])
            if k not in seen:
                seen.add(k)
                say(f"  confirmed  {m['step']:<19} block {m['block']}")
        if view["milestones"].get("indexed") and "indexed" not in seen:
            seen.add("indexed")
            say(f"  indexed    at block {view['milestones']['indexed']['block']}")
        if view["state"] in ("completed", "failed", "cancelled"):
            return view
        time.sleep(0.1)
    fail(f"operation {op_id} did not end within {timeout} s")


def create_asset(idem, name, symbol, template="standard"):
    status, view = http(
        "POST",
        "/v1/assets",
        {"name": name, "symbol": symbol, "decimals": 6, "templateId": template, "initialPrice": "101.25"},
        idem,
    )
    if status not in (200, 202):
        fail(f"POST /v1/assets answered {status}: {view}")
    say(f"accepted   operation {view['id']} for asset {view['assetId']} (HTTP {status})")
    return view


def token_op(asset, what, body, idem):
    """Submits a token operation and follows it to completion; returns its view."""
    status, op = http("POST", f"/v1/assets/{asset}/{what}", body, idem)
    if status not in (200, 202):
        fail(f"{what} answered {status}: {op}")
    view = follow(op["id"])
    if view["state"] != "completed":
        fail(f"{what} ended {view['state']}: {view.get('error')}")
    return view


def distribution_leg(asset, record, holders):
    """Snapshots `asset` at `record`, lets the block become final (mines 70 blocks: the
    local chain's finality is head - 64), pays 1 ETH pro rata (largest remainder) to the
    snapshot's holders through POST /v1/distributions and checks every payment on chain
    with eth_getBalance. Returns the wei paid per holder."""
    status, snap = http("POST", f"/v1/assets/{asset}/snapshots", {"atBlock": record})
    if status not in (200, 201):
        fail(f"POST snapshots answered {status}: {snap}")
    say(f"snapshot   {snap['id']} of block {record}: {snap['state']} ({snap.get('pendingReason')})")
    rpc("anvil_mine", [hex(70)])
    deadline = time.time() + 60
    while snap["state"] != "final":
        if time.time() > deadline:
            fail(f"the snapshot did not become final: {snap}")
        time.sleep(0.2)
        status, snap = http("GET", f"/v1/assets/{asset}/snapshots/{snap['id']}")
    say(f"snapshot   final: {snap['holderCount']} holders, total {snap['total']} ACME, sha-256 {snap['contentHash']}")
    total = 10**18
    balances = {a.lower(): int(b) for a, b in holders}
    s = sum(balances.values())
    exact = {a: (total * b // s, total * b % s) for a, b in balances.items()}
    left = total - sum(q for q, _ in exact.values())
    owed = {a: q for a, (q, _) in exact.items()}
    for a in sorted(balances, key=lambda a: (-exact[a][1], a))[:left]:
        owed[a] += 1
    before = {a: int(rpc("eth_getBalance", [a, "latest"]), 16) for a in balances}
    status, op = http("POST", "/v1/distributions", {
        "assetId": asset, "snapshotId": snap["id"], "payWith": "native", "basis": "proRata",
        "amountBaseUnits": str(total), "rounding": "largestRemainder"}, "demo-distribution-1")
    if status not in (200, 202):
        fail(f"POST /v1/distributions answered {status}: {op}")
    view = follow(op["id"])
    if view["state"] != "completed":
        fail(f"the distribution ended {view['state']}: {view.get('error')}")
    status, d = http("GET", f"/v1/distributions/{op['id']}")
    p = d["progress"]
    say(f"  paid       {p['paid']['holders']} holders, {p['paid']['amount']} wei in {p['batchesPaid']} batch(es);"
        f" remainder {d['remainder']} wei")
    status, pays = http("GET", f"/v1/distributions/{op['id']}/payments")
    for row in pays["data"]:
        after = int(rpc("eth_getBalance", [row["holder"], "latest"]), 16)
        got = after - before[row["holder"].lower()]
        say(f"    {row['holder']}  {row['state']:<5} {row['amount']:>20} wei  tx {row['txHash']}  on chain +{got} wei")
        if row["state"] != "paid" or int(row["amount"]) != owed[row["holder"].lower()] or got != int(row["amount"]):
            fail("a holder was not paid exactly its pro-rata share once")
    if sum(int(r["amount"]) for r in pays["data"]) != total:
        fail("the shares do not sum to the total")
    status, again = http("POST", "/v1/distributions", {
        "assetId": asset, "snapshotId": snap["id"], "payWith": "native", "basis": "proRata",
        "amountBaseUnits": str(total), "rounding": "largestRemainder"}, "demo-distribution-1")
    if again.get("id") != op["id"]:
        fail(f"the same idempotency key did not answer the same distribution: {again}")
    say("  replayed   the same request and idempotency key: the same distribution, nothing paid twice")
    return {r["holder"]: int(r["amount"]) for r in pays["data"]}


def follow_ok(status, view, what):
    if status not in (200, 202):
        fail(f"{what} answered {status}: {view}")
    done = follow(view["id"])
    if done["state"] != "completed":
        fail(f"{what} ended {done['state']}: {done.get('error')}")
    return done


def org_system_leg():
    """Issue 37: the organization's own system (factory, eligibility registry, compliance
    contract), a regulated asset through it, two investors, the eligible-holders rule,
    and a transfer to an unregistered address refused at the API with its reason."""
    chain_id = int(rpc("eth_chainId", []), 16)
    say(f"6b. the organization's own system on chain {chain_id}: deploy it, create a regulated asset through it")
    status, op = http("POST", f"/v1/organizations/{ORG}/system", {"chainId": chain_id}, "demo-system-1")
    done = follow_ok(status, op, "the system deployment")
    r = done["result"]
    say(f"system     factory {r['factoryAddress']} registry {r['registryAddress']} compliance {r['complianceAddress']}"
        f" (block {r['deployedBlock']})")
    _, systems = http("GET", f"/v1/organizations/{ORG}/systems")
    system = next(s for s in systems["data"] if s["id"] == r["systemId"])
    if not (system["current"] and system["state"] == "active"):
        fail(f"the deployed system is not the organization's: {system}")
    reg = create_asset("demo-asset-4", "Delta Regulated Fund", "DLTA")
    done = follow(reg["id"])
    if done["state"] != "completed":
        fail(f"the regulated asset ended {done['state']}: {done.get('error')}")
    token = done["result"]["tokenAddress"]
    bound = "0x" + rpc("eth_call", [{"to": token, "data": selector("compliance()")}, "latest"])[-40:]
    if bound.lower() != r["complianceAddress"].lower():
        fail("the regulated token is not bound to the system's compliance contract")
    say(f"asset      DLTA token {token}: a RegulatedToken asking compliance {bound} on every mint and transfer")
    for i, (who, country) in enumerate([(HOLDER, "840"), (HOLDER2, "276")]):
        status, op = http("POST", f"/v1/organizations/{ORG}/investors",
                          {"chainId": chain_id, "address": who, "eligible": True, "countryCode": country},
                          f"demo-investor-{i}")
        follow_ok(status, op, "an investor write")
        say(f"investor   {who} eligible, country {country}")
    status, op = http("POST", f"/v1/assets/{reg['assetId']}/set-compliance", {"eligibleOnly": True}, "demo-rules-1")
    follow_ok(status, op, "the compliance rules")
    say("rules      DLTA: eligible holders only")
    token_op(reg["assetId"], "mint", {"recipient": HOLDER, "amount": "50"}, "demo-mint-dlta")
    say(f"minted     50 DLTA to {HOLDER} (eligible)")
    refusals = []
    for what, idem in (("transfer", "demo-transfer-dlta"), ("mint", "demo-mint-dlta-2")):
        status, body = http("POST", f"/v1/assets/{reg['assetId']}/{what}", {"recipient": HOLDER3, "amount": "1"}, idem)
        if status != 422 or body.get("code") != "COMPLIANCE_NOT_ELIGIBLE":
            fail(f"a {what} to an unregistered address was not refused at the API: {status} {body}")
        say(f"refused    {what} of 1 DLTA to {HOLDER3}: HTTP {status} {body['code']} ({body['detail']})")
        refusals.append(f"{what} {status} {body['code']}")
    # Issue 37 §3, agent operations: part of the holder's balance frozen (the holders
    # page shows it), then the holder's wallet recovered onto a new one: balance,
    # frozen amount and registry entry move, each write once.
    token_op(reg["assetId"], "freeze", {"account": HOLDER, "amount": "20"}, "demo-freeze-dlta")
    _, _, rows = holders_at(reg["assetId"])
    row = next((h for h in rows if h["address"].lower() == HOLDER.lower()), None)
    if row is None or row["frozenBalance"] != "20":
        fail(f"the holders page does not show the frozen amount: {row}")
    say(f"froze      20 of {HOLDER}'s {row['balance']} DLTA: the holders page shows frozenBalance {row['frozenBalance']}")
    done = token_op(reg["assetId"], "recover", {"lostWallet": HOLDER, "newWallet": HOLDER3}, "demo-recover-dlta")
    _, _, rows = holders_at(reg["assetId"])
    moved = next((h for h in rows if h["address"].lower() == HOLDER3.lower()), None)
    if moved is None or moved["balance"] != "50" or moved["frozenBalance"] != "20":
        fail(f"the recovered wallet does not hold the balance and the frozen amount: {moved}")
    if any(h["address"].lower() == HOLDER.lower() for h in rows):
        fail("the lost wallet still holds DLTA after the recovery")
    registered = rpc("eth_call", [{"to": r["registryAddress"], "data": selector("investorOf(address)") + word(HOLDER3)}, "latest"])
    if int(registered[2:66], 16) != 1:
        fail("the new wallet is not registered after the recovery")
    say(f"recovered  {HOLDER} -> {HOLDER3}: {moved['balance']} DLTA ({moved['frozenBalance']} frozen) and its registry entry"
        f" moved (last write {done['result']['txHash']})")
    return system, ", ".join(refusals)


def holders_at(asset, block=None):
    """Every holder of `asset` (at `block`, else the indexed tip), walking the pages."""
    query = "limit=2" + ("" if block is None else f"&atBlock={block}")
    rows, cursor = [], None
    while True:
        status, page = http("GET", f"/v1/assets/{asset}/holders?{query}" + (f"&cursor={cursor}" if cursor else ""))
        if status != 200:
            fail(f"GET holders answered {status}: {page}")
        rows.extend(page["data"])
        cursor = page["nextCursor"]
        if not page["hasMore"]:
            return page["block"], page["finalized"], rows


def print_holders(label, block, finalized, rows, supply):
    say(f"  {label}: block {block} (finalized={str(finalized).lower()}), supply {supply} ACME")
    for h in rows:
        say(f"    {h['address']}  {h['balance']:>10} ACME")


def main():
    spawn_sim()
    for role in ("indexer", "runner", "api"):
        spawn(role)
    wait_ready()
    say("all three roles and the custody simulator are up; the api is ready")

    say("0. register a webhook endpoint served by a receiver this driver runs")
    url = start_receiver()
    status, created = http("POST", "/v1/webhook-endpoints", {"url": url, "eventTypes": ["*"], "description": "demo"})
    if status != 201:
        fail(f"POST /v1/webhook-endpoints answered {status}: {created}")
    webhook_secret.append(created["secret"])
    say(f"endpoint   {created['endpoint']['id']} -> {url} (signing secret shown once, kept by the driver)")

    say("1. create an asset through the Platform API and follow its operation")
    first = create_asset("demo-asset-1", "Acme Treasury Fund", "ACME")
    view = follow(first["id"])
    if view["state"] != "completed":
        fail(f"asset creation ended {view['state']}: {view.get('error')}")
    asset = first["assetId"]
    deadline = time.time() + 60
    while time.time() < deadline and not any(
        e["type"] == "operation.state_changed" and e["data"].get("state") == "completed" for e in events_of(first["id"])
    ):
        time.sleep(0.2)
    deadline = time.time() + 10
    while time.time() < deadline and not any(e["type"] == "operation.indexed" for e in events_of(first["id"])):
        time.sleep(0.2)
    first_events = events_of(first["id"])
    say(f"webhooks   the first asset's operation, {len(first_events)} events in arrival order (signatures verified):")
    for e in first_events:
        d = e["data"]
        say(f"  {e['createdAt']}  {e['type']:<32} state={d.get('state')} submitted={len(d['milestones']['submitted'])}"
            f" confirmed={len(d['milestones']['confirmed'])} indexed={d['milestones'].get('indexed') is not None}")
    if not first_events or first_events[0]["type"] != "operation.accepted":
        fail("the first webhook event of the operation is not operation.accepted")
    if first_events[-1]["data"].get("state") != "completed":
        fail("the completion of the first asset's operation was not delivered")
    history, cursor = [], None
    while True:
        q = f"/v1/operations/{first['id']}/history?limit=200" + (f"&cursor={cursor}" if cursor else "")
        status, page = http("GET", q)
        if status != 200:
            fail(f"GET {q} answered {status}: {page}")
        history += page["data"]
        cursor = page["nextCursor"]
        if not cursor:
            break
    say(f"history    the first asset's operation, {len(history)} entries (who asked, what Keel decided):")
    for e in history:
        who = e["actor"]["kind"] + (f":{e['actor']['id']}" if e["actor"]["id"] else "") + (
            f" ({e['actor']['reason']})" if e["actor"]["reason"] else "")
        what = e["detail"].get("name") or e["detail"].get("command") or ""
        ms = f" {e['detail']['durationMs']} ms" if "durationMs" in e["detail"] else ""
        state = (e.get("state") or {}).get("status")
        say(f"  #{e['seq']:<3} {e['recordedAt']}  {e['kind']:<21} {what:<28}{ms:<9} by {who:<45} state={state}")
    if not history or history[0]["kind"] != "command_received" or history[-1]["kind"] != "completed":
        fail("the first asset's history does not run from its command to its completion")
    status, a = http("GET", f"/v1/assets/{asset}")
    say(
        f"asset      {a['symbol']} token {a['tokenAddress']} feed {a['feedAddress']}"
        f" paused={a['paused']} bound={a['stalenessBoundSeconds']} s price={a['latestObservation']['answer']}"
    )

    say("2. mint 1,234.56 ACME (6 decimals) and read the balance back from the index")
    status, mint = http("POST", f"/v1/assets/{asset}/mint", {"recipient": HOLDER, "amount": "1234.56"}, "demo-mint-1")
    if status not in (200, 202):
        fail(f"mint answered {status}: {mint}")
    view = follow(mint["id"])
    if view["state"] != "completed":
        fail(f"mint ended {view['state']}: {view.get('error')}")
    block = view["result"]["block"]
    status, bal = http("GET", f"/v1/assets/{asset}/balances/{HOLDER}?minBlock={block}")
    say(f"balance    {HOLDER} holds {bal['balance']} ACME ({bal['balanceBaseUnits']} base units) at index block {bal['indexedBlock']}")
    if bal["balance"] != "1234.56":
        fail("the indexed balance is not the minted amount")

    say("2b. a record date: mint 500 ACME to a second holder, take that block as the record date,")
    say("    then mint 300 ACME to the issuer and transfer 120 of them to a third holder")
    record = token_op(asset, "mint", {"recipient": HOLDER2, "amount": "500"}, "demo-mint-2")["result"]["block"]
    token_op(asset, "mint", {"recipient": OPERATOR, "amount": "300"}, "demo-mint-3")
    last = token_op(asset, "transfer", {"recipient": HOLDER3, "amount": "120"}, "demo-transfer-1")["result"]["block"]
    # Read-after-write: wait until the index has the transfer's block.
    http("GET", f"/v1/assets/{asset}/balances/{HOLDER3}?minBlock={last}")
    then = holders_at(asset, record)
    now = holders_at(asset)
    _, s_then = http("GET", f"/v1/assets/{asset}/supply?atBlock={record}")
    _, s_now = http("GET", f"/v1/assets/{asset}/supply")
    print_holders("holders at the record date", *then, s_then["supply"])
    print_holders("holders now", *now, s_now["supply"])
    if [(h["address"], h["balance"]) for h in then[2]] != [(HOLDER, "1234.56"), (HOLDER2, "500")]:
        fail("the record-date snapshot is not the two holders of that block")
    if {h["address"]: h["balance"] for h in now[2]} != {HOLDER: "1234.56", HOLDER2: "500", OPERATOR: "180", HOLDER3: "120"}:
        fail("the holders now are not the four expected")
    _, transfers = http("GET", f"/v1/assets/{asset}/transfers?limit=1")
    t = transfers["data"][0]
    say(f"  latest transfer: block {t['blockNumber']} at {t['blockTime']}, {t['amount']} ACME {t['from']} -> {t['to']}, tx {t['txHash']}")
    issuer = a["issuerAddress"]
    say(f"issuer     {issuer} sends the asset's transactions; transfer moves its tokens: mint 100 to it, transfer 10.5")
    status, m = http("POST", f"/v1/assets/{asset}/mint", {"recipient": issuer, "amount": "100"}, "demo-mint-issuer")
    if status not in (200, 202) or follow(m["id"])["state"] != "completed":
        fail(f"the mint to the issuer did not complete: {m}")
    status, t = http("POST", f"/v1/assets/{asset}/transfer", {"recipient": HOLDER, "amount": "10.5"}, "demo-transfer-2")
    view = follow(t["id"]) if status in (200, 202) else t
    if view.get("state") != "completed":
        fail(f"the transfer did not complete: {view}")
    status, bal = http("GET", f"/v1/assets/{asset}/balances/{HOLDER}?minBlock={view['result']['block']}")
    say(f"balance    {HOLDER} holds {bal['balance']} ACME after the transfer")
    if bal["balance"] != "1245.06":
        fail("the indexed balance does not include the transfer")

    say("3. create a second asset and kill -9 the runner in the middle of its feed phase")
    killed = []

    def kill_runner(phase):
        if phase == "submit-observation" and not killed:
            p = procs["runner"]
            p.send_signal(signal.SIGKILL)
            p.wait()
            killed.append(phase)
            say(f"  KILLED     runner (SIGKILL, pid {p.pid}) during {phase}")
            spawn("runner")

    second = create_asset("demo-asset-2", "Beta Income Fund", "BETA")
    view = follow(second["id"], on_phase=kill_runner)
    if view["state"] != "completed":
        fail(f"second asset ended {view['state']}: {view.get('error')}")
    if not killed:
        fail("the runner was never killed (the feed phase passed unseen)")

    say("4. check the chain: exactly one of each deployment per asset")
    status, b = http("GET", f"/v1/assets/{second['assetId']}")
    contracts = json.loads(os.environ["KEEL_CONTRACTS"])
    asset_id_topic = "0x" + "0" * 32 + second["assetId"].replace("-", "")
    tokens = logs(contracts["assetFactory"], ASSET_CREATED, asset_id_topic)
    feeds = logs(contracts["priceFeedFactory"], FEED_CREATED)
    observations = logs(b["feedAddress"], ANSWER_UPDATED)
    bounds = logs(contracts["priceResolver"], BOUND_SET, "0x" + "0" * 24 + b["feedAddress"][2:].lower())
    unpauses = logs(b["tokenAddress"], UNPAUSED)
    say(f"  tokens deployed for the second asset: {len(tokens)}")
    say(f"  feeds deployed in total (two assets):  {len(feeds)}")
    say(f"  observations on its feed:             {len(observations)}")
    say(f"  staleness bounds for its feed:        {len(bounds)}")
    say(f"  unpauses of its token:                {len(unpauses)}")
    if (len(tokens), len(feeds), len(observations), len(bounds), len(unpauses)) != (1, 2, 1, 1, 1):
        fail("a deployment is missing or was repeated")

    say("5. list what exists: assets, operations (page by page) and templates")
    status, assets = http("GET", "/v1/assets")
    say(f"  assets:     {[x['symbol'] for x in assets['data']]} (hasMore={assets['hasMore']})")
    ops, cursor, pages = [], None, 0
    while True:
        status, page = http("GET", "/v1/operations?limit=2" + (f"&cursor={cursor}" if cursor else ""))
        if status != 200:
            fail(f"GET /v1/operations answered {status}: {page}")
        pages += 1
        ops += page["data"]
        if not page["hasMore"]:
            break
        cursor = page["nextCursor"]
    say(f"  operations: {len(ops)} in {pages} pages of 2: {', '.join(o['kind'] + '=' + o['state'] for o in ops)}")
    status, done = http("GET", f"/v1/operations?assetId={asset}&kind=asset.mint&state=completed")
    say(f"  completed mints of ACME: {len(done['data'])}")
    status, templates = http("GET", "/v1/templates")
    say(f"  templates:  {[x['id'] for x in templates['data']]}")
    if len(assets["data"]) != 2 or len(ops) != 8 or len(done["data"]) != 4:
        fail("the lists do not show what was created")

    say("5b. ERC-4337: a sponsored transfer of 2.5 ACME from a smart account with no ETH")
    account, user_op_hash, receipt = aa_leg(asset, a["tokenAddress"], HOLDER3, 2_500_000)
    block = int(receipt["receipt"]["blockNumber"], 16)
    status, bal = http("GET", f"/v1/assets/{asset}/balances/{HOLDER3}?minBlock={block}")
    say(f"included   bundle tx {receipt['receipt']['transactionHash']} block {block}: success, paid"
        f" {int(receipt['actualGasCost'], 16)} wei from the paymaster's deposit; {HOLDER3} holds {bal['balance']} ACME")
    if bal["balance"] != "122.5":
        fail("the indexed balance does not include the sponsored transfer")

    say(f"5c. a distribution at the record date (block {then[0]}): 1 ETH pro rata to its holders")
    paid_wei = distribution_leg(asset, then[0], [(h["address"], h["balanceBaseUnits"]) for h in then[2]])

    say("6. custody: an asset whose template sends from vault 'treasury' at keel-custody-sim")
    custody = create_asset("demo-asset-3", "Gamma Custody Fund", "GMMA", template="custody")
    view = follow(custody["id"])
    if view["state"] != "completed":
        fail(f"the custody asset ended {view['state']}: {view.get('error')}")
    status, g = http("GET", f"/v1/assets/{custody['assetId']}")
    say(f"asset      {g['symbol']} token {g['tokenAddress']} issuer {g['issuerAddress']} (the vault: every write signed and broadcast by the provider)")
    if g["issuerAddress"].lower() != VAULT.lower():
        fail("the custody asset's issuer is not the vault")
    sim_admin("POST", "/admin/faults/transaction", {"behavior": "require_approval"})
    say("  the provider's policy now asks for an approval of the next transaction")
    status, m = http("POST", f"/v1/assets/{custody['assetId']}/mint", {"recipient": HOLDER, "amount": "250"}, "demo-mint-custody")
    if status not in (200, 202):
        fail(f"the custody mint answered {status}: {m}")
    deadline = time.time() + 60
    while True:
        status, view = http("GET", f"/v1/operations/{m['id']}")
        wait = view.get("wait") or {}
        if wait.get("for") == "custody_approval":
            break
        if view["state"] in ("completed", "failed", "cancelled") or time.time() > deadline:
            fail(f"the custody mint never waited for the provider's approval: {view}")
        time.sleep(0.1)
    provider_tx = wait["custody"]["providerTxId"]
    say(f"  waiting    for custody_approval: provider {wait['custody']['provider']} transaction {provider_tx} status {wait['custody']['status']}")
    minted_before = len(logs(g["tokenAddress"], TRANSFER, ZERO_TOPIC))
    if minted_before != 0:
        fail("something was minted before the approval")
    counted_before = custody_webhooks_counted().get("woken", 0)
    sim_admin("POST", f"/admin/transactions/{provider_tx}/approve", {})
    say(f"  approved   at the provider (POST {SIM}/admin/transactions/{provider_tx}/approve)")
    view = follow(m["id"])
    if view["state"] != "completed":
        fail(f"the custody mint ended {view['state']}: {view.get('error')}")
    custody_mints = logs(g["tokenAddress"], TRANSFER, ZERO_TOPIC)
    woken = custody_webhooks_counted().get("woken", 0) - counted_before
    events = [e for e in sim_admin("GET", "/admin/webhooks/events") if e["resourceId"] == provider_tx]
    say(f"  completed  block {view['result']['block']}; mints on chain: {len(custody_mints)}; provider webhooks for it:"
        f" {len(events)} sent, {int(woken)} verified by the api and woke the queue")
    if len(custody_mints) != 1:
        fail("the custody mint did not land exactly once")
    if woken < 1:
        fail("no verified provider webhook woke the queue after the approval")

    system, regulated = org_system_leg()

    say("7. stop every role with SIGTERM (the simulator with SIGINT)")
    stop_all()
    print()
    print("Summary")
    print(f"  asset ACME  created and active; 1234.56 ACME minted to {HOLDER}, visible in the Ledger Index")
    print(f"              holders at the record date (block {then[0]}): 2; holders now (block {now[0]}): 4")
    print("              100 minted to its issuer, 10.5 transferred from the issuer to the holder")
    print(f"  asset BETA  created although the runner was killed during '{killed[0]}'; the chain holds")
    print("              exactly one token, one feed, one observation, one bound and one unpause for it")
    print(f"  asset GMMA  created through custody vault 'treasury' (keel-custody-sim); one mint of 250 waited")
    print(f"              for the provider's approval, was approved through the simulator's admin call and")
    print(f"              completed via its signed webhook ({int(woken)} verified); exactly {len(custody_mints)} mint on chain")
    print(f"  dividend    1 ETH pro rata to the {len(paid_wei)} holders of the record date, one batch through BatchPay:")
    print("              " + ", ".join(f"{a} +{w} wei" for a, w in paid_wei.items()))
    print(f"  ERC-4337    one sponsored transfer (2.5 ACME) from smart account {account}, which holds no ETH:")
    print(f"              user operation {user_op_hash} included once, gas paid by Keel's paymaster")
    print(f"  org system  serial {system['serial']}: factory {system['factoryAddress']}, registry {system['registryAddress']},")
    print(f"              compliance {system['complianceAddress']}; asset DLTA a RegulatedToken through it; two investors;")
    print(f"              a transfer and a mint to an unregistered address refused at the API: {regulated}")
    print(f"              20 DLTA of {HOLDER} frozen (shown in the holders page), then its wallet recovered onto")
    print(f"              {HOLDER3} with the balance, the frozen amount and the registry entry")
    print(f"  webhooks    {len(received)} distinct events delivered, every signature verified")
    print(f"  logs        {LOGS}")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - a demo prints why it stopped
        fail(f"{type(e).__name__}: {e}")
