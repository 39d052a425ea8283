// The wait for a guest agent's stream counts (microvm), on the run's strand.
#pragma once

#include <algorithm>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/run/guest_streams.hpp"
#include "core/run/launcher.hpp"
#include "core/run/stream_reader.hpp"
#include "sandbox/backend.hpp"
#include "sandbox/span.hpp"

namespace sandbox::detail {

/**
 * A guest agent's `usage` counted the bytes the program wrote to each stream at the guest's
 * relay; the ports deliver them on their own way, so some may still be in flight (in the
 * VMM, in the sockets) when `quiet` arrives. The run goes on once the captures hold the
 * counts — or, bounded (judge_guest_streams, guest_streams.hpp), when no byte came for
 * `stall`, when `max` passed, or when a stream ended short: the counts are untrusted and a
 * guest could claim any number. A shortfall is logged and said in the result (the stream is
 * flagged truncated); a capture past the count is only logged (it holds what really came).
 *
 * Thread-safety: strand only. Lifetime: its pending timer holds the owner given to `begin`.
 */
class guest_stream_wait {
 public:
  /// No byte for this long ends the wait.
  static constexpr auto stall = std::chrono::seconds(3);

  /// What the wait asks and tells its run; each is called on the strand.
  struct hooks {
    std::function<std::optional<guest_usage>()> usage;       ///< the guest's report, if it came
    std::function<void(log_level, const std::string&)> log;  ///< host log
    std::function<void()> settled;  ///< the wait is over (the run goes on to its end)
    std::function<bool()> stopped;  ///< the run is ending: the wait stops
  };

  /// `max_setup_floor`: the launcher's `min_setup_budget` (the wait's bound is the larger of
  /// 10 s and a quarter of it).
  guest_stream_wait(boost::asio::strand<boost::asio::any_io_executor> strand,
                    std::chrono::milliseconds max_setup_floor)
      : timer_(strand),
        max_(std::max<std::chrono::milliseconds>(std::chrono::seconds(10), max_setup_floor / 4)) {}

  /// Starts waiting for `out` and `err` (they outlive the wait) to reach the counts.
  void begin(const stream_reader& out, const stream_reader& err, std::weak_ptr<void> owner,
             hooks h);
  /// A read happened on a stream: checks again while waiting.
  void progress() {
    if (awaiting_) check();
  }
  /// True once the wait is over (it runs at most once per run).
  bool settled() const noexcept { return settled_; }
  /// Stops the timer (the run ends).
  void cancel() { timer_.cancel(); }
  /// Bytes the guest counted that never reached a capture: the stream is flagged truncated
  /// (the result does not hold all of it) and the message says how many bytes are missing.
  /// total_bytes stays what the host received.
  void note_shortfall(run_result& r) const;

 private:
  void check();

  boost::asio::steady_timer timer_;
  std::chrono::milliseconds max_;
  const stream_reader* out_ = nullptr;
  const stream_reader* err_ = nullptr;
  std::weak_ptr<void> owner_;
  hooks h_;
  bool awaiting_ = false, settled_ = false;
  std::chrono::steady_clock::time_point since_, last_progress_;
  std::uint64_t seen_ = 0;
  /// Bytes the guest counted on stdout / stderr that never reached the capture (0: none).
  std::uint64_t stdout_missing_ = 0, stderr_missing_ = 0;
};

}  // namespace sandbox::detail
