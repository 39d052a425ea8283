// The run machine's evidence watchers: each owns its descriptor or timer and reports what it
// saw to its run. Strand only; every pending wait holds the run (the owner given to `start`),
// and each stops arming itself once its run's `stopped()` says the run is ending.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "core/run/cgroup.hpp"
#include "core/run/seccomp_notify.hpp"
#include "sandbox/egress.hpp"

namespace sandbox::detail {

/// The executor every watcher runs on: the run's strand.
using run_strand = boost::asio::strand<boost::asio::any_io_executor>;

/**
 * The seccomp user-notification listener (packet-mode runs): answers every notification
 * (handle_notification, seccomp_notify.hpp) and reports violations and egress attempts.
 * Each notification costs the host a few system calls while the calling thread waits, so a
 * run gets at most `burst` per `window`; past that the host waits before answering the next
 * one (the sandboxed threads stay blocked, costing nothing).
 */
class notify_watcher {
 public:
  static constexpr int burst = 200;                               ///< notifications …
  static constexpr auto window = std::chrono::milliseconds(100);  ///< … per window

  /// What the watcher reports; each is called on the strand.
  struct hooks {
    std::function<void(std::string syscall)> violation;  ///< a denied syscall: the run ends
    std::function<void(egress_attempt)> egress;          ///< an egress attempt, answered
    std::function<bool()> stopped;                       ///< the run is ending
  };

  explicit notify_watcher(run_strand strand) : strand_(strand), listener_(strand) {}

  /// Takes the listener sandbox-init handed over (owned from here on) and starts watching.
  void start(int listener, std::weak_ptr<void> owner, hooks h);
  /// True once a listener was handed over (and not yet closed).
  bool is_open() const noexcept { return listener_.is_open(); }
  /// Closes the listener and drops the run's /proc/<pid>/mem descriptors (teardown: gone
  /// before the result).
  void close();

 private:
  void watch();

  run_strand strand_;
  boost::asio::posix::stream_descriptor listener_;
  notify_mem_cache mem_cache_;
  std::weak_ptr<void> owner_;
  hooks h_;
  std::chrono::steady_clock::time_point window_start_{};
  int count_ = 0;
};

/**
 * The DNS sink (packet-mode runs without network): a datagram socket in the run's network
 * namespace that sandbox-init handed over. The run's own names (localhost, its hostname)
 * are answered; every other query is refused and reported as an egress attempt.
 */
class dns_sink_server {
 public:
  explicit dns_sink_server(run_strand strand) : sock_(strand) {}
  /// Takes the socket (owned from here on) and serves it; `query` gets each refused name,
  /// `stopped` says when the run is ending.
  void start(int fd, std::weak_ptr<void> owner, std::function<void(egress_attempt)> query,
             std::function<bool()> stopped);
  /// Closes the socket.
  void close();

 private:
  void serve();

  boost::asio::posix::stream_descriptor sock_;
  std::weak_ptr<void> owner_;
  std::function<void(egress_attempt)> query_;
  std::function<bool()> stopped_;
};

/**
 * The run cgroup's OOM events. The notification comes when the OOM killer is invoked, which
 * can be a moment before the kill is counted: the counter is re-read for a short while
 * (50 × 2 ms) before concluding nothing died. One OOM kill ends the whole run (v2 does this
 * itself with memory.oom.group; v1 needs us), so results agree on every host.
 */
class oom_watch {
 public:
  explicit oom_watch(run_strand strand) : strand_(strand), events_(strand) {}
  /// Watches `cgroup`'s OOM event descriptor (duplicated; nothing when it has none). `oom`
  /// is called once an OOM kill is counted. `cgroup` must outlive the watch while the run is
  /// not `stopped()` (it is removed only after the run ended).
  void start(run_cgroup& cgroup, std::weak_ptr<void> owner, std::function<void()> oom,
             std::function<bool()> stopped);
  /// Closes the event descriptor.
  void close();

