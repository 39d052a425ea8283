// A network run's egress proxy, as the run machine holds it (private to src/).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/egress/egress_proxy.hpp"
#include "sandbox/backend.hpp"
#include "sandbox/backend_options.hpp"
#include "sandbox/egress.hpp"
#include "sandbox/protocol.hpp"

namespace sandbox::detail {

/**
 * Serves one network run's egress proxy (core/egress) on the listener made in the run's
 * network namespace, hands each attempt it reports to the run's evidence, and stops it at
 * teardown: the run's connections end with the run, each recorded with its final bytes
 * before the result is made — waited for at most 2 s (a name lookup on the host reports
 * only when it returns; later records are dropped).
 *
 * Thread-safety: strand only; the proxy's reports reach `record` through the strand-bound
 * owner check below. Lifetime: the proxy's reports hold only a weak reference to the owner
 * (they are dropped once the run is gone); the drain's waits hold a strong one, so the run
 * lives until its proxy drained. The destructor stops the proxy (idempotent).
 */
class egress_wiring {
 public:
  explicit egress_wiring(boost::asio::strand<boost::asio::any_io_executor> strand);
  ~egress_wiring();
  egress_wiring(const egress_wiring&) = delete;
  egress_wiring& operator=(const egress_wiring&) = delete;

  /**
   * A run with secrets or L7 rules: makes its CA (run_ca.hpp) for `domains`, once. Its
   * certificate is then `ca_pem()`; its key stays here and goes with this object (the run's
   * end). When OpenSSL fails there is no CA: the proxy then never terminates TLS, so a
   * placeholder is all the run can send (it is still refused where it may not go), and HTTPS
   * to a host with rules is refused. Returns why the CA could not be made, for the host log
   * (empty when it was, or was tried before).
   */
  std::string prepare_ca(const std::string& run_id, const std::vector<std::string>& domains);
  /// The run CA's certificate (PEM); empty without one.
  std::string_view ca_pem() const noexcept;

  /// Serves the proxy on `listener` (taken) for `domains` under `options`, refusing the run's
  /// `secrets`' placeholders where they may not go and, with a CA (`prepare_ca`), putting
  /// their values into their headers inside terminated TLS, and enforcing the run's L7
  /// `rules`; each attempt goes to `record` on the strand while `owner` lives.
  void start(int listener, std::vector<std::string> domains, const std::vector<run_secret>& secrets,
             std::vector<egress_rule> rules, const egress_proxy_options& options,
             std::shared_ptr<egress_resolver> resolver, std::weak_ptr<void> owner,
             std::function<void(egress_attempt)> record);
  /// True once a proxy serves the run.
  bool serving() const noexcept { return proxy_ != nullptr; }

  /**
   * Teardown: true when there is no proxy or it drained (go on). Otherwise the proxy is
   * asked to stop (once) and false is returned: `resume` then runs once on the strand when
   * every connection has been reported or 2 s passed; `keep` (the run) is held until then.
   */
  bool drained(std::shared_ptr<void> keep, std::function<void()> resume);
  /// Stops the proxy now without waiting for its reports (the run's destructor).
  void stop() noexcept {
    if (proxy_) proxy_->stop();
  }

 private:
  boost::asio::strand<boost::asio::any_io_executor> strand_;
  boost::asio::steady_timer timer_;  ///< bounds the drain (2 s)
  std::shared_ptr<egress_proxy> proxy_;
  std::shared_ptr<run_ca> ca_;  ///< a run with secrets; shared with the proxy's grant
  bool ca_tried_ = false;
  bool stop_requested_ = false;  ///< teardown asked it to stop
  bool drained_ = false;         ///< it reported every session (or 2 s passed)
};

}  // namespace sandbox::detail
