{
  phases: [],
  errors: [],
  cur: null,
  done: false,
  gasAt: -1,
  gasAddr: "",
  extAt: null,
  depth: 1,
  ep: "",
  word: function (w) { return "0x" + w.toString(16); },
  addrOf: function (w) { var h = w.toString(16); while (h.length < 40) { h = "0" + h; } return "0x" + h.slice(-40); },
  sel: function (log, off, len) {
    if (len < 4) { return len == 0 ? "" : "short"; }
    if (off + 4 > log.memory.length()) { return "short"; }
    return toHex(log.memory.slice(off, off + 4));
  },
  arg: function (log, off, len) {
    if (len < 36 || off + 36 > log.memory.length()) { return ""; }
    var h = toHex(log.memory.slice(off + 4, off + 36));
    return "0x" + h.slice(-40);
  },
  step: function (log, db) {
    try { this.stepInner(log, db); } catch (e) { this.errors.push(String(e)); }
  },
  stepInner: function (log, db) {
    var op = log.op.toString();
    var d = log.getDepth();
    if (this.done) { return; }
    if (this.gasAt >= 0) {
      if (op.indexOf("CALL") < 0 && this.cur !== null) { this.cur.ops.push({ op: "GAS", addr: this.gasAddr }); }
      this.gasAt = -1;
    }
    if (this.extAt !== null) {
      if (op == "ISZERO") { this.extAt.iszero = true; }
      this.extAt = null;
    }
    if (d == 1) {
      if (this.ep === "") { this.ep = toHex(log.contract.getAddress()); }
      if (op == "CALL" || op == "STATICCALL" || op == "DELEGATECALL" || op == "CALLCODE") {
        var to = this.addrOf(log.stack.peek(1));
        var a = (op == "CALL" || op == "CALLCODE") ? 3 : 2;
        var s = this.sel(log, Number(log.stack.peek(a)), Number(log.stack.peek(a + 1)));
        if (to == this.ep) { this.done = true; return; }
        this.cur = { to: to, sel: s, ops: [], acc: {}, calls: [], keccak: [], create2: [], oog: false, out: "" };
        this.phases.push(this.cur);
      }
      return;
    }
    if (this.cur === null) { return; }
    var self = toHex(log.contract.getAddress());
    if (self == this.ep) { return; }
    switch (op) {
      case "GAS": this.gasAt = d; this.gasAddr = self; break;
      case "ORIGIN": case "GASPRICE": case "BLOCKHASH": case "COINBASE": case "TIMESTAMP":
      case "NUMBER": case "DIFFICULTY": case "PREVRANDAO": case "GASLIMIT": case "BASEFEE":
      case "CREATE": case "INVALID": case "SELFDESTRUCT": case "BALANCE": case "SELFBALANCE":
      case "BLOBHASH": case "BLOBBASEFEE":
        this.cur.ops.push({ op: op, addr: self }); break;
      case "CREATE2": this.cur.create2.push(self); break;
      case "SLOAD": case "SSTORE": case "TLOAD": case "TSTORE":
        var k = (op == "TLOAD" || op == "TSTORE") ? "t" : "s";
        var w = (op == "SSTORE" || op == "TSTORE") ? "w" : "r";
        var slot = this.word(log.stack.peek(0));
        var e = this.cur.acc[self];
        if (e === undefined) { e = {}; this.cur.acc[self] = e; }
        e[k + w + ":" + slot] = 1;
        break;
      case "KECCAK256": case "SHA3":
        var off = Number(log.stack.peek(0)); var len = Number(log.stack.peek(1));
        if (len >= 32 && len <= 128 && off + len <= log.memory.length()) { this.cur.keccak.push(toHex(log.memory.slice(off, off + len))); }
        break;
      case "EXTCODESIZE": case "EXTCODEHASH": case "EXTCODECOPY":
        var t = this.addrOf(log.stack.peek(0));
        var ext = { op: op, from: self, to: t, code: db.getCode(toAddress(t)).length > 0, value: false, sel: "", arg: "", iszero: false };
        this.cur.calls.push(ext);
        if (op == "EXTCODESIZE") { this.extAt = ext; }
        break;
      case "CALL": case "CALLCODE": case "STATICCALL": case "DELEGATECALL":
        var to2 = this.addrOf(log.stack.peek(1));
        var hasValue = (op == "CALL" || op == "CALLCODE") && log.stack.peek(2) != 0;
        var a2 = (op == "CALL" || op == "CALLCODE") ? 3 : 2;
        var s2 = "";
        var arg2 = "";
        if (to2 == this.ep) {
          var off2 = Number(log.stack.peek(a2)); var len2 = Number(log.stack.peek(a2 + 1));
          s2 = this.sel(log, off2, len2);
          arg2 = this.arg(log, off2, len2);
        }
        this.cur.calls.push({ op: op, from: self, to: to2, code: db.getCode(toAddress(to2)).length > 0, value: hasValue, sel: s2, arg: arg2, iszero: false });
        break;
    }
  },
  fault: function (log, db) {},
  enter: function (frame) { this.depth++; },
  exit: function (frame) {
    var d = this.depth;
    this.depth--;
    if (this.done || this.cur === null) { return; }
    var err = frame.getError();
    if (err !== undefined && err !== null && String(err).toLowerCase().indexOf("out of gas") >= 0) { this.cur.oog = true; }
    if (d == 2) {
      var o = frame.getOutput();
      this.cur.out = o === undefined || o === null ? "" : toHex(o.length > 4096 ? o.slice(0, 4096) : o);
    }
  },
  result: function (ctx, db) {
    return { phases: this.phases, errors: this.errors, output: toHex(ctx.output), error: ctx.error === undefined ? "" : String(ctx.error) };
  }
}
