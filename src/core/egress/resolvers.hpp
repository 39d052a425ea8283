// Name resolution for the egress proxy (private to src/): the sandbox never resolves anything
// itself; the host does, here.
//
// Every resolver of the proxy is in this file: the host's system resolver, the static one of
// tests, and what network runs get from `make_egress_resolver` — the operator's pinned names
// (trusted answers) first, then the operator's resolver function or the host's resolver
// (untrusted answers, whose addresses the proxy judges with `address_refusal` before it
// connects).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/system/error_code.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace sandbox::detail {

/// Host-side name resolution for the proxy; the sandbox never resolves anything itself.
class egress_resolver {
 public:
  struct answer {
    std::vector<boost::asio::ip::address> addresses;
    /// Explicitly mapped by the host's configuration (tests): exempt from `address_refusal`.
    bool pinned = false;
  };
  virtual ~egress_resolver() = default;
  /// Resolves `host` (a canonical name) and calls `done` exactly once, from any thread,
  /// possibly before returning. The proxy bounds the wait with `connect_timeout`.
  virtual void async_resolve(const std::string& host,
                             std::function<void(boost::system::error_code, answer)> done) = 0;
};

/// The resolver of network runs' egress proxies: `pinned` names (egress_proxy_options) answer
/// with their fixed, trusted addresses; other names go to `fallback` (untrusted answers) or,
/// when it is empty, the host's resolver. A reason (naming the entry) when a pinned name or
/// address is malformed.
std::variant<std::shared_ptr<egress_resolver>, std::string> make_egress_resolver(
    boost::asio::any_io_executor ex, const std::map<std::string, std::vector<std::string>>& pinned,
    std::function<void(const std::string&, std::function<void(std::vector<std::string>)>)>
        fallback = {});

/// The host's resolver (getaddrinfo through Asio) running on `ex`; answers are not pinned and
/// hold at most 16 addresses. `fully_qualified`: names are looked up with a trailing dot, so
/// resolv.conf's search list never turns an approved name that does not exist into a name of
/// the host's own domain; false only for names that live in /etc/hosts (glibc does not match
/// those with a trailing dot), as tests do.
std::shared_ptr<egress_resolver> make_system_resolver(boost::asio::any_io_executor ex,
                                                      bool fully_qualified = true);

/// For tests: name → addresses (names compared case-insensitively, one trailing dot ignored);
/// unknown names fail with `host_not_found`; answers are `pinned` unless `pinned` is false
/// (then they go through `address_refusal` like real DNS answers). Calls `done` inline.
std::shared_ptr<egress_resolver> make_static_resolver(
    std::map<std::string, std::vector<boost::asio::ip::address>> names, bool pinned = true);

}  // namespace sandbox::detail
