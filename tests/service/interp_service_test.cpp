// Interpreter sessions through `sandboxctl serve` (docs/protocol.md, "Interpreters over the
// daemon"): state kept across two cells, and an interpreter belongs to the connection that
// opened it (another connection naming its id gets the unknown-id error).
#include <catch2/catch.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "service_harness.hpp"

using nlohmann::json;
using namespace std::chrono_literals;

namespace {

std::string line(const json& j) { return j.dump() + "\n"; }

json interp_ticket() {
  json t = svctest::ticket("interpsvc");
  t["max_timeout_ms"] = 120000;
  return t;
}

}  // namespace

TEST_CASE("an interpreter through the daemon keeps state; other connections cannot use it",
          "[service][interp]") {
  svctest::daemon d;
  svctest::client c(d.socket());
  c.send(line(
      {{"id", "open"}, {"interp_open", {{"ticket", interp_ticket()}, {"runtime", "python3"}}}}));
  const json opened = c.answer();
  INFO(opened.dump() << "\ndaemon log:\n" << d.log());
  REQUIRE(opened["id"] == "open");
  REQUIRE(opened.contains("interpreter"));
  const std::string sid = opened["interpreter"];

  c.send(line(
      {{"id", "c1"}, {"interp_execute", {{"session", sid}, {"code", "x = 41\nprint('hi')"}}}}));
  const json r1 = c.answer();
  INFO(r1.dump());
  REQUIRE(r1["id"] == "c1");
  CHECK(r1["cell_result"]["code"] == "ok");
  CHECK(r1["cell_result"]["state"] == "kept");
  CHECK(r1["cell_result"]["stdout"]["summary"] == "hi\n");

  c.send(line({{"id", "c2"},
               {"interp_execute", {{"session", sid}, {"code", "x + 1"}, {"timeout_ms", 20000}}}}));
  const json r2 = c.answer();
  INFO(r2.dump());
  REQUIRE(r2["id"] == "c2");
  CHECK(r2["cell_result"]["code"] == "ok");
  CHECK(r2["cell_result"]["value"] == "42");
  CHECK(r2["cell_result"]["session_ended"] == false);
  // Usage from the host's evidence, on the line.
  CHECK(r2["cell_result"]["cpu_ms"].is_number_integer());
  CHECK(r2["cell_result"]["peak_memory_bytes"].get<std::uint64_t>() > 0);

  // files_in: a malformed entry is the line's error; a blob the tenant lacks is the cell's.
  c.send(line(
      {{"id", "f1"},
       {"interp_execute", {{"session", sid}, {"code", "1"}, {"files_in", {{{"name", "a"}}}}}}}));
  const json f1 = c.answer();
  INFO(f1.dump());
  CHECK(f1["error"]["code"] == "invalid_request");
  CHECK(f1["error"]["message"] == "interp_execute.files_in[0].blob: required field is missing");
  c.send(line({{"id", "f2"},
               {"interp_execute",
                {{"session", sid},
                 {"code", "1"},
                 {"files_in", {{{"name", "a"}, {"blob", "sha256:" + std::string(64, 'b')}}}}}}}));
  const json f2 = c.answer();
  INFO(f2.dump());
  CHECK(f2["cell_result"]["code"] == "blob_not_found");
  CHECK(f2["cell_result"]["state"] == "kept");

  // Strict decoding: an unknown field is refused.
  c.send(line({{"id", "bad"}, {"interp_execute", {{"session", sid}, {"code", "1"}, {"x", 1}}}}));
  const json bad = c.answer();
  CHECK(bad["error"]["code"] == "invalid_request");

  // Another connection: the same error as an unknown id, for execute and close.
  {
    svctest::client other(d.socket());
    other.send(line({{"id", "o1"}, {"interp_execute", {{"session", sid}, {"code", "x"}}}}));
    const json o1 = other.answer();
    INFO(o1.dump());
    CHECK(o1["error"]["code"] == "session_not_found");
    other.send(line({{"id", "o2"}, {"interp_close", {{"session", sid}}}}));
    CHECK(other.answer()["error"]["code"] == "session_not_found");
    other.send(line({{"id", "o3"}, {"interp_execute", {{"session", "nope"}, {"code", "x"}}}}));
    CHECK(other.answer()["error"]["code"] == "session_not_found");
  }

  // Still the first connection's, state intact.
  c.send(line({{"id", "c3"}, {"interp_execute", {{"session", sid}, {"code", "x"}}}}));
  CHECK(c.answer()["cell_result"]["value"] == "41");

  c.send(line({{"id", "close"}, {"interp_close", {{"session", sid}}}}));
  const json closed = c.answer();
  INFO(closed.dump());
  REQUIRE(closed.contains("session_result"));
  c.send(line({{"id", "after"}, {"interp_execute", {{"session", sid}, {"code", "x"}}}}));
  CHECK(c.answer()["error"]["code"] == "session_not_found");
}
