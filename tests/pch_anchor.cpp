// Nothing but the test programs' precompiled header (tests/CMakeLists.txt,
// sandbox_test_runner): a target builds its PCH only for a file that uses it.
