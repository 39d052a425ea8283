// The egress proxy's resolvers (core/egress/resolvers.hpp): the host's, the static one of
// tests, and what `make_egress_resolver` gives network runs (pinned names first, then the
// operator's function or the host's resolver).
#include "core/egress/resolvers.hpp"

#include <boost/asio/error.hpp>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/egress/egress_proxy.hpp"

namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using namespace sandbox::detail;

asio::ip::address ip(const char* s) { return asio::ip::make_address(s); }

// The answer of `r` for `host` (resolved on `io`, which runs until it comes).
std::pair<boost::system::error_code, egress_resolver::answer> resolve(asio::io_context& io,
                                                                      egress_resolver& r,
                                                                      const std::string& host) {
  std::optional<std::pair<boost::system::error_code, egress_resolver::answer>> got;
  r.async_resolve(host, [&](boost::system::error_code ec, egress_resolver::answer a) {
    got.emplace(ec, std::move(a));
  });
  io.restart();
  while (!got && io.run_one_for(10s) > 0) {
  }
  REQUIRE(got);
  return std::move(*got);
}

}  // namespace

TEST_CASE("egress: the system resolver answers unpinned", "[egress]") {
  asio::io_context io;
  auto resolver = make_system_resolver(io.get_executor(), false);  // /etc/hosts: not qualified
  std::optional<egress_resolver::answer> got;
  boost::system::error_code got_ec;
  resolver->async_resolve("localhost",
                          [&](boost::system::error_code ec, egress_resolver::answer a) {
                            got_ec = ec;
                            got = std::move(a);
                          });
  io.run_for(10s);
  REQUIRE(got);
  REQUIRE_FALSE(got_ec);
  CHECK_FALSE(got->pinned);
  REQUIRE_FALSE(got->addresses.empty());
  for (const auto& a : got->addresses) CHECK(address_refusal(a) == std::string("loopback"));

  auto fixed = make_static_resolver({{"Api.Example.com.", {ip("127.0.0.1")}}});
  fixed->async_resolve("api.example.com",
                       [&](boost::system::error_code ec, egress_resolver::answer a) {
                         CHECK_FALSE(ec);
                         CHECK(a.pinned);
                         CHECK(a.addresses == std::vector{ip("127.0.0.1")});
                       });
  fixed->async_resolve("other.example.com",
                       [&](boost::system::error_code ec, egress_resolver::answer) {
                         CHECK(ec == asio::error::host_not_found);
                       });
}

TEST_CASE("egress: make_egress_resolver answers pinned names, then the operator's function",
          "[egress]") {
  asio::io_context io;
  std::vector<std::string> asked;
  auto made = make_egress_resolver(
      io.get_executor(), {{"Rates.Internal.Example.", {"10.20.0.7", "fd00::7"}}},
      [&](const std::string& host, std::function<void(std::vector<std::string>)> answer) {
        asked.push_back(host);
        answer({"203.0.113.9", "not an address", "2001:db8::1"});
        answer({"198.51.100.1"});  // a second answer is ignored
      });
  REQUIRE(std::holds_alternative<std::shared_ptr<egress_resolver>>(made));
  auto& r = *std::get<std::shared_ptr<egress_resolver>>(made);

  // A pinned name, in any case and with a trailing dot: the operator's addresses, trusted.
  auto [ec, a] = resolve(io, r, "rates.internal.example");
  CHECK_FALSE(ec);
  CHECK(a.pinned);
  CHECK(a.addresses == std::vector{ip("10.20.0.7"), ip("fd00::7")});
  CHECK(asked.empty());

  // Any other name: the function, asked with the canonical name; its answers are not
  // trusted, and what is not an address is dropped.
  auto [ec2, b] = resolve(io, r, "API.Example.com.");
  CHECK_FALSE(ec2);
  CHECK_FALSE(b.pinned);
  CHECK(b.addresses == std::vector{ip("203.0.113.9"), ip("2001:db8::1")});
  CHECK(asked == std::vector<std::string>{"api.example.com"});
}

TEST_CASE("egress: make_egress_resolver names a malformed pinned entry", "[egress]") {
  asio::io_context io;
  const auto reason = [&](std::map<std::string, std::vector<std::string>> pinned) {
    auto made = make_egress_resolver(io.get_executor(), pinned);
    return std::holds_alternative<std::string>(made) ? std::get<std::string>(made) : "";
  };
  CHECK(reason({{"*.example.com", {"10.0.0.1"}}}) ==
        "egress.pinned_hosts: '*.example.com' is not a host name");
  CHECK(reason({{"api.example.com", {"localhost"}}}) ==
        "egress.pinned_hosts['api.example.com']: 'localhost' is not an IP address");
  CHECK(reason({{"api.example.com", {}}}) == "egress.pinned_hosts['api.example.com']: no address");
  CHECK(reason({{"api.example.com", {"10.0.0.1"}}}).empty());
  // An operator's function that answers nothing leaves the name unresolved.
  auto made = make_egress_resolver(
      io.get_executor(), {},
      [](const std::string&, std::function<void(std::vector<std::string>)> answer) { answer({}); });
  auto [ec, a] = resolve(io, *std::get<std::shared_ptr<egress_resolver>>(made), "x.example");
  CHECK(ec == asio::error::host_not_found);
  CHECK(a.addresses.empty());
}
