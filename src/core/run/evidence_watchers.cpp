#include "core/run/evidence_watchers.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <span>
#include <utility>

#include "wire/dns_sink.hpp"

namespace sandbox::detail {

namespace asio = boost::asio;
using clock = std::chrono::steady_clock;

// --- notify_watcher ---------------------------------------------------------------------

void notify_watcher::start(int listener, std::weak_ptr<void> owner, hooks h) {
  listener_.assign(listener);
  owner_ = std::move(owner);
  h_ = std::move(h);
  watch();
}

void notify_watcher::close() {
  boost::system::error_code ignored;
  listener_.close(ignored);
  mem_cache_.clear();
}

void notify_watcher::watch() {
  auto keep = owner_.lock();
  auto now = clock::now();
  if (now - window_start_ > window) {
    window_start_ = now;
    count_ = 0;
  }
  if (++count_ > burst) {
    auto t = std::make_shared<asio::steady_timer>(strand_, window_start_ + window);
    t->async_wait([this, keep, t](boost::system::error_code) {
      if (!h_.stopped()) watch();
    });
    return;
  }
  listener_.async_wait(
      asio::posix::descriptor_base::wait_read, [this, keep](boost::system::error_code ec) {
        if (ec || h_.stopped()) return;
        auto ev = handle_notification(listener_.native_handle(), mem_cache_);
        if (ev && ev->what == notify_event::kind::violation) return h_.violation(ev->syscall);
        if (ev && ev->what == notify_event::kind::egress) h_.egress(std::move(ev->attempt));
        if (!ev) {
          // Nothing pending: either a dead target, every filter user has exited (the
          // listener then polls as hung up), or a wake-up with nothing behind it
          // (handle_notification never receives then: a receive would block this thread).
          // The last is re-armed after a moment, so it can never spin.
          pollfd p{listener_.native_handle(), POLLIN, 0};
          const int n = ::poll(&p, 1, 0);
          if (n == 1 && (p.revents & POLLHUP) && !(p.revents & POLLIN)) return;
          if (n == 0) {
            auto t = std::make_shared<asio::steady_timer>(strand_, std::chrono::milliseconds(1));
            t->async_wait([this, keep, t](boost::system::error_code) {
              if (!h_.stopped()) watch();
            });
            return;
          }
        }
        watch();
      });
}

// --- dns_sink_server --------------------------------------------------------------------

void dns_sink_server::start(int fd, std::weak_ptr<void> owner,
                            std::function<void(egress_attempt)> query,
                            std::function<bool()> stopped) {
  sock_.assign(fd);
  owner_ = std::move(owner);
  query_ = std::move(query);
  stopped_ = std::move(stopped);
  serve();
}

void dns_sink_server::close() {
  boost::system::error_code ignored;
  sock_.close(ignored);
}

void dns_sink_server::serve() {
  sock_.async_wait(asio::posix::descriptor_base::wait_read,
                   [this, keep = owner_.lock()](boost::system::error_code ec) {
                     if (ec || stopped_()) return;
                     for (int i = 0; i < 64; ++i) {
                       std::array<std::uint8_t, 1500> pkt;
                       sockaddr_storage from{};
                       socklen_t fl = sizeof from;
                       ssize_t n =
                           ::recvfrom(sock_.native_handle(), pkt.data(), pkt.size(), MSG_DONTWAIT,
                                      reinterpret_cast<sockaddr*>(&from), &fl);
                       if (n <= 0) break;
                       std::span<const std::uint8_t> q(pkt.data(), static_cast<std::size_t>(n));
                       // The run's own names (localhost, its hostname) never leave it:
                       // answered, not egress.
                       if (auto local = dns_local_response(q); !local.empty()) {
                         ::sendto(sock_.native_handle(), local.data(), local.size(), MSG_DONTWAIT,
                                  reinterpret_cast<sockaddr*>(&from), fl);
                         continue;
                       }
                       if (auto name = dns_query_name(q)) {
                         query_({.protocol = "dns",
                                 .host = *name,
                                 .address = "",
                                 .port = 53,
                                 .allowed = false,
                                 .reason = "network disabled"});
                       }
                       auto resp = dns_refused_response(q);
                       if (!resp.empty()) {
                         ::sendto(sock_.native_handle(), resp.data(), resp.size(), MSG_DONTWAIT,
                                  reinterpret_cast<sockaddr*>(&from), fl);
                       }
                     }
                     serve();
                   });
}

// --- oom_watch --------------------------------------------------------------------------

void oom_watch::start(run_cgroup& cgroup, std::weak_ptr<void> owner, std::function<void()> oom,
                      std::function<bool()> stopped) {
  const int fd = cgroup.oom_event_fd();
  if (fd < 0) return;
  cgroup_ = &cgroup;
  owner_ = std::move(owner);
  oom_ = std::move(oom);
  stopped_ = std::move(stopped);
  events_.assign(::dup(fd));
  watch();
}

void oom_watch::close() {
  boost::system::error_code ignored;
  events_.close(ignored);
}

void oom_watch::watch() {
  events_.async_wait(asio::posix::descriptor_base::wait_read,
                     [this, keep = owner_.lock()](boost::system::error_code ec) {
                       if (ec || stopped_()) return;
                       cgroup_->drain_oom_event_fd();
                       check(0);
                       watch();
                     });
}

void oom_watch::check(int attempt) {
  if (stopped_()) return;
  auto st = cgroup_->stats();
  if (st && st->oom_kills > 0) return oom_();
  if (attempt >= 50) return;
  auto t = std::make_shared<asio::steady_timer>(strand_, std::chrono::milliseconds(2));
  t->async_wait([this, keep = owner_.lock(), t, attempt](boost::system::error_code ec) {
    if (!ec) check(attempt + 1);
  });
}

// --- memory_sampler ---------------------------------------------------------------------

void memory_sampler::start(run_cgroup& cgroup, std::weak_ptr<void> owner,
                           std::function<bool()> stopped) {
  cgroup_ = &cgroup;
  owner_ = std::move(owner);
  stopped_ = std::move(stopped);
  sample();
}

void memory_sampler::sample() {
  if (stopped_()) return;
  cgroup_->sample_memory();
  timer_.expires_after(std::chrono::milliseconds(20));
  timer_.async_wait([this, keep = owner_.lock()](boost::system::error_code ec) {
    if (!ec) sample();
  });
}

}  // namespace sandbox::detail
