// Service mode (service/service.hpp): `run_service` puts the daemon together and runs it.
//
// Structure of the room:
//   - one io_context run by a few threads; one runtime on it (so one scheduler: the caps are
//     host-wide for every client of this daemon);
//   - `server` (server.hpp, on its own strand): the listening socket, signals, the set of
//     connections and its cap, the shutdown sequence;
//   - `connection` (connection.hpp, on its own strand): one client's lines, runs, blob
//     requests (on a small thread pool: they do blocking file I/O) and answers, with
//     `connection_sessions` for its sessions;
//   - `line_reader` and `line_protocol`: pure framing, reading and answer writing;
//   - `socket_path` (the socket on disk) and `stdio_pumps` (serving on stdin/stdout).
#include "service/service.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "core/run/cgroup.hpp"
#include "sandbox/approval.hpp"
#include "service/context.hpp"
#include "service/server.hpp"
#include "service/socket_path.hpp"
#include "service/stdio_pumps.hpp"
#include "service/systemd.hpp"

namespace sandbox::service {
namespace {

namespace asio = boost::asio;

constexpr int exit_ok = 0;
constexpr int exit_fail = 1;
constexpr int exit_usage = 2;

/// The runtime the daemon serves with: `options.runtime`, plus, with trusted keys and no
/// approver, one that defers every network approval to the client.
sandbox::runtime_options runtime_options_of(const serve_options& options) {
  sandbox::runtime_options rt_options = options.runtime;
  if (!options.trusted_keys.empty() && !rt_options.approver) {
    // With signed tickets, a network request whose ticket lacks code.network is answered
    // approval_required with its approval request: the client's approval service (which
    // holds a trusted key) can then derive and sign the ticket, and the client resubmits.
    // Without keys a client could grant itself anything, so nothing changes there.
    rt_options.approver = sandbox::make_callback_approver(
        [](sandbox::approval_request, sandbox::approval_callback answer) {
          answer(sandbox::approval_decision::defer(
              "resume with a derived ticket signed by a trusted key"));
        });
  }
  return rt_options;
}

/// Logs the backends that did not register (runs at their levels answer
/// runtime_unavailable).
void log_backends(const sandbox::runtime& rt, const sandbox::log_sink& log) {
  bool any_backend = false;
  for (const auto& b : rt.backends()) {
    if (b.registered) {
      any_backend = true;
    } else {
      log(sandbox::log_level::warning,
          fmt::format("serve: backend {} unavailable: {}", b.name, b.reason));
    }
  }
  if (!any_backend) {
    log(sandbox::log_level::warning,
        "serve: no backend registered; runs answer runtime_unavailable");
  }
}

/// Binds the socket (judging the path once more when someone created it since the first
/// check). Returns the descriptor, or -1 with `why` set.
int bind_listening_socket(const std::filesystem::path& path, struct stat& st, std::string& why) {
  int fd = bind_socket(path, st, why);
  if (fd < 0 && why.find("Address already in use") != std::string::npos) {
    if (auto w = clear_socket_path(path); w.empty()) {
      fd = bind_socket(path, st, why);
    } else {
      why = w;
    }
  }
  return fd;
}

/// Runs the io_context on `threads` threads (this one included) until it stops; a handler
/// that throws is logged and the loop goes on.
void run_io(asio::io_context& io, unsigned threads, const sandbox::log_sink& log) {
  auto run = [&io, &log] {
    for (;;) {
      try {
        io.run();
        return;
      } catch (const std::exception& e) {
        log(sandbox::log_level::error, std::string("serve: handler failed: ") + e.what());
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < std::max(1U, threads); ++i) pool.emplace_back(run);
  run();
  for (auto& t : pool) t.join();
}

}  // namespace

service_exit run_service(const serve_options& options) {
  auto log = options.runtime.log ? options.runtime.log
                                 : sandbox::make_stderr_log_sink(sandbox::log_level::warning);
  ::signal(SIGPIPE, SIG_IGN);       // a client gone while we write: EPIPE, not death
  const systemd_notifier notifier;  // takes $NOTIFY_SOCKET now, while single-threaded
  auto notify = [&](const std::string& state) {
    if (auto why = notifier.notify(state); !why.empty()) {
      log(sandbox::log_level::warning, "serve: sd_notify " + state + ": " + why);
    }
  };

  const auto& socket_path = options.socket_path;
  const bool activated = options.listen_fd >= 0;
  if (!options.stdio && !activated) {
    if (socket_path.empty()) return {exit_usage, "give --socket PATH or --stdio"};
    if (socket_path.string().size() >= sizeof(sockaddr_un{}.sun_path)) {
      return {exit_usage, fmt::format("socket path is longer than {} bytes",
                                      sizeof(sockaddr_un{}.sun_path) - 1)};
    }
    if (auto why = clear_socket_path(socket_path); !why.empty()) return {exit_fail, why};
  }

  // Destruction order matters: the server (connections, acceptor) and the runtime go
  // before the io_context their I/O objects and handlers belong to.
  asio::io_context io;
  std::optional<asio::thread_pool> blob_pool;  // started once the runtime is up (below)
  std::optional<sandbox::runtime> rt;
  std::optional<service_context> ctx;
  std::optional<server> srv;
  auto rt_options = runtime_options_of(options);
  if (options.cgroup_delegated) {
    // First, while single-threaded: the move takes the whole process, and the runs' parent
    // can get its controllers only once the service's cgroup holds no process of ours.
    std::string why;
    auto d = sandbox::detail::enter_delegated_cgroup(
        rt_options.process.cgroup_root, "/proc/self/mountinfo", "/proc/self/cgroup", &why);
    if (!d) {
      if (activated) ::close(options.listen_fd);
      return {exit_fail, "--cgroup-delegated: " + why};
    }
    log(sandbox::log_level::info,
        fmt::format("serve: delegated cgroup {}: daemon in {}, runs under {}", d->own, d->leaf,
                    d->parent));
    rt_options.process.cgroup_parent = d->parent;
  }
  {
    auto created = sandbox::runtime::create(io.get_executor(), rt_options);
    if (!created) {
      if (activated) ::close(options.listen_fd);
      return {exit_fail, "cannot start the runtime: " + created.error().message()};
    }
    rt.emplace(std::move(*created));
  }
  log_backends(*rt, log);
  // Threads start only now: the runtime's start-up (its self-test starts a sandbox) runs
  // while this process is still single-threaded.
  blob_pool.emplace(2);
  ctx.emplace(*rt, *blob_pool, options.limits, options.trusted_keys, log);
  srv.emplace(io, *ctx);

  stdio_pipes stdio;
  struct stat sock_st {};
  if (options.stdio) {
    if (auto why = start_stdio_pumps(stdio); !why.empty()) return {exit_fail, why};
  } else if (activated) {
    if (auto w = srv->listen(options.listen_fd); !w.empty()) return {exit_fail, w};
  } else {
    std::string why;
    int fd = bind_listening_socket(socket_path, sock_st, why);
    if (fd < 0) return {exit_fail, why};
    if (auto w = srv->listen(fd); !w.empty()) {
      ::unlink(socket_path.c_str());
      return {exit_fail, w};
    }
  }

  const bool own_socket_file = !options.stdio && !activated;
  try {
    srv->start(stdio.in, stdio.out);
  } catch (const std::exception& e) {
    if (own_socket_file) ::unlink(socket_path.c_str());
    return {exit_fail, std::string("cannot start: ") + e.what()};
  }
  if (options.stdio) log(sandbox::log_level::info, "serve: serving on stdin/stdout");
  if (options.on_ready) options.on_ready();
  notify("READY=1");

  run_io(io, options.threads, log);
  notify("STOPPING=1");

  // Cleanup. The socket file goes first (it is ours only if it is still the one we bound;
  // an inherited one belongs to the socket unit).
  if (own_socket_file) {
    struct stat now {};
    if (::lstat(socket_path.c_str(), &now) == 0 && now.st_ino == sock_st.st_ino &&
        now.st_dev == sock_st.st_dev) {
      ::unlink(socket_path.c_str());
    }
  }
  blob_pool->stop();
  blob_pool->join();
  srv.reset();
  rt.reset();  // kills whatever is still running (after a cut-short shutdown) and waits
  if (stdio.out_done.valid()) {
    // Our end of the answer pipe is closed (or about to be, with the io_context); give the
    // pump a moment to hand the last answers to stdout.
    stdio.out_done.wait_for(std::chrono::seconds(5));
  }
  return {exit_ok, {}};
}

}  // namespace sandbox::service
