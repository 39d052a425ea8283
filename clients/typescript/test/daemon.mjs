// The tests' daemon: a real `sandboxctl serve` ($SANDBOXCTL) on a socket in a private temporary
// directory, with its own state and blob dirs, and --image-dir / --cgroup-parent from
// $SANDBOX_IMAGE_DIR / $SANDBOX_CGROUP_PARENT when set (as tests/service/service_harness.cpp).
// Its registry (--config) has `cat` (echoes stdin) for the session tests.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync, openSync, closeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

export const SANDBOXCTL = process.env.SANDBOXCTL ?? "/work/main/build/dev/bin/sandboxctl";

/** The ticket of the tests' code runs (tenant "acme", code.execute only). */
export function ticket(tenant = "acme") {
  return {
    v: 1,
    id: "ts-test",
    tenant,
    actions: ["code.execute"],
    isolation: "process",
    max_timeout_ms: 8000,
    max_memory_bytes: 536870912,
  };
}

/** A ticket for sessions of the registry's `cat`. */
export function toolTicket(tenant = "acme") {
  return { ...ticket(tenant), actions: ["tool.run"], tools: ["cat"], max_timeout_ms: 60000 };
}

/** A python3 run request. */
export function python(source, extra = {}) {
  return { runtime: "python3", source, timeout_ms: 8000, ...extra };
}

/** Starts a daemon; resolves once its socket accepts (its log in the error if it exits). */
export async function startDaemon() {
  const dir = mkdtempSync(join(tmpdir(), "sbts-"));
  const socket = join(dir, "s.sock");
  const config = join(dir, "config.json");
  writeFileSync(
    config,
    JSON.stringify({ v: 1, tools: [{ name: "cat", image: "python3", binary: "/bin/cat" }] }),
  );
  const args = ["serve", "--socket", socket, "-v", "--state-dir", join(dir, "state"),
                "--blob-dir", join(dir, "blobs"), "--config", config];
  if (process.env.SANDBOX_IMAGE_DIR) args.push("--image-dir", process.env.SANDBOX_IMAGE_DIR);
  if (process.env.SANDBOX_CGROUP_PARENT) {
    args.push("--cgroup-parent", process.env.SANDBOX_CGROUP_PARENT);
  }
  const logPath = join(dir, "daemon.log");
  const logFd = openSync(logPath, "w");
  const child = spawn(SANDBOXCTL, args, { stdio: ["ignore", logFd, logFd] });
  closeSync(logFd);
  let exited = null;
  const exit = new Promise((resolve) => child.on("exit", (code, signal) => {
    exited = { code, signal };
    resolve(exited);
  }));
  const log = () => (existsSync(logPath) ? readFileSync(logPath, "utf8") : "");
  const deadline = Date.now() + 30000;
  while (!existsSync(socket)) {
    if (exited) throw new Error(`the daemon exited (${JSON.stringify(exited)}):\n${log()}`);
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`the daemon did not start in 30 s:\n${log()}`);
    }
    await sleep(20);
  }
  return {
    socket,
    pid: child.pid,
    log,
    /** SIGKILL, as a crash would. */
    async kill() {
      if (!exited) child.kill("SIGKILL");
      await exit;
    },
    /** SIGTERM and wait; then the temporary directory goes. */
    async stop() {
      if (!exited) child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 15000);
      await exit;
      clearTimeout(timer);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
