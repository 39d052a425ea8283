// Waiting on a descriptor's state (a peer's hang-up, a process's exit) with Asio, where the
// completion of `async_wait` is a hint and never evidence.
//
// Asio's epoll reactor recycles the per-descriptor state of a closed descriptor for the next
// one registered, and readiness it had already collected for the closed one (say a client's
// hang-up) is then applied to the new one: a wait queued there completes with success
// although nothing happened to it (Boost 1.81; tests/unit/confirmed_wait_test.cpp shows it).
// Whoever acts on a wait's completion alone can drop a live client or declare a live process
// dead. `async_wait_confirmed` checks the descriptor itself and waits again otherwise.
#pragma once

#include <poll.h>

#include <boost/asio/error.hpp>
#include <boost/system/error_code.hpp>
#include <cerrno>
#include <utility>

namespace sandbox::detail {

/// The poll(2) events of `fd` right now among `events`, plus POLLHUP, POLLERR and POLLNVAL
/// (always reported); 0 when none, or when poll fails. Never blocks.
inline short poll_events_now(int fd, short events) noexcept {
  pollfd p{fd, events, 0};
  int n = 0;
  do {
    n = ::poll(&p, 1, 0);
  } while (n < 0 && errno == EINTR);
  return n > 0 ? p.revents : short{0};
}

/// `async_wait_confirmed`'s confirmation for a pidfd (waited on with `wait_read`): it polls
/// readable once its process has exited.
inline bool pidfd_exited(int fd) noexcept { return (poll_events_now(fd, POLLIN) & POLLIN) != 0; }

/**
 * Waits (`w`) on `d` until `confirm(d.native_handle())` returns true, then calls
 * `handler(error_code{})`; a completion that `confirm` does not confirm re-arms the wait. A
 * failed or cancelled wait (closing `d`: `operation_aborted`) is handed to `handler` as is,
 * unconfirmed (and a completion that finds `d` closed, as `operation_aborted`). `confirm` runs
 * after each completion and may consume what woke the wait (it must, for a level that stays raised,
 * or the wait completes again at once).
 *
 * `d` must outlive the wait (keep its owner alive in `handler`). The handler and `confirm`
 * run on `d`'s executor (the handler's own associated executor is not used).
 *
 *   detail::async_wait_confirmed(pidfd_desc_, wait_read, detail::pidfd_exited,
 *       [self](boost::system::error_code ec) { if (!ec) self->on_exit(); });
 */
template <class Descriptor, class Confirm, class Handler>
void async_wait_confirmed(Descriptor& d, typename Descriptor::wait_type w, Confirm confirm,
                          Handler handler) {
  d.async_wait(w, [&d, w, confirm = std::move(confirm),
                   handler = std::move(handler)](boost::system::error_code ec) mutable {
    if (!ec && !d.is_open()) ec = boost::asio::error::operation_aborted;
    if (!ec && !confirm(d.native_handle())) {
      async_wait_confirmed(d, w, std::move(confirm), std::move(handler));
      return;
    }
    handler(ec);
  });
}

}  // namespace sandbox::detail
