// Sessions (sandbox/session.hpp) at the container level (crun) and the gvisor level (runsc,
// where the server's stdin travels through sandbox-init's control stream under a credit
// window): the process level's checks (tests/integration/process/session_test.cpp) on the
// same servers. Each case checks that nothing of it is left on the host.
#include "integration/common/session_support.hpp"

using namespace sessiontest;

bool sessiontest::fixture_enables_oci_levels() { return true; }

TEST_CASE("session: the fixture runtime exists (OCI levels)", "[session]") {
  INFO(fixture().why);
  REQUIRE(fixture().rt.has_value());
}

TEST_CASE("session: MCP initialize and tools/list over stdio (container, crun)",
          "[session][mcp][container]") {
  if (!has_container()) return;
  mcp_initialize_and_list("mcp-everything-container");
  settle_fds();
}

TEST_CASE("session: MCP initialize and tools/list over stdio (gvisor)", "[session][mcp][gvisor]") {
  if (!has_gvisor()) return;
  mcp_initialize_and_list("mcp-everything-gvisor");
  settle_fds();
}

TEST_CASE("session: stdio is byte-exact both ways (container, crun)", "[session][container]") {
  if (!has_container()) return;
  byte_exact_echo("cat-container");
  settle_fds();
}

TEST_CASE("session: stdio is byte-exact both ways (gvisor)", "[session][gvisor]") {
  if (!has_gvisor()) return;
  byte_exact_echo("cat-gvisor");
  settle_fds();
}

TEST_CASE("session: a server that does not read makes writes wait (gvisor)", "[session][gvisor]") {
  if (!has_gvisor()) return;
  unread_stdin_waits("sleeper-gvisor");
  settle_fds();
}

TEST_CASE("session: close_stdin is EOF for the server, after every byte (container, crun)",
          "[session][container]") {
  if (!has_container()) return;
  stdin_close_is_eof("eof-reporter-container");
  settle_fds();
}

TEST_CASE("session: close_stdin is EOF for the server, after every byte (gvisor)",
          "[session][gvisor]") {
  if (!has_gvisor()) return;
  stdin_close_is_eof("eof-reporter-gvisor");
  settle_fds();
}

TEST_CASE("session: a server that closes its stdin makes writes fail with broken_pipe (gvisor)",
          "[session][gvisor]") {
  if (!has_gvisor()) return;
  closed_stdin_breaks_writes("stdin-closer-gvisor");
  settle_fds();
}
