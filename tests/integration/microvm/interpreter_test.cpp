// Interpreter sessions at the microvm level: the driver in its own VM, its commands carried
// as sandbox-init's control-stream frames, its frames streamed from the guest. One compact
// case (one interpreter start under emulation): the checks every level runs
// (tests/integration/common/interp_support.hpp), then no VM of it is left.
#include <catch2/catch.hpp>

#include "integration/common/interp_support.hpp"
#include "integration/microvm/microvm_harness.hpp"

TEST_CASE("microvm: an interpreter session keeps state, times out kept, loses it at exit()",
          "[microvm][interp]") {
  // Its own runtime: the interrupt grace is a hang bound here (a KeyboardInterrupt's
  // traceback and the answer's frames take seconds under emulation), as are the cells'
  // deadlines (`must_finish`, at least 60 s).
  mvtest::private_runtime own([](sandbox::runtime_options& o) {
    o.interpreters.interrupt_grace = mvtest::must_finish();
    o.sessions.idle_timeout =
        std::max<std::chrono::milliseconds>(std::chrono::minutes(2), mvtest::must_finish());
  });
  if (!own.available()) return;
  interptest::level_checks(*own.rt, interptest::ticket_at(sandbox::isolation::microvm, "mvtest"),
                           sandbox::isolation::microvm, mvtest::must_finish());
  CHECK(mvtest::vmm_pids(own.state()).empty());
}
