// The host's side of the stream control channel (runsc's mode: length-prefixed packets on
// sandbox-init's stdin, a session's stdin carried as `stdin_data` under a credit window),
// against a scripted stand-in for sandbox-init: a Python program spoken to exactly as runsc's
// sandbox-init is, which behaves well (the harness is sound) or breaks the protocol on
// purpose. What it proves: the host never has more than `stdin_window` bytes in flight,
// whatever the host buffers, and an ack it was not owed — more than in flight, unasked, or
// in a run without a stream stdin — ends the run `internal` with nothing left behind.
//
// Root only (the stand-in runs in a real run cgroup under the init backend's machine).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/buffer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <fstream>
#include <future>
#include <thread>

#include "core/run/machine.hpp"
#include "integration/harness.hpp"
#include "sys/pidfd.hpp"
#include "sys/spawn.hpp"

namespace asio = boost::asio;
using namespace std::chrono_literals;
namespace ip = sandbox::detail::init_protocol;

namespace {

// The stand-in. Behaviour: the first argv of the program (`go`), or the self-test's probe.
constexpr const char* fake_init_py = R"PY(
import os, struct, sys, time
CTL = 0
def read_exact(n):
    b = b''
    while len(b) < n:
        c = os.read(CTL, n - len(b))
        if not c:
            os._exit(0)  # the host closed the channel
        b += c
    return b
def recv():
    (n,) = struct.unpack('=I', read_exact(4))
    body = read_exact(n)
    t, a, b = struct.unpack('=IIq', body[:16])
    return t, a, body[16:]
def send(t, a=0, payload=b''):
    body = struct.pack('=IIq', t, a, 0) + payload
    os.write(CTL, struct.pack('=I', len(body)) + body)
def out(text):
    os.write(1, text.encode())
def idle():
    while True:
        recv()
t, _, cfg = recv()
assert t == 1
send(10)                                  # ready
t, a, go = recv()
assert t == 2
argv = [kv[5:].decode() for kv in go.split(b'\0') if kv.startswith(b'argv=')]
if '--probe' in argv:                     # the start-up self-test
    send(14, 0, b'probe.invalid')         # a DNS query, as the real sink reports it
    send(11, 2)                           # started
    out('probe ok\n')
    send(12, 0)                           # exited 0
    send(15)                              # quiet
    idle()
mode = argv[1]
send(11, 2)                               # started
if mode == 'cat':                         # a well-behaved session: echo, ack, EOF ends it
    while True:
        t, a, p = recv()
        if t == 3:
            os.write(1, p)
            send(17, len(p))
        elif t == 4:
            send(12, 0)
            send(15)
            idle()
elif mode == 'never-ack':                 # counts what the host sends without any credit back
    got = 0
    while got < 65536:
        t, a, p = recv()
        got += len(p)
    os.set_blocking(CTL, False)
    end = time.time() + 0.3
    while time.time() < end:              # anything beyond the window shows up here
        try:
            n, = struct.unpack('=I', os.read(CTL, 4))
        except (BlockingIOError, struct.error):
            time.sleep(0.01)
            continue
        os.set_blocking(CTL, True)
        body = read_exact(n)
        got += len(body) - 16
        os.set_blocking(CTL, False)
    os.set_blocking(CTL, True)
    out('%d\n' % got)
    idle()
elif mode == 'ack-more':                  # acknowledges one byte more than it was sent
    t, a, p = recv()
    send(17, len(p) + 1)
    idle()
elif mode == 'ack-unasked':               # acknowledges before anything was sent
    send(17, 1)
    idle()
elif mode == 'stdin-closed-in-run':       # a one-shot run has no stream stdin to close
    send(18)
    idle()
)PY";

