// MCP's Streamable HTTP transport (http_transport.hpp).
#include "mcp/http_transport.hpp"

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/socket_base.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cstring>
#include <iostream>
#include <map>
#include <utility>
#include <vector>

#include "service/socket_path.hpp"
#include "sys/random.hpp"

namespace sandbox::mcp {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using json = nlohmann::json;
using protocol = asio::generic::stream_protocol;
using request = http::request<http::string_body>;
using response = http::response<http::string_body>;
using steady = std::chrono::steady_clock;

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The media type of a header entry (`type/sub; params`), lowercased, without parameters.
std::string media_type(std::string_view entry) {
  return lower(trim(entry.substr(0, entry.find(';'))));
}

// Whether `name` (a host without its port, brackets removed) is a loopback name.
bool is_loopback_name(std::string_view name) {
  const auto n = lower(name);
  if (n == "localhost") return true;
  boost::system::error_code ec;
  const auto a = asio::ip::make_address(n, ec);
  return !ec && a.is_loopback();
}

// Splits `host[:port]` / `[v6][:port]`; false when it is neither.
bool split_host(std::string_view text, std::string_view& name, std::string_view& port) {
  if (text.empty()) return false;
  if (text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos) return false;
    name = text.substr(1, close - 1);
    auto rest = text.substr(close + 1);
    if (rest.empty()) {
      port = {};
      return true;
    }
    if (rest.front() != ':') return false;
    port = rest.substr(1);
    return true;
  }
  const auto colon = text.find(':');
  if (colon != text.rfind(':')) return false;  // an IPv6 address must be in brackets
  name = text.substr(0, colon);
  port = colon == std::string_view::npos ? std::string_view{} : text.substr(colon + 1);
  return true;
}

bool is_port(std::string_view p) {
  return !p.empty() && p.size() <= 5 &&
         std::all_of(p.begin(), p.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) &&
         std::stoul(std::string(p)) <= 65535;
}

response json_response(http::status status, std::string body) {
  response res{status, 11};
  res.set(http::field::server, "agent-sandbox");
  if (!body.empty()) res.set(http::field::content_type, "application/json");
  res.body() = std::move(body);
  return res;
}

class http_transport;

// One accepted connection: reads requests one at a time (HTTP/1.1 keep-alive, pipelining
// in order), hands each to the transport, writes its response. While a request waits for
// its answer (a run in flight) the next request is read already, so that a client that
// closes the connection is seen at once: its request is then cancelled.
class connection : public std::enable_shared_from_this<connection> {
 public:
  connection(http_transport& t, protocol::socket s, bool overflow)
      : t_(t),
        socket_(std::move(s)),
        buffer_(64 * 1024 + 16 * 1024),
        timer_(socket_.get_executor()),
        overflow_(overflow) {}

  bool is_overflow() const noexcept { return overflow_; }
  void start() { read(); }

  /// The request just handed over waits for an answer from session `sid` (empty: from a
  /// session being deleted), request `id`.
  void begin_wait(std::string sid, json id) {
    waiting_ = true;
    wait_session_ = std::move(sid);
    wait_id_ = std::move(id);
  }

  /// After the transport handled a request: a request still waiting keeps the connection
  /// read, so that a disconnect is seen.
  void watch_if_waiting() {
    if (waiting_ && !closed_) read();
  }

  /// Writes the response to the request handed over last; `close` ends the connection after.
  void respond(response res, bool close = false);

  /// Ends the connection without an answer (a request cancelled, the server stopping).
  void close();

 private:
  void read();
  void on_read(boost::system::error_code ec);
  void dispatch(request req);
  void arm_timer();
  void on_timeout();
  void linger();

  http_transport& t_;
  protocol::socket socket_;
  boost::beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<request> held_;  ///< a pipelined request read while one waits
  response res_;                 ///< the response being written
  asio::steady_timer timer_;
  bool overflow_;         ///< accepted over max_connections: every request is answered 503
  bool reading_ = false;  ///< an async_read is outstanding
  bool writing_ = false;  ///< an async_write is outstanding
  bool waiting_ = false;  ///< the last request waits for its answer
  bool lingering_ = false;
  bool timed_out_ = false;  ///< the read was cancelled to answer 408
  bool closed_ = false;
  std::string wait_session_;
  json wait_id_;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  std::array<char, 4096> discard_{};
};

