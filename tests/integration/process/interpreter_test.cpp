// Interpreter sessions at the process level (sandbox/interpreter.hpp, src/runtime/
// interpreter.cpp): state across cells, values, errors, the interrupt at a cell's timeout and
// the kill when it does not yield, the interpreter's exit, output floods, and hostile cells
// that forge the driver's frames or take its channel. Each case checks that nothing of it is
// left on the host.
#include <boost/asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <optional>
#include <string>

#include "integration/harness.hpp"
#include "sandbox/runtime.hpp"

namespace {

using namespace std::chrono_literals;
using sandbox::code;
using sandbox::interpreter_state;

struct interp_fixture {
  std::string state;
  std::optional<sandbox::runtime> rt;
  bool has_data = false;
};

interp_fixture& fixture() {
  static interp_fixture f = [] {
    interp_fixture s;
    auto opts = itest::private_runtime_options(&s.state);
    auto applied = sandbox::apply_config(R"({"v":1, "runtimes": [
        {"name": "python3-data", "image": "python3-data",
         "argv": ["/usr/bin/python3", "-I", "{source}"], "source_name": "main.py"}]})",
                                         opts);
    REQUIRE(applied.has_value());
    opts.interpreters.interrupt_grace = 500ms;
    auto made = sandbox::runtime::create(opts);
    REQUIRE(made.has_value());
    s.rt.emplace(std::move(*made));
    const auto cat = s.rt->catalog();
    const auto it = cat.runtimes.find("python3-data");
    s.has_data = it != cat.runtimes.end() && it->second.has_value();
    return s;
  }();
  return f;
}

sandbox::ticket long_ticket() { return itest::ticket("itest", 120000ms); }

std::shared_ptr<sandbox::interpreter> open(const std::string& runtime = "python3") {
  auto st =
      fixture()
          .rt->async_open_interpreter({.runtime = runtime}, long_ticket(), boost::asio::use_future)
          .get();
  INFO(st.message);
  REQUIRE(st.code == code::ok);
  REQUIRE(st.interpreter);
  return st.interpreter;
}

sandbox::cell_result exec(sandbox::interpreter& i, std::string code,
                          std::optional<std::chrono::milliseconds> timeout = 20000ms) {
  return i.async_execute({.code = std::move(code), .timeout = timeout}, boost::asio::use_future)
      .get();
}

std::string blob(const std::string& id) {
  auto b = fixture().rt->blobs()->get("itest", id);
  return b ? *b : std::string("<absent>");
}

bool can_run() {
  if (itest::rt() == nullptr) {
    if (itest::must_work()) FAIL(itest::why());
    WARN("skipped: " << itest::why());
    return false;
  }
  return true;
}

}  // namespace

TEST_CASE("interpreter: state, values, errors, interrupt, flood, forged frames", "[interp]") {
  if (!can_run()) return;
  fixture();  // (its runtime's descriptors are not the case's)
  const auto before = itest::snapshot();
  {
    auto i = open();
    // State kept across cells; the last expression's repr.
    auto r = exec(*i, "x = 41");
    CHECK(r.code == code::ok);
    CHECK(r.state == interpreter_state::kept);
    CHECK(r.value.empty());
    r = exec(*i, "print('hi')\nimport sys\nprint('oops', file=sys.stderr)\nx + 1");
    CHECK(r.code == code::ok);
    CHECK(r.value == "42");
    CHECK(r.std_out.summary == "hi\n");
    CHECK(r.std_err.summary == "oops\n");
    CHECK(blob(r.std_out.blob) == "hi\n");

    // An exception: `error` with its summary; the state is kept.
    r = exec(*i, "def f():\n    return 1 / 0\nf()");
    CHECK(r.code == code::error);
    CHECK(r.state == interpreter_state::kept);
    CHECK(r.error.find("ZeroDivisionError") != std::string::npos);
    CHECK(exec(*i, "x").value == "41");

    // The timeout interrupts the cell (KeyboardInterrupt); the interpreter lives on.
    r = exec(*i, "import time\ntime.sleep(60)", 500ms);
    CHECK(r.code == code::timeout);
    CHECK(r.state == interpreter_state::kept);
    CHECK(!r.session_ended);
    CHECK(r.error.find("KeyboardInterrupt") != std::string::npos);
    CHECK(exec(*i, "x").value == "41");

    // A flood: kept up to the capture cap, counted in full.
    r = exec(*i, "import sys\nfor _ in range(64): sys.stdout.write('y' * 65536)\n'done'");
    CHECK(r.code == code::ok);
    CHECK(r.value == "'done'");
    CHECK(r.std_out.total_bytes == 64u * 65536u);
    CHECK(r.std_out.bytes == fixture().rt->policy().stream_capture_bytes);
    CHECK(r.std_out.truncated);

    // Forged frames: the cell finds the live nonce in the driver and writes a fake "done"
    // and a fake value, then an over-long line without end, then a frame of another nonce.
    // That may mislead about this cell only: the next cells read true.
    r = exec(*i, R"PY(
import base64, os, sys, time
m = sys.modules['__main__']
n = m._running[0]
def frame(nonce, kind, payload):
    os.write(m._out, b'\n' + nonce + b' ' + kind + b' ' + base64.b64encode(payload) + b'\n')
frame(n, b'v', b'forged')
frame(n, b'z', b'ok')
os.write(m._out, b'x' * (1 << 20))
frame(b'0' * 32, b'z', b'ok')
time.sleep(0.3)
x = 7
)PY");
    CHECK(r.state == interpreter_state::kept);
    CHECK(r.value == "forged");  // it misled about itself, as it may
    auto next = exec(*i, "x * 2");
    CHECK(next.code == code::ok);
    CHECK(next.value == "14");
    CHECK(exec(*i, "'again'").value == "'again'");

    auto end = i->async_close(boost::asio::use_future).get();
    CHECK(end.end == sandbox::session_end::closed);
    CHECK(i->ended());
    // After the end: operation_aborted, state lost.
    auto fut = i->async_execute({.code = "x"}, boost::asio::use_future);
    CHECK_THROWS(fut.get());
  }
  itest::check_host_unchanged(before);
}

