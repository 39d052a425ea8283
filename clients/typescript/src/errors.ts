/**
 * The client's errors. How a run ended is never an error: it is the run result's
 * `code`. A promise of this package rejects only when the daemon refused the line itself
 * ({@link SandboxError}, with the protocol's stable code), when the connection failed
 * ({@link SandboxConnectionError}), or for a request that could not be sent at all
 * (`RangeError`, `TypeError`; nothing was sent).
 *
 * @module
 */

/**
 * The stable codes of an `error` answer (docs/protocol.md, "Lines" and "Sessions over the
 * daemon"): `invalid_request` (a malformed line, bad base64, tenant or blob id, an unknown
 * tool), `blob_not_found`, `too_large` (a blob over 768 KiB put or 8 MiB got),
 * `quota_exceeded`, `capacity` (too many connections or sessions), `session_not_found`,
 * `session_ended`, `internal`; a refused session open also `action_denied`,
 * `runtime_unavailable`, `digest_mismatch` and `queue_timeout`.
 */
export type ErrorCode =
  | "invalid_request"
  | "blob_not_found"
  | "too_large"
  | "quota_exceeded"
  | "capacity"
  | "session_not_found"
  | "session_ended"
  | "internal"
  | "action_denied"
  | "runtime_unavailable"
  | "digest_mismatch"
  | "queue_timeout";

/** An `error` answer of the daemon: the line was refused, or a blob or session request failed. */
export class SandboxError extends Error {
  /** The stable code (see {@link ErrorCode}; an unknown one is passed on as it came). */
  readonly code: ErrorCode;

  /**
   * @param code - the answer's `error.code`
   * @param message - the answer's `error.message`: short and sanitized
   */
  constructor(code: ErrorCode, message: string) {
    super(message);
    this.name = "SandboxError";
    this.code = code;
  }

  /** `code: message`, as a log line would show it. */
  override toString(): string {
    return `${this.name}: ${this.code}: ${this.message}`;
  }
}

/**
 * The connection to the daemon failed or was closed (by {@link SandboxClient.close} or by
 * the daemon: it exited, was killed, or disconnected a client that did not read). Every call
 * in flight rejects with it, and so does every later call on the same client.
 */
export class SandboxConnectionError extends Error {
  /**
   * @param message - what happened, e.g. `the sandbox daemon closed the connection`
   * @param options - `cause`: the socket's own error, when there was one
   */
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "SandboxConnectionError";
  }
}

