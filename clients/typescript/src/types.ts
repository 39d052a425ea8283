/**
 * The protocol's documents (docs/protocol.md, protocol version 1) as TypeScript types: what a
 * client sends (tickets, run requests, session requests, run records for replay) and what the
 * daemon answers (run results, session results, service counters).
 *
 * Field names are the wire's, unchanged (snake_case), so a value can be written to and read
 * from the socket as it is. Units live in the names: `_ms` is milliseconds, `_bytes` bytes.
 * Integers are JavaScript numbers: exact up to 2^53 - 1 (`Number.MAX_SAFE_INTEGER`), which no
 * real limit, size or duration reaches; larger uint64 values lose precision.
 *
 * @module
 */

/** A blob id: `sha256:` and 64 lowercase hex digits, the SHA-256 of the blob's bytes. */
export type BlobId = `sha256:${string}`;

/** An isolation level, weakest first. A run never uses a weaker one than its ticket names. */
export type Isolation = "process" | "container" | "gvisor" | "microvm";

/**
 * What a ticket may grant: `code.execute` (run code at all), `code.network` (reach the
 * network through the run's egress proxy), `tool.run` (run the registered tools in `tools`).
 */
export type Action = "code.execute" | "code.network" | "tool.run";

/**
 * A ticket: what the host allows (docs/protocol.md, "ticket"). Without `--trusted-keys` the
 * daemon trusts the ticket its client sends; with them, send a {@link SignedTicket}.
 */
export interface Ticket {
  /** Protocol version; 1 when given. */
  v?: 1;
  /** 1-128 printable ASCII characters. */
  id: string;
  /** 1-64 characters of `[A-Za-z0-9._-]`, starting with a letter or digit. */
  tenant: string;
  /** Granted actions, each at most once; `[]` allows nothing. */
  actions: Action[];
  /** Minimum isolation level of runs under the ticket. */
  isolation: Isolation;
  /** > 0. Ceiling of a run's `timeout_ms`; of a session's whole lifetime. */
  max_timeout_ms: number;
  /** > 0. Ceiling of a run's `memory_limit_bytes`. */
  max_memory_bytes: number;
  /** Pin of the runtime image (`sha256:` + 64 hex); another image → `digest_mismatch`. */
  runtime_digest?: BlobId;
  /** Egress patterns a `code.network` ticket allows (required with it, refused without). */
  egress?: string[];
  /** RFC 3339 UTC, exactly `YYYY-MM-DDTHH:MM:SSZ`; at and after it → `action_denied`. */
  expires_at?: string;
  /** A derived ticket's ancestors' ids, root first, 1-4 of them. */
  derived_from?: string[];
  /** Registered tools (`[a-z0-9._-]`, 1-64) or `"*"`; required with `tool.run`. */
  tools?: string[];
  /** The host's workload profile for runs under the ticket. */
  profile?: string;
  /** Host-held secrets runs may name (`[a-z0-9-]`, 1-64, starting with a letter), at most 16. */
  secrets?: string[];
  /**
   * L7 rules (docs/security.md, "L7 rules"), only with `code.network`: 1-32, narrowing what
   * runs may send to the hosts they name.
   */
  egress_rules?: EgressRule[];
  /** For a ticket derived from an approval: the approval request it answers. */
  approval?: ApprovalRequest;
}

/**
 * An L7 egress rule: requests to `host` must use one of `methods` on a path under one of
 * `paths` (compared as sent, never decoded); refusals and attempts name the rule.
 */
export interface EgressRule {
  /** 1-64 characters of `[a-z0-9-]`, unique in the ticket. */
  name: string;
  /** An egress pattern sharing at least one name with the ticket's `egress`. */
  host: string;
  /** 1-7 distinct of `GET`, `HEAD`, `POST`, `PUT`, `PATCH`, `DELETE`, `OPTIONS`. */
  methods: string[];
  /** 1-32 distinct path prefixes starting with `/` (no `%`, `?`, `#`, `\`, dot segments). */
  paths: string[];
  /** > 0: requests admitted under the rule over a whole run. */
  max_requests?: number;
  /** > 0: bytes of request and response bodies relayed under the rule over a whole run. */
  max_bytes?: number;
}

/** A ticket signed with Ed25519 (docs/protocol.md, "Signed tickets"), as `ticket sign` writes. */
export interface SignedTicket {
  v: 1;
  ticket: Ticket;
  /** The parent's signed document, for a derived ticket. */
  parent?: SignedTicket;
  /** Key id: 1-64 characters of `[A-Za-z0-9._-]`. */
  kid: string;
  /** Signature, 86 base64url characters. */
  sig: string;
}

