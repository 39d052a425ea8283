/**
 * A client of `sandboxctl serve` (docs/protocol.md, "Service mode"): one connection to the
 * daemon's unix socket, over which any number of calls may be in flight at once. Each request
 * line carries an `id` of this client's choosing and each answer echoes it; answers come as
 * requests complete, in any order, and are matched to their promises by that id.
 *
 * ```ts
 * const sb = await SandboxClient.connect("/run/agent-sandbox/serve.sock");
 * const ticket = { v: 1, id: "t-1", tenant: "acme", actions: ["code.execute"],
 *                  isolation: "process", max_timeout_ms: 8000, max_memory_bytes: 536870912 };
 * const result = await sb.run(ticket, { runtime: "python3", source: "print(6 * 7)" });
 * console.log(result.code, result.stdout.summary);   // ok 42
 * await sb.close();
 * ```
 *
 * @module
 */

import { Buffer } from "node:buffer";
import { createConnection, type Socket } from "node:net";

import { type ErrorCode, SandboxConnectionError, SandboxError } from "./errors.js";
import type {
  BlobId,
  RecordedRun,
  RunRecord,
  RunRequest,
  RunResult,
  ServiceStats,
  SessionRequest,
  SessionResult,
  TicketDocument,
} from "./types.js";

/**
 * The daemon's longest request line in bytes, without its newline: 1 MiB + 64 KiB
 * (docs/protocol.md, "Limits and backpressure"). Longer lines are refused here, before
 * anything is sent.
 */
export const MAX_LINE_BYTES = (1 << 20) + (64 << 10);

/** The most bytes one `blob_put` takes (768 KiB); beyond, the daemon answers `too_large`. */
export const MAX_BLOB_PUT_BYTES = 786432;

/** Options of {@link SandboxClient.connect}. */
export interface ConnectOptions {
  /** How long to wait for the connection, ms. Default 10000. */
  connectTimeoutMs?: number;
  /** The longest request line sent, bytes without its newline. Default {@link MAX_LINE_BYTES}. */
  maxLineBytes?: number;
  /**
   * Stdout chunks (16 KiB each at most) kept per session for {@link Session.read}. Default
   * 256. When a session holds that many, this client stops reading from the daemon until a
   * read takes one (and the daemon in turn leaves the server's output in its pipe): a
   * server's output never piles up without bound. Answers of other calls wait meanwhile.
   */
  maxQueuedChunks?: number;
}

/** Options of every call. */
export interface CallOptions {
  /**
   * Stops waiting when it aborts: the call rejects with `signal.reason` (for
   * `AbortSignal.timeout(ms)`, a `TimeoutError` DOMException). The request itself goes on
   * (the protocol has no cancel line; {@link SandboxClient.close} cancels every run in
   * flight); its answer is dropped when it comes, and a session it opens is closed at once.
   * A signal aborted before the call sends nothing.
   */
  signal?: AbortSignal;
}

/** Options of {@link Session.readLine}. */
export interface ReadLineOptions extends CallOptions {
  /** The longest line accepted, bytes without its newline. Default 4 MiB (4194304). */
  maxBytes?: number;
}

type Answer = Record<string, unknown>;

interface Pending {
  deliver(answer: Answer): void;
  fail(error: Error): void;
}

const DEFAULT_CONNECT_TIMEOUT_MS = 10000;
const DEFAULT_MAX_QUEUED_CHUNKS = 256;
const DEFAULT_MAX_READ_LINE_BYTES = 4 << 20;
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/**
 * One connection to the daemon. Every method may be called at any time, concurrently; the
 * promises settle as the daemon answers, in any order.
 *
 * A run that ends non-ok (`timeout`, `action_denied`, `blob_not_found`, …) is a result with
 * that `code`, never a rejection. Promises reject with {@link SandboxError} for the daemon's
 * `error` answers, with {@link SandboxConnectionError} when the connection fails or is closed
 * (every call in flight then rejects: none is left waiting), and with `RangeError` or
 * `TypeError` for a request that cannot be sent (nothing is sent).
 *
 * The open socket keeps Node's event loop alive: call {@link SandboxClient.close} when done.
 * Closing the connection cancels every run still in flight (the daemon kills them) and
 * closes every session.
 */
