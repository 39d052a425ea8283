// `sandboxctl interp`: one interpreter session fed from stdin, cells separated by a line
// `# %%`, each cell's result printed as one JSON line (the daemon's cell_result object).
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <iostream>
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
  std::string runtime = "python3";
  auto d = common_options(c);
  d.add_options()("ticket", po::value(&c.ticket_path), "ticket JSON file (required)")(
      "runtime", po::value(&runtime), "a Python runtime (default python3)")(
      "trusted-keys", po::value(&c.trusted_keys), "keys that --ticket must verify against");
  po::positional_options_description pos;
  parse(args, d, pos);
  if (c.ticket_path.empty()) throw usage_error("interp: --ticket is required");
  auto opts = options_from(c);
  auto ticket = load_ticket(c.ticket_path, c.trusted_keys);
  if (!ticket) {
    std::cerr << "sandboxctl: " << ticket.error().message << "\n";
    return exit_fail;
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
    auto r =
        start.interpreter->async_execute({.code = std::move(code)}, boost::asio::use_future).get();
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
