// What the interpreter-session tests of every level share (tests/integration/oci/
// interpreter_test.cpp, tests/integration/microvm/interpreter_test.cpp; the process level's
// own cases are in tests/integration/process/interpreter_test.cpp): one session that checks
// state across cells, the last expression's value, a file written in one cell and read in the
// next, a cell timeout interrupted with the state kept, and exit() losing the state and ending
// the session.
#pragma once

#include <boost/asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "sandbox/sandbox.hpp"

namespace interptest {

using namespace std::chrono_literals;

/// A ticket for `tenant` with code.execute at `level`, a lifetime ceiling of `max_timeout`.
inline sandbox::ticket ticket_at(sandbox::isolation level, const std::string& tenant,
                                 std::chrono::milliseconds max_timeout = 600000ms) {
  return sandbox::ticket_issuer{}
      .issue({.id = "interp-level-ticket",
              .tenant = tenant,
              .execute = true,
              .isolation = level,
              .max_timeout = max_timeout,
              .max_memory_bytes = 1ULL << 30})
      .value();
}

/// One cell, waited for.
inline sandbox::cell_result exec(sandbox::interpreter& i, std::string code,
                                 std::chrono::milliseconds timeout) {
  return i.async_execute({.code = std::move(code), .timeout = timeout}, boost::asio::use_future)
      .get();
}

/**
 * The checks every level runs, on one interpreter session of `rt` opened with `t` (whose
 * level is `level`), in as few cells as the properties need (five; one interpreter start).
 * `cell_deadline` bounds a cell that ends by itself (a hang bound, never a speed: 60 s or
 * more under emulation). The timed-out cell's own timeout is short on purpose: an interrupt
 * that reaches the driver before its cell starts is still honoured, so it tests no speed.
 * `rt`'s `interrupt_grace` must be a hang bound too.
 */
inline void level_checks(sandbox::runtime& rt, const sandbox::ticket& t, sandbox::isolation level,
                         std::chrono::milliseconds cell_deadline) {
  auto st = rt.async_open_interpreter({.runtime = "python3"}, t, boost::asio::use_future).get();
  INFO("open: " << to_string(st.code) << " " << st.message);
  REQUIRE(st.code == sandbox::code::ok);
  REQUIRE(st.interpreter);
  auto i = st.interpreter;
  const std::string out_file = "os.path.join(os.environ['SANDBOX_OUTPUT_DIR'], 'notes.txt')";

  // 1. State, and a file written in the session's workspace.
  auto r = exec(*i, "import os\nx = 41\nopen(" + out_file + ", 'w').write('hello')", cell_deadline);
  INFO("cell 1: " << r.message << r.error << r.std_err.summary);
  CHECK(r.code == sandbox::code::ok);
  CHECK(r.state == sandbox::interpreter_state::kept);
  CHECK(r.value == "5");  // the last expression: write()'s count
  CHECK(r.files_out.size() == 1);

  // 2. The state and the file, read in the next cell; the last expression's value.
  r = exec(*i, "(x + 1, open(" + out_file + ").read())", cell_deadline);
  INFO("cell 2: " << r.message << r.error << r.std_err.summary);
  CHECK(r.code == sandbox::code::ok);
  CHECK(r.value == "(42, 'hello')");

  // 3. A timeout: the cell interrupted, the interpreter lives on with its state.
  r = exec(*i, "import time\ntime.sleep(600)", 1000ms);
  INFO("cell 3: " << r.message << r.error);
  CHECK(r.code == sandbox::code::timeout);
  CHECK(r.state == sandbox::interpreter_state::kept);
  CHECK(!r.session_ended);
  CHECK(r.error.find("KeyboardInterrupt") != std::string::npos);
  r = exec(*i, "x", cell_deadline);
  CHECK(r.code == sandbox::code::ok);
  CHECK(r.value == "41");

  // 4. exit(): the state lost and the session over, from the host's evidence.
  r = exec(*i, "exit(3)", cell_deadline);
  INFO("cell 5: " << r.message);
  CHECK(r.code == sandbox::code::ok);
  CHECK(r.state == sandbox::interpreter_state::lost);
  CHECK(r.session_ended);
  CHECK(r.exit_code == 3);
  CHECK(i->ended());
  auto fut = i->async_execute({.code = "x"}, boost::asio::use_future);
  CHECK_THROWS(fut.get());
  const auto end = i->async_close(boost::asio::use_future).get();
  CHECK(end.result.isolation == level);
}

/**
 * A cell that takes the driver's channel (closes its command input, or its frame output):
 * the host ends the session on its own evidence, the state lost, within `cell_deadline` (a
 * hang bound); a session opened afterwards works.
 */
inline void channel_taken_checks(sandbox::runtime& rt, const sandbox::ticket& t,
                                 std::chrono::milliseconds cell_deadline) {
  for (const std::string take : {"os.close(m._in)", "os.close(m._out)"}) {
    INFO(take);
    auto st = rt.async_open_interpreter({.runtime = "python3"}, t, boost::asio::use_future).get();
    REQUIRE(st.interpreter);
    auto r = exec(*st.interpreter, "import os, sys\nm = sys.modules['__main__']\n" + take,
                  cell_deadline);
    INFO(r.message);
    CHECK(r.state == sandbox::interpreter_state::lost);
    CHECK(r.session_ended);
    CHECK(st.interpreter->ended());
    st.interpreter->async_close(boost::asio::use_future).get();
  }
  auto st = rt.async_open_interpreter({.runtime = "python3"}, t, boost::asio::use_future).get();
  REQUIRE(st.interpreter);
  CHECK(exec(*st.interpreter, "1 + 1", cell_deadline).value == "2");
  st.interpreter->async_close(boost::asio::use_future).get();
}

}  // namespace interptest
