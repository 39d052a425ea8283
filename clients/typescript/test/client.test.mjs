// The client against a real daemon (test/daemon.mjs): runs and their codes, blobs and files,
// records and replay, a session of the registry's `cat`, concurrency and id matching, and
// what the client refuses before sending.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import {
  MAX_LINE_BYTES,
  SandboxClient,
  SandboxConnectionError,
  SandboxError,
} from "../dist/index.js";
import { python, startDaemon, ticket, toolTicket } from "./daemon.mjs";

let daemon;
let sb;

before(async () => {
  daemon = await startDaemon();
  sb = await SandboxClient.connect(daemon.socket);
});

after(async () => {
  await sb?.close();
  await daemon?.stop();
});

// Every field the daemon writes (docs/protocol.md, "run_result"): what the RunResult type says.
const RESULT_FIELDS = [
  "v", "code", "message", "exit_code", "signal", "stdout", "stderr", "files_out",
  "files_dropped", "usage", "oom_kills", "timeout_clamped", "memory_clamped", "timeout_ms",
  "memory_limit_bytes", "isolation", "runtime", "egress_attempts", "egress_attempts_dropped",
  "violation", "run_id", "queue", "queue_wait_ms", "backend", "approval",
].sort();

test("a run that ends ok: its stdout, exit code and every field of the result", async () => {
  const r = await sb.run(ticket(), python("print(6 * 7)"));
  assert.equal(r.code, "ok", r.message);
  assert.equal(r.exit_code, 0);
  assert.equal(r.signal, null);
  assert.equal(r.stdout.summary, "42\n");
  assert.equal(r.stdout.bytes, 3);
  assert.equal(r.stdout.truncated, false);
  assert.equal(r.isolation, "process");
  assert.equal(r.runtime.name, "python3");
  assert.match(r.runtime.digest, /^sha256:[0-9a-f]{64}$/);
  assert.deepEqual(Object.keys(r).sort(), RESULT_FIELDS);
  assert.deepEqual(Object.keys(r.usage).sort(), ["cpu_ms", "peak_memory_bytes", "setup_ms", "wall_ms"]);
  // The stdout blob holds the bytes exactly.
  const out = await sb.getBlob("acme", r.stdout.blob);
  assert.equal(out.toString("utf8"), "42\n");
});

test("a run past its timeout_ms is a result with code timeout, not a rejection", async () => {
  const r = await sb.run(ticket(), python("import time\ntime.sleep(30)", { timeout_ms: 300 }));
  assert.equal(r.code, "timeout");
  assert.equal(r.timeout_ms, 300);
  assert.equal(r.exit_code, null);
  assert.notEqual(r.signal, null);
});

test("refused runs are results: action_denied, invalid_request, clamped limits", async () => {
  const denied = await sb.run({ ...ticket(), actions: [] }, python("print(1)"));
  assert.equal(denied.code, "action_denied");
  assert.equal(denied.backend, "");
  assert.match(denied.message, /code\.execute/);

  const invalid = await sb.run(ticket(), python("print(1)", { timeout_ms: 0 }));
  assert.equal(invalid.code, "invalid_request");
  assert.match(invalid.message, /timeout_ms/);

  const clamped = await sb.run(ticket(), python("print(1)", { timeout_ms: 60000 }));
  assert.equal(clamped.code, "ok");
  assert.equal(clamped.timeout_clamped, true);
  assert.equal(clamped.timeout_ms, 8000);
});

test("blobs: a binary round trip; absent and other tenants' blobs are blob_not_found", async () => {
  const bytes = new Uint8Array(70000);
  for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 7 + 3) % 256;
  const id = await sb.putBlob("acme", bytes);
  assert.match(id, /^sha256:[0-9a-f]{64}$/);
  const back = await sb.getBlob("acme", id);
  assert.ok(Buffer.from(bytes).equals(back), "the blob's bytes came back changed");
  // A subarray view is stored as its own bytes, not its whole buffer.
  const view = bytes.subarray(10, 20);
  assert.ok(Buffer.from(view).equals(await sb.getBlob("acme", await sb.putBlob("acme", view))));
  assert.equal(await sb.putBlob("acme", "hello"),
               "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824");

  const absent = "sha256:" + "0".repeat(64);
  await assert.rejects(sb.getBlob("acme", absent), (e) => {
    assert.ok(e instanceof SandboxError);
    assert.equal(e.code, "blob_not_found");
    return true;
  });
  await assert.rejects(sb.getBlob("other", id), { name: "SandboxError", code: "blob_not_found" });
  await assert.rejects(sb.getBlob("acme", "sha256:nothex"),
                       { name: "SandboxError", code: "invalid_request" });
});