class http_transport final : public transport {
 public:
  http_transport(const server_context& c, http_options o)
      : c_(c),
        o_(std::move(o)),
        acceptor_(c.executor),
        sweep_timer_(c.executor),
        retry_timer_(c.executor) {}

  ~http_transport() override { remove_socket_file(); }

  bool start(std::function<void()> /*ended: HTTP never ends by itself*/) override {
    std::string address;
    boost::system::error_code ec;
    if (o_.tcp) {
      const protocol::endpoint ep(*o_.tcp);
      acceptor_.open(ep.protocol(), ec);
      if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
      if (!ec) acceptor_.bind(ep, ec);
      if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
      if (ec) {
        std::cerr << "sandboxctl: mcp: cannot listen on " << o_.tcp->address().to_string() << ":"
                  << o_.tcp->port() << ": " << ec.message() << "\n";
        return false;
      }
      const auto bound = acceptor_.local_endpoint();
      asio::ip::tcp::endpoint tcp;
      std::memcpy(tcp.data(), bound.data(), bound.size());
      tcp.resize(bound.size());
      port_ = tcp.port();
      address = fmt::format(
          "http://{}:{}{}",
          tcp.address().is_v6() ? "[" + tcp.address().to_string() + "]" : tcp.address().to_string(),
          port_, o_.endpoint);
    } else {
      if (auto why = sandbox::service::clear_socket_path(o_.socket_path); !why.empty()) {
        std::cerr << "sandboxctl: mcp: " << why << "\n";
        return false;
      }
      std::string why;
      const int fd = sandbox::service::bind_socket(o_.socket_path, socket_stat_, why);
      if (fd < 0) {
        std::cerr << "sandboxctl: mcp: " << why << "\n";
        return false;
      }
      bound_socket_ = true;
      acceptor_.assign(protocol(AF_UNIX, 0), fd, ec);
      if (ec) {
        ::close(fd);
        std::cerr << "sandboxctl: mcp: " << ec.message() << "\n";
        return false;
      }
      address = "unix:" + o_.socket_path;
    }
    std::cerr << "sandboxctl: mcp: listening on " << address << "\n";
    if (o_.listening) o_.listening(address);
    accept();
    sweep();
    return true;
  }

  void async_stop(std::function<void()> done) override {
    stopping_ = true;
    done_ = std::move(done);
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    remove_socket_file();
    sweep_timer_.cancel();
    retry_timer_.cancel();
    // Every connection ends (a request in flight is cancelled with its session below).
    std::vector<std::shared_ptr<connection>> open;
    for (auto& [p, w] : connections_) {
      if (auto c = w.lock()) open.push_back(std::move(c));
    }
    for (auto& c : open) c->close();
    auto live = std::move(sessions_);
    sessions_.clear();
    for (auto& [id, e] : live) close_session(std::move(e.s), nullptr);
    finish_if_done();
  }

  // --- called by connections

  const http_options& options() const noexcept { return o_; }
  bool is_stopping() const noexcept { return stopping_; }

  void forget(connection* c) {
    connections_.erase(c);
    if (!c->is_overflow() && open_ > 0) --open_;
  }

  /// The client closed the connection on which request `id` of session `sid` waited.
  void disconnected(const std::string& sid, const json& id) {
    if (sid.empty()) return;
    auto it = sessions_.find(sid);
    if (it == sessions_.end()) return;
    if (it->second.s->cancel(id)) {
      std::cerr << "sandboxctl: mcp: the client closed the connection of request " << id.dump()
                << ": cancelled\n";
    }
  }

  void handle(const std::shared_ptr<connection>& c, request& req);

 private:
  struct session_entry {
    std::unique_ptr<session> s;
    steady::time_point last_used;
  };

