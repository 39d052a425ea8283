"""Lines of the daemon's protocol (docs/protocol.md, "Lines"), shared by both clients."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Callable, Mapping, Sequence

from .errors import LineTooLongError, ProtocolError, SandboxError
from .types import (CellResult, InputFile, RunRequest, RunResult, ServiceStats,
                    SessionRequest, SessionResult, Ticket)

#: The daemon's longest request line in bytes, without its newline (1 MiB + 64 KiB).
MAX_LINE_BYTES = (1 << 20) + (64 << 10)
#: The most `put_blob` takes, in bytes (768 KiB decoded).
MAX_BLOB_PUT_BYTES = 786432

TicketLike = Ticket | Mapping[str, Any]
RequestLike = RunRequest | Mapping[str, Any]
SessionRequestLike = SessionRequest | Mapping[str, Any]
Unwrap = Callable[[Mapping[str, Any]], Any]


#: Session output chunks a session holds unread before its connection stops reading.
SESSION_MAX_QUEUED = 256
#: readline's default bound on a line's length in bytes (its newline not counted).
SESSION_MAX_LINE_BYTES = 4 << 20


def line_end(buf: bytearray, scanned: int, limit: int, session: str) -> int:
    """Where the first line in `buf` ends (just past its b"\n"; the search starts at
    `scanned`, where the last one stopped), or 0 when no newline came yet. ValueError when
    the line is longer than `limit` bytes (its newline not counted)."""
    nl = buf.find(b"\n", scanned)
    if nl > limit or (nl < 0 and len(buf) > limit):
        raise ValueError(f"session {session}: the server's line is longer than {limit} bytes "
                         f"(readline's max_bytes)")
    return nl + 1


def document(value: Any) -> Any:
    """A typed document's JSON form; a mapping (e.g. a signed ticket) as it is."""
    return value.to_json() if hasattr(value, "to_json") else value


def encode_line(request_id: str, body: Mapping[str, Any], max_line_bytes: int) -> bytes:
    """One request line with its newline. The id goes first: when the daemon cannot parse a
    line (too deep, say) it still answers under a leading id. Raises before anything is
    sent: ValueError for NaN or infinities (not JSON), UnicodeEncodeError for a lone
    surrogate, LineTooLongError for a line over `max_line_bytes`."""
    line = json.dumps({"id": request_id, **body}, ensure_ascii=False,
                      allow_nan=False).encode("utf-8")
    if len(line) > max_line_bytes:
        raise LineTooLongError(f"the request line is {len(line)} bytes; the sandbox daemon "
                               f"accepts at most {max_line_bytes}")
    return line + b"\n"


def b64encode(data: bytes) -> str:
    """RFC 4648 base64 with padding, no line breaks."""
    return base64.b64encode(data).decode("ascii")


def b64decode(text: Any, what: str) -> bytes:
    """Strict base64 of an answer; ProtocolError when malformed."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, TypeError, ValueError) as e:
        raise ProtocolError(f"{what}: not base64 ({e})") from e


def member(answer: Mapping[str, Any], key: str) -> Any:
    """answer[key], or ProtocolError naming it."""
    if key not in answer:
        raise ProtocolError(f"answer {answer.get('id')!r}: {key}: required field is missing")
    return answer[key]


def error_of(answer: Mapping[str, Any]) -> SandboxError:
    """The SandboxError of an `error` answer."""
    err = answer.get("error")
    if not isinstance(err, Mapping):
        return SandboxError("internal", f"malformed error answer: {err!r}")
    return SandboxError(str(err.get("code")), str(err.get("message", "")))


# Bodies and unwraps of each request, the same for the sync and async clients.

def run_body(ticket: TicketLike, request: RequestLike, record: bool = False) -> dict[str, Any]:
    body = {"ticket": document(ticket), "request": document(request)}
    if record:
        body["record"] = True
    return body


def unwrap_result(a: Mapping[str, Any]) -> RunResult:
    return RunResult.from_json(member(a, "result"), "result.")


def unwrap_record(a: Mapping[str, Any]) -> tuple[RunResult, dict[str, Any]]:
    record = member(a, "record")
    if not isinstance(record, dict):
        raise ProtocolError("record: expected an object")
    return unwrap_result(a), record


def replay_body(ticket: TicketLike, record: Mapping[str, Any]) -> dict[str, Any]:
    return {"replay": {"ticket": document(ticket), "record": record}}


def blob_put_body(tenant: str, data: bytes) -> dict[str, Any]:
    return {"blob_put": {"tenant": tenant, "data_b64": b64encode(bytes(data))}}


def unwrap_blob(a: Mapping[str, Any]) -> str:
    return member(a, "blob")


def blob_get_body(tenant: str, blob: str) -> dict[str, Any]:
    return {"blob_get": {"tenant": tenant, "blob": blob}}


def unwrap_data(a: Mapping[str, Any]) -> bytes:
    return b64decode(member(a, "data_b64"), "data_b64")


def session_open_body(ticket: TicketLike, request: SessionRequestLike) -> dict[str, Any]:
    return {"session_open": {"ticket": document(ticket), "request": document(request)}}


def session_write_body(session: str, data: bytes | str) -> dict[str, Any]:
    if isinstance(data, str):
        return {"session_write": {"session": session, "text": data}}
    return {"session_write": {"session": session, "data_b64": b64encode(bytes(data))}}


def unwrap_written(a: Mapping[str, Any]) -> int:
    return member(a, "written")


def unwrap_stdin_closed(a: Mapping[str, Any]) -> bool:
    return member(a, "stdin_closed")


def unwrap_session_result(a: Mapping[str, Any]) -> SessionResult:
    return SessionResult.from_json(member(a, "session_result"), "session_result.")


def unwrap_stats(a: Mapping[str, Any]) -> ServiceStats:
    return ServiceStats.from_json(member(a, "service_stats"), "service_stats.")


def event_chunk(event: Mapping[str, Any]) -> bytes | None:
    """A session event's stdout bytes; None for its `eof`."""
    if event.get("eof"):
        return None
    return b64decode(event.get("stdout"), f"session {event.get('session')}: stdout")


def interp_open_body(ticket: TicketLike, runtime: str, max_lifetime_ms: int | None,
                     idle_timeout_ms: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"ticket": document(ticket), "runtime": runtime}
    if max_lifetime_ms is not None:
        body["max_lifetime_ms"] = max_lifetime_ms
    if idle_timeout_ms is not None:
        body["idle_timeout_ms"] = idle_timeout_ms
    return {"interp_open": body}


def interp_execute_body(session: str, code: str, timeout_ms: int | None,
                        files_in: Sequence[InputFile | Mapping[str, Any]] | None = None
                        ) -> dict[str, Any]:
    body: dict[str, Any] = {"session": session, "code": code}
    if timeout_ms is not None:
        body["timeout_ms"] = timeout_ms
    if files_in:
        body["files_in"] = [f.to_json() if isinstance(f, InputFile) else dict(f)
                            for f in files_in]
    return {"interp_execute": body}


def unwrap_interpreter(a: Mapping[str, Any]) -> str:
    sid = member(a, "interpreter")
    if not isinstance(sid, str):
        raise ProtocolError("interpreter: expected a string")
    return sid


def unwrap_cell_result(a: Mapping[str, Any]) -> CellResult:
    return CellResult.from_json(member(a, "cell_result"), "cell_result.")
