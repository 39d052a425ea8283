// The MCP server over stdio (server.hpp).
#include "mcp/server.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "mcp/jsonrpc.hpp"
#include "mcp/tools.hpp"

namespace sandbox::mcp {
namespace {

using json = nlohmann::json;

// The protocol revisions a client may ask for; any other is answered with ours.
constexpr std::array<std::string_view, 3> known_revisions{"2025-06-18", "2025-03-26", "2024-11-05"};

class server {
 public:
  explicit server(server_options o)
      : o_(std::move(o)), signals_(io_, SIGINT, SIGTERM, SIGHUP), out_(io_), drain_timer_(io_) {}

  int run() {
    auto opts = o_.runtime;
    // A level is proved only when a run first needs it: the server answers `initialize`
    // at once, and a host whose calls all run at the process level never boots a VM.
    opts.levels_on_demand = true;
    // A network run whose ticket lacks code.network ends approval_required with what a
    // human must approve (the tool error names it): the MCP client holds no key and sends no
    // ticket, so it can never grant itself anything; the operator approves out of band and
    // binds the server to the derived ticket. A host's own approver is kept.
    if (!opts.approver) {
      opts.approver = sandbox::make_callback_approver(
          [](sandbox::approval_request, sandbox::approval_callback answer) {
            answer(sandbox::approval_decision::defer(
                "a human must approve this network access; the MCP client cannot"));
          });
    }
    auto rt = sandbox::runtime::create(io_.get_executor(), std::move(opts));
    if (!rt) {
      std::cerr << "sandboxctl: mcp: cannot start the runtime: " << rt.error().message() << "\n";
      return 1;
    }
    rt_.emplace(std::move(*rt));
    // A descriptor of its own for stdout (the asio object closes it, not fd 1).
    const int out = ::fcntl(o_.out_fd, F_DUPFD_CLOEXEC, 3);
    if (out < 0) {
      std::cerr << "sandboxctl: mcp: fcntl(F_DUPFD_CLOEXEC, stdout): " << std::strerror(errno)
                << "\n";
      return 1;
    }
    out_.assign(out);
    if (::pipe2(wake_, O_CLOEXEC) < 0) {
      std::cerr << "sandboxctl: mcp: pipe2: " << std::strerror(errno) << "\n";
      return 1;
    }
    signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      std::cerr << "sandboxctl: mcp: signal " << sig << ": ending\n";
      close();
    });
    auto work = boost::asio::make_work_guard(io_);
    std::thread reader([this] { read_loop(); });
    io_.run();
    // Every run was confirmed gone (close() waits for their completions); the runtime's
    // destruction ends what it still keeps (pools, timers).
    rt_.reset();
    {
      // Wakes the reader wherever it waits: in poll (the pipe) or for room (the flag).
      std::lock_guard lock(pending_mutex_);
      stopped_ = true;
    }
    pending_cv_.notify_all();
    char c = 0;
    (void)!::write(wake_[1], &c, 1);
    reader.join();
    ::close(wake_[0]);
    ::close(wake_[1]);
    return 0;
  }

