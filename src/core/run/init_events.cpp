// Decoding sandbox-init's messages (init_events.hpp).
#include "core/run/init_events.hpp"

#include <fmt/format.h>

#include <cstring>
#include <utility>
#include <vector>

#include "core/run/init_messages.hpp"

namespace sandbox::detail {

namespace ip = init_protocol;

void dispatch_init_message(const ip::init_header& h, std::string_view payload, std::span<int> fds,
                           init_channel_shape shape, init_events& sink) {
  // Every descriptor is owned from here on: the ones the message does not hand over close as
  // `owned` goes, whichever way the message ends.
  std::vector<unique_fd> owned;
  owned.reserve(fds.size());
  for (int& fd : fds) owned.emplace_back(std::exchange(fd, -1));
  auto take = [&](std::size_t i) { return i < owned.size() ? std::move(owned[i]) : unique_fd(); };

  switch (h.type) {
    case ip::msg::ready: {
      unique_fd out_dir = take(0);
      return sink.ready(std::move(out_dir), take(1));
    }
    case ip::msg::egress_proxy:
      if (unique_fd l = take(0)) return sink.egress_proxy(std::move(l));
      return sink.protocol_error("unexpected egress proxy socket from sandbox-init");
    case ip::msg::started: {
      unique_fd l = take(0);
      if (!l && !shape.stream_control) {
        return sink.protocol_error("no seccomp listener from sandbox-init");
      }
      return sink.started(payload, std::move(l));
    }
    case ip::msg::exited:
      return sink.exited(static_cast<int>(h.a));
    case ip::msg::dns:
      // Stream mode only: else the host serves the sink, and this is no report of ours.
      if (shape.stream_control) sink.dns(payload);
      return;
    case ip::msg::quiet:
      // Stream mode only: else the capture pipes' end is what the run waits for.
      if (shape.stream_control) sink.quiet();
      return;
    case ip::msg::stdin_ack:
      return sink.stdin_ack(h.a);
    case ip::msg::stdin_closed:
      return sink.stdin_closed();
    case ip::msg::failed:
      return sink.failed(fmt::format("sandbox-init step '{}' ({}) failed: {}", payload,
                                     describe_step(static_cast<ip::step>(h.a)),
                                     std::strerror(static_cast<int>(h.b))));
    default:
      // A guest agent's own frames (microvm, wire/guest_protocol.hpp): untrusted; its
      // channel checks them. Any other type is none sandbox-init sends: ignored.
      if (static_cast<std::uint32_t>(h.type) < 100) return;
      if (!shape.guest_agent) {
        return sink.protocol_error("unexpected agent message on the control channel");
      }
      return sink.agent_frame(h, payload);
  }
}

}  // namespace sandbox::detail
