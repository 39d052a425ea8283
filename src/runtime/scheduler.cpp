#include "runtime/scheduler.hpp"

#include <algorithm>
#include <boost/asio/post.hpp>

namespace sandbox::detail {

namespace asio = boost::asio;

scheduler::slot::~slot() {
  if (auto s = sched_.lock()) s->release(tenant_, granted_);
}

std::shared_ptr<scheduler> scheduler::create(asio::any_io_executor executor,
                                             scheduler_options options) {
  return std::shared_ptr<scheduler>(new scheduler(std::move(executor), std::move(options)));
}

scheduler::scheduler(asio::any_io_executor executor, scheduler_options options)
    : executor_(std::move(executor)), options_(std::move(options)), timer_(executor_) {}

scheduler::~scheduler() = default;

const tenant_class_limits& scheduler::limits_of(const std::string& tenant) const {
  auto c = options_.tenant_classes.find(tenant);
  if (c != options_.tenant_classes.end()) {
    auto l = options_.classes.find(c->second);
    if (l != options_.classes.end()) return l->second;
  }
  return options_.default_class;
}

std::chrono::milliseconds scheduler::retry_after_locked() const {
  // About how long until the queue ahead drains: queued / slots × mean hold time.
  double slots = std::max<double>(1, options_.max_running);
  double ms = mean_hold_ms_ * (static_cast<double>(waiters_.size()) / slots + 1.0);
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::clamp(ms, 100.0, 60000.0)));
}

void scheduler::post_all(std::vector<completion>& out) {
  for (auto& c : out) asio::post(executor_, std::move(c));
  out.clear();
}

std::uint64_t scheduler::submit(const std::string& tenant, done_fn done) {
  std::vector<completion> out;
  std::uint64_t id;
  {
    std::lock_guard lock(mu_);
    id = next_id_++;
    const auto& lim = limits_of(tenant);
    auto reject = [&](std::string message) {
      ++stats_.rejected;
      auto it = tenants_.find(tenant);
      std::uint32_t tenant_queued =
          it == tenants_.end() ? 0 : static_cast<std::uint32_t>(it->second.queue.size());
      queue_info qi{.position = tenant_queued + 1,
                    .length = static_cast<std::uint32_t>(waiters_.size()),
                    .retry_after = retry_after_locked()};
      message += "; retry after about " + std::to_string(qi.retry_after.count()) + " ms";
      out.push_back([done = std::move(done), message = std::move(message), qi] {
        done({.rejected = rejection{code::capacity, message}, .queue = qi});
      });
    };
    if (shut_down_) {
      out.push_back([done = std::move(done)] {
        done({.rejected = rejection{code::internal, "the runtime is shutting down"}});
      });
    } else if (options_.max_running == 0) {
      // No scheduling: every admitted run starts at once (slots are still counted).
      ++running_;
      ++tenants_[tenant].running;
      tenants_[tenant].limits = &lim;
      ++stats_.dispatched;
      auto s = std::shared_ptr<slot>(new slot(weak_from_this(), tenant, clock::now(), {}));
      out.push_back([done = std::move(done), s] { done({.granted = s}); });
    } else if (!can_start_now_locked(tenant, lim) && waiters_.size() >= options_.max_queued) {
      // (A run that starts at once takes no queue space: queue caps apply to waiting runs.)
      reject("host at capacity: " + std::to_string(waiters_.size()) + " runs queued (limit " +
             std::to_string(options_.max_queued) + ")");
    } else if (const std::size_t queued = queued_of_locked(tenant);
               !can_start_now_locked(tenant, lim) && queued >= lim.max_queued) {
      reject("tenant queue full: " + std::to_string(queued) +
             " runs of this tenant queued (limit " + std::to_string(lim.max_queued) + ")");
    } else {
      auto now = clock::now();
      tenant_state& t = tenants_[tenant];
      t.limits = &lim;
      t.queue.push_back(id);
      waiter w{.tenant = tenant,
               .enqueued = now,
               .deadline = now + lim.queue_deadline,
               .done = std::move(done),
               .in_queue = std::prev(t.queue.end()),
               .in_deadlines = {}};
      w.in_deadlines = deadlines_.emplace(w.deadline, id);
      waiters_.emplace(id, std::move(w));
      if (!t.in_ring && t.running < lim.max_running) enter_ring_locked(t);
      dispatch_locked(out);
      arm_timer_locked();
    }
  }
  post_all(out);
  return id;
}

