// Host tools run by the stores (gzip, tar, debootstrap): no shell, no inherited environment
// or descriptors, stdin from /dev/null, and a timeout that kills the whole process group.
#include "sys/tool_process.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "sandbox/error.hpp"
#include "unit/store/store_test_util.hpp"

namespace {

using namespace std::chrono_literals;
using sandbox::detail::run_tool;
using store_test::temp_dir;

// True when `pid` is gone or a zombie (killed, not yet reaped by its new parent).
bool is_dead(pid_t pid) {
  std::string stat = store_test::read_file("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return true;
  auto close_paren = stat.rfind(')');
  return close_paren != std::string::npos && close_paren + 2 < stat.size() &&
         (stat[close_paren + 2] == 'Z' || stat[close_paren + 2] == 'X');
}

}  // namespace

TEST_CASE("tool process: argv environment cwd stdin and descriptors", "[tool_process]") {
  // Only the environment we pass; "/" as working directory; words are never split by a shell.
  auto r = run_tool({"/bin/sh", "-c", "echo \"[$HOME][$FOO][$1]\"; pwd", "sh", "a b; echo no"},
                    {"PATH=/usr/bin:/bin", "FOO=bar"}, 10s);
  REQUIRE(r.has_value());
  CHECK(r->ok());
  CHECK(r->output == "[][bar][a b; echo no]\n/\n");

  auto in = run_tool({"/bin/cat"}, sandbox::detail::minimal_tool_env(), 10s);
  REQUIRE(in.has_value());
  CHECK(in->ok());
  CHECK(in->output.empty());  // stdin is /dev/null: cat ends at once

  // A descriptor opened without O_CLOEXEC (as another thread might) does not leak.
  int leak = ::open("/dev/null", O_RDONLY);
  REQUIRE(leak >= 0);
  REQUIRE(::dup2(leak, 77) == 77);
  ::close(leak);
  auto fds = run_tool({"/bin/ls", "/proc/self/fd"}, sandbox::detail::minimal_tool_env(), 10s);
  ::close(77);
  REQUIRE(fds.has_value());
  CHECK(fds->output.find("77") == std::string::npos);

  auto status = run_tool({"/bin/sh", "-c", "echo failing >&2; exit 3"}, {}, 10s);
  REQUIRE(status.has_value());
  CHECK_FALSE(status->ok());
  CHECK(status->describe() == "exit status 3");
  CHECK(status->output == "failing\n");

  CHECK(run_tool({"/nonexistent/tool"}, {}, 10s).error().value() == ENOENT);
  CHECK(run_tool({"relative"}, {}, 10s).error().value() == EINVAL);
}

TEST_CASE("tool process: a timeout kills the tool and what it started", "[tool_process]") {
  temp_dir tmp;
  const auto pid_file = tmp / "bg.pid";
  const auto t0 = std::chrono::steady_clock::now();
  auto r =
      run_tool({"/bin/sh", "-c", "sleep 100 & echo $! > \"$1\"; wait", "sh", pid_file.string()},
               sandbox::detail::minimal_tool_env(), 300ms);
  CHECK(std::chrono::steady_clock::now() - t0 < 30s);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().value() == ETIMEDOUT);
  const pid_t bg = std::stoi(store_test::read_file(pid_file));
  for (int i = 0; i < 100 && !is_dead(bg); ++i) std::this_thread::sleep_for(20ms);
  CHECK(is_dead(bg));
}

TEST_CASE("tool process: output lines reach the sink while the tool runs, in order",
          "[tool_process]") {
  // The first line must arrive before the tool ends: the tool waits until the sink saw it
  // (the sink creates the file the tool polls for), so a sink fed only at exit times out.
  temp_dir tmp;
  const auto seen = tmp / "seen";
  std::vector<std::string> lines;
  auto r = run_tool(
      {"/bin/sh", "-c",
       "printf 'first\\r\\n'; i=0; while [ ! -e \"$1\" ] && [ $i -lt 200 ]; do sleep 0.05; "
       "i=$((i+1)); done; [ -e \"$1\" ] || exit 9; echo second >&2; printf 'no newline'",
       "sh", seen.string()},
      sandbox::detail::minimal_tool_env(), 30s, -1, 64 * 1024, [&](std::string_view line) {
        lines.emplace_back(line);
        if (line == "first") store_test::write_file(seen, "");
      });
  REQUIRE(r.has_value());
  CHECK(r->ok());
  CHECK(lines == std::vector<std::string>{"first", "second", "no newline"});
  CHECK(r->output == "first\r\nsecond\nno newline");
}

TEST_CASE("tool process: long lines are cut and a throwing sink does not fail the tool",
          "[tool_process]") {
  std::vector<std::size_t> sizes;
  auto r = run_tool({"/bin/sh", "-c", "head -c 10000 /dev/zero | tr '\\0' x; echo; echo ok"},
                    sandbox::detail::minimal_tool_env(), 30s, -1, 64 * 1024,
                    [&](std::string_view line) { sizes.push_back(line.size()); });
  REQUIRE(r.has_value());
  CHECK(sizes == std::vector<std::size_t>{4096, 2});

  int calls = 0;
  auto t = run_tool({"/bin/sh", "-c", "echo a; echo b; exit 4"},
                    sandbox::detail::minimal_tool_env(), 30s, -1, 64 * 1024, [&](std::string_view) {
                      ++calls;
                      throw std::runtime_error("display failed");
                    });
  REQUIRE(t.has_value());
  CHECK(t->describe() == "exit status 4");
  CHECK(t->output == "a\nb\n");
  CHECK(calls == 1);
}
