// Warm pools (private to src/): sandboxes prepared ahead of their runs, one pool per
// configured limits class (sandbox/backend_options.hpp `warm_pool_class`).
#pragma once

#include <algorithm>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/run/machine.hpp"
#include "core/run/pool_instance.hpp"
#include "sandbox/backend.hpp"
#include "sandbox/backend_options.hpp"
#include "sandbox/blob_store.hpp"
#include "sys/random.hpp"

namespace sandbox::detail {

/**
 * The warm pools of one backend. Each pool keeps up to its class's `size` instances ready
 * (prepared from a template job up to sandbox-init's `ready`: namespaces, cgroup,
 * filesystem), refilling with at most two preparations in flight per pool so that refills
 * never starve live runs of the host's cores; after three failed preparations in a row it
 * retries only 5 s later instead of spinning. `take` hands out a ready instance of a
 * matching pool after its health check (one-shot: it leaves the pool for good; an unhealthy
 * one is cancelled and counted failed). A pre-started class whose interpreter reports that
 * a preload module's import raised stops preparing for good (`pool_stats::error`, one error
 * line naming the class, the module and the exception): the image is fixed for the pool's
 * life, so every instance would fail the same way; its runs go cold.
 *
 * `Run` is the run machine's run: `prepare_pooled(on_prepared, on_lost)` (posted, never
 * inline), `is_ready_idle()` and `passes_health_check()` (any thread) and `cancel()` (any
 * thread).
 *
 * Thread-safety: every member takes the pools' mutex, and so do the runs' callbacks (on
 * their strands) and the retry timers; a run's callbacks are never called inline by
 * `prepare_pooled`, so none runs under the mutex. Lifetime: owned by its backend through a
 * shared_ptr; the callbacks and timers hold it weakly (nothing happens once it is gone).
 */
template <class Run>
class warm_pool : public std::enable_shared_from_this<warm_pool<Run>> {
 public:
  /// Makes a pool instance from `job` (the template with its own run id), not started.
  using factory = std::function<std::shared_ptr<Run>(run_job job)>;

  /// `network_goes_cold`: the launcher makes the network namespace at launch
  /// (`makes_network_namespace`), so network runs never take a pooled instance.
  /// `can_prestart`: the level can pre-start interpreters (`warm_pool_class::prestart`;
  /// `launcher_traits::can_prestart`: process, container, gvisor); classes asking for it
  /// elsewhere are logged and skipped.
  warm_pool(run_machine_context ctx, bool network_goes_cold, factory make,
            bool can_prestart = false)
      : ctx_(std::move(ctx)),
        network_goes_cold_(network_goes_cold),
        can_prestart_(can_prestart),
        make_(std::move(make)) {}

  /// Creates the configured pools and starts filling them (asynchronously, on the runtime's
  /// executor). Classes whose runtime is unavailable, or whose limits no request could have
  /// under the policy, are logged and skipped.
  void start() {
    std::lock_guard lock(mu_);
    const policy& pol = ctx_.policy;
    for (const auto& cls : ctx_.options.warm_pool) {
      if (cls.size == 0) continue;
      if (cls.memory_limit_bytes < pol.min_memory_bytes ||
          cls.memory_limit_bytes > pol.max_memory_bytes ||
          cls.files_out.max_files > pol.max_output_files ||
          cls.files_out.max_bytes > pol.max_output_bytes) {
        log("warm pool for runtime '" + cls.runtime +
            "' skipped: its limits are outside the policy");
        continue;
      }
      auto resolved = ctx_.resolve_runtime ? ctx_.resolve_runtime(cls.runtime) : std::nullopt;
      if (!resolved) {
        log("warm pool for runtime '" + cls.runtime + "' skipped: unavailable");
        continue;
      }
      if (cls.prestart) {
        const prestart_kind kind = prestart_kind_of(resolved->first);
        const bool names_ok =
            cls.preload.size() <= 64 &&
            std::all_of(cls.preload.begin(), cls.preload.end(),
                        [kind](const auto& m) { return is_valid_preload_module(kind, m); }) &&
            std::set<std::string>(cls.preload.begin(), cls.preload.end()).size() ==
                cls.preload.size();
        if (!can_prestart_ || !supports_prestart(resolved->first) || !names_ok) {
          log("warm pool for runtime '" + cls.runtime + "' skipped: " +
              (!can_prestart_ ? "this level cannot pre-start interpreters"
               : !names_ok    ? "its preload list names an invalid module or one twice"
                              : "the runtime cannot be pre-started"));
          continue;
        }
      } else if (!cls.preload.empty()) {
        log("warm pool for runtime '" + cls.runtime + "' skipped: preload needs prestart");
        continue;
      }
      auto p = std::make_unique<pool_state>();
      p->cls = cls;
      p->tmpl.runtime = resolved->first;
      p->tmpl.rootfs = resolved->second;
      p->tmpl.policy = ctx_.policy;
      p->tmpl.admitted.request.runtime = cls.runtime;
      p->tmpl.admitted.request.memory_limit_bytes = cls.memory_limit_bytes;
      p->tmpl.admitted.request.files_out = cls.files_out;
      p->tmpl.blobs = make_memory_blob_store(1);
      if (cls.prestart) p->tmpl.prestart = cls.preload;
      pools_.push_back(std::move(p));
    }
    for (auto& p : pools_) refill_locked(*p);
  }

