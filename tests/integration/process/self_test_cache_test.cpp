// The start-up self-test's verdict, kept for the boot (core/run/self_test_cache.hpp), through
// the real runtime at the process level: a second runtime on the same state directory
// reuses the first one's pass; a changed key, a tampered record, `probe_backends` and
// `reuse_self_test_verdict = false` all test again; and a runtime that reused a pass still
// runs real sandboxes.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "integration/harness.hpp"

using sandbox::code;
namespace fs = std::filesystem;

namespace {

/// The process level's self-test lines a runtime made with `o` logged while it was created.
std::vector<std::string> self_test_lines(sandbox::runtime_options o, bool probe = false) {
  auto lines = std::make_shared<std::vector<std::string>>();
  auto mu = std::make_shared<std::mutex>();
  o.log = [lines, mu](sandbox::log_level, std::string_view line) {
    if (line.rfind("process self-test", 0) != 0) return;
    std::lock_guard g(*mu);
    lines->emplace_back(line);
  };
  if (probe) {
    auto statuses = sandbox::probe_backends(o);
    REQUIRE_FALSE(statuses.empty());
    CHECK(statuses[0].registered);
  } else {
    auto rt = sandbox::runtime::create(o);
    REQUIRE(rt.has_value());
    // A runtime that reused the verdict runs real sandboxes all the same.
    const auto deadline = itest::default_deadline();
    auto r = rt->run(
        {.runtime = "python3", .source = "import os; print(os.getuid() != 0)", .timeout = deadline},
        itest::ticket("itest", std::max(deadline, std::chrono::milliseconds(8000))));
    CHECK(r.code == code::ok);
    CHECK(r.std_out.summary == "True\n");
  }
  std::lock_guard g(*mu);
  return *lines;
}

bool one_line_saying(const std::vector<std::string>& lines, const std::string& part) {
  return lines.size() == 1 && lines[0].find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("self-test cache: a pass is kept for the boot, re-tested when anything changes",
          "[selftest]") {
  std::string root;
  auto o = itest::private_runtime_options(&root);
  struct cleanup {
    std::string root;
    ~cleanup() {
      std::error_code ec;
      fs::remove_all(root, ec);
    }
  } c{root};
  const fs::path record = fs::path(o.state_dir) / "selftest" / "process.json";

  auto first = self_test_lines(o);
  INFO("first: " << (first.empty() ? "" : first[0]));
  CHECK(one_line_saying(first, "running it (no record)"));
  REQUIRE(fs::exists(record));

  auto second = self_test_lines(o);
  INFO("second: " << (second.empty() ? "" : second[0]));
  CHECK(one_line_saying(second, "passed on this boot at"));
  CHECK(one_line_saying(second, "not repeated"));

  SECTION("another option the run machine uses") {
    o.process.uid_base += 4096;
    CHECK(one_line_saying(self_test_lines(o), "running it (options changed (options))"));
    // ... and that pass is the record now.
    CHECK(one_line_saying(self_test_lines(o), "not repeated"));
  }
  SECTION("a record writable by others") {
    ::chmod(record.c_str(), 0646);
    CHECK(one_line_saying(self_test_lines(o), "record not trusted"));
    // Re-tested and recorded afresh, with the right mode.
    struct stat st {};
    REQUIRE(::stat(record.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    CHECK(one_line_saying(self_test_lines(o), "not repeated"));
  }
  SECTION("a record that claims a pass of another boot") {
    std::ifstream in(record);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    const auto at = text.find("\"boot_id\": \"");
    REQUIRE(at != std::string::npos);
    text[at + 12] = text[at + 12] == 'a' ? 'b' : 'a';
    std::ofstream(record, std::ios::trunc) << text;
    CHECK(one_line_saying(self_test_lines(o), "the host rebooted since (boot_id)"));
  }
  SECTION("a probe (sandboxctl doctor) always tests") {
    CHECK(one_line_saying(self_test_lines(o, /*probe=*/true),
                          "running it (recorded passes not consulted)"));
    CHECK(one_line_saying(self_test_lines(o), "not repeated"));
  }
  SECTION("reuse turned off") {
    o.reuse_self_test_verdict = false;
    CHECK(one_line_saying(self_test_lines(o), "running it (recorded passes not consulted)"));
  }
}
