// A run's face to its warm pool (private to src/): whether it is a ready, idle instance, and
// the pool's callbacks for its preparation, its loss and its run's start.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <utility>

#include "sandbox/span.hpp"

namespace sandbox::detail {

/// Why a warm-pool instance could not be prepared (`pool_instance::gone`).
struct prepare_failure {
  std::string why;  ///< the host-only text (empty: nothing more is known)
  /// A pre-started interpreter reported that importing a preload module raised: every
  /// instance of the class would fail the same way (the image is fixed for the pool's life).
  bool preload_raised = false;
};

/**
 * The warm-pool side of one run. A cold run is "activated" from the start and never calls
 * the pool; a warm-pool instance is prepared first (`expect`), becomes `ready` when
 * sandbox-init waits for its program, and is handed out (`hand_out`, `activate`) — or lost
 * idle, or fails preparing, which the pool hears of exactly once (`gone`).
 *
 * Thread-safety: `is_ready_idle`, `ready` and `activated` read atomics from any thread (the
 * pool's health check runs under the pool's lock); everything else on the run's strand. The
 * callbacks are called on the strand and may take the pool's lock.
 */
class pool_instance {
 public:
  /// A warm-pool instance: `on_prepared(ok, failure)` once preparing ended (`failure` says
  /// why when not ok), `on_lost()` if it dies idle after that.
  void expect(std::function<void(bool, const prepare_failure&)> on_prepared,
              std::function<void()> on_lost) {
    on_prepared_ = std::move(on_prepared);
    on_lost_ = std::move(on_lost);
  }
  /// Handed out: a loss is no longer the pool's; `on_started` (optional) once the program
  /// started or the run ended without starting.
  void hand_out(std::function<void()> on_started) {
    on_lost_ = nullptr;
    on_started_ = std::move(on_started);
  }
  /// The instance has its run (a cold run: from the start).
  void activate() noexcept { activated_ = true; }
  bool activated() const noexcept { return activated_.load(); }
  /// sandbox-init is set up and waits for its program.
  bool ready() const noexcept { return ready_.load(); }
  /// True while the instance is ready and idle (not handed out).
  bool is_ready_idle() const noexcept { return ready_.load() && !activated_.load(); }

  /// sandbox-init reported `ready`: the pool hears the preparation succeeded (once).
  void became_ready() {
    ready_ = true;
    call(on_prepared_, true, prepare_failure{});
  }
  /// The program started, or the run ended without starting (once).
  void started() { call(on_started_); }
  /// Logs a failed setup (`detail`: the host-only text) as loudly as it deserves:
  /// `on_purpose` (the run was cancelled, or the runtime is shutting down) makes an idle
  /// instance's loss silent and a preparing instance's drop a debug line; an idle instance
  /// that died is worth a warning (the pool replaces it); anything else is an error.
  void log_setup_failure(const std::string& detail, bool on_purpose,
                         const std::function<void(log_level, const std::string&)>& log) const {
    if (is_ready_idle()) {
      if (!on_purpose) log(log_level::warning, "idle warm-pool instance lost: " + detail);
    } else if (!activated() && on_purpose) {
      // A warm-pool instance still being prepared when the pool or the runtime went away.
      log(log_level::debug, "warm-pool instance dropped while preparing: " + detail);
    } else {
      log(log_level::error, detail);
    }
  }

  /// The instance is gone: the pool hears that preparing failed (and `f`, why), or that a
  /// ready instance was lost (once, whichever applies).
  void gone(const prepare_failure& f) {
    if (on_prepared_) {
      call(on_prepared_, false, f);
    } else if (on_lost_) {
      call(on_lost_);
    }
  }

 private:
  template <class F, class... Args>
  static void call(F& f, const Args&... args) {
    if (!f) return;
    auto g = std::move(f);
    f = nullptr;
    g(args...);
  }

  std::atomic<bool> ready_{false};
  std::atomic<bool> activated_{false};
  std::function<void(bool, const prepare_failure&)> on_prepared_;
  std::function<void()> on_lost_;
  std::function<void()> on_started_;
};

}  // namespace sandbox::detail
