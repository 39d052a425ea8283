"""The synchronous client: one connection, any number of threads.

The daemon answers as requests complete, in any order; a reader thread matches answers to
requests by id (docs/protocol.md, "Lines") and hands session output to its Session.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import queue
import socket
import threading
import time
from typing import Any, Mapping, Sequence

from . import _wire as w
from .errors import DaemonConnectionError, connect_failed
from .types import CellResult, InputFile, RunResult, ServiceStats, SessionResult

__all__ = ["Client", "Session", "Interpreter"]


class Client:
    """One connection to `sandboxctl serve` over its unix socket. Thread-safe; use it as a
    context manager or call close().

    Tickets and requests are typed documents (Ticket, RunRequest, SessionRequest) or plain
    mappings (e.g. a signed ticket document). Every call takes `timeout` in seconds (None:
    wait for the answer) and raises TimeoutError past it.

    How a run ended is data, not an exception: `run` returns a RunResult whose `code` may be
    `timeout`, `action_denied`, ... Exceptions are for answers of kind `error`
    (SandboxError with its `code`), for requests that cannot be sent (ValueError,
    LineTooLongError, UnicodeEncodeError) and for a lost connection (DaemonConnectionError:
    every pending call fails with it, none waits forever).

    Closing the connection (or the process exiting) cancels every run still in flight and
    closes every session: the daemon kills them.
    """

    MAX_LINE_BYTES = w.MAX_LINE_BYTES

    def __init__(self, socket_path: str | os.PathLike[str], connect_timeout: float = 10.0,
                 max_line_bytes: int | None = None) -> None:
        """Connects to the daemon's unix socket at `socket_path`; raises DaemonConnectionError
        (an OSError, with the cause's errno: ENOENT for no socket there, ECONNREFUSED for
        nobody listening) when that fails within `connect_timeout` seconds. `max_line_bytes`:
        the longest line sent (default MAX_LINE_BYTES, the daemon's cap)."""
        self.max_line_bytes = max_line_bytes or self.MAX_LINE_BYTES
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(connect_timeout)
            self._sock.connect(os.fspath(socket_path))
            self._sock.settimeout(None)
        except OSError as e:
            self._sock.close()
            raise connect_failed(socket_path, e) from e
        except BaseException:
            self._sock.close()
            raise
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._pending: dict[str, concurrent.futures.Future[Any]] = {}
        self._ids = itertools.count(1)
        self._closed = False
        self._failure: DaemonConnectionError | None = None
        #: Answers with "id": null or an id this client did not send.
        self.unmatched: list[dict[str, Any]] = []
        self._sessions: dict[str, Session] = {}
        #: Session events of no session of this client (one closed, or abandoned by a
        #: timed-out open_session): dropped, only counted.
        self.dropped_events = 0
        self._reader = threading.Thread(target=self._read_answers, daemon=True)
        self._reader.start()

    # --- requests ---------------------------------------------------------------------------

    def submit(self, ticket: w.TicketLike, request: w.RequestLike,
               request_id: str | None = None) -> concurrent.futures.Future[RunResult]:
        """Starts a run; returns a Future of its RunResult, whatever its code. The future fails
        with SandboxError when the daemon refuses the line, DaemonConnectionError when the
        connection ends first."""
        return self._send(w.run_body(ticket, request), request_id, w.unwrap_result)

    def run(self, ticket: w.TicketLike, request: w.RequestLike,
            timeout: float | None = None) -> RunResult:
        """Runs one request and returns its RunResult (see submit)."""
        return self.submit(ticket, request).result(timeout)

    def run_with_record(self, ticket: w.TicketLike, request: w.RequestLike,
                        timeout: float | None = None) -> tuple[RunResult, dict[str, Any]]:
        """Runs one request; returns (result, run record). Store the record (a plain JSON
        dict, kept exactly as the daemon wrote it) as the checkpoint: after a restart,
        `replay(ticket, record)` returns the same result without running anything."""
        return self._send(w.run_body(ticket, request, record=True), None,
                          w.unwrap_record).result(timeout)

    def replay(self, ticket: w.TicketLike, record: Mapping[str, Any],
               timeout: float | None = None) -> RunResult:
        """The stored RunResult of `record`, nothing executed; or a result with code
        `blob_not_found` (a collected blob, named in the message), `action_denied` (a ticket
        of another tenant) or `invalid_request` (a malformed record)."""
        return self._send(w.replay_body(ticket, record), None,
                          w.unwrap_result).result(timeout)

    def put_blob(self, tenant: str, data: bytes, timeout: float | None = None) -> str:
        """Stores `data` (at most 786432 bytes) in `tenant`'s blob store; returns its blob id
        (`sha256:<hex>`). SandboxError `too_large`, `quota_exceeded`, `invalid_request`."""
        return self._send(w.blob_put_body(tenant, data), None, w.unwrap_blob).result(timeout)

    def get_blob(self, tenant: str, blob: str, timeout: float | None = None) -> bytes:
        """The bytes of blob `blob` of `tenant` (at most 8 MiB). SandboxError
        `blob_not_found` (absent, or another tenant's), `too_large`, `capacity`."""
        return self._send(w.blob_get_body(tenant, blob), None, w.unwrap_data).result(timeout)

    def open_session(self, ticket: w.TicketLike, request: w.SessionRequestLike,
                     timeout: float | None = None) -> Session:
        """Starts a session of a registered server; returns its Session once the server runs.

        The ticket must grant `tool.run` for `request.tool`. Raises SandboxError when the
        daemon refuses it (`invalid_request` for an unknown tool, `action_denied`,
        `capacity` at the session caps, `queue_timeout`, `runtime_unavailable`).

        After `timeout` seconds without the answer it raises TimeoutError; should the session
        open later, this client closes it (kill-and-confirm) as soon as the answer arrives and
        drops its output, so a timed-out open leaves no live session behind.
        """
        future = self._send(w.session_open_body(ticket, request), None,
                            lambda a: self._register_session(w.member(a, "session")))
        try:
            return future.result(timeout)
        except TimeoutError:
            # Runs at once when the answer came meanwhile, else in the reader thread when it
            # comes (the session is registered first, so none of its output is kept).
            future.add_done_callback(self._abandon_open)
            raise

    def open_interpreter(self, ticket: w.TicketLike, runtime: str = "python3",
                         max_lifetime_ms: int | None = None,
                         idle_timeout_ms: int | None = None,
                         timeout: float | None = None) -> Interpreter:
        """Starts a live Python interpreter (`interp_open`); the ticket must grant
        `code.execute`. Raises SandboxError when the daemon refuses it. It belongs to this
        connection and is closed (killed) when the connection closes.

        After `timeout` seconds without the answer it raises TimeoutError; should the
        interpreter open later, this client closes it (kill-and-confirm) as soon as the answer
        arrives, so a timed-out open leaves no live interpreter behind."""
        future = self._send(w.interp_open_body(ticket, runtime, max_lifetime_ms, idle_timeout_ms),
                            None, lambda a: Interpreter(self, w.unwrap_interpreter(a)))
        try:
            return future.result(timeout)
        except TimeoutError:
            future.add_done_callback(self._abandon_interpreter)
            raise

    def stats(self, timeout: float | None = None) -> ServiceStats:
        """The daemon's counters (`service_stats`)."""
        return self._send({"service_stats": {}}, None, w.unwrap_stats).result(timeout)

    def close(self) -> None:
        """Closes the connection; the daemon cancels runs in flight and closes sessions.
        Pending calls fail with DaemonConnectionError. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        if threading.current_thread() is not self._reader:
            self._reader.join(timeout=5)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------------

    def _send(self, body: Mapping[str, Any], request_id: str | None,
              unwrap: w.Unwrap) -> concurrent.futures.Future[Any]:
        request_id = request_id or f"r{next(self._ids)}"
        # Encoded before anything is registered: a request that cannot be sent never waits.
        line = w.encode_line(request_id, body, self.max_line_bytes)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.unwrap = unwrap  # type: ignore[attr-defined]
        with self._lock:
            if self._closed or self._failure is not None:
                raise self._failure or DaemonConnectionError(
                    "the connection to the sandbox daemon is closed")
            if request_id in self._pending:
                raise ValueError(f"id {request_id!r} is already in flight")
            self._pending[request_id] = future
        try:
            with self._send_lock:
                self._sock.sendall(line)
        except BaseException as e:
            with self._lock:
                self._pending.pop(request_id, None)
            if isinstance(e, OSError):
                raise DaemonConnectionError(f"sending to the sandbox daemon failed: {e}") from e
            raise
        return future

    def _register_session(self, sid: str) -> Session:
        """Reader thread, at the session_open answer: the Session, registered before any of
        its events is read (the daemon sends the answer before the session's first event)."""
        session = Session(self, sid)
        with self._lock:
            self._sessions[sid] = session
        return session

    def _abandon_open(self, future: concurrent.futures.Future[Any]) -> None:
        """Done-callback of a timed-out open_session: closes the session it opened, if any."""
        if future.cancelled() or future.exception() is not None:
            return
        session = future.result()
        session._closed.set()  # its output is dropped from now on
        session._drain()

        def close_quietly() -> None:
            try:
                session.close(timeout=600)
            except Exception:  # noqa: BLE001 - nobody waits for it; the connection may be gone
                with self._lock:
                    self._sessions.pop(session.id, None)

        # Not in the reader thread: a close waits for the reader to bring its answer.
        threading.Thread(target=close_quietly, daemon=True).start()

    def _abandon_interpreter(self, future: concurrent.futures.Future[Any]) -> None:
        """Done-callback of a timed-out open_interpreter: closes the interpreter it opened."""
        if future.cancelled() or future.exception() is not None:
            return
        interpreter = future.result()

        def close_quietly() -> None:
            try:
                interpreter.close(timeout=600)
            except Exception:  # noqa: BLE001 - nobody waits for it; the connection may be gone
                pass

        # Not in the reader thread: a close waits for the reader to bring its answer.
        threading.Thread(target=close_quietly, daemon=True).start()

    def _read_answers(self) -> None:
        failure = DaemonConnectionError("the sandbox daemon closed the connection")
        try:
            for raw in self._sock.makefile("rb"):
                answer = json.loads(raw)
                if not isinstance(answer, dict):
                    raise ValueError("an answer line is not a JSON object")
                if "id" not in answer and "session" in answer:
                    with self._lock:
                        session = self._sessions.get(answer["session"])
                        if session is None:
                            self.dropped_events += 1
                    if session is not None:
                        session._deliver(w.event_chunk(answer))  # may wait: MAX_QUEUED
                    continue
                with self._lock:
                    future = self._pending.pop(answer.get("id"), None)
                if future is None:
                    self.unmatched.append(answer)
                elif "error" in answer:
                    future.set_exception(w.error_of(answer))
                else:
                    try:
                        future.set_result(future.unwrap(answer))  # type: ignore[attr-defined]
                    except Exception as e:  # a malformed answer: report it on that request
                        future.set_exception(e)
        except (OSError, ValueError) as e:
            if not self._closed:
                failure = DaemonConnectionError(f"reading from the sandbox daemon failed: {e}")
        if self._closed:
            failure = DaemonConnectionError("the connection to the sandbox daemon was closed")
        with self._lock:
            self._failure = failure
            pending, self._pending = self._pending, {}
            sessions = list(self._sessions.values())
        for future in pending.values():
            future.set_exception(failure)
        for session in sessions:
            session._gone.set()


class Session:
    """A live session opened by Client.open_session. Thread-safe.

    Its stdout arrives as chunks (bytes, exactly as the server wrote them). At most
    MAX_QUEUED chunks (16 KiB each at most) wait here for `read`; beyond, this connection
    stops reading from the daemon until `read` takes one, and the daemon in turn stops
    reading the server's stdout: output never piles up without bound. Answers of the other
    requests on the connection wait meanwhile, so read what you asked for.
    """

    MAX_QUEUED = w.SESSION_MAX_QUEUED
    #: readline's default bound on a line's length in bytes (its newline not counted).
    MAX_LINE_BYTES = w.SESSION_MAX_LINE_BYTES

    def __init__(self, client: Client, session_id: str) -> None:
        self._client = client
        #: The session's name on this connection.
        self.id = session_id
        self._chunks: queue.Queue[bytes | None] = queue.Queue(self.MAX_QUEUED)
        self._pending = b""
        self._eof = False
        self._closed = threading.Event()
        self._gone = threading.Event()  # the connection ended

    def write(self, data: bytes | str, timeout: float | None = None) -> int:
        """Writes `data` (bytes, or str sent as UTF-8) to the server's stdin; returns the
        bytes written once the daemon accepted every one (it waits while the session's stdin
        buffer, 64 KiB, is full). SandboxError `session_ended` when the server's stdin closed
        or the session ended first, `session_not_found` after close."""
        return self._client._send(w.session_write_body(self.id, data), None,
                                  w.unwrap_written).result(timeout)

    def read(self, timeout: float | None = None) -> bytes:
        """The next chunk of the server's stdout; b"" once it ended (or the connection did).
        Raises TimeoutError after `timeout` seconds without output."""
        if self._pending:
            chunk, self._pending = self._pending, b""
            return chunk
        if self._eof:
            return b""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                item = self._chunks.get(timeout=0.2)
                break
            except queue.Empty:
                if self._gone.is_set() and self._chunks.empty():
                    item = None
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"session {self.id}: no output within {timeout} s")
        if item is None:
            self._eof = True
            return b""
        return item

    def readline(self, timeout: float | None = None, max_bytes: int | None = None) -> bytes:
        """The next line of the server's stdout with its b"\\n" (what is left at the end).

        `timeout` (seconds) bounds the whole call: TimeoutError once it passed without a
        whole line. A line longer than `max_bytes` (default MAX_LINE_BYTES; its newline not
        counted) raises ValueError as soon as that many bytes came without a newline. Either
        way nothing is lost: the bytes read so far are returned by the next read or readline.
        """
        limit = self.MAX_LINE_BYTES if max_bytes is None else max_bytes
        deadline = None if timeout is None else time.monotonic() + timeout
        buf = bytearray()
        scanned = 0  # the newline search resumes here: linear in the line's length
        try:
            while True:
                end = w.line_end(buf, scanned, limit, self.id)
                if end:
                    self._pending = bytes(buf[end:]) + self._pending
                    return bytes(buf[:end])
                scanned = len(buf)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"session {self.id}: no whole line within {timeout} s")
                chunk = self.read(left)
                if not chunk:
                    return bytes(buf)
                buf += chunk
        except BaseException:
            self._pending = bytes(buf) + self._pending  # returned by the next read
            raise

    def close_stdin(self, timeout: float | None = None) -> None:
        """Closes the server's stdin after the writes sent before (EOF for the server)."""
        self._client._send({"session_close_stdin": {"session": self.id}}, None,
                           w.unwrap_stdin_closed).result(timeout)

    def close(self, timeout: float | None = None) -> SessionResult:
        """Stops the server (kill-and-confirm) and returns its SessionResult. Output not read
        yet is dropped."""
        self._closed.set()
        self._drain()  # the reader may be waiting to hand this session a chunk
        result = self._client._send({"session_close": {"session": self.id}}, None,
                                    w.unwrap_session_result).result(timeout)
        with self._client._lock:
            self._client._sessions.pop(self.id, None)
        return result

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._closed.is_set():
            self.close()

    def _drain(self) -> None:
        try:
            while True:
                self._chunks.get_nowait()
        except queue.Empty:
            pass

    def _deliver(self, item: bytes | None) -> None:
        """Reader thread: one chunk of stdout (None: its end)."""
        while True:
            if self._closed.is_set():
                return  # output of a closing session is dropped
            try:
                self._chunks.put(item, timeout=0.2)
                return
            except queue.Full:
                continue


