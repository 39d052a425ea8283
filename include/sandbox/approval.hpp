// Network by approval: the hook through which a human (or a policy service) lets one run reach
// the network although its ticket does not grant `code.network`.
//
// A host installs an `approver` in `runtime_options::approver`. When a request with
// `network: true` arrives under a ticket without `code.network`, and everything else about
// it admits (`admit_pending_approval`, the inputs exist), the runtime builds an
// `approval_request` (sandbox/protocol.hpp) — the domains, the program's and inputs' hashes,
// the isolation level, the image — and asks. The run never starts before the answer:
//
//   - approve, with a ticket derived from the run's ticket (`ticket_issuer::derive`): the
//     runtime checks that ticket (`check_derived_ticket`; never trusted) and runs under it,
//     reaching only the approved domains; a ticket broader than the approval is
//     `action_denied` and nothing starts;
//   - deny: the run ends `approval_denied`;
//   - defer: the run ends `approval_required` with the approval request in
//     `run_result::approval`, so the host can checkpoint, ask a human at leisure, and resume
//     by submitting the same request under the derived ticket.
//
// Without an approver such a request is `action_denied`, as before.
#pragma once

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/system/error_code.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "sandbox/protocol.hpp"
#include "sandbox/ticket.hpp"

namespace sandbox {

/// The three answers an approver can give.
enum class approval_verdict : std::uint8_t {
  approve,  ///< run, under `approval_decision::derived`
  deny,     ///< never run this: `approval_denied`
  defer,    ///< not now: `approval_required`, the host asks and resumes later
};

/// An approver's answer. Build one with `approve`, `deny` or `defer`.
struct approval_decision {
  approval_verdict verdict = approval_verdict::defer;
  /// For `approve`: the ticket the run proceeds under, minted with `ticket_issuer::derive`
  /// from the run's ticket and the approval request. Checked by the runtime before use.
  std::optional<ticket> derived;
  /// For `deny` and `defer`: why, for the result's message (escaped, at most 200 bytes kept).
  std::string reason;

  /// Approves the run under `derived`.
  static approval_decision approve(ticket derived) {
    return {approval_verdict::approve, std::move(derived), {}};
  }
  /// Refuses the run.
  static approval_decision deny(std::string reason = {}) {
    return {approval_verdict::deny, std::nullopt, std::move(reason)};
  }
  /// Answers "ask again later": the run ends `approval_required`.
  static approval_decision defer(std::string reason = {}) {
    return {approval_verdict::defer, std::nullopt, std::move(reason)};
  }
};

/**
 * The approval hook. Implementations decide how to ask (a UI prompt, a chat message, a policy
 * service) and must be thread-safe.
 *
 * `async_approve` completes once with `(error_code, approval_decision)`. The runtime's handler
 * may be invoked on any thread, at any time, even inside `async_approve` (it re-posts to the
 * runtime's executor); it has no associated executor of its own (the system executor). A
 * non-zero error code means the approver failed: the run ends `approval_required` with the
 * approval request, like a deferral. The handler's cancellation slot is emitted (type
 * `terminal`, on the runtime's executor) when the run is cancelled or the runtime is
 * destroyed while the question is pending; an approver may then withdraw its question and
 * complete with `operation_aborted`, or ignore it. An answer after that, or from a handler
 * kept after its runtime is gone, is ignored; a handler destroyed without being invoked ends
 * the run `approval_required`.
 */
class approver {
 public:
  virtual ~approver() = default;

  /// Asks about `request`; see the class comment. Works with any completion token.
  template <class CompletionToken>
  auto async_approve(approval_request request, CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken,
                                       void(boost::system::error_code, approval_decision)>(
        [this](auto handler, approval_request r) { do_approve(std::move(r), std::move(handler)); },
        token, std::move(request));
  }

 private:
  virtual void do_approve(
      approval_request request,
      boost::asio::any_completion_handler<void(boost::system::error_code, approval_decision)>
          handler) = 0;
};

/// The callback an approver built by `make_callback_approver` answers through. Copyable;
/// callable from any thread; only its first call counts.
using approval_callback = std::function<void(approval_decision)>;

/**
 * An approver from a plain function: `ask(request, answer)` is called on the runtime's
 * executor for each question and must not block; call `answer` once, now or later, from any
 * thread. Dropping every copy of `answer` without calling it ends the run
 * `approval_required`. Cancellation is not forwarded (a late answer is ignored).
 *
 *   runtime_options o;
 *   o.approver = sandbox::make_callback_approver(
 *       [&](sandbox::approval_request req, sandbox::approval_callback answer) {
 *         ui.ask(req, [answer, req, parent](bool yes) {
 *           if (!yes) return answer(sandbox::approval_decision::deny("declined"));
 *           answer(sandbox::approval_decision::approve(
 *               sandbox::ticket_issuer{}.derive(parent, req).value()));
 *         });
 *       });
 */
std::shared_ptr<approver> make_callback_approver(
    std::function<void(approval_request, approval_callback)> ask);

/**
 * Why `derived` may not answer `request` for a run under `parent` at `now`, or
 * `std::nullopt` when it may. The runtime calls this on every approval (an approver's ticket
 * is never trusted): `derived.approval()` must be exactly `request`; `check_derivation(parent,
 * derived, now)` must pass (same tenant, no wider isolation/ceilings, an expiry at most
 * `max_derived_ttl` away and not after the parent's, domains within the requested ones,
 * isolation at least `container`, the image pinned to `request.runtime.digest`); and it must
 * not be expired at `now`.
 */
std::optional<std::string> check_derived_ticket(const ticket& parent,
                                                const approval_request& request,
                                                const ticket& derived,
                                                std::chrono::system_clock::time_point now);

}  // namespace sandbox
