#include "core/run/stream_reader.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <span>
#include <utility>

namespace sandbox::detail {

namespace asio = boost::asio;

stream_reader::stream_reader(strand_type strand, std::uint64_t capture_bytes,
                             std::uint32_t summary_bytes)
    : d_(strand), cap_(capture_bytes, summary_bytes), park_timer_(strand) {}

stream_reader::~stream_reader() {
  if (parked_ >= 0) ::close(parked_);
}

void stream_reader::assign(int fd, std::weak_ptr<void> owner, hooks h, bool throttle_past_cap) {
  d_.assign(fd);
  owner_ = std::move(owner);
  h_ = std::move(h);
  throttle_ = throttle_past_cap;
}

void stream_reader::start() { read(); }

void stream_reader::read() {
  if (settling_) return;
  auto buf = std::make_shared<std::array<char, 65536>>();
  in_flight_ = true;
  d_.async_read_some(asio::buffer(*buf), [this, keep = owner_.lock(), buf](
                                             boost::system::error_code ec, std::size_t n) {
    in_flight_ = false;
    if (n > 0) cap_.append(std::span<const char>(buf->data(), n));
    if (settling_) {  // teardown waits for this read's bytes (`settled`); no more reads
      if (auto resume = std::exchange(on_settled_, nullptr)) resume();
      return;
    }
    if (h_.data) h_.data();
    if (ec) {
      if (ec != asio::error::operation_aborted) {
        open_ = false;
        h_.ended();
      }
      return;
    }
    // A session's stderr past its capture cap is only discarded, for as long as the
    // session lives: it is drained at most `session_stderr_drain_bytes_per_s` (the
    // descriptor is parked for the time those bytes are worth), so a server flooding its
    // stderr costs the host a bounded share of a core, and blocks on its own pipe instead
    // (a chatty logger under that rate never waits). Runs drain at full speed: their
    // deadline bounds them.
    std::chrono::milliseconds pause(2);
    const bool throttled = throttle_ && cap_.truncated() && !h_.exited();
    if (throttled) {
      pause = std::chrono::milliseconds(
          std::max<std::uint64_t>(1, n * 1000 / session_stderr_drain_bytes_per_s));
    } else if (n >= 4096) {
      return read();
    }
    // A trickle (e.g. one byte per write): let it collect in the pipe for a moment instead
    // of waking the host for every write. The descriptor is taken out of the reactor
    // meanwhile (an edge-triggered epoll would otherwise wake on every write); the writer
    // only blocks if the pipe fills.
    // Once the program has exited there is no trickle to wait for: read on at once.
    if (h_.exited()) return read();
    parked_ = d_.release();
    park_timer_.expires_after(pause);
    park_timer_.async_wait([this, keep](boost::system::error_code) {
      if (parked_ < 0) return;  // teardown took it back
      d_.assign(parked_);
      parked_ = -1;
      if (!h_.stopped()) read();
    });
  });
}

void stream_reader::reclaim() {
  if (parked_ >= 0) {
    d_.assign(parked_);
    parked_ = -1;
  }
}

bool stream_reader::settled(std::function<void()> resume) {
  settling_ = true;
  if (!in_flight_) return true;
  on_settled_ = std::move(resume);
  boost::system::error_code ignored;
  d_.cancel(ignored);  // a read not yet performed ends aborted; one performed brings its bytes
  return false;
}

void stream_reader::drain(bool into_capture) {
  reclaim();
  if (!into_capture || !d_.is_open()) return;
  std::array<char, 65536> buf;
  for (int i = 0; i < 4096; ++i) {  // bounded: at most a pipe's worth remains
    ssize_t n = ::read(d_.native_handle(), buf.data(), buf.size());
    if (n <= 0) break;
    cap_.append(std::span<const char>(buf.data(), static_cast<std::size_t>(n)));
  }
}

void stream_reader::close() {
  reclaim();
  boost::system::error_code ignored;
  d_.close(ignored);
}

}  // namespace sandbox::detail
