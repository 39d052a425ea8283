// Catch2's session for the test programs' own main(): Catch2 2.x declares Catch::Session only
// in the file that compiles its implementation, which is compiled once (catch2_runner.cpp,
// the sandbox_test_runner library in tests/CMakeLists.txt) instead of in every main.cpp.
#pragma once

namespace testrun {

/// Runs the test cases that argv selects, as Catch::Session().run(argc, argv) does, and
/// returns its exit status (the number of failed assertions, capped at 255).
int run_catch_session(int argc, char** argv);

}  // namespace testrun
