// Interpreter sessions at the container level (crun) and the gvisor level (runsc, where the
// driver's commands reach it through sandbox-init's control stream): the checks every level
// runs (tests/integration/common/interp_support.hpp), and a cell that takes the driver's
// channel. Each case checks that nothing of it is left on the host.
#include <unistd.h>

#include <optional>

#include "integration/common/interp_support.hpp"
#include "integration/common/session_support.hpp"
#include "integration/harness.hpp"

namespace {

struct interp_oci_fixture {
  std::string state_root;
  std::optional<sandbox::runtime> rt;
  std::string why;
};

// A runtime of its own with both OCI levels; the interrupt grace is a hang bound.
interp_oci_fixture& oci_fixture() {
  static interp_oci_fixture f = [] {
    interp_oci_fixture s;
    auto opts = itest::private_runtime_options(&s.state_root);
    opts.container.enabled = true;
    opts.gvisor.enabled = true;
    opts.interpreters.interrupt_grace = std::chrono::milliseconds(20000);
    auto made = sandbox::runtime::create(opts);
    if (!made) {
      s.why = made.error().message();
    } else {
      s.rt.emplace(std::move(*made));
      sessiontest::settle_fds();  // the container self-test's `crun delete`
    }
    return s;
  }();
  return f;
}

// The level is registered; otherwise FAILs as root under CI, else WARNs (skipped).
bool has(sandbox::isolation level) {
  auto& f = oci_fixture();
  if (f.rt) {
    for (const auto& b : f.rt->backends()) {
      if (b.isolation == level && b.registered) return true;
    }
  }
  const std::string what = std::string(to_string(level)) + " level unavailable " + f.why;
  if (itest::must_work() && ::geteuid() == 0) FAIL(what);
  WARN(what << ": skipped");
  return false;
}

void run_checks(sandbox::isolation level) {
  auto& f = oci_fixture();
  const auto before = itest::snapshot();
  interptest::level_checks(*f.rt, interptest::ticket_at(level, "itest"), level,
                           std::chrono::milliseconds(60000));
  interptest::channel_taken_checks(*f.rt, interptest::ticket_at(level, "itest"),
                                   std::chrono::milliseconds(60000));
  sessiontest::settle_fds();
  itest::check_host_unchanged(before);
}

}  // namespace

TEST_CASE("interpreter: state, values, files, timeout, exit, a taken channel (container, crun)",
          "[interp][container]") {
  if (!has(sandbox::isolation::container)) return;
  run_checks(sandbox::isolation::container);
}

TEST_CASE("interpreter: state, values, files, timeout, exit, a taken channel (gvisor)",
          "[interp][gvisor]") {
  if (!has(sandbox::isolation::gvisor)) return;
  run_checks(sandbox::isolation::gvisor);
}
