// The runtime with the fake backend: admission through the runtime, blob checks, result
// filling, spans, completion styles, cancellation, destruction with runs in flight,
// concurrency.
#include <unistd.h>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <optional>
#include <set>

#include "backends/levels.hpp"
#include "runtime/runtime_impl.hpp"
#include "sandbox/sandbox.hpp"
#include "unit/runtime/runtime_test_support.hpp"

namespace asio = boost::asio;
using namespace std::chrono_literals;
using sandbox::code;
using sandbox::run_result;
using sandbox::test::eventually;
using sandbox::test::make_fake_runtime;
using sandbox::test::make_ticket;
using sandbox::test::py;
using sandbox::testing::fake_backend;
using sandbox::testing::fake_digest;
using sandbox::testing::result_with;
using sandbox::testing::scripted_run;

namespace {

constexpr auto forever = std::chrono::hours(1);

sandbox::runtime_options fake_options(std::shared_ptr<sandbox::span_sink> spans = nullptr) {
  sandbox::runtime_options o;
  o.blobs = sandbox::make_memory_blob_store();
  o.fixed_digests = {{"python3", fake_digest("python3")}, {"node", fake_digest("node")}};
  o.process_backend = false;
  o.spans = std::move(spans);
  o.log = [](sandbox::log_level, std::string_view) {};
  return o;
}

/// `fake_options()` with a state directory of this test process named by `tag`, and the
/// container and gvisor levels enabled so that each self-test refuses at once: container
/// with runc at a path that does not exist, gvisor with an OCI runtime it does not know.
sandbox::runtime_options refused_oci_options(const std::string& tag) {
  auto o = fake_options();
  o.state_dir = std::filesystem::temp_directory_path() /
                ("rt-test-" + tag + "-" + std::to_string(::getpid()));
  o.container.enabled = true;
  o.container.runtime = "runc";
  o.container.path = "/nonexistent/runc";
  o.gvisor.enabled = true;
  o.gvisor.runtime = "docker";
  return o;
}

sandbox::runtime create_on(const asio::any_io_executor& ex,
                           sandbox::runtime_options o = fake_options()) {
  auto rt = sandbox::runtime::create(ex, std::move(o));
  REQUIRE(rt.has_value());
  return std::move(*rt);
}

/// An io_context run by one thread until `stop()` / destruction.
struct io_thread {
  asio::io_context io{1};
  asio::executor_work_guard<asio::io_context::executor_type> guard{io.get_executor()};
  std::thread thread{[this] { io.run(); }};
  void stop() {
    guard.reset();
    io.stop();
    if (thread.joinable()) thread.join();
  }
  ~io_thread() { stop(); }
};

}  // namespace

// --- defaults ---------------------------------------------------------------------------

TEST_CASE("default runtimes are python3 and node", "[runtime]") {
  auto rs = sandbox::default_runtimes();
  REQUIRE(rs.size() == 2);
  CHECK(rs[0].name == "python3");
  CHECK(rs[0].argv == std::vector<std::string>{"/usr/bin/python3", "-I", "{source}"});
  CHECK(rs[0].source_name == "main.py");
  CHECK(rs[1].name == "node");
  CHECK(rs[1].argv == std::vector<std::string>{"/usr/bin/node", "{source}"});
  CHECK(rs[1].source_name == "main.js");
}

TEST_CASE("default paths follow the user", "[runtime]") {
  auto o = sandbox::default_runtime_options();
  CHECK(o.runtimes == sandbox::default_runtimes());
  CHECK(o.process_backend);
  if (::geteuid() == 0) {
    CHECK(o.state_dir == "/run/agent-sandbox");
    CHECK(o.image_dir == "/var/lib/agent-sandbox/images");
    CHECK(o.blob_dir == "/var/lib/agent-sandbox/blobs");
  } else {
    CHECK(o.state_dir.is_absolute());
    CHECK(o.image_dir.filename() == "images");
    CHECK(o.image_dir.parent_path().filename() == "agent-sandbox");
    CHECK(o.blob_dir.filename() == "blobs");
    if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x != nullptr && x[0] == '/') {
      CHECK(o.state_dir == std::filesystem::path(x) / "agent-sandbox");
    } else {
      CHECK(o.state_dir == "/tmp/agent-sandbox-" + std::to_string(::geteuid()));
    }
  }
}

// --- creation -----------------------------------------------------------------------------

TEST_CASE("make_runtime registers the fake at microvm with fake digests", "[runtime]") {
  auto fake = std::make_shared<fake_backend>();
  auto rt = make_fake_runtime(fake);
  auto cat = rt.catalog();
  CHECK(cat.levels == std::vector<sandbox::isolation>{sandbox::isolation::microvm});
  REQUIRE(cat.runtimes.size() == 2);
  CHECK(cat.runtimes.at("python3") == fake_digest("python3"));
  CHECK(cat.runtimes.at("node") == fake_digest("node"));
  CHECK(fake_digest("python3") != fake_digest("node"));
  CHECK(sandbox::is_valid_blob_id(fake_digest("python3")));
  auto st = rt.backends();
  REQUIRE(st.size() == 1);
  CHECK(st[0] == sandbox::backend_status{.isolation = sandbox::isolation::microvm,
                                         .name = "fake",
                                         .registered = true,
                                         .reason = ""});
  CHECK(rt.blobs() != nullptr);
  CHECK(rt.images() == nullptr);
}

