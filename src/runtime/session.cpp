// Sessions (sandbox/session.hpp): the runtime's side — registry lookup, the ticket's and the
// host's checks, the image, the level — before a backend's run machine starts the server in
// session mode (core/run/machine.cpp).
#include "sandbox/session.hpp"

#include <algorithm>
#include <atomic>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <mutex>

#include "protocol/text_util.hpp"
#include "runtime/runtime_impl.hpp"
#include "sandbox/egress.hpp"
#include "sandbox/policy.hpp"
#include "sandbox/runtime.hpp"

namespace sandbox {

namespace {

using open_handler =
    boost::asio::any_completion_handler<void(boost::system::error_code, session_start)>;

void refuse(open_handler h, const boost::asio::any_io_executor& fallback, code c,
            std::string message, boost::system::error_code ec = {}) {
  detail::post_completion(
      fallback, std::move(h), ec,
      session_start{.session = nullptr, .code = c, .message = std::move(message)});
}

/// One admitted session's bookkeeping in the runtime: the scheduler slot it holds for its
/// whole life and the span recorded at its end. `end` runs once (the backend's
/// `session_job::on_end`, or the open's outcome when the session never started); the slot
/// goes with it. Destroyed unended (a backend that dropped `on_end`): the slot is released
/// and the span recorded as `internal`.
class session_tracker {
 public:
  session_tracker(std::shared_ptr<detail::runtime_impl> rt, const admitted& adm, std::string run_id,
                  const ticket& t)
      : rt_(std::move(rt)),
        ticket_(t),
        request_(adm.request),
        run_id_(std::move(run_id)),
        tenant_(adm.tenant),
        ticket_id_(t.id()),
        isolation_(adm.isolation),
        timeout_(adm.request.timeout),
        runtime_(adm.runtime),
        start_(std::chrono::system_clock::now()) {}
  session_tracker(const session_tracker&) = delete;
  session_tracker& operator=(const session_tracker&) = delete;
  ~session_tracker() {
    if (ended_.load()) return;
    session_result r;
    r.result.code = code::internal;
    end(r);
  }

  void hold(std::shared_ptr<detail::scheduler::slot> s) {
    std::lock_guard lk(mu_);
    slot_ = std::move(s);
  }
  void waited(std::chrono::milliseconds w) noexcept { queue_wait_ = w; }
  /// A session place (scheduler::take_session_place), given back with the slot.
  void keep(std::shared_ptr<void> place) {
    std::lock_guard lk(mu_);
    place_ = std::move(place);
  }
  /// The lifetime granted in the end (cut to the ticket's expiry): the span's timeout.
  void granted(std::chrono::milliseconds lifetime) noexcept {
    timeout_ = lifetime;
    request_.timeout = lifetime;
  }

