"""agent_sandbox: a client of the agent-sandbox daemon (`sandboxctl serve`), standard library
only. The protocol is docs/protocol.md ("Service mode").

    from agent_sandbox import Client, Ticket, RunRequest

    ticket = Ticket(id="t-1", tenant="acme", actions=["code.execute"], isolation="process",
                    max_timeout_ms=8000, max_memory_bytes=512 << 20)
    with Client("/run/agent-sandbox/serve.sock") as sb:
        result = sb.run(ticket, RunRequest(runtime="python3", source="print(6 * 7)"))
        print(result.code, result.stdout.summary)      # ok 42

`Client` is synchronous and thread-safe; `AsyncClient` is its asyncio twin. A run's outcome
(`ok`, `timeout`, `action_denied`, ...) is a RunResult, never an exception; SandboxError is an
`error` answer, DaemonConnectionError a lost connection.
"""

from .aio import AsyncClient, AsyncInterpreter, AsyncSession
from .client import Client, Interpreter, Session
from .errors import DaemonConnectionError, LineTooLongError, ProtocolError, SandboxError
from .types import (CellResult, Code, DroppedFile, EgressAttempt, EgressRule, FilesOut, InputFile, OutputFile,
                    PoolStats, QueueInfo, RichOutput, RunRequest, RunResult, RuntimeInfo, ServiceStats,
                    SessionRequest, SessionResult, StreamSummary, Ticket, Usage)
from ._wire import MAX_BLOB_PUT_BYTES, MAX_LINE_BYTES

__all__ = [
    "AsyncClient", "AsyncInterpreter", "AsyncSession", "Client", "Interpreter", "Session",
    "CellResult", "RichOutput", "DaemonConnectionError",
    "LineTooLongError", "ProtocolError", "SandboxError", "Code", "DroppedFile",
    "EgressAttempt", "EgressRule", "FilesOut", "InputFile", "OutputFile", "PoolStats",
    "QueueInfo", "RunRequest", "RunResult", "RuntimeInfo", "ServiceStats", "SessionRequest", "SessionResult",
    "StreamSummary", "Ticket", "Usage", "MAX_BLOB_PUT_BYTES", "MAX_LINE_BYTES",
]
