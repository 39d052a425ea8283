// Decoding sandbox-init's messages (init_events.hpp).
#include "core/run/init_events.hpp"

#include <fmt/format.h>

#include <cstring>
#include <utility>
#include <vector>

#include "core/run/init_messages.hpp"
#include "protocol/display_text.hpp"

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
    case ip::msg::failed: {
      // "<step name>" or "<step name>\0<detail>"; the detail is shown in display form.
      const auto nul = payload.find('\0');
      const std::string_view name = payload.substr(0, nul);
      const std::string_view detail =
          nul == std::string_view::npos ? std::string_view() : payload.substr(nul + 1);
      const auto s = static_cast<ip::step>(h.a);
      const std::string head =
          fmt::format("sandbox-init step {} ({}) failed: ", quote_name(name), describe_step(s));
      if (s == ip::step::prestart && h.b == 0 && !detail.empty()) {
        // The loader's report: the module (host configuration) and the exception's summary.
        const auto nl = detail.find('\n');
        const std::string_view module = detail.substr(0, nl);
        const std::string_view summary =
            nl == std::string_view::npos ? std::string_view() : detail.substr(nl + 1);
        return sink.failed(head + fmt::format("importing preload module {} raised {}",
                                              quote_name(module), quote_name(summary)),
                           true);
      }
      if (!detail.empty()) return sink.failed(head + quote_name(detail), false);
      return sink.failed(head + std::strerror(static_cast<int>(h.b)), false);
    }
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