class Interpreter:
    """A live interpreter opened by Client.open_interpreter: cells run one at a time and
    share their state. A context manager: leaving it closes the interpreter."""

    def __init__(self, client: Client, session_id: str) -> None:
        self._client = client
        self.id = session_id
        self._closed = False

    def execute(self, code: str, timeout_ms: int | None = None,
                timeout: float | None = None,
                files_in: Sequence[InputFile | Mapping[str, Any]] | None = None) -> CellResult:
        """Runs one cell; every outcome of the cell (error, timeout, lost state) is in the
        CellResult. `files_in`: blobs of the ticket's tenant (InputFile or {"name", "blob"})
        added to the interpreter's `$SANDBOX_INPUT_DIR` before the cell runs, for the rest
        of its life; a refusal (`invalid_request`, `blob_not_found`) is the CellResult's code
        and the cell does not run. SandboxError `session_not_found` once the interpreter is
        closed."""
        return self._client._send(w.interp_execute_body(self.id, code, timeout_ms, files_in),
                                  None, w.unwrap_cell_result).result(timeout)

    def close(self, timeout: float | None = None) -> SessionResult:
        """Kills the interpreter (confirmed gone) and returns its SessionResult."""
        self._closed = True
        return self._client._send({"interp_close": {"session": self.id}}, None,
                                  w.unwrap_session_result).result(timeout)

    def __enter__(self) -> Interpreter:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._closed:
            self.close()