  void accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, protocol::socket s) {
      if (stopping_ || ec == asio::error::operation_aborted) return;
      if (ec) {
        // EMFILE and the like: try again shortly rather than spin.
        std::cerr << "sandboxctl: mcp: accept: " << ec.message() << "\n";
        retry_timer_.expires_after(std::chrono::milliseconds(100));
        retry_timer_.async_wait([this](boost::system::error_code e) {
          if (!e && !stopping_) accept();
        });
        return;
      }
      const bool overflow = open_ >= o_.max_connections;
      if (overflow && connections_.size() >= 2 * o_.max_connections) {
        boost::system::error_code ignored;
        s.close(ignored);  // even the refusals are at their cap
      } else {
        auto c = std::make_shared<connection>(*this, std::move(s), overflow);
        connections_.emplace(c.get(), c);
        if (!overflow) ++open_;
        c->start();
      }
      accept();
    });
  }

  // Ends sessions idle for session_idle_timeout (no run in flight, no request).
  void sweep() {
    const auto period = std::clamp<std::chrono::milliseconds>(
        o_.session_idle_timeout / 4, std::chrono::milliseconds(10), std::chrono::seconds(30));
    sweep_timer_.expires_after(period);
    sweep_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec || stopping_) return;
      const auto now = steady::now();
      for (auto it = sessions_.begin(); it != sessions_.end();) {
        if (it->second.s->in_flight() == 0 &&
            now - it->second.last_used >= o_.session_idle_timeout) {
          std::cerr << "sandboxctl: mcp: session " << it->first.substr(0, 8) << "… expired\n";
          // Closed, not dropped: its interpreter session is killed and confirmed gone.
          auto s = std::move(it->second.s);
          it = sessions_.erase(it);
          close_session(std::move(s), nullptr);
        } else {
          ++it;
        }
      }
      sweep();
    });
  }

  // Closes `s` (its runs killed and confirmed gone), then calls `then` and drops it.
  void close_session(std::unique_ptr<session> s, std::function<void()> then) {
    session* p = s.get();
    closing_.emplace(p, std::move(s));
    p->async_close([this, p, then = std::move(then)] {
      if (then) then();
      // Posted: the session is still in the middle of its own completion here.
      asio::post(c_.executor, [this, p] {
        closing_.erase(p);
        finish_if_done();
      });
    });
  }

  void finish_if_done() {
    if (stopping_ && closing_.empty() && done_)
      asio::post(c_.executor, std::exchange(done_, nullptr));
  }

  void remove_socket_file() {
    if (!bound_socket_) return;
    bound_socket_ = false;
    struct stat st {};
    // Only the file this transport made (a later server may have replaced it).
    if (::lstat(o_.socket_path.c_str(), &st) == 0 && st.st_ino == socket_stat_.st_ino &&
        st.st_dev == socket_stat_.st_dev) {
      ::unlink(o_.socket_path.c_str());
    }
  }

  void post(const std::shared_ptr<connection>& c, request& req);
  void remove(const std::shared_ptr<connection>& c, request& req);

  const server_context& c_;
  http_options o_;
  asio::basic_socket_acceptor<protocol> acceptor_;
  asio::steady_timer sweep_timer_;
  asio::steady_timer retry_timer_;
  unsigned short port_ = 0;  ///< the bound TCP port (0 on a unix socket)
  bool bound_socket_ = false;
  struct stat socket_stat_ {};
  std::map<connection*, std::weak_ptr<connection>> connections_;
  std::size_t open_ = 0;  ///< connections within max_connections
  std::map<std::string, session_entry> sessions_;
  std::map<session*, std::unique_ptr<session>> closing_;  ///< closing: runs being killed
  std::function<void()> done_;
  bool stopping_ = false;
};

// --- connection

void connection::read() {
  if (closed_ || reading_) return;
  parser_.emplace();
  parser_->body_limit(t_.options().max_body_bytes);
  parser_->header_limit(static_cast<std::uint32_t>(t_.options().max_header_bytes));
  reading_ = true;
  arm_timer();
  http::async_read(socket_, buffer_, *parser_,
                   [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                     self->on_read(ec);
                   });
}