TEST_CASE("a runtime without backends is created and answers runtime_unavailable", "[runtime]") {
  auto rt = sandbox::runtime::create(fake_options());
  REQUIRE(rt.has_value());
  CHECK(rt->catalog().levels.empty());
  auto r = rt->run(py("print(1)"), make_ticket());
  CHECK(r.code == code::runtime_unavailable);
  CHECK(sandbox::test::is_run_id(r.run_id));

  // A backend added later serves from then on.
  auto fake = std::make_shared<fake_backend>(sandbox::isolation::process);
  fake->otherwise().respond_stdout("1\n");
  rt->add_backend(fake);
  r = rt->run(py("print(1)"), make_ticket());
  CHECK(r.code == code::ok);
  CHECK(r.std_out.summary == "1\n");
}

TEST_CASE("the process backend's status is reported", "[runtime]") {
  auto o = fake_options();
  o.process_backend = true;
  o.state_dir =
      std::filesystem::temp_directory_path() / ("rt-test-state-" + std::to_string(::getpid()));
  // No cgroup filesystem there: the self-test must refuse, and say why, without touching the
  // host's cgroups.
  o.process.cgroup_root = o.state_dir / "no-cgroupfs";
  {
    auto rt = sandbox::runtime::create(o);
    REQUIRE(rt.has_value());
    auto st = rt->backends();
    REQUIRE(st.size() == 1);
    CHECK(st[0].name == "process");
    CHECK(st[0].isolation == sandbox::isolation::process);
    CHECK_FALSE(st[0].registered);
    CHECK_FALSE(st[0].reason.empty());
    CHECK(rt->catalog().levels.empty());
  }
  std::error_code ec;
  std::filesystem::remove_all(o.state_dir, ec);

  auto probed = sandbox::probe_backends(o);
  REQUIRE(probed.size() == 1);
  CHECK(probed[0].name == "process");
  CHECK_FALSE(probed[0].registered);
  CHECK_FALSE(probed[0].reason.empty());

  o.process_backend = false;
  probed = sandbox::probe_backends(o);
  REQUIRE(probed.size() == 1);
  CHECK_FALSE(probed[0].registered);
  CHECK_FALSE(probed[0].reason.empty());
}

// Registration and probing go through the one levels table: every level the options enable
// gets a status (registered, or refused with the reason), in the levels' order; a probe also
// lists the process level when it was turned off.
TEST_CASE("every enabled level gets a status, refused with its reason", "[runtime]") {
  auto o = refused_oci_options("levels");
  const bool oci_built = sandbox::detail::builtin_levels()[1].built;
  auto check_refusals = [&](const std::vector<sandbox::backend_status>& st) {
    REQUIRE(st.size() == 2);
    CHECK(st[0].isolation == sandbox::isolation::container);
    CHECK(st[0].name == "runc");
    CHECK_FALSE(st[0].registered);
    CHECK(st[1].isolation == sandbox::isolation::gvisor);
    CHECK(st[1].name == "docker");
    CHECK_FALSE(st[1].registered);
    if (oci_built) {
      CHECK(st[0].reason.starts_with("runc not found at /nonexistent/runc"));
      CHECK(st[1].reason == "unknown OCI runtime 'docker' (crun, runc or runsc)");
    } else {
      CHECK(st[0].reason == "not built into this library (SANDBOX_BACKEND_OCI=OFF)");
      CHECK(st[1].reason == "not built into this library (SANDBOX_BACKEND_OCI=OFF)");
    }
  };
  {
    auto rt = sandbox::runtime::create(o);
    REQUIRE(rt.has_value());
    check_refusals(rt->backends());
    CHECK(rt->catalog().levels.empty());
  }
  auto probed = sandbox::probe_backends(o);
  REQUIRE(probed.size() == 3);
  CHECK(probed[0].isolation == sandbox::isolation::process);
  CHECK(probed[0].name == "process");
  CHECK_FALSE(probed[0].registered);
  CHECK(probed[0].reason == "disabled (runtime_options::process_backend is false)");
  check_refusals({probed[1], probed[2]});
  std::error_code ec;
  std::filesystem::remove_all(o.state_dir, ec);
}

