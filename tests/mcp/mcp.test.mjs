// `sandboxctl mcp` driven by the official MCP TypeScript SDK client (@modelcontextprotocol/sdk,
// pinned in package.json / package-lock.json, installed by tools/setup.sh) over its
// StdioClientTransport, or its StreamableHTTPClientTransport against `--http 127.0.0.1:0`:
// the same cases either way (list tools, run code, a chart image, a refusal, a timeout, a
// malformed call, cancellation, a client that disconnects mid-run after which the run's
// processes are gone), plus what only one transport has (EOF and framing on stdio; DELETE,
// SIGTERM, HTTP refusals and the unix socket over HTTP). Run by CTest ("mcp: sandboxctl mcp
// with the SDK client (stdio)" and "(Streamable HTTP)") as
//   node tests/mcp/mcp.test.mjs SANDBOXCTL [stdio|http]
// Exits 77 (skipped) when the SDK is not installed or the host has no python3 image, unless
// CI=true or SANDBOX_MUST_WORK=1.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { request as httpRequest } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

const sandboxctl = process.argv[2] ?? process.env.SANDBOXCTL;
const overHttp = (process.argv[3] ?? "stdio") === "http";
const mustWork = process.env.CI === "true" || process.env.SANDBOX_MUST_WORK === "1";

function skip(why) {
  console.error(`mcp test: ${why}`);
  process.exit(mustWork ? 1 : 77);
}

// One case's missing prerequisite: a failure in CI (CI=true or SANDBOX_MUST_WORK=1), else the
// case is skipped.
function missing(t, why) {
  if (mustWork) assert.fail(why);
  return t.skip(why);
}

if (!sandboxctl || !existsSync(sandboxctl)) skip("no sandboxctl (argv[1] or SANDBOXCTL)");
let Client, StdioClientTransport, StreamableHTTPClientTransport, McpError;
try {
  ({ Client } = await import("@modelcontextprotocol/sdk/client/index.js"));
  ({ StdioClientTransport } = await import("@modelcontextprotocol/sdk/client/stdio.js"));
  ({ StreamableHTTPClientTransport } = await import("@modelcontextprotocol/sdk/client/streamableHttp.js"));
  ({ McpError } = await import("@modelcontextprotocol/sdk/types.js"));
} catch (e) {
  skip(`the MCP SDK is not installed (tools/setup.sh installs it): ${e.message}`);
}
const imageArgs = process.env.SANDBOX_IMAGE_DIR ? ["--image-dir", process.env.SANDBOX_IMAGE_DIR] : [];
const hasImage = (name) => spawnSync(sandboxctl, ["image", "current", name, ...imageArgs]).status === 0;
if (!hasImage("python3")) {
  skip("no python3 image (tools/setup.sh builds it)");
}

const scratch = mkdtempSync(join(tmpdir(), "sandbox-mcp-test-"));
const ticketPath = join(scratch, "ticket.json");
writeFileSync(
  ticketPath,
  JSON.stringify({
    v: 1,
    id: "mcp-test",
    tenant: "acme",
    actions: ["code.execute"],
    isolation: "process",
    max_timeout_ms: 8000,
    max_memory_bytes: 536870912,
  }),
);
// The server's arguments, bound to `ticket`.
const argsFor = (ticket) => [
  "mcp",
  "--ticket",
  ticket,
  "--state-dir",
  join(scratch, "state"),
  "--blob-dir",
  join(scratch, "blobs"),
  // As the other CLI tests: tools/run-unprivileged.sh names the image store and the
  // delegated cgroup subtree runs go under.
  ...(process.env.SANDBOX_IMAGE_DIR ? ["--image-dir", process.env.SANDBOX_IMAGE_DIR] : []),
  ...(process.env.SANDBOX_CGROUP_PARENT ? ["--cgroup-parent", process.env.SANDBOX_CGROUP_PARENT] : []),
];
const serverArgs = argsFor(ticketPath);

// A fresh `sandboxctl mcp` serving Streamable HTTP (`--http 127.0.0.1:0`, or `--http-socket
// PATH`), once it printed its address: the child, the address and a promise of its exit code.
async function startHttpServer(args, listen = ["--http", "127.0.0.1:0"]) {
  const child = spawn(sandboxctl, [...args, ...listen], { stdio: ["ignore", "ignore", "pipe"] });
  const exited = new Promise((resolve) => child.on("exit", (code) => resolve(code)));
  let err = "";
  const address = await new Promise((resolve, reject) => {
    child.stderr.on("data", (d) => {
      err += d;
      const m = /listening on (\S+)/.exec(err);
      if (m) resolve(m[1]);
    });
    child.on("exit", (code) => reject(new Error(`sandboxctl mcp exited ${code}: ${err}`)));
  });
  child.stderr.resume();
  return { child, address, exited };
}