// One timer: the write timeout while a response is written, the read timeout while a request
// is awaited and none waits for its answer, else none (a run may take its time).
void connection::arm_timer() {
  std::chrono::milliseconds after{};
  if (writing_) {
    after = t_.options().write_timeout;
  } else if (reading_ && !waiting_ && !held_) {
    after = t_.options().read_timeout;
  } else {
    timer_.cancel();
    return;
  }
  timer_.expires_after(after);
  timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (!ec) self->on_timeout();
  });
}

void connection::on_timeout() {
  if (closed_) return;
  if (writing_ || lingering_ || !parser_ || !parser_->got_some()) {
    close();  // a client that does not read, or an idle keep-alive connection
    return;
  }
  // Part of a request and no more (slowloris): 408, then the connection ends.
  std::cerr << "sandboxctl: mcp: a request was not read in time: 408\n";
  timed_out_ = true;
  boost::system::error_code ignored;
  socket_.cancel(ignored);
  respond(json_response(http::status::request_timeout,
                        error_line(nullptr, rpc_error::invalid_request,
                                   fmt::format("request timeout: not read in full within {} ms",
                                               t_.options().read_timeout.count()))),
          true);
}

void connection::on_read(boost::system::error_code ec) {
  reading_ = false;
  if (closed_ || lingering_ || timed_out_) return;
  if (ec) {
    if (waiting_ || writing_ || held_) {
      close();  // the client went away while its request is in flight: cancelled
      return;
    }
    if (ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::error::connection_reset || ec == asio::error::operation_aborted ||
        ec == asio::error::broken_pipe) {
      close();
      return;
    }
    if (ec == http::error::body_limit) {
      respond(json_response(http::status::payload_too_large,
                            error_line(nullptr, rpc_error::parse_error,
                                       fmt::format("parse error: body over {} bytes",
                                                   t_.options().max_body_bytes))),
              true);
    } else if (ec == http::error::header_limit) {
      respond(json_response(http::status::request_header_fields_too_large,
                            error_line(nullptr, rpc_error::invalid_request,
                                       fmt::format("invalid request: headers over {} bytes",
                                                   t_.options().max_header_bytes))),
              true);
    } else {
      respond(json_response(http::status::bad_request,
                            error_line(nullptr, rpc_error::invalid_request,
                                       "invalid request: malformed HTTP: " + ec.message())),
              true);
    }
    return;
  }
  auto req = parser_->release();
  if (waiting_ || writing_) {
    held_ = std::move(req);  // pipelined: handled once the one before it is answered
    arm_timer();
    return;
  }
  dispatch(std::move(req));
}

void connection::dispatch(request req) {
  version_ = req.version();
  keep_alive_ = req.keep_alive();
  timer_.cancel();
  t_.handle(shared_from_this(), req);
  watch_if_waiting();
}

void connection::respond(response res, bool close_after) {
  if (closed_) return;
  waiting_ = false;
  wait_session_.clear();
  res.version(version_);
  res.keep_alive(keep_alive_ && !close_after && !t_.is_stopping());
  res.prepare_payload();
  res_ = std::move(res);
  writing_ = true;
  arm_timer();
  http::async_write(socket_, res_,
                    [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                      self->writing_ = false;
                      if (self->closed_) return;
                      if (ec) {
                        self->close();
                        return;
                      }
                      if (!self->res_.keep_alive()) {
                        self->linger();
                        return;
                      }
                      if (self->held_) {
                        auto next = std::move(*self->held_);
                        self->held_.reset();
                        self->dispatch(std::move(next));
                      } else if (self->reading_) {
                        self->arm_timer();
                      } else {
                        self->read();
                      }
                    });
}

