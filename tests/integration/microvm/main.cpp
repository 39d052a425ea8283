// Integration tests of the microvm level: real Python in a QEMU microvm guest. Exit code 77
// (skipped) when this host cannot run the level — unless CI=true or SANDBOX_MUST_WORK=1,
// where that is a failure.
#include <iostream>

#include "catch2_runner.hpp"
#include "integration/microvm/microvm_harness.hpp"

int main(int argc, char** argv) {
  if (mvtest::rt() == nullptr) {
    std::cerr << "microvm backend unavailable: " << mvtest::why() << "\n";
    if (mvtest::must_work()) {
      std::cerr << "CI=true / SANDBOX_MUST_WORK=1: failing instead of skipping\n";
      return 1;
    }
    return 77;
  }
  // The deadlines' calibration, on this host as it is now, before any test (printed).
  (void)mvtest::calibrate();
  return testrun::run_catch_session(argc, argv);
}
