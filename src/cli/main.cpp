// sandboxctl: the command-line front end of agent-sandbox. This file is the dispatch: one
// static table naming every verb and its handler (crun's model), each handler in its own
// file (verbs.hpp); what the verbs share is cli_util.hpp.
//
// The CLI trusts its caller: it reads tickets from files the local operator controls (see
// docs/protocol.md). Exit status of `run`: 0 when the result's code is `ok`, 1 for any other
// code, 2 for usage errors (bad options, unreadable files). Other commands: 0 success, 1
// failure, 2 usage.
#include <array>
#include <exception>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "cli/cli_util.hpp"
#include "cli/verbs.hpp"

namespace {

using sandboxctl::exit_fail;
using sandboxctl::exit_ok;
using sandboxctl::exit_usage;

/// `sandboxctl --help`.
constexpr const char* top_usage =
    "usage: sandboxctl <command> [options]\n"
    "\n"
    "commands:\n"
    "  run --request REQ.json --ticket TICKET.json   run a protocol request; prints the result "
    "JSON\n"
    "  run --ticket T.json [--file NAME=PATH]... [--timeout-ms N] [--runtime R]\n"
    "      [--memory-bytes N] [--env NAME=VALUE --allow-env NAME]... [--out-dir DIR]\n"
    "      [--force] [--json] SCRIPT\n"
    "                                                run a script file ('-' = stdin); the\n"
    "                                                runtime follows the extension (.py, .js)\n"
    "                                                unless --runtime is given. Output files go\n"
    "                                                to --out-dir (never over an existing\n"
    "                                                entry unless --force; links never followed)\n"
    "  run --ticket T.json --tool NAME [--stdin-file F] [--file NAME=PATH]... [--json]\n"
    "                                                run a registered tool (--config's tools);\n"
    "                                                F ('-' = stdin) is its standard input\n"
    "  tools [--config FILE]                         list the registered tools\n"
    "  blob put FILE [--tenant T | --ticket T.json]  store a file; prints its blob id\n"
    "  blob get ID [--tenant T | --ticket T.json] [-o FILE]\n"
    "                                                write a blob's bytes (stdout by default)\n"
    "  blob rm ID [--tenant T | --ticket T.json]     delete a blob\n"
    "  blob ls [--tenant T | --ticket T.json]        list a tenant's blob ids\n"
    "  blob pin|unpin ID --holder H [--tenant T]     keep a blob through gc (or stop keeping it)\n"
    "  blob gc [--older-than D] [--target-bytes N] [--tenant T] [--dry-run]\n"
    "                                                remove unpinned blobs last stored more than\n"
    "                                                D ago (default 1h; 90s, 30m, 24h, 7d)\n"
    "  image build NAME [--package P]...             build a runtime image (python3, node, ...)\n"
    "  image import LAYOUT_DIR NAME [--ref REF]      import an OCI image layout as runtime NAME\n"
    "  image ls                                      list images (current and earlier)\n"
    "  image current NAME                            print the current digest of runtime NAME\n"
    "  image use NAME DIGEST                         make an earlier image current (rollback)\n"
    "  image verify DIGEST|NAME                      re-hash every blob of an image\n"
    "  image rm DIGEST                               remove an image that is not current\n"
    "  doctor                                        which backends work on this host, and why "
    "not\n"
    "  audit [--isolation L] [--json] [--runtime R]  prove one level's guarantees on this host: "
    "an\n"
    "                                                in-sandbox probe and host checks (exit 0\n"
    "                                                only when every check passes)\n"
    "  ticket keygen --kid K --out DIR               new Ed25519 key pair DIR/K.pem, "
    "DIR/K.pub.pem\n"
    "  ticket sign --key K.pem [--parent DOC] TICKET.json\n"
    "                                                print the signed ticket document\n"
    "  ticket verify --trusted-keys PATH DOC         check a signed ticket; print its ticket\n"
    "  ticket derive --ticket T.json --approval A.json [--domain D]... [--ttl-s N]\n"
    "                                                print the ticket derived from an approval\n"
    "  receipt verify --trusted-keys PATH FILE       check an execution receipt (a receipt, a\n"
    "                                                result or a run record carrying one)\n"
    "  serve (--socket PATH | --stdio) [--config FILE] [--max-running N]\n"
    "      [--max-queued N] [--tenant-max-running N] [--tenant-max-queued N]\n"
    "      [--queue-deadline-ms N] [--trusted-keys PATH]...\n"
    "                                                a daemon: the JSON protocol, one line per\n"
    "                                                request, host-wide caps (serve --help)\n"
    "  mcp --ticket T.json [--config FILE]           an MCP server on stdin/stdout bound to the\n"
    "                                                ticket: tools run_code, run_tool, put_file,\n"
    "                                                get_file (docs/mcp.md)\n"
    "  interp [--ticket T.json | --isolation LEVEL] [--runtime R] [--timeout-ms N]\n"
    "                                                one Python interpreter fed cells from stdin\n"
    "                                                (separated by a line `# %%`); one JSON\n"
    "                                                cell_result line per cell\n"
    "\n"
    "store options (every command): --state-dir DIR --image-dir DIR --blob-dir DIR\n"
    "  --cgroup-parent PATH (unprivileged hosts: a delegated cgroup subtree)\n"
    "  --config FILE (host configuration: policy, scheduler, warm pools, backends such as\n"
    "  {\"backends\": {\"container\": {\"runtime\": \"crun\"}}}; docs/operations.md)\n"
    "  -v/--verbose (host log lines on stderr)\n"
    "\n"
    "exit status: run: 0 when the result's code is ok, 1 for any other code, 2 for usage\n"
    "errors, 128+N when interrupted by signal N (the run is killed and cleaned up first).\n"
    "Other commands: 0 success, 1 failure, 2 usage. The program's output is escaped when\n"
    "it goes to a terminal. The CLI trusts its caller: ticket files are the operator's\n"
    "(a signed ticket document needs --trusted-keys, and is then verified).\n";

/// One verb: its name on the command line and its handler.
struct verb {
  std::string_view name;
  int (*handler)(const std::vector<std::string>& args);
};

/// Every verb of sandboxctl, in the order of the usage text.
constexpr std::array verbs{
    verb{"run", sandboxctl::cmd_run},       verb{"tools", sandboxctl::cmd_tools},
    verb{"blob", sandboxctl::cmd_blob},     verb{"image", sandboxctl::cmd_image},
    verb{"doctor", sandboxctl::cmd_doctor}, verb{"audit", sandboxctl::cmd_audit},
    verb{"ticket", sandboxctl::cmd_ticket}, verb{"receipt", sandboxctl::cmd_receipt},
    verb{"serve", sandboxctl::cmd_serve},   verb{"mcp", sandboxctl::cmd_mcp},
    verb{"interp", sandboxctl::cmd_interp},
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    std::cout << top_usage;
    return args.empty() ? exit_usage : exit_ok;
  }
  std::string cmd = args[0];
  args.erase(args.begin());
  try {
    for (const auto& v : verbs) {
      if (v.name == cmd) return v.handler(args);
    }
    throw sandboxctl::usage_error(fmt::format("unknown command {}", sandboxctl::quote_name(cmd)));
  } catch (const sandboxctl::usage_error& e) {
    std::cerr << "sandboxctl: " << e.what() << "\n(see sandboxctl --help)\n";
    return exit_usage;
  } catch (const std::exception& e) {
    std::cerr << "sandboxctl: " << e.what() << "\n";
    return exit_fail;
  }
}
