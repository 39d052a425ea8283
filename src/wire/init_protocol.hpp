// The control channel between the host and `sandbox-init` (private to src/).
//
// A SOCK_SEQPACKET socketpair: the host keeps one end, sandbox-init gets the other as fd 3.
// Every message is one packet: a fixed `init_header`, then an optional payload; descriptors
// travel as SCM_RIGHTS. sandbox-init treats the channel as its lifeline: when the host end
// closes (the host died), it exits at once, which kills every process of its pid namespace.
//
// Flow of one run:
//   host → init   config     (after the host put init into the run's cgroup and, for a user
//                             namespace, wrote its uid/gid maps): everything but the program
//   init → host   ready      fds: [output dir (O_RDONLY|O_DIRECTORY), DNS sink UDP socket]
//   host → init   go         argv and env of the program. A cold run sends it right after
//                             config; a warm-pool instance waits, ready, until it is handed
//                             out (its inputs and source are staged into the already-bound
//                             workspace files first). Either way init runs the same steps.
//                             `egress_proxy=<port>` (network runs only): see below.
//                             `run_ca_pem=<PEM>` (runs with secrets): init writes it to
//                             `run_ca_path` (root's, mode 0444) before the program starts.
//                             `node_proxy_preload=<JS>` (network runs where the launcher
//                             has no file of it, the microvm level): likewise, to
//                             `node_proxy_path`, which NODE_OPTIONS then requires.
//   init → host   egress_proxy  fds: [a TCP socket listening on 127.0.0.1:<port> in the run's
//                             network namespace], sent before the program starts; the host
//                             serves the run's egress proxy on it (core/egress_proxy.hpp)
//   init → host   started    fds: [seccomp user-notification listener]; a = pid (inside)
//   init → host   exited     a = wait status of the main process
//   init → host   failed     a = setup step, b = errno; payload = step name, optionally a NUL
//                            and a detail (host logs only; `step::prestart`)
//   init → host   quiet      the main process exited and nothing of the run is left
//   init → host   dns        (stream mode only) a DNS query's name
// `go` with a = 1 (sessions, sandbox/session.hpp) carries the program's stdin: the read end of
// a pipe whose write end the host keeps (SCM_RIGHTS); without it stdin is /dev/null.
// Stream mode cannot carry a descriptor: there `go` with a = 1 makes sandbox-init create the
// pipe itself (the read end becomes the program's fd 0) and the stdin bytes travel through
// the control stream, under a credit window:
//   host → init   stdin_data   payload = 1..stdin_chunk bytes for the program's stdin
//   host → init   stdin_close  once the host's bytes are all sent: EOF for the program
//   init → host   stdin_ack    a = bytes of earlier stdin_data written into the pipe
//   init → host   stdin_closed the program closed its stdin (EPIPE): later bytes are dropped
// The host never has more than `stdin_window` bytes sent and not acknowledged, so sandbox-init
// holds at most that much (a host that sends more is a protocol fault: sandbox-init exits),
// and a program that never reads leaves the host's writes waiting on its bounded buffer. The
// host checks every ack (never more than is outstanding, only in a stream-mode session).
// `config` with a = 1 carries the program's stdout and stderr pipes (SCM_RIGHTS) for a
// launcher whose runtime would hold them otherwise (launcher_traits::stdio_over_control).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace sandbox::detail::init_protocol {

/// File descriptor numbers sandbox-init starts with.
inline constexpr int control_fd = 3;
/// Only in self-test mode: sandbox-init's own executable, for the in-sandbox probe.
inline constexpr int self_exec_fd = 4;

enum class msg : std::uint32_t {
  config = 1,
  go = 2,
  ready = 10,
  started = 11,
  exited = 12,
  failed = 13,
  dns = 14,    ///< payload = the name a DNS query asked for (stream mode: init serves the sink)
  quiet = 15,  ///< the main process was reported and no process of the run is left
  egress_proxy = 16,  ///< fds: [the egress proxy's listening socket, in the run's netns]
  // Stream-mode sessions only (see the flow above):
  stdin_data = 3,     ///< host → init: payload = bytes for the program's stdin
  stdin_close = 4,    ///< host → init: no more bytes; close the pipe once they are written
  stdin_ack = 17,     ///< init → host: a = bytes written into the program's stdin pipe
  stdin_closed = 18,  ///< init → host: the program closed its stdin (EPIPE)
};