// `levels_on_demand` (sandboxctl run): no level is tried at creation; a run tries the enabled
// levels from the one it needs upward and stops where an eager runtime's choice would be.
TEST_CASE("levels on demand: only the levels a run needs are tried, weakest first", "[runtime]") {
  auto o = refused_oci_options("demand");
  o.levels_on_demand = true;
  const bool oci_built = sandbox::detail::builtin_levels()[1].built;
  auto levels_of = [](const std::vector<sandbox::backend_status>& st) {
    std::vector<sandbox::isolation> out;
    for (const auto& s : st) out.push_back(s.isolation);
    return out;
  };
  using sandbox::isolation;

  SECTION("a process-level run never tries the stronger levels") {
    auto rt = sandbox::runtime::create(o);
    REQUIRE(rt.has_value());
    CHECK(rt->backends().empty());  // nothing tried at creation
    auto fake = std::make_shared<fake_backend>(isolation::process);
    rt->add_backend(fake);
    auto r = rt->run(py("print(1)"), make_ticket());
    CHECK(r.code == code::ok);
    CHECK(levels_of(rt->backends()) == std::vector{isolation::process});
    // A container-level run tries container, then gvisor (both refused), once each.
    r = rt->run(py("print(1)"), make_ticket("acme", isolation::container));
    CHECK(r.code == code::runtime_unavailable);
    const auto st = rt->backends();
    REQUIRE(levels_of(st) ==
            std::vector{isolation::process, isolation::container, isolation::gvisor});
    CHECK_FALSE(st[1].registered);
    CHECK_FALSE(st[2].registered);
    if (oci_built) CHECK(st[1].reason.starts_with("runc not found at /nonexistent/runc"));
    r = rt->run(py("print(1)"), make_ticket("acme", isolation::gvisor));
    CHECK(r.code == code::runtime_unavailable);
    CHECK(rt->backends().size() == 3);  // never tried again
    CHECK(fake->requests().size() == 1);
  }
  SECTION("an untried level weaker than the registered one is tried first") {
    auto rt = sandbox::runtime::create(o);
    REQUIRE(rt.has_value());
    auto fake = std::make_shared<fake_backend>(isolation::gvisor);
    rt->add_backend(fake);
    // Needs container: container is tried (refused), so gvisor serves, as it would have for
    // a runtime that tried every level at creation.
    auto r = rt->run(py("print(1)"), make_ticket("acme", isolation::container));
    CHECK(r.code == code::ok);
    CHECK(levels_of(rt->backends()) == std::vector{isolation::gvisor, isolation::container});
    CHECK(fake->requests().size() == 1);
  }
  SECTION("a network run needs container at least, whatever the ticket's level") {
    auto rt = sandbox::runtime::create(o);
    REQUIRE(rt.has_value());
    rt->add_backend(std::make_shared<fake_backend>(isolation::process));
    auto req = py("print(1)");
    req.network = true;
    req.egress = {"example.com"};
    auto t = sandbox::ticket_issuer{}
                 .issue({.id = "net", .tenant = "acme", .egress = {"example.com"}},
                        sandbox::network_grant{})
                 .value();
    auto r = rt->run(req, t);
    CHECK(r.code == code::runtime_unavailable);
    CHECK(levels_of(rt->backends()) ==
          std::vector{isolation::process, isolation::container, isolation::gvisor});
  }
  std::error_code ec;
  std::filesystem::remove_all(o.state_dir, ec);
}

TEST_CASE("required_level: the ticket's, a tool entry's when stronger, container for network",
          "[runtime]") {
  using sandbox::isolation;
  sandbox::host_catalog cat;
  sandbox::tool_entry strong;
  strong.name = "strong";
  strong.isolation = isolation::gvisor;
  cat.tools.emplace("strong", sandbox::host_catalog::tool{.entry = strong});
  sandbox::tool_entry net;
  net.name = "net";
  net.egress = {"example.com"};
  cat.tools.emplace("net", sandbox::host_catalog::tool{.entry = net});
  const auto process = make_ticket();
  const auto microvm = make_ticket("acme", isolation::microvm);
  CHECK(sandbox::required_level(py("1"), process, cat) == isolation::process);
  CHECK(sandbox::required_level(py("1"), microvm, cat) == isolation::microvm);
  sandbox::run_request tool{.tool = "strong"};
  CHECK(sandbox::required_level(tool, process, cat) == isolation::gvisor);
  CHECK(sandbox::required_level(tool, microvm, cat) == isolation::microvm);
  tool.tool = "net";
  CHECK(sandbox::required_level(tool, process, cat) == isolation::container);
  tool.tool = "unknown";
  CHECK(sandbox::required_level(tool, process, cat) == isolation::process);
  auto networked = py("1");
  networked.network = true;
  CHECK(sandbox::required_level(networked, process, cat) == isolation::container);
  CHECK(sandbox::required_level(networked, microvm, cat) == isolation::microvm);
}

TEST_CASE("the levels' options come from the runtime's, defaults on by default", "[runtime]") {
  auto o = sandbox::default_runtime_options();
  auto lo = sandbox::detail::level_options_of(o, {});
  for (const auto& l : sandbox::detail::builtin_levels()) {
    INFO(l.name);
    CHECK(l.enabled(lo) == l.on_by_default);
  }
  CHECK(sandbox::detail::builtin_levels()[1].backend_name(lo) == "crun");
  CHECK(sandbox::detail::builtin_levels()[2].backend_name(lo) == "runsc");
  o.process_backend = false;
  o.microvm.enabled = true;
  o.microvm.qemu_path = "/opt/qemu";
  o.gvisor.platform = "kvm";
  lo = sandbox::detail::level_options_of(o, {});
  CHECK_FALSE(lo.process);
  CHECK(lo.microvm.enabled);
  CHECK(lo.microvm.qemu_path == "/opt/qemu");
  CHECK(lo.gvisor.platform == "kvm");
}

TEST_CASE("create rejects an empty executor", "[runtime]") {
  auto rt = sandbox::runtime::create(asio::any_io_executor{}, fake_options());
  REQUIRE_FALSE(rt.has_value());
  CHECK(rt.error() == sandbox::errc::invalid_argument);
}