// A connected SDK client on a fresh `sandboxctl mcp` over the transport under test. `close()`
// closes the client and (HTTP) stops the server with SIGTERM, which must exit 0.
async function connect(extraArgs = [], ticket = ticketPath) {
  const client = new Client({ name: "agent-sandbox-test", version: "1.0.0" });
  if (!overHttp) {
    const transport = new StdioClientTransport({
      command: sandboxctl,
      args: [...argsFor(ticket), ...extraArgs],
      stderr: "pipe",
    });
    await client.connect(transport);
    return { client, transport, pid: () => transport.pid, close: () => client.close() };
  }
  const server = await startHttpServer([...argsFor(ticket), ...extraArgs]);
  const transport = new StreamableHTTPClientTransport(new URL(server.address));
  await client.connect(transport);
  return {
    client,
    transport,
    server,
    pid: () => server.child.pid,
    close: async () => {
      await client.close();
      server.child.kill("SIGTERM");
      assert.equal(await server.exited, 0);
    },
  };
}

// Pids of the processes whose argv holds `marker`.
function processesWith(marker) {
  const found = [];
  for (const pid of readdirSync("/proc").filter((d) => /^\d+$/.test(d))) {
    try {
      if (readFileSync(`/proc/${pid}/cmdline`, "latin1").includes(marker)) found.push(pid);
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

// Whether `pid` is still a live process (a zombie counts as gone).
function alive(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "latin1");
    return !/^\d+ \(.*\) Z/.test(stat);
  } catch {
    return false;
  }
}

async function waitFor(what, predicate, ms = 15000) {
  const end = Date.now() + ms;
  while (!predicate()) {
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

// Code that replaces itself with a sleeping python3 whose argv carries `marker`.
const sleeper = (marker) =>
  `import os, sys\nos.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", "${marker}"])\n`;

// A 2x2 red PNG written with zlib only, into the run's output directory.
const pngSource = `
import os, struct, zlib
def chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xffffffff)
raw = b"".join(b"\\x00" + b"\\xff\\x00\\x00" * 2 for _ in range(2))
png = (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0))
       + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
out = os.environ["SANDBOX_OUTPUT_DIR"]
open(os.path.join(out, "chart.png"), "wb").write(png)
open(os.path.join(out, "data.csv"), "w").write("a,b\\n1,2\\n")
print("wrote chart")
`;

let shared;
before(async () => {
  shared = await connect();
});
after(async () => {
  await shared?.close();
  await cells?.close();
  rmSync(scratch, { recursive: true, force: true });
});

test("tools/list: run_code with the host's limits, put_file, get_file", async () => {
  const { tools } = await shared.client.listTools();
  const names = tools.map((t) => t.name);
  assert.ok(names.includes("run_code"));
  assert.ok(names.includes("put_file"));
  assert.ok(names.includes("get_file"));
  const run = tools.find((t) => t.name === "run_code");
  assert.equal(run.inputSchema.properties.source.maxLength, 32768);
  assert.equal(run.inputSchema.properties.timeout_ms.maximum, 8000);
  assert.ok(run.inputSchema.properties.runtime.enum.includes("python3"));
});

test("run_code: print(6*7) is ok and prints 42", async () => {
  const r = await shared.client.callTool({
    name: "run_code",
    arguments: { runtime: "python3", source: "print(6*7)" },
  });
  assert.equal(r.isError, false);
  assert.match(r.content[0].text, /^ok\n/);
  assert.match(r.content[0].text, /\n42\n/);
});

test("run_code: a PNG output comes back as image content, a CSV as a link", async () => {
  const r = await shared.client.callTool({
    name: "run_code",
    arguments: { runtime: "python3", source: pngSource },
  });
  assert.equal(r.isError, false, r.content[0].text);
  const image = r.content.find((c) => c.type === "image");
  assert.ok(image, JSON.stringify(r.content));
  assert.equal(image.mimeType, "image/png");
  assert.deepEqual([...Buffer.from(image.data, "base64").subarray(0, 8)], [137, 80, 78, 71, 13, 10, 26, 10]);
  const link = r.content.find((c) => c.type === "resource_link");
  assert.equal(link.name, "data.csv");
  const got = await shared.client.callTool({ name: "get_file", arguments: { blob_id: link.uri } });
  assert.equal(got.content[0].text, "a,b\n1,2\n");
});

test("run_code: a matplotlib chart (python3-data) comes back as a PNG image", async (t) => {
  if (!hasImage("python3-data")) return missing(t, "no python3-data image (tools/setup.sh builds it)");
  const config = join(scratch, "data.json");
  writeFileSync(
    config,
    JSON.stringify({
      v: 1,
      runtimes: [
        { name: "python3-data", image: "python3-data", argv: ["/usr/bin/python3", "-I", "{source}"], source_name: "main.py" },
      ],
    }),
  );
  const conn = await connect(["--config", config]);
  const { client } = conn;
  try {
    const { tools } = await client.listTools();
    const run = tools.find((x) => x.name === "run_code");
    assert.ok(run.inputSchema.properties.runtime.enum.includes("python3-data"));
    const r = await client.callTool({
      name: "run_code",
      arguments: {
        runtime: "python3-data",
        timeout_ms: 8000,
        source: [
          "import os, matplotlib",
          'matplotlib.use("Agg")',
          "import matplotlib.pyplot as plt",
          "plt.bar(['a', 'b'], [3, 5])",
          'plt.savefig(os.path.join(os.environ["SANDBOX_OUTPUT_DIR"], "chart.png"))',
        ].join("\n"),
      },
    });
    assert.equal(r.isError, false, r.content[0].text);
    const image = r.content.find((c) => c.type === "image");
    assert.equal(image?.mimeType, "image/png");
    assert.ok(Buffer.from(image.data, "base64").length > 1000);
  } finally {
    await conn.close();
  }
});

test("put_file then run_code reads it as an input file", async () => {
  const put = await shared.client.callTool({ name: "put_file", arguments: { text: "hello" } });
  const id = put.content[0].text;
  const r = await shared.client.callTool({
    name: "run_code",
    arguments: {
      runtime: "python3",
      source: "import os\nprint(open(os.path.join(os.environ['SANDBOX_INPUT_DIR'], 'in.txt')).read())",
      files: { "in.txt": { blob_id: id } },
    },
  });
  assert.equal(r.isError, false, r.content[0].text);
  assert.match(r.content[0].text, /hello/);
});

test("a refusal: the network at the process level only is refused with its code", async () => {
  const r = await shared.client.callTool({
    name: "run_code",
    arguments: { runtime: "python3", source: "print(1)", network: true, egress: ["example.com"] },
  });
  assert.equal(r.isError, true);
  // No container level configured: the network cannot run here at all.
  assert.match(r.content[0].text, /^runtime_unavailable: isolation:/);
});

test("a refusal: the network without a grant is an error naming what to approve", async (t) => {
  // The container level (which the network needs) runs here as root, with crun.
  if (process.getuid() !== 0) return t.skip("not root: no container level");
  if (spawnSync("crun", ["--version"]).status !== 0) {
    return missing(t, "no crun for the container level the network needs (tools/setup.sh installs it)");
  }
  const config = join(scratch, "container.json");
  writeFileSync(config, JSON.stringify({ v: 1, backends: { container: { runtime: "crun" } } }));
  const conn = await connect(["--config", config]);
  const { client } = conn;
  try {
    const r = await client.callTool({
      name: "run_code",
      arguments: { runtime: "python3", source: "print(1)", network: true, egress: ["example.com"] },
    });
    assert.equal(r.isError, true);
    const text = r.content[0].text;
    assert.match(text, /^approval_required: /);
    assert.match(text, /approve network access to \[example\.com\] for ticket 'mcp-test'/);
    // Never an implicit grant: nothing ran.
    assert.equal(JSON.parse(r.content.at(-1).text).exit_code, null);
  } finally {
    await conn.close();
  }
});

test("run_tool: a registered tool listed by name and run on stdin", async (t) => {
  if (!hasImage("tools")) return missing(t, "no tools image (tools/setup.sh builds it)");
  const config = join(scratch, "tools.json");
  writeFileSync(
    config,
    JSON.stringify({ v: 1, tools: [{ name: "markdown", image: "tools", binary: "/usr/bin/cmark" }] }),
  );
  const toolTicket = join(scratch, "tool-ticket.json");
  writeFileSync(
    toolTicket,
    JSON.stringify({
      v: 1,
      id: "mcp-tool",
      tenant: "acme",
      actions: ["tool.run"],
      tools: ["markdown"],
      isolation: "process",
      max_timeout_ms: 8000,
      max_memory_bytes: 536870912,
    }),
  );
  const conn = await connect(["--config", config], toolTicket);
  const { client } = conn;
  try {
    const { tools } = await client.listTools();
    // No code.execute on this ticket: no run_code; run_tool names the granted tool.
    assert.deepEqual(tools.map((x) => x.name).sort(), ["get_file", "put_file", "run_tool"]);
    const runTool = tools.find((x) => x.name === "run_tool");
    assert.deepEqual(runTool.inputSchema.properties.tool.enum, ["markdown"]);
    const r = await client.callTool({ name: "run_tool", arguments: { tool: "markdown", stdin: "# Hi\n" } });
    assert.equal(r.isError, false, r.content[0].text);
    assert.match(r.content[0].text, /<h1>Hi<\/h1>/);
  } finally {
    await conn.close();
  }
});

test("a timeout: isError with the stable code first", async () => {
  const r = await shared.client.callTool({
    name: "run_code",
    arguments: { runtime: "python3", source: "while True: pass", timeout_ms: 300 },
  });
  assert.equal(r.isError, true);
  assert.match(r.content[0].text, /^timeout/);
});

test("malformed calls: JSON-RPC invalid params", async () => {
  for (const [name, args] of [
    ["run_code", { runtime: "python3" }],
    ["run_code", { runtime: "python3", source: "1", timeout_ms: -5 }],
    ["run_code", { runtime: "python3", source: "1", ticket: "mine" }],
    ["run_code", { runtime: "ruby", source: "1" }],
    ["run_code", { runtime: "python3", source: "1", files: { "a.txt": "not an object" } }],
    ["no_such_tool", {}],
  ]) {
    await assert.rejects(shared.client.callTool({ name, arguments: args }), (e) => {
      assert.ok(e instanceof McpError, String(e));
      assert.equal(e.code, -32602);
      return true;
    });
  }
});

test("a call in flight does not block ping; cancelling it kills the run", async () => {
  const marker = `mcp-cancel-${process.pid}-${Date.now()}`;
  const abort = new AbortController();
  const call = shared.client.callTool(
    { name: "run_code", arguments: { runtime: "python3", source: sleeper(marker), timeout_ms: 8000 } },
    undefined,
    { signal: abort.signal },
  );
  await waitFor("the run to start", () => processesWith(marker).length > 0);
  await shared.client.ping();
  abort.abort("test cancels");
  await assert.rejects(call);
  await waitFor("the cancelled run to be gone", () => processesWith(marker).length === 0);
});

// Cases of one transport only.
const stdioOnly = overHttp ? () => {} : test;
const httpOnly = overHttp ? test : () => {};

// A call of `sleeper(marker)` on `client`, aborted by the returned AbortController (after a
// disconnect, so that the SDK clears its request timer without telling the server anything).
function sleepingCall(client, marker) {
  const abort = new AbortController();
  const call = client
    .callTool(
      { name: "run_code", arguments: { runtime: "python3", source: sleeper(marker), timeout_ms: 8000 } },
      undefined,
      { signal: abort.signal },
    )
    .catch((e) => e);
  return { abort, call };
}

stdioOnly("a client that disconnects mid-run: the run is killed and gone", async () => {
  const conn = await connect();
  const marker = `mcp-disconnect-${process.pid}-${Date.now()}`;
  const { abort, call } = sleepingCall(conn.client, marker);
  await waitFor("the run to start", () => processesWith(marker).length > 0);
  const pid = conn.pid();
  await conn.client.close();
  abort.abort("disconnected");
  await call;
  await waitFor("sandboxctl mcp to exit", () => !alive(pid));
  assert.deepEqual(processesWith(marker), []);
});

httpOnly("a client that disconnects mid-run: the run is killed and gone, the server goes on", async () => {
  const conn = await connect();
  const marker = `mcp-disconnect-${process.pid}-${Date.now()}`;
  const { abort, call } = sleepingCall(conn.client, marker);
  await waitFor("the run to start", () => processesWith(marker).length > 0);
  // Closing the SDK transport aborts its fetch: the connection closes under the call.
  await conn.transport.close();
  abort.abort("disconnected");
  await call;
  // Well before the run's own 8 s timeout: only the disconnect can have ended it.
  await waitFor("the run to be gone", () => processesWith(marker).length === 0, 4000);
  assert.ok(alive(conn.pid()), "the server keeps serving other clients");
  const other = new Client({ name: "second", version: "1" });
  await other.connect(new StreamableHTTPClientTransport(new URL(conn.server.address)));
  const r = await other.callTool({ name: "run_code", arguments: { runtime: "python3", source: "print(1)" } });
  assert.equal(r.isError, false);
  await other.close();
  conn.server.child.kill("SIGTERM");
  assert.equal(await conn.server.exited, 0);
});

httpOnly("DELETE of the session mid-run: the run is killed and gone, the session is over", async () => {
  const conn = await connect();
  const marker = `mcp-delete-${process.pid}-${Date.now()}`;
  const { abort, call } = sleepingCall(conn.client, marker);
  await waitFor("the run to start", () => processesWith(marker).length > 0);
  const sessionId = conn.transport.sessionId;
  await conn.transport.terminateSession();  // answered once the run is confirmed gone
  assert.deepEqual(processesWith(marker), []);
  abort.abort("session ended");
  await call;
  const res = await fetch(conn.server.address, {
    method: "POST",
    headers: { "content-type": "application/json", accept: "application/json, text/event-stream", "mcp-session-id": sessionId },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "ping" }),
  });
  assert.equal(res.status, 404);
  await conn.close();
});

httpOnly("SIGTERM mid-run: the run is killed and gone, then the server exits 0", async () => {
  const conn = await connect();
  const marker = `mcp-term-${process.pid}-${Date.now()}`;
  const { abort, call } = sleepingCall(conn.client, marker);
  await waitFor("the run to start", () => processesWith(marker).length > 0);
  conn.server.child.kill("SIGTERM");
  assert.equal(await conn.server.exited, 0);
  assert.deepEqual(processesWith(marker), []);
  abort.abort("server gone");
  await call;
  await conn.client.close();
});

httpOnly("HTTP refusals: each gets its status and a JSON-RPC error", async () => {
  const url = shared.server.address;
  const headers = { "content-type": "application/json", accept: "application/json, text/event-stream" };
  const init = { jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "1" } } };
  const first = await fetch(url, { method: "POST", headers, body: JSON.stringify(init) });
  assert.equal(first.status, 200);
  const sid = first.headers.get("mcp-session-id");
  assert.match(sid, /^[0-9a-f]{64}$/);
  const ping = JSON.stringify({ jsonrpc: "2.0", id: 2, method: "ping" });
  for (const [what, init2, status, code] of [
    ["GET", { method: "GET", headers: { accept: "text/event-stream", "mcp-session-id": sid } }, 405, -32000],
    ["a foreign Origin", { method: "POST", headers: { ...headers, "mcp-session-id": sid, origin: "http://evil.example" }, body: ping }, 403, -32000],
    ["no Accept for SSE", { method: "POST", headers: { ...headers, accept: "application/json", "mcp-session-id": sid }, body: ping }, 406, -32600],
    ["an unknown protocol version", { method: "POST", headers: { ...headers, "mcp-session-id": sid, "mcp-protocol-version": "1999-01-01" }, body: ping }, 400, -32600],
    ["no session id", { method: "POST", headers, body: ping }, 400, -32600],
    ["an unknown session id", { method: "POST", headers: { ...headers, "mcp-session-id": "f".repeat(64) }, body: ping }, 404, -32000],
    ["a batch", { method: "POST", headers: { ...headers, "mcp-session-id": sid }, body: `[${ping}]` }, 400, -32600],
    ["not JSON", { method: "POST", headers: { ...headers, "mcp-session-id": sid }, body: "nope" }, 400, -32700],
    ["an oversized body", { method: "POST", headers: { ...headers, "mcp-session-id": sid }, body: "x".repeat(9 * 1024 * 1024) }, 413, -32700],
  ]) {
    const res = await fetch(url, init2);
    assert.equal(res.status, status, what);
    assert.equal((await res.json()).error.code, code, what);
  }
  const ok = await fetch(url, { method: "POST", headers: { ...headers, "mcp-session-id": sid, origin: "http://localhost:6274" }, body: ping });
  assert.equal(ok.status, 200);
  assert.equal((await fetch(url, { method: "DELETE", headers: { "mcp-session-id": sid } })).status, 204);
});