/// Largest `stdin_data` payload (bytes).
inline constexpr std::uint32_t stdin_chunk = 16 * 1024;
/// Most stdin bytes the host may have sent and not yet seen acknowledged (bytes): what
/// sandbox-init holds at most besides the pipe.
inline constexpr std::uint32_t stdin_window = 64 * 1024;

/// Stream mode (a launcher whose runtime cannot pass descriptors, e.g. runsc: the control
/// channel is sandbox-init's stdin, a SOCK_STREAM socket): every packet is preceded by its
/// length (u32, host order), no descriptors travel, sandbox-init serves the DNS sink itself
/// and reports each query as `dns`, and the program's end of output is `quiet` (the
/// runtime holds the capture pipes too, so the host never sees them close).
inline constexpr const char* control_stdin_arg = "--control-stdin";

/// Setup steps, reported in `failed` messages.
enum class step : std::uint32_t {
  config = 1,
  cgroup_namespace,
  mount_private,
  root_tmpfs,
  rootfs_bind,
  proc,
  dev,
  tmpfs,
  inputs,
  outputs,
  source,
  etc_files,
  hostname,
  loopback,
  dns_socket,
  pivot_root,
  remount_readonly,
  fork,
  rlimits,
  drop_privileges,
  no_new_privs,
  seccomp,
  exec,
  drop_init_privileges,
  egress_proxy,
  run_ca,
  /// A pre-started interpreter died before it was ready (detail: how), or a preload module's
  /// import raised (errno 0; detail: "<module>\n<exception summary>", from inside the sandbox)
  prestart,
  /// Writing the Node proxy preload (`go`'s `node_proxy_preload`).
  node_proxy,
};

/// Where sandbox-init writes a run's CA certificate (`go`'s `run_ca_pem`), read-only, and
/// what SSL_CERT_FILE, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE and NODE_EXTRA_CA_CERTS name.
inline constexpr const char* run_ca_path = "/tmp/sandbox-run-ca.pem";

/// Where sandbox-init writes `go`'s `node_proxy_preload` (root's, mode 0444, in the sticky
/// /tmp), for a launcher whose runs have no file of it (`launcher_traits::
/// node_proxy_preload_in_go`).
inline constexpr const char* node_proxy_path = "/tmp/sandbox-node-proxy.cjs";

/// Port of the egress proxy on the run's loopback (HTTP_PROXY=http://127.0.0.1:3128).
inline constexpr std::uint16_t egress_proxy_port = 3128;

struct init_header {
  msg type;
  std::uint32_t a;
  std::int64_t b;
};

/// Largest packet either side sends or accepts.
inline constexpr std::size_t max_packet = 256 * 1024;

/// Appends one length-prefixed stream frame to `out`: u32 length (host order; the header
/// and the payload), the header, the payload. Stream mode's framing, which the microvm
/// level's guest channel and egress tunnel (guest_protocol.hpp) use too; the caller keeps
/// the payload within its channel's cap.
inline void append_frame(std::string& out, std::uint32_t type, std::uint32_t a, std::int64_t b,
                         std::string_view payload) {
  const init_header h{static_cast<msg>(type), a, b};
  const auto len = static_cast<std::uint32_t>(sizeof h + payload.size());
  out.append(reinterpret_cast<const char*>(&len), sizeof len);
  out.append(reinterpret_cast<const char*>(&h), sizeof h);
  out.append(payload);
}

/// The configuration, as NUL-separated "key=value" strings (repeated keys keep their order:
/// `argv`, `env`). Simple enough to parse in the helper without allocating surprises.
class config_writer {
 public:
  void add(std::string_view key, std::string_view value) {
    buf_.append(key);
    buf_.push_back('=');
    buf_.append(value);
    buf_.push_back('\0');
  }
  void add(std::string_view key, std::uint64_t value) { add(key, std::to_string(value)); }
  const std::string& bytes() const noexcept { return buf_; }

 private:
  std::string buf_;
};

/// Splits a config payload into (key, value) pairs. Entries without '=' are skipped.
inline std::vector<std::pair<std::string_view, std::string_view>> parse_config(
    std::string_view payload) {
  std::vector<std::pair<std::string_view, std::string_view>> out;
  while (!payload.empty()) {
    auto end = payload.find('\0');
    std::string_view entry = payload.substr(0, end);
    auto eq = entry.find('=');
    if (eq != std::string_view::npos) out.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
    if (end == std::string_view::npos) break;
    payload.remove_prefix(end + 1);
  }
  return out;
}

}  // namespace sandbox::detail::init_protocol