// True when a new run of `tenant` would be dispatched the moment it is queued: a host slot
// and a tenant slot are free and none of the tenant's runs wait ahead of it. (With a free host
// slot no other tenant can be waiting for one: dispatch would have granted it already.)
std::size_t scheduler::queued_of_locked(const std::string& tenant) const {
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second.queue.size();
}

bool scheduler::can_start_now_locked(const std::string& tenant,
                                     const tenant_class_limits& lim) const {
  if (running_ >= options_.max_running) return false;
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) return lim.max_running > 0;
  return it->second.running < lim.max_running && it->second.queue.empty();
}

void scheduler::enter_ring_locked(tenant_state& t) {
  t.credit = std::max<std::uint32_t>(1, t.limits->weight);
  ring_.push_back(&t);
  t.ring_pos = std::prev(ring_.end());
  t.in_ring = true;
}

void scheduler::dispatch_locked(std::vector<completion>& out) {
  const auto now = clock::now();
  while (running_ < options_.max_running && !ring_.empty()) {
    tenant_state* t = ring_.front();
    if (t->queue.empty() || t->running >= t->limits->max_running) {
      // Nothing to run, or at its bulkhead: out of the ring until a release or a submit.
      ring_.pop_front();
      t->in_ring = false;
      continue;
    }
    const std::uint64_t id = t->queue.front();
    t->queue.pop_front();
    auto wit = waiters_.find(id);
    waiter w = std::move(wit->second);
    deadlines_.erase(w.in_deadlines);
    waiters_.erase(wit);
    ++t->running;
    ++running_;
    ++stats_.dispatched;
    --t->credit;
    if (t->credit <= 0 || t->queue.empty() || t->running >= t->limits->max_running) {
      ring_.pop_front();
      t->in_ring = false;
      if (!t->queue.empty() && t->running < t->limits->max_running) enter_ring_locked(*t);
    }
    auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - w.enqueued);
    auto s = std::shared_ptr<slot>(new slot(weak_from_this(), w.tenant, now, waited));
    out.push_back([done = std::move(w.done), s] { done({.granted = s}); });
  }
}

void scheduler::release(const std::string& tenant, clock::time_point granted) {
  std::vector<completion> out;
  {
    std::lock_guard lock(mu_);
    auto it = tenants_.find(tenant);
    if (it == tenants_.end() || it->second.running == 0 || running_ == 0) return;
    tenant_state& t = it->second;
    --t.running;
    --running_;
    double held = std::chrono::duration<double, std::milli>(clock::now() - granted).count();
    mean_hold_ms_ = 0.9 * mean_hold_ms_ + 0.1 * held;
    if (!t.in_ring && !t.queue.empty() && t.running < t.limits->max_running) {
      enter_ring_locked(t);
    }
    dispatch_locked(out);
    forget_if_idle_locked(tenant);
    arm_timer_locked();
  }
  post_all(out);
}

void scheduler::forget_if_idle_locked(const std::string& tenant) {
  auto it = tenants_.find(tenant);
  if (it != tenants_.end() && it->second.running == 0 && it->second.queue.empty() &&
      !it->second.in_ring) {
    tenants_.erase(it);
  }
}

bool scheduler::cancel(std::uint64_t id) {
  std::vector<completion> out;
  {
    std::lock_guard lock(mu_);
    auto wit = waiters_.find(id);
    if (wit == waiters_.end()) return false;
    waiter w = std::move(wit->second);
    waiters_.erase(wit);
    deadlines_.erase(w.in_deadlines);
    auto& t = tenants_[w.tenant];
    t.queue.erase(w.in_queue);
    if (t.queue.empty() && t.in_ring) {
      ring_.erase(t.ring_pos);
      t.in_ring = false;
    }
    forget_if_idle_locked(w.tenant);
    out.push_back([done = std::move(w.done)] {
      done({.rejected = rejection{code::internal, "run cancelled while queued"}});
    });
    arm_timer_locked();
  }
  post_all(out);
  return true;
}

void scheduler::shutdown() {
  std::vector<completion> out;
  {
    std::lock_guard lock(mu_);
    shut_down_ = true;
    for (auto& [id, w] : waiters_) {
      out.push_back([done = std::move(w.done)] {
        done({.rejected = rejection{code::internal, "the runtime is shutting down"}});
      });
    }
    waiters_.clear();
    deadlines_.clear();
    ring_.clear();
    for (auto it = tenants_.begin(); it != tenants_.end();) {
      it->second.queue.clear();
      it->second.in_ring = false;
      it = it->second.running == 0 ? tenants_.erase(it) : std::next(it);
    }
    timer_.cancel();
    armed_for_.reset();
  }
  post_all(out);
}

