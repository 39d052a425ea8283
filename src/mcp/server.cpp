// The MCP server: runtime, signals, orderly end (server.hpp).
#include "mcp/server.hpp"

#include <signal.h>

#include <algorithm>
#include <array>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "protocol/python_runtime.hpp"

namespace sandbox::mcp {
namespace {

// The protocol revisions a client may ask for; any other is answered with ours.
constexpr std::array<std::string_view, 3> known_revisions{"2025-06-18", "2025-03-26", "2024-11-05"};

}  // namespace

bool is_known_revision(std::string_view revision) noexcept {
  return std::find(known_revisions.begin(), known_revisions.end(), revision) !=
         known_revisions.end();
}

int serve(server_options o, const transport_factory& make_transport) {
  // A client that closes its end must not kill the server with SIGPIPE before it has killed
  // the runs: the write fails with EPIPE instead, and the transport ends.
  ::signal(SIGPIPE, SIG_IGN);
  boost::asio::io_context io;
  auto opts = std::move(o.runtime);
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
  // run_cell's runtimes: the configured ones an interpreter session can run.
  std::vector<std::string> python_runtimes;
  for (const auto& spec : opts.runtimes) {
    if (sandbox::detail::is_python_runtime(spec)) python_runtimes.push_back(spec.name);
  }
  auto created = sandbox::runtime::create(io.get_executor(), std::move(opts));
  if (!created) {
    std::cerr << "sandboxctl: mcp: cannot start the runtime: " << created.error().message() << "\n";
    return 1;
  }
  std::optional<sandbox::runtime> rt(std::move(*created));
  const server_context context{.runtime = *rt,
                               .ticket = o.ticket,
                               .executor = io.get_executor(),
                               .max_in_flight = o.max_in_flight,
                               .python_runtimes = std::move(python_runtimes)};
  auto t = make_transport(context);
  boost::asio::signal_set signals(io, SIGINT, SIGTERM, SIGHUP);
  bool stopping = false;
  auto stop = [&] {
    if (stopping) return;
    stopping = true;
    signals.cancel();
    t->async_stop([&io] { io.stop(); });
  };
  signals.async_wait([&](boost::system::error_code ec, int sig) {
    if (ec) return;
    std::cerr << "sandboxctl: mcp: signal " << sig << ": ending\n";
    stop();
  });
  if (!t->start(stop)) return 1;
  auto work = boost::asio::make_work_guard(io);
  io.run();
  // Every run was confirmed gone (async_stop waits for their completions); the transport
  // goes first (its sessions refer to the runtime), then the runtime ends what it still
  // keeps (pools, timers).
  t.reset();
  rt.reset();
  return 0;
}

}  // namespace sandbox::mcp