/** What the daemon accepts as a run's or session's ticket. */
export type TicketDocument = Ticket | SignedTicket;

/** An input file of a run: staged read-only in `$SANDBOX_INPUT_DIR`. */
export interface InputFile {
  /** 1-255 bytes of UTF-8 in NFC; no `/`, not `.` or `..`, no control characters; unique. */
  name: string;
  /** A blob of the ticket's tenant (absent → the run's code is `blob_not_found`). */
  blob: BlobId;
}

/** Caps on the output files a run returns (from `$SANDBOX_OUTPUT_DIR`); clamped by policy. */
export interface OutputLimits {
  /** Default 16, clamped to the policy's 256; 0 returns no files. */
  max_files?: number;
  /** Default 8388608 (8 MiB), clamped to the policy's 64 MiB. */
  max_bytes?: number;
}

/** The fields every run request may carry (docs/protocol.md, "run_request"). */
export interface RunRequestBase {
  /** Protocol version; 1 when given. */
  v?: 1;
  /** Default 2000; ≤ 0 → `invalid_request`; above the ceilings clamped (`timeout_clamped`). */
  timeout_ms?: number;
  /** Default false; true needs `egress` and `code.network` on the ticket. */
  network?: boolean;
  /** Host names or `*.` wildcards a network run may reach; non-empty exactly with `network`. */
  egress?: string[];
  /**
   * Host-held secrets the network run uses, by name (granted by the ticket, defined by the
   * host); the program sees only `SANDBOX_SECRET_<NAME>`, a per-run placeholder.
   */
  secrets?: string[];
  /** At most 16 input files. */
  files_in?: InputFile[];
  /** Caps on returned output files. */
  files_out?: OutputLimits;
  /** Default 268435456 (256 MiB); below 32 MiB → `invalid_request`; above the ceilings clamped. */
  memory_limit_bytes?: number;
  /** Environment; names must be in the policy's allowlist (at most 32, values ≤ 4096 bytes). */
  env?: Record<string, string>;
  /** Pin of the runtime image; another installed image → `digest_mismatch`. */
  runtime_digest?: BlobId;
}

/** A run of program text in a runtime (`python3`, `node`, …). */
export interface CodeRunRequest extends RunRequestBase {
  /** A runtime configured on the host (else `invalid_request`) whose image is installed. */
  runtime: string;
  /** Program text, at most 32768 bytes (else `source_too_large`). */
  source: string;
  tool?: never;
  stdin?: never;
  stdin_blob?: never;
}

/** A run of a registered tool (docs/protocol.md, "Registered tools"): bytes on stdin. */
export interface ToolRunRequest extends RunRequestBase {
  /** A tool of the host's registry the ticket grants `tool.run` for. */
  tool: string;
  /** Absent or empty with `tool`. */
  runtime?: "";
  /** Absent or empty with `tool`. */
  source?: "";
  /** The standard input, exactly these bytes as UTF-8; at most 1 MiB. Not with `stdin_blob`. */
  stdin?: string;
  /** A blob of the ticket's tenant whose bytes are the standard input; not with `stdin`. */
  stdin_blob?: BlobId;
}

/** A run request: code in a runtime, or a registered tool. */
export type RunRequest = CodeRunRequest | ToolRunRequest;

/**
 * A run's code (docs/protocol.md, "Codes"). Only `ok` means the program ran to completion
 * (its `exit_code` may still be non-zero). Codes may be appended within protocol version 1
 * (`pids_limit` was), so handle an unknown one like `internal`.
 */
export type ResultCode =
  | "ok"
  | "invalid_request"
  | "source_too_large"
  | "action_denied"
  | "approval_required"
  | "approval_denied"
  | "network_disabled"
  | "timeout"
  | "oom"
  | "seccomp_violation"
  | "output_limit"
  | "blob_not_found"
  | "queue_timeout"
  | "capacity"
  | "runtime_unavailable"
  | "digest_mismatch"
  | "internal"
  | "pids_limit"
  | "error";

/** A captured stream (stdout or stderr) of a run. */
export interface StreamSummary {
  /** Head and tail, at most 4 KiB of valid UTF-8 (invalid bytes as `\xNN`), with a cut marker. */
  summary: string;
  /** Blob of the first `bytes` bytes, byte-exact (empty for a session's stdout). */
  blob: BlobId | "";
  /** Bytes stored in the blob. */
  bytes: number;
  /** Bytes the program wrote in all. */
  total_bytes: number;
  /** `total_bytes > bytes`. */
  truncated: boolean;
}

