// The host ↔ guest agent channel of the microvm level (private to src/).
//
// The guest agent (src/helpers/guest, `sandbox-guest`) is PID 1 of the microVM. It plays the
// part an OCI runtime plays for sandbox-init: it builds the run's filesystem and cgroup inside
// the guest, then starts sandbox-init in stream mode (init_protocol.hpp) and relays that
// channel. One virtio-serial port carries everything, as the stream mode's frames:
//
//     u32 length (host order; both ends run on the same architecture) · init_header · payload
//
// where `length` counts the header and the payload and never exceeds
// init_protocol::max_packet. Message types below 100 are sandbox-init's own, relayed unchanged
// in both directions once the agent has started sandbox-init; types from 100 are the agent's.
// Everything the guest sends is untrusted: the host checks every length, name and count again
// (a guest kernel the code took over can send anything).
//
// Ports (virtio-serial port names, /sys/class/virtio-ports/*/name in the guest):
//   "sandbox.ctl"     this channel
//   "sandbox.stdout"  the program's stdout: bytes, guest → host. The program writes to a pipe
//                     the agent relays to this port (bounded buffer, so a slow host still
//                     throttles the program), counting the bytes
//   "sandbox.stderr"  the program's stderr: the same
//   "sandbox.net"     network runs only (setup `network=1`; the port exists only then): the
//                     egress tunnel, `net_msg` frames below, both directions
//
// Flow of one run:
//   agent → host  agent_ready  a = guest_protocol::version; payload: "key=value\0" pairs for
//                              the host log only (kernel release)
//   host → agent  setup        payload: "key=value\0" pairs (setup_keys below): the run's
//                              limits and sizes the agent applies before sandbox-init starts
//   agent → host  agent_failed a = agent_step, b = errno; payload: what failed (host log)
//   (from here on sandbox-init's frames are relayed: host → init config … go, init → host
//    ready, started, exited, dns, quiet, failed)
//   host → agent  file_open / file_data* / file_close   (any number, before `go`): a file to
//                              place under the guest's workspace (the source, inputs). `go`
//                              is forwarded to sandbox-init only after every file is closed.
//   agent → host  file_open / file_data* / file_close   (after sandbox-init's `quiet`, before
//                              the agent forwards it): the run's output files, collected in
//                              the guest without following links
//   agent → host  file_dropped (interleaved with those file frames, same time): an output
//                              entry the agent did not send (over a cap, not a regular
//                              file), so the result lists it in files_dropped as the host
//                              levels' collector does
//   agent → host  usage        payload: "key=value\0" pairs (usage_keys): the guest cgroup's
//                              figures and the stream byte counts, sent just before the
//                              agent's `quiet` — which it sends for sandbox-init's once both
//                              output pipes reached EOF (every byte counted). The host
//                              completes the run once its capture holds the counts (bounded)
//   host → agent  finish       (only when the host's deadline or exit grace ends the run
//                              before sandbox-init's `quiet`): the agent kills the guest's
//                              run cgroup, then sends the outputs, usage and its own quiet
// A warm-pool VM stops after `ready`: its files and `go` come when it is handed out.
#pragma once

#include <cstdint>

#include "wire/init_protocol.hpp"

