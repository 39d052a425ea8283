// The wire protocol's value types: what a caller asks for (`run_request`) and what it gets
// back (`run_result`). Version 1. The JSON form (field names, defaults, the JSON Schema) is
// in docs/protocol.md; the codec is sandbox/json.hpp.
//
// All types are plain aggregates: fill them with designated initializers, copy them, compare
// them with `==`. Units are in the field's type or name (`std::chrono::milliseconds`,
// `*_bytes`).
#pragma once

#include <boost/assert/source_location.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/code.hpp"
#include "sandbox/secrets.hpp"

namespace sandbox {

/// The protocol version this library speaks (`"v"` on the wire; absent means 1).
inline constexpr std::uint32_t protocol_version = 1;

/// One input file: placed read-only, as `name`, in the run's input directory.
struct input_file {
  /// Plain file name: valid UTF-8, 1..255 bytes, no `/`, not `.` or `..`, no NUL or other
  /// control characters, no invisible formatting characters (bidi controls, zero-width
  /// characters, U+FEFF, tags: docs/protocol.md), NFC; unique within the request.
  std::string name;
  /// Blob id, `sha256:` + 64 lowercase hex digits, of a blob of the ticket's tenant.
  std::string blob;
  bool operator==(const input_file&) const = default;
};

/// Caps on what the run may leave in its output directory.
struct output_limits {
  std::uint32_t max_files = 16;               ///< files returned at most (default 16)
  std::uint64_t max_bytes = 8 * 1024 * 1024;  ///< total bytes returned at most (default 8 MiB)
  bool operator==(const output_limits&) const = default;
};

/// One request to run `source` with a named runtime. Built by the agent runtime from the
/// model's tool call; checked against a ticket and the policy before anything starts
/// (sandbox/admission.hpp).
struct run_request {
  std::uint32_t v = protocol_version;  ///< protocol version; only 1 is accepted
  std::string runtime;                 ///< runtime name, e.g. "python3" or "node"
  std::string source;                  ///< UTF-8 program text; over the cap → source_too_large
  /// Wall-clock limit for the user code (setup excluded). Default 2000 ms; <= 0 is
  /// invalid_request; above the ticket's or policy's ceiling it is clamped and the result
  /// says so (`timeout_clamped`).
  std::chrono::milliseconds timeout{2000};
  /// The run needs the network: needs `code.network` on the ticket (or an approval, see
  /// sandbox/approval.hpp) and a non-empty `egress`. The run then reaches only the named
  /// hosts, through the host's egress proxy (HTTP `CONNECT` and plain HTTP), never directly.
  bool network = false;
  /// Host names a network run may reach: exact names or `*.suffix` wildcards
  /// (sandbox/egress.hpp, `canonical_egress_pattern`), at most `max_egress_patterns`.
  /// Required (non-empty) when `network`; must be empty otherwise. Admission canonicalizes
  /// them (lower case, no trailing dot, duplicates dropped) and rejects the request as
  /// `invalid_request` naming the entry when one is malformed.
  std::vector<std::string> egress;
  /**
   * Host-held secrets the run uses (sandbox/secrets.hpp), by name: at most `max_secrets`,
   * each a valid secret name, no duplicates; only with `network` (else invalid_request). The
   * ticket must grant each (`ticket_spec::secrets`) and the host must define it, else
   * action_denied naming it. The run never holds a value: its environment variable
   * `secret_env_name(name)` holds a random placeholder made for the run.
   */
  std::vector<std::string> secrets;
  std::vector<input_file> files_in;  ///< at most 16 entries (policy)
  output_limits files_out;           ///< caps on returned output files
  /// Memory limit of the whole run (every process, tmpfs pages included). Default 256 MiB;
  /// clamped to the ticket's and the policy's ceiling.
  std::uint64_t memory_limit_bytes = 256ULL * 1024 * 1024;
  /// Extra environment variables; only names the policy allows (default: none).
  std::map<std::string, std::string> env;
  /// Optional pin: the manifest digest (`sha256:…`) of the runtime image the caller expects
  /// (for a tool run: of the tool's image).
  std::optional<std::string> runtime_digest;
  /// A registered tool to run instead of `runtime` + `source` (sandbox/registry.hpp): the
  /// host's registry fixes its image, program, argv, isolation and limits; the request only
  /// picks the name and gives the bytes (`std_in` / `stdin_blob`, `files_in`). A request
  /// names either `runtime` and `source` or `tool`, never both (invalid_request naming the
  /// field); a tool run takes no `network`/`egress`. Needs `tool.run` on the ticket for this
  /// name (`ticket_spec::tools`), else action_denied; an unknown name is invalid_request.
  std::string tool;
  /// Tool runs only: the program's standard input, byte for byte (wire "stdin", a JSON string,
  /// so UTF-8 text; use `stdin_blob` for arbitrary bytes). Staged read-only and opened as
  /// fd 0; EOF after it. Unset (and no `stdin_blob`): fd 0 is /dev/null. At most
  /// `policy::max_stdin_bytes`, else invalid_request.
  std::optional<std::string> std_in;
  /// Tool runs only: a blob id of the ticket's tenant whose bytes are the program's standard
  /// input (any bytes: NUL, invalid UTF-8). Not with `std_in`. Absent blob: blob_not_found;
  /// larger than `policy::max_stdin_bytes`: invalid_request.
  std::optional<std::string> stdin_blob;
  bool operator==(const run_request&) const = default;
};

/// A captured stdout or stderr stream.
struct stream_capture {
  /// Head and tail of the stream, at most 4 KiB, valid UTF-8 (invalid bytes escaped as
  /// `\xNN`), with a cut marker when the middle was left out. For the model to read.
  std::string summary;
  /// Blob id of the stored bytes: the first `bytes` bytes of the stream, byte-exact.
  std::string blob;
  std::uint64_t bytes = 0;        ///< bytes stored in `blob` (at most the capture cap)
  std::uint64_t total_bytes = 0;  ///< bytes the program wrote to the stream in all
  bool truncated = false;         ///< `total_bytes > bytes`: the rest was read and discarded
  bool operator==(const stream_capture&) const = default;
};

/// A file the run left in its output directory, now a blob.
struct output_file {
  std::string name;         ///< the file's name, exactly as the program wrote it
  std::string blob;         ///< blob id of its content
  std::uint64_t bytes = 0;  ///< its size
  bool operator==(const output_file&) const = default;
};

/// Why an entry of the output directory was not returned.
enum class drop_reason : std::uint8_t {
  count_limit,       ///< more than `files_out.max_files` entries
  bytes_limit,       ///< returning it would exceed `files_out.max_bytes`
  not_regular_file,  ///< a symlink, directory, FIFO, socket or device
  bad_name,          ///< not valid UTF-8, or has control or invisible formatting characters
  quota_exceeded,    ///< the tenant's blob-store quota is full
  store_error,       ///< the blob store failed to store it (e.g. its disk is full); host log
};

/// Wire string of a drop reason, e.g. "not_regular_file".
std::string_view to_string(drop_reason r) noexcept;

/// An output entry that was not returned, with a display form of its name that is always
/// valid UTF-8 without control or invisible formatting characters (`escape_name_for_display`:
/// the name itself when it has none; else invalid bytes, control and formatting characters and
/// backslashes escaped as `\xNN`, so that distinct names never share a display form).
struct dropped_file {
  std::string name_display;
  drop_reason reason = drop_reason::not_regular_file;
  bool operator==(const dropped_file&) const = default;
};

/// Resource usage of one run.
struct run_usage {
  std::chrono::milliseconds setup{0};   ///< preparing the sandbox, before the user code starts
  std::chrono::milliseconds wall{0};    ///< from user-code start to its end (or the kill)
  std::chrono::milliseconds cpu{0};     ///< user + system CPU time of every process of the run
  std::uint64_t peak_memory_bytes = 0;  ///< peak memory of the run's cgroup
  bool operator==(const run_usage&) const = default;
};

/// One attempt of the sandboxed code to reach the network (or a name server).
struct egress_attempt {
  /// "tcp", "udp", "dns", "unix", "other"; through the egress proxy: "https" (CONNECT) or
  /// "http" (a plain-HTTP request)
  std::string protocol;
  /// DNS name asked for (protocol "dns"), or the host a proxy request named ("https", "http";
  /// escaped, at most 253 bytes), else empty
  std::string host;
  std::string address;  ///< numeric address tried, e.g. "93.184.216.34"; empty for dns
  std::uint16_t port = 0;
  bool allowed = false;          ///< false: it was refused (always, when network is off)
  std::string reason;            ///< short reason, e.g. "network disabled"
  std::uint64_t bytes_up = 0;    ///< bytes the code sent through the proxy on this attempt
  std::uint64_t bytes_down = 0;  ///< bytes the code received through the proxy on it
  /// For a proxy request judged by L7 rules (its host has rules, `ticket_spec::egress_rules`):
  /// the request's method and target as the program sent them (escaped like `host`, at most
  /// 256 bytes), and the rule that admitted or refused it (for a request no rule allows: the
  /// host's rules, comma-separated). Empty otherwise. In a terminated tunnel each such request
  /// is its own attempt.
  std::string method;
  std::string path;
  std::string rule;
  bool operator==(const egress_attempt&) const = default;
};

/// The runtime that ran the code: its name and the manifest digest of its image.
struct runtime_info {
  std::string name;
  std::string digest;
  bool operator==(const runtime_info&) const = default;
};

/// Where a run stood in the host's queue, for `capacity` and `queue_timeout` results.
struct queue_info {
  std::uint32_t position = 0;  ///< 1-based place among its tenant's queued runs (0: not queued)
  std::uint32_t length = 0;    ///< runs queued on the host at that moment
  /// For `capacity`: a hint of when a retry may find room (an estimate, not a promise).
  std::chrono::milliseconds retry_after{0};
  bool operator==(const queue_info&) const = default;
};

/// One input file as an approval request shows it: what the human is asked to let reach
/// the network.
struct approval_file {
  std::string name;         ///< the file's name in the run (`input_file::name`)
  std::string sha256;       ///< 64 lowercase hex digits: the content's SHA-256 (the blob id's hex)
  std::uint64_t bytes = 0;  ///< its size, from the blob store
  bool operator==(const approval_file&) const = default;
};

/**
 * What a human (or a policy service) is asked when a network run's ticket lacks
 * `code.network` (sandbox/approval.hpp). Built by the runtime from the admitted request, so
 * every figure is the one the run would get; carried in `run_result::approval` when the
 * decision is deferred, so that the host can checkpoint it, ask, and resume with the derived
 * ticket (`ticket_issuer::derive`). Wire form: docs/protocol.md, "Approval".
 */
struct approval_request {
  std::string ticket_id;  ///< the ticket the run was submitted under (the parent)
  std::string tenant;     ///< its tenant
  /// The domains the run asks for: canonical egress patterns (sandbox/egress.hpp), in the
  /// request's order, duplicates dropped.
  std::vector<std::string> domains;
  std::chrono::milliseconds timeout{0};  ///< the run's timeout, after clamping (wire: timeout_ms)
  std::uint64_t memory_limit_bytes = 0;  ///< the run's memory limit, after clamping
  std::vector<approval_file> files_in;   ///< every input, in the request's order
  std::string source_sha256;             ///< 64 lowercase hex digits: SHA-256 of `source`
  std::uint64_t source_bytes = 0;        ///< size of `source`
  /// The request's `env`, names and values, shown to whoever approves: values steer code as
  /// much as its inputs do (a URL, a query), so a run under the approval must carry exactly
  /// these. Empty when the request set none.
  std::map<std::string, std::string> env;
  /// The host-held secrets the run asks for (`run_request::secrets`, in its order): each
  /// name, the domains it may be sent to and the header that would carry it, never the value.
  /// A run under the approval may use these or fewer. Empty when the request names none.
  std::vector<approval_secret> secrets;
  /// The level the run will get (at least `container`: network never runs weaker).
  sandbox::isolation isolation = sandbox::isolation::container;
  runtime_info runtime;  ///< runtime name and its installed image digest
  bool operator==(const approval_request&) const = default;
};

/// Everything a caller learns about one run. Codes, flags and counters come from the
/// sandbox's own evidence, never from what the code printed or how it exited.
struct run_result {
  std::uint32_t v = protocol_version;
  sandbox::code code = sandbox::code::internal;
  /// Short, sanitized explanation for humans and models: never a host path, a stack or a
  /// kernel version. Empty for a plain `ok`.
  std::string message;
  std::optional<int> exit_code;  ///< exit status of the main process, when it exited
  std::optional<int> signal;     ///< signal number that ended the main process, if any
  stream_capture std_out;        ///< wire name "stdout"
  stream_capture std_err;        ///< wire name "stderr"
  std::vector<output_file> files_out;
  std::vector<dropped_file> files_dropped;
  run_usage usage;
  std::uint32_t oom_kills = 0;           ///< processes killed by the run cgroup's OOM killer
  bool timeout_clamped = false;          ///< the requested timeout was lowered to a ceiling
  bool memory_clamped = false;           ///< the requested memory limit was lowered
  std::chrono::milliseconds timeout{0};  ///< the timeout that applied (wire: timeout_ms)
  std::uint64_t memory_limit_bytes = 0;  ///< the memory limit that applied
  sandbox::isolation isolation = sandbox::isolation::process;  ///< the level it ran at
  runtime_info runtime;
  /// Egress attempts in the order seen, at most 64; the rest are only counted.
  std::vector<egress_attempt> egress_attempts;
  std::uint32_t egress_attempts_dropped = 0;
  /// For `seccomp_violation`: the name of the forbidden system call, e.g. "ptrace".
  std::optional<std::string> violation;
  std::string run_id;  ///< unique id of this run, for correlating host logs and spans
  /// The mechanism that ran it and its version: "process", "crun 1.8.1", "runc 1.1.5+ds1",
  /// "runsc 0.0~20221219.0" (the OCI runtime's own `--version`). Empty when no backend ran
  /// (refused before a sandbox was made).
  std::string backend;
  /// Queue figures when the run was refused by the scheduler (`capacity`, `queue_timeout`);
  /// wire name "queue", `null` otherwise.
  std::optional<queue_info> queue;
  /// How long the run waited for a slot before it started (wire: queue_wait_ms).
  std::chrono::milliseconds queue_wait{0};
  /// For `approval_required`: the approval request the runtime would have asked (wire name
  /// "approval", `null` otherwise). The host checkpoints it, asks, mints the derived ticket
  /// with `ticket_issuer::derive`, and resubmits the same request under that ticket.
  std::optional<approval_request> approval;
  /// The run's signed execution receipt (sandbox/receipt.hpp): the receipt document, one
  /// line of JSON in its canonical form. Set when the runtime has a `receipt_signer` and a
  /// backend ran the run; wire name "receipt" (the document as a JSON object), absent
  /// otherwise.
  std::optional<std::string> receipt;
  bool operator==(const run_result&) const = default;
};

/// A request refused before anything started: an admission code (`invalid_request`,
/// `source_too_large`, `action_denied`, `runtime_unavailable`, `digest_mismatch`,
/// `blob_not_found`, `approval_required`, `approval_denied`) and a short message that names
/// the offending field.
struct rejection {
  sandbox::code code = sandbox::code::invalid_request;
  std::string message;
  bool operator==(const rejection&) const = default;
};

/// Lets `boost::system::result<T, rejection>::value()` throw (as `std::invalid_argument`
/// carrying the message) when called on a rejection. Prefer testing the result instead.
[[noreturn]] void throw_exception_from_error(const rejection& r, const boost::source_location& loc);

/// True when `id` is `sha256:` followed by exactly 64 lowercase hex digits.
constexpr bool is_valid_blob_id(std::string_view id) noexcept {
  constexpr std::string_view prefix = "sha256:";
  if (id.size() != prefix.size() + 64 || id.substr(0, prefix.size()) != prefix) return false;
  for (char c : id.substr(prefix.size())) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

/// Checks an input file name (see `input_file::name`). Returns an empty string when it is
/// acceptable, else a short reason such as "contains '/'".
std::string check_file_name(std::string_view name);

/// Escapes `bytes` for display: valid UTF-8 without control characters passes unchanged;
/// invalid bytes and control characters become `\xNN`. Used for summaries and messages
/// (file names: `escape_name_for_display`).
std::string escape_for_display(std::string_view bytes);

/// The display form of a file name (`dropped_file::name_display`): `name` unchanged when it
/// is valid UTF-8 without control characters or invisible formatting characters (bidi
/// controls such as U+202E, zero-width characters, U+FEFF, tags) — such names are unique as
/// they are; otherwise `escape_for_display`, with those formatting characters and each
/// backslash also escaped as `\xNN`, so that the form reads
/// back as exactly one name (`\xNN` is byte NN, every other character stands for itself)
/// and two distinct names never display alike. E.g. "a\nb" → `a\x0ab`, "a\\x0a\n" →
/// `a\x5cx0a\x0a`.
std::string escape_name_for_display(std::string_view name);

/// True when `bytes` is well-formed UTF-8 (no overlongs, no surrogates, max U+10FFFF).
bool is_valid_utf8(std::string_view bytes) noexcept;

}  // namespace sandbox
