// A network run's egress proxy (egress_wiring.hpp).
#include "core/run/egress_wiring.hpp"

#include <boost/asio/dispatch.hpp>
#include <chrono>

#include "core/egress/secret_scan.hpp"

namespace sandbox::detail {

namespace asio = boost::asio;

egress_wiring::egress_wiring(asio::strand<asio::any_io_executor> strand)
    : strand_(strand), timer_(strand) {}

egress_wiring::~egress_wiring() { stop(); }  // (normally stopped at teardown; idempotent)

void egress_wiring::start(int listener, std::vector<std::string> domains,
                          std::vector<std::string> placeholders, const egress_proxy_options& o,
                          std::shared_ptr<egress_resolver> resolver, std::weak_ptr<void> owner,
                          std::function<void(egress_attempt)> record) {
  egress_grant g;
  g.domains = std::move(domains);
  g.connect_ports = o.connect_ports;
  g.http_ports = o.http_ports;
  g.max_connections = o.max_connections;
  g.max_bytes_up = o.max_bytes_up;
  g.max_bytes_down = o.max_bytes_down;
  g.secret_marks = placeholder_marks(placeholders);
  proxy_ =
      egress_proxy::start(strand_, listener, std::move(g), std::move(resolver),
                          [owner = std::move(owner), record = std::move(record)](egress_attempt a) {
                            if (auto self = owner.lock()) record(std::move(a));
                          });
}

bool egress_wiring::drained(std::shared_ptr<void> keep, std::function<void()> resume) {
  if (!proxy_ || drained_) return true;
  if (stop_requested_) return false;
  stop_requested_ = true;
  auto done = [this, keep, resume = std::move(resume)] {
    if (drained_) return;
    drained_ = true;
    timer_.cancel();
    resume();
  };
  proxy_->stop([this, done] { asio::dispatch(strand_, done); });
  timer_.expires_after(std::chrono::seconds(2));
  timer_.async_wait([done](boost::system::error_code ec) {
    if (!ec) done();
  });
  return false;
}

}  // namespace sandbox::detail