export class SandboxClient {
  /** Answers this client could not match: `"id": null` errors, or ids it did not send. */
  readonly unmatched: Answer[] = [];
  /** Session events of no open session of this client (one closed or abandoned): dropped. */
  droppedEvents = 0;

  private readonly socket: Socket;
  private readonly maxLineBytes: number;
  /** @internal */ readonly maxQueuedChunks: number;
  private readonly pending = new Map<string, Pending>();
  private readonly sessions = new Map<string, Session>();
  private readonly held = new Set<Session>();
  private partial: Buffer[] = [];
  private nextId = 0;
  private failure: SandboxConnectionError | null = null;

  private constructor(socket: Socket, options: ConnectOptions) {
    this.socket = socket;
    this.maxLineBytes = options.maxLineBytes ?? MAX_LINE_BYTES;
    this.maxQueuedChunks = options.maxQueuedChunks ?? DEFAULT_MAX_QUEUED_CHUNKS;
    socket.on("data", (chunk: Buffer) => this.onData(chunk));
    socket.on("error", (e: Error) =>
      this.fail(
        new SandboxConnectionError(`the connection to the sandbox daemon failed: ${e.message}`, {
          cause: e,
        }),
      ),
    );
    socket.on("close", () =>
      this.fail(new SandboxConnectionError("the sandbox daemon closed the connection")),
    );
  }

  /**
   * Connects to the daemon's unix socket at `socketPath`.
   *
   * Rejects with {@link SandboxConnectionError} when nobody listens there (or the path is
   * not a socket we may open) or after `connectTimeoutMs`.
   */
  static connect(socketPath: string, options: ConnectOptions = {}): Promise<SandboxClient> {
    const timeoutMs = options.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS;
    return new Promise((resolve, reject) => {
      const socket = createConnection({ path: socketPath });
      const onError = (e: Error) => {
        clearTimeout(timer);
        reject(
          new SandboxConnectionError(
            `cannot connect to the sandbox daemon at ${socketPath}: ${e.message}`,
            { cause: e },
          ),
        );
      };
      const timer = setTimeout(() => {
        socket.off("error", onError);
        socket.destroy();
        reject(
          new SandboxConnectionError(
            `connecting to the sandbox daemon at ${socketPath} took over ${timeoutMs} ms`,
          ),
        );
      }, timeoutMs);
      socket.once("error", onError);
      socket.once("connect", () => {
        clearTimeout(timer);
        socket.off("error", onError);
        resolve(new SandboxClient(socket, options));
      });
    });
  }

  /**
   * Runs `request` under `ticket` and resolves to its {@link RunResult}, whatever its code:
   * `ok`, or how it failed (`timeout`, `oom`, `action_denied`, `invalid_request` for a
   * ticket or request that does not decode, `blob_not_found`, `queue_timeout`, `capacity`,
   * …). Rejects only with {@link SandboxError} (the line itself refused, e.g.
   * `invalid_request`), {@link SandboxConnectionError}, or `RangeError` for a line over
   * `maxLineBytes`.
   */
  run(ticket: TicketDocument, request: RunRequest, options?: CallOptions): Promise<RunResult> {
    return this.request({ ticket, request }, (a) => object<RunResult>(a, "result"), options);
  }

  /**
   * Runs `request` like {@link SandboxClient.run} and resolves to its result with its run
   * record: store the record (plain JSON) as the checkpoint; after a restart
   * {@link SandboxClient.replay} returns the same result without running anything.
   */
  runWithRecord(
    ticket: TicketDocument,
    request: RunRequest,
    options?: CallOptions,
  ): Promise<RecordedRun> {
    return this.request(
      { ticket, request, record: true },
      (a) => ({ result: object<RunResult>(a, "result"), record: object<RunRecord>(a, "record") }),
      options,
    );
  }

  /**
   * The stored result of `record`, nothing executed. When it cannot be returned the result
   * says why: `blob_not_found` (the message names the collected blob), `action_denied` (a
   * ticket of another tenant), `invalid_request` (a malformed record, message prefixed
   * `replay.record: `).
   */
  replay(ticket: TicketDocument, record: RunRecord, options?: CallOptions): Promise<RunResult> {
    return this.request(
      { replay: { ticket, record } },
      (a) => object<RunResult>(a, "result"),
      options,
    );
  }