test("input files in through blobs, output files back as blobs", async () => {
  const input = await sb.putBlob("acme", "hello files\n");
  const source = [
    "import os",
    "data = open(os.path.join(os.environ['SANDBOX_INPUT_DIR'], 'in.txt')).read()",
    "open(os.path.join(os.environ['SANDBOX_OUTPUT_DIR'], 'out.txt'), 'w').write(data.upper())",
    "print(len(data))",
  ].join("\n");
  const r = await sb.run(ticket(), python(source, { files_in: [{ name: "in.txt", blob: input }] }));
  assert.equal(r.code, "ok", r.message + r.stderr.summary);
  assert.equal(r.stdout.summary, "12\n");
  assert.equal(r.files_out.length, 1);
  assert.equal(r.files_out[0].name, "out.txt");
  assert.equal(r.files_out[0].bytes, 12);
  assert.equal((await sb.getBlob("acme", r.files_out[0].blob)).toString(), "HELLO FILES\n");

  // An input blob that is absent: the run's code, not a rejection.
  const missing = await sb.run(ticket(), python("print(1)", {
    files_in: [{ name: "in.txt", blob: "sha256:" + "1".repeat(64) }],
  }));
  assert.equal(missing.code, "blob_not_found");
});

test("a recorded run replays its stored result; another tenant's ticket is refused", async () => {
  const { result, record } = await sb.runWithRecord(ticket(), python("import random\nprint(random.random())"));
  assert.equal(result.code, "ok");
  assert.equal(record.record_id, result.run_id);
  assert.equal(record.tenant, "acme");
  assert.match(record.request_sha256, /^[0-9a-f]{64}$/);
  // The record is plain JSON: a checkpoint written and read back.
  const stored = JSON.parse(JSON.stringify(record));
  const replayed = await sb.replay(ticket(), stored);
  assert.deepEqual(replayed, result); // nothing ran: the same random number, the same run id

  const other = await sb.replay(ticket("other"), stored);
  assert.equal(other.code, "action_denied");
  const broken = await sb.replay(ticket(), { ...stored, record_id: "x" });
  assert.equal(broken.code, "invalid_request");
  assert.match(broken.message, /^replay\.record: /);
});

test("a session of `cat`: write, readLine, read, close stdin, iterate to the end, close", async () => {
  const s = await sb.openSession(toolTicket(), { tool: "cat" });
  assert.equal(typeof s.id, "string");
  assert.equal(await s.write("hello\nwor"), 9);
  assert.equal((await s.readLine({ signal: AbortSignal.timeout(10000) })).toString(), "hello\n");
  assert.equal(await s.write(new Uint8Array([108, 100, 10, 0, 255])), 5);
  assert.equal((await s.readLine()).toString(), "world\n");
  // A line longer than maxBytes: RangeError, and no byte is lost.
  assert.equal(await s.write("0123456789abcdef"), 16);
  await new Promise((r) => setTimeout(r, 200));
  await assert.rejects(s.readLine({ maxBytes: 4, signal: AbortSignal.timeout(10000) }), RangeError);
  await s.closeStdin();
  const rest = [];
  for await (const chunk of s) rest.push(chunk);
  assert.ok(Buffer.concat(rest).equals(Buffer.from([0, 255, ...Buffer.from("0123456789abcdef")])));
  assert.equal(await s.read(), null);
  const res = await s.close();
  assert.equal(res.bytes_to_server, 30);
  assert.equal(res.bytes_from_server, 30);
  assert.ok(["server_exited", "closed"].includes(res.end), res.end);
  assert.equal(res.result.stdout.blob, "");
  // Closed: the daemon no longer knows it.
  await assert.rejects(s.write("x"), { name: "SandboxError", code: "session_not_found" });
});

test("session opens refused with their codes; a read stops waiting at its signal", async () => {
  await assert.rejects(sb.openSession(toolTicket(), { tool: "nope" }),
                       { name: "SandboxError", code: "invalid_request", message: /tool/ });
  await assert.rejects(sb.openSession(ticket(), { tool: "cat" }),
                       { name: "SandboxError", code: "action_denied" });
  const s = await sb.openSession(toolTicket(), { tool: "cat" });
  await assert.rejects(s.read({ signal: AbortSignal.timeout(100) }), { name: "TimeoutError" });
  await s.write("late\n");
  assert.equal((await s.readLine({ signal: AbortSignal.timeout(10000) })).toString(), "late\n");
  assert.equal((await sb.stats()).sessions >= 1, true);
  const res = await s.close();
  assert.equal(res.end, "closed");
  assert.equal(res.bytes_to_server, 5);
});

