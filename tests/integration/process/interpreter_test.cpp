// Interpreter sessions at the process level (sandbox/interpreter.hpp, src/runtime/
// interpreter.cpp): state across cells, values, errors, the interrupt at a cell's timeout and
// the kill when it does not yield, the interpreter's exit, output floods, and hostile cells
// that forge the driver's frames or take its channel. Each case checks that nothing of it is
// left on the host.
#include <boost/asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "integration/harness.hpp"
#include "sandbox/runtime.hpp"

namespace {

using namespace std::chrono_literals;
using sandbox::code;
using sandbox::interpreter_state;

/// Keeps every span the fixture's runtime records.
class span_log final : public sandbox::span_sink {
 public:
  void record(const sandbox::span& s) noexcept override {
    std::lock_guard lk(mu_);
    spans_.push_back(s);
  }
  /// The spans named `name` of session `id`, in order.
  std::vector<sandbox::span> of(const std::string& name, const std::string& id) const {
    std::lock_guard lk(mu_);
    std::vector<sandbox::span> out;
    for (const auto& sp : spans_) {
      auto a = sp.attributes.find("sandbox.run_id");
      if (sp.name == name && a != sp.attributes.end() && std::get<std::string>(a->second) == id) {
        out.push_back(sp);
      }
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<sandbox::span> spans_;
};

std::string attr(const sandbox::span& sp, const std::string& key) {
  auto it = sp.attributes.find(key);
  if (it == sp.attributes.end()) return "<absent>";
  if (const auto* v = std::get_if<std::string>(&it->second)) return *v;
  if (const auto* v = std::get_if<std::int64_t>(&it->second)) return std::to_string(*v);
  return std::get<bool>(it->second) ? "true" : "false";
}

struct interp_fixture {
  std::string state;
  std::shared_ptr<span_log> spans = std::make_shared<span_log>();
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
    opts.spans = s.spans;
    // Session caps small enough to reach: one live session for tenant "capped", three on
    // the host.
    opts.scheduler.max_session_slots = 3;
    opts.scheduler.classes["one"] = sandbox::tenant_class_limits{.max_session_slots = 1};
    opts.scheduler.tenant_classes["capped"] = "one";
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

sandbox::interpreter_start try_open(sandbox::interpreter_request req, const sandbox::ticket& t) {
  return fixture().rt->async_open_interpreter(std::move(req), t, boost::asio::use_future).get();
}

std::shared_ptr<sandbox::interpreter> open(const std::string& runtime = "python3",
                                           const sandbox::ticket& t = long_ticket(),
                                           sandbox::interpreter_request req = {}) {
  req.runtime = runtime;
  auto st = try_open(std::move(req), t);
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

sandbox::cell_result exec(sandbox::interpreter& i, sandbox::cell_request c) {
  return i.async_execute(std::move(c), boost::asio::use_future).get();
}

std::string blob(const std::string& id, const std::string& tenant = "itest") {
  auto b = fixture().rt->blobs()->get(tenant, id);
  return b ? *b : std::string("<absent>");
}

std::string put(const std::string& bytes, const std::string& tenant = "itest") {
  auto id = fixture().rt->blobs()->put(tenant, bytes);
  REQUIRE(id.has_value());
  return *id;
}

/// Processes of this test program's runs, seen from the host (their cgroups).
std::size_t host_processes() { return itest::snapshot().sandbox_pids.size(); }

/// `host_processes()` once it equals `want`, or its last count after 2 s (another program's
/// sandbox process between its start and its cgroup counts for a moment, as in
/// itest::check_host_unchanged).
std::size_t host_processes_settled(std::size_t want) {
  const auto give_up = std::chrono::steady_clock::now() + 2s;
  auto n = host_processes();
  while (n != want && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(20ms);
    n = host_processes();
  }
  return n;
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
    // A KeyboardInterrupt the cell raises itself (no timeout, no cancel) is its exception too.
    r = exec(*i, "raise KeyboardInterrupt('mine')");
    CHECK(r.code == code::error);
    CHECK(r.state == interpreter_state::kept);
    CHECK(r.error.find("KeyboardInterrupt") != std::string::npos);

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
    // The deadline leaves the cell time to get to its sleep (an interrupt that reaches the
    // driver before the cell runs is raised as it starts: state kept, not this case).
    auto r = exec(*i,
                  "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                  "time.sleep(60)",
                  500ms + itest::startup_allowance());
    CHECK(r.code == code::timeout);
    CHECK(r.state == interpreter_state::lost);
    CHECK(r.session_ended);
    CHECK(i->ended());
    // A cell for the interpreter that is gone: the caller's request, not a host fault (the
    // error code says the cell never ran).
    std::promise<std::pair<boost::system::error_code, sandbox::cell_result>> gone;
    i->async_execute({.code = "x", .timeout = 2000ms},
                     [&gone](boost::system::error_code ec, sandbox::cell_result cr) {
                       gone.set_value({ec, std::move(cr)});
                     });
    auto [ec, after] = gone.get_future().get();
    CHECK(ec == boost::asio::error::operation_aborted);
    r = std::move(after);
    CHECK(r.code == code::invalid_request);
    CHECK(r.state == interpreter_state::lost);
    CHECK(r.session_ended);
    CHECK(r.message == "the interpreter session is over");
  }
  {
    auto i = open();
    auto r = exec(*i, "print('bye')\nexit(3)");
    INFO(r.message);
    CHECK(r.code == code::ok);
    CHECK(r.state == interpreter_state::lost);
    CHECK(r.session_ended);
    CHECK(r.exit_code == 3);
    CHECK(r.std_out.summary == "bye\n");  // what it printed before it exited
  }
  {
    // The cell puts /dev/null over the driver's channel: nothing of the driver reaches the
    // host any more; the host ends the session and says the state is lost (the driver, which
    // sees its channel replaced, exits; or the host kills the sandbox).
    auto i = open();
    auto r = exec(*i,
                  "import os, sys\nm = sys.modules['__main__']\n"
                  "os.dup2(os.open('/dev/null', os.O_WRONLY), m._out)",
                  2000ms);
    CHECK(r.state == interpreter_state::lost);
    CHECK(r.session_ended);
    CHECK((r.code == code::internal || r.code == code::timeout ||
           (r.code == code::ok && r.exit_code.has_value())));
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

TEST_CASE("interpreter: files_in between cells, usage per cell, spans", "[interp]") {
  if (!can_run()) return;
  fixture();
  const auto before = itest::snapshot();
  {
    auto i = open();
    const std::string data = put("a,b\n1,2\n");
    const std::string in_dir = "os.environ['SANDBOX_INPUT_DIR']";
    // An input added before the cell: there, read-only, and still there at the next cell.
    auto r = exec(*i, {.code = "import os\nopen(os.path.join(" + in_dir + ", 'data.csv')).read()",
                       .timeout = 20000ms,
                       .files_in = {{.name = "data.csv", .blob = data}}});
    INFO(r.message << r.error);
    CHECK(r.code == code::ok);
    CHECK(r.value == "'a,b\\n1,2\\n'");
    r = exec(*i, "open(os.path.join(" + in_dir + ", 'data.csv'), 'a').write('x')");
    CHECK(r.code == code::error);
    CHECK(r.error.find("Error") != std::string::npos);
    // The same name with the same blob again: accepted; with another blob: refused.
    r = exec(*i, {.code = "sorted(os.listdir(" + in_dir + "))",
                  .files_in = {{.name = "data.csv", .blob = data}}});
    CHECK(r.code == code::ok);
    CHECK(r.value == "['data.csv']");
    const std::string other = put("other bytes");
    r = exec(*i, {.code = "1", .files_in = {{.name = "data.csv", .blob = other}}});
    CHECK(r.code == code::invalid_request);
    CHECK(r.message == "files_in[0].name: the session already has an input of that name");
    CHECK(r.state == interpreter_state::kept);
    CHECK(r.value.empty());  // the cell did not run
    // Bad names, ids, duplicates; a missing blob and another tenant's look alike.
    r = exec(*i, {.code = "1", .files_in = {{.name = "../x", .blob = other}}});
    CHECK(r.code == code::invalid_request);
    CHECK(r.message.rfind("files_in[0].name: ", 0) == 0);
    r = exec(*i, {.code = "1", .files_in = {{.name = "b", .blob = "sha256:nope"}}});
    CHECK(r.code == code::invalid_request);
    CHECK(r.message.rfind("files_in[0].blob: not a blob id", 0) == 0);
    r = exec(*i, {.code = "1",
                  .files_in = {{.name = "b", .blob = other}, {.name = "b", .blob = other}}});
    CHECK(r.code == code::invalid_request);
    CHECK(r.message == "files_in[1].name: duplicate of files_in[0].name");
    r = exec(*i,
             {.code = "1", .files_in = {{.name = "b", .blob = "sha256:" + std::string(64, 'a')}}});
    CHECK(r.code == code::blob_not_found);
    CHECK(r.message == "files_in[0].blob: blob not found");
    const std::string theirs = put("not yours", "someone-else");
    r = exec(*i, {.code = "1", .files_in = {{.name = "b", .blob = theirs}}});
    CHECK(r.code == code::blob_not_found);
    CHECK(r.message == "files_in[0].blob: blob not found");
    r = exec(*i, "sorted(os.listdir(" + in_dir + "))");
    CHECK(r.value == "['data.csv']");  // nothing of the refused cells arrived

    // Usage from the session's cgroup: this cell's CPU, not the session's so far.
    const auto busy =
        exec(*i, "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass");
    CHECK(busy.code == code::ok);
    CHECK(busy.usage.cpu >= 300ms);
    CHECK(busy.usage.wall > 0ms);
    r = exec(*i, "b = b'x' * (96 << 20)");
    CHECK(r.code == code::ok);
    CHECK(r.usage.peak_memory_bytes >= (96u << 20));
    r = exec(*i, "del b");
    r = exec(*i, "1");
    // The earlier cells' CPU is not counted again: a trivial cell costs less than the busy
    // one (relative, not a figure: under the test bed's emulation a cell's framing alone
    // costs tens of ms).
    CHECK(r.usage.cpu < busy.usage.cpu);
    CHECK(r.usage.peak_memory_bytes > 0);
    if (std::filesystem::exists("/sys/fs/cgroup/memory/memory.max_usage_in_bytes")) {
      // cgroup v1: the peak counter restarts with each cell.
      CHECK(r.usage.peak_memory_bytes < (96u << 20));
    }
    const auto cells = fixture().spans->of("sandbox.cell", i->id());
    REQUIRE(cells.size() == 14);
    CHECK(attr(cells[0], "error_code") == "ok");
    CHECK(attr(cells[0], "sandbox.cell.state") == "kept");
    CHECK(attr(cells[0], "sandbox.tenant") == "itest");
    CHECK(attr(cells[1], "error_code") == "error");
    CHECK(attr(cells[3], "error_code") == "invalid_request");
    CHECK(std::stoll(attr(cells[10], "sandbox.usage.cpu_ms")) >= 300);
    CHECK(std::stoll(attr(cells[11], "sandbox.usage.peak_memory_bytes")) >= (96 << 20));
    i->async_close(boost::asio::use_future).get();
    const auto sessions = fixture().spans->of("sandbox.interpreter", i->id());
    REQUIRE(sessions.size() == 1);
    CHECK(attr(sessions[0], "sandbox.interpreter.state") == "kept");
    CHECK(attr(sessions[0], "sandbox.session.end") == "closed");
    CHECK(attr(sessions[0], "sandbox.interpreter.cells") == std::to_string(cells.size()));
  }
  itest::check_host_unchanged(before);
}

TEST_CASE("interpreter: children outlive a cell within the pids limit and die with the session",
          "[interp]") {
  if (!can_run()) return;
  fixture();
  const auto before = itest::snapshot();
  const std::size_t host_before = host_processes();
  {
    auto i = open();
    const std::size_t alone = host_processes();
    CHECK(alone > host_before);
    // A child that outlives its cell: still running at the next cell, seen by the host.
    auto r = exec(*i,
                  "import subprocess, sys\n"
                  "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])");
    CHECK(r.code == code::ok);
    CHECK(exec(*i, "p.poll() is None").value == "True");
    CHECK(host_processes_settled(alone + 1) == alone + 1);
    CHECK(exec(*i, "p.kill(); p.wait()").value == "-9");
    CHECK(host_processes_settled(alone) == alone);
    // A fork bomb: stopped by the session's pids limit, and the interpreter lives on.
    r = exec(*i, R"PY(
import os, time
kids = []
try:
    while len(kids) < 4096:
        pid = os.fork()
        if pid == 0:
            time.sleep(600)
            os._exit(0)
        kids.append(pid)
except OSError as e:
    err = e.errno
len(kids)
)PY");
    INFO(r.message << r.error);
    CHECK(r.code == code::ok);
    CHECK(r.state == interpreter_state::kept);
    const auto forked = std::stoul(r.value.empty() ? "0" : r.value);
    CHECK(forked > 0);
    CHECK(forked < fixture().rt->policy().max_pids);
    CHECK(exec(*i, "err").value == "11");  // EAGAIN
    CHECK(host_processes() <= alone + fixture().rt->policy().max_pids);
    CHECK(host_processes() >= alone + forked);
    // A cell that reads its stdin gets end of file at once (never the driver's commands).
    r = exec(*i, "import sys, os\n(sys.stdin.read(), os.read(0, 10))");
    CHECK(r.code == code::ok);
    CHECK(r.value == "('', b'')");
    auto end = i->async_close(boost::asio::use_future).get();
    CHECK(end.end == sandbox::session_end::closed);
  }
  // Every child went with the session.
  itest::check_host_unchanged(before);
}

TEST_CASE("interpreter: OOM, an interrupt slept through, a closed stdout lose the state honestly",
          "[interp]") {
  if (!can_run()) return;
  fixture();
  const auto before = itest::snapshot();
  {
    // OOM: the host's counter says so; the state is lost and the session over.
    auto i = open("python3", itest::ticket("itest", 120000ms, 128ULL << 20));
    exec(*i, "x = 1");
    auto r = exec(*i, "b = b'x' * (400 << 20)");
    INFO(r.message);
    CHECK(r.code == code::oom);
    CHECK(r.state == interpreter_state::lost);
    CHECK(r.session_ended);
    CHECK(i->ended());
    CHECK(i->async_close(boost::asio::use_future).get().end == sandbox::session_end::oom);
    const auto cells = fixture().spans->of("sandbox.cell", i->id());
    REQUIRE(cells.size() == 2);
    CHECK(attr(cells[1], "error_code") == "oom");
    CHECK(attr(cells[1], "sandbox.cell.state") == "lost");
    const auto sessions = fixture().spans->of("sandbox.interpreter", i->id());
    REQUIRE(sessions.size() == 1);
    CHECK(attr(sessions[0], "sandbox.interpreter.state") == "lost");
  }
  {
    // A cell that swallows every KeyboardInterrupt: killed after the grace. Its deadline
    // leaves it time to get into its loop (an interrupt that reaches the driver before the
    // cell runs is raised as it starts, before the loop: state kept, as the early-interrupt
    // race test checks; seen on the cgroup v2 test bed's emulated CPU with 500 ms).
    auto i = open();
    auto r = exec(*i,
                  "import time\nwhile True:\n    try:\n        time.sleep(60)\n"
                  "    except KeyboardInterrupt:\n        pass",
                  500ms + itest::startup_allowance());
    CHECK(r.code == code::timeout);
    CHECK(r.state == interpreter_state::lost);
    CHECK(r.session_ended);
    CHECK(i->ended());
  }
  {
    // A cell that closes its own stdout and stderr: either the interpreter carries on (and
    // later cells work) or the host says the state is lost — never a kept state that is not.
    auto i = open();
    exec(*i, "x = 5");
    auto r = exec(*i, "import os\nos.close(1)\nos.close(2)", 5000ms);
    if (r.state == interpreter_state::kept) {
      CHECK(exec(*i, "x").value == "5");
    } else {
      CHECK(r.session_ended);
      CHECK(i->ended());
    }
    i->async_close(boost::asio::use_future).get();
  }
  itest::check_host_unchanged(before);
}

TEST_CASE("interpreter: the idle timeout and the maximum lifetime end the session", "[interp]") {
  if (!can_run()) return;
  fixture();
  const auto before = itest::snapshot();
  {
    auto i = open("python3", long_ticket(), {.idle_timeout = 300ms});
    CHECK(exec(*i, "x = 1").code == code::ok);
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    while (!i->ended() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(50ms);
    }
    CHECK(i->ended());
    auto fut = i->async_execute({.code = "x"}, boost::asio::use_future);
    CHECK_THROWS(fut.get());
    auto end = i->async_close(boost::asio::use_future).get();
    CHECK(end.end == sandbox::session_end::idle_timeout);
    CHECK(end.result.code == code::timeout);
  }
  {
    // A cell's timeout is cut to the lifetime left; then the lifetime ends the session.
    auto i = open("python3", long_ticket(), {.max_lifetime = 2500ms});
    auto r = exec(*i, "import time\ntime.sleep(60)", 20000ms);
    CHECK(r.code == code::timeout);
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    while (!i->ended() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(50ms);
    }
    CHECK(i->ended());
    auto end = i->async_close(boost::asio::use_future).get();
    CHECK(end.end == sandbox::session_end::max_lifetime);
    CHECK(end.result.code == code::timeout);
  }
  itest::check_host_unchanged(before);
}

TEST_CASE("interpreter: session caps refuse with capacity; tenants stay apart", "[interp]") {
  if (!can_run()) return;
  fixture();
  const auto before = itest::snapshot();
  {
    // Tenant "capped" may hold one live session; the host three.
    auto a = open("python3", itest::ticket("capped", 120000ms));
    auto refused = try_open({}, itest::ticket("capped", 120000ms));
    CHECK(refused.code == code::capacity);
    CHECK(!refused.interpreter);
    auto b = open("python3", itest::ticket("tenant-b", 120000ms));
    auto c = open("python3", itest::ticket("tenant-c", 120000ms));
    refused = try_open({}, itest::ticket("tenant-d", 120000ms));
    CHECK(refused.code == code::capacity);
    // Tenants apart: b's outputs are b's blobs, and b cannot name a's.
    auto r = exec(*b, "print('secret of b')");
    CHECK(blob(r.std_out.blob, "tenant-b") == "secret of b\n");
    CHECK(blob(r.std_out.blob, "capped") == "<absent>");
    const std::string of_a = put("a's data", "capped");
    r = exec(*b, {.code = "1", .files_in = {{.name = "a.txt", .blob = of_a}}});
    CHECK(r.code == code::blob_not_found);
    for (auto* i : {&a, &b, &c}) (*i)->async_close(boost::asio::use_future).get();
    // Closed sessions gave their places back.
    auto again = open("python3", itest::ticket("capped", 120000ms));
    again->async_close(boost::asio::use_future).get();
  }
  itest::check_host_unchanged(before);
}

TEST_CASE("interpreter: an interrupt that reaches the driver before its cell starts is kept",
          "[interp]") {
  if (!can_run()) return;
  fixture();
  const auto before = itest::snapshot();
  {
    auto i = open();
    exec(*i, "x = 3");
    // The ordering forced, not timed: the driver's queue of cells waits (up to 60 s) until
    // the reader thread has recorded an interrupt for a cell not yet running, so the next
    // cell's interrupt is there before the cell starts. Dropped, it would leave the cell
    // asleep until the grace ran out and the sandbox was killed (state lost).
    auto r = exec(*i, R"PY(
import sys, time
m = sys.modules['__main__']
class _Late:
    def __init__(self, q):
        self.q = q
    def put(self, msg):
        self.q.put(msg)
    def get(self):
        msg = self.q.get()
        t = time.monotonic()
        while m._pending[0] is None and time.monotonic() - t < 60:
            time.sleep(0.01)
        m._cells = self.q
        return msg
m._cells = _Late(m._cells)
)PY");
    REQUIRE(r.code == code::ok);
    r = exec(*i, "import time\ntime.sleep(60)", 300ms);
    INFO(r.message << r.error);
    CHECK(r.code == code::timeout);
    CHECK(r.state == interpreter_state::kept);
    CHECK(!r.session_ended);
    CHECK(r.error.find("KeyboardInterrupt") != std::string::npos);
    CHECK(exec(*i, "x").value == "3");
    i->async_close(boost::asio::use_future).get();
  }
  itest::check_host_unchanged(before);
}

TEST_CASE("interpreter: a cell that closes or replaces the driver's channel ends the session",
          "[interp]") {
  if (!can_run()) return;
  fixture();
  const auto before = itest::snapshot();
  // Each way of taking the channel: the command input closed or replaced, the frame output
  // closed. The driver cannot be trusted to say so (the cell shares its process): the host
  // ends the session on its own evidence, the state lost, within the cell's hang deadline.
  for (const std::string take :
       {"os.close(m._in)", "os.dup2(os.open('/dev/null', os.O_RDONLY), m._in)",
        "os.close(m._out)"}) {
    INFO(take);
    auto i = open();
    exec(*i, "x = 1");
    auto r = exec(*i, "import os, sys\nm = sys.modules['__main__']\n" + take, 20000ms);
    INFO(r.message);
    CHECK(r.state == interpreter_state::lost);
    CHECK(r.session_ended);
    CHECK(i->ended());
    // Its code is the host's: the interpreter's exit (with its status), or the kill.
    CHECK((r.code == code::ok || r.code == code::internal || r.code == code::timeout));
    if (r.code == code::ok) CHECK(r.exit_code.has_value());
    i->async_close(boost::asio::use_future).get();
  }
  // A new session works afterwards.
  auto i = open();
  CHECK(exec(*i, "1 + 1").value == "2");
  i->async_close(boost::asio::use_future).get();
  i.reset();
  itest::check_host_unchanged(before);
}

TEST_CASE("interpreter: a cell's refused network attempts give network_disabled, state kept",
          "[interp]") {
  if (!can_run()) return;
  fixture();
  const auto before = itest::snapshot();
  {
    auto i = open();
    exec(*i, "x = 9");
    // As a run's: the host's record of the attempt, not what the cell says of it.
    auto r = exec(*i, R"PY(
import socket
s = socket.socket()
try:
    s.connect(('192.0.2.1', 80))
except OSError as e:
    print('refused', e.errno)
)PY");
    INFO(r.message << r.error);
    CHECK(r.code == code::network_disabled);
    CHECK(r.state == interpreter_state::kept);
    CHECK(r.std_out.summary.rfind("refused", 0) == 0);
    // The next cell's code is its own.
    r = exec(*i, "x");
    CHECK(r.code == code::ok);
    CHECK(r.value == "9");
    i->async_close(boost::asio::use_future).get();
  }
  itest::check_host_unchanged(before);
}