  /**
   * Stores `data` (bytes, or a string stored as its UTF-8) in `tenant`'s blob store and
   * resolves to its blob id. At most {@link MAX_BLOB_PUT_BYTES} bytes (768 KiB): beyond,
   * {@link SandboxError} `too_large`; also `invalid_request` (a bad tenant name) and
   * `quota_exceeded` (the tenant's quota).
   */
  putBlob(tenant: string, data: Uint8Array | string, options?: CallOptions): Promise<BlobId> {
    const bytes = typeof data === "string" ? Buffer.from(data, "utf8") : data;
    const b64 = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("base64");
    return this.request(
      { blob_put: { tenant, data_b64: b64 } },
      (a) => string(a, "blob") as BlobId,
      options,
    );
  }

  /**
   * The bytes of blob `blob` of `tenant` (at most 8 MiB, else {@link SandboxError}
   * `too_large`). A blob that is absent, or another tenant's, rejects with `blob_not_found`;
   * a malformed blob id with `invalid_request`.
   */
  getBlob(tenant: string, blob: BlobId | string, options?: CallOptions): Promise<Buffer> {
    return this.request(
      { blob_get: { tenant, blob } },
      (a) => base64(string(a, "data_b64")),
      options,
    );
  }

  /**
   * Starts a session of a registered server (`request.tool`, an entry of the daemon's
   * `--config` registry) and resolves to its {@link Session} once the server runs. The
   * ticket must grant `tool.run` for the entry. Rejects with {@link SandboxError}:
   * `invalid_request` (unknown tool, bad request), `action_denied` (the ticket lacks
   * `tool.run` for it), `capacity` (the session caps), `queue_timeout`,
   * `runtime_unavailable`, `digest_mismatch`, `internal`.
   *
   * Abandoned through `options.signal`, the open goes on in the daemon; should it succeed,
   * this client closes the session as soon as the answer comes and drops its output.
   */
  openSession(
    ticket: TicketDocument,
    request: SessionRequest,
    options?: CallOptions,
  ): Promise<Session> {
    return this.request(
      { session_open: { ticket, request } },
      (a) => this.registerSession(string(a, "session")),
      options,
      (session) => {
        session.abandon();
        session.close().catch(() => undefined);
      },
    );
  }

  /** The daemon's counters and warm pools (`service_stats`). */
  stats(options?: CallOptions): Promise<ServiceStats> {
    return this.request(
      { service_stats: {} },
      (a) => {
        const stats = object<ServiceStats>(a, "service_stats");
        // A daemon older than `pools` does not send it: no pools.
        return { ...stats, pools: stats.pools ?? [] };
      },
      options,
    );
  }

  /**
   * Closes the connection. The daemon cancels every run still in flight (it kills them) and
   * closes every session; their promises reject with {@link SandboxConnectionError}. Resolves
   * once the socket is closed; calling it again does nothing more.
   */
  close(): Promise<void> {
    this.fail(new SandboxConnectionError("the client was closed"));
    return new Promise((resolve) => {
      if (this.socket.closed) resolve();
      else this.socket.once("close", () => resolve());
    });
  }

  /** Whether the connection is gone (closed by either side, or failed). */
  get closed(): boolean {
    return this.failure !== null;
  }

  // --- internals -------------------------------------------------------------------------------

