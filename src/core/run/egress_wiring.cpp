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

std::string egress_wiring::prepare_ca(const std::string& run_id,
                                      const std::vector<std::string>& domains) {
  if (ca_tried_) return {};
  ca_tried_ = true;
  std::string why;
  ca_ = run_ca::create(run_id, domains, why);
  if (ca_) return {};
  return why.empty() ? std::string("the run CA could not be made") : why;
}

std::string_view egress_wiring::ca_pem() const noexcept {
  return ca_ ? std::string_view(ca_->cert_pem()) : std::string_view();
}

void egress_wiring::start(int listener, std::vector<std::string> domains,
                          const std::vector<run_secret>& secrets, std::vector<egress_rule> rules,
                          const egress_proxy_options& o, std::shared_ptr<egress_resolver> resolver,
                          std::weak_ptr<void> owner, std::function<void(egress_attempt)> record) {
  egress_grant g;
  g.domains = std::move(domains);
  g.connect_ports = o.connect_ports;
  g.http_ports = o.http_ports;
  g.max_connections = o.max_connections;
  g.max_bytes_up = o.max_bytes_up;
  g.max_bytes_down = o.max_bytes_down;
  std::vector<std::string> placeholders;
  for (const auto& s : secrets) {
    placeholders.push_back(s.placeholder);
    const std::string_view header = s.definition.header;
    const auto colon = header.find(':');
    if (!s.value || colon == std::string_view::npos) continue;
    std::string_view tmpl = header.substr(colon + 1);
    while (!tmpl.empty() && (tmpl.front() == ' ' || tmpl.front() == '\t')) tmpl.remove_prefix(1);
    g.secrets.push_back(secret_injection{.placeholder = s.placeholder,
                                         .value = s.value,
                                         .domains = s.definition.domains,
                                         .header_name = std::string(header.substr(0, colon)),
                                         .header_template = std::string(tmpl)});
  }
  g.secret_marks = placeholder_marks(placeholders);
  g.rules = std::move(rules);
  if (ca_ && (!g.secrets.empty() || !g.rules.empty())) {
    g.ca = ca_;
    g.origin_ca_file = o.origin_ca_file;
  } else {
    g.secrets.clear();
  }
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