test("a session whose output is not read: the client stops reading, the daemon too", async (t) => {
  // maxQueuedChunks 2: past two unread chunks this client pauses its socket, so the daemon's
  // answers pile up to its 1 MiB and it leaves cat's output in cat's pipe.
  const small = await SandboxClient.connect(daemon.socket, { maxQueuedChunks: 2 });
  try {
    const s = await small.openSession(toolTicket(), { tool: "cat" });
    const before = (await sb.stats()).session_stdout_bytes; // every session since the start
    const total = 4 << 20;
    const block = Buffer.alloc(65536);
    for (let i = 0; i < block.length; i++) block[i] = i % 251;
    const writes = [];
    for (let sent = 0; sent < total; sent += block.length) writes.push(s.write(block));
    await new Promise((r) => setTimeout(r, 1000));
    const read = (await sb.stats()).session_stdout_bytes - before;
    t.diagnostic(`the daemon read ${read} of ${total} bytes before the client read any`);
    // Far from all of it: what the daemon read is bounded by its 1 MiB of unwritten answers
    // plus the socket buffers between (without the pause this client would take it all).
    assert.ok(read < total - (1 << 20), `the daemon read ${read} of ${total} bytes of output`);
    let got = 0;
    let exact = true;
    while (got < total) {
      const chunk = await s.read({ signal: AbortSignal.timeout(10000) });
      assert.notEqual(chunk, null);
      for (let i = 0; i < chunk.length; i++) exact &&= chunk[i] === (got + i) % 65536 % 251;
      got += chunk.length;
    }
    assert.equal(got, total);
    assert.ok(exact, "the echoed bytes differ from those written");
    assert.deepEqual(await Promise.all(writes), writes.map(() => 65536));
    assert.equal((await s.close()).bytes_from_server, total);
  } finally {
    await small.close();
  }
});

test("concurrent runs: answers come in any order and each reaches its own promise", async () => {
  const order = [];
  const runs = [0, 1, 2, 3, 4, 5].map((i) => {
    const sleep = i === 0 ? 1.5 : 0;
    return sb.run(ticket(), python(`import time\ntime.sleep(${sleep})\nprint(${i} * 11)`))
      .then((r) => { order.push(i); return r; });
  });
  const results = await Promise.all(runs);
  results.forEach((r, i) => {
    assert.equal(r.code, "ok", r.message);
    assert.equal(r.stdout.summary, `${i * 11}\n`);
  });
  assert.equal(order.at(-1), 0, `completion order ${order}: the slow run should finish last`);
  assert.equal(new Set(results.map((r) => r.run_id)).size, results.length);
});

test("a line over the daemon's cap and values JSON cannot carry are refused before sending", async () => {
  const big = "#".repeat(MAX_LINE_BYTES);
  await assert.rejects(sb.run(ticket(), python(big)), (e) => {
    assert.ok(e instanceof RangeError);
    assert.match(e.message, /1114112/);
    return true;
  });
  await assert.rejects(sb.run(ticket(), python("print(1)", { timeout_ms: NaN })), TypeError);
  await assert.rejects(sb.run(ticket(), python("print('\ud800')")), TypeError);
  // A blob put of just over the line cap is refused here too; one over 768 KiB that fits
  // the line is the daemon's too_large.
  await assert.rejects(sb.putBlob("acme", new Uint8Array(900000)), RangeError);
  await assert.rejects(sb.putBlob("acme", new Uint8Array(800000)),
                       { name: "SandboxError", code: "too_large" });
  // Nothing reached the daemon as a broken line, and the connection still serves.
  const r = await sb.run(ticket(), python("print('still here')"));
  assert.equal(r.stdout.summary, "still here\n");
  assert.deepEqual(sb.unmatched, []);
});

test("a call abandoned through its signal rejects; its late answer is dropped", async () => {
  const slow = sb.run(ticket(), python("import time\ntime.sleep(0.5)\nprint(1)"),
                      { signal: AbortSignal.timeout(50) });
  await assert.rejects(slow, { name: "TimeoutError" });
  await new Promise((r) => setTimeout(r, 1000));
  assert.deepEqual(sb.unmatched, []);
  const aborted = new AbortController();
  aborted.abort(new Error("not now"));
  await assert.rejects(sb.stats({ signal: aborted.signal }), /not now/);
  assert.equal((await sb.run(ticket(), python("print(2)"))).stdout.summary, "2\n");
});

test("connecting where nobody listens rejects with SandboxConnectionError", async () => {
  await assert.rejects(SandboxClient.connect(daemon.socket + ".absent"), SandboxConnectionError);
});