// After a response that ends the connection: no more is sent, what the client still sends
// (the rest of an oversized body) is read and dropped for a moment, so that closing does not
// reset the connection before the client has read the response.
void connection::linger() {
  boost::system::error_code ignored;
  socket_.shutdown(asio::socket_base::shutdown_send, ignored);
  if (reading_) {  // a read is outstanding (a timed-out request): no draining beside it
    close();
    return;
  }
  lingering_ = true;
  timer_.expires_after(std::chrono::seconds(2));
  timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (!ec) self->close();
  });
  auto drain = std::make_shared<std::function<void()>>();
  *drain = [self = shared_from_this(), drain] {
    self->socket_.async_read_some(asio::buffer(self->discard_),
                                  [self, drain](boost::system::error_code ec, std::size_t) {
                                    if (ec || self->closed_) {
                                      self->close();
                                      *drain = nullptr;  // breaks the cycle
                                      return;
                                    }
                                    (*drain)();
                                  });
  };
  (*drain)();
}

void connection::close() {
  if (closed_) return;
  closed_ = true;
  timer_.cancel();
  boost::system::error_code ignored;
  socket_.shutdown(asio::socket_base::shutdown_both, ignored);
  socket_.close(ignored);
  if (waiting_) {
    waiting_ = false;
    t_.disconnected(wait_session_, wait_id_);
  }
  t_.forget(this);
}

// --- request handling

void http_transport::handle(const std::shared_ptr<connection>& c, request& req) {
  auto refuse = [&](http::status status, rpc_error code, const std::string& why,
                    const json& id = nullptr, bool close = false) {
    c->respond(json_response(status, error_line(id, code, why)), close);
  };
  if (c->is_overflow()) {
    auto res = json_response(
        http::status::service_unavailable,
        error_line(nullptr, rpc_error::server_error,
                   fmt::format("capacity: {} connections are open already", o_.max_connections)));
    res.set(http::field::retry_after, "1");
    c->respond(std::move(res), true);
    return;
  }
  const std::string_view target(req.target().data(), req.target().size());
  if (target.substr(0, target.find('?')) != o_.endpoint) {
    return refuse(http::status::not_found, rpc_error::server_error,
                  "not found: the MCP endpoint is " + o_.endpoint);
  }
  // DNS rebinding: a web page whose name was rebound to 127.0.0.1 talks to us with its own
  // name in Host, and a browser always sends its Origin on such a request.
  if (o_.tcp) {
    const auto host = req[http::field::host];
    if (!is_loopback_host({host.data(), host.size()}, port_)) {
      return refuse(http::status::forbidden, rpc_error::server_error,
                    "forbidden: the Host header must name this loopback server (DNS rebinding "
                    "protection)");
    }
  }
  if (auto origin = req.find(http::field::origin); origin != req.end()) {
    if (!is_loopback_origin({origin->value().data(), origin->value().size()})) {
      return refuse(http::status::forbidden, rpc_error::server_error,
                    "forbidden: Origin is not a loopback origin (DNS rebinding protection)");
    }
  }
  if (req.method() != http::verb::post && req.method() != http::verb::delete_) {
    auto res = json_response(
        http::status::method_not_allowed,
        error_line(nullptr, rpc_error::server_error,
                   fmt::format("method not allowed: {} (POST a message; DELETE ends a session; "
                               "the server sends nothing unasked, so there is no GET stream)",
                               std::string(req.method_string()))));
    res.set(http::field::allow, "POST, DELETE");
    c->respond(std::move(res));
    return;
  }
  if (auto v = req.find("MCP-Protocol-Version"); v != req.end()) {
    if (!is_known_revision({v->value().data(), v->value().size()})) {
      return refuse(http::status::bad_request, rpc_error::invalid_request,
                    "invalid request: unsupported MCP-Protocol-Version (2025-06-18, 2025-03-26 "
                    "or 2024-11-05)");
    }
  }
  if (req.method() == http::verb::delete_) {
    remove(c, req);
  } else {
    post(c, req);
  }
}

