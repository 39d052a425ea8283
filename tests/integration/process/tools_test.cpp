// Registered tools and workload profiles in real process-level sandboxes, with the "tools"
// image (Debian: cmark, pcre2-utils; built by tools/setup.sh): a Markdown renderer and a regex
// engine fed model bytes on stdin, byte-exact stdin, a hostile tool input, the request codes,
// and profiles that really change pids.max and /dev/shm inside.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>

#include "integration/harness.hpp"

using sandbox::code;
using sandbox::isolation;
using sandbox::tool_entry;
using namespace std::chrono_literals;
using namespace std::string_literals;

namespace {

/// A runtime of this file's own: the registry below, and two profiles.
struct tool_host {
  std::string state;
  std::optional<sandbox::runtime> rt;
  std::string skip;  ///< why it could not be made (no tools image); empty when made

  tool_host() {
    auto opts = itest::private_runtime_options(&state);
    opts.policy.profiles["big"] = {
        .max_pids = 200, .shm_bytes = 100ULL << 20, .memory_limit_bytes = 1ULL << 30};
    opts.policy.profiles["over"] = {.max_pids = 100000, .memory_limit_bytes = 1ULL << 30};
    opts.policy.ceilings.max_pids = 150;
    opts.tools = {
        {.name = "markdown", .image = "tools", .binary = "/usr/bin/cmark"},
        // The pattern is the host's (catastrophic on purpose); the model gives only the text.
        {.name = "regex",
         .image = "tools",
         .binary = "/usr/bin/pcre2grep",
         .args = {"--match-limit=4000000000", "^(a|aa)+$"}},
        {.name = "cat", .image = "tools", .binary = "/bin/cat"},
        // A tool whose engine the input fully steers: the worst a tool input can be.
        {.name = "sh", .image = "tools", .binary = "/bin/sh", .args = {"-s"}},
        {.name = "sh-big", .image = "tools", .binary = "/bin/sh", .args = {"-s"}, .profile = "big"},
    };
    // The sink outlives this constructor (the runtime logs from its own thread for as long
    // as it lives): it owns what it collects, and collects only until creation is over.
    struct collected {
      std::mutex mu;
      std::vector<std::string> lines;
      bool open = true;
    };
    auto log = std::make_shared<collected>();
    opts.log = [log](sandbox::log_level, std::string_view l) {
      std::lock_guard lock(log->mu);
      if (log->open) log->lines.emplace_back(l);
    };
    auto made = sandbox::runtime::create(opts);
    std::vector<std::string> lines;
    {
      std::lock_guard lock(log->mu);
      log->open = false;
      lines = std::move(log->lines);
    }
    if (!made) {
      for (const auto& l : lines) skip += l + "\n";
      if (skip.empty()) skip = made.error().message();
      return;
    }
    rt.emplace(std::move(*made));
  }
  ~tool_host() {
    rt.reset();
    std::filesystem::remove_all(state);
  }
  /// Null (after failing or warning) when the tools image is absent and that is allowed.
  sandbox::runtime* get() {
    if (rt) return &*rt;
    if (itest::must_work()) FAIL("no tools runtime (tools/setup.sh builds the image): " << skip);
    WARN("skipped: no tools runtime (sandboxctl image build tools ...): " << skip);
    return nullptr;
  }
};

sandbox::ticket tool_ticket(std::vector<std::string> tools = {"*"}, std::string profile = {}) {
  return sandbox::ticket_issuer{}
      .issue({.id = "itest-tools",
              .tenant = "itest",
              .execute = true,
              .max_timeout = 8000ms,
              .max_memory_bytes = 1ULL << 30,
              .tools = std::move(tools),
              .profile = std::move(profile)})
      .value();
}

std::string out(const sandbox::run_result& r, sandbox::runtime& rt) {
  if (r.std_out.blob.empty()) return {};
  return rt.blobs()->get("itest", r.std_out.blob).value();
}

}  // namespace

TEST_CASE("tools: a registered Markdown renderer renders model Markdown from stdin", "[tools]") {
  tool_host h;
  auto* rt = h.get();
  if (rt == nullptr) return;
  auto before = itest::snapshot();
  auto r = rt->run({.tool = "markdown", .std_in = "# Title\n\n*em* and <script>x</script>\n"},
                   tool_ticket({"markdown"}));
  INFO(r.message << r.std_err.summary);
  REQUIRE(r.code == code::ok);
  CHECK(r.exit_code == 0);
  CHECK(r.std_out.summary.find("<h1>Title</h1>") != std::string::npos);
  CHECK(r.std_out.summary.find("<em>em</em>") != std::string::npos);
  // cmark's default (safe) mode drops raw HTML.
  CHECK(r.std_out.summary.find("<script>") == std::string::npos);
  CHECK(r.runtime.name == "markdown");
  CHECK(r.runtime.digest == rt->catalog().tools.at("markdown").digest);
  CHECK(r.backend == "process");
  CHECK(r.isolation == isolation::process);
  itest::check_host_unchanged(before);
}

