// The host-side egress proxy of a network run (private to src/).
//
// A run granted `code.network` reaches the outside only through this proxy: the sandbox gets a
// listening TCP socket on loopback inside its own network namespace, the host serves it here.
// The proxy speaks just enough HTTP/1.1 to know where a client wants to go, decides from the
// run's grant (approved domains, ports, budgets), resolves names on the host, refuses
// non-public addresses unless a test resolver pinned them, and relays bytes. For HTTPS it
// reads the ClientHello's SNI and requires it to name the CONNECT host before a single byte
// goes upstream; only for a run that uses a secret or has L7 rules does it then terminate TLS
// (see `egress_grant::ca`). L7 rules (l7_rules.hpp) judge each request to a host they name:
// plain-HTTP requests here, requests inside terminated TLS in `terminated_http`.
//
// Three parts (src/core/egress/): the parsers (parsers.hpp: pure, fuzzed), the resolvers
// (resolvers.hpp: every way a name becomes addresses), and this, the Asio proxy, which also
// judges the addresses it is given (`address_refusal`).
//
// Reasons recorded in `egress_attempt.reason` (short, stable strings; `allowed` is true exactly
// when the reason is "approved"):
//   approved                          the request was let through (it may still end by idle
//                                     timeout, by either side closing, or by stop())
//   domain not approved               the host name matches no pattern of the grant (also: a
//                                     host that is not a valid name)
//   port not approved                 port not in `connect_ports` (CONNECT) / `http_ports`
//   direct IP not allowed             an IP literal (IPv4 in any inet_aton form, [IPv6])
//   address refused: <class>          every resolved address is non-public; <class> is what
//                                     `address_refusal` returns for the first of them
//   resolution failed                 the resolver failed or returned no address
//   connect failed                    no resolved address accepted a TCP connection
//   SNI does not match CONNECT host   the ClientHello names another server
//   no SNI                            the ClientHello names no server
//   not TLS                           the tunnel's first bytes are not a TLS ClientHello (or
//                                     the client closed before completing one)
//   connection limit                  the run already used `max_connections` connections
//   byte limit                        the run's byte budget is spent (recorded on the attempt
//                                     that crossed it and on later requests)
//   malformed request                 not a strict HTTP/1.1 request head (see
//                                     `parse_http_request_head`), Host mismatch, bad authority
//   unsupported request               Transfer-Encoding request bodies, https:// or other
//                                     schemes in absolute-form, HTTP versions other than 1.0/1.1
//   timeout                           the client was too slow to send its head or ClientHello,
//                                     or resolving and connecting took over `connect_timeout`
//   proxy stopped                     stop() came before a decision was made
//   origin_unverified                 (terminated TLS) the origin's certificate or name did
//                                     not verify, or its TLS handshake failed: a 403 to the
//                                     client inside the tunnel, nothing sent upstream
//   tls handshake failed              (terminated TLS) the client refused the run CA's leaf
//   malformed response                (terminated TLS) the origin's response is not strict
//                                     HTTP/1.1; the tunnel is closed
//   secret_misuse                     a secret's placeholder in the request head (CONNECT
//                                     target, URL, Host or any header) or in a plain-HTTP
//                                     body: refused 403 before anything goes upstream, or,
//                                     for a body part already relaying, the connection closed;
//                                     in a terminated tunnel: anywhere in a request but its
//                                     secret's header to its domains
//   rule_refused                      (L7 rules) no rule of the host allows the request's
//                                     method and path; also a CONNECT to a host with rules in
//                                     a run whose CA could not be made (rules cannot be
//                                     enforced inside an unterminated tunnel)
//   budget_exhausted                  (L7 rules) the rule's request or byte budget is spent:
//                                     the request is refused; a response that would cross
//                                     the byte budget is cut there and the connection closed
//   unsafe_path                       (L7 rules) the target's path could mean something else
//                                     to the origin than its bytes say (l7_rules.hpp)
// The L7 refusals are a 403 whose JSON body also names the rule (`"rule"`) and says what
// would be allowed; their attempts carry `method`, `path` and `rule`, as do the requests a
// rule admitted (in a terminated tunnel, each request is then its own attempt).
#pragma once

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/system/error_code.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/egress/l7_rules.hpp"
#include "core/egress/resolvers.hpp"
#include "core/egress/run_ca.hpp"
#include "core/egress/terminated_http.hpp"
#include "sandbox/protocol.hpp"

