// The unit tests' main: Catch2's default one (its implementation is tests/catch2_runner.cpp).
#include "catch2_runner.hpp"

int main(int argc, char** argv) { return testrun::run_catch_session(argc, argv); }