/** An output file a run returned. */
export interface OutputFile {
  name: string;
  blob: BlobId;
  bytes: number;
}

/** Why an output file was not returned. */
export type DropReason =
  | "count_limit"
  | "bytes_limit"
  | "not_regular_file"
  | "bad_name"
  | "quota_exceeded"
  | "store_error";

/** An output file that was not returned. */
export interface DroppedFile {
  /** The name, with invalid bytes, control and invisible characters escaped as `\xNN`. */
  name_display: string;
  reason: DropReason;
}

/** What a run used. */
export interface Usage {
  /** Setting the sandbox up, ms. */
  setup_ms: number;
  /** The user code's wall-clock time, ms. */
  wall_ms: number;
  /** CPU time, ms. */
  cpu_ms: number;
  /** Peak memory, bytes. */
  peak_memory_bytes: number;
}

/** One connection or lookup a run attempted (at most 64 are listed, in order). */
export interface EgressAttempt {
  /** `tcp`, `udp`, `dns`, `unix`, `other`; proxy requests `https` (CONNECT) or `http`. */
  protocol: string;
  /** The name asked for. */
  host: string;
  /** The numeric address tried, or the one the proxy connected to. */
  address: string;
  /** 0-65535. */
  port: number;
  allowed: boolean;
  /** `approved`, or why not (`domain not approved`, `connect failed`, …). */
  reason: string;
  /** Bytes relayed up through the proxy. */
  bytes_up: number;
  /** Bytes relayed down through the proxy. */
  bytes_down: number;
  /** For a request an L7 egress rule judged: its method as sent (absent otherwise). */
  method?: string;
  /** For a request an L7 egress rule judged: its path as sent, escaped, at most 256 bytes. */
  path?: string;
  /** The rule that admitted or refused it (none matched: the host's rules, comma-separated). */
  rule?: string;
}

/** Queue position, for `capacity` and `queue_timeout`. */
export interface QueueInfo {
  /** 1-based place among the tenant's queued runs. */
  position: number;
  /** Runs queued on the host. */
  length: number;
  /** When to retry, ms (a hint for `capacity`). */
  retry_after_ms: number;
}

/** The approval request a host asks a human about (docs/protocol.md, "Approval"). */
export interface ApprovalRequest {
  v?: 1;
  ticket_id: string;
  tenant: string;
  /** Canonical egress patterns, 1-32. */
  domains: string[];
  timeout_ms: number;
  memory_limit_bytes: number;
  files_in: { name: string; sha256: string; bytes: number }[];
  /** 64 lowercase hex digits. */
  source_sha256: string;
  source_bytes: number;
  env?: Record<string, string>;
  /** The secrets the run asks for: names, where each would go and in which header; no value. */
  secrets?: { name: string; domains: string[]; header: string }[];
  isolation: Exclude<Isolation, "process">;
  runtime: { name: string; digest: BlobId };
}

/** A signed execution receipt (docs/protocol.md, "Execution receipts"). */
export interface Receipt {
  v: 1;
  kid: string;
  sig: string;
  receipt: {
    run_id: string;
    issued_at: string;
    tenant: string;
    ticket_id: string;
    derived_from: string[];
    approval_sha256: string | null;
    request_sha256: string;
    code: ResultCode;
    exit_code: number | null;
    signal: number | null;
    backend: string;
    isolation: Isolation;
    runtime: { name: string; digest: string };
    usage: Usage;
    egress_attempts: EgressAttempt[];
    egress_attempts_dropped: number;
    stdout: Omit<StreamSummary, "summary">;
    stderr: Omit<StreamSummary, "summary">;
    files_out: OutputFile[];
  };
}

/**
 * What came of a run (docs/protocol.md, "run_result"). The schema lets a decoder omit every
 * field but `code`; the daemon writes them all (`receipt` only when it signs receipts), and
 * this type says so.
 */