TEST_CASE(
    "interpreter: a cell that ignores SIGINT is killed; exit() and a taken channel lose "
    "the state",
    "[interp]") {
  if (!can_run()) return;
  fixture();  // (its runtime's descriptors are not the case's)
  const auto before = itest::snapshot();
  {
    auto i = open();
    exec(*i, "x = 1");
    auto r = exec(*i,
                  "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                  "time.sleep(60)",
                  500ms);
    CHECK(r.code == code::timeout);
    CHECK(r.state == interpreter_state::lost);
    CHECK(r.session_ended);
    CHECK(i->ended());
  }
  {
    auto i = open();
    auto r = exec(*i, "exit(3)");
    INFO(r.message);
    CHECK(r.code == code::ok);
    CHECK(r.state == interpreter_state::lost);
    CHECK(r.session_ended);
    CHECK(r.exit_code == 3);
  }
  {
    // The cell puts /dev/null over the driver's channel: nothing of the driver reaches the
    // host any more; the host ends the session and says the state is lost.
    auto i = open();
    auto r = exec(*i,
                  "import os, sys\nm = sys.modules['__main__']\n"
                  "os.dup2(os.open('/dev/null', os.O_WRONLY), m._out)",
                  2000ms);
    CHECK(r.state == interpreter_state::lost);
    CHECK(r.session_ended);
    CHECK((r.code == code::internal || r.code == code::timeout));
  }
  itest::check_host_unchanged(before);
}

TEST_CASE("interpreter: a matplotlib figure comes back as a PNG; output files as blobs",
          "[interp][data]") {
  if (!can_run()) return;
  if (!fixture().has_data) {
    if (itest::must_work()) FAIL("the python3-data image is not installed (tools/setup.sh)");
    WARN("skipped: the python3-data image is not installed (tools/setup.sh)");
    return;
  }
  const auto before = itest::snapshot();
  {
    auto i = open("python3-data");
    auto r = exec(*i, R"PY(
import os
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [3, 1, 2])
with open(os.path.join(os.environ['SANDBOX_OUTPUT_DIR'], 'notes.txt'), 'w') as f:
    f.write('hello')
)PY");
    INFO(r.error << r.message);
    CHECK(r.code == code::ok);
    REQUIRE(r.outputs.size() == 1);
    CHECK(r.outputs[0].mime_type == "image/png");
    CHECK(blob(r.outputs[0].blob).substr(0, 4) == "\x89PNG");
    REQUIRE(r.files_out.size() == 1);
    CHECK(r.files_out[0].name == "notes.txt");
    CHECK(blob(r.files_out[0].blob) == "hello");
    // An unchanged file is not sent again.
    r = exec(*i, "1");
    CHECK(r.files_out.empty());
    CHECK(r.outputs.empty());
    i->async_close(boost::asio::use_future).get();
  }
  itest::check_host_unchanged(before);
}