void http_transport::post(const std::shared_ptr<connection>& c, request& req) {
  auto refuse = [&](http::status status, rpc_error code, const std::string& why,
                    const json& id = nullptr) {
    c->respond(json_response(status, error_line(id, code, why)));
  };
  const auto type = req[http::field::content_type];
  if (media_type({type.data(), type.size()}) != "application/json") {
    return refuse(http::status::unsupported_media_type, rpc_error::invalid_request,
                  "invalid request: Content-Type must be application/json");
  }
  const auto accept = req[http::field::accept];
  if (!accepts_json_and_sse({accept.data(), accept.size()})) {
    return refuse(http::status::not_acceptable, rpc_error::invalid_request,
                  "invalid request: Accept must list application/json and text/event-stream");
  }
  auto parsed = parse_line(req.body());
  if (auto* r = std::get_if<refusal>(&parsed)) {
    c->respond(json_response(http::status::bad_request, std::move(r->line)));
    return;
  }
  auto& m = std::get<message>(parsed);
  const auto sid_field = req["Mcp-Session-Id"];
  const std::string sid(sid_field.data(), sid_field.size());
  const bool is_request = !m.is_notification && !m.is_response;
  if (is_request && m.method == "initialize") {
    if (!sid.empty()) {
      return refuse(http::status::bad_request, rpc_error::invalid_request,
                    "invalid request: initialize starts a new session; send it without "
                    "Mcp-Session-Id",
                    m.id);
    }
    if (sessions_.size() + closing_.size() >= o_.max_sessions) {
      return refuse(http::status::service_unavailable, rpc_error::server_error,
                    fmt::format("capacity: {} sessions are open already (DELETE one, or let it "
                                "expire)",
                                o_.max_sessions),
                    m.id);
    }
    // 32 random bytes, hex: unguessable, visible ASCII.
    auto id = sandbox::detail::random_hex(32);
    if (!id) {
      return refuse(http::status::internal_server_error, rpc_error::internal_error,
                    "internal error: no random session id", m.id);
    }
    auto s = std::make_unique<session>(c_);
    session& ref = *s;
    sessions_.emplace(*id, session_entry{std::move(s), steady::now()});
    c->begin_wait({}, m.id);
    ref.handle(m, [this, w = std::weak_ptr(c), sid = *id, &ref](std::optional<std::string> line) {
      const bool ok = ref.is_initialized();
      // A failed initialize makes no session (dropped once its handle() has returned).
      if (!ok) asio::post(c_.executor, [this, sid] { sessions_.erase(sid); });
      auto conn = w.lock();
      if (!conn) return;
      if (!line) return conn->close();
      auto res = json_response(http::status::ok, std::move(*line));
      if (ok) res.set("Mcp-Session-Id", sid);
      conn->respond(std::move(res));
    });
    return;
  }
  if (sid.empty()) {
    return refuse(http::status::bad_request, rpc_error::invalid_request,
                  "invalid request: Mcp-Session-Id is required (the initialize answer gives it)",
                  is_request ? m.id : json(nullptr));
  }
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) {
    return refuse(http::status::not_found, rpc_error::server_error,
                  "session not found: it ended or expired; initialize a new one",
                  is_request ? m.id : json(nullptr));
  }
  it->second.last_used = steady::now();
  if (!is_request) {
    it->second.s->handle(m, [](std::optional<std::string>) {});
    c->respond(json_response(http::status::accepted, {}));
    return;
  }
  c->begin_wait(sid, m.id);
  it->second.s->handle(m, [this, w = std::weak_ptr(c), sid](std::optional<std::string> line) {
    if (auto s = sessions_.find(sid); s != sessions_.end()) s->second.last_used = steady::now();
    auto conn = w.lock();
    if (!conn) return;
    if (!line) return conn->close();  // cancelled: no answer (MCP, "Cancellation")
    conn->respond(json_response(http::status::ok, std::move(*line)));
  });
}

