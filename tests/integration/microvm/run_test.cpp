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

TEST_CASE("microvm: an input file reaches the guest read-only", "[microvm]") {
  auto id = mvtest::put("payload-bytes");
  sandbox::run_request base;
  base.files_in = {{.name = "data.txt", .blob = id}};
  auto r = mvtest::run(
      "import os\n"
      "p = os.path.join(os.environ['SANDBOX_INPUT_DIR'], 'data.txt')\n"
      "print(open(p).read())\n"
      "try:\n"
      "    open(p, 'w')\n"
      "    print('writable')\n"
      "except OSError as e:\n"
      "    print('refused', e.errno)\n",
      base);
  REQUIRE(r.code == code::ok);
  CHECK(r.exit_code == 0);
  CHECK(r.std_out.summary.find("payload-bytes\n") == 0);
  CHECK(r.std_out.summary.find("refused") != std::string::npos);
}

TEST_CASE("microvm: a busy loop ends as timeout; the VMM is dead and the cgroup gone",
          "[microvm]") {
  const int vmms_before = mvtest::vmm_processes();
  sandbox::run_request base;
  // Python's start-up, then a second of spinning before the deadline ends it.
  base.timeout = mvtest::deadline(std::chrono::seconds(1));
  auto r = mvtest::run("print('spinning', flush=True)\nwhile True:\n    pass\n", base);
  CHECK(r.code == code::timeout);
  CHECK(r.signal == SIGKILL);
  CHECK(r.std_out.summary == "spinning\n");
  // Every process of the run was confirmed dead before the result: no VMM is left, and the
  // run's cgroup is gone.
  CHECK(vmms_before == 0);
  CHECK(mvtest::vmm_processes() == 0);
  CHECK(mvtest::run_cgroups().empty());
}

TEST_CASE("microvm: a memory hog ends as oom (the guest cgroup's limit)", "[microvm]") {
  sandbox::run_request base;
  base.memory_limit_bytes = 64ULL << 20;
  base.timeout = mvtest::must_finish();
  // More than the guest's RAM (limit + overhead): the guest overcommits like a host, so the
  // run cgroup's limit ends it, not an allocation failure.
  auto r = mvtest::run("b = bytearray(400 << 20)\nprint('survived')", base);
  CHECK(r.code == code::oom);
  CHECK(r.std_out.summary.find("survived") == std::string::npos);
  CHECK(r.oom_kills >= 1);
  CHECK(r.signal == SIGKILL);
  CHECK(mvtest::run_cgroups().empty());
}

TEST_CASE("microvm: a program reaches its own memory limit even beside a large input",
          "[microvm]") {
  // The guest workspace (the inputs) lives in guest RAM outside the program's cgroup; the
  // guest has room for a full workspace besides the limit, so the program, not the guest
  // kernel's OOM killer on a squeezed guest, decides where it ends: at the limit.
  sandbox::run_request base;
  base.memory_limit_bytes = 128ULL << 20;
  base.timeout = mvtest::must_finish();
  base.files_in = {{.name = "big.bin", .blob = mvtest::put(std::string(60ULL << 20, 'i'))}};
  auto r = mvtest::run(
      "import os\n"
      "print('input', os.path.getsize(os.environ['SANDBOX_INPUT_DIR'] + '/big.bin'), flush=True)\n"
      "b = []\n"
      "while True: b.append(bytearray(8 << 20))\n",
      base);
  CHECK(r.code == code::oom);
  CHECK(r.std_out.summary.find("input 62914560") == 0);
  // The guest cgroup's peak is the limit itself (memory.max), never an earlier kill.
  CHECK(r.usage.peak_memory_bytes >= (120ULL << 20));
  CHECK(r.oom_kills >= 1);
}

TEST_CASE("microvm: usage CPU is the program's, not the guest's set-up", "[microvm]") {
  // sandbox-init's set-up inside the guest (namespaces, mounts; emulated under TCG: seconds)
  // runs in the run cgroup before the program starts; the reported CPU starts at the
  // program's start. With one vCPU it cannot exceed the program's wall time (a small margin
  // for the guest and host clocks reading `started` at slightly different moments).
  sandbox::run_request base;
  base.timeout = mvtest::must_finish();
  auto r = mvtest::run("import time\ntime.sleep(1)\nprint('ok')", base);
  REQUIRE(r.code == code::ok);
  INFO("cpu_ms=" << r.usage.cpu.count() << " wall_ms=" << r.usage.wall.count());
  CHECK(r.usage.cpu.count() <= r.usage.wall.count() + 250);
}