  /// Each pool's figures (any thread).
  std::vector<pool_stats> stats() const {
    std::lock_guard lock(mu_);
    std::vector<pool_stats> out;
    for (const auto& p : pools_) {
      out.push_back({.runtime = p->cls.runtime,
                     .memory_limit_bytes = p->cls.memory_limit_bytes,
                     .size = p->cls.size,
                     .ready = static_cast<std::uint32_t>(p->ready.size()),
                     .starting = p->starting,
                     .handed_out = p->handed_out,
                     .failed = p->failed,
                     .error = p->error});
    }
    return out;
  }

  /**
   * A ready, healthy instance of a pool matching `job`, or nullptr (the matching pool, if
   * any, refills now). With an instance, `refill` is set: call it once the run started (or
   * ended without starting), so that preparing the next instance does not compete with this
   * run's hand-out for the executor and the cores.
   */
  std::shared_ptr<Run> take(const run_job& job, std::function<void()>& refill) {
    std::lock_guard lock(mu_);
    for (auto& p : pools_) {
      if (!matches(*p, job)) continue;
      std::shared_ptr<Run> got;
      while (!p->ready.empty() && !got) {
        auto c = std::move(p->ready.front());
        p->ready.pop_front();
        if (c->is_ready_idle() && c->passes_health_check()) {
          got = std::move(c);
          ++p->handed_out;
        } else {
          ++p->failed;  // failed its health check: destroyed, never handed out
          c->cancel();
        }
      }
      if (got) {
        refill = [weak = this->weak_from_this(), pp = p.get()] {
          auto self = weak.lock();
          if (!self) return;
          std::lock_guard lock(self->mu_);
          self->refill_locked(*pp);
        };
      } else {
        refill_locked(*p);
      }
      return got;
    }
    return nullptr;
  }

  /// Runtime shutdown: no more refills, the idle instances are dropped; returns every
  /// instance still alive (the caller kills them).
  std::vector<std::shared_ptr<Run>> shutdown() {
    std::lock_guard lock(mu_);
    shutting_down_ = true;
    for (auto& p : pools_) p->ready.clear();  // idle instances die with the caller's kill
    std::vector<std::shared_ptr<Run>> live;
    for (auto& w : instances_) {
      if (auto r = w.lock()) live.push_back(std::move(r));
    }
    return live;
  }

 private:
  struct pool_state {
    warm_pool_class cls;
    run_job tmpl;  ///< the limits class: runtime, rootfs, policy, memory, files_out
    std::deque<std::shared_ptr<Run>> ready;
    std::uint32_t starting = 0;
    std::uint64_t handed_out = 0, failed = 0;
    std::uint32_t consecutive_failures = 0;
    bool retry_scheduled = false;
    std::string error;  ///< set: the class cannot be prepared; no more refills
  };

  void log(const std::string& line) const {
    if (ctx_.log) ctx_.log(log_level::warning, line);
  }