  /**
   * Sends `{"id": <new id>, ...body}` and settles with `unwrap(answer)`. The id goes first:
   * when the daemon cannot parse a line it still answers under that leading id. `late` gets
   * the value of an answer that comes after the caller stopped waiting.
   */
  private request<T>(
    body: Record<string, unknown>,
    unwrap: (answer: Answer) => T,
    options?: CallOptions,
    late?: (value: T) => void,
  ): Promise<T> {
    const signal = options?.signal;
    let id: string;
    let line: string;
    try {
      if (this.failure) throw this.failure;
      if (signal?.aborted) throw signal.reason;
      id = `r${++this.nextId}`;
      line = encodeLine({ id, ...body });
      const bytes = Buffer.byteLength(line, "utf8");
      if (bytes > this.maxLineBytes) {
        throw new RangeError(
          `the request line is ${bytes} bytes; the sandbox daemon accepts at most ${this.maxLineBytes}`,
        );
      }
    } catch (e) {
      return Promise.reject(e);
    }
    return new Promise<T>((resolve, reject) => {
      let waiting = true;
      const onAbort = () => {
        waiting = false;
        reject(signal?.reason);
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      const done = () => signal?.removeEventListener("abort", onAbort);
      this.pending.set(id, {
        deliver: (answer) => {
          done();
          const error = answer["error"];
          if (error !== undefined) {
            if (!waiting) return;
            const e = error as { code?: unknown; message?: unknown };
            reject(new SandboxError(String(e.code) as ErrorCode, String(e.message ?? "")));
            return;
          }
          let value: T;
          try {
            value = unwrap(answer);
          } catch (e) {
            if (waiting) reject(e);
            return;
          }
          if (waiting) resolve(value);
          else late?.(value);
        },
        fail: (e) => {
          done();
          if (waiting) reject(e);
        },
      });
      this.socket.write(line + "\n");
    });
  }

  private registerSession(id: string): Session {
    const session = new Session(this, id);
    this.sessions.set(id, session);
    return session;
  }

  /** @internal Called by a session when its close is answered (or failed). */
  forgetSession(session: Session): void {
    if (this.sessions.get(session.id) === session) this.sessions.delete(session.id);
    this.release(session);
  }

  /** @internal A session's queue is full: read no more from the daemon for now. */
  hold(session: Session): void {
    this.held.add(session);
    this.socket.pause();
  }

  /** @internal A session's queue has room again. */
  release(session: Session): void {
    if (this.held.delete(session) && this.held.size === 0 && !this.failure) this.socket.resume();
  }

  /** @internal Sends a request for a session (`session_write`, `_close_stdin`, `_close`). */
  sessionRequest<T>(
    body: Record<string, unknown>,
    unwrap: (answer: Answer) => T,
    options?: CallOptions,
  ): Promise<T> {
    return this.request(body, unwrap, options);
  }

  private onData(chunk: Buffer): void {
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(10, start);
      if (nl < 0) break;
      let line = chunk.subarray(start, nl);
      if (this.partial.length > 0) {
        line = Buffer.concat([...this.partial, line]);
        this.partial = [];
      }
      start = nl + 1;
      this.onLine(line);
      if (this.failure) return;
    }
    if (start < chunk.length) this.partial.push(chunk.subarray(start));
  }

  private onLine(line: Buffer): void {
    if (line.length === 0 || (line.length === 1 && line[0] === 13)) return;
    let answer: Answer;
    try {
      const parsed: unknown = JSON.parse(line.toString("utf8"));
      if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
        throw new TypeError("not a JSON object");
      }
      answer = parsed as Answer;
    } catch (e) {
      this.fail(
        new SandboxConnectionError(
          `the sandbox daemon sent a line that is not a JSON object: ${(e as Error).message}`,
          { cause: e },
        ),
      );
      return;
    }
    if (!("id" in answer) && typeof answer["session"] === "string") {
      const session = this.sessions.get(answer["session"]);
      if (session === undefined) {
        this.droppedEvents += 1;
      } else if (answer["eof"] === true) {
        session.deliverEof();
      } else {
        try {
          session.deliver(base64(string(answer, "stdout")));
        } catch (e) {
          this.fail(new SandboxConnectionError((e as Error).message, { cause: e }));
        }
      }
      return;
    }
    const id = answer["id"];
    const pending = typeof id === "string" ? this.pending.get(id) : undefined;
    if (pending === undefined) {
      this.unmatched.push(answer);
      return;
    }
    this.pending.delete(id as string);
    pending.deliver(answer);
  }

  /** The connection is over: every call in flight and every session's reader learns why. */
  private fail(error: SandboxConnectionError): void {
    if (this.failure) return;
    this.failure = error;
    this.socket.destroy();
    const pending = [...this.pending.values()];
    this.pending.clear();
    for (const p of pending) p.fail(error);
    for (const s of this.sessions.values()) s.connectionLost(error);
    this.held.clear();
  }
}

/**
 * A live session opened by {@link SandboxClient.openSession}: a server with its stdin and
 * stdout. Its stdout arrives as chunks, exactly the bytes the server wrote, in order; read
 * them with {@link Session.read}, {@link Session.readLine} or `for await (const chunk of
 * session)`. At most `maxQueuedChunks` chunks wait here (see {@link ConnectOptions}): read
 * what you asked for.
 */
export class Session implements AsyncIterable<Buffer> {
  /** The session's name on this connection (the daemon's `S`). */
  readonly id: string;

