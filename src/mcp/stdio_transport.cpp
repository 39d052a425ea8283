// MCP's stdio transport (stdio_transport.hpp).
#include "mcp/stdio_transport.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>

namespace sandbox::mcp {
namespace {

class stdio_transport final : public transport {
 public:
  stdio_transport(const server_context& c, stdio_options o)
      : c_(c), o_(o), session_(c), out_(c.executor), drain_timer_(c.executor) {}

  ~stdio_transport() override {
    stop_reader();
    if (wake_[0] >= 0) ::close(wake_[0]);
    if (wake_[1] >= 0) ::close(wake_[1]);
  }

  bool start(std::function<void()> ended) override {
    ended_ = std::move(ended);
    // A descriptor of its own for stdout (the asio object closes it, not fd 1).
    const int out = ::fcntl(o_.out_fd, F_DUPFD_CLOEXEC, 3);
    if (out < 0) {
      std::cerr << "sandboxctl: mcp: fcntl(F_DUPFD_CLOEXEC, stdout): " << std::strerror(errno)
                << "\n";
      return false;
    }
    out_.assign(out);
    if (::pipe2(wake_, O_CLOEXEC) < 0) {
      std::cerr << "sandboxctl: mcp: pipe2: " << std::strerror(errno) << "\n";
      return false;
    }
    reader_ = std::thread([this] { read_loop(); });
    return true;
  }

  void async_stop(std::function<void()> done) override {
    closing_ = true;
    done_ = std::move(done);
    stop_reader();
    session_.async_close([this] {
      session_closed_ = true;
      finish_if_done();
    });
  }

 private:
  // Wakes the reader wherever it waits, in poll (the pipe) or for room (the flag), and joins
  // it: nothing is read once the transport stops.
  void stop_reader() {
    {
      std::lock_guard lock(pending_mutex_);
      stopped_ = true;
    }
    pending_cv_.notify_all();
    if (wake_[1] >= 0) {
      char c = 0;
      (void)!::write(wake_[1], &c, 1);
    }
    if (reader_.joinable()) reader_.join();
  }

  // The reader thread: lines of at most max_line_bytes, each posted to the executor; a
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
      if (fds[1].revents != 0) return;  // the transport stopped without EOF (a signal)
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
    boost::asio::post(c_.executor, [this] {
      if (closing_) return;
      std::cerr << "sandboxctl: mcp: stdin closed\n";
      ended_();
    });
  }

  // Posts one line to the executor. Backpressure: the reader waits while the lines posted
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
    boost::asio::post(c_.executor, [this, line = std::move(line), too_long, size] {
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
      session_.handle_line(line, [this](std::optional<std::string> answer) {
        if (answer) write(*answer);
      });
    });
  }

  // Once stopping and the session closed: done when every answer already queued (to
  // requests read before EOF) is written, or after drain_timeout when the client no longer
  // reads them.
  void finish_if_done() {
    if (!closing_ || !session_closed_ || !done_) return;
    if (out_queue_.empty() || out_broken_) {
      boost::asio::post(c_.executor, std::exchange(done_, nullptr));
      return;
    }
    if (draining_) return;
    draining_ = true;
    drain_timer_.expires_after(drain_timeout);
    drain_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec || !done_) return;
      std::cerr << "sandboxctl: mcp: answers left unread at exit\n";
      boost::asio::post(c_.executor, std::exchange(done_, nullptr));
    });
  }

  // The client is gone (it closed stdout or stopped reading it).
  void broken() {
    out_broken_ = true;
    out_queue_.clear();
    unsent_bytes_ = 0;
    if (!closing_) ended_();
    finish_if_done();
  }

  // Queues one line for stdout. Writes are asynchronous, so that a client that stops
  // reading never blocks the executor (timers, kills, signals go on); one that leaves more
  // than max_unsent_bytes unread is treated as gone.
  void write(const std::string& line) {
    if (out_broken_) return;
    if (unsent_bytes_ + line.size() + 1 > max_unsent_bytes) {
      std::cerr << "sandboxctl: mcp: the client does not read stdout; ending\n";
      broken();
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
          if (out_broken_) return;
          if (ec) {
            // EPIPE: the client closed its end. As good as gone.
            std::cerr << "sandboxctl: mcp: write to stdout failed: " << ec.message() << "\n";
            broken();
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

  const server_context& c_;
  stdio_options o_;
  session session_;
  std::function<void()> ended_;
  std::function<void()> done_;                 ///< async_stop's, until everything settled
  boost::asio::posix::stream_descriptor out_;  ///< stdout, written asynchronously
  std::deque<std::string> out_queue_;          ///< lines not yet written, front first
  std::size_t unsent_bytes_ = 0;               ///< bytes in out_queue_
  /// Unread output after which the client counts as gone: 64 MiB.
  static constexpr std::size_t max_unsent_bytes = 64ULL << 20;
  /// How long, once stopping, the transport waits for the client to read what is queued.
  static constexpr std::chrono::seconds drain_timeout{5};
  boost::asio::steady_timer drain_timer_;
  bool draining_ = false;
  std::thread reader_;
  int wake_[2] = {-1, -1};
  /// Bytes of lines posted to the executor and not yet handled (reader backpressure).
  static constexpr std::size_t max_pending_bytes = 2 * max_line_bytes;
  std::mutex pending_mutex_;
  std::condition_variable pending_cv_;
  std::size_t pending_bytes_ = 0;  ///< guarded by pending_mutex_
  bool stopped_ = false;           ///< guarded by pending_mutex_: nothing more is read
  bool closing_ = false;
  bool session_closed_ = false;
  bool out_broken_ = false;
};

}  // namespace

std::unique_ptr<transport> make_stdio_transport(const server_context& context,
                                                stdio_options options) {
  return std::make_unique<stdio_transport>(context, options);
}

}  // namespace sandbox::mcp