TEST_CASE("tools: catastrophic backtracking in a regex engine ends in timeout", "[tools]") {
  tool_host h;
  auto* rt = h.get();
  if (rt == nullptr) return;
  auto before = itest::snapshot();
  auto r = rt->run({.timeout = 1000ms, .tool = "regex", .std_in = std::string(64, 'a') + "b\n"},
                   tool_ticket({"regex"}));
  INFO(r.message << r.std_err.summary);
  CHECK(r.code == code::timeout);
  CHECK(r.signal == 9);
  CHECK(r.timeout == 1000ms);
  // The same engine on a benign line answers normally (exit 0: it matched).
  auto ok = rt->run({.tool = "regex", .std_in = "aaaa\n"}, tool_ticket({"regex"}));
  CHECK(ok.code == code::ok);
  CHECK(ok.exit_code == 0);
  CHECK(ok.std_out.summary == "aaaa\n");
  itest::check_host_unchanged(before);
}

TEST_CASE("tools: stdin arrives byte for byte (NUL, invalid UTF-8), then EOF; else /dev/null",
          "[tools]") {
  tool_host h;
  auto* rt = h.get();
  if (rt == nullptr) return;
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<char>(i));
  bytes += "\xff\xfe\xc3\x28 end\0"s;
  const auto id = rt->blobs()->put("itest", bytes).value();
  auto r = rt->run({.tool = "cat", .stdin_blob = id}, tool_ticket({"cat"}));
  INFO(r.message);
  REQUIRE(r.code == code::ok);
  CHECK(r.std_out.bytes == bytes.size());
  CHECK(out(r, *rt) == bytes);
  // Text stdin (a JSON string: NUL is allowed escaped).
  auto t = rt->run({.tool = "cat", .std_in = "h\xc3\xa9llo\0x"s}, tool_ticket({"cat"}));
  REQUIRE(t.code == code::ok);
  CHECK(out(t, *rt) == "h\xc3\xa9llo\0x"s);
  // No stdin: /dev/null, so cat ends at once with nothing.
  auto n = rt->run({.tool = "cat"}, tool_ticket({"cat"}));
  REQUIRE(n.code == code::ok);
  CHECK(n.std_out.total_bytes == 0);
  // Standard input is read-only.
  auto w = rt->run({.tool = "sh", .std_in = "echo x >&0 && echo wrote || echo refused\n"},
                   tool_ticket({"sh"}));
  REQUIRE(w.code == code::ok);
  CHECK(w.std_out.summary == "refused\n");
}

TEST_CASE("tools: a hostile tool input cannot read host files or reach the host", "[tools]") {
  tool_host h;
  auto* rt = h.get();
  if (rt == nullptr) return;
  // A secret the host holds, at a path the input names outright.
  std::mt19937_64 rng{std::random_device{}()};
  const std::string secret = "host-secret-" + std::to_string(rng());
  char tmpl[] = "/tmp/sandbox-itest-secret-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  std::ofstream(dir + "/secret") << secret;
  ::chmod(dir.c_str(), 0755);
  const std::string script = "cat " + dir + "/secret; cat /proc/1/root" + dir + "/secret; ls " +
                             dir + "; cat /proc/1/environ; grep -r " + secret +
                             " /tmp /proc/1/cwd 2>/dev/null;"
                             " echo uid=$(id -u); echo done\n";
  auto before = itest::snapshot();
  auto r = rt->run({.tool = "sh", .std_in = script}, tool_ticket({"sh"}));
  const std::string all = out(r, *rt) + r.std_err.summary;
  std::filesystem::remove_all(dir);
  INFO(all);
  REQUIRE(r.code == code::ok);
  CHECK(all.find(secret) == std::string::npos);
  CHECK(all.find("done") != std::string::npos);
  CHECK(all.find("uid=0") == std::string::npos);
  itest::check_host_unchanged(before);
}