// runsc's launcher, minus runsc: the stand-in gets the control socket as its stdin and the
// capture pipes as stdout/stderr, in the run's cgroup, in stream mode.
class fake_stream_launcher final : public sandbox::detail::launcher {
 public:
  fake_stream_launcher(int python_fd, std::string script)
      : python_fd_(python_fd), script_(std::move(script)) {}
  ~fake_stream_launcher() override { ::close(python_fd_); }
  sandbox::detail::launcher_traits traits() const override {
    return {.isolation = sandbox::isolation::gvisor,
            .name = "fake-stream",
            .description = "fake-stream",
            .stream_control = true,
            .probe_path = "probe"};
  }
  sandbox::result<std::unique_ptr<sandbox::detail::launched>> launch(
      const sandbox::detail::launch_request& r, std::string* why) override {
    sandbox::detail::spawn_request sr;
    sr.exec_fd = python_fd_;
    sr.argv = {"python3", "-c", script_};
    sr.fd0 = r.ctl_fd;
    sr.fd1 = r.out_fd;
    sr.fd2 = r.err_fd;
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    sr.fd3 = devnull;  // (as runsc's launcher: fd 3 is /dev/null in stream mode)
    auto sp = sandbox::detail::spawn_process(sr);
    ::close(devnull);
    if (!sp) {
      *why = sp.error().message();
      return sp.error();
    }
    if (auto a = r.cgroup.attach(sp->pid); !a) {
      *why = "attach: " + a.error().message();
      ::kill(sp->pid, SIGKILL);
      siginfo_t si{};
      sandbox::detail::waitid_pidfd(sp->pidfd, &si, WEXITED);
      ::close(sp->pidfd);
      return a.error();
    }
    auto l = std::make_unique<sandbox::detail::launched>();
    l->pid = sp->pid;
    l->pidfd.reset(sp->pidfd);
    l->config.add("launch", "oci");
    return l;
  }

 private:
  int python_fd_;
  std::string script_;
};

struct fake_backend_fixture {
  std::string root;
  std::shared_ptr<sandbox::backend> backend;
  std::string why;
  asio::io_context io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::thread thread;

  fake_backend_fixture() {
    char tmpl[] = "/tmp/sandbox-stream-XXXXXX";
    root = ::mkdtemp(tmpl);
    std::filesystem::create_directories(root + "/rootfs");
    int py = ::open("/usr/bin/python3", O_PATH | O_CLOEXEC);
    sandbox::detail::run_machine_context ctx{};
    ctx.executor = io.get_executor();
    if (const char* p = std::getenv("SANDBOX_CGROUP_PARENT")) ctx.options.cgroup_parent = p;
    ctx.state_dir = root + "/state";
    ctx.log = [](sandbox::log_level, std::string_view) {};
    work.emplace(io.get_executor());
    thread = std::thread([this] { io.run(); });
    auto made = sandbox::detail::make_run_machine(
        ctx, std::make_shared<fake_stream_launcher>(py, fake_init_py));
    if (auto* b = std::get_if<std::shared_ptr<sandbox::backend>>(&made))
      backend = *b;
    else
      why = std::get<std::string>(made);
  }
  ~fake_backend_fixture() {
    if (backend) backend->shutdown();
    backend.reset();
    work.reset();
    io.stop();
    thread.join();
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }

  sandbox::run_job job(const std::string& mode) {
    sandbox::run_job j;
    j.run_id = "stream-" + mode + "-" + std::to_string(++n_);
    j.admitted.tenant = "itest";
    j.admitted.request.runtime = "fake";
    j.admitted.request.timeout = 20s;
    j.admitted.request.memory_limit_bytes = 256ULL << 20;
    j.admitted.isolation = sandbox::isolation::gvisor;
    j.runtime = {.name = "fake", .argv = {"fake", mode}, .source_name = "main", .image = {}};
    j.rootfs = root + "/rootfs";
    j.blobs = sandbox::make_memory_blob_store();
    j.policy = sandbox::policy{};
    j.executor = io.get_executor();
    return j;
  }

  sandbox::session_start open(const std::string& mode, std::uint32_t buffer = 256 * 1024) {
    std::promise<sandbox::session_start> p;
    backend->open_session(
        job(mode), {.idle_timeout = 20s, .stdin_buffer_bytes = buffer, .on_end = {}},
        [&](boost::system::error_code, sandbox::session_start s) { p.set_value(std::move(s)); });
    return p.get_future().get();
  }

 private:
  int n_ = 0;
};

bool ready(fake_backend_fixture& f) {
  if (::geteuid() != 0) {
    // Like the container and gvisor levels it stands for, it needs root (run-tests.sh runs
    // this executable as root too, where it must work).
    WARN("not root: skipped");
    return false;
  }
  INFO(f.why);
  REQUIRE(f.backend);
  return true;
}

std::string read_line(sandbox::session& s) {
  std::string line;
  char c;
  for (;;) {
    auto [ec, n] = [&] {
      std::promise<std::pair<boost::system::error_code, std::size_t>> p;
      s.async_read_some(asio::buffer(&c, 1), [&](boost::system::error_code e, std::size_t k) {
        p.set_value({e, k});
      });
      return p.get_future().get();
    }();
    if (ec || n == 0) return line;
    if (c == '\n') return line;
    line.push_back(c);
  }
}

}  // namespace