httpOnly("--http refuses a non-loopback address with a usage error", () => {
  const r = spawnSync(sandboxctl, [...serverArgs, "--http", "0.0.0.0:0"], { encoding: "utf8" });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /not a loopback address/);
});

httpOnly("--http-socket: raw HTTP over the unix socket, mode 0660", async () => {
  const path = join(scratch, "mcp.sock");
  const server = await startHttpServer(serverArgs, ["--http-socket", path]);
  assert.equal(server.address, `unix:${path}`);
  assert.equal(statSync(path).mode & 0o777, 0o660);
  const request = (method, body, headers = {}) =>
    new Promise((resolve, reject) => {
      const req = httpRequest(
        { socketPath: path, path: "/mcp", method, headers: { "content-type": "application/json", accept: "application/json, text/event-stream", ...headers } },
        (res) => {
          let data = "";
          res.on("data", (d) => (data += d));
          res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body: data }));
        },
      );
      req.on("error", reject);
      req.end(body);
    });
  const init = await request("POST", JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "1" } } }));
  assert.equal(init.status, 200);
  const sid = init.headers["mcp-session-id"];
  assert.equal((await request("POST", JSON.stringify({ jsonrpc: "2.0", method: "notifications/initialized" }), { "mcp-session-id": sid })).status, 202);
  const call = await request(
    "POST",
    JSON.stringify({ jsonrpc: "2.0", id: 2, method: "tools/call", params: { name: "run_code", arguments: { runtime: "python3", source: "print(6*7)" } } }),
    { "mcp-session-id": sid },
  );
  assert.equal(call.status, 200);
  assert.match(JSON.parse(call.body).result.content[0].text, /\n42\n/);
  assert.equal((await request("POST", "{}", {})).status, 400);
  assert.equal((await request("DELETE", undefined, { "mcp-session-id": sid })).status, 204);
  server.child.kill("SIGTERM");
  assert.equal(await server.exited, 0);
  assert.equal(existsSync(path), false, "the socket is removed at exit");
});