TEST_CASE("tools: request faults get their codes before anything starts", "[tools][codes]") {
  tool_host h;
  auto* rt = h.get();
  if (rt == nullptr) return;
  auto r1 = rt->run({.tool = "nope"}, tool_ticket());
  CHECK(r1.code == code::invalid_request);
  CHECK(r1.message == "tool: no registered tool named 'nope'");
  auto r2 = rt->run({.runtime = "python3", .source = "print(1)", .tool = "cat"}, tool_ticket());
  CHECK(r2.code == code::invalid_request);
  CHECK(r2.message.rfind("runtime: ", 0) == 0);
  auto r3 = rt->run({.tool = "cat", .std_in = std::string((1 << 20) + 1, 'x')}, tool_ticket());
  CHECK(r3.code == code::invalid_request);
  CHECK(r3.message.rfind("stdin: 1048577 bytes, over the limit", 0) == 0);
  auto r4 = rt->run({.tool = "sh", .std_in = "id"}, tool_ticket({"markdown"}));
  CHECK(r4.code == code::action_denied);
  CHECK(r4.message == "tool: ticket does not grant tool.run for 'sh'");
  auto r5 = rt->run({.tool = "cat"}, itest::ticket());  // a code ticket grants no tool
  CHECK(r5.code == code::action_denied);
  for (const auto* r : {&r1, &r2, &r3, &r4, &r5}) CHECK(r->backend.empty());
}

TEST_CASE("profiles: a profile raising pids lets more processes start than the default",
          "[tools][profiles]") {
  tool_host h;
  auto* rt = h.get();
  if (rt == nullptr) return;
  // Forks children that wait, until `n` run or a fork fails; prints how many started.
  auto forks = [](int n) {
    return "import os, time\n"
           "n = 0\n"
           "for _ in range(" +
           std::to_string(n) +
           "):\n"
           "    try:\n"
           "        pid = os.fork()\n"
           "    except OSError:\n"
           "        break\n"
           "    if pid == 0:\n"
           "        time.sleep(30)\n"
           "        os._exit(0)\n"
           "    n += 1\n"
           "print(n)\n";
  };
  auto before = itest::snapshot();
  // 120 forks take seconds on an emulated CPU (the cgroup v2 test bed): the calibrated
  // deadline (clamped to the ticket's 8 s), not the request's default 2 s.
  const auto deadline = itest::default_deadline();
  auto plain =
      rt->run({.runtime = "python3", .source = forks(120), .timeout = deadline}, tool_ticket());
  auto big = rt->run({.runtime = "python3", .source = forks(120), .timeout = deadline},
                     tool_ticket({"*"}, "big"));
  INFO(plain.std_out.summary << " / " << big.std_out.summary << big.std_err.summary);
  REQUIRE(plain.code == code::ok);
  REQUIRE(big.code == code::ok);
  CHECK(std::stoi(plain.std_out.summary) < 64);  // the policy's max_pids (64), python counts
  CHECK(std::stoi(big.std_out.summary) == 120);  // the profile's 200
  // A profile above its ceiling is clamped to it: 150 pids in all, not 100000.
  auto over = rt->run({.runtime = "python3", .source = forks(200), .timeout = deadline},
                      tool_ticket({"*"}, "over"));
  INFO(over.std_out.summary << over.std_err.summary);
  REQUIRE(over.code == code::ok);
  CHECK(std::stoi(over.std_out.summary) > 120);
  CHECK(std::stoi(over.std_out.summary) < 150);
  itest::check_host_unchanged(before);
}

TEST_CASE("profiles: a tool's profile sizes /dev/shm inside", "[tools][profiles]") {
  tool_host h;
  auto* rt = h.get();
  if (rt == nullptr) return;
  const std::string df = "df -k /dev/shm | tail -n 1\n";
  auto plain = rt->run({.tool = "sh", .std_in = df}, tool_ticket({"sh"}));
  auto big = rt->run({.tool = "sh-big", .std_in = df}, tool_ticket({"sh-big"}));
  INFO(plain.std_out.summary << " / " << big.std_out.summary << big.std_err.summary);
  REQUIRE(plain.code == code::ok);
  REQUIRE(big.code == code::ok);
  // df -k: "tmpfs <size in KiB> ...". Default 16 MiB; the profile's 100 MiB (its memory
  // limit of 1 GiB lets /dev/shm have up to an eighth of it).
  CHECK(plain.std_out.summary.find(" 16384 ") != std::string::npos);
  CHECK(big.std_out.summary.find(" 102400 ") != std::string::npos);
  CHECK(big.memory_limit_bytes == 1ULL << 30);
}
