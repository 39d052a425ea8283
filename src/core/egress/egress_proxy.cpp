// The host-side egress proxy (egress_proxy.hpp): the addresses it refuses, how it judges a
// request head, one session per accepted connection, and the proxy that accepts them.
#include "core/egress/egress_proxy.hpp"

#include <fcntl.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/append.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>

#include "core/egress/parsers.hpp"
#include "core/egress/secret_scan.hpp"
#include "sandbox/egress.hpp"

namespace sandbox::detail {

namespace asio = boost::asio;
using asio::ip::tcp;

// ---------------------------------------------------------------------------------------------
// Addresses

namespace {

std::optional<std::string> v4_refusal(const asio::ip::address_v4& a) {
  const std::uint32_t v = a.to_uint();
  const auto in = [v](std::uint32_t net, int bits) {
    const std::uint32_t mask = bits == 0 ? 0 : ~std::uint32_t{0} << (32 - bits);
    return (v & mask) == net;
  };
  if (v == 0) return "unspecified";
  if (in(0x00000000, 8)) return "this network";
  if (in(0x7F000000, 8)) return "loopback";
  if (in(0x0A000000, 8) || in(0xAC100000, 12) || in(0xC0A80000, 16)) return "private";
  if (in(0x64400000, 10)) return "shared";
  if (v == 0xA9FEA9FE) return "metadata";  // 169.254.169.254
  if (in(0xA9FE0000, 16)) return "link-local";
  if (in(0xE0000000, 4)) return "multicast";
  if (v == 0xFFFFFFFF) return "broadcast";
  if (in(0xF0000000, 4) || in(0xC0000000, 24)) return "reserved";
  if (in(0xC0000200, 24) || in(0xC6336400, 24) || in(0xCB007100, 24)) return "documentation";
  if (in(0xC6120000, 15)) return "benchmarking";
  return std::nullopt;
}

asio::ip::address_v4 v4_at(const asio::ip::address_v6::bytes_type& b, std::size_t at) {
  return asio::ip::address_v4(
      asio::ip::address_v4::bytes_type{b[at], b[at + 1], b[at + 2], b[at + 3]});
}

std::optional<std::string> v6_refusal(const asio::ip::address_v6& a) {
  const auto b = a.to_bytes();
  const auto prefix_zero = [&](std::size_t n) {
    return std::all_of(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n),
                       [](std::uint8_t x) { return x == 0; });
  };
  if (a.is_unspecified()) return "unspecified";
  if (a.is_loopback()) return "loopback";
  // ::ffff:a.b.c.d (mapped) and ::a.b.c.d (compatible, deprecated): judged as IPv4.
  if (prefix_zero(10) && b[10] == 0xFF && b[11] == 0xFF) return v4_refusal(v4_at(b, 12));
  if (prefix_zero(12)) return v4_refusal(v4_at(b, 12));
  // ::ffff:0:a.b.c.d (IPv4-translated, RFC 2765).
  if (prefix_zero(8) && b[8] == 0xFF && b[9] == 0xFF && b[10] == 0 && b[11] == 0) {
    return v4_refusal(v4_at(b, 12));
  }
  // 64:ff9b::/96 (NAT64 well-known prefix, RFC 6052): judged as the IPv4 it reaches.
  if (b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xFF && b[3] == 0x9B &&
      std::all_of(b.begin() + 4, b.begin() + 12, [](std::uint8_t x) { return x == 0; })) {
    return v4_refusal(v4_at(b, 12));
  }
  // 64:ff9b:1::/48 (local-use NAT64, RFC 8215): where it leads is the operator's choice.
  if (b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xFF && b[3] == 0x9B && b[4] == 0x00 &&
      b[5] == 0x01) {
    return "nat64-local";
  }
  if (b[0] == 0x20 && b[1] == 0x02) return v4_refusal(v4_at(b, 2));  // 6to4, RFC 3056
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x00 && b[3] == 0x00) return "teredo";
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x0D && b[3] == 0xB8) return "documentation";
  if (b[0] == 0x01 && b[1] == 0x00 &&
      std::all_of(b.begin() + 2, b.begin() + 8, [](std::uint8_t x) { return x == 0; })) {
    return "discard";  // 100::/64
  }
  if (b[0] == 0xFF) return "multicast";
  if (b[0] == 0xFE && (b[1] & 0xC0) == 0x80) return "link-local";
  if (b[0] == 0xFE && (b[1] & 0xC0) == 0xC0) return "site-local";
  if (a == asio::ip::make_address_v6("fd00:ec2::254")) return "metadata";  // AWS IMDS over IPv6
  if ((b[0] & 0xFE) == 0xFC) return "unique-local";
  return std::nullopt;
}
}  // namespace

std::optional<std::string> address_refusal(const asio::ip::address& a) {
  return a.is_v4() ? v4_refusal(a.to_v4()) : v6_refusal(a.to_v6());
}