TEST_CASE("microvm: the guest cannot see a host file", "[microvm]") {
  // A marker on the host, at a path the snippet names: the guest's file system is the image
  // disk and its own tmpfs mounts, nothing of the host.
  const std::string marker = "/tmp/mvtest-host-marker-" + std::to_string(::getpid());
  { std::ofstream(marker) << "host secret"; }
  auto r = mvtest::run(
      "import os\n"
      "for p in ['" +
      marker + "', '/proc/1/root" + marker +
      "']:\n"
      "    try:\n"
      "        print('read', open(p).read())\n"
      "    except OSError as e:\n"
      "        print('absent', e.errno)\n");
  std::filesystem::remove(marker);
  REQUIRE(r.code == code::ok);
  CHECK(r.std_out.summary.find("host secret") == std::string::npos);
  CHECK(r.std_out.summary.find("read") == std::string::npos);
  CHECK(r.std_out.summary.find("absent") != std::string::npos);
}

TEST_CASE("microvm: an output symlink is not followed; only regular files come back", "[microvm]") {
  auto r = mvtest::run(
      "import os\n"
      "out = os.environ['SANDBOX_OUTPUT_DIR']\n"
      "os.symlink('/etc/passwd', out + '/passwd-link')\n"
      "os.symlink('/proc/self/environ', out + '/environ-link')\n"
      "os.mkdir(out + '/subdir')\n"
      "open(out + '/subdir/nested.txt', 'w').write('nested')\n"
      "open(out + '/plain.txt', 'w').write('plain')\n");
  REQUIRE(r.code == code::ok);
  REQUIRE(r.files_out.size() == 1);
  CHECK(r.files_out[0].name == "plain.txt");
  CHECK(mvtest::blob(r.files_out[0].blob) == "plain");
}

TEST_CASE("microvm: output caps hold (count and bytes)", "[microvm]") {
  sandbox::run_request base;
  base.files_out = {.max_files = 2, .max_bytes = 1000};
  auto r = mvtest::run(
      "import os\n"
      "out = os.environ['SANDBOX_OUTPUT_DIR']\n"
      "for i in range(5):\n"
      "    open(f'{out}/f{i}.txt', 'w').write('x' * 300)\n"
      "open(out + '/big.txt', 'w').write('y' * 5000)\n",
      base);
  REQUIRE(r.code == code::ok);
  CHECK(r.files_out.size() <= 2);
  std::uint64_t total = 0;
  for (const auto& f : r.files_out) total += mvtest::blob(f.blob).size();
  CHECK(total <= 1000);
}

TEST_CASE("microvm: a run ended by the deadline or the exit grace still returns its outputs",
          "[microvm]") {
  SECTION("deadline") {
    sandbox::run_request base;
    base.timeout = mvtest::deadline(std::chrono::seconds(1));
    auto r = mvtest::run(
        "import os, time\n"
        "open(os.environ['SANDBOX_OUTPUT_DIR'] + '/partial.txt', 'w').write('before')\n"
        "while True:\n"
        "    time.sleep(1)\n",
        base);
    CHECK(r.code == code::timeout);
    REQUIRE(r.files_out.size() == 1);
    CHECK(mvtest::blob(r.files_out[0].blob) == "before");
    CHECK(r.usage.peak_memory_bytes > 0);  // the guest's report came too
  }
  SECTION("exit grace: a daemonized grandchild outlives the main process") {
    auto r = mvtest::run(
        "import os, sys, time\n"
        "out = os.environ['SANDBOX_OUTPUT_DIR']\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "open(out + '/main.txt', 'w').write('main')\n"
        "print('main done', flush=True)\n");
    CHECK(r.code == code::ok);
    CHECK(r.exit_code == 0);
    CHECK(r.std_out.summary == "main done\n");
    REQUIRE(r.files_out.size() == 1);
    CHECK(mvtest::blob(r.files_out[0].blob) == "main");
    CHECK(mvtest::vmm_processes() == 0);
  }
}