void http_transport::remove(const std::shared_ptr<connection>& c, request& req) {
  const auto sid_field = req["Mcp-Session-Id"];
  const std::string sid(sid_field.data(), sid_field.size());
  if (sid.empty()) {
    c->respond(json_response(
        http::status::bad_request,
        error_line(nullptr, rpc_error::invalid_request,
                   "invalid request: DELETE needs the Mcp-Session-Id of the session to end")));
    return;
  }
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) {
    c->respond(json_response(
        http::status::not_found,
        error_line(nullptr, rpc_error::server_error, "session not found: it ended or expired")));
    return;
  }
  auto s = std::move(it->second.s);
  sessions_.erase(it);
  std::cerr << "sandboxctl: mcp: session " << sid.substr(0, 8) << "… ended by the client\n";
  c->begin_wait({}, nullptr);
  // Answered once every run of the session was killed and confirmed gone.
  close_session(std::move(s), [w = std::weak_ptr(c)] {
    if (auto conn = w.lock()) conn->respond(json_response(http::status::no_content, {}));
  });
}

}  // namespace

std::unique_ptr<transport> make_http_transport(const server_context& context,
                                               http_options options) {
  return std::make_unique<http_transport>(context, std::move(options));
}

std::variant<asio::ip::tcp::endpoint, std::string> parse_loopback_address(std::string_view text) {
  std::string_view name;
  std::string_view port;
  if (!split_host(text, name, port) || port.empty()) {
    return std::string("expected ADDRESS:PORT, such as 127.0.0.1:8080 or [::1]:8080");
  }
  if (!is_port(port)) return std::string("the port must be a number from 0 to 65535");
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(std::string(name), ec);
  if (ec) {
    return fmt::format("'{}' is not a numeric IP address (use 127.0.0.1 or [::1])",
                       std::string(name));
  }
  if (!address.is_loopback()) {
    return fmt::format(
        "{} is not a loopback address: the MCP server has no authentication of its own, so it "
        "listens only on loopback (127.0.0.1, [::1]) or a unix socket (--http-socket)",
        std::string(name));
  }
  return asio::ip::tcp::endpoint(address,
                                 static_cast<unsigned short>(std::stoul(std::string(port))));
}

bool is_loopback_host(std::string_view host, unsigned short port) {
  std::string_view name;
  std::string_view p;
  if (!split_host(trim(host), name, p) || !is_loopback_name(name)) return false;
  return p.empty() || (is_port(p) && std::stoul(std::string(p)) == port);
}

bool is_loopback_origin(std::string_view origin) {
  const auto o = lower(trim(origin));
  std::string_view rest(o);
  if (rest.substr(0, 7) == "http://") {
    rest.remove_prefix(7);
  } else if (rest.substr(0, 8) == "https://") {
    rest.remove_prefix(8);
  } else {
    return false;  // "null", or another scheme
  }
  std::string_view name;
  std::string_view port;
  return split_host(rest, name, port) && is_loopback_name(name) && (port.empty() || is_port(port));
}

bool accepts_json_and_sse(std::string_view accept) {
  bool json_ok = false;
  bool sse_ok = false;
  while (!accept.empty()) {
    const auto comma = accept.find(',');
    const auto entry = accept.substr(0, comma);
    accept = comma == std::string_view::npos ? std::string_view{} : accept.substr(comma + 1);
    // A "q=0" parameter says the type is not acceptable.
    const auto params = lower(entry.substr(std::min(entry.find(';'), entry.size())));
    bool refused = false;
    for (std::string_view ps(params); !ps.empty();) {
      const auto semi = ps.find(';', 1);
      auto param =
          trim(ps.substr(ps.front() == ';' ? 1 : 0,
                         semi == std::string_view::npos ? std::string_view::npos : semi - 1));
      if (param.substr(0, 2) == "q=") {
        auto q = param.substr(2);
        refused = !q.empty() && q.find_first_not_of("0.") == std::string_view::npos;
      }
      ps = semi == std::string_view::npos ? std::string_view{} : ps.substr(semi);
    }
    if (refused) continue;
    const auto type = media_type(entry);
    json_ok = json_ok || type == "application/json";
    sse_ok = sse_ok || type == "text/event-stream";
  }
  return json_ok && sse_ok;
}

}  // namespace sandbox::mcp
