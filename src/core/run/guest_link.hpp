// The run machine's side of a guest agent (microvm; private to src/): the agent's channel,
// the request to finish, and the wait for the streams the agent counted.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "core/run/control_channel.hpp"
#include "core/run/guest_stream_wait.hpp"
#include "core/run/launcher.hpp"
#include "core/run/stream_reader.hpp"
#include "core/run/workspace.hpp"
#include "wire/init_protocol.hpp"

namespace sandbox::detail {

/**
 * One run's link to its guest agent (microvm), or nothing (every other level: `active()` is
 * false and the run never asks more of it). A guest cannot see the host's workspace, so the
 * staged files travel as frames; at the deadline or the exit grace the agent is asked to
 * kill what is left of the run in the guest and send the outputs (`finish`,
 * wire/guest_protocol.hpp), bounded by a quarter of the launcher's `min_setup_budget`; its
 * `usage` counted what each stream carried, which the run waits for (guest_stream_wait.hpp).
 * Everything the agent sends is untrusted: its channel checks each frame, and a refusal
 * ends the run (`refused`).
 *
 * Thread-safety: strand only. Lifetime: the agent's own I/O reports through the weak owner
 * given to `attach`; the finish wait holds the run (a strong reference) like the run's own
 * timers; the stream wait holds the owner given to `wait_streams`.
 */
class guest_link {
 public:
  /// `min_setup_budget`: the launcher's (bounds the finish wait and the stream wait).
  guest_link(boost::asio::strand<boost::asio::any_io_executor> strand,
             std::chrono::milliseconds min_setup_budget);

  /// Takes the launch's agent channel (`agent` may be null: no guest). Its initial frames are
  /// queued on `ctl` ahead of the configuration; its own I/O starts (microvm: a network
  /// run's egress tunnel) and its faults go to `refused` while `owner` lives.
  void attach(std::unique_ptr<agent_channel> agent, control_channel& ctl, std::weak_ptr<void> owner,
              std::function<void(std::string)> refused);
  /// True when the run has a guest agent.
  bool active() const noexcept { return agent_ != nullptr; }
  /// The agent (usage, dropped outputs), or nullptr.
  const agent_channel* agent() const noexcept { return agent_.get(); }

  /// Sends the staged files of `ws` as frames (the agent forwards `go` only after them).
  /// Returns why it failed, or empty.
  std::string send_files(const run_workspace& ws, control_channel& ctl);
  /// A frame of the agent's own (type ≥ 100): empty, or why its channel refused it.
  std::string on_frame(const init_protocol::init_header& h, std::string_view payload) {
    return agent_->on_frame(h, payload);
  }

  /// Stream mode: `quiet` arrived (the guest will send nothing more of the run).
  void note_quiet() noexcept { quiet_seen_ = true; }
  /// True once the agent was asked to finish the run.
  bool finish_sent() const noexcept { return finish_sent_; }
  /**
   * The deadline or the exit grace ended a started run: asks the agent to finish (once, while
   * `ctl` is open and no `quiet` came). True when asked: the run then ends at the agent's
   * `quiet`, or `on_timeout` runs (on the strand, holding `keep`) when it does not come in
   * time. False: the run ends now.
   */
  bool ask_finish(control_channel& ctl, std::shared_ptr<void> keep,
                  std::function<void()> on_timeout);

  /// True while the counted streams are still to be waited for.
  bool streams_unsettled() const noexcept { return active() && !streams_.settled(); }
  /// Waits for `out` and `err` to reach the agent's counts (the finish wait stops).
  void wait_streams(const stream_reader& out, const stream_reader& err, std::weak_ptr<void> owner,
                    guest_stream_wait::hooks h);
  /// A read happened on a stream (checks the wait again).
  void progress() { streams_.progress(); }
  /// Says in `r` what the guest counted and never arrived.
  void note_shortfall(run_result& r) const { streams_.note_shortfall(r); }
  /// The run ends: both waits stop.
  void cancel() {
    timer_.cancel();
    streams_.cancel();
  }

 private:
  boost::asio::strand<boost::asio::any_io_executor> strand_;
  std::unique_ptr<agent_channel> agent_;
  boost::asio::steady_timer timer_;  ///< bounds the wait for the outputs after `finish`
  std::chrono::milliseconds finish_wait_;
  guest_stream_wait streams_;
  bool quiet_seen_ = false;   ///< stream mode: `quiet` arrived
  bool finish_sent_ = false;  ///< the agent was told to end the run
};

}  // namespace sandbox::detail
