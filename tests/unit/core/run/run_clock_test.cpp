// The run's clock (core/run/run_clock.hpp): each timer calls its hook once it expired, never
// once cancelled; the exit grace is armed once per run; every pending wait holds the owner.
#include "core/run/run_clock.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace {

namespace sd = sandbox::detail;
namespace asio = boost::asio;
using namespace std::chrono_literals;

struct clock_fixture {
  asio::io_context io;
  std::shared_ptr<int> owner = std::make_shared<int>(0);
  std::vector<std::string> calls;
  sd::run_clock clock{asio::make_strand(io.get_executor()), 5ms};

  clock_fixture() {
    clock.bind(owner, {.setup_expired = [this] { calls.push_back("setup"); },
                       .deadline = [this] { calls.push_back("deadline"); },
                       .grace_over = [this] { calls.push_back("grace"); }});
  }
};

}  // namespace

TEST_CASE("run clock: the setup budget expires unless the program started", "[run_clock]") {
  clock_fixture f;
  CHECK(f.clock.setup_budget() == 5ms);
  SECTION("expired") {
    f.clock.arm_setup();
    CHECK(f.owner.use_count() == 2);  // the pending wait holds the run
    f.io.run();
    CHECK(f.calls == std::vector<std::string>{"setup"});
    CHECK(f.owner.use_count() == 1);
  }
  SECTION("started: the deadline runs instead") {
    f.clock.arm_setup();
    f.clock.start_deadline(1ms);
    f.io.run();
    CHECK(f.calls == std::vector<std::string>{"deadline"});
  }
}

TEST_CASE("run clock: the exit grace is armed once per run", "[run_clock]") {
  clock_fixture f;
  f.clock.arm_grace_once(1ms);
  f.io.run();
  f.io.restart();
  f.clock.arm_grace_once(1ms);  // a second exit grace: none
  f.io.run();
  CHECK(f.calls == std::vector<std::string>{"grace"});
}

TEST_CASE("run clock: cancelled timers call nothing and let the run go", "[run_clock]") {
  clock_fixture f;
  SECTION("cancel_all") {
    f.clock.arm_setup();
    f.clock.start_deadline(1h);
    f.clock.arm_grace_once(1h);
    f.clock.cancel_all();
  }
  SECTION("stop_run_timers") {
    f.clock.start_deadline(1h);
    f.clock.arm_grace_once(1h);
    f.clock.stop_run_timers();
  }
  f.io.run();
  CHECK(f.calls.empty());
  CHECK(f.owner.use_count() == 1);
}

TEST_CASE("run clock: nothing is armed once the owner is gone", "[run_clock]") {
  clock_fixture f;
  f.owner.reset();
  f.clock.arm_setup();
  f.io.run();
  CHECK(f.calls.empty());
}