TEST_CASE("stream control: a well-behaved stand-in round-trips a session's stdin",
          "[session][stream]") {
  auto before = itest::snapshot();
  {
    fake_backend_fixture f;
    if (!ready(f)) return;
    auto st = f.open("cat");
    INFO(st.message);
    REQUIRE(st.session);
    std::string data(200000, '\0');
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 % 256);
    std::promise<std::size_t> wrote;
    st.session->async_write(asio::buffer(data), [&](boost::system::error_code ec, std::size_t n) {
      CHECK(!ec);
      wrote.set_value(n);
    });
    std::string echo;
    std::vector<char> buf(65536);
    std::thread closer([&] {
      CHECK(wrote.get_future().get() == data.size());
      st.session->close_stdin();
    });
    for (;;) {
      std::promise<std::pair<boost::system::error_code, std::size_t>> p;
      st.session->async_read_some(asio::buffer(buf),
                                  [&](boost::system::error_code e, std::size_t k) {
                                    p.set_value({e, k});
                                  });
      auto [ec, n] = p.get_future().get();
      echo.append(buf.data(), n);
      if (ec) {
        CHECK(ec == asio::error::eof);
        break;
      }
    }
    closer.join();
    CHECK(echo == data);
    auto r = st.session->async_close(asio::use_future).get();
    CHECK(r.result.code == sandbox::code::ok);
    CHECK(r.bytes_to_server == data.size());
  }
  itest::check_host_unchanged(before);
}

TEST_CASE("stream control: the host never has more than the window in flight",
          "[session][stream]") {
  auto before = itest::snapshot();
  {
    fake_backend_fixture f;
    if (!ready(f)) return;
    auto st = f.open("never-ack", 256 * 1024);
    REQUIRE(st.session);
    auto& s = *st.session;
    std::string data(1 << 20, 'w');
    std::atomic<bool> done{false};
    s.async_write(asio::buffer(data), [&](boost::system::error_code, std::size_t) { done = true; });
    // The stand-in counts every stdin byte it was sent, with no credit given back.
    CHECK(read_line(s) == std::to_string(ip::stdin_window));
    auto x = s.stats();
    CHECK(x.write_waiting);
    CHECK(x.stdin_buffered == 256 * 1024);  // the host's buffer is full; only the window left
    CHECK(x.bytes_to_server == 0);          // nothing acknowledged, nothing counted
    CHECK(!done.load());
    auto r = s.async_close(asio::use_future).get();
    CHECK(r.end == sandbox::session_end::closed);
  }
  itest::check_host_unchanged(before);
}

TEST_CASE("stream control: an ack the host was not owed ends the run internal",
          "[session][stream]") {
  auto before = itest::snapshot();
  {
    fake_backend_fixture f;
    if (!ready(f)) return;
    // More than was in flight.
    {
      auto st = f.open("ack-more");
      REQUIRE(st.session);
      std::string data(1000, 'a');
      auto wrote = st.session->async_write(asio::buffer(data), asio::use_future);
      // The session ends by itself on the fault (a wait, bounded by the idle timeout).
      for (int i = 0; i < 4000 && !st.session->stats().ended; ++i) std::this_thread::sleep_for(5ms);
      CHECK(st.session->stats().ended);
      auto r = st.session->async_close(asio::use_future).get();
      CHECK(r.end == sandbox::session_end::failed);
      CHECK(r.result.code == sandbox::code::internal);
      CHECK(r.bytes_to_server == 0);
      CHECK(wrote.get() == data.size());  // accepted into the buffer before the fault
    }
    // Before anything was sent: the session fails on its own (or its open does).
    {
      auto st = f.open("ack-unasked");
      if (st.session) {
        for (int i = 0; i < 4000 && !st.session->stats().ended; ++i) {
          std::this_thread::sleep_for(5ms);
        }
        CHECK(st.session->stats().ended);
        auto r = st.session->async_close(asio::use_future).get();
        CHECK(r.result.code == sandbox::code::internal);
        CHECK(r.end == sandbox::session_end::failed);
      } else {
        CHECK(st.code == sandbox::code::internal);
      }
    }
    // A one-shot run has no stream stdin: a stdin message from its sandbox-init is a fault.
    {
      auto r = f.backend->async_execute(f.job("stdin-closed-in-run"), asio::use_future).get();
      CHECK(r.code == sandbox::code::internal);
    }
  }
  itest::check_host_unchanged(before);
}