export interface RunResult {
  v: 1;
  code: ResultCode;
  /** Short and sanitized; names the offending field for admission codes; `""` for plain ok. */
  message: string;
  /** Exit status of the main process, when it exited. */
  exit_code: number | null;
  /** Signal that ended the main process, if any. */
  signal: number | null;
  stdout: StreamSummary;
  stderr: StreamSummary;
  files_out: OutputFile[];
  files_dropped: DroppedFile[];
  usage: Usage;
  /** Processes killed by the run cgroup's OOM killer. */
  oom_kills: number;
  /** The request's timeout was lowered to a ceiling. */
  timeout_clamped: boolean;
  /** The request's memory limit was lowered to a ceiling. */
  memory_clamped: boolean;
  /** The timeout that applied, ms. */
  timeout_ms: number;
  /** The memory limit that applied, bytes. */
  memory_limit_bytes: number;
  /** The level the run used. */
  isolation: Isolation;
  /** The runtime (or tool) and its image's manifest digest. */
  runtime: { name: string; digest: string };
  egress_attempts: EgressAttempt[];
  /** Attempts not listed (repeats, and those beyond 64). */
  egress_attempts_dropped: number;
  /** For `seccomp_violation`: the forbidden system call. */
  violation: string | null;
  /** Correlates host logs and spans. */
  run_id: string;
  /** The mechanism and its version (`process`, `crun 1.8.1`, …); `""` when nothing ran. */
  backend: string;
  /** For `capacity` and `queue_timeout`; null otherwise. */
  queue: QueueInfo | null;
  /** How long the run waited for a scheduler slot, ms. */
  queue_wait_ms: number;
  /** For `approval_required`: what to ask; null otherwise. */
  approval: ApprovalRequest | null;
  /** The signed receipt, when the daemon signs receipts (`--receipt-key`). */
  receipt?: Receipt;
}

/**
 * A run record (docs/protocol.md, "Run records"): a run's checkpoint. Store it as it came
 * (plain JSON); {@link SandboxClient.replay} returns its result without running anything.
 */
export interface RunRecord {
  v: 1;
  /** Equals `result.run_id`. */
  record_id: string;
  tenant: string;
  /** SHA-256 of the request's canonical encoding, 64 lowercase hex digits. */
  request_sha256: string;
  ticket_id: string;
  derived_from: string[];
  runtime: { name: string; digest: string };
  /** RFC 3339 UTC, whole seconds. */
  created_at: string;
  result: RunResult;
}

/** A run's result with its record, from {@link SandboxClient.runWithRecord}. */
export interface RecordedRun {
  result: RunResult;
  record: RunRecord;
}

/** What to open as a session (docs/protocol.md, "Sessions over the daemon"). */
export interface SessionRequest {
  v?: 1;
  /** An entry of the daemon's registry (its `--config` file's `tools`). */
  tool: string;
  /** ≥ 1; clamped to the host's ceiling and the ticket's `max_timeout_ms`. */
  max_lifetime_ms?: number;
  /** ≥ 1; clamped to the host's ceiling. */
  idle_timeout_ms?: number;
}

/**
 * How a session ended: `closed` (by {@link Session.close}), `server_exited`, `idle_timeout`,
 * `max_lifetime`, `ticket_expired` (these three with code `timeout`), `oom`,
 * `seccomp_violation`, `killed`, `failed` (code `internal` or `pids_limit`).
 */
export type SessionEnd =
  | "closed"
  | "server_exited"
  | "idle_timeout"
  | "max_lifetime"
  | "oom"
  | "seccomp_violation"
  | "killed"
  | "failed"
  | "ticket_expired";

/** What came of a session (docs/protocol.md, "session_result"). */
export interface SessionResult {
  v?: 1;
  end: SessionEnd;
  /** The session's life as a run: wall time, stderr blob; stdout is never stored. */
  result: RunResult;
  /** Bytes the server read from its stdin. */
  bytes_to_server: number;
  /** Bytes the daemon read from the server's stdout. */
  bytes_from_server: number;
}

/**
 * One warm pool class of the daemon (`service_stats.pools`, docs/protocol.md), members in
 * the daemon's order.
 */
export interface PoolStats {
  /** The level whose backend keeps the pool. */
  isolation: Isolation;
  /** The runtime the class serves. */
  runtime: string;
  /** The class's memory limit, bytes. */
  memory_limit_bytes: number;
  /** Configured size: concurrent executions expected of the class. */
  size: number;
  /** Instances prepared and waiting. */
  ready: number;
  /** Instances being prepared now. */
  starting: number;
  /** Instances given to runs since the daemon started. */
  handed_out: number;
  /** Instances that failed to prepare or died idle, since the start. */
  failed: number;
  /**
   * Present only once the class stopped preparing for good (a pre-started class whose
   * `preload` import raised: the module and the exception's summary); its runs are served
   * cold.
   */
  error?: string;
}

/** The daemon's counters (`service_stats`). */
export interface ServiceStats {
  /** Sessions open or opening, every client. */
  sessions: number;
  /** Bytes read from every session's server since the start. */
  session_stdout_bytes: number;
  /** Write data waiting in the daemon, bytes. */
  session_write_bytes: number;
  /** Answers not yet written to their clients, bytes. */
  unwritten_bytes: number;
  /** One per warm pool class; empty with none (and from a daemon older than the member). */
  pools: PoolStats[];
}
