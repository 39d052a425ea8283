// The egress proxy's resolvers (resolvers.hpp).
#include "core/egress/resolvers.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/error.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <set>
#include <string_view>

#include "protocol/text_util.hpp"
#include "sandbox/egress.hpp"

namespace sandbox::detail {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

class system_resolver final : public egress_resolver {
 public:
  system_resolver(asio::any_io_executor ex, bool fully_qualified)
      : ex_(std::move(ex)), fully_qualified_(fully_qualified) {}

  void async_resolve(const std::string& host,
                     std::function<void(boost::system::error_code, answer)> done) override {
    // One resolver per lookup, so concurrent lookups never cancel each other.
    auto r = std::make_shared<tcp::resolver>(ex_);
    const bool dot = fully_qualified_ && !host.empty() && host.back() != '.';
    r->async_resolve(
        dot ? host + "." : host, "", tcp::resolver::numeric_service,
        [r, done = std::move(done)](boost::system::error_code ec,
                                    const tcp::resolver::results_type& results) {
          answer a;
          for (const auto& e : results) {
            const auto addr = e.endpoint().address();
            if (a.addresses.size() == 16) break;
            if (std::find(a.addresses.begin(), a.addresses.end(), addr) == a.addresses.end()) {
              a.addresses.push_back(addr);
            }
          }
          if (!ec && a.addresses.empty()) ec = asio::error::host_not_found;
          done(ec, std::move(a));
        });
  }

 private:
  asio::any_io_executor ex_;
  bool fully_qualified_;
};

// Names compare case-insensitively, one trailing dot ignored.
std::string resolver_key(std::string_view name) {
  if (!name.empty() && name.back() == '.') name.remove_suffix(1);
  std::string key(name);
  for (char& c : key) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return key;
}

class static_resolver final : public egress_resolver {
 public:
  static_resolver(std::map<std::string, std::vector<asio::ip::address>> names, bool pinned)
      : pinned_(pinned) {
    for (auto& [name, addresses] : names) names_[resolver_key(name)] = std::move(addresses);
  }

  void async_resolve(const std::string& host,
                     std::function<void(boost::system::error_code, answer)> done) override {
    const auto it = names_.find(resolver_key(host));
    if (it == names_.end()) {
      done(asio::error::host_not_found, {});
      return;
    }
    done({}, answer{.addresses = it->second, .pinned = pinned_});
  }

 private:
  std::map<std::string, std::vector<asio::ip::address>> names_;
  bool pinned_;
};

// The operator's pinned names (trusted answers), then the host's resolver for the rest.
class pinned_then_system_resolver final : public egress_resolver {
 public:
  pinned_then_system_resolver(std::shared_ptr<egress_resolver> pinned,
                              std::set<std::string> pinned_names,
                              std::shared_ptr<egress_resolver> system)
      : pinned_(std::move(pinned)), names_(std::move(pinned_names)), system_(std::move(system)) {}
  void async_resolve(const std::string& host,
                     std::function<void(boost::system::error_code, answer)> done) override {
    auto canonical = canonical_egress_pattern(host);
    if (canonical && names_.contains(*canonical))
      return pinned_->async_resolve(*canonical, std::move(done));
    system_->async_resolve(host, std::move(done));
  }

 private:
  std::shared_ptr<egress_resolver> pinned_;
  std::set<std::string> names_;
  std::shared_ptr<egress_resolver> system_;
};

// The operator's resolver function (egress_proxy_options::resolver): its answers are not
// pinned, so the proxy checks their addresses; unparsable entries are dropped.
class function_resolver final : public egress_resolver {
 public:
  using fn = std::function<void(const std::string&, std::function<void(std::vector<std::string>)>)>;
  explicit function_resolver(fn f) : f_(std::move(f)) {}
  void async_resolve(const std::string& host,
                     std::function<void(boost::system::error_code, answer)> done) override {
    auto once = std::make_shared<std::atomic<bool>>(false);
    auto call = [done = std::move(done), once](std::vector<std::string> addresses) {
      if (once->exchange(true)) return;
      answer a;
      for (const auto& t : addresses) {
        boost::system::error_code ec;
        auto addr = asio::ip::make_address(t, ec);
        if (!ec) a.addresses.push_back(addr);
      }
      const auto ec = a.addresses.empty() ? make_error_code(asio::error::host_not_found)
                                          : boost::system::error_code();
      done(ec, std::move(a));
    };
    try {
      auto canonical = canonical_egress_pattern(host);  // the form the operator configured
      f_(canonical ? *canonical : host, std::move(call));
    } catch (...) {
      // An operator's resolver that throws answers nothing.
    }
  }

 private:
  fn f_;
};

}  // namespace

std::shared_ptr<egress_resolver> make_system_resolver(asio::any_io_executor ex,
                                                      bool fully_qualified) {
  return std::make_shared<system_resolver>(std::move(ex), fully_qualified);
}

std::shared_ptr<egress_resolver> make_static_resolver(
    std::map<std::string, std::vector<asio::ip::address>> names, bool pinned) {
  return std::make_shared<static_resolver>(std::move(names), pinned);
}

std::variant<std::shared_ptr<egress_resolver>, std::string> make_egress_resolver(
    asio::any_io_executor ex, const std::map<std::string, std::vector<std::string>>& pinned,
    std::function<void(const std::string&, std::function<void(std::vector<std::string>)>)>
        fallback) {
  std::map<std::string, std::vector<asio::ip::address>> names;
  for (const auto& [name, addresses] : pinned) {
    auto canonical = canonical_egress_pattern(name);
    if (!canonical || canonical->starts_with("*.")) {
      return fmt::format("egress.pinned_hosts: {} is not a host name",
                         detail::quote_for_message(name));
    }
    auto& out = names[*canonical];
    for (const auto& a : addresses) {
      boost::system::error_code ec;
      auto addr = asio::ip::make_address(a, ec);
      if (ec) {
        return fmt::format("egress.pinned_hosts[{}]: {} is not an IP address",
                           detail::quote_for_message(name), detail::quote_for_message(a));
      }
      out.push_back(addr);
    }
    if (out.empty()) {
      return fmt::format("egress.pinned_hosts[{}]: no address", detail::quote_for_message(name));
    }
  }
  std::set<std::string> keys;
  for (const auto& [n, _] : names) keys.insert(n);
  std::shared_ptr<egress_resolver> rest =
      fallback ? std::make_shared<function_resolver>(std::move(fallback))
               : make_system_resolver(ex);
  return std::make_shared<pinned_then_system_resolver>(make_static_resolver(std::move(names)),
                                                       std::move(keys), std::move(rest));
}

}  // namespace sandbox::detail
