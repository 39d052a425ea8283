// Catch2's implementation (its test runner, reporters and assertion machinery), compiled once
// for every test program (sandbox_test_runner, tests/CMakeLists.txt) instead of once in each
// program's main.cpp: about 15 s of g++ each (Catch2 2.x, docs/slow-compiles.md).
#define CATCH_CONFIG_RUNNER
#include "catch2_runner.hpp"

#include <catch2/catch.hpp>

int testrun::run_catch_session(int argc, char** argv) { return Catch::Session().run(argc, argv); }
