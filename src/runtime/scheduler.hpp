// The multi-tenant scheduler (private to src/; policy in include/sandbox/scheduler.hpp).
//
// A run asks for a slot with `submit`; it gets one (a `slot` it holds until the run is over)
// or a rejection (`capacity` at once; `queue_timeout` after its deadline), exactly once, on
// the scheduler's executor — never inline. Slots count runs that are starting as well as
// running. Dispatch is a weighted round robin over the tenants with queued work that are
// under their cap: each tenant in the ring gets `weight` dispatches per turn, a tenant at its
// cap leaves the ring until one of its slots is released, so a flood from one tenant only
// delays that tenant. Deadlines are kept in one ordered index with one timer, so thousands
// of queued runs cost one timer. Thread-safe (one mutex; completions are posted).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "sandbox/protocol.hpp"
#include "sandbox/scheduler.hpp"

namespace sandbox::detail {

class scheduler : public std::enable_shared_from_this<scheduler> {
 public:
  using clock = std::chrono::steady_clock;

  /// A granted slot. Releasing it (destroying the last reference) lets the next run start.
  class slot {
   public:
    ~slot();
    slot(const slot&) = delete;
    slot& operator=(const slot&) = delete;
    /// How long the run waited in the queue.
    std::chrono::milliseconds waited() const noexcept { return waited_; }

   private:
    friend class scheduler;
    slot(std::weak_ptr<scheduler> s, std::string tenant, clock::time_point granted,
         std::chrono::milliseconds waited)
        : sched_(std::move(s)), tenant_(std::move(tenant)), granted_(granted), waited_(waited) {}
    std::weak_ptr<scheduler> sched_;
    std::string tenant_;
    clock::time_point granted_;
    std::chrono::milliseconds waited_;
  };

  /// What a submission became: a slot, or a rejection (`capacity`, `queue_timeout`, or
  /// `internal` when the scheduler shut down) with the queue's figures.
  struct outcome {
    std::shared_ptr<slot> granted;
    std::optional<rejection> rejected;
    std::optional<queue_info> queue;
    std::chrono::milliseconds waited{0};  ///< time spent queued (rejections; slots carry their own)
  };
  using done_fn = std::function<void(outcome)>;

  static std::shared_ptr<scheduler> create(boost::asio::any_io_executor executor,
                                           scheduler_options options);
  ~scheduler();

  /// Queues a run of `tenant`; `done` is called exactly once, on the executor. Returns an id
  /// for `cancel`.
  std::uint64_t submit(const std::string& tenant, done_fn done);

  /// Withdraws a queued run: its `done` gets a rejection with code `internal` ("cancelled")
  /// and the queue place is freed at once. False when it was not queued any more (granted,
  /// rejected, or unknown) — a granted run releases its slot by dropping it.
  bool cancel(std::uint64_t id);

  /// Rejects everything queued (code `internal`, "shutting down") and refuses new
  /// submissions. Slots already granted stay valid.
  void shutdown();

  scheduler_stats stats() const;

  /// Takes a session place of `tenant` (scheduler_options / tenant_class_limits
  /// `max_session_slots`), held beside the slot (`submit`) for the session's whole life and
  /// given back by dropping the returned handle. Null, with `why` set to `capacity` naming
  /// the cap, when the host's or the tenant's session cap is reached. Never null when
  /// `max_running` is 0 (no scheduling, no cap).
  std::shared_ptr<void> take_session_place(const std::string& tenant,
                                           std::optional<rejection>& why);

  /// The limits that apply to `tenant`.
  const tenant_class_limits& limits_of(const std::string& tenant) const;

 private:
  struct waiter {
    std::string tenant;
    clock::time_point enqueued;
    clock::time_point deadline;
    done_fn done;
    std::list<std::uint64_t>::iterator in_queue;
    std::multimap<clock::time_point, std::uint64_t>::iterator in_deadlines;
  };
  struct tenant_state {
    const tenant_class_limits* limits = nullptr;
    std::list<std::uint64_t> queue;
    std::uint32_t running = 0;
    std::int64_t credit = 0;
    bool in_ring = false;
    std::list<tenant_state*>::iterator ring_pos;
  };

  scheduler(boost::asio::any_io_executor executor, scheduler_options options);
  void release(const std::string& tenant, clock::time_point granted);
  // Everything below runs with mu_ held; completions are collected and posted after.
  using completion = std::function<void()>;
  void dispatch_locked(std::vector<completion>& out);
  void enter_ring_locked(tenant_state& t);
  bool can_start_now_locked(const std::string& tenant, const tenant_class_limits& lim) const;
  std::size_t queued_of_locked(const std::string& tenant) const;
  void arm_timer_locked();
  void on_timer();
  void forget_if_idle_locked(const std::string& tenant);
  std::chrono::milliseconds retry_after_locked() const;
  void post_all(std::vector<completion>& out);

  boost::asio::any_io_executor executor_;
  const scheduler_options options_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, tenant_state> tenants_;
  std::unordered_map<std::uint64_t, waiter> waiters_;
  std::list<tenant_state*> ring_;
  std::multimap<clock::time_point, std::uint64_t> deadlines_;
  boost::asio::steady_timer timer_;
  std::optional<clock::time_point> armed_for_;
  std::uint64_t next_id_ = 1;
  std::uint32_t running_ = 0;
  double mean_hold_ms_ = 1000.0;  ///< EWMA of how long slots are held, for retry-after
  scheduler_stats stats_;
  bool shut_down_ = false;
  std::uint32_t session_places_ = 0;                                      ///< host-wide
  std::unordered_map<std::string, std::uint32_t> tenant_session_places_;  ///< per tenant
};

}  // namespace sandbox::detail
