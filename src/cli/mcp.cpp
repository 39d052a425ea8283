// `sandboxctl mcp`: an MCP server bound to one ticket (docs/mcp.md), over stdio, or over
// Streamable HTTP on a loopback TCP port (`--http`) or a unix socket (`--http-socket`). This
// file parses the flags and loads the ticket; the server is the mcp room (src/mcp).
//
// Exit status: 0 after the client closed stdin or a signal ended the server (every run killed
// and confirmed gone), 1 when the runtime cannot start, the ticket is refused or the address
// cannot be bound, 2 for usage errors (a non-loopback --http address among them).
#include <sys/un.h>

#include <filesystem>
#include <iostream>

#include "cli/cli_util.hpp"
#include "cli/verbs.hpp"
#include "mcp/http_transport.hpp"
#include "mcp/server.hpp"
#include "mcp/stdio_transport.hpp"

namespace sandboxctl {

int cmd_mcp(const std::vector<std::string>& args) {
  common_flags c;
  std::string http;
  std::string http_socket;
  auto d = common_options(c);
  d.add_options()("ticket", po::value(&c.ticket_path),
                  "ticket JSON file (or signed ticket document) every call runs under; its "
                  "tenant owns the files (required: the MCP client never sends one)")(
      "trusted-keys", po::value(&c.trusted_keys),
      "Ed25519 public key file or directory of <kid>.pub.pem: --ticket must be a signed "
      "ticket that verifies against them (repeatable)")(
      "http", po::value(&http),
      "serve Streamable HTTP on this loopback address instead of stdio: 127.0.0.1:PORT or "
      "[::1]:PORT (port 0: any free port; the bound address is printed on stderr)")(
      "http-socket", po::value(&http_socket),
      "serve Streamable HTTP on this unix socket (mode 0660) instead of stdio");
  po::positional_options_description pos;
  parse(args, d, pos);
  if (c.ticket_path.empty()) {
    throw usage_error("mcp: --ticket FILE is required (the server is bound to one ticket)");
  }
  if (!http.empty() && !http_socket.empty()) {
    throw usage_error("mcp: give --http or --http-socket, not both");
  }
  std::optional<sandbox::mcp::http_options> http_options;
  if (!http.empty()) {
    auto address = sandbox::mcp::parse_loopback_address(http);
    if (auto* why = std::get_if<std::string>(&address)) {
      throw usage_error("mcp: --http " + http + ": " + *why);
    }
    http_options.emplace();
    http_options->tcp = std::get<boost::asio::ip::tcp::endpoint>(address);
  } else if (!http_socket.empty()) {
    const auto path = std::filesystem::absolute(http_socket).string();
    if (path.size() >= sizeof(sockaddr_un::sun_path)) {
      throw usage_error("mcp: --http-socket: the path is longer than a unix socket allows");
    }
    http_options.emplace();
    http_options->socket_path = path;
  }
  auto opts = options_from(c);
  auto ticket = load_ticket(c.ticket_path, c.trusted_keys);
  if (!ticket) {
    std::cerr << "sandboxctl: mcp: " << to_string(ticket.error().code) << ": "
              << ticket.error().message << "\n";
    return exit_fail;
  }
  return sandbox::mcp::serve({.runtime = std::move(opts), .ticket = std::move(*ticket)},
                             [&](const sandbox::mcp::server_context& context) {
                               return http_options ? sandbox::mcp::make_http_transport(
                                                         context, *http_options)
                                                   : sandbox::mcp::make_stdio_transport(context);
                             });
}

}  // namespace sandboxctl