 private:
  // The reader thread: lines of at most max_line_bytes, each posted to the io thread; a
  // longer one is discarded to its newline and answered with a parse error.
  void read_loop() {
    std::string line;
    bool skipping = false;
    char buf[65536];
    for (;;) {
      pollfd fds[2] = {{o_.in_fd, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (fds[1].revents != 0) return;  // the server ended without EOF (a signal)
      const ssize_t n = ::read(o_.in_fd, buf, sizeof buf);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) break;
      std::string_view chunk(buf, static_cast<std::size_t>(n));
      while (!chunk.empty()) {
        const auto nl = chunk.find('\n');
        const auto part = chunk.substr(0, nl);
        if (!skipping) {
          if (line.size() + part.size() > max_line_bytes) {
            skipping = true;
            line.clear();
            line.shrink_to_fit();
          } else {
            line.append(part);
          }
        }
        if (nl == std::string_view::npos) break;
        chunk.remove_prefix(nl + 1);
        if (skipping) {
          post_line({}, true);
          skipping = false;
        } else {
          post_line(std::move(line), false);
          line = {};
        }
      }
    }
    // EOF (or a read error): the client is gone. A last line without a newline still counts.
    if (!line.empty() && !skipping) post_line(std::move(line), false);
    boost::asio::post(io_, [this] {
      std::cerr << "sandboxctl: mcp: stdin closed\n";
      close();
    });
  }

  // Posts one line to the io thread. Backpressure: the reader waits while the lines posted
  // but not yet handled hold more than max_pending_bytes, so a client that floods stdin
  // faster than the server answers holds the host's memory to a bound.
  void post_line(std::string line, bool too_long) {
    const std::size_t size = line.size() + 1;
    {
      std::unique_lock lock(pending_mutex_);
      pending_cv_.wait(lock, [&] { return stopped_ || pending_bytes_ < max_pending_bytes; });
      if (stopped_) return;
      pending_bytes_ += size;
    }
    boost::asio::post(io_, [this, line = std::move(line), too_long, size] {
      {
        std::lock_guard lock(pending_mutex_);
        pending_bytes_ -= size;
      }
      pending_cv_.notify_all();
      if (closing_) return;
      if (too_long) {
        write(error_line(nullptr, rpc_error::parse_error,
                         fmt::format("parse error: line over {} bytes", max_line_bytes)));
        return;
      }
      handle_line(line);
    });
  }

  // Cancels every run in flight; the io_context stops once the last has completed.
  void close() {
    if (closing_) return;
    closing_ = true;
    signals_.cancel();
    // A copy: a completion may erase its entry while the others are being cancelled.
    std::vector<std::shared_ptr<boost::asio::cancellation_signal>> signals;
    for (auto& [key, signal] : in_flight_) signals.push_back(signal);
    for (auto& signal : signals) signal->emit(boost::asio::cancellation_type::terminal);
    finish_if_done();
  }

  // Once closing and no run is in flight: the io_context stops when every answer already
  // queued (to requests read before EOF, the killed runs' results) is written, or after
  // drain_timeout when the client no longer reads them.
  void finish_if_done() {
    if (!closing_ || !in_flight_.empty()) return;
    if (out_queue_.empty() || out_broken_) {
      io_.stop();
      return;
    }
    if (draining_) return;
    draining_ = true;
    drain_timer_.expires_after(drain_timeout);
    drain_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      std::cerr << "sandboxctl: mcp: answers left unread at exit\n";
      io_.stop();
    });
  }

  // Queues one line for stdout. Writes are asynchronous, so that a client that stops
  // reading never blocks the io thread (timers, kills, signals go on); one that leaves more
  // than max_unsent_bytes unread is treated as gone.
  void write(const std::string& line) {
    if (out_broken_) return;
    if (unsent_bytes_ + line.size() + 1 > max_unsent_bytes) {
      out_broken_ = true;
      std::cerr << "sandboxctl: mcp: the client does not read stdout; ending\n";
      close();
      return;
    }
    unsent_bytes_ += line.size() + 1;
    out_queue_.push_back(line + "\n");
    if (out_queue_.size() == 1) write_front();
  }

  void write_front() {
    boost::asio::async_write(
        out_, boost::asio::buffer(out_queue_.front()),
        [this](boost::system::error_code ec, std::size_t) {
          if (ec) {
            // EPIPE: the client closed its end. As good as gone.
            out_broken_ = true;
            out_queue_.clear();
            std::cerr << "sandboxctl: mcp: write to stdout failed: " << ec.message() << "\n";
            close();
            return;
          }
          unsent_bytes_ -= out_queue_.front().size();
          out_queue_.pop_front();
          if (!out_queue_.empty()) {
            write_front();
          } else {
            finish_if_done();
          }
        });
  }

  void handle_line(std::string_view line) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) return;  // blank line
    auto parsed = parse_line(line);
    if (auto* r = std::get_if<refusal>(&parsed)) {
      write(r->line);
      return;
    }
    auto& m = std::get<message>(parsed);
    if (m.is_response) return;  // the server sends no requests: nothing to match
    if (m.is_notification) {
      handle_notification(m);
      return;
    }
    if (m.method == "initialize") {
      initialize(m);
      return;
    }
    if (m.method == "ping") {
      write(result_line(m.id, json::object()));
      return;
    }
    if (!initialized_) {
      write(error_line(m.id, rpc_error::invalid_request,
                       "invalid request: not initialized (send \"initialize\" first)"));
      return;
    }
    if (m.method == "tools/list") {
      auto catalog = rt_->catalog();
      write(result_line(m.id, {{"tools", list_tools(context(catalog))}}));
    } else if (m.method == "tools/call") {
      call(m);
    } else {
      write(error_line(m.id, rpc_error::method_not_found,
                       "method not found: " + m.method.substr(0, 128)));
    }
  }

  void handle_notification(const message& m) {
    if (m.method == "notifications/cancelled") {
      auto id = m.params.find("requestId");
      if (id == m.params.end()) return;
      if (auto it = in_flight_.find(id->dump()); it != in_flight_.end()) {
        std::cerr << "sandboxctl: mcp: request " << it->first << " cancelled by the client\n";
        cancelled_.insert(it->first);
        it->second->emit(boost::asio::cancellation_type::terminal);
      }
    }
    // notifications/initialized and any other notification: nothing to do.
  }

  void initialize(const message& m) {
    std::string asked;
    if (auto v = m.params.find("protocolVersion"); v != m.params.end() && v->is_string()) {
      asked = v->get<std::string>();
    } else {
      write(error_line(m.id, rpc_error::invalid_params,
                       "invalid params: \"protocolVersion\" must be a string"));
      return;
    }
    const bool known =
        std::find(known_revisions.begin(), known_revisions.end(), asked) != known_revisions.end();
    initialized_ = true;
    write(result_line(
        m.id, {{"protocolVersion", known ? asked : std::string(protocol_revision)},
               {"capabilities", {{"tools", {{"listChanged", false}}}}},
               {"serverInfo", {{"name", "agent-sandbox"}, {"version", SANDBOX_PROJECT_VERSION}}},
               {"instructions",
                "Runs code in a sandbox under the host's ticket. Non-ok outcomes are tool "
                "errors whose text starts with the stable code."}}));
  }

  tool_context context(const host_catalog& catalog) const {
    return {.policy = rt_->policy(), .catalog = catalog, .ticket = o_.ticket};
  }

  void call(const message& m) {
    auto name = m.params.find("name");
    if (name == m.params.end() || !name->is_string()) {
      write(error_line(m.id, rpc_error::invalid_params, "invalid params: \"name\" is required"));
      return;
    }
    json args = json::object();
    if (auto a = m.params.find("arguments"); a != m.params.end()) {
      if (!a->is_object()) {
        write(error_line(m.id, rpc_error::invalid_params,
                         "invalid params: \"arguments\" must be an object"));
        return;
      }
      args = *a;
    }
    const auto tool = name->get<std::string>();
    auto catalog = rt_->catalog();
    const auto ctx = context(catalog);
    auto tools = list_tools(ctx);
    const bool listed =
        std::any_of(tools.begin(), tools.end(), [&](const json& t) { return t["name"] == tool; });
    if (!listed) {
      write(error_line(m.id, rpc_error::invalid_params,
                       "invalid params: unknown tool " +
                           json(tool).dump(-1, ' ', false, json::error_handler_t::replace)));
      return;
    }
    auto blobs = rt_->blobs();
    auto answer = [&](std::variant<json, bad_arguments> r) {
      if (auto* e = std::get_if<bad_arguments>(&r)) {
        write(error_line(m.id, rpc_error::invalid_params, "invalid params: " + e->message));
      } else {
        write(result_line(m.id, std::get<json>(std::move(r))));
      }
    };
    if (tool == "put_file") {
      answer(put_file(args, *blobs, o_.ticket.tenant(), rt_->policy().max_input_bytes));
      return;
    }
    if (tool == "get_file") {
      answer(get_file(args, *blobs, o_.ticket.tenant()));
      return;
    }
    auto req = decode_run_arguments(args, ctx, tool == "run_tool", *blobs);
    if (auto* e = std::get_if<bad_arguments>(&req)) {
      write(error_line(m.id, rpc_error::invalid_params, "invalid params: " + e->message));
      return;
    }
    const auto key = m.id.dump();
    if (in_flight_.count(key) != 0) {
      write(error_line(m.id, rpc_error::invalid_request,
                       "invalid request: a request with this id is in flight"));
      return;
    }
    if (in_flight_.size() >= o_.max_in_flight) {
      write(result_line(
          m.id, error_result(fmt::format("capacity: {} calls of this client are in flight already",
                                         o_.max_in_flight))));
      return;
    }
    auto signal = std::make_shared<boost::asio::cancellation_signal>();
    in_flight_.emplace(key, signal);
    rt_->async_run(
        std::get<run_request>(std::move(req)), o_.ticket,
        boost::asio::bind_cancellation_slot(
            signal->slot(),
            [this, id = m.id, key, signal](boost::system::error_code ec, sandbox::run_result r) {
              in_flight_.erase(key);
              const bool by_client = cancelled_.erase(key) != 0;
              if (ec == boost::asio::error::operation_aborted) {
                std::cerr << "sandboxctl: mcp: run " << r.run_id << " of request " << key
                          << " killed and gone\n";
              }
              // A request the client cancelled is never answered (MCP, "Cancellation"); nor
              // is any once the client is gone.
              if (!by_client && !closing_) {
                write(result_line(id, call_result(r, *rt_->blobs(), o_.ticket.tenant())));
              }
              finish_if_done();
            }));
  }

  server_options o_;
  boost::asio::io_context io_;
  boost::asio::signal_set signals_;
  boost::asio::posix::stream_descriptor out_;  ///< stdout, written asynchronously
  std::deque<std::string> out_queue_;          ///< lines not yet written, front first
  std::size_t unsent_bytes_ = 0;               ///< bytes in out_queue_
  /// Unread output after which the client counts as gone: 64 MiB.
  static constexpr std::size_t max_unsent_bytes = 64ULL << 20;
  /// How long, once closing, the server waits for the client to read what is queued.
  static constexpr std::chrono::seconds drain_timeout{5};
  boost::asio::steady_timer drain_timer_;
  bool draining_ = false;
  std::optional<sandbox::runtime> rt_;
  std::map<std::string, std::shared_ptr<boost::asio::cancellation_signal>> in_flight_;
  std::set<std::string> cancelled_;  ///< keys the client cancelled, not answered
  int wake_[2] = {-1, -1};
  /// Bytes of lines posted to the io thread and not yet handled (reader backpressure).
  static constexpr std::size_t max_pending_bytes = 2 * max_line_bytes;
  std::mutex pending_mutex_;
  std::condition_variable pending_cv_;
  std::size_t pending_bytes_ = 0;  ///< guarded by pending_mutex_
  bool stopped_ = false;           ///< guarded by pending_mutex_: the io thread is done
  bool initialized_ = false;
  bool closing_ = false;
  bool out_broken_ = false;
};

}  // namespace

int serve_stdio(server_options options) {
  // A client that closes its end of stdout must not kill the server with SIGPIPE before it
  // has killed the runs: the write fails with EPIPE instead, and the server closes.
  ::signal(SIGPIPE, SIG_IGN);
  server s(std::move(options));
  return s.run();
}

}  // namespace sandbox::mcp
