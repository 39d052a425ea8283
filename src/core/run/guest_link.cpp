// The run machine's side of a guest agent (guest_link.hpp).
#include "core/run/guest_link.hpp"

#include <cstdint>

#include "wire/guest_protocol.hpp"

namespace sandbox::detail {

namespace asio = boost::asio;
namespace ip = init_protocol;

guest_link::guest_link(asio::strand<asio::any_io_executor> strand,
                       std::chrono::milliseconds min_setup_budget)
    : strand_(strand),
      timer_(strand),
      finish_wait_(min_setup_budget / 4),
      streams_(strand, min_setup_budget) {}

void guest_link::attach(std::unique_ptr<agent_channel> agent, control_channel& ctl,
                        std::weak_ptr<void> owner, std::function<void(std::string)> refused) {
  agent_ = std::move(agent);
  if (!agent_) return;
  ctl.queue_framed(agent_->initial_frames());  // sent ahead of the configuration
  // The agent's own I/O (microvm: a network run's egress tunnel); its faults are the
  // guest's, like a refused agent frame.
  agent_->start(strand_, [owner = std::move(owner), refused = std::move(refused)](std::string why) {
    if (auto self = owner.lock()) refused(std::move(why));
  });
}

std::string guest_link::send_files(const run_workspace& ws, control_channel& ctl) {
  auto frames = agent_->file_frames(ws);
  if (!frames) return "workspace: " + frames.error().message();
  if (!ctl.send_framed(*frames)) return "sending the files to the guest failed";
  return {};
}

bool guest_link::ask_finish(control_channel& ctl, std::shared_ptr<void> keep,
                            std::function<void()> on_timeout) {
  if (!agent_ || ctl.closed() || quiet_seen_ || finish_sent_) return false;
  finish_sent_ = true;
  ip::init_header h{static_cast<ip::msg>(static_cast<std::uint32_t>(guest_protocol::msg::finish)),
                    0, 0};
  std::string packet(reinterpret_cast<const char*>(&h), sizeof h);
  if (ctl.send_packet(packet, {}) != 0) return false;
  timer_.expires_after(finish_wait_);
  timer_.async_wait(
      [keep = std::move(keep), on_timeout = std::move(on_timeout)](boost::system::error_code ec) {
        if (!ec) on_timeout();
      });
  return true;
}

void guest_link::wait_streams(const stream_reader& out, const stream_reader& err,
                              std::weak_ptr<void> owner, guest_stream_wait::hooks h) {
  timer_.cancel();
  h.usage = [this] { return agent_->usage(); };
  streams_.begin(out, err, std::move(owner), std::move(h));
}

}  // namespace sandbox::detail
