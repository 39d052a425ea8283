// Sessions (sandbox/session.hpp): the runtime's side — registry lookup, the ticket's and the
// host's checks, the image, the level — before a backend's run machine starts the server in
// session mode (init_backend.cpp).
#include "sandbox/session.hpp"

#include <algorithm>
#include <boost/asio/post.hpp>

#include "core/runtime_impl.hpp"
#include "core/text_util.hpp"
#include "sandbox/egress.hpp"
#include "sandbox/policy.hpp"
#include "sandbox/runtime.hpp"

namespace sandbox {

std::string_view to_string(session_end e) noexcept {
  switch (e) {
    case session_end::closed:
      return "closed";
    case session_end::server_exited:
      return "server_exited";
    case session_end::idle_timeout:
      return "idle_timeout";
    case session_end::max_lifetime:
      return "max_lifetime";
    case session_end::oom:
      return "oom";
    case session_end::seccomp_violation:
      return "seccomp_violation";
    case session_end::killed:
      return "killed";
    case session_end::failed:
      return "failed";
  }
  return "failed";
}

namespace {

using open_handler =
    boost::asio::any_completion_handler<void(boost::system::error_code, session_start)>;

void refuse(open_handler h, const boost::asio::any_io_executor& fallback, code c,
            std::string message, boost::system::error_code ec = {}) {
  detail::post_completion(
      fallback, std::move(h), ec,
      session_start{.session = nullptr, .code = c, .message = std::move(message)});
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
    return refuse(std::move(handler), ex, code::action_denied,
                  "tool: ticket does not grant tool.run for " +
                      detail::quote_for_message(entry->name));
  }

  // 3. The level: the stronger of the entry's and the ticket's; the network (the entry's own
  //    egress) only at container or stronger; the weakest registered backend at or above.
  isolation need = is_at_least(entry->isolation, t.isolation()) ? entry->isolation : t.isolation();
  if (!entry->egress.empty() && !is_at_least(need, isolation::container))
    need = isolation::container;
  std::shared_ptr<backend> chosen;
  for (isolation l :
       {isolation::process, isolation::container, isolation::gvisor, isolation::microvm}) {
    if (!is_at_least(l, need)) continue;
    if (auto b = impl->backend_at(l)) {
      chosen = std::move(b);
      break;
    }
  }
  if (!chosen) {
    return refuse(std::move(handler), ex, code::runtime_unavailable,
                  "isolation: no backend at level '" + std::string(to_string(need)) +
                      "' or stronger on this host");
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
  auto lifetime = std::min(request.max_lifetime.value_or(opts.default_lifetime), opts.max_lifetime);
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
  session_job sj{.idle_timeout = idle,
                 .stdin_buffer_bytes = std::max<std::uint32_t>(opts.stdin_buffer_bytes, 1)};
  chosen->open_session(std::move(job), sj, std::move(handler));
}

}  // namespace sandbox