std::optional<std::string> origin_ca_file_problem(const std::string& path) {
  if (path.empty()) return std::nullopt;
  if (path.front() != '/') return "egress.origin_ca_file: not an absolute path";
  X509_STORE* store = X509_STORE_new();
  if (store == nullptr) return "egress.origin_ca_file: out of memory";
  const bool loaded = X509_STORE_load_file(store, path.c_str()) == 1;
  const bool any = loaded && sk_X509_OBJECT_num(X509_STORE_get0_objects(store)) > 0;
  X509_STORE_free(store);
  if (!any) return "egress.origin_ca_file: " + path + ": no PEM certificate could be read";
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// The proxy

namespace {

constexpr std::size_t head_buffer_bytes = 16384;        // also the head size bound
constexpr std::size_t relay_buffer_bytes = 16384;       // per direction
constexpr std::uint32_t max_refusing = 8;               // over-limit connections answered at once
constexpr std::size_t max_candidates = 8;               // resolved addresses tried
constexpr std::size_t max_linger_bytes = 65536;         // read and dropped after a refusal
constexpr std::uint64_t max_judged_body_bytes = 65536;  // with secrets: read whole, then judged
constexpr std::chrono::milliseconds max_linger{2000};
constexpr std::chrono::milliseconds accept_retry{100};
constexpr std::string_view connect_established = "HTTP/1.1 200 Connection established\r\n\r\n";

// Sockets Asio opens are not close-on-exec; the host's spawner closes stray descriptors in
// its children, and this keeps any other fork+exec of the embedding process from leaking them.
void set_cloexec(int fd) noexcept {
  if (fd >= 0) (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);
}

// The record of a connection closed before its request was read.
sandbox::egress_attempt unheard_attempt(std::string reason) {
  sandbox::egress_attempt a;
  a.protocol = "http";
  a.reason = std::move(reason);
  return a;
}

// What the proxy makes of a complete request head before any I/O: what was asked (recorded
// even when refused), then either a refusal or what to do next.
struct request_verdict {
  bool connect = false;         // CONNECT (recorded "https"), else an absolute-form http:// request
  std::string asked_host;       // as the client wrote it (recorded escaped)
  std::uint16_t port = 0;       // 0 when no authority could be read
  unsigned status = 0;          // a refusal's HTTP status; 0: go on
  std::string reason;           // a refusal's reason
  std::string host_name;        // canonical: what to resolve
  std::uint64_t body_left = 0;  // plain HTTP: request body bytes to forward
  std::string upstream_head;    // plain HTTP: the head sent upstream
  std::string origin_form;      // plain HTTP: the target as the origin gets it
};

// Judges `head` against the grant. Order: what was asked, then limits, then the grant, so the
// record names the host and port even when the answer is a refusal. (The run's byte budget is
// the proxy's to check.)
request_verdict judge_request(const http_request_head& head, const egress_grant& grant,
                              bool over_limit) {
  request_verdict v;
  const auto refuse = [&v](unsigned status, std::string reason) {
    v.status = status;
    v.reason = std::move(reason);
    return std::move(v);
  };
  v.connect = head.method == "CONNECT";
  std::optional<http_authority> auth;
  std::optional<absolute_target> target;
  if (v.connect) {
    auth = parse_authority(head.target, 0);
    if (!auth) {
      v.asked_host = head.target;
      return refuse(400, "malformed request");
    }
  } else {
    target = parse_absolute_target(head.target);
    if (!target) return refuse(400, "malformed request");
    auth = parse_authority(target->authority, target->scheme == "https" ? 443 : 80);
    if (!auth) {
      v.asked_host = target->authority;
      return refuse(400, "malformed request");
    }
  }
  v.asked_host = auth->host;
  v.port = auth->port;
  if (over_limit) return refuse(403, "connection limit");
  if (head.version != "HTTP/1.1" && head.version != "HTTP/1.0") {
    return refuse(501, "unsupported request");
  }
  if (!v.connect) {
    if (target->scheme != "http") return refuse(501, "unsupported request");
    // The origin must see the request the proxy judged: one host, named twice alike.
    const std::string* host_field = head.find("Host");
    const auto host_auth = host_field ? parse_authority(*host_field, 80) : std::nullopt;
    if (!host_auth || !same_host(host_auth->host, auth->host) || host_auth->port != auth->port) {
      return refuse(400, "malformed request");
    }
    if (head.find("Transfer-Encoding") != nullptr) return refuse(501, "unsupported request");
  }
  if (auth->ip_literal) return refuse(403, "direct IP not allowed");
  const auto name = canonical_host_name(auth->host);
  if (!name || !egress_allowed(grant.domains, *name)) return refuse(403, "domain not approved");
  const auto& ports = v.connect ? grant.connect_ports : grant.http_ports;
  if (std::find(ports.begin(), ports.end(), auth->port) == ports.end()) {
    return refuse(403, "port not approved");
  }
  if (!v.connect) {
    const std::string* length = head.find("Content-Length");
    v.body_left = length != nullptr ? parse_content_length(*length).value_or(0) : 0;
    v.upstream_head = rewrite_http_request_head(head, target->origin_form);
    v.origin_form = target->origin_form;
  }
  v.host_name = *name;
  return v;
}

// The addresses of a resolver's answer the proxy may connect to (at most `max_candidates`, in
// order) and, when there is none, why: the first refused address and its class. A pinned
// answer is trusted as it is (the operator's configuration, or a test's).
struct address_choice {
  std::vector<asio::ip::address> candidates;
  std::string refused_address;
  std::optional<std::string> refusal;
};

address_choice choose_addresses(const egress_resolver::answer& a) {
  // DNS-rebinding defence: each address is judged here, and only those judged are connected to.
  address_choice out;
  for (const auto& address : a.addresses) {
    if (out.candidates.size() == max_candidates) break;
    if (!a.pinned) {
      if (auto why = address_refusal(address)) {
        if (!out.refusal) {
          out.refusal = std::move(why);
          out.refused_address = address.to_string();
        }
        continue;
      }
    }
    out.candidates.push_back(address);
  }
  return out;
}

// The client's socket for the TLS server end of a terminated tunnel: the bytes the proxy
// already read (the ClientHello it judged) are read again first, then the socket's own.
class replay_socket {
 public:
  using executor_type = tcp::socket::executor_type;
  using lowest_layer_type = tcp::socket::lowest_layer_type;

  replay_socket(tcp::socket& socket, std::string first)
      : socket_(&socket), first_(std::move(first)) {}

  executor_type get_executor() noexcept { return socket_->get_executor(); }
  lowest_layer_type& lowest_layer() noexcept { return socket_->lowest_layer(); }

  template <class MutableBuffers, class Handler>
  void async_read_some(const MutableBuffers& buffers, Handler&& handler) {
    if (!first_.empty()) {
      const std::size_t n = asio::buffer_copy(buffers, asio::buffer(first_));
      first_.erase(0, n);
      asio::post(socket_->get_executor(),
                 asio::append(std::forward<Handler>(handler), boost::system::error_code{}, n));
      return;
    }
    socket_->async_read_some(buffers, std::forward<Handler>(handler));
  }

  template <class ConstBuffers, class Handler>
  void async_write_some(const ConstBuffers& buffers, Handler&& handler) {
    socket_->async_write_some(buffers, std::forward<Handler>(handler));
  }

 private:
  tcp::socket* socket_;
  std::string first_;
};

}  // namespace

/**
 * One accepted client connection and its one request, from the head to the last byte.
 *
 * Every asynchronous operation is started through `track`, which counts it in `outstanding_`;
 * the attempt is reported once the session is closed and no operation is outstanding, so the
 * byte counts are final. While the session lives its deadline timer always has a wait pending,
 * so closing it (which cancels that wait) always ends in a completion that reports.
 */
class egress_proxy::session : public std::enable_shared_from_this<session> {
 public:
  session(std::shared_ptr<egress_proxy> proxy, std::uint64_t id, tcp::socket client,
          bool over_limit)
      : proxy_(std::move(proxy)),
        id_(id),
        over_limit_(over_limit),
        client_(std::move(client)),
        upstream_(proxy_->strand_),
        timer_(proxy_->strand_) {
    attempt_.protocol = "http";
  }

  void start() {
    buf_.resize(head_buffer_bytes);
    set_phase(phase::head, grant().handshake_timeout);
    wait_timer();
    read_head();
  }

  /// stop(): closes the connection; an attempt still undecided is recorded "proxy stopped".
  void abort() {
    if (phase_ == phase::closed) return;
    if (attempt_.reason.empty()) attempt_.reason = "proxy stopped";
    close();
  }

  /// The run's byte budget is spent: a tunnel or response still relaying ends now.
  void close_tunnel() {
    if (phase_ == phase::relay) close();
  }

 private:
  using clock = std::chrono::steady_clock;
  using error_code = boost::system::error_code;
  enum class phase { head, resolve, connect, reply, hello, relay, deny, linger, closed };

  struct direction {
    bool up = false;        // client → upstream
    bool done = false;      // nothing more to read this way
    bool reading = false;   // a read of the source is in flight
    std::vector<char> buf;  // relay_buffer_bytes
  };

  const egress_grant& grant() const noexcept { return proxy_->grant_; }

  // Wraps a completion handler: counts the operation as outstanding until it completes; once
  // the session is closed the handler body is skipped (unless `Always`, for handlers that
  // must still count bytes) and the attempt is reported when nothing is left outstanding.
  template <bool Always = false, class F>
  auto track(F f) {
    ++outstanding_;
    return [self = shared_from_this(), f = std::move(f)](auto&&... args) mutable {
      --self->outstanding_;
      if (self->phase_ == phase::closed) {
        if constexpr (Always) f(std::forward<decltype(args)>(args)...);
        self->maybe_report();
        return;
      }
      f(std::forward<decltype(args)>(args)...);
    };
  }

  // ----- deadlines: one timer per session, re-armed for the current phase's deadline.

  clock::time_point current_deadline() const {
    return phase_ == phase::relay ? last_activity_ + grant().idle_timeout : deadline_;
  }

  void set_phase(phase p, clock::duration timeout) {
    phase_ = p;
    deadline_ = clock::now() + timeout;
    last_activity_ = clock::now();
    timer_.expires_at(current_deadline());  // cancels the pending wait, which re-arms
  }

  void wait_timer() {
    timer_.async_wait(track([this](error_code) {
      if (clock::now() >= current_deadline()) {
        on_timeout();
        if (phase_ == phase::closed) return;
      }
      timer_.expires_at(current_deadline());
      wait_timer();
    }));
  }

  void on_timeout() {
    switch (phase_) {
      case phase::head:
      case phase::reply:
      case phase::hello:
        return fail("timeout");
      case phase::resolve:
      case phase::connect:
        return deny(504, "timeout");
      case phase::relay:  // idle: the attempt keeps its reason
      case phase::deny:
      case phase::linger:
      case phase::closed:
        return close();
    }
  }

  // ----- the request head

  void read_head() {
    client_.async_read_some(
        asio::buffer(buf_.data() + len_, head_buffer_bytes - len_),
        track([this](error_code ec, std::size_t n) {
          if (phase_ != phase::head) return;
          const std::size_t old = len_;
          len_ += n;
          if (ec) {
            // The client stopped sending before its head was complete. If it only half-closed
            // it can still read why.
            if (len_ > 0 && ec == asio::error::eof) return deny(400, "malformed request");
            return fail("malformed request");
          }
          // Not even the start of a request line (a ClientHello sent without CONNECT, ...).
          if (old == 0 && !could_start_request(buf_[0])) return deny(400, "malformed request");
          // Parse only when a line may have ended or the buffer is full, so a client sending
          // a byte at a time cannot make parsing quadratic.
          const std::string_view fresh(buf_.data() + old, n);
          if (fresh.find('\n') == std::string_view::npos && len_ < head_buffer_bytes) {
            return read_head();
          }
          auto [status, head] =
              parse_http_request_head(std::string_view(buf_.data(), len_), head_buffer_bytes);
          switch (status) {
            case http_head_status::need_more:
              return read_head();
            case http_head_status::malformed:
              return deny(400, "malformed request");
            case http_head_status::too_large:
              return deny(431, "malformed request");
            case http_head_status::complete:
              return on_head(head);
          }
        }));
  }

  // Decides on a complete head: the verdict, then the run's byte budget.
  void on_head(const http_request_head& head) {
    head_bytes_ = head.head_bytes;
    request_verdict v = judge_request(head, grant(), over_limit_);
    connect_ = v.connect;
    attempt_.protocol = connect_ ? "https" : "http";
    asked_host_ = std::move(v.asked_host);
    attempt_.port = v.port;
    // A secret's placeholder anywhere in the head, or in the body bytes already read: the
    // run tried to send it where its value may not go. Before anything else is judged, so the
    // record says so whatever else is wrong with the request.
    if (!grant().secret_marks.empty()) {
      body_scan_.emplace(grant().secret_marks);
      const std::size_t extra = len_ - head_bytes_;
      const std::size_t body_now =
          connect_ ? 0 : static_cast<std::size_t>(std::min<std::uint64_t>(extra, v.body_left));
      if (holds_placeholder(std::string_view(buf_.data(), head_bytes_), grant().secret_marks) ||
          body_scan_->feed(std::string_view(buf_.data() + head_bytes_, body_now))) {
        return deny(403, std::string(secret_misuse_reason));
      }
    }
    if (v.status != 0) return deny(v.status, std::move(v.reason));
    body_left_ = v.body_left;
    upstream_head_ = std::move(v.upstream_head);
    if (proxy_->budget_spent() || proxy_->budget_left_up() < upstream_head_.size()) {
      return deny(403, "byte limit");
    }
    host_name_ = std::move(v.host_name);
    if (proxy_->rules_.applies(host_name_)) {
      if (connect_) {
        // Rules are judged per request, inside the tunnel: without a CA to terminate it they
        // could not be, so the tunnel is refused rather than relayed unjudged.
        if (!grant().ca) {
          return deny(403, std::string(rule_refused_reason), {},
                      "this host's L7 rules cannot be enforced in this run (no run CA): it is "
                      "not reachable over HTTPS");
        }
      } else {
        // Plain HTTP: one request, judged here (its body's length is known: Content-Length).
        l7_verdict lv = proxy_->rules_.admit(host_name_, head.method, v.origin_form, body_left_);
        attempt_.method = display_target(head.method);
        attempt_.path = display_target(target_path(v.origin_form));
        attempt_.rule = lv.rule_names;
        if (!lv.allowed) {
          return deny(lv.status, std::move(lv.reason), std::move(lv.rule_names),
                      std::move(lv.advice));
        }
        rule_ = lv.rule;
      }
    }
    // With secrets, a plain-HTTP body that fits is read whole and judged before anything
    // goes upstream, so a placeholder in it is always a clean 403 (a larger one is judged as
    // it is relayed).
    if (body_scan_ && !connect_ && body_left_ > len_ - head_bytes_ &&
        body_left_ <= max_judged_body_bytes) {
      return read_body();
    }
    resolve();
  }

  // Reads the rest of a plain-HTTP body (`body_left_` bytes after the head) into buf_,
  // scanning each piece for placeholders; then resolves.
  void read_body() {
    const std::size_t want = head_bytes_ + static_cast<std::size_t>(body_left_);
    if (buf_.size() < want) buf_.resize(want);
    if (len_ >= want) return resolve();
    client_.async_read_some(asio::buffer(buf_.data() + len_, want - len_),
                            track([this](error_code ec, std::size_t n) {
                              if (phase_ != phase::head) return;
                              len_ += n;
                              if (ec) return fail("malformed request");
                              if (body_scan_->feed(std::string_view(buf_.data() + len_ - n, n))) {
                                return deny(403, std::string(secret_misuse_reason));
                              }
                              read_body();
                            }));
  }

  // ----- resolving and connecting: on the host, to a validated address, never re-resolved

  void resolve() {
    set_phase(phase::resolve, grant().connect_timeout);
    // Not counted as outstanding: a resolver may take its time, and a closed session does not
    // wait for it (the answer is then ignored).
    auto self = shared_from_this();
    auto strand = proxy_->strand_;
    proxy_->resolver_->async_resolve(host_name_,
                                     [self, strand](error_code ec, egress_resolver::answer a) {
                                       asio::post(strand, [self, ec, a = std::move(a)]() mutable {
                                         self->on_resolved(ec, std::move(a));
                                       });
                                     });
  }

  void on_resolved(error_code ec, egress_resolver::answer a) {
    if (phase_ != phase::resolve) return;  // timed out or stopped meanwhile
    if (ec || a.addresses.empty()) return deny(502, "resolution failed");
    address_choice choice = choose_addresses(a);
    candidates_ = std::move(choice.candidates);
    if (candidates_.empty()) {
      attempt_.address = std::move(choice.refused_address);
      return deny(403, "address refused: " + choice.refusal.value_or("unspecified"));
    }
    phase_ = phase::connect;  // same deadline: connect_timeout covers both
    connect_to(0);
  }

  void connect_to(std::size_t i) {
    for (; i < candidates_.size(); ++i) {
      const tcp::endpoint endpoint(candidates_[i], attempt_.port);
      attempt_.address = candidates_[i].to_string();
      error_code ec;
      upstream_.close(ec);
      upstream_.open(endpoint.protocol(), ec);
      if (ec) continue;
      set_cloexec(upstream_.native_handle());
      upstream_.async_connect(endpoint, track([this, i](error_code ec) {
                                if (phase_ != phase::connect) return;
                                if (ec) return connect_to(i + 1);
                                on_connected();
                              }));
      return;
    }
    deny(502, "connect failed");
  }

  void on_connected() {
    if (!connect_) {
      // Plain HTTP: the rewritten head and the part of the body already read go first; bytes
      // past Content-Length (a second, pipelined request) are never forwarded.
      attempt_.allowed = true;
      attempt_.reason = "approved";
      const std::size_t extra = len_ - head_bytes_;
      const std::size_t body_now =
          static_cast<std::size_t>(std::min<std::uint64_t>(extra, body_left_));
      body_left_ -= body_now;
      pending_up_ = std::move(upstream_head_);
      pending_up_.append(buf_.data() + head_bytes_, body_now);
      return start_relay();
    }
    set_phase(phase::reply, grant().handshake_timeout);
    asio::async_write(client_, asio::buffer(connect_established),
                      track([this](error_code ec, std::size_t) {
                        if (phase_ != phase::reply) return;
                        if (ec) return fail("not TLS");
                        start_hello();
                      }));
  }

  // ----- CONNECT: the ClientHello must name the CONNECT host before anything goes upstream

  void start_hello() {
    set_phase(phase::hello, grant().handshake_timeout);
    hello_.assign(buf_.begin() + static_cast<std::ptrdiff_t>(head_bytes_),
                  buf_.begin() + static_cast<std::ptrdiff_t>(len_));
    check_hello();
  }

  void check_hello() {
    if (!hello_.empty()) {
      const auto sni = tls_client_hello_sni(hello_);
      switch (sni.status) {
        case sni_status::need_more:
          break;
        case sni_status::malformed:
          return fail("not TLS");
        case sni_status::absent:
          return fail("no SNI");
        case sni_status::found:
          // Exact pattern match = equal names, ignoring case and one trailing dot.
          if (!egress_pattern_matches(host_name_, sni.name)) {
            return fail("SNI does not match CONNECT host");
          }
          if (grant().ca && (!grant().secrets.empty() || !proxy_->rules_.empty())) {
            std::string first(hello_.begin(), hello_.end());
            hello_ = {};
            return start_terminate(std::move(first));
          }
          attempt_.allowed = true;
          attempt_.reason = "approved";
          pending_up_.assign(hello_.begin(), hello_.end());
          hello_ = {};
          return start_relay();
      }
    }
    const std::size_t old = hello_.size();
    if (old >= max_client_hello_wire_bytes) return fail("not TLS");  // the parser's bound
    hello_.resize(max_client_hello_wire_bytes);
    client_.async_read_some(asio::buffer(hello_.data() + old, hello_.size() - old),
                            track([this, old](error_code ec, std::size_t n) {
                              if (phase_ != phase::hello) return;
                              hello_.resize(old + n);
                              if (ec) return fail("not TLS");
                              check_hello();
                            }));
  }

  // ----- terminated TLS (a run with secrets): the run CA's leaf to the client, the origin
  // verified, then HTTP/1.1 through `terminated_http` both ways

  void start_terminate(std::string first) {
    set_phase(phase::hello, grant().handshake_timeout);  // both handshakes, from now
    const run_leaf* leaf = grant().ca->leaf_for(host_name_);
    server_ctx_.emplace(asio::ssl::context::tls_server);
    SSL_CTX* sctx = server_ctx_->native_handle();
    if (leaf == nullptr || SSL_CTX_set_min_proto_version(sctx, TLS1_2_VERSION) != 1 ||
        SSL_CTX_use_certificate(sctx, leaf->cert.get()) != 1 ||
        SSL_CTX_use_PrivateKey(sctx, leaf->key.get()) != 1) {
      return fail("tls handshake failed");
    }
    client_tls_.emplace(replay_socket(client_, std::move(first)), *server_ctx_);
    client_tls_->async_handshake(asio::ssl::stream_base::server, track([this](error_code ec) {
                                   if (phase_ != phase::hello) return;
                                   if (ec) return fail("tls handshake failed");
                                   origin_handshake();
                                 }));
  }

  void origin_handshake() {
    origin_ctx_.emplace(asio::ssl::context::tls_client);
    error_code ignored;
    origin_ctx_->set_default_verify_paths(ignored);
    if (!grant().origin_ca_file.empty()) {
      origin_ctx_->load_verify_file(grant().origin_ca_file, ignored);
    }
    origin_ctx_->set_verify_mode(asio::ssl::verify_peer);
    SSL_CTX_set_min_proto_version(origin_ctx_->native_handle(), TLS1_2_VERSION);
    upstream_tls_.emplace(upstream_, *origin_ctx_);
    SSL* ssl = upstream_tls_->native_handle();
    if (SSL_set_tlsext_host_name(ssl, host_name_.c_str()) != 1 ||
        SSL_set1_host(ssl, host_name_.c_str()) != 1) {
      return tls_deny(403, "origin_unverified");
    }
    upstream_tls_->async_handshake(asio::ssl::stream_base::client, track([this](error_code ec) {
                                     if (phase_ != phase::hello) return;
                                     if (ec) return tls_deny(403, "origin_unverified");
                                     attempt_.allowed = true;
                                     attempt_.reason = "approved";
                                     http_.emplace(host_name_, grant().secrets, &proxy_->rules_);
                                     set_phase(phase::relay, {});
                                     up_.up = true;
                                     up_.buf.resize(relay_buffer_bytes);
                                     down_.buf.resize(relay_buffer_bytes);
                                     tls_read_client();
                                     tls_read_origin();
                                   }));
  }

  void tls_read_client() {
    up_.reading = true;
    client_tls_->async_read_some(
        asio::buffer(up_.buf), track([this](error_code ec, std::size_t n) {
          up_.reading = false;
          if (phase_ == phase::linger) {  // the tunnel is ending: drain, bounded
            lingered_ += n;
            if (ec || lingered_ >= max_linger_bytes) return close();
            return tls_linger();
          }
          if (phase_ != phase::relay) return;
          if (ec) {
            // The client is done: once its last response went out, so is the tunnel.
            up_.done = true;
            if (!http_->awaiting_response() && !down_writing_) tls_finish();
            return;
          }
          last_activity_ = clock::now();
          std::string out;
          auto refusal = http_->from_client(std::string_view(up_.buf.data(), n), out);
          for (auto& judged : http_->take_judged()) note_request(std::move(judged));
          if (refusal) return tls_refuse(*refusal);
          if (out.empty()) return tls_read_client();
          if (proxy_->take_budget(true, out.size()) < out.size()) return over_budget();
          up_out_ = std::move(out);
          asio::async_write(*upstream_tls_, asio::buffer(up_out_),
                            track<true>([this](error_code wec, std::size_t written) {
                              attempt_.bytes_up += written;
                              if (phase_ != phase::relay) return;
                              if (wec) return close();
                              last_activity_ = clock::now();
                              tls_read_client();
                            }));
        }));
  }

  void tls_read_origin() {
    upstream_tls_->async_read_some(
        asio::buffer(down_.buf), track([this](error_code ec, std::size_t n) {
          if (phase_ != phase::relay) return;
          std::string out;
          bool last = false;
          bool cut = false;  // its rule's byte budget cut the response: what fit, then close
          if (ec) {
            // The origin closed (with or without close_notify): a response read until close
            // ends here; one cut short ends the tunnel.
            if (!http_->origin_closed(out)) return close();
            last = true;
          } else {
            last_activity_ = clock::now();
            if (auto r = http_->from_origin(std::string_view(down_.buf.data(), n), out)) {
              if (r->reason != budget_exhausted_reason) return close();
              attempt_.allowed = false;
              attempt_.reason = r->reason;
              if (out.empty()) return close();
              cut = true;
            }
          }
          if (out.empty()) return last ? tls_finish() : tls_read_origin();
          if (proxy_->take_budget(false, out.size()) < out.size()) return over_budget();
          down_out_ = std::move(out);
          down_writing_ = true;
          asio::async_write(*client_tls_, asio::buffer(down_out_),
                            track<true>([this, last, cut](error_code wec, std::size_t written) {
                              down_writing_ = false;
                              attempt_.bytes_down += written;
                              if (phase_ != phase::relay) return;
                              if (wec || cut) return close();
                              if (last || (up_.done && !http_->awaiting_response())) {
                                return tls_finish();
                              }
                              last_activity_ = clock::now();
                              tls_read_origin();
                            }));
        }));
  }

  // A request refused inside the tunnel: nothing more goes upstream; the client gets the
  // refusal when no response is on its way to it, else the tunnel just closes.
  void tls_refuse(const http_refusal& refusal) {
    if (down_writing_ || !http_->can_answer_refusal()) {
      attempt_.allowed = false;
      attempt_.reason = refusal.reason;
      return close();
    }
    tls_deny(refusal.status, refusal.reason, refusal.rule, refusal.advice);
  }

  // A request an L7 rule judged inside the tunnel. Each is its own attempt: the one before it
  // on this connection (admitted, or the tunnel would have ended) is recorded now, with the
  // bytes moved since the one before that; this one becomes the session's attempt.
  void note_request(judged_request r) {
    if (judged_any_) {
      sandbox::egress_attempt earlier = attempt_;
      earlier.host = display_host(asked_host_);
      earlier.bytes_up -= base_up_;
      earlier.bytes_down -= base_down_;
      base_up_ = attempt_.bytes_up;
      base_down_ = attempt_.bytes_down;
      proxy_->record(std::move(earlier));
    }
    judged_any_ = true;
    attempt_.method = std::move(r.method);
    attempt_.path = std::move(r.path);
    attempt_.rule = std::move(r.rule);
  }

  // Answers the client inside its TLS session, then closes (after a bounded linger).
  void tls_deny(unsigned status, std::string reason, std::string rule = {},
                std::string advice = {}) {
    prepare_denial(status, std::move(reason), std::move(rule), std::move(advice));
    asio::async_write(*client_tls_, asio::buffer(reply_), track([this](error_code ec, std::size_t) {
      if (phase_ != phase::deny) return;
      if (ec) return close();
      tls_finish();
    }));
  }

  // The last byte for the client is written: no more to or from the origin; the client's
  // side is shut for sending, and what it still sends is read and dropped (bounded in bytes
  // and time) so closing does not reset the connection before it read everything.
  void tls_finish() {
    error_code ignored;
    upstream_.close(ignored);
    client_.shutdown(tcp::socket::shutdown_send, ignored);
    set_phase(phase::linger, linger_timeout());
    tls_linger();
  }

  void tls_linger() {
    if (up_.reading) return;  // the client read in flight drains (tls_read_client)
    up_.reading = true;
    client_tls_->async_read_some(asio::buffer(buf_.data(), buf_.size()),
                                 track([this](error_code ec, std::size_t n) {
                                   up_.reading = false;
                                   if (phase_ != phase::linger) return;
                                   lingered_ += n;
                                   if (ec || lingered_ >= max_linger_bytes) return close();
                                   tls_linger();
                                 }));
  }

  // ----- relaying, with the run's byte budget and the idle timeout

  void start_relay() {
    set_phase(phase::relay, {});
    up_.up = true;
    up_.buf.resize(relay_buffer_bytes);
    down_.buf.resize(relay_buffer_bytes);
    if (!pending_up_.empty()) {
      forward(up_, pending_up_.data(), pending_up_.size());
    } else {
      pump(up_);
    }
    pump(down_);
  }

  tcp::socket& source(const direction& d) noexcept { return d.up ? client_ : upstream_; }
  tcp::socket& sink(const direction& d) noexcept { return d.up ? upstream_ : client_; }

  void pump(direction& d) {
    std::size_t want = d.buf.size();
    if (d.up && !connect_) {  // plain HTTP: the request body only, by Content-Length
      if (body_left_ == 0) {
        d.done = true;
        return;
      }
      want = static_cast<std::size_t>(std::min<std::uint64_t>(want, body_left_));
    }
    d.reading = true;
    source(d).async_read_some(asio::buffer(d.buf.data(), want),
                              track([this, &d](error_code ec, std::size_t n) {
                                d.reading = false;
                                if (phase_ != phase::relay) return;
                                if (ec) return on_source_end(d, ec);
                                last_activity_ = clock::now();
                                if (d.up && !connect_) body_left_ -= n;
                                // A plain-HTTP body carrying a placeholder: this part never
                                // goes upstream, and neither does the rest.
                                if (d.up && !connect_ && body_scan_ &&
                                    body_scan_->feed(std::string_view(d.buf.data(), n))) {
                                  // Still answerable while nothing came back from upstream.
                                  if (!down_started_) {
                                    return deny(403, std::string(secret_misuse_reason));
                                  }
                                  return fail(secret_misuse_reason);
                                }
                                if (!d.up) down_started_ = true;
                                forward(d, d.buf.data(), n);
                              }));
  }

  // Writes `n` bytes of `data` (alive until the write completes) the way of `d`, as far as
  // the run's budget allows.
  void forward(direction& d, const char* data, std::size_t n) {
    auto granted = static_cast<std::size_t>(proxy_->take_budget(d.up, n));
    if (granted == 0) return over_budget();
    bool crossed = granted < n;
    // A plain-HTTP response under an L7 rule: its bytes count against the rule's byte
    // budget (the request body was reserved when the request was admitted), cut at its end.
    bool rule_crossed = false;
    if (!d.up && !connect_ && rule_ != no_rule) {
      const auto fits = static_cast<std::size_t>(proxy_->rules_.take_bytes(rule_, granted));
      rule_crossed = fits < granted;
      granted = fits;
      if (granted == 0) return over_rule_budget();
    }
    asio::async_write(
        sink(d), asio::buffer(data, granted),
        track<true>([this, &d, crossed, rule_crossed](error_code ec, std::size_t written) {
          (d.up ? attempt_.bytes_up : attempt_.bytes_down) += written;
          if (phase_ != phase::relay) return;
          if (ec) return close();
          if (rule_crossed) return over_rule_budget();
          if (crossed) return over_budget();
          last_activity_ = clock::now();
          pump(d);
        }));
  }

  void over_budget() {
    attempt_.allowed = false;
    attempt_.reason = "byte limit";
    close();
    proxy_->close_tunnels();
  }

  // A response crossed its L7 rule's byte budget: cut where it crossed.
  void over_rule_budget() {
    attempt_.allowed = false;
    attempt_.reason = budget_exhausted_reason;
    close();
  }

  void on_source_end(direction& d, error_code ec) {
    if (ec != asio::error::eof) return close();
    d.done = true;
    error_code ignored;
    if (!connect_) {
      // The client closed before its body was complete: the request is cut, so is the rest.
      if (d.up) return close();
      // The response is complete (the origin closed: Connection: close). Tell the client, and
      // give it time to read before the socket goes (closing with unread input would reset).
      upstream_.close(ignored);
      if (up_.reading) return close();  // still reading a body nobody will answer
      return linger();
    }
    // CONNECT: half-close the other side, keep relaying the other way.
    sink(d).shutdown(tcp::socket::shutdown_send, ignored);
    if (up_.done && down_.done) close();
  }

  // ----- refusals and endings

  std::chrono::milliseconds linger_timeout() const {
    return std::min(grant().handshake_timeout, max_linger);
  }

  // What both refusals (plain `deny`, `tls_deny` inside a terminated tunnel) do before
  // writing: the attempt recorded as refused, the origin dropped, `reply_` made, the phase
  // set with the linger deadline.
  void prepare_denial(unsigned status, std::string reason, std::string rule = {},
                      std::string advice = {}) {
    attempt_.allowed = false;
    attempt_.reason = std::move(reason);
    error_code ignored;
    upstream_.close(ignored);
    reply_ = egress_denial_response(status, attempt_.reason, asked_host_, rule, advice);
    set_phase(phase::deny, linger_timeout());
  }

  // Answers the client with `status` (over-limit connections always get 403 "connection
  // limit"), then lingers. Only called when no read of the client is in flight.
  void deny(unsigned status, std::string reason, std::string rule = {}, std::string advice = {}) {
    if (over_limit_) {
      status = 403;
      reason = "connection limit";
      rule.clear();
      advice.clear();
    }
    prepare_denial(status, std::move(reason), std::move(rule), std::move(advice));
    asio::async_write(client_, asio::buffer(reply_), track([this](error_code ec, std::size_t) {
                        if (phase_ != phase::deny) return;
                        if (ec) return close();
                        linger();
                      }));
  }

  // After the last byte to the client: shut down sending, read and drop what the client still
  // sends (bounded in bytes and time), then close.
  void linger() {
    error_code ignored;
    client_.shutdown(tcp::socket::shutdown_send, ignored);
    set_phase(phase::linger, linger_timeout());
    linger_read();
  }

  void linger_read() {
    client_.async_read_some(asio::buffer(buf_.data(), buf_.size()),
                            track([this](error_code ec, std::size_t n) {
                              if (phase_ != phase::linger) return;
                              lingered_ += n;
                              if (ec || lingered_ >= max_linger_bytes) return close();
                              linger_read();
                            }));
  }

  // Refuses without an HTTP answer (the client no longer speaks HTTP, or is gone).
  void fail(std::string_view reason) {
    attempt_.allowed = false;
    attempt_.reason = reason;
    close();
  }

  void close() {
    if (phase_ == phase::closed) return;
    phase_ = phase::closed;
    error_code ignored;
    client_.close(ignored);
    upstream_.close(ignored);
    timer_.cancel();
    if (outstanding_ == 0) {
      asio::post(proxy_->strand_, [self = shared_from_this()] { self->maybe_report(); });
    }
  }

  void maybe_report() {
    if (phase_ != phase::closed || outstanding_ != 0 || reported_) return;
    reported_ = true;
    attempt_.host = display_host(asked_host_);
    attempt_.bytes_up -= base_up_;  // the earlier requests of a tunnel were recorded apart
    attempt_.bytes_down -= base_down_;
    if (over_limit_) {
      attempt_.allowed = false;
      attempt_.reason = "connection limit";
    }
    proxy_->finish_session(id_, over_limit_, std::move(attempt_));
  }

  std::shared_ptr<egress_proxy> proxy_;
  const std::uint64_t id_;
  const bool over_limit_;
  tcp::socket client_;
  tcp::socket upstream_;
  asio::steady_timer timer_;
  phase phase_ = phase::head;
  clock::time_point deadline_;
  clock::time_point last_activity_;
  int outstanding_ = 0;
  bool reported_ = false;
  sandbox::egress_attempt attempt_;

  std::vector<char> buf_;       // the request head (and what followed it); later, lingering
  std::size_t len_ = 0;         // bytes in buf_
  std::size_t head_bytes_ = 0;  // of them, the head
  bool connect_ = false;
  std::string asked_host_;       // as the client wrote it (recorded escaped)
  std::string host_name_;        // canonical
  std::uint64_t body_left_ = 0;  // plain HTTP: request body bytes still to forward
  std::string upstream_head_;
  std::vector<asio::ip::address> candidates_;
  std::string reply_;
  std::vector<std::uint8_t> hello_;
  std::string pending_up_;  // first bytes upstream: the ClientHello, or the head and body start
  std::optional<placeholder_scanner> body_scan_;  // plain HTTP with secrets: the request body
  bool down_started_ = false;                     // a byte came back from upstream
  direction up_;
  direction down_;
  std::size_t lingered_ = 0;
  // Terminated TLS (contexts before the streams that use them).
  std::optional<asio::ssl::context> server_ctx_;
  std::optional<asio::ssl::context> origin_ctx_;
  std::optional<asio::ssl::stream<replay_socket>> client_tls_;
  std::optional<asio::ssl::stream<tcp::socket&>> upstream_tls_;
  std::optional<terminated_http> http_;
  std::string up_out_;
  std::string down_out_;
  bool down_writing_ = false;
  // L7 rules.
  static constexpr std::size_t no_rule = static_cast<std::size_t>(-1);
  std::size_t rule_ = no_rule;  // plain HTTP: the rule that admitted the request
  bool judged_any_ = false;     // terminated: a request of this tunnel was judged by a rule
  std::uint64_t base_up_ = 0;   // terminated: bytes of the earlier requests, recorded apart
  std::uint64_t base_down_ = 0;
};

egress_proxy::egress_proxy(private_tag, asio::any_io_executor ex, egress_grant grant,
                           std::shared_ptr<egress_resolver> resolver, attempt_sink on_attempt)
    : strand_(asio::make_strand(ex)),
      acceptor_(strand_),
      retry_timer_(strand_),
      grant_(std::move(grant)),
      rules_(grant_.rules),
      resolver_(std::move(resolver)),
      on_attempt_(std::move(on_attempt)) {}

std::shared_ptr<egress_proxy> egress_proxy::start(asio::any_io_executor ex, int listener_fd,
                                                  egress_grant grant,
                                                  std::shared_ptr<egress_resolver> resolver,
                                                  attempt_sink on_attempt) {
  const auto int_option = [listener_fd](int name) {
    int value = 0;
    socklen_t len = sizeof(value);
    return ::getsockopt(listener_fd, SOL_SOCKET, name, &value, &len) == 0 ? value : -1;
  };
  sockaddr_storage local{};
  socklen_t local_len = sizeof(local);
  const bool ok =
      listener_fd >= 0 && resolver != nullptr && int_option(SO_TYPE) == SOCK_STREAM &&
      int_option(SO_ACCEPTCONN) == 1 &&
      ::getsockname(listener_fd, reinterpret_cast<sockaddr*>(&local), &local_len) == 0 &&
      (local.ss_family == AF_INET || local.ss_family == AF_INET6);
  if (!ok) {
    if (listener_fd >= 0) ::close(listener_fd);
    return nullptr;
  }
  set_cloexec(listener_fd);
  auto proxy = std::make_shared<egress_proxy>(private_tag{}, std::move(ex), std::move(grant),
                                              std::move(resolver), std::move(on_attempt));
  boost::system::error_code ec;
  proxy->acceptor_.assign(local.ss_family == AF_INET ? tcp::v4() : tcp::v6(), listener_fd, ec);
  if (ec) {
    ::close(listener_fd);
    return nullptr;
  }
  asio::post(proxy->strand_, [proxy] { proxy->accept_next(); });
  return proxy;
}

void egress_proxy::stop() {
  asio::post(strand_, [self = shared_from_this()] { self->do_stop(); });
}

void egress_proxy::stop(std::function<void()> on_stopped) {
  asio::post(strand_, [self = shared_from_this(), f = std::move(on_stopped)]() mutable {
    self->on_stopped_ = std::move(f);
    self->do_stop();
    self->maybe_stopped();
  });
}

void egress_proxy::maybe_stopped() {
  if (!stopped_ || !sessions_.empty() || !on_stopped_) return;
  auto f = std::move(on_stopped_);
  on_stopped_ = nullptr;
  f();
}

void egress_proxy::do_stop() {
  if (stopped_) return;
  stopped_ = true;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  retry_timer_.cancel();
  std::vector<std::shared_ptr<session>> live;
  live.reserve(sessions_.size());
  for (auto& [id, weak] : sessions_) {
    if (auto s = weak.lock()) live.push_back(std::move(s));
  }
  for (auto& s : live) s->abort();
}

void egress_proxy::accept_next() {
  if (stopped_) return;
  acceptor_.async_accept(
      [self = shared_from_this()](boost::system::error_code ec, tcp::socket socket) {
        self->on_accept(ec, std::move(socket));
      });
}

void egress_proxy::on_accept(boost::system::error_code ec, tcp::socket socket) {
  if (stopped_) {
    if (!ec) record(unheard_attempt("proxy stopped"));
    return;
  }
  if (ec) {
    if (ec == asio::error::operation_aborted || ec == asio::error::bad_descriptor ||
        ec == asio::error::invalid_argument || ec == asio::error::not_socket) {
      return;  // the listener is gone
    }
    // EMFILE, ENFILE, ENOBUFS, ECONNABORTED, ...: try again shortly instead of spinning.
    retry_timer_.expires_after(accept_retry);
    retry_timer_.async_wait([self = shared_from_this()](boost::system::error_code wait_ec) {
      if (!wait_ec) self->accept_next();
    });
    return;
  }
  set_cloexec(socket.native_handle());
  const bool over = accepted_ >= grant_.max_connections;
  if (over && refusing_ >= max_refusing) {
    // Too many over-limit clients at once to answer each: close, still on the record.
    boost::system::error_code ignored;
    socket.close(ignored);
    record(unheard_attempt("connection limit"));
    return accept_next();
  }
  if (over) {
    ++refusing_;
  } else {
    ++accepted_;
  }
  const std::uint64_t id = next_id_++;
  auto s = std::make_shared<session>(shared_from_this(), id, std::move(socket), over);
  sessions_.emplace(id, s);
  s->start();
  accept_next();
}

void egress_proxy::finish_session(std::uint64_t id, bool over_limit, sandbox::egress_attempt a) {
  sessions_.erase(id);
  if (over_limit) --refusing_;
  record(std::move(a));
  maybe_stopped();
}

void egress_proxy::record(sandbox::egress_attempt a) {
  if (recorded_ >= max_recorded_egress_attempts) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  ++recorded_;
  if (on_attempt_) on_attempt_(std::move(a));
}

std::uint64_t egress_proxy::take_budget(bool up, std::uint64_t n) {
  std::uint64_t& used = up ? used_up_ : used_down_;
  const std::uint64_t max = up ? grant_.max_bytes_up : grant_.max_bytes_down;
  const std::uint64_t granted = std::min(n, max - std::min(used, max));
  used += granted;
  return granted;
}

std::uint64_t egress_proxy::budget_left_up() const noexcept {
  return grant_.max_bytes_up - std::min(used_up_, grant_.max_bytes_up);
}

bool egress_proxy::budget_spent() const noexcept {
  return used_up_ >= grant_.max_bytes_up || used_down_ >= grant_.max_bytes_down;
}

void egress_proxy::close_tunnels() {
  std::vector<std::shared_ptr<session>> live;
  for (auto& [id, weak] : sessions_) {
    if (auto s = weak.lock()) live.push_back(std::move(s));
  }
  for (auto& s : live) s->close_tunnel();
}

}  // namespace sandbox::detail