TEST_CASE("filesystem stores: a store without images leaves runtimes absent", "[runtime]") {
  auto dir =
      std::filesystem::temp_directory_path() / ("rt-test-stores-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  {
    sandbox::runtime_options o;
    o.blob_dir = dir / "blobs";
    o.image_dir = dir / "images";
    o.state_dir = dir / "state";
    o.process_backend = false;
    o.log = [](sandbox::log_level, std::string_view) {};
    auto rt = sandbox::runtime::create(o);
    REQUIRE(rt.has_value());
    CHECK(rt->images() != nullptr);
    auto cat = rt->catalog();
    REQUIRE(cat.runtimes.size() == 2);
    CHECK_FALSE(cat.runtimes.at("python3").has_value());
    CHECK_FALSE(cat.runtimes.at("node").has_value());
    rt->add_backend(std::make_shared<fake_backend>());
    auto r = rt->run(py("print(1)"), make_ticket());
    CHECK(r.code == code::runtime_unavailable);

    // Blobs go to the filesystem store.
    auto id = rt->blobs()->put("acme", "hello");
    REQUIRE(id.has_value());
    CHECK(std::filesystem::exists(dir / "blobs"));
  }
  std::filesystem::remove_all(dir);
}

// --- admission through the runtime ---------------------------------------------------------

TEST_CASE("admission codes come back through the runtime", "[runtime]") {
  auto fake = std::make_shared<fake_backend>();
  sandbox::policy policy;
  policy.max_source_bytes = 64;
  auto rt = make_fake_runtime(fake, policy);
  auto t = make_ticket();

  SECTION("invalid_request: protocol version") {
    auto req = py("print(1)");
    req.v = 2;
    auto r = rt.run(req, t);
    CHECK(r.code == code::invalid_request);
    CHECK_FALSE(r.message.empty());
  }
  SECTION("invalid_request: timeout <= 0") {
    auto req = py("print(1)");
    req.timeout = 0ms;
    CHECK(rt.run(req, t).code == code::invalid_request);
  }
  SECTION("invalid_request: unknown runtime") {
    auto req = py("print(1)");
    req.runtime = "ruby";
    CHECK(rt.run(req, t).code == code::invalid_request);
  }
  SECTION("source_too_large") {
    auto r = rt.run(py(std::string(65, 'x')), t);
    CHECK(r.code == code::source_too_large);
  }
  SECTION("action_denied") {
    auto r = rt.run(py("print(1)"), make_ticket("acme", sandbox::isolation::process, false));
    CHECK(r.code == code::action_denied);
  }
  SECTION("action_denied: network without code.network") {
    auto req = py("print(1)");
    req.network = true;
    req.egress = {"api.example.com"};
    CHECK(rt.run(req, t).code == code::action_denied);
  }
  SECTION("digest_mismatch") {
    auto req = py("print(1)");
    req.runtime_digest = "sha256:" + std::string(64, 'a');
    auto r = rt.run(req, t);
    CHECK(r.code == code::digest_mismatch);
    req.runtime_digest = fake_digest("python3");
    CHECK(rt.run(req, t).code == code::ok);
  }
  SECTION("digest_mismatch: the ticket's pin, whatever the request says") {
    auto spec = sandbox::ticket_spec{
        .id = "t-pin", .tenant = "acme", .runtime_digest = "sha256:" + std::string(64, 'a')};
    const auto rolled = sandbox::ticket_issuer{}.issue(spec).value();
    auto req = py("print(1)");
    auto r = rt.run(req, rolled);
    CHECK(r.code == code::digest_mismatch);
    CHECK(r.message == "ticket.runtime_digest: does not match the installed image of 'python3'");
    req.runtime_digest = fake_digest("python3");
    CHECK(rt.run(req, rolled).code == code::digest_mismatch);
    spec.runtime_digest = fake_digest("python3");
    const auto current = sandbox::ticket_issuer{}.issue(spec).value();
    req.runtime_digest = "sha256:" + std::string(64, 'a');
    CHECK(rt.run(req, current).code == code::digest_mismatch);
    req.runtime_digest = fake_digest("python3");
    r = rt.run(req, current);
    CHECK(r.code == code::ok);
    CHECK(r.runtime.digest == fake_digest("python3"));
  }
  SECTION("rejections carry a run id and nothing else") {
    auto req = py("print(1)");
    req.v = 7;
    auto r = rt.run(req, t);
    CHECK(sandbox::test::is_run_id(r.run_id));
    CHECK(r.std_out == sandbox::stream_capture{});
    CHECK(r.files_out.empty());
    CHECK_FALSE(r.exit_code.has_value());
  }
  // Nothing rejected reached the backend; the digest_mismatch sections' last runs did.
  for (const auto& a : fake->requests()) CHECK(a.request.runtime_digest == fake_digest("python3"));
}

TEST_CASE("runtime_unavailable when no backend serves the ticket's level", "[runtime]") {
  auto fake = std::make_shared<fake_backend>(sandbox::isolation::container);
  auto rt = make_fake_runtime(fake);
  // container serves process and container tickets ...
  CHECK(rt.run(py("1"), make_ticket("acme", sandbox::isolation::process)).code == code::ok);
  CHECK(rt.run(py("1"), make_ticket("acme", sandbox::isolation::container)).code == code::ok);
  // ... but never a stronger one.
  auto r = rt.run(py("1"), make_ticket("acme", sandbox::isolation::microvm));
  CHECK(r.code == code::runtime_unavailable);
  CHECK(fake->requests().size() == 2);
  CHECK(fake->requests()[0].isolation == sandbox::isolation::container);
}