namespace sandbox::detail::guest_protocol {

/// Version of this protocol; `agent_ready` carries it and the host refuses any other.
inline constexpr std::uint32_t version = 1;

/// Port names (virtio-serial `name=`).
inline constexpr const char* ctl_port = "sandbox.ctl";
inline constexpr const char* stdout_port = "sandbox.stdout";
inline constexpr const char* stderr_port = "sandbox.stderr";
/// Network runs only: the egress tunnel (see "The egress tunnel" below).
inline constexpr const char* net_port = "sandbox.net";

/// Agent message types (init_header::type values from 100; sandbox-init's are below).
enum class msg : std::uint32_t {
  agent_ready = 100,
  setup = 101,
  agent_failed = 102,
  /// payload = relative path ('/'-separated, no "." or ".." component, no empty component,
  /// ≤ 255 bytes per component); a = file mode bits (0400 | 0200 | 0100 only); b = size
  /// in bytes, which the data frames must match exactly.
  file_open = 103,
  /// payload = the next bytes of the open file (at most max_packet - header).
  file_data = 104,
  /// closes the open file; a = 0.
  file_close = 105,
  usage = 106,
  /// host → agent: the host's deadline or exit grace ended the run while processes of it
  /// are still alive in the guest. The agent kills the guest's run cgroup (sandbox-init with
  /// it), then sends the outputs, `usage` and a `quiet` of its own, as after sandbox-init's.
  finish = 107,
  /// agent → host, among the output files: an entry of the output directory the agent did
  /// not send. payload = its name (one component as the guest read it: 1..255 bytes, no '/'
  /// or NUL, not "." or ".."); a = the reason (`dropped` below: the host collector's reasons
  /// the guest can have; the store's are the host's own); b = 0. The agent judges entries in
  /// the collector's order (the name, the type without following, the count cap, the byte
  /// cap), so a bad name never uses up the count cap, and sends at most `max_dropped`. The
  /// host refuses a name that is not one component, a reason out of range, `bad_name` for a
  /// plain name (a bad name is `bad_name` whatever the guest says), a name twice (sent or
  /// dropped), more than `max_dropped`, and any after `usage`.
  file_dropped = 108,
};

/// Most file_dropped frames of one run: the host collector's scan limit
/// (collect_limits::max_scan_entries), so a guest can list no more than a host level would.
inline constexpr std::uint32_t max_dropped = 65536;

/// file_dropped reasons: the values of sandbox::drop_reason (the host static_asserts that they
/// match), spelled here because the statically linked agent does not include the public API.
enum class dropped : std::uint32_t {
  count_limit = 0,
  bytes_limit = 1,
  not_regular_file = 2,
  bad_name = 3,  ///< not UTF-8, or control / invisible formatting characters (is_display_safe_name)
};

/// Setup steps of the agent, reported in `agent_failed`.
enum class agent_step : std::uint32_t {
  modules = 1,
  ports,
  image_disk,
  mounts,
  cgroup,
  setup_message,
  files,
  start_init,
  outputs,
};

// `setup` keys (all decimal unless noted):
//   memory_bytes, pids, cpu_quota_us, cpu_period_us   the guest cgroup's limits
//   tmp_bytes, out_bytes, shm_bytes                    tmpfs sizes (/tmp, output dir, /dev/shm)
//   out_files                                          most output files the agent sends
//   uid, gid                                           the program's ids inside the guest
//   network=0|1                                        1: a network run (the egress tunnel)
// `usage` keys: memory_peak_bytes, cpu_usec (the run cgroup's CPU since sandbox-init's
// `started`: its set-up before the program is not the program's), oom_kills, pids_peak;
// stdout_bytes, stderr_bytes
// (every byte the program wrote to each stream, as the agent's relay read it from the pipe;
// the host refuses a `usage` without them).

// --- The egress tunnel ("sandbox.net", network runs only) -------------------------------
//
// The guest has no network device, ever. In a network run the agent listens on
// 127.0.0.1:init_protocol::egress_proxy_port inside the run's network namespace (the one it
// cloned sandbox-init into; loopback is the only interface there), where HTTP_PROXY points.
// Each connection it accepts becomes a numbered tunnel connection on the net port; the host
// connects each to the run's egress proxy (core/egress_proxy.hpp), served on a listener in a
// network namespace the host made for the run, exactly as for the gvisor level. So the proxy,
// its grant checks and its `egress_attempts` records are the other levels' own.
//
// Frames: the control channel's format (u32 length · init_header · payload), `type` from
// `net_msg`, `a` = the connection id; `length` ≤ sizeof(init_header) + net_chunk.
//   guest → host  open   b = 0, no payload: a new connection. Ids start at 1 and each open's
//                        id is larger than every earlier one (never reused).
//   both ways     data   payload = 1..net_chunk bytes of the connection.
//   both ways     eof    the sender will send no more data (a half-close: the receiver shuts
//                        down its socket's write side once the data before it is written).
//   both ways     close  the connection is gone (error, refused, or both eofs done); the
//                        receiver closes its socket and ignores later frames of the id.
//   both ways     ack    b = 1..net_window: bytes of the other side's data written into the
//                        receiver's socket since its last ack.
// Flow control: neither side sends data beyond `net_window` bytes not yet acknowledged, per
// connection and direction, so a slow connection holds at most a window on each side and
// never blocks the others; both sides always read the port. Acks are coalesced (at most one
// queued per connection). The host treats every guest frame as hostile: an unknown type, an
// oversized frame, an id that is reused, out of order or never opened, data or eof after
// eof, data past the window, an ack beyond what is outstanding, or more than
// `net_max_connections` open at once end the run `internal`. Frames of an id the host
// already closed are ignored (they may cross its close). The guest closes a connection
// whose host frames break these rules.
enum class net_msg : std::uint32_t {
  open = 200,
  data = 201,
  eof = 202,
  close = 203,
  ack = 204,
};

/// Largest data payload of one net frame (bytes).
inline constexpr std::uint32_t net_chunk = 16 * 1024;
/// Unacknowledged data per connection and direction (bytes).
inline constexpr std::uint32_t net_window = 64 * 1024;
/// Connections open at once (the agent stops accepting at this many; the host refuses more).
inline constexpr std::uint32_t net_max_connections = 64;

}  // namespace sandbox::detail::guest_protocol
