// The microvm level end to end: a real Python snippet in a QEMU microvm guest, with the same
// run_result contract as every other level.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "integration/microvm/microvm_harness.hpp"

using sandbox::code;

TEST_CASE("microvm: a Python run returns stdout, exit code and an output file", "[microvm]") {
  auto r = mvtest::run(
      "import os, sys\n"
      "print('hello from the guest')\n"
      "print('err line', file=sys.stderr)\n"
      "open(os.environ['SANDBOX_OUTPUT_DIR'] + '/result.txt', 'w').write('42')\n"
      "sys.exit(3)\n");
  REQUIRE(r.code == code::ok);
  CHECK(r.exit_code == 3);
  CHECK(r.isolation == sandbox::isolation::microvm);
  CHECK(r.std_out.summary == "hello from the guest\n");
  CHECK(r.std_err.summary == "err line\n");
  REQUIRE(r.files_out.size() == 1);
  CHECK(r.files_out[0].name == "result.txt");
  CHECK(mvtest::blob(r.files_out[0].blob) == "42");
  CHECK(r.usage.cpu.count() >= 0);
  CHECK(r.usage.peak_memory_bytes > 0);
}