stdioOnly("EOF on stdin: every run in flight is killed before sandboxctl mcp exits", async () => {
  const marker = `mcp-eof-${process.pid}-${Date.now()}`;
  const child = spawn(sandboxctl, serverArgs, { stdio: ["pipe", "pipe", "inherit"] });
  const exited = new Promise((resolve) => child.on("exit", (code) => resolve(code)));
  const send = (m) => child.stdin.write(JSON.stringify({ jsonrpc: "2.0", ...m }) + "\n");
  send({ id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "1" } } });
  send({ method: "notifications/initialized" });
  send({ id: 2, method: "tools/call", params: { name: "run_code", arguments: { runtime: "python3", source: sleeper(marker), timeout_ms: 8000 } } });
  await waitFor("the run to start", () => processesWith(marker).length > 0);
  child.stdin.end();
  assert.equal(await exited, 0);
  assert.deepEqual(processesWith(marker), []);
});

stdioOnly("EOF right after the requests: every request read before it is answered", async () => {
  // A piped client (printf '...' | sandboxctl mcp) writes its lines and closes stdin at once:
  // the answers already queued are written before the server exits (they were lost).
  const child = spawn(sandboxctl, serverArgs, { stdio: ["pipe", "pipe", "inherit"] });
  const exited = new Promise((resolve) => child.on("exit", (code) => resolve(code)));
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  const lines = [
    { id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "1" } } },
    { method: "notifications/initialized" },
    { id: 2, method: "ping" },
    { id: 3, method: "tools/list" },
    { id: 4, method: "tools/call", params: { name: "put_file", arguments: { text: "kept" } } },
  ];
  child.stdin.end(lines.map((m) => JSON.stringify({ jsonrpc: "2.0", ...m }) + "\n").join(""));
  assert.equal(await exited, 0);
  await new Promise((resolve) => (child.stdout.readableEnded ? resolve() : child.stdout.on("end", resolve)));
  const replies = out.split("\n").filter((l) => l).map((l) => JSON.parse(l));
  assert.deepEqual(replies.map((r) => r.id).sort(), [1, 2, 3, 4]);
  for (const r of replies) assert.equal(r.error, undefined, JSON.stringify(r));
});

