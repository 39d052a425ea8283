"""An MCP server in a sandbox, driven from Python through `sandboxctl serve` (no C++ needed).

The daemon's registry (its --config `tools` section) names the server; the ticket grants
`tool.run` for it. This script speaks MCP's stdio transport (JSON-RPC, one message per line):
`initialize`, `notifications/initialized`, `tools/list`, then closes the session and prints
one JSON document: the server's name, its tool names and the session_result.

    python3 mcp_via_daemon.py SOCKET TICKET_JSON [TOOL]
"""

import json
import os
import sys

# The package in the source tree, unless it is installed (clients/python).
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "clients", "python", "src"))
from agent_sandbox import Client, SessionRequest  # noqa: E402


def rpc(session, message, timeout=60):
    """Sends one JSON-RPC request and returns the response with the same id."""
    session.write(json.dumps(message) + "\n", timeout=timeout)
    while True:
        line = session.readline(timeout=timeout)
        if not line:
            raise RuntimeError("the server ended its output before answering")
        answer = json.loads(line)
        if answer.get("id") == message["id"]:
            return answer
        # Notifications and logging from the server are skipped.


def main():
    socket_path, ticket = sys.argv[1], json.loads(sys.argv[2])
    tool = sys.argv[3] if len(sys.argv) > 3 else "mcp-everything"
    with Client(socket_path) as sb:
        session = sb.open_session(ticket, SessionRequest(tool), timeout=120)
        init = rpc(session, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                             "params": {"protocolVersion": "2024-11-05", "capabilities": {},
                                        "clientInfo": {"name": "python-client", "version": "1"}}})
        session.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
        tools = rpc(session, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        result = session.close(timeout=60)
    print(json.dumps({
        "server": init["result"]["serverInfo"]["name"],
        "protocol": init["result"]["protocolVersion"],
        "tools": [t["name"] for t in tools["result"]["tools"]],
        "session_result": result.to_json(),
    }))


if __name__ == "__main__":
    main()
