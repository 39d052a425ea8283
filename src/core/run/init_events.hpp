// What sandbox-init says on the control channel, decoded (private to src/): one call per
// message kind, with the descriptors it carries as owned `unique_fd`s. The dispatcher checks
// the message's shape (the descriptors it must carry, the kinds this channel may carry) and
// nothing of the run's state, so it is unit-tested on its own
// (tests/unit/core/run/init_events_test.cpp); the run machine implements `init_events`.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "sys/unique_fd.hpp"
#include "wire/init_protocol.hpp"

namespace sandbox::detail {

/**
 * The receiver of sandbox-init's messages (and a guest agent's frames on the same channel).
 * Everything it is handed is untrusted: it comes from inside the sandbox. Called on the
 * run's strand, one call per message; a descriptor the receiver does not keep closes when
 * its `unique_fd` goes.
 */
class init_events {
 public:
  virtual ~init_events() = default;

  /// `ready`: sandbox-init is set up and waits for its program. `out_dir`: the output
  /// tmpfs (none when the launcher made the output directory on the host); `dns`: the DNS
  /// sink's socket (none in stream mode, where sandbox-init serves the sink).
  virtual void ready(unique_fd out_dir, unique_fd dns) = 0;
  /// `egress_proxy`: the egress proxy's listening socket, made in the run's network
  /// namespace (always a descriptor; whether one was asked for is the run's to judge).
  virtual void egress_proxy(unique_fd listener) = 0;
  /// `started`: the program runs. `init_times`: sandbox-init's phase timestamps (text);
  /// `listener`: the seccomp listener (none in stream mode only).
  virtual void started(std::string_view init_times, unique_fd listener) = 0;
  /// `exited`: the main process's wait status.
  virtual void exited(int status) = 0;
  /// `dns` (stream mode only): the name a DNS query asked for, escaped by sandbox-init.
  virtual void dns(std::string_view payload) = 0;
  /// `quiet` (stream mode only): the main process was reported and no process is left.
  virtual void quiet() = 0;
  /// `stdin_ack`: `bytes` more were written into the program's stdin pipe (not checked).
  virtual void stdin_ack(std::uint32_t bytes) = 0;
  /// `stdin_closed`: the program closed its stdin.
  virtual void stdin_closed() = 0;
  /// `failed`: a setup step failed; `text` names the step, what it needs and the errno (or
  /// sandbox-init's detail). `preload_raised`: a pre-started interpreter reported that
  /// importing a preload module raised (`text` names the module and the exception) — every
  /// instance of its class would fail the same way.
  virtual void failed(const std::string& text, bool preload_raised) = 0;
  /// A guest agent's own frame (type ≥ 100, wire/guest_protocol.hpp), on a channel that
  /// has a guest agent.
  virtual void agent_frame(const init_protocol::init_header& h, std::string_view payload) = 0;
  /// A message whose shape this channel does not allow (a missing descriptor, an agent
  /// frame without a guest agent); `text` says which, for the host log.
  virtual void protocol_error(const std::string& text) = 0;
};

/// What the channel carrying the messages is.
struct init_channel_shape {
  bool stream_control = false;  ///< the launcher's stream_control(): no descriptors, `dns`, `quiet`
  bool guest_agent = false;     ///< a guest agent (microvm) shares the channel
};

/**
 * Decodes one message (`h`, `payload`, the descriptors `fds` it carried) into one call on
 * `sink`. Takes every descriptor of `fds` (each entry becomes -1): the ones the message
 * carries are handed over, the others are closed, on every path. Kinds sandbox-init never
 * sends (and `dns`, `quiet` outside stream mode) are ignored; so is a value out of range
 * (an unknown step or errno is described as such).
 */
void dispatch_init_message(const init_protocol::init_header& h, std::string_view payload,
                           std::span<int> fds, init_channel_shape shape, init_events& sink);

}  // namespace sandbox::detail