stdioOnly("hostile framing: each bad line gets its JSON-RPC error and the server goes on", async () => {
  const child = spawn(sandboxctl, serverArgs, { stdio: ["pipe", "pipe", "inherit"] });
  const exited = new Promise((resolve) => child.on("exit", (code) => resolve(code)));
  let buffered = "";
  const replies = [];
  child.stdout.on("data", (d) => {
    buffered += d;
    let nl;
    while ((nl = buffered.indexOf("\n")) >= 0) {
      replies.push(JSON.parse(buffered.slice(0, nl)));
      buffered = buffered.slice(nl + 1);
    }
  });
  const write = (line) => child.stdin.write(line + "\n");
  write(JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/list" }));  // before initialize
  write(JSON.stringify({ jsonrpc: "2.0", id: 2, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "1" } } }));
  write("not json");
  write("[" + JSON.stringify({ jsonrpc: "2.0", id: 3, method: "ping" }) + "]");
  write("x".repeat(9 * 1024 * 1024));  // over the 8 MiB line cap
  write(JSON.stringify({ jsonrpc: "2.0", id: 4, method: "no/such/method" }));
  write(JSON.stringify({ jsonrpc: "2.0", id: 5, method: "tools/call", params: { name: "run_code", arguments: "x" } }));
  write(JSON.stringify({ jsonrpc: "2.0", id: 6, method: "ping" }));
  await waitFor("every reply", () => replies.length >= 8);
  child.stdin.end();
  assert.equal(await exited, 0);
  const codes = replies.map((r) => [r.id, r.error?.code ?? "ok"]);
  assert.deepEqual(codes, [
    [1, -32600],
    [2, "ok"],
    [null, -32700],
    [null, -32600],
    [null, -32700],
    [4, -32601],
    [5, -32602],
    [6, "ok"],
  ]);
});