  private readonly client: SandboxClient;
  private chunks: Buffer[] = [];
  private eof = false;
  private dropping = false;
  private lost: Error | null = null;
  private readonly waiters: {
    resolve: (chunk: Buffer | null) => void;
    reject: (e: unknown) => void;
  }[] = [];

  /** Made by {@link SandboxClient.openSession}; not to be called directly. */
  constructor(client: SandboxClient, id: string) {
    this.client = client;
    this.id = id;
  }

  /**
   * Writes `data` (bytes, or a string sent as its UTF-8) to the server's stdin; resolves to
   * the number of bytes written once the daemon accepted them all (it waits while the
   * session's 64 KiB stdin buffer is full). Rejects with {@link SandboxError}
   * `session_ended` when the server closed its stdin or the session ended (or its stdin was
   * closed), `session_not_found` after {@link Session.close}.
   */
  write(data: Uint8Array | string, options?: CallOptions): Promise<number> {
    const op =
      typeof data === "string"
        ? { session: this.id, text: data }
        : {
            session: this.id,
            data_b64: Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString(
              "base64",
            ),
          };
    return this.client.sessionRequest(
      { session_write: op },
      (a) => integer(a, "written"),
      options,
    );
  }

  /**
   * The next chunk of the server's stdout (at most 16 KiB), or `null` once the output ended
   * (the server closed its stdout, the session ended or was closed). Rejects with
   * {@link SandboxConnectionError} when the connection was lost before the end (after the
   * chunks that came before it), and with `options.signal`'s reason when it aborts.
   */
  read(options?: CallOptions): Promise<Buffer | null> {
    const chunk = this.chunks.shift();
    if (chunk !== undefined) {
      if (this.chunks.length < this.client.maxQueuedChunks) this.client.release(this);
      return Promise.resolve(chunk);
    }
    if (this.eof || this.dropping) return Promise.resolve(null);
    if (this.lost) return Promise.reject(this.lost);
    const signal = options?.signal;
    if (signal?.aborted) return Promise.reject(signal.reason);
    return new Promise((resolve, reject) => {
      const waiter = {
        resolve: (c: Buffer | null) => {
          signal?.removeEventListener("abort", onAbort);
          resolve(c);
        },
        reject: (e: unknown) => {
          signal?.removeEventListener("abort", onAbort);
          reject(e);
        },
      };
      const onAbort = () => {
        const i = this.waiters.indexOf(waiter);
        if (i >= 0) this.waiters.splice(i, 1);
        reject(signal?.reason);
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.waiters.push(waiter);
    });
  }

  /**
   * The next line of the server's stdout with its `\n`; at the end, what is left without
   * one; `null` when nothing is left. A line longer than `maxBytes` (default 4 MiB, its
   * newline not counted) rejects with `RangeError` as soon as that many bytes came without a
   * newline. Whatever rejects (that, an aborted signal, a lost connection), no byte is lost:
   * those read so far come first in the next read.
   */
  async readLine(options: ReadLineOptions = {}): Promise<Buffer | null> {
    const limit = options.maxBytes ?? DEFAULT_MAX_READ_LINE_BYTES;
    const read: CallOptions = options.signal ? { signal: options.signal } : {};
    const parts: Buffer[] = [];
    let size = 0;
    try {
      for (;;) {
        const chunk = await this.read(read);
        if (chunk === null) return size > 0 ? Buffer.concat(parts) : null;
        parts.push(chunk);
        const nl = chunk.indexOf(10);
        if (nl >= 0 && size + nl <= limit) {
          parts.pop();
          if (nl + 1 < chunk.length) this.chunks.unshift(chunk.subarray(nl + 1));
          parts.push(chunk.subarray(0, nl + 1));
          return Buffer.concat(parts);
        }
        size += chunk.length;
        if (size > limit) {
          throw new RangeError(
            `session ${this.id}: the server's line is longer than ${limit} bytes (readLine's maxBytes)`,
          );
        }
      }
    } catch (e) {
      if (size > 0 || parts.length > 0) this.chunks.unshift(Buffer.concat(parts));
      throw e;
    }
  }

  /** Every stdout chunk until the output ends (see {@link Session.read}). */
  async *[Symbol.asyncIterator](): AsyncIterator<Buffer> {
    for (;;) {
      const chunk = await this.read();
      if (chunk === null) return;
      yield chunk;
    }
  }

  /**
   * Closes the server's stdin once the writes sent before are in (EOF for the server); later
   * writes reject with `session_ended`. Rejects with {@link SandboxError}
   * `session_not_found` for a closed session.
   */
  async closeStdin(options?: CallOptions): Promise<void> {
    await this.client.sessionRequest(
      { session_close_stdin: { session: this.id } },
      (a) => a["stdin_closed"],
      options,
    );
  }

  /**
   * Stops the server (stdin closed, a grace period, then every process of it killed and
   * confirmed dead) and resolves to the {@link SessionResult}. Output not read yet is
   * dropped, and reads resolve `null` from now on. Writes still waiting reject with
   * `session_ended`. Rejects with {@link SandboxError} `session_not_found` when already
   * closed.
   */
  async close(options?: CallOptions): Promise<SessionResult> {
    this.abandon();
    try {
      return await this.client.sessionRequest(
        { session_close: { session: this.id } },
        (a) => object<SessionResult>(a, "session_result"),
        options,
      );
    } finally {
      this.client.forgetSession(this);
    }
  }

  /** @internal Drops the output, now and from now on; wakes the readers (end of output). */
  abandon(): void {
    this.dropping = true;
    this.chunks = [];
    this.client.release(this);
    for (const w of this.waiters.splice(0)) w.resolve(null);
  }

  /** @internal One chunk of stdout. */
  deliver(chunk: Buffer): void {
    if (this.dropping) return;
    const waiter = this.waiters.shift();
    if (waiter) {
      waiter.resolve(chunk);
      return;
    }
    this.chunks.push(chunk);
    if (this.chunks.length >= this.client.maxQueuedChunks) this.client.hold(this);
  }

  /** @internal The `eof` event. */
  deliverEof(): void {
    this.eof = true;
    for (const w of this.waiters.splice(0)) w.resolve(null);
  }

  /** @internal The connection ended. */
  connectionLost(error: Error): void {
    if (this.eof || this.dropping) return;
    this.lost = error;
    for (const w of this.waiters.splice(0)) w.reject(error);
  }
}

// --- wire helpers ----------------------------------------------------------------------------

/**
 * One request line, without its newline. Refuses what JSON.stringify would send wrong: NaN
 * and infinities (it writes `null`), and strings that are not valid UTF-16 (lone surrogates:
 * not UTF-8, which the daemon refuses), in values and keys. BigInt is refused by
 * JSON.stringify itself (TypeError).
 */
function encodeLine(value: Record<string, unknown>): string {
  return JSON.stringify(value, function (key: string, v: unknown) {
    if (typeof v === "number" && !Number.isFinite(v)) {
      throw new TypeError(`${key || "request"}: ${v} is not a JSON number`);
    }
    if (typeof v === "string" && LONE_SURROGATE.test(v)) {
      throw new TypeError(`${key || "request"}: a string with a lone surrogate is not UTF-8`);
    }
    if (typeof v === "object" && v !== null && !Array.isArray(v)) {
      for (const k of Object.keys(v)) {
        if (LONE_SURROGATE.test(k)) {
          throw new TypeError(`${key || "request"}: a key with a lone surrogate is not UTF-8`);
        }
      }
    }
    return v;
  });
}

function malformed(what: string): TypeError {
  return new TypeError(`malformed answer from the sandbox daemon: ${what}`);
}

function object<T>(answer: Answer, field: string): T {
  const v = answer[field];
  if (typeof v !== "object" || v === null || Array.isArray(v)) {
    throw malformed(`'${field}' is not an object`);
  }
  return v as T;
}

function string(answer: Answer, field: string): string {
  const v = answer[field];
  if (typeof v !== "string") throw malformed(`'${field}' is not a string`);
  return v;
}

function integer(answer: Answer, field: string): number {
  const v = answer[field];
  if (typeof v !== "number" || !Number.isInteger(v)) {
    throw malformed(`'${field}' is not an integer`);
  }
  return v;
}

/** Strict RFC 4648 base64 with padding (Buffer.from alone skips bad characters). */
function base64(text: string): Buffer {
  if (!BASE64.test(text)) throw malformed("not padded RFC 4648 base64");
  return Buffer.from(text, "base64");
}