TEST_CASE("blob_not_found: missing and other-tenant blobs answer identically", "[runtime]") {
  auto fake = std::make_shared<fake_backend>();
  auto rt = make_fake_runtime(fake);
  const std::string secret = "the other tenant's data";
  const std::string id = sandbox::blob_id_of(secret);

  auto req = py("print(open('in.txt').read())");
  req.files_in = {{.name = "in.txt", .blob = id}};
  auto missing = rt.run(req, make_ticket("acme"));
  REQUIRE(rt.blobs()->put("other", secret).has_value());
  auto foreign = rt.run(req, make_ticket("acme"));

  CHECK(missing.code == code::blob_not_found);
  CHECK(foreign.code == code::blob_not_found);
  CHECK(missing.message == foreign.message);
  CHECK(missing.message.find("files_in[0].blob") != std::string::npos);
  CHECK(missing.message == "files_in[0].blob: blob not found");
  missing.run_id.clear();
  foreign.run_id.clear();
  CHECK(missing == foreign);
  CHECK(fake->requests().empty());

  // The owner can use it.
  auto own = rt.run(req, make_ticket("other"));
  CHECK(own.code == code::ok);
  REQUIRE(fake->requests().size() == 1);
  CHECK(fake->requests()[0].tenant == "other");
  CHECK(fake->requests()[0].request.files_in == req.files_in);

  // Only the failing entry is named.
  auto ok_id = rt.blobs()->put("acme", "mine");
  REQUIRE(ok_id.has_value());
  req.files_in = {{.name = "a", .blob = *ok_id}, {.name = "b", .blob = id}};
  auto second = rt.run(req, make_ticket("acme"));
  CHECK(second.code == code::blob_not_found);
  CHECK(second.message.find("files_in[1].blob") != std::string::npos);
}

TEST_CASE("the runtime fills what it knows into the result", "[runtime]") {
  auto fake = std::make_shared<fake_backend>();
  // A backend that leaves everything empty.
  fake->otherwise().respond_with([](const sandbox::admitted&) { return scripted_run{}; });
  auto rt = make_fake_runtime(fake);
  auto req = py("print(1)");
  req.timeout = 60s;  // above the ticket's 8 s ceiling
  req.memory_limit_bytes = 4ULL << 30;
  auto r = rt.run(req, make_ticket("acme", sandbox::isolation::gvisor));
  CHECK(r.code == code::ok);
  CHECK(sandbox::test::is_run_id(r.run_id));
  CHECK(r.isolation == sandbox::isolation::microvm);
  CHECK(r.runtime == sandbox::runtime_info{"python3", fake_digest("python3")});
  CHECK(r.timeout == 8000ms);
  CHECK(r.timeout_clamped);
  CHECK(r.memory_limit_bytes == 512ULL << 20);
  CHECK(r.memory_clamped);
  CHECK(r.v == 1);
}

TEST_CASE("a backend error other than operation_aborted becomes internal", "[runtime]") {
  struct failing_backend : sandbox::backend {
    sandbox::isolation isolation() const noexcept override { return sandbox::isolation::process; }
    std::string_view name() const noexcept override { return "failing"; }
    void shutdown() noexcept override {}
    void do_execute(
        sandbox::run_job job,
        asio::any_completion_handler<void(boost::system::error_code, run_result)> h) override {
      asio::post(job.executor, [h = std::move(h)]() mutable {
        run_result r;
        r.code = code::ok;
        std::move(h)(asio::error::connection_refused, std::move(r));
      });
    }
  };
  auto rt = sandbox::runtime::create(fake_options());
  REQUIRE(rt.has_value());
  rt->add_backend(std::make_shared<failing_backend>());
  auto f = rt->async_run(py("1"), make_ticket(), asio::use_future);
  run_result got = f.get();  // would throw for a non-success error code
  CHECK(got.code == code::internal);
  CHECK(got.message == "internal error");
}

// --- completion styles ----------------------------------------------------------------------

TEST_CASE("callback on an external io_context", "[runtime]") {
  asio::io_context io;
  auto fake = std::make_shared<fake_backend>();
  fake->otherwise().respond_stdout("42\n");
  auto rt = sandbox::runtime::create(io.get_executor(), fake_options());
  REQUIRE(rt.has_value());
  rt->add_backend(fake);
  int calls = 0;
  bool returned = false;
  run_result got;
  rt->async_run(py("print(42)"), make_ticket(), [&](boost::system::error_code ec, run_result r) {
    CHECK_FALSE(ec);
    CHECK(returned);  // never inline
    ++calls;
    got = std::move(r);
  });
  returned = true;
  CHECK(calls == 0);
  io.run();
  CHECK(calls == 1);
  CHECK(got.code == code::ok);
  CHECK(got.std_out.summary == "42\n");
}

