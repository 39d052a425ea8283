// The host-side egress proxy of a network run (private to src/).
//
// A run granted `code.network` reaches the outside only through this proxy: the sandbox gets a
// listening TCP socket on loopback inside its own network namespace, the host serves it here.
// The proxy speaks just enough HTTP/1.1 to know where a client wants to go, decides from the
// run's grant (approved domains, ports, budgets), resolves names on the host, refuses
// non-public addresses unless a test resolver pinned them, and relays bytes. It never
// decrypts: for HTTPS it reads the ClientHello's SNI and requires it to name the CONNECT host
// before a single byte goes upstream.
//
// The parsers below are pure (bytes in, values out, no I/O, bounded work and memory), so they
// are fuzzed (tests/fuzz/egress_fuzz.cpp). `egress_proxy` is the Asio part.
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
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sandbox/protocol.hpp"

namespace sandbox::detail {

// ---------------------------------------------------------------------------------------------
// Pure parsing

/// Largest ClientHello handshake message accepted, header included, in bytes.
inline constexpr std::size_t max_client_hello_bytes = 16384;
/// Most bytes of TLS records (headers included) read while looking for a complete ClientHello;
/// `tls_client_hello_sni` never answers `need_more` for an input this long or longer.
inline constexpr std::size_t max_client_hello_wire_bytes = 18432;

enum class sni_status {
  need_more,  ///< a prefix of a plausible ClientHello: read more bytes
  found,      ///< a complete ClientHello with a host_name server name (in `name`)
  absent,     ///< a complete ClientHello without a host_name (no extensions, or no SNI)
  malformed,  ///< not a TLS ClientHello, or one that breaks RFC 8446 / RFC 6066 rules
};

struct sni_result {
  sni_status status = sni_status::need_more;
  std::string name;  ///< for `found`: the host_name as sent, 1..255 bytes of 0x21..0x7E
};

/**
 * The SNI host_name of the TLS ClientHello at the start of `bytes` (RFC 8446 §4.1.2, §5.1;
 * RFC 6066 §3).
 *
 * Reads handshake records (content type 22, version 3.x, 1..16384 bytes each); the ClientHello
 * may span several records but must fit in `max_client_hello_bytes` and its records in
 * `max_client_hello_wire_bytes`. Strict: the first handshake message must be a ClientHello; no
 * other record type before it is complete; no bytes after it in its last record; the
 * extensions block fills the message exactly; no extension type twice; a server_name list
 * holds exactly host_name entries, at most one. Bytes after the last record of the ClientHello
 * are ignored (they belong to the tunnel). A malformed prefix is `malformed` as soon as it is
 * seen; a prefix of a valid ClientHello is `need_more`. Never reads outside `bytes`.
 */
sni_result tls_client_hello_sni(std::span<const std::uint8_t> bytes);

enum class http_head_status {
  need_more,  ///< no error so far, the head is not complete
  complete,   ///< a complete, valid head (`head_bytes` long)
  malformed,  ///< breaks the strict grammar below
  too_large,  ///< no complete head within the size or header-count bound
};

/// Most header fields in one request head.
inline constexpr std::size_t max_http_header_fields = 100;

/// A parsed HTTP/1.1 request head. Names keep the client's case; values are trimmed of OWS.
struct http_request_head {
  std::string method, target, version;
  std::vector<std::pair<std::string, std::string>> headers;
  std::size_t head_bytes = 0;  ///< bytes of the head, final CRLF CRLF included

  /// The value of the first header named `name` (case-insensitive), or nullptr.
  const std::string* find(std::string_view name) const;
};

/**
 * Parses the request line and header fields at the start of `buf` (RFC 9112 §2–§5), strictly:
 * every line ends in CRLF (a bare LF, or a CR not followed by LF, is malformed); the request
 * line is `token SP 1*VCHAR SP HTTP/DIGIT.DIGIT` with single spaces; no empty line before it;
 * field names are tokens with no whitespace before the ':'; no obs-fold (a line starting with
 * SP or HTAB); field values hold no control characters but HTAB. Request smuggling forms are
 * malformed: Host or Content-Length twice, Transfer-Encoding with Content-Length, a
 * Content-Length that is not 1*DIGIT within 64 bits. `too_large` when no head is complete
 * within `max_head_bytes` or it has more than `max_http_header_fields` fields. Bytes after the
 * head (a body) are not looked at.
 */
std::pair<http_head_status, http_request_head> parse_http_request_head(
    std::string_view buf, std::size_t max_head_bytes = 16384);

/// The authority of a request: `host[:port]`.
struct http_authority {
  std::string host;         ///< as written (an IPv6 literal without its brackets)
  std::uint16_t port = 0;   ///< explicit port, or the default given to `parse_authority`
  bool ip_literal = false;  ///< a bracketed IPv6 literal, or a host whose last label is a
                            ///< number (decimal, 0x-hex): what URL parsers treat as IPv4
};

/**
 * Parses an RFC 3986 authority `host[:port]` without userinfo. `default_port` 0 means the port
 * is required (CONNECT's authority-form). The port is 1*5 DIGIT in 1..65535. The host is a
 * bracketed IPv6 literal or 1..255 bytes of unreserved / sub-delims / '%' characters (not
 * decoded: a percent-encoded name never matches a pattern). nullopt when malformed.
 */
std::optional<http_authority> parse_authority(std::string_view s, std::uint16_t default_port);

/// An absolute-form request target split in parts (RFC 9112 §3.2.2).
struct absolute_target {
  std::string scheme;       ///< lowered ("http")
  std::string authority;    ///< as written
  std::string origin_form;  ///< path (at least "/") and query: what the origin server gets
};

/// Splits `scheme "://" authority path-abempty [ "?" query ]`; nullopt for any other form (a
/// fragment, no "//", an empty authority, bytes outside VCHAR).
std::optional<absolute_target> parse_absolute_target(std::string_view target);

/**
 * The head the proxy sends upstream for a plain-HTTP request: `head.method SP origin_form SP
 * head.version`, the client's fields minus `Proxy-*` fields, hop-by-hop fields (Connection,
 * Keep-Alive, TE, Trailer, Transfer-Encoding, Upgrade) and fields that Connection names, then
 * `Connection: close`. Field order is kept. Input must come from `parse_http_request_head`.
 */
std::string rewrite_http_request_head(const http_request_head& head, std::string_view origin_form);

/// `host` fit for a record or a message: bytes outside 0x21..0x7E and '\' become `\xNN`, the
/// result is cut to at most 253 bytes (never inside an escape).
std::string display_host(std::string_view host);

/**
 * The complete HTTP response the proxy answers a refusal with: `HTTP/1.1 <status> <phrase>`,
 * `Content-Type: application/json`, `Content-Length`, `Connection: close` and a JSON body
 * `{"error": ..., "reason": reason, "host": host, "advice": ...}` a model can read. `error` is
 * "egress_denied" (403), "egress_failed" (502, 504), "bad_request" (400, 431) or "unsupported"
 * (501). `host` is escaped with `display_host`.
 */
std::string egress_denial_response(unsigned status, std::string_view reason, std::string_view host);

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

// ---------------------------------------------------------------------------------------------
// The proxy

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
};

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
 * relay buffers; at most `max_connections` served connections plus 8 being refused at a time
 * (more are closed at once and recorded). Threads: everything runs on a strand of `ex`;
 * `on_attempt` runs there, must not block or throw, and may call `stop()`. Lifetime: a started
 * proxy keeps itself alive while it listens, so the run's owner must call `stop()` when the run
 * ends (dropping the last `shared_ptr` does not stop it).
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