  /// The session is over (or never started): its receipt (a session a backend ran, when
  /// the runtime has a `receipt_signer`: the same claims as a run's, the request being the
  /// session's as run — tool name, lifetime as `timeout_ms`, memory limit), its span, then
  /// its slot is released.
  void end(session_result& r) noexcept {
    if (ended_.exchange(true)) return;
    if (const auto& signer = rt_->receipt_signer(); signer && !r.result.backend.empty()) {
      try {
        run_request as_run = request_;
        as_run.tool = as_run.runtime;  // the registry entry's name
        as_run.runtime.clear();
        auto doc = signer->sign(
            make_receipt_claims(as_run, ticket_, r.result, std::chrono::system_clock::now()));
        if (doc) {
          r.result.receipt = std::move(*doc);
        } else {
          rt_->log(log_level::error,
                   "session " + run_id_ + ": receipt not signed: " + doc.error().message());
        }
      } catch (...) {
        rt_->log(log_level::error, "session " + run_id_ + ": receipt not signed (out of memory)");
      }
    }
    try {
      span s;
      s.name = "sandbox.session";
      s.start = start_;
      s.end = std::chrono::system_clock::now();
      auto& a = s.attributes;
      a["sandbox.run_id"] = run_id_;
      a["sandbox.tenant"] = tenant_;
      a["sandbox.ticket_id"] = ticket_id_;
      a["sandbox.isolation"] = std::string(to_string(isolation_));
      a["sandbox.timeout"] = static_cast<std::int64_t>(timeout_.count());
      a["sandbox.runtime"] = runtime_.name;
      a["sandbox.runtime_digest"] = runtime_.digest;
      a["error_code"] = std::string(to_string(r.result.code));
      if (r.result.exit_code)
        a["sandbox.exit_code"] = static_cast<std::int64_t>(*r.result.exit_code);
      a["sandbox.usage.setup_ms"] = static_cast<std::int64_t>(r.result.usage.setup.count());
      a["sandbox.usage.wall_ms"] = static_cast<std::int64_t>(r.result.usage.wall.count());
      a["sandbox.usage.cpu_ms"] = static_cast<std::int64_t>(r.result.usage.cpu.count());
      a["sandbox.usage.peak_memory_bytes"] = static_cast<std::int64_t>(
          std::min<std::uint64_t>(r.result.usage.peak_memory_bytes, INT64_MAX));
      a["sandbox.egress_attempts"] = static_cast<std::int64_t>(r.result.egress_attempts.size() +
                                                               r.result.egress_attempts_dropped);
      a["sandbox.oom_kills"] = static_cast<std::int64_t>(r.result.oom_kills);
      a["sandbox.queue_wait_ms"] = static_cast<std::int64_t>(queue_wait_.count());
      a["sandbox.session.end"] = std::string(to_string(r.end));
      a["sandbox.session.bytes_to_server"] =
          static_cast<std::int64_t>(std::min<std::uint64_t>(r.bytes_to_server, INT64_MAX));
      a["sandbox.session.bytes_from_server"] =
          static_cast<std::int64_t>(std::min<std::uint64_t>(r.bytes_from_server, INT64_MAX));
      rt_->record_span(s);
    } catch (...) {
      rt_->log(log_level::warning, "span for session " + run_id_ + " lost (allocation failed)");
    }
    std::shared_ptr<detail::scheduler::slot> released;
    std::shared_ptr<void> place;
    std::lock_guard lk(mu_);
    released = std::move(slot_);  // (destroyed after the lock: the scheduler dispatches)
    place = std::move(place_);
  }