TEST_CASE("handlers run on their associated executor", "[runtime]") {
  asio::io_context other;
  auto fake = std::make_shared<fake_backend>();
  auto rt = make_fake_runtime(fake);
  std::promise<bool> on_other;
  rt.async_run(py("1"), make_ticket(),
               asio::bind_executor(other, [&](boost::system::error_code, run_result) {
                 on_other.set_value(other.get_executor().running_in_this_thread());
               }));
  // The runtime keeps work on `other` until the handler has run there, so run() does not
  // return early.
  other.run();
  auto f = on_other.get_future();
  REQUIRE(f.wait_for(0s) == std::future_status::ready);
  CHECK(f.get());
}

TEST_CASE("use_future", "[runtime]") {
  auto fake = std::make_shared<fake_backend>();
  fake->otherwise().respond_stdout("ok\n");
  auto rt = make_fake_runtime(fake);
  auto f = rt.async_run(py("print('ok')"), make_ticket(), asio::use_future);
  auto r = f.get();
  CHECK(r.code == code::ok);
  CHECK(r.std_out.summary == "ok\n");
}

TEST_CASE("use_awaitable", "[runtime]") {
  auto fake = std::make_shared<fake_backend>();
  fake->on_source_contains("a").respond_stdout("A\n");
  fake->otherwise().respond_stdout("B\n");

  SECTION("runtime with its own thread, coroutine on the caller's io_context") {
    auto rt = make_fake_runtime(fake);
    asio::io_context io;
    std::vector<std::string> out;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          auto r1 = co_await rt.async_run(py("a"), make_ticket(), asio::use_awaitable);
          out.push_back(r1.std_out.summary);
          auto r2 = co_await rt.async_run(py("b"), make_ticket(), asio::use_awaitable);
          out.push_back(r2.std_out.summary);
        },
        asio::detached);
    io.run();
    CHECK(out == std::vector<std::string>{"A\n", "B\n"});
  }
  SECTION("runtime on the coroutine's io_context") {
    asio::io_context io;
    auto rt = sandbox::runtime::create(io.get_executor(), fake_options());
    REQUIRE(rt.has_value());
    rt->add_backend(fake);
    std::string out;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          auto r = co_await rt->async_run(py("a"), make_ticket(), asio::use_awaitable);
          out = r.std_out.summary;
        },
        asio::detached);
    io.run();
    CHECK(out == "A\n");
  }
}

// --- cancellation ---------------------------------------------------------------------------

TEST_CASE("cancelling an in-flight run completes it with operation_aborted", "[runtime]") {
  auto fake = std::make_shared<fake_backend>();
  fake->otherwise().respond(scripted_run{.std_out = "never\n", .delay = forever});
  auto rt = make_fake_runtime(fake);
  asio::cancellation_signal cancel;
  std::promise<std::pair<boost::system::error_code, run_result>> done;
  std::atomic<int> calls{0};
  rt.async_run(
      py("while True: pass"), make_ticket(),
      asio::bind_cancellation_slot(cancel.slot(), [&](boost::system::error_code ec, run_result r) {
        ++calls;
        done.set_value({ec, std::move(r)});
      }));
  // Wait until the backend holds the run, then cancel it.
  REQUIRE(eventually([&] { return fake->requests().size() == 1; }));
  cancel.emit(asio::cancellation_type::terminal);
  auto f = done.get_future();
  REQUIRE(f.wait_for(60s) == std::future_status::ready);
  auto [ec, r] = f.get();
  CHECK(ec == asio::error::operation_aborted);
  CHECK(r.code == code::internal);
  CHECK(sandbox::test::is_run_id(r.run_id));
  CHECK(r.std_out.summary.empty());
  CHECK(calls == 1);
}

TEST_CASE("cancelling before the run starts never reaches the backend", "[runtime]") {
  asio::io_context io;
  auto fake = std::make_shared<fake_backend>();
  auto rt = sandbox::runtime::create(io.get_executor(), fake_options());
  REQUIRE(rt.has_value());
  rt->add_backend(fake);
  asio::cancellation_signal cancel;
  boost::system::error_code got;
  int calls = 0;
  rt->async_run(
      py("1"), make_ticket(),
      asio::bind_cancellation_slot(cancel.slot(), [&](boost::system::error_code ec, run_result) {
        ++calls;
        got = ec;
      }));
  cancel.emit(asio::cancellation_type::terminal);  // io not run yet: the run has not started
  io.run();
  CHECK(calls == 1);
  CHECK(got == asio::error::operation_aborted);
  CHECK(fake->requests().empty());
}

TEST_CASE("awaitable cancellation with an awaitable operator", "[runtime]") {
  using namespace asio::experimental::awaitable_operators;
  auto fake = std::make_shared<fake_backend>();
  fake->otherwise().respond(scripted_run{.delay = forever});
  auto rt = make_fake_runtime(fake);
  asio::io_context io;
  std::optional<std::size_t> which;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        asio::steady_timer timer(co_await asio::this_coro::executor, 20ms);
        auto v = co_await (rt.async_run(py("1"), make_ticket(), asio::use_awaitable) ||
                           timer.async_wait(asio::use_awaitable));
        which = v.index();
      },
      asio::detached);
  io.run();  // returns only once the cancelled run has completed
  REQUIRE(which.has_value());
  CHECK(*which == 1);  // the timer won; the run was cancelled
}

// --- destruction ----------------------------------------------------------------------------

