// The callback approver and the check of an approver's derived ticket (sandbox/approval.hpp).
#include "sandbox/approval.hpp"

#include <boost/asio/associated_cancellation_slot.hpp>
#include <mutex>
#include <utility>

namespace sandbox {
namespace {

using handler_type =
    boost::asio::any_completion_handler<void(boost::system::error_code, approval_decision)>;

/// The handler of one question, shared by every copy of its `approval_callback`: the first
/// call completes it; the last copy dropped uncalled destroys it uncalled.
class pending_answer {
 public:
  explicit pending_answer(handler_type h) : handler_(std::move(h)) {}
  void answer(approval_decision d) {
    std::optional<handler_type> h;
    {
      std::lock_guard lk(mu_);
      if (!handler_) return;
      h = std::move(handler_);
      handler_.reset();
    }
    std::move (*h)(boost::system::error_code{}, std::move(d));
  }

 private:
  std::mutex mu_;
  std::optional<handler_type> handler_;
};

class callback_approver final : public approver {
 public:
  explicit callback_approver(std::function<void(approval_request, approval_callback)> ask)
      : ask_(std::move(ask)) {}

 private:
  void do_approve(approval_request request, handler_type handler) override {
    auto pending = std::make_shared<pending_answer>(std::move(handler));
    if (!ask_) {
      pending->answer(approval_decision::defer("no approval function installed"));
      return;
    }
    ask_(std::move(request), [pending](approval_decision d) { pending->answer(std::move(d)); });
  }
  std::function<void(approval_request, approval_callback)> ask_;
};

}  // namespace

std::shared_ptr<approver> make_callback_approver(
    std::function<void(approval_request, approval_callback)> ask) {
  return std::make_shared<callback_approver>(std::move(ask));
}

std::optional<std::string> check_derived_ticket(const ticket& parent,
                                                const approval_request& request,
                                                const ticket& derived,
                                                std::chrono::system_clock::time_point now) {
  if (!derived.approval() || *derived.approval() != request) {
    return "the derived ticket does not answer this approval request";
  }
  if (auto why = check_derivation(parent, derived, now)) return why;
  if (derived.is_expired(now)) return "the derived ticket is expired";
  return std::nullopt;
}

}  // namespace sandbox
