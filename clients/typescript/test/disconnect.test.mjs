// The connection ending under calls in flight: the daemon killed mid-request, and the client
// closed with a run in flight. Every promise rejects with SandboxConnectionError; none hangs.
import assert from "node:assert/strict";
import { test } from "node:test";

import { SandboxClient, SandboxConnectionError } from "../dist/index.js";
import { python, startDaemon, ticket, toolTicket } from "./daemon.mjs";

/** Rejects when `promise` has not settled within `ms`: a hang is a failure, not a stall. */
function within(promise, ms, what) {
  let timer;
  const limit = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: still pending after ${ms} ms`)), ms);
  });
  return Promise.race([promise, limit]).finally(() => clearTimeout(timer));
}

test("the daemon killed mid-request: every pending call and read rejects", async () => {
  const daemon = await startDaemon();
  const sb = await SandboxClient.connect(daemon.socket);
  try {
    const session = await sb.openSession(toolTicket(), { tool: "cat" });
    const reading = session.read();
    const runs = [1, 2, 3].map(() => sb.run(ticket(), python("import time\ntime.sleep(20)")));
    const stats = await sb.stats();
    assert.equal(stats.sessions, 1);
    await new Promise((r) => setTimeout(r, 300)); // the runs are running
    // Each outcome is taken as it comes (an error, or a value where none should be).
    const outcomes = [...runs, reading].map((p) =>
      within(p, 5000, "a call in flight").then((v) => ({ value: v }), (e) => e));
    await daemon.kill();
    for (const e of await Promise.all(outcomes)) {
      assert.ok(e instanceof SandboxConnectionError, `not a connection error: ${e}`);
      assert.match(e.message, /closed the connection|failed/);
    }
    assert.equal(sb.closed, true);
    // Later calls reject at once, the same way.
    await assert.rejects(within(sb.stats(), 1000, "a later call"), SandboxConnectionError);
    await assert.rejects(within(session.write("x"), 1000, "a later write"), SandboxConnectionError);
  } finally {
    await sb.close();
    await daemon.stop();
  }
});

test("close() with a run in flight rejects it; the daemon stays up for others", async () => {
  const daemon = await startDaemon();
  try {
    const sb = await SandboxClient.connect(daemon.socket);
    const run = sb.run(ticket(), python("import time\ntime.sleep(20)"));
    await new Promise((r) => setTimeout(r, 200));
    await within(sb.close(), 5000, "close");
    await assert.rejects(within(run, 1000, "the run"), {
      name: "SandboxConnectionError", message: /client was closed/,
    });
    await sb.close(); // again: nothing more
    const other = await SandboxClient.connect(daemon.socket);
    assert.equal((await other.run(ticket(), python("print(3)"))).stdout.summary, "3\n");
    await other.close();
  } finally {
    await daemon.stop();
  }
});