  bool matches(const pool_state& p, const run_job& job) const {
    const auto& req = job.admitted.request;
    // A network run of a launcher that makes its namespace at launch goes cold.
    if (req.network && network_goes_cold_) return false;
    // Pools are prepared with the policy's own limits and a runtime's argv: a registered
    // tool or a run under a workload profile goes cold.
    if (!req.tool.empty() || !job.admitted.profile.empty()) return false;
    // A pre-started interpreter has its standard input, its network namespace's proxy
    // settings and what it reads of the environment at start-up (the locale, the time zone)
    // already: runs that would differ there go cold.
    if (p.cls.prestart) {
      if (req.network || job.stdin_bytes) return false;
      // Node also reads its options, module path, thread pool size and OpenSSL settings.
      const bool node = prestart_kind_of(p.tmpl.runtime) == prestart_kind::node;
      for (const auto& [k, v] : req.env) {
        if (k.starts_with("LC_") || k == "TZ") return false;
        if (node && (k.starts_with("NODE_") || k.starts_with("UV_") || k.starts_with("OPENSSL_") ||
                     k.starts_with("SSL_"))) {
          return false;
        }
      }
    }
    return job.runtime.name == p.cls.runtime &&
           req.memory_limit_bytes == p.cls.memory_limit_bytes && req.files_out == p.cls.files_out;
  }

  // Starts preparing instances until ready + starting reaches the pool's size (at most two
  // in flight per pool, so refills never starve live runs of the host's cores).
  void refill_locked(pool_state& p) {
    if (shutting_down_ || p.retry_scheduled || !p.error.empty()) return;
    if (p.consecutive_failures >= 3) {
      // Something is wrong on this host right now: retry later instead of spinning.
      p.retry_scheduled = true;
      auto t = std::make_shared<boost::asio::steady_timer>(ctx_.executor, std::chrono::seconds(5));
      t->async_wait([weak = this->weak_from_this(), pp = &p, t](boost::system::error_code ec) {
        auto self = weak.lock();
        if (ec || !self) return;
        std::lock_guard lock(self->mu_);
        pp->retry_scheduled = false;
        pp->consecutive_failures = 0;
        self->refill_locked(*pp);
      });
      return;
    }
    while (p.ready.size() + p.starting < p.cls.size && p.starting < 2) {
      ++p.starting;
      run_job job = p.tmpl;
      auto suffix = random_hex(8);
      if (!suffix) {  // counted as a failed preparation: retried later, never spun on
        ++p.failed;
        ++p.consecutive_failures;
        --p.starting;
        break;
      }
      job.run_id = "w" + *suffix;
      auto inst = make_(std::move(job));
      track_locked(inst);
      std::weak_ptr<Run> winst = inst;
      auto weak = this->weak_from_this();
      inst->prepare_pooled(
          [weak, pp = &p, winst](bool ok, const prepare_failure& why) {
            auto self = weak.lock();
            if (!self) return;
            std::lock_guard lock(self->mu_);
            --pp->starting;
            auto i = winst.lock();
            if (ok && i && !self->shutting_down_) {
              pp->ready.push_back(std::move(i));
              pp->consecutive_failures = 0;
            } else if (!ok) {
              ++pp->failed;
              ++pp->consecutive_failures;
              if (why.preload_raised && pp->error.empty() && !self->shutting_down_) {
                self->stop_class_locked(*pp, why.why);
              }
            }
            self->refill_locked(*pp);
          },
          [weak, pp = &p, winst] {
            auto self = weak.lock();
            if (!self) return;
            std::lock_guard lock(self->mu_);
            auto i = winst.lock();
            auto it = std::find(pp->ready.begin(), pp->ready.end(), i);
            if (it != pp->ready.end()) pp->ready.erase(it);
            ++pp->failed;
            self->refill_locked(*pp);
          });
    }
  }

  // A pre-started class whose preload list cannot be imported from its image: recorded
  // (stats), said once at error level with the class, and never prepared again.
  void stop_class_locked(pool_state& p, const std::string& why) {
    std::string modules;
    for (const auto& m : p.cls.preload) modules += (modules.empty() ? "" : ", ") + m;
    p.error = why;
    if (ctx_.log) {
      ctx_.log(log_level::error,
               "warm pool class (runtime '" + p.cls.runtime + "', memory_limit_bytes " +
                   std::to_string(p.cls.memory_limit_bytes) + ", pre-started, preload [" + modules +
                   "]) stopped: its preload list cannot be imported from the image: " + why +
                   "; it prepares no more instances and its runs go cold");
    }
  }

  // Every instance made, for `shutdown` (the gone ones are pruned as new ones come).
  void track_locked(const std::shared_ptr<Run>& run) {
    std::erase_if(instances_, [](const std::weak_ptr<Run>& w) { return w.expired(); });
    instances_.push_back(run);
  }

  run_machine_context ctx_;
  bool network_goes_cold_;
  bool can_prestart_;
  factory make_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<pool_state>> pools_;
  std::vector<std::weak_ptr<Run>> instances_;
  bool shutting_down_ = false;
};

}  // namespace sandbox::detail