namespace sandbox::detail {

/**
 * nullopt when the proxy may connect to `a`; otherwise the class of address that is refused:
 * "unspecified", "this network" (0/8), "loopback", "private" (RFC 1918), "shared" (CGNAT
 * 100.64/10), "link-local" (169.254/16, fe80::/10), "metadata" (169.254.169.254,
 * fd00:ec2::254), "multicast", "broadcast", "reserved" (240/4, 192.0.0/24), "documentation",
 * "benchmarking" (198.18/15), "unique-local" (fc00::/7), "site-local" (fec0::/10), "discard"
 * (100::/64), "teredo" (2001::/32), "nat64-local" (64:ff9b:1::/48). IPv4-mapped (::ffff:0:0/96),
 * IPv4-translated (::ffff:0:0:0/96), IPv4-compatible (::/96), NAT64 (64:ff9b::/96) and 6to4
 * (2002::/16) forms are judged by the IPv4 address they carry.
 */
std::optional<std::string> address_refusal(const boost::asio::ip::address& a);

/// What a run may reach through its proxy, and how much. Plain value; defaults are the grant of
/// a run that asked for HTTPS to its approved domains.
struct egress_grant {
  std::vector<std::string> domains;               ///< canonical patterns (sandbox/egress.hpp)
  std::vector<std::uint16_t> connect_ports{443};  ///< ports allowed for CONNECT (HTTPS)
  std::vector<std::uint16_t> http_ports{80};      ///< ports allowed for plain HTTP forwarding
  std::uint32_t max_connections = 32;          ///< per run, in total (accepted client connections)
  std::uint64_t max_bytes_up = 16ULL << 20;    ///< per run, client→upstream bytes, in total
  std::uint64_t max_bytes_down = 64ULL << 20;  ///< per run, upstream→client bytes, in total
  /// Resolving and connecting upstream, all addresses together.
  std::chrono::milliseconds connect_timeout{5000};
  /// An open tunnel or response with no byte moving either way for this long is closed.
  std::chrono::milliseconds idle_timeout{30000};
  /// The client's request head, and for CONNECT its ClientHello, must arrive within this.
  std::chrono::milliseconds handshake_timeout{10000};
  /// Marks of the run's secret placeholders (secret_scan.hpp, `placeholder_marks`): a request
  /// whose head (target, Host, any header) or plain-HTTP body holds one is refused
  /// "secret_misuse". Empty: the run has no secrets.
  std::vector<std::string> secret_marks;
  /// The run's secrets (for a run that uses one and has a CA).
  std::vector<secret_injection> secrets;
  /// The run's L7 rules (the ticket's that apply to its domains; sandbox/egress.hpp), with
  /// their budgets counted over the run. A plain-HTTP request to a host they name is judged
  /// before anything goes upstream; HTTPS to such a host needs `ca` (else the CONNECT is
  /// refused "rule_refused": rules are never skipped), and is judged request by request.
  std::vector<egress_rule> rules;
  /// The run's CA (run_ca.hpp), set for a run that uses a secret or has rules: each HTTPS
  /// tunnel is then terminated after the SNI check, with a leaf of `ca` for the CONNECT host,
  /// and re-encrypted to the origin, whose certificate and name must verify against
  /// OpenSSL's default trust store and `origin_ca_file`. Its requests and responses go
  /// through `terminated_http` (the value into its header, echoes redacted, rules judged).
  /// Unset: the tunnel is relayed as it is.
  std::shared_ptr<run_ca> ca;
  /// An extra PEM file of CAs trusted for origins (`egress_proxy_options::origin_ca_file`).
  std::string origin_ca_file;
};

/// nullopt when `path` (egress_proxy_options::origin_ca_file) is empty or an absolute path to
/// a file OpenSSL reads at least one PEM certificate from; otherwise why not, as
/// "egress.origin_ca_file: ...". The runtime refuses to start with a bad one, rather than
/// have every terminated tunnel refused `origin_unverified`.
std::optional<std::string> origin_ca_file_problem(const std::string& path);

/// Most attempts an `egress_proxy` reports; the rest are only counted (`dropped()`).
inline constexpr std::size_t max_recorded_egress_attempts = 256;

/**
 * One run's egress proxy, serving an already-listening TCP socket.
 *
 * Each accepted connection carries one request: `CONNECT host:port` (recorded as protocol
 * "https") or one absolute-form `http://` request (protocol "http"). Both need a host name
 * matching the grant and an approved port; the name is resolved by `resolver`, non-public
 * addresses are dropped unless the answer is pinned, and the proxy connects to a validated
 * address (never re-resolving). A CONNECT tunnel then carries nothing upstream until the
 * client's ClientHello names the CONNECT host. Refusals are answered with
 * `egress_denial_response` while the client still speaks HTTP.
 *
 * Every accepted connection is one `egress_attempt`, reported to `on_attempt` when the
 * connection is over — after all its handlers ran — with final byte counts (bytes_up: bytes
 * written upstream, the rewritten HTTP head included; bytes_down: bytes written to the client
 * from upstream; the proxy's own 200/4xx/5xx answers are not counted). At most
 * `max_recorded_egress_attempts` are reported, the rest counted by `dropped()`.
 *
 * Bounded: per connection a 16 KiB head buffer, an 18 KiB ClientHello buffer and two 16 KiB
 * relay buffers (a terminated tunnel adds two TLS sessions and `terminated_http`'s bounded
 * buffers: a 16 KiB head each way, a request of at most 64 KiB held while it is judged); at most
 * `max_connections` served connections plus 8 being refused at a time (more are closed at once and
 * recorded). Threads: everything runs on a strand of `ex`; `on_attempt` runs there, must not block
 * or throw, and may call `stop()`. Lifetime: a started proxy keeps itself alive while it listens,
 * so the run's owner must call `stop()` when the run ends (dropping the last `shared_ptr` does not
 * stop it).
 */
class egress_proxy : public std::enable_shared_from_this<egress_proxy> {
  struct private_tag {};