TEST_CASE("destroying a runtime aborts its runs in flight", "[runtime]") {
  auto fake = std::make_shared<fake_backend>();
  fake->otherwise().respond(scripted_run{.delay = forever});

  SECTION("private thread, callback") {
    std::optional<sandbox::runtime> rt(make_fake_runtime(fake));
    std::atomic<int> calls{0};
    boost::system::error_code got;
    run_result result;
    rt->async_run(py("1"), make_ticket(), [&](boost::system::error_code ec, run_result r) {
      got = ec;
      result = std::move(r);
      ++calls;
    });
    REQUIRE(eventually([&] { return fake->requests().size() == 1; }));
    rt.reset();
    CHECK(calls == 1);  // run on the private thread before it was joined
    CHECK(got == asio::error::operation_aborted);
    CHECK(result.code == code::internal);
    CHECK(sandbox::test::is_run_id(result.run_id));
  }
  SECTION("private thread, use_future") {
    std::optional<sandbox::runtime> rt(make_fake_runtime(fake));
    auto f = rt->async_run(py("1"), make_ticket(), asio::use_future);
    REQUIRE(eventually([&] { return fake->requests().size() == 1; }));
    rt.reset();
    REQUIRE(f.wait_for(60s) == std::future_status::ready);
    try {
      f.get();
      FAIL("expected operation_aborted");
    } catch (const boost::system::system_error& e) {
      CHECK(e.code() == asio::error::operation_aborted);
    }
  }
  SECTION("external io_context keeps running") {
    io_thread t;
    std::optional<sandbox::runtime> rt(create_on(t.io.get_executor()));
    rt->add_backend(fake);
    std::promise<boost::system::error_code> done;
    rt->async_run(py("1"), make_ticket(),
                  [&](boost::system::error_code ec, run_result) { done.set_value(ec); });
    REQUIRE(eventually([&] { return fake->requests().size() == 1; }));
    rt.reset();
    auto f = done.get_future();
    REQUIRE(f.wait_for(60s) == std::future_status::ready);
    CHECK(f.get() == asio::error::operation_aborted);
    // Nothing of the run keeps the io_context busy any more.
    t.guard.reset();
    t.thread.join();
    CHECK(t.io.stopped());
  }
  SECTION("external io_context never run again") {
    auto io = std::make_unique<asio::io_context>();
    std::optional<sandbox::runtime> rt(create_on(io->get_executor()));
    rt->add_backend(fake);
    int calls = 0;
    rt->async_run(py("1"), make_ticket(), [&](boost::system::error_code, run_result) { ++calls; });
    io->poll();  // starts the run; the fake now holds it
    rt.reset();
    io.reset();  // the queued completion is destroyed, not called
    CHECK(calls == 0);
  }
  SECTION("external io_context destroyed first") {
    auto io = std::make_unique<asio::io_context>();
    std::optional<sandbox::runtime> rt(create_on(io->get_executor()));
    rt->add_backend(fake);
    int calls = 0;
    rt->async_run(py("1"), make_ticket(), [&](boost::system::error_code, run_result) { ++calls; });
    rt->async_run(py("2"), make_ticket(), [&](boost::system::error_code, run_result) { ++calls; });
    io->poll_one();  // one run is held by the fake, the other still queued
    io.reset();
    rt.reset();  // nothing to post to any more: must not crash
    CHECK(calls == 0);
  }
  SECTION("destroyed from one of its own handlers") {
    std::optional<sandbox::runtime> rt(make_fake_runtime(fake));
    auto quick = std::make_shared<fake_backend>(sandbox::isolation::process);
    rt->add_backend(quick);
    std::promise<boost::system::error_code> held_done;
    std::promise<void> destroyed;
    auto strong = make_ticket("acme", sandbox::isolation::microvm);
    auto weak = make_ticket("acme", sandbox::isolation::process);
    rt->async_run(py("held"), strong,
                  [&](boost::system::error_code ec, run_result) { held_done.set_value(ec); });
    REQUIRE(eventually([&] { return fake->requests().size() == 1; }));
    rt->async_run(py("quick"), weak, [&](boost::system::error_code, run_result) {
      rt.reset();  // on the runtime's own thread
      destroyed.set_value();
    });
    auto d = destroyed.get_future();
    REQUIRE(d.wait_for(60s) == std::future_status::ready);
    auto f = held_done.get_future();
    REQUIRE(f.wait_for(60s) == std::future_status::ready);
    CHECK(f.get() == asio::error::operation_aborted);
  }
}

TEST_CASE("a moved-from runtime answers without crashing", "[runtime]") {
  auto rt = make_fake_runtime(std::make_shared<fake_backend>());
  sandbox::runtime other(std::move(rt));
  CHECK(other.run(py("1"), make_ticket()).code == code::ok);
  // NOLINTBEGIN(bugprone-use-after-move): that is what is tested
  CHECK(rt.run(py("1"), make_ticket()).code == code::internal);
  CHECK(rt.blobs() == nullptr);
  CHECK(rt.backends().empty());
  auto f = rt.async_run(py("1"), make_ticket(), asio::use_future);
  CHECK_THROWS_AS(f.get(), boost::system::system_error);
  // NOLINTEND(bugprone-use-after-move)
}