 private:
  std::shared_ptr<detail::runtime_impl> rt_;
  ticket ticket_;        ///< what the session ran under (for its receipt)
  run_request request_;  ///< the session as admitted (for its receipt)
  std::string run_id_, tenant_, ticket_id_;
  isolation isolation_;
  std::chrono::milliseconds timeout_;
  runtime_info runtime_;
  std::chrono::system_clock::time_point start_;
  std::chrono::milliseconds queue_wait_{0};
  std::atomic<bool> ended_{false};
  std::mutex mu_;
  std::shared_ptr<detail::scheduler::slot> slot_;
  std::shared_ptr<void> place_;
};

/// The closing record of a session that never started (refused by the scheduler or the
/// backend, or failed to start): for its span.
session_result not_started(code c, const std::string& message) {
  session_result r;
  r.end = session_end::failed;
  r.result.code = c;
  r.result.message = message;
  return r;
}

}  // namespace

void runtime::do_open_session(session_request request, ticket t, open_handler handler) {
  if (!impl_) {
    // No executor to post to: complete inline (the runtime was moved from).
    std::move(handler)(
        boost::asio::error::operation_aborted,
        session_start{
            .session = nullptr, .code = code::internal, .message = "the runtime was moved from"});
    return;
  }
  auto impl = impl_;
  const auto& ex = impl->executor();
  const auto& opts = impl->sessions();

  // 1. The registry entry: the request names it, nothing else of the server. The one
  //    registry of registered tools (`runtime_options::tools`), checked and resolved when the
  //    runtime was created (`check_tool_entry`, canonical egress, the image's digest).
  const host_catalog catalog = impl->catalog();
  const auto found = catalog.tools.find(request.tool);
  if (found == catalog.tools.end()) {
    return refuse(std::move(handler), ex, code::invalid_request,
                  "tool: no registered tool named " + detail::quote_for_message(request.tool));
  }
  const tool_entry* entry = &found->second.entry;
  if (request.max_lifetime && request.max_lifetime->count() <= 0) {
    return refuse(std::move(handler), ex, code::invalid_request, "max_lifetime: must be > 0");
  }
  if (request.idle_timeout && request.idle_timeout->count() <= 0) {
    return refuse(std::move(handler), ex, code::invalid_request, "idle_timeout: must be > 0");
  }
  std::vector<std::string> egress = entry->egress;  // canonical already

  // 2. The ticket: unexpired, and `tool.run` granted for this entry (as for a registered
  //    tool's one-shot run: sandbox/ticket.hpp `ticket_spec::tools`).
  if (t.is_expired(std::chrono::system_clock::now())) {
    return refuse(std::move(handler), ex, code::action_denied, "ticket expired");
  }
  if (!t.allows_tool(entry->name)) {
    return refuse(
        std::move(handler), ex, code::action_denied,
        "tool: ticket does not grant tool.run for " + detail::quote_for_message(entry->name));
  }

  // 3. The level: the stronger of the entry's and the ticket's; the network (the entry's own
  //    egress) only at container or stronger — as for the entry's one-shot runs
  //    (`required_level`); the weakest registered backend at or above.
  const isolation need = required_level(run_request{.tool = entry->name}, t, catalog);
  impl->ensure_level(need);
  std::shared_ptr<backend> chosen = impl->backend_at_least(need);
  if (!chosen) {
    return refuse(std::move(handler), ex, code::runtime_unavailable, no_backend_message(need));
  }

  // 4. The image: the digest resolved at creation (a runtime serves the images it started
  //    with), against the entry's and the ticket's pins.
  const auto& digest = found->second.digest;
  auto launch = impl->tool_launch(entry->name);
  if (!digest || !launch) {
    return refuse(
        std::move(handler), ex, code::runtime_unavailable,
        "tool: the image " + detail::quote_for_message(entry->image) + " is not installed");
  }
  if (!found->second.unusable.empty()) {
    return refuse(
        std::move(handler), ex, code::runtime_unavailable,
        "tool: " + detail::quote_for_message(entry->name) + ": " + found->second.unusable);
  }
  if (entry->image_digest && *entry->image_digest != *digest) {
    return refuse(
        std::move(handler), ex, code::digest_mismatch,
        "tool: the image of " + detail::quote_for_message(entry->name) + " is not the pinned one");
  }
  if (t.runtime_digest() && *t.runtime_digest() != *digest) {
    return refuse(std::move(handler), ex, code::digest_mismatch,
                  "ticket.runtime_digest: the image of " + detail::quote_for_message(entry->name) +
                      " is not the pinned one");
  }

  // 5. The job: the entry's argv and env, the lifetime as the run's timeout, the ticket's
  //    memory ceiling.
  // The entry's workload profile (checked above to exist) gives the per-run limits; its
  // memory default applies, clamped like a request's.
  auto eff = effective_limits(impl->policy(), entry->profile);
  if (!eff) {
    return refuse(std::move(handler), ex, code::invalid_request,
                  "tool: entry " + detail::quote_for_message(entry->name) + ": profile: unknown");
  }
  const sandbox::policy& pol = eff->limits;
  // The lifetime: the request's (or the host's default), under the host's ceiling and the
  // ticket's `max_timeout` (a ticket's time ceiling bounds a session's whole life, as it
  // bounds a run's); the ticket's expiry shortens it further when the slot is granted
  // (below).
  auto lifetime = std::min(
      {request.max_lifetime.value_or(opts.default_lifetime), opts.max_lifetime, t.max_timeout()});
  auto idle = std::min(request.idle_timeout.value_or(opts.idle_timeout), opts.idle_timeout);
  admitted adm;
  adm.request.runtime = entry->name;
  adm.request.timeout = lifetime;
  std::uint64_t memory = adm.request.memory_limit_bytes;
  if (!entry->profile.empty()) {
    if (auto it = pol.profiles.find(entry->profile);
        it != pol.profiles.end() && it->second.memory_limit_bytes) {
      memory = *it->second.memory_limit_bytes;
    }
  }
  adm.request.memory_limit_bytes = std::min({memory, pol.max_memory_bytes, t.max_memory_bytes()});
  if (adm.request.memory_limit_bytes < pol.min_memory_bytes) {
    return refuse(std::move(handler), ex, code::action_denied,
                  "ticket: memory ceiling below the policy's minimum");
  }
  for (const auto& [k, v] : entry->env) adm.request.env[k] = v;
  if (!entry->egress.empty()) {
    adm.request.egress = std::move(egress);
    adm.request.network = true;
  }
  adm.tenant = t.tenant();
  adm.ticket_id = t.id();
  adm.isolation = chosen->isolation();
  adm.runtime = runtime_info{.name = entry->name, .digest = *digest};
  adm.timeout_clamped = request.max_lifetime && *request.max_lifetime > lifetime;

  run_job job{.run_id = detail::new_run_id(),
              .admitted = std::move(adm),
              .runtime = std::move(launch->first),
              .rootfs = std::move(launch->second),
              .blobs = impl->blobs(),
              .policy = pol,
              .executor = ex};
  detail::start_session(impl, t, std::move(chosen), std::move(job), idle,
                        std::max<std::uint32_t>(opts.stdin_buffer_bytes, 1), std::move(handler));
}

void detail::start_session(const std::shared_ptr<runtime_impl>& impl, const ticket& t,
                           std::shared_ptr<backend> chosen, run_job job,
                           std::chrono::milliseconds idle, std::uint32_t stdin_buffer_bytes,
                           open_handler handler) {
  const auto& ex = impl->executor();
  // 6. A scheduler slot, held for the session's whole life (a session is a live sandbox like
  //    a run's, so it counts against the same caps: the host's and its tenant's class),
  //    released when it ends (session_job::on_end). No slot in time: `queue_timeout`; a full
  //    queue: `capacity` — the open completes with that code. The session's span is
  //    recorded at its end, or here when it never starts.
  auto tracker = std::make_shared<session_tracker>(impl, job.admitted, job.run_id, t);
  session_job sj{.idle_timeout = idle,
                 .stdin_buffer_bytes = stdin_buffer_bytes,
                 .on_end = [tracker](session_result& r) { tracker->end(r); }};
  // The open's outcome: a session that never started ends here, before its handler runs
  // (no-op when the backend reported its end already). The caller's executor stays the
  // handler's.
  auto caller_ex = boost::asio::get_associated_executor(handler, ex);
  open_handler opened = boost::asio::bind_executor(
      caller_ex,
      [tracker, h = std::move(handler)](boost::system::error_code ec, session_start st) mutable {
        if (!st.session) {
          auto r = not_started(st.code, st.message);
          tracker->end(r);
        }
        std::move(h)(ec, std::move(st));
      });
  struct pending_open {
    std::shared_ptr<backend> chosen;
    run_job job;
    session_job sj;
    open_handler opened;
  };
  auto p = std::make_shared<pending_open>(
      pending_open{std::move(chosen), std::move(job), std::move(sj), std::move(opened)});
  auto start = [p, tracker, expires = t.expires_at(),
                ex](std::shared_ptr<detail::scheduler::slot> slot) {
    // Never past the ticket's expiry (a ticket stops granting anything when it expires): the
    // lifetime is cut to the time left now, after the queue wait, and the session then ends
    // as `ticket_expired` (code `timeout`). A ticket that expired while queued is refused.
    if (expires) {
      const auto left = std::chrono::floor<std::chrono::milliseconds>(
          *expires - std::chrono::system_clock::now());
      if (left.count() <= 0) {
        return refuse(std::move(p->opened), ex, code::action_denied, "ticket expired");
      }
      auto& timeout = p->job.admitted.request.timeout;
      if (left < timeout) {
        timeout = left;
        p->sj.lifetime_ends_at_ticket_expiry = true;
      }
    }
    tracker->granted(p->job.admitted.request.timeout);
    tracker->hold(std::move(slot));
    p->chosen->open_session(std::move(p->job), std::move(p->sj), std::move(p->opened));
  };
  auto sched = impl->sched();
  if (!sched) return start(nullptr);
  // Sessions may hold only part of the slots (scheduler_options::max_session_slots, host-wide
  // and per tenant): idle sessions can never take every slot from runs. Over it: `capacity`
  // at once (a session does not queue for another session's end).
  std::optional<rejection> why;
  auto place = sched->take_session_place(t.tenant(), why);
  if (!place) {
    const rejection rej = why.value_or(rejection{code::capacity, "session cap reached"});
    return refuse(std::move(p->opened), ex, rej.code, rej.message);
  }
  tracker->keep(std::move(place));
  sched->submit(t.tenant(), [p, tracker, start, ex = ex](detail::scheduler::outcome o) {
    if (!o.granted) {
      const rejection rej = o.rejected.value_or(rejection{code::internal, "internal error"});
      tracker->waited(o.waited);
      return refuse(std::move(p->opened), ex, rej.code, rej.message);
    }
    tracker->waited(o.granted->waited());
    start(std::move(o.granted));
  });
}

}  // namespace sandbox