void scheduler::arm_timer_locked() {
  if (deadlines_.empty()) return;
  auto earliest = deadlines_.begin()->first;
  if (armed_for_ && *armed_for_ <= earliest) return;
  armed_for_ = earliest;
  timer_.expires_at(earliest);
  timer_.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
    if (ec) return;
    if (auto s = weak.lock()) s->on_timer();
  });
}

void scheduler::on_timer() {
  std::vector<completion> out;
  {
    std::lock_guard lock(mu_);
    armed_for_.reset();
    const auto now = clock::now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      const std::uint64_t id = deadlines_.begin()->second;
      deadlines_.erase(deadlines_.begin());
      auto wit = waiters_.find(id);
      if (wit == waiters_.end()) continue;
      waiter w = std::move(wit->second);
      waiters_.erase(wit);
      auto& t = tenants_[w.tenant];
      std::uint32_t position = 1;
      for (auto it = t.queue.begin(); it != w.in_queue; ++it) ++position;
      t.queue.erase(w.in_queue);
      if (t.queue.empty() && t.in_ring) {
        ring_.erase(t.ring_pos);
        t.in_ring = false;
      }
      forget_if_idle_locked(w.tenant);
      ++stats_.queue_timeouts;
      auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - w.enqueued);
      queue_info qi{.position = position,
                    .length = static_cast<std::uint32_t>(waiters_.size() + 1),
                    .retry_after = retry_after_locked()};
      std::string message = "waited " + std::to_string(waited.count()) +
                            " ms in the queue without a free slot (position " +
                            std::to_string(position) + " of its tenant's runs)";
      out.push_back([done = std::move(w.done), message = std::move(message), qi, waited] {
        done({.rejected = rejection{code::queue_timeout, message}, .queue = qi, .waited = waited});
      });
    }
    arm_timer_locked();
  }
  post_all(out);
}

std::shared_ptr<void> scheduler::take_session_place(const std::string& tenant,
                                                    std::optional<rejection>& why) {
  std::lock_guard lock(mu_);
  if (options_.max_running != 0) {
    const std::uint32_t host_cap = options_.max_session_slots != 0
                                       ? options_.max_session_slots
                                       : std::max<std::uint32_t>(1, options_.max_running / 2);
    const auto& lim = limits_of(tenant);
    const std::uint32_t tenant_cap = lim.max_session_slots != 0
                                         ? lim.max_session_slots
                                         : std::max<std::uint32_t>(1, lim.max_running / 2);
    auto it = tenant_session_places_.find(tenant);
    const std::uint32_t mine = it == tenant_session_places_.end() ? 0 : it->second;
    if (session_places_ >= host_cap) {
      ++stats_.rejected;
      why =
          rejection{code::capacity, "host at its session cap: " + std::to_string(session_places_) +
                                        " sessions hold slots (limit " + std::to_string(host_cap) +
                                        "; the rest are for runs)"};
      return nullptr;
    }
    if (mine >= tenant_cap) {
      ++stats_.rejected;
      why = rejection{code::capacity, "tenant at its session cap: " + std::to_string(mine) +
                                          " sessions hold slots (limit " +
                                          std::to_string(tenant_cap) + ")"};
      return nullptr;
    }
  }
  ++session_places_;
  ++tenant_session_places_[tenant];
  return std::shared_ptr<void>(new char(0), [w = weak_from_this(), tenant](void* p) {
    delete static_cast<char*>(p);
    if (auto s = w.lock()) {
      std::lock_guard lock(s->mu_);
      --s->session_places_;
      auto it = s->tenant_session_places_.find(tenant);
      if (it != s->tenant_session_places_.end() && --it->second == 0) {
        s->tenant_session_places_.erase(it);
      }
    }
  });
}

scheduler_stats scheduler::stats() const {
  std::lock_guard lock(mu_);
  scheduler_stats s = stats_;
  s.session_slots = session_places_;
  s.running = running_;
  s.queued = static_cast<std::uint32_t>(waiters_.size());
  return s;
}

}  // namespace sandbox::detail