TEST_CASE("run() on the runtime's own thread does not deadlock", "[runtime]") {
  auto fake = std::make_shared<fake_backend>();
  auto rt = make_fake_runtime(fake);
  std::promise<run_result> inner;
  auto t = make_ticket();
  rt.async_run(py("1"), t,
               [&](boost::system::error_code, run_result) { inner.set_value(rt.run(py("2"), t)); });
  auto f = inner.get_future();
  REQUIRE(f.wait_for(60s) == std::future_status::ready);
  CHECK(f.get().code == code::internal);
}

// --- spans ----------------------------------------------------------------------------------

TEST_CASE("one span per run with the documented attributes", "[runtime]") {
  auto sink = std::make_shared<sandbox::test::recording_sink>();
  auto fake = std::make_shared<fake_backend>();
  fake->otherwise().respond(
      scripted_run{.exit_code = 3,
                   .egress_attempts = {{.protocol = "dns", .host = "x"}},
                   .oom_kills = 2,
                   .usage = {.setup = 5ms, .wall = 7ms, .cpu = 6ms, .peak_memory_bytes = 1234}});
  auto rt = sandbox::runtime::create(fake_options(sink));
  REQUIRE(rt.has_value());
  rt->add_backend(fake);
  auto t = make_ticket("acme", sandbox::isolation::process);
  auto req = py("1");
  req.timeout = 1500ms;
  auto r = rt->run(req, t);
  REQUIRE(r.code == code::ok);
  auto rej = py("1");
  rej.v = 9;
  auto rr = rt->run(rej, t);
  REQUIRE(rr.code == code::invalid_request);

  auto spans = sink->spans();
  REQUIRE(spans.size() == 2);
  const auto& a = spans[0].attributes;
  using attr = std::variant<std::string, std::int64_t, bool>;
  CHECK(spans[0].name == "sandbox.run");
  CHECK(spans[0].start <= spans[0].end);
  CHECK(a.at("sandbox.run_id") == attr(r.run_id));
  CHECK(a.at("sandbox.tenant") == attr(std::string("acme")));
  CHECK(a.at("sandbox.ticket_id") == attr(std::string("t-acme")));
  CHECK(a.at("sandbox.isolation") == attr(std::string("microvm")));
  CHECK(a.at("sandbox.timeout") == attr(std::int64_t{1500}));
  CHECK(a.at("sandbox.runtime") == attr(std::string("python3")));
  CHECK(a.at("sandbox.runtime_digest") == attr(fake_digest("python3")));
  CHECK(a.at("error_code") == attr(std::string("ok")));
  CHECK(a.at("sandbox.exit_code") == attr(std::int64_t{3}));
  CHECK(a.at("sandbox.usage.setup_ms") == attr(std::int64_t{5}));
  CHECK(a.at("sandbox.usage.wall_ms") == attr(std::int64_t{7}));
  CHECK(a.at("sandbox.usage.cpu_ms") == attr(std::int64_t{6}));
  CHECK(a.at("sandbox.usage.peak_memory_bytes") == attr(std::int64_t{1234}));
  CHECK(a.at("sandbox.egress_attempts") == attr(std::int64_t{1}));
  CHECK(a.at("sandbox.oom_kills") == attr(std::int64_t{2}));

  const auto& b = spans[1].attributes;
  CHECK(b.at("sandbox.run_id") == attr(rr.run_id));
  CHECK(b.at("error_code") == attr(std::string("invalid_request")));
  CHECK(b.at("sandbox.isolation") == attr(std::string("process")));  // the ticket's minimum
  CHECK(b.count("sandbox.exit_code") == 0);
  CHECK(b.count("sandbox.oom_kills") == 1);
}

// --- concurrency ----------------------------------------------------------------------------

TEST_CASE("many runs from several threads", "[runtime]") {
  auto fake = std::make_shared<fake_backend>();
  fake->otherwise().respond_with(
      [](const sandbox::admitted& a) { return scripted_run{.std_out = a.request.source + "\n"}; });
  auto rt = make_fake_runtime(fake);
  constexpr int threads = 4;
  constexpr int per_thread = 25;
  std::mutex mu;
  std::set<std::string> ids;
  std::atomic<int> mismatches{0};
  std::atomic<int> async_done{0};
  std::vector<sandbox::ticket> tickets;
  for (int t = 0; t < threads; ++t) tickets.push_back(make_ticket("tenant" + std::to_string(t)));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        const std::string src = "run-" + std::to_string(t) + "-" + std::to_string(i);
        if (i % 2 == 0) {
          auto r = rt.run(py(src), tickets[t]);
          if (r.code != code::ok || r.std_out.summary != src + "\n") ++mismatches;
          std::lock_guard lk(mu);
          ids.insert(r.run_id);
        } else {
          rt.async_run(py(src), tickets[t], [&, src](boost::system::error_code ec, run_result r) {
            if (ec || r.code != code::ok || r.std_out.summary != src + "\n") {
              ++mismatches;
            }
            {
              std::lock_guard lk(mu);
              ids.insert(r.run_id);
            }
            ++async_done;
          });
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  REQUIRE(eventually([&] { return async_done == threads * (per_thread / 2); }));
  CHECK(mismatches == 0);
  CHECK(ids.size() == threads * per_thread);
  CHECK(fake->requests().size() == threads * per_thread);
}
