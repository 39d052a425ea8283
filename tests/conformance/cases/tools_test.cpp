// Registered tools (sandbox/registry.hpp) at every level: a tool runs its host-fixed program on
// model bytes given on stdin, in the same sandbox as code (the host's canaries stay unread, a
// runaway engine ends at our deadline), stdin arrives byte for byte, and a workload profile
// really changes the sandbox (/dev/shm size, pids).
#include <catch2/catch.hpp>

#include "conformance/suite.hpp"

using sandbox::code;
using namespace std::chrono_literals;
using namespace std::string_literals;

namespace {

sandbox::ticket tool_ticket(const conformance::backend& b) {
  return sandbox::ticket_issuer{}
      .issue({.id = "conformance-tools",
              .tenant = "conformance",
              .execute = false,
              .isolation = b.profile().level,
              .max_timeout = 8000ms,
              .max_memory_bytes = 1ULL << 30,
              .tools = {"*"}})
      .value();
}

sandbox::run_result run_tool(conformance::backend& b, sandbox::run_request req) {
  auto r = b.rt().run(std::move(req), tool_ticket(b));
  UNSCOPED_INFO("result: code=" << to_string(r.code) << " message=" << r.message << "\nstdout: "
                                << r.std_out.summary << "\nstderr: " << r.std_err.summary);
  return r;
}

}  // namespace

TEST_CASE("tools: a registered renderer turns model Markdown from stdin into HTML",
          "[tools][core]") {
  CONFORMANCE_BACKEND(b);
  auto r = run_tool(b, {.tool = "markdown", .std_in = "# T\n\n*x*\n"});
  REQUIRE(r.code == code::ok);
  CHECK(r.exit_code == 0);
  CHECK(r.std_out.summary == "<h1>T</h1>\n<p><em>x</em></p>\n");
  CHECK(r.runtime.name == "markdown");
  CHECK(r.isolation == b.profile().level);
}

TEST_CASE("tools: stdin is byte-exact, read-only, then EOF", "[tools][core]") {
  CONFORMANCE_BACKEND(b);
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<char>(i));
  bytes += "\xc3\x28\xff\0tail"s;
  auto r = run_tool(b, {.tool = "cat", .stdin_blob = b.put(bytes)});
  REQUIRE(r.code == code::ok);
  CHECK(b.blob(r.std_out.blob) == bytes);
  auto w = run_tool(b, {.tool = "sh", .std_in = "echo x >&0 && echo wrote || echo refused\n"});
  REQUIRE(w.code == code::ok);
  CHECK(w.std_out.summary == "refused\n");
}

TEST_CASE("tools: a runaway regex engine ends at our deadline", "[tools][core]") {
  CONFORMANCE_BACKEND(b);
  auto r =
      run_tool(b, {.timeout = 1500ms, .tool = "regex", .std_in = std::string(64, 'a') + "b\n"});
  CHECK(r.code == code::timeout);
  CHECK(r.timeout == 1500ms);
}

TEST_CASE("tools: a hostile tool input reads no host canary", "[tools][core]") {
  CONFORMANCE_BACKEND(b);
  std::string script;
  for (const auto& f : conformance::canary_files()) {
    script += "cat '" + f.string() + "' 2>&1; cat '/proc/1/root" + f.string() + "' 2>&1;\n";
  }
  script += "grep -rs '" + conformance::canary_secret() +
            "' /proc/1/environ /tmp /home 2>&1;"
            " cat /proc/self/environ | tr '\\0' '\\n'; echo done\n";
  auto r = run_tool(b, {.tool = "sh", .std_in = script});
  REQUIRE(r.code == code::ok);
  const std::string all = b.blob(r.std_out.blob) + r.std_err.summary;
  CHECK(all.find(conformance::canary_secret()) == std::string::npos);
  CHECK(all.find("done") != std::string::npos);
}

TEST_CASE("tools: a workload profile sizes /dev/shm inside", "[tools][profiles][core]") {
  CONFORMANCE_BACKEND(b);
  const std::string df = "df -k /dev/shm | tail -n 1\n";
  auto plain = run_tool(b, {.tool = "sh", .std_in = df});
  auto big = run_tool(b, {.tool = "sh-big", .std_in = df});
  REQUIRE(plain.code == code::ok);
  REQUIRE(big.code == code::ok);
  CHECK(plain.std_out.summary.find(" 16384 ") != std::string::npos);  // the policy's 16 MiB
  CHECK(big.std_out.summary.find(" 98304 ") != std::string::npos);    // the profile's 96 MiB
  CHECK(big.memory_limit_bytes == 1ULL << 30);
}
