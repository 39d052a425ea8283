#include "core/run/session_stdio.hpp"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <string_view>
#include <utility>

#include "wire/init_protocol.hpp"

namespace sandbox::detail {

namespace asio = boost::asio;
namespace ip = init_protocol;

namespace {

// write(2) on the stdin pipe without SIGPIPE (the host library must not die because a
// server closed its stdin): the signal is blocked on this thread for the call, and one it
// raised is consumed before unblocking.
ssize_t write_no_sigpipe(int fd, const char* p, std::size_t n) {
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  sigset_t pending;
  sigpending(&pending);
  const bool was_pending = sigismember(&pending, SIGPIPE) == 1;
  ssize_t r = ::write(fd, p, n);
  const int saved = errno;
  if (r < 0 && saved == EPIPE && !was_pending) {
    timespec zero{};
    while (sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = saved;
  return r;
}

}  // namespace

session_stdio::session_stdio(asio::strand<asio::any_io_executor> strand, bool stream,
                             control_channel& ctl, stream_reader& out)
    : stream_(stream), ctl_(ctl), out_(out), stdin_(std::move(strand)) {}

session_stdio::~session_stdio() {
  if (child_fd_ >= 0) ::close(child_fd_);
}

void session_stdio::begin(std::uint32_t capacity, asio::any_io_executor ex,
                          std::weak_ptr<void> owner, hooks h) {
  active_ = true;
  capacity_ = capacity;
  buf_.reserve(capacity);
  ex_ = std::move(ex);
  owner_ = std::move(owner);
  h_ = std::move(h);
}

bool session_stdio::make_pipe() {
  int inp[2];
  if (pipe2(inp, O_CLOEXEC) < 0) return false;
  fcntl(inp[1], F_SETFL, O_NONBLOCK);
  stdin_.assign(inp[1]);
  child_fd_ = inp[0];
  return true;
}

void session_stdio::go_sent(bool with_stdin) {
  if (child_fd_ >= 0) ::close(child_fd_);  // only sandbox-init (then the program) holds it
  child_fd_ = -1;
  if (with_stdin && stream_) stream_open_ = true;
}

void session_stdio::complete(io_handler h, boost::system::error_code ec, std::size_t n) {
  sandbox::detail::post_completion(ex_, std::move(h), ec, n);
}

void session_stdio::write(asio::const_buffer d, io_handler h) {
  if (pending_write_) return complete(std::move(h), asio::error::in_progress, 0);
  if (h_.ending()) return complete(std::move(h), asio::error::operation_aborted, 0);
  if (close_requested_ || !stdin_is_open()) {
    return complete(std::move(h), asio::error::broken_pipe, 0);
  }
  pending_write_.emplace(pending_write{d, 0, std::move(h)});
  accept_input();
  flush();
}

// Moves what fits of the pending write into the bounded buffer; completes the write once
// all of it is in. (The buffer's capacity is reserved up front: appending never moves
// bytes a write in flight points at.)
void session_stdio::accept_input() {
  if (!pending_write_) return;
  auto& w = *pending_write_;
  const std::size_t space = capacity_ - std::min<std::size_t>(capacity_, buf_.size());
  const std::size_t n = std::min(space, w.rest.size());
  buf_.append(static_cast<const char*>(w.rest.data()), n);
  w.rest += n;
  w.accepted += n;
  buffered_ = static_cast<std::uint32_t>(buf_.size());
  if (w.rest.size() == 0) {
    auto h = std::move(w.handler);
    const std::size_t total = w.accepted;
    pending_write_.reset();
    write_waiting_ = false;
    complete(std::move(h), {}, total);
  } else {
    write_waiting_ = true;
  }
}

void session_stdio::fail_pending_write(boost::system::error_code ec) {
  if (!pending_write_) return;
  auto h = std::move(pending_write_->handler);
  const std::size_t n = pending_write_->accepted;
  pending_write_.reset();
  write_waiting_ = false;
  complete(std::move(h), ec, n);
}

/// The host can still send the program stdin bytes (the pipe, or in stream mode the
/// control stream's stdin, is open).
bool session_stdio::stdin_is_open() const noexcept {
  return stream_ ? stream_open_ : stdin_.is_open();
}

/// EOF for the program: the pipe's write end closes, or (stream mode) `stdin_close` is
/// queued behind the bytes already sent.
void session_stdio::close_stdin_pipe() {
  if (stream_) {
    if (!stream_open_) return;
    stream_open_ = false;
    ctl_.send_frame(ip::msg::stdin_close, 0, {});
    return;
  }
  boost::system::error_code ignored;
  stdin_.close(ignored);
}

void session_stdio::close_stdin() {
  close_requested_ = true;
  flush();
}

void session_stdio::drop_for_close() {
  buf_.resize(stream_ ? sent_ : 0);
  buffered_ = static_cast<std::uint32_t>(buf_.size());
  close_stdin_pipe();
  fail_pending_write(asio::error::operation_aborted);
}

void session_stdio::close() {
  boost::system::error_code ignored;
  stdin_.close(ignored);
}

/// Stream mode: sends what the credit window allows of the buffer's unsent bytes (`sent_`
/// of its front are in flight), in chunks; the buffer's front is erased only as sandbox-init
/// acknowledges it, so `buffered_` counts every byte not yet in the program's pipe.
void session_stdio::flush_stream() {
  if (!stream_open_) return;
  while (sent_ < buf_.size() && sent_ < ip::stdin_window) {
    const std::size_t n =
        std::min<std::size_t>({buf_.size() - sent_, ip::stdin_chunk, ip::stdin_window - sent_});
    ctl_.send_frame(ip::msg::stdin_data, 0, std::string_view(buf_.data() + sent_, n));
    sent_ += n;
  }
  // EOF as soon as every byte is sent: sandbox-init writes what it holds first.
  if (sent_ == buf_.size() && close_requested_) close_stdin_pipe();
}

const char* session_stdio::on_ack(std::uint32_t n) {
  if (!active_ || !stream_ || n == 0 || n > sent_) {
    return "sandbox-init acknowledged stdin bytes it was not sent";
  }
  buf_.erase(0, n);
  sent_ -= n;
  bytes_to_server_ += n;
  buffered_ = static_cast<std::uint32_t>(buf_.size());
  h_.activity();
  accept_input();
  flush_stream();
  return nullptr;
}

const char* session_stdio::on_stdin_closed() {
  if (!active_ || !stream_) return "sandbox-init reported a stdin the run does not have";
  stream_open_ = false;
  buf_.clear();
  sent_ = 0;
  buffered_ = 0;
  fail_pending_write(asio::error::broken_pipe);
  return nullptr;
}

void session_stdio::flush() {
  if (stream_) return flush_stream();
  if (flushing_ || !stdin_.is_open()) return;
  if (buf_.empty()) {
    if (close_requested_) {
      boost::system::error_code ignored;
      stdin_.close(ignored);
    }
    return;
  }
  flushing_ = true;
  stdin_.async_wait(asio::posix::descriptor_base::wait_write,
                    [this, keep = owner_.lock()](boost::system::error_code ec) {
                      flushing_ = false;
                      if (ec || !stdin_.is_open()) return;
                      ssize_t n =
                          write_no_sigpipe(stdin_.native_handle(), buf_.data(), buf_.size());
                      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return flush();
                      if (n < 0) {
                        // The server closed its stdin (EPIPE): nothing more reaches it.
                        buf_.clear();
                        buffered_ = 0;
                        boost::system::error_code ignored;
                        stdin_.close(ignored);
                        fail_pending_write(asio::error::broken_pipe);
                        return;
                      }
                      buf_.erase(0, static_cast<std::size_t>(n));
                      bytes_to_server_ += static_cast<std::uint64_t>(n);
                      buffered_ = static_cast<std::uint32_t>(buf_.size());
                      if (n > 0) h_.activity();
                      accept_input();
                      flush();
                    });
}

void session_stdio::read(asio::mutable_buffer b, io_handler h) {
  auto& d = out_.descriptor();
  if (read_pending_) return complete(std::move(h), asio::error::in_progress, 0);
  if (stdout_eof_) return complete(std::move(h), asio::error::eof, 0);
  if (h_.ending() || !d.is_open()) {
    return complete(std::move(h), asio::error::operation_aborted, 0);
  }
  if (stdout_quiet_) return read_after_quiet(b, std::move(h));
  read_pending_ = true;
  d.async_read_some(b, [this, keep = owner_.lock(), b, h = std::move(h)](
                           boost::system::error_code ec, std::size_t n) mutable {
    read_pending_ = false;
    // Stream mode: `quiet` cancelled this wait (the pipe's writers inside are gone, but
    // the runtime holds it open): what is left in it is read without waiting.
    if (ec == asio::error::operation_aborted && n == 0 && stdout_quiet_ && !h_.ending() &&
        out_.descriptor().is_open()) {
      return read_after_quiet(b, std::move(h));
    }
    if (n > 0) {
      bytes_from_server_ += n;
      h_.activity();
    }
    if (ec == asio::error::eof) {
      stdout_eof_ = true;
      out_.mark_closed();
      h_.stdout_ended();
    } else if (ec && ec != asio::error::operation_aborted) {
      out_.mark_closed();
      h_.stdout_ended();
    }
    if (ec && ec != asio::error::eof && n == 0) ec = asio::error::operation_aborted;
    complete(std::move(h), n > 0 ? boost::system::error_code{} : ec, n);
  });
}

void session_stdio::on_quiet() {
  stdout_quiet_ = true;
  if (read_pending_) {
    boost::system::error_code ignored;
    out_.descriptor().cancel(ignored);
  }
}

/// Stream mode, after `quiet`: no process inside holds the session's stdout any more, but
/// the runtime does, so its end never shows. Every byte the server wrote is in the pipe:
/// read what is there without waiting; an empty pipe is the end (EOF).
void session_stdio::read_after_quiet(asio::mutable_buffer b, io_handler h) {
  auto& d = out_.descriptor();
  ssize_t n = -1;
  if (d.is_open() && b.size() > 0) {
    do {
      n = ::read(d.native_handle(), b.data(), b.size());
    } while (n < 0 && errno == EINTR);
  }
  if (n > 0) {
    bytes_from_server_ += static_cast<std::uint64_t>(n);
    h_.activity();
    return complete(std::move(h), {}, static_cast<std::size_t>(n));
  }
  if (b.size() == 0 && d.is_open()) return complete(std::move(h), {}, 0);
  stdout_eof_ = true;
  out_.mark_closed();
  h_.stdout_ended();
  complete(std::move(h), asio::error::eof, 0);
}

session_stats session_stdio::stats(bool ended) const {
  return {.bytes_to_server = bytes_to_server_.load(),
          .bytes_from_server = bytes_from_server_.load(),
          .stdin_buffered = buffered_.load(),
          .stdin_capacity = capacity_,
          .write_waiting = write_waiting_.load(),
          .ended = ended};
}

}  // namespace sandbox::detail