 private:
  void watch();
  void check(int attempt);

  run_strand strand_;
  boost::asio::posix::stream_descriptor events_;
  run_cgroup* cgroup_ = nullptr;
  std::weak_ptr<void> owner_;
  std::function<void()> oom_;
  std::function<bool()> stopped_;
};

/// Samples the run cgroup's memory every 20 ms while the program runs (a peak where the
/// kernel keeps none: cgroup v1 without max_usage, see cgroup.hpp).
class memory_sampler {
 public:
  explicit memory_sampler(run_strand strand) : timer_(strand) {}
  /// Samples now and every 20 ms until `stopped()` or `cancel`. Same lifetime rule as
  /// oom_watch for `cgroup`.
  void start(run_cgroup& cgroup, std::weak_ptr<void> owner, std::function<bool()> stopped);
  /// Stops sampling.
  void cancel() { timer_.cancel(); }

 private:
  void sample();

  boost::asio::steady_timer timer_;
  run_cgroup* cgroup_ = nullptr;
  std::weak_ptr<void> owner_;
  std::function<bool()> stopped_;
};

/**
 * One run's evidence watchers together — the seccomp notification listener, the DNS sink,
 * the OOM watch and the memory sampler — reporting through one set of hooks, bound once
 * (`bind`, at prepare) before any of them starts. Strand only; every pending wait holds the
 * owner given to `bind` as each watcher says.
 */
class evidence_watchers {
 public:
  /// What the watchers tell their run; each is called on the strand.
  struct hooks {
    std::function<void(std::string syscall)> violation;  ///< a denied syscall: the run ends
    std::function<void(egress_attempt)> egress;          ///< an egress attempt was seen
    std::function<void()> oom;                           ///< an OOM kill: the run ends
    std::function<bool()> stopped;                       ///< the run is ending
  };

  explicit evidence_watchers(run_strand strand)
      : notify_(strand), dns_(strand), oom_(strand), sampler_(strand) {}

  /// The run (`owner`) and its hooks, for every watcher started later.
  void bind(std::weak_ptr<void> owner, hooks h) {
    owner_ = std::move(owner);
    h_ = std::move(h);
  }
  /// Watches the run cgroup's OOM events (see oom_watch).
  void watch_oom(run_cgroup& cgroup) {
    oom_.start(
        cgroup, owner_, [this] { h_.oom(); }, [this] { return h_.stopped(); });
  }
  /// Serves the DNS sink on `fd` (taken; packet mode).
  void serve_dns(int fd) {
    dns_.start(
        fd, owner_, [this](egress_attempt a) { h_.egress(std::move(a)); },
        [this] { return h_.stopped(); });
  }
  /// Answers the seccomp notifications of `listener` (taken; packet mode).
  void watch_notifications(int listener) {
    notify_.start(listener, owner_,
                  {.violation = [this](std::string syscall) { h_.violation(std::move(syscall)); },
                   .egress = [this](egress_attempt a) { h_.egress(std::move(a)); },
                   .stopped = [this] { return h_.stopped(); }});
  }
  /// Samples `cgroup`'s memory while the program runs, until `stopped()` (or the run's).
  void sample_memory(run_cgroup& cgroup, std::function<bool()> stopped) {
    sampler_.start(cgroup, owner_, std::move(stopped));
  }
  /// Stops sampling (the run ends; before the kill).
  void stop_sampling() { sampler_.cancel(); }
  /// Teardown: closes the listener (and drops the run's /proc/<pid>/mem descriptors), the
  /// DNS socket and the OOM event descriptor.
  void close() {
    notify_.close();
    dns_.close();
    oom_.close();
  }

 private:
  notify_watcher notify_;
  dns_sink_server dns_;
  oom_watch oom_;
  memory_sampler sampler_;
  std::weak_ptr<void> owner_;
  hooks h_;
};

}  // namespace sandbox::detail
