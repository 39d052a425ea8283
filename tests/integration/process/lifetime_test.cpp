// The run's lifetime: when the main process exits, descendants get a short grace, then
// everything is killed; nothing of a run outlives its result; a crashed host's runs die with
// it and their remains are reclaimed at the next start.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <thread>

#include "integration/harness.hpp"

using sandbox::code;
using namespace std::chrono_literals;

TEST_CASE("lifetime: a daemon left behind by the main process is killed at the end", "[lifetime]") {
  auto before = itest::snapshot();
  auto r = itest::run(itest::helper_source("daemonize.py") + "\nprint('main done')");
  CHECK(r.code == code::ok);
  CHECK(r.std_out.summary == "main done\n");
  itest::check_host_unchanged(before);
}

TEST_CASE("lifetime: a grandchild holding stdout cannot hold the run past the grace",
          "[lifetime]") {
  auto before = itest::snapshot();
  auto r = itest::run(R"PY(
import os, sys, time
if os.fork() == 0:
    while True:
        sys.stdout.write('.'); sys.stdout.flush(); time.sleep(0.01)
print('main exits', flush=True)
)PY",
                      {.timeout = itest::default_deadline()});
  // Ended by the exit grace after the main process: `ok`, where a grandchild that held the
  // run would have run into the deadline (`timeout`; calibrated, so a loaded host's slow
  // start-up does not decide it).
  CHECK(r.code == code::ok);
  CHECK(r.exit_code == 0);
  CHECK(r.std_out.summary.find("main exits") != std::string::npos);
  itest::check_host_unchanged(before);
}

TEST_CASE("lifetime: thousands of orphans are reaped under a low pids limit", "[lifetime]") {
  auto r = itest::run(R"PY(
import os
fails = 0
for i in range(2000):
    try:
        pid = os.fork()
    except OSError:
        fails += 1; continue
    if pid == 0:
        if os.fork() == 0: os._exit(0)   # the grandchild becomes an orphan of PID 1
        os._exit(0)
    os.waitpid(pid, 0)
print('fails', fails)
)PY",
                      // Generous: the property is that every orphan is reaped, not how fast
                      // 4,000 forks are on this host (over 8 s beside other test tiers).
                      {.timeout = 60000ms});
  CHECK(r.code == code::ok);
  CHECK(r.std_out.summary == "fails 0\n");
}

TEST_CASE(
    "lifetime: a deadline passing inside the exit grace cannot turn an exit into a "
    "timeout",
    "[lifetime]") {
  // The main process exits 0 at once; its child holds stdout. With a grace longer than the
  // run's timeout, the deadline passes while the child is being waited for: the run still
  // ends as its main process did (the child is killed, not blamed on the program).
  std::string state;
  auto opts = itest::private_runtime_options(&state);
  opts.policy.exit_grace = 3000ms;
  auto rt = sandbox::runtime::create(opts);
  REQUIRE(rt.has_value());
  auto r = rt->run({.runtime = "python3",
                    .source = "import os, time\n"
                              "if os.fork() == 0:\n"
                              "    time.sleep(60)\n"
                              "print('main exits', flush=True)\n",
                    .timeout = 1000ms + itest::startup_allowance()},
                   itest::ticket());
  CHECK(r.code == code::ok);
  CHECK(r.exit_code == 0);
  CHECK(r.std_out.summary == "main exits\n");
  // A main process still running at the deadline is a timeout, as ever.
  auto t =
      rt->run({.runtime = "python3", .source = "import time\ntime.sleep(60)\n", .timeout = 500ms},
              itest::ticket());
  CHECK(t.code == code::timeout);
  std::filesystem::remove_all(state);
}
