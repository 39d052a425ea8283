// `sandboxctl interp`: one interpreter session fed from stdin, cells separated by a line
// `# %%`, each cell's result printed as one JSON line (the daemon's cell_result object).
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

#include "cli/cli_util.hpp"
#include "cli/verbs.hpp"
#include "sandbox/interpreter.hpp"
#include "sandbox/runtime.hpp"
#include "service/line_protocol.hpp"

namespace sandboxctl {

int cmd_interp(const std::vector<std::string>& args) {
  common_flags c;
  std::string runtime = "python3", isolation_text, timeout_text;
  auto d = common_options(c);
  d.add_options()("ticket", po::value(&c.ticket_path),
                  "ticket JSON file (or signed ticket document); without it, a local ticket as "
                  "`run` makes: tenant 'default', code.execute at the --isolation level")(
      "isolation", po::value(&isolation_text),
      "without --ticket: the local ticket's level, process (default), container, gvisor or "
      "microvm (the weakest registered backend at or above it runs)")(
      "runtime", po::value(&runtime), "a Python runtime (default python3)")(
      "timeout-ms", po::value(&timeout_text),
      "each cell's timeout (default: the policy's default timeout; clamped to the ticket's "
      "ceiling): past it the cell is interrupted, its state kept")(
      "trusted-keys", po::value(&c.trusted_keys), "keys that --ticket must verify against");
  po::positional_options_description pos;
  auto vm = parse(args, d, pos);
  if (c.ticket_path.empty() && !c.trusted_keys.empty()) {
    throw usage_error("interp: --trusted-keys needs --ticket (the ticket to verify)");
  }
  const auto level =
      isolation_flag("interp", vm.count("isolation") != 0, isolation_text, !c.ticket_path.empty());
  std::optional<std::chrono::milliseconds> cell_timeout;
  if (vm.count("timeout-ms") != 0) {
    cell_timeout = std::chrono::milliseconds(
        parse_number<std::int64_t>("timeout-ms", timeout_text, 1, max_duration_ms));
  }
  auto opts = options_from(c);
  auto ticket = c.ticket_path.empty() ? local_ticket(opts.policy, {}, level)
                                      : load_ticket(c.ticket_path, c.trusted_keys);
  if (!ticket) {
    std::cerr << "sandboxctl: " << ticket.error().message << "\n";
    return exit_fail;
  }
  if (c.ticket_path.empty() && c.verbose) {
    std::cerr << "sandboxctl: local ticket: " << sandbox::encode(*ticket) << "\n";
  }
  opts.levels_on_demand = true;
  boost::asio::io_context io;
  auto work = boost::asio::make_work_guard(io);
  std::thread t([&] { io.run(); });
  struct joiner {
    boost::asio::executor_work_guard<boost::asio::io_context::executor_type>& w;
    boost::asio::io_context& io;
    std::thread& t;
    void stop() {
      w.reset();
      io.stop();
      if (t.joinable()) t.join();
    }
    ~joiner() { stop(); }
  } join{work, io, t};
  auto rt = sandbox::runtime::create(io.get_executor(), std::move(opts));
  if (!rt) {
    std::cerr << "sandboxctl: cannot start the runtime: " << rt.error().message() << "\n";
    return exit_fail;
  }
  auto start =
      rt->async_open_interpreter({.runtime = runtime}, *ticket, boost::asio::use_future).get();
  if (!start.interpreter) {
    std::cerr << "sandboxctl: interp: " << sandbox::to_string(start.code) << ": " << start.message
              << "\n";
    join.stop();
    return exit_fail;
  }
  auto run_cell = [&](std::string code) {
    auto r = start.interpreter
                 ->async_execute({.code = std::move(code), .timeout = cell_timeout},
                                 boost::asio::use_future)
                 .get();
    std::cout << sandbox::service::encode_cell_result(r) << "\n" << std::flush;
  };
  std::string cell, line;
  bool any = false;
  while (std::getline(std::cin, line)) {
    if (line == "# %%") {
      if (any) run_cell(std::move(cell));
      cell.clear();
      any = false;
      continue;
    }
    cell += line;
    cell += '\n';
    any = true;
  }
  if (any) run_cell(std::move(cell));
  start.interpreter->async_close(boost::asio::use_future).get();
  start.interpreter.reset();
  // The runtime is destroyed (below) once its executor no longer runs, as `run` does.
  join.stop();
  return exit_ok;
}

}  // namespace sandboxctl
