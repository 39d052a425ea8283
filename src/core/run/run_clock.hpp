// The run's clock (private to src/): the three timers of one run's life — the setup budget
// (until the program starts), the deadline (the request's timeout, from `started`: user code
// only) and the exit grace (descendants that still hold the pipes after the main process
// exited) — and which of them are armed.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <utility>

namespace sandbox::detail {

/**
 * The timers of one run. Each pending wait holds the run (its owner, a strong reference),
 * like every other pending operation of the run: the run lives until its timers are done.
 * A hook is called only when its timer expired and was not cancelled before; a wait that
 * completed just before its cancel still calls it, so the hooks check the run's state.
 *
 * Thread-safety: strand only (the hooks run on the strand).
 */
class run_clock {
 public:
  using strand_type = boost::asio::strand<boost::asio::any_io_executor>;

  /// What each timer's expiry does to the run.
  struct hooks {
    std::function<void()> setup_expired;  ///< the setup budget ran out (the program not started)
    std::function<void()> deadline;       ///< the request's timeout passed since `started`
    std::function<void()> grace_over;     ///< the exit grace passed
  };

  /// `setup_budget`: the policy's setup budget, or the launcher's floor when that is longer
  /// (a VM boots).
  run_clock(strand_type strand, std::chrono::milliseconds setup_budget)
      : setup_(strand), deadline_(strand), grace_(strand), setup_budget_(setup_budget) {}

  /// Binds the run: `owner` is held by each pending wait, `h` is called on expiry.
  void bind(std::weak_ptr<void> owner, hooks h) {
    owner_ = std::move(owner);
    hooks_ = std::move(h);
  }

  /// The setup budget (ms) this clock was made with.
  std::chrono::milliseconds setup_budget() const noexcept { return setup_budget_; }

  /// (Re)starts the setup budget: a cold run's when its configuration went out, a warm-pool
  /// instance's again when it is handed out (an idle instance is not on the clock).
  void arm_setup() { arm(setup_, setup_budget_, hooks_.setup_expired); }

  /// The program started: the setup budget stops and the deadline (`timeout`) starts.
  void start_deadline(std::chrono::milliseconds timeout) {
    setup_.cancel();
    arm(deadline_, timeout, hooks_.deadline);
  }

  /// Starts the exit grace (`grace`), once per run: a later call does nothing.
  void arm_grace_once(std::chrono::milliseconds grace) {
    if (grace_armed_) return;
    grace_armed_ = true;
    arm(grace_, grace, hooks_.grace_over);
  }

  /// Stops the deadline and the exit grace (the run's processes are gone; what is left is a
  /// bounded wait of its own).
  void stop_run_timers() {
    deadline_.cancel();
    grace_.cancel();
  }

  /// Stops every timer (the run ends).
  void cancel_all() {
    setup_.cancel();
    stop_run_timers();
  }

 private:
  /// Arms `t` for `after`; its wait holds the owner (none left: nothing is armed).
  void arm(boost::asio::steady_timer& t, std::chrono::milliseconds after,
           const std::function<void()>& on_expired) {
    auto owner = owner_.lock();
    if (!owner) return;  // (the run is going away: nothing is left to time)
    t.expires_after(after);
    t.async_wait([owner = std::move(owner), &on_expired](boost::system::error_code ec) {
      if (!ec && on_expired) on_expired();
    });
  }

  boost::asio::steady_timer setup_, deadline_, grace_;  ///< the three timers
  std::chrono::milliseconds setup_budget_;              ///< as made
  std::weak_ptr<void> owner_;                           ///< the run (`bind`)
  hooks hooks_;                                         ///< the run's (`bind`)
  bool grace_armed_ = false;                            ///< the exit grace was armed (once per run)
};

}  // namespace sandbox::detail