// run_cell: an interpreter session bound to the MCP session. One server for these cases, in
// order (state carries from one to the next), under a ticket whose ceiling lets the
// interpreter live through them (its lifetime is bounded by the ticket's max_timeout_ms).
const cellTicket = join(scratch, "cell-ticket.json");
writeFileSync(
  cellTicket,
  JSON.stringify({
    v: 1,
    id: "mcp-cell",
    tenant: "acme",
    actions: ["code.execute"],
    isolation: "process",
    max_timeout_ms: 120000,
    max_memory_bytes: 536870912,
  }),
);
const cellConfig = join(scratch, "cell-config.json");
writeFileSync(
  cellConfig,
  JSON.stringify({
    v: 1,
    runtimes: [
      { name: "python3-data", image: "python3-data", argv: ["/usr/bin/python3", "-I", "{source}"], source_name: "main.py" },
    ],
  }),
);
let cells;
const cellConn = async () => (cells ??= await connect(["--config", cellConfig], cellTicket));
const cell = async (args) => (await cellConn()).client.callTool({ name: "run_cell", arguments: args });
const textOf = (r) => r.content[0].text;
// A call of `code` while no other cell runs: a `capacity` answer (the cell of a cancelled
// call may still be yielding) is retried.
async function cellWhenFree(args) {
  for (let i = 0; ; ++i) {
    const r = await cell(args);
    if (!/^capacity/.test(textOf(r)) || i >= 50) return r;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

test("run_cell: listed with the Python runtimes and the limits; state kept across calls", async () => {
  const { tools } = await (await cellConn()).client.listTools();
  const run = tools.find((t) => t.name === "run_cell");
  assert.ok(run, JSON.stringify(tools.map((t) => t.name)));
  assert.equal(run.inputSchema.properties.code.maxLength, 32768);
  // The policy's ceiling (8 s) is below this ticket's.
  assert.equal(run.inputSchema.properties.timeout_ms.maximum, 8000);
  assert.ok(run.inputSchema.properties.runtime.enum.includes("python3"));
  assert.ok(!run.inputSchema.properties.runtime.enum.includes("node"));
  const first = await cell({ code: "x = 41\nprint('set')" });
  assert.equal(first.isError, false, textOf(first));
  assert.match(textOf(first), /^ok\nstate: kept\nsession: fresh \(python3\)\n/);
  assert.match(textOf(first), /--- stdout \(4 bytes\) ---\nset\n/);
  const second = await cell({ code: "x + 1" });
  assert.equal(second.isError, false, textOf(second));
  assert.match(textOf(second), /session: python3, cell 2\n/);
  assert.match(textOf(second), /--- value ---\n42\n/);
  assert.equal(JSON.parse(second.content.at(-1).text).value, "42");
});

test("run_cell: a cell while another runs is refused with capacity", async () => {
  const slow = cell({ code: "import time\ntime.sleep(1.5)\n'slow done'", timeout_ms: 8000 });
  await new Promise((resolve) => setTimeout(resolve, 300));
  const refused = await cell({ code: "1" });
  assert.equal(refused.isError, true);
  assert.match(textOf(refused), /^capacity: /);
  const r = await slow;
  assert.equal(r.isError, false, textOf(r));
  assert.match(textOf(r), /'slow done'/);
});

test("run_cell: a timeout interrupts the cell and keeps the state", async () => {
  const r = await cell({ code: "import time\ntime.sleep(30)", timeout_ms: 500 });
  assert.equal(r.isError, true);
  assert.match(textOf(r), /^timeout: /);
  assert.match(textOf(r), /\nstate: kept\n/);
  assert.match(textOf(r), /KeyboardInterrupt/);
  const after = await cell({ code: "x" });
  assert.match(textOf(after), /--- value ---\n41\n/);
});

test("run_cell: cancelling a running cell interrupts it; the next result says so", async () => {
  const abort = new AbortController();
  const call = (await cellConn()).client
    .callTool({ name: "run_cell", arguments: { code: "import time\ntime.sleep(30)", timeout_ms: 8000 } }, undefined, {
      signal: abort.signal,
    });
  await new Promise((resolve) => setTimeout(resolve, 700));
  abort.abort("test cancels");
  await assert.rejects(call);
  const next = await cellWhenFree({ code: "x" });
  assert.equal(next.isError, false, textOf(next));
  assert.match(textOf(next), /previous call: it was cancelled: internal: the cell was cancelled and interrupted.*\(state kept\)\n/);
  assert.match(textOf(next), /--- value ---\n41\n/);
});

test("run_cell: exit() loses the state; the next call runs in a fresh session and says so", async () => {
  const r = await cell({ code: "exit(3)" });
  assert.match(textOf(r), /\nstate: lost \(the interpreter session is over/);
  assert.match(textOf(r), /\nexit code: 3\n/);
  const next = await cell({ code: "'x' in globals()" });
  assert.equal(next.isError, false, textOf(next));
  assert.match(textOf(next), /session: fresh \(python3\): the previous session ended when a cell lost its state/);
  assert.match(textOf(next), /--- value ---\nFalse\n/);
});

test("run_cell: a matplotlib chart (python3-data) arrives as image content", async (t) => {
  if (!hasImage("python3-data")) return missing(t, "no python3-data image (tools/setup.sh builds it)");
  const code = ["import matplotlib.pyplot as plt", "plt.bar(['a', 'b'], [3, 5])", "'charted'"].join("\n");
  // Another runtime than the session's: refused unless the client starts over on purpose.
  const refused = await cell({ code, runtime: "python3-data" });
  assert.equal(refused.isError, true);
  assert.match(textOf(refused), /^invalid_request: runtime: .*reset: true/);
  const r = await cell({ code, runtime: "python3-data", reset: true, timeout_ms: 8000 });
  assert.equal(r.isError, false, textOf(r));
  assert.match(textOf(r), /session: fresh \(python3-data\): the previous session was closed at the client's request/);
  const image = r.content.find((c) => c.type === "image");
  assert.equal(image?.mimeType, "image/png", JSON.stringify(r.content.map((c) => c.type)));
  assert.deepEqual([...Buffer.from(image.data, "base64").subarray(0, 4)], [137, 80, 78, 71]);
  assert.ok(Buffer.from(image.data, "base64").length > 1000);
});

test("run_cell: bad arguments are JSON-RPC invalid params", async () => {
  const { client } = await cellConn();
  for (const args of [{}, { code: 1 }, { code: "1", timeout_ms: 0 }, { code: "1", runtime: "node" }, { code: "1", reset: "yes" }, { code: "1", memory_bytes: 5 }]) {
    await assert.rejects(client.callTool({ name: "run_cell", arguments: args }), (e) => {
      assert.ok(e instanceof McpError, String(e));
      assert.equal(e.code, -32602);
      return true;
    });
  }
  await cells.close();
  cells = undefined;
});

// A connection whose interpreter session started a child marked `marker`, inside its sandbox.
async function cellWithChild(marker) {
  const conn = await connect([], cellTicket);
  const r = await conn.client.callTool({
    name: "run_cell",
    arguments: { code: `import subprocess, sys\np = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "${marker}"])\n'started'` },
  });
  assert.equal(r.isError, false, textOf(r));
  await waitFor("the child to start", () => processesWith(marker).length > 0);
  return conn;
}

stdioOnly("run_cell: EOF ends the interpreter session; nothing of it is left", async () => {
  const marker = `mcp-cell-eof-${process.pid}-${Date.now()}`;
  const conn = await cellWithChild(marker);
  const pid = conn.pid();
  await conn.client.close();
  await waitFor("sandboxctl mcp to exit", () => !alive(pid));
  assert.deepEqual(processesWith(marker), []);
});

httpOnly("run_cell: DELETE ends the interpreter session; nothing of it is left", async () => {
  const marker = `mcp-cell-delete-${process.pid}-${Date.now()}`;
  const conn = await cellWithChild(marker);
  await conn.transport.terminateSession();  // answered once the sandbox is confirmed gone
  assert.deepEqual(processesWith(marker), []);
  await conn.close();
});
