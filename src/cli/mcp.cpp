// `sandboxctl mcp`: an MCP server over stdio bound to one ticket (docs/mcp.md). This file
// parses the flags and loads the ticket; the server is the mcp room (src/mcp).
//
// Exit status: 0 after the client closed stdin (every run killed and confirmed gone), 1 when
// the runtime cannot start or the ticket is refused, 2 for usage errors.
#include <iostream>

#include "cli/cli_util.hpp"
#include "cli/verbs.hpp"
#include "mcp/server.hpp"
#include "mcp/stdio_transport.hpp"

namespace sandboxctl {

int cmd_mcp(const std::vector<std::string>& args) {
  common_flags c;
  auto d = common_options(c);
  d.add_options()("ticket", po::value(&c.ticket_path),
                  "ticket JSON file (or signed ticket document) every call runs under; its "
                  "tenant owns the files (required: the MCP client never sends one)")(
      "trusted-keys", po::value(&c.trusted_keys),
      "Ed25519 public key file or directory of <kid>.pub.pem: --ticket must be a signed "
      "ticket that verifies against them (repeatable)");
  po::positional_options_description pos;
  parse(args, d, pos);
  if (c.ticket_path.empty()) {
    throw usage_error("mcp: --ticket FILE is required (the server is bound to one ticket)");
  }
  auto opts = options_from(c);
  auto ticket = load_ticket(c.ticket_path, c.trusted_keys);
  if (!ticket) {
    std::cerr << "sandboxctl: mcp: " << to_string(ticket.error().code) << ": "
              << ticket.error().message << "\n";
    return exit_fail;
  }
  return sandbox::mcp::serve({.runtime = std::move(opts), .ticket = std::move(*ticket)},
                             [](const sandbox::mcp::server_context& context) {
                               return sandbox::mcp::make_stdio_transport(context);
                             });
}

}  // namespace sandboxctl
