// sandboxctl's verbs: one handler per verb, each in its own file (src/cli/<verb>.cpp), named
// in main.cpp's table. Each takes the arguments after the verb and returns the exit status
// (cli_util.hpp: 0 success, 1 failure, 2 usage); a `usage_error` it throws is printed by
// `main` with a pointer to `--help` (exit 2), any other exception as a failure (exit 1).
#pragma once

#include <string>
#include <vector>

namespace sandboxctl {

/// `run`: a protocol request, a script or a registered tool (run.cpp).
int cmd_run(const std::vector<std::string>& args);
/// `blob put|get|rm|ls|pin|unpin|gc`: the blob store (blob.cpp).
int cmd_blob(const std::vector<std::string>& args);
/// `image build|import|ls|current|use|verify|rm`: the image store (image.cpp).
int cmd_image(const std::vector<std::string>& args);
/// `doctor`: which backends work on this host, and why not (doctor.cpp).
int cmd_doctor(const std::vector<std::string>& args);
/// `audit`: prove one level's guarantees on this host (audit.cpp).
int cmd_audit(const std::vector<std::string>& args);
/// `tools`: the registered tools (tools.cpp).
int cmd_tools(const std::vector<std::string>& args);
/// `ticket keygen|sign|verify|derive`: signed tickets (ticket.cpp).
int cmd_ticket(const std::vector<std::string>& args);
/// `receipt verify`: execution receipts (receipt.cpp).
int cmd_receipt(const std::vector<std::string>& args);
/// `serve`: the service-mode daemon (serve.cpp; the daemon is src/service).
int cmd_serve(const std::vector<std::string>& args);
/// `interp`: one interpreter session fed cells from stdin (interp.cpp).
int cmd_interp(const std::vector<std::string>& args);
/// `mcp`: an MCP server over stdio bound to one ticket (mcp.cpp; the server is src/mcp).
int cmd_mcp(const std::vector<std::string>& args);

}  // namespace sandboxctl