 public:
  using attempt_sink = std::function<void(sandbox::egress_attempt)>;

  /// Takes ownership of `listener_fd` (a listening TCP socket, IPv4 or IPv6; made
  /// close-on-exec) and serves it on a strand of `ex` until `stop()`. Returns nullptr, closing
  /// the fd, when it is not a listening stream socket.
  static std::shared_ptr<egress_proxy> start(boost::asio::any_io_executor ex, int listener_fd,
                                             egress_grant grant,
                                             std::shared_ptr<egress_resolver> resolver,
                                             attempt_sink on_attempt);

  /// Closes the listener and every connection. Every attempt is reported exactly once, by the
  /// time the handlers have run, with its final byte counts; undecided ones get "proxy
  /// stopped". Idempotent; callable from any thread (it posts to the strand).
  void stop();
  /// `stop()`, then `on_stopped` (on the proxy's strand) once every session has been
  /// reported. A session waiting for the host's resolver reports when the lookup returns,
  /// so a caller that must not wait long bounds the wait itself.
  void stop(std::function<void()> on_stopped);

  /// Attempts not reported because `max_recorded_egress_attempts` were already. Any thread.
  std::uint64_t dropped() const noexcept { return dropped_.load(std::memory_order_relaxed); }

  egress_proxy(private_tag, boost::asio::any_io_executor ex, egress_grant grant,
               std::shared_ptr<egress_resolver> resolver, attempt_sink on_attempt);
  egress_proxy(const egress_proxy&) = delete;
  egress_proxy& operator=(const egress_proxy&) = delete;

 private:
  class session;

  void accept_next();
  void on_accept(boost::system::error_code ec, boost::asio::ip::tcp::socket socket);
  void do_stop();
  /// Calls `on_stopped_` once stopped with no session left.
  void maybe_stopped();
  /// Reports (or counts) `a`, and forgets session `id`.
  void finish_session(std::uint64_t id, bool over_limit, sandbox::egress_attempt a);
  void record(sandbox::egress_attempt a);
  /// Takes up to `n` bytes of the up (client→upstream) or down budget; returns how many.
  std::uint64_t take_budget(bool up, std::uint64_t n);
  /// Bytes the up budget still allows.
  std::uint64_t budget_left_up() const noexcept;
  /// Either budget is used up: new requests are refused "byte limit".
  bool budget_spent() const noexcept;
  /// The budget is spent: close every tunnel.
  void close_tunnels();

  boost::asio::strand<boost::asio::any_io_executor> strand_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer retry_timer_;  // after a transient accept error (EMFILE, ...)
  egress_grant grant_;
  l7_rules rules_;  // grant_.rules, with what their budgets used
  std::shared_ptr<egress_resolver> resolver_;
  attempt_sink on_attempt_;
  bool stopped_ = false;
  std::function<void()> on_stopped_;
  std::uint32_t accepted_ = 0;   // connections served within max_connections
  std::uint32_t refusing_ = 0;   // over-limit connections being answered now
  std::uint64_t used_up_ = 0;    // budget taken, client→upstream
  std::uint64_t used_down_ = 0;  // budget taken, upstream→client
  std::size_t recorded_ = 0;
  std::atomic<std::uint64_t> dropped_{0};
  std::uint64_t next_id_ = 0;
  std::unordered_map<std::uint64_t, std::weak_ptr<session>> sessions_;
};

}  // namespace sandbox::detail
