// The levels table (src/backends/levels.hpp): one row per isolation level in its order, what
// enables each, and `try_level`'s refusals (a level not built into this library, a binary
// that is missing, an unknown OCI runtime), which the runtime's registration and
// `probe_backends` report as they are.
#include "backends/levels.hpp"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

namespace {

using sandbox::isolation;
using sandbox::detail::builtin_level;
using sandbox::detail::builtin_levels;
using sandbox::detail::level_options;
using sandbox::detail::try_level;

const builtin_level& row(isolation l) { return builtin_levels()[static_cast<std::size_t>(l)]; }

level_options quiet_options() {
  level_options o;
  o.context.state_dir =
      std::filesystem::temp_directory_path() / ("levels-test-" + std::to_string(::getpid()));
  o.context.log = [](sandbox::log_level, std::string_view) {};
  return o;
}

}  // namespace

TEST_CASE("the levels table names every level once, weakest first", "[levels]") {
  const auto levels = builtin_levels();
  REQUIRE(levels.size() == sandbox::isolation_names.size());
  for (std::size_t i = 0; i < levels.size(); ++i) {
    INFO(levels[i].name);
    CHECK(static_cast<std::size_t>(levels[i].isolation) == i);
    CHECK(levels[i].name == sandbox::to_string(levels[i].isolation));
    CHECK(levels[i].build_option.starts_with("SANDBOX_BACKEND_"));
    CHECK(levels[i].enabled_by.starts_with("runtime_options::"));
    CHECK(levels[i].enabled != nullptr);
    CHECK(levels[i].backend_name != nullptr);
    CHECK(levels[i].make != nullptr);
  }
  CHECK(row(isolation::container).build_option == row(isolation::gvisor).build_option);
}

TEST_CASE("the levels table: what enables each level, and its status name", "[levels]") {
  level_options o;
  // Only the process level is on unless the host says otherwise.
  for (const auto& l : builtin_levels()) {
    INFO(l.name);
    CHECK(l.enabled(o) == l.on_by_default);
  }
  CHECK(row(isolation::process).on_by_default);

  o.process = false;
  o.container.enabled = true;
  o.container.runtime = "runc";
  o.gvisor.enabled = true;
  o.gvisor.runtime = "runsc";
  o.microvm.enabled = true;
  CHECK_FALSE(row(isolation::process).enabled(o));
  CHECK(row(isolation::container).enabled(o));
  CHECK(row(isolation::gvisor).enabled(o));
  CHECK(row(isolation::microvm).enabled(o));
  CHECK(row(isolation::process).backend_name(o) == "process");
  CHECK(row(isolation::container).backend_name(o) == "runc");
  CHECK(row(isolation::gvisor).backend_name(o) == "runsc");
  CHECK(row(isolation::microvm).backend_name(o) == "microvm");

  const auto off = sandbox::detail::disabled_status(row(isolation::process), o);
  CHECK(off.isolation == isolation::process);
  CHECK(off.name == "process");
  CHECK_FALSE(off.registered);
  CHECK(off.reason == "disabled (runtime_options::process_backend is false)");
}

TEST_CASE("try_level refuses with the reason, before any self-test", "[levels]") {
  auto o = quiet_options();
  const auto& container = row(isolation::container);
  const auto& gvisor = row(isolation::gvisor);

  SECTION("a missing runtime binary") {
    o.container.enabled = true;
    o.container.runtime = "runc";
    o.container.path = "/nonexistent/runc";
    auto a = try_level(container, o);
    CHECK(a.status.isolation == isolation::container);
    CHECK(a.status.name == "runc");
    CHECK_FALSE(a.status.registered);
    CHECK(a.made == nullptr);
    if (container.built) {
      CHECK(a.status.reason.starts_with("runc not found at /nonexistent/runc"));
    } else {
      CHECK(a.status.reason == "not built into this library (SANDBOX_BACKEND_OCI=OFF)");
    }
  }
  SECTION("an unknown OCI runtime") {
    o.gvisor.enabled = true;
    o.gvisor.runtime = "docker";
    auto a = try_level(gvisor, o);
    CHECK(a.status.isolation == isolation::gvisor);
    CHECK(a.status.name == "docker");
    CHECK_FALSE(a.status.registered);
    if (gvisor.built) {
      CHECK(a.status.reason == "unknown OCI runtime 'docker' (crun, runc or runsc)");
    } else {
      CHECK(a.status.reason == "not built into this library (SANDBOX_BACKEND_OCI=OFF)");
    }
  }
  SECTION("a level not built into this library says so") {
    for (const auto& l : builtin_levels()) {
      if (l.built) continue;
      INFO(l.name);
      auto a = try_level(l, o);
      CHECK_FALSE(a.status.registered);
      CHECK(a.status.reason ==
            "not built into this library (" + std::string(l.build_option) + "=OFF)");
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(o.context.state_dir, ec);
}
