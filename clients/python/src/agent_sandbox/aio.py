"""The asyncio client: one connection, any number of concurrent tasks.

    async with AsyncClient(path) as sb:
        results = await asyncio.gather(*(sb.run(ticket, req) for req in requests))
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
from typing import Any, Mapping, Sequence

from . import _wire as w
from .errors import DaemonConnectionError, connect_failed
from .types import CellResult, InputFile, RunResult, ServiceStats, SessionResult

__all__ = ["AsyncClient", "AsyncSession"]

#: The longest answer line read, in bytes: a blob_get answer of 8 MiB is ~11 MiB of base64.
_MAX_ANSWER_BYTES = 64 << 20


class AsyncClient:
    """One connection to `sandboxctl serve`, for asyncio. Connect with `async with
    AsyncClient(path) as sb` or `sb = await AsyncClient.connect(path)`; any number of tasks
    may call it at once (answers are matched by id). Bound waits with `asyncio.timeout()`.

    How a run ended is data: `run` returns a RunResult whatever its code. Exceptions are for
    `error` answers (SandboxError with its `code`), requests that cannot be sent (ValueError,
    LineTooLongError, UnicodeEncodeError) and a lost connection (DaemonConnectionError: every
    pending call fails with it, none waits forever).

    Closing the connection cancels the runs in flight and closes the sessions (the daemon
    kills them). A call cancelled while waiting leaves its request in flight on the daemon;
    its answer is dropped when it comes, and a session it opened is closed.
    """

    MAX_LINE_BYTES = w.MAX_LINE_BYTES

    def __init__(self, socket_path: str | os.PathLike[str],
                 max_line_bytes: int | None = None) -> None:
        """Remembers where to connect; `connect()` or `async with` connects."""
        self.socket_path = os.fspath(socket_path)
        self.max_line_bytes = max_line_bytes or self.MAX_LINE_BYTES
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._send_lock = asyncio.Lock()
        self._pending: dict[str, tuple[asyncio.Future[Any], w.Unwrap]] = {}
        self._sessions: dict[str, AsyncSession] = {}
        self._ids = itertools.count(1)
        self._failure: DaemonConnectionError | None = None
        self._closed = False
        #: Answers with "id": null or an id this client did not send.
        self.unmatched: list[dict[str, Any]] = []
        #: Session events of no session of this client: dropped, only counted.
        self.dropped_events = 0

    @classmethod
    async def connect(cls, socket_path: str | os.PathLike[str],
                      max_line_bytes: int | None = None) -> AsyncClient:
        """A connected client; raises OSError when nobody listens at `socket_path`."""
        client = cls(socket_path, max_line_bytes)
        await client._connect()
        return client

    async def __aenter__(self) -> AsyncClient:
        if self._writer is None:
            await self._connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- requests ---------------------------------------------------------------------------

    async def run(self, ticket: w.TicketLike, request: w.RequestLike) -> RunResult:
        """Runs one request and returns its RunResult, whatever its code."""
        return await self._call(w.run_body(ticket, request), w.unwrap_result)

    async def run_with_record(self, ticket: w.TicketLike,
                              request: w.RequestLike) -> tuple[RunResult, dict[str, Any]]:
        """Runs one request; returns (result, run record): the record is the checkpoint that
        `replay` turns back into the same result without running anything."""
        return await self._call(w.run_body(ticket, request, record=True), w.unwrap_record)

    async def replay(self, ticket: w.TicketLike, record: Mapping[str, Any]) -> RunResult:
        """The stored RunResult of `record`, nothing executed (or a result with code
        `blob_not_found`, `action_denied`, `invalid_request`: see Client.replay)."""
        return await self._call(w.replay_body(ticket, record), w.unwrap_result)

    async def put_blob(self, tenant: str, data: bytes) -> str:
        """Stores `data` (at most 786432 bytes) for `tenant`; returns its blob id."""
        return await self._call(w.blob_put_body(tenant, data), w.unwrap_blob)

    async def get_blob(self, tenant: str, blob: str) -> bytes:
        """The bytes of blob `blob` of `tenant` (at most 8 MiB); SandboxError
        `blob_not_found`."""
        return await self._call(w.blob_get_body(tenant, blob), w.unwrap_data)

    async def open_session(self, ticket: w.TicketLike,
                           request: w.SessionRequestLike) -> AsyncSession:
        """Starts a session of a registered server; returns it once the server runs. Raises
        SandboxError as Client.open_session. Cancelled while waiting, the session (should it
        open later) is closed as soon as its answer comes."""
        return await self._call(w.session_open_body(ticket, request),
                                lambda a: self._register_session(w.member(a, "session")))

    async def open_interpreter(self, ticket: w.TicketLike, runtime: str = "python3",
                               max_lifetime_ms: int | None = None,
                               idle_timeout_ms: int | None = None) -> AsyncInterpreter:
        """Starts a live Python interpreter; as Client.open_interpreter. Cancelled while
        waiting (asyncio.wait_for, say), the interpreter (should it open later) is closed as
        soon as its answer comes."""
        return await self._call(
            w.interp_open_body(ticket, runtime, max_lifetime_ms, idle_timeout_ms),
            lambda a: AsyncInterpreter(self, w.unwrap_interpreter(a)))

    async def stats(self) -> ServiceStats:
        """The daemon's counters (`service_stats`)."""
        return await self._call({"service_stats": {}}, w.unwrap_stats)

    async def close(self) -> None:
        """Closes the connection; pending calls fail with DaemonConnectionError. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._fail(DaemonConnectionError("the connection to the sandbox daemon was closed"))

    # --- internals --------------------------------------------------------------------------

    async def _connect(self) -> None:
        try:
            self._reader, self._writer = await asyncio.open_unix_connection(
                self.socket_path, limit=_MAX_ANSWER_BYTES)
        except OSError as e:
            raise connect_failed(self.socket_path, e) from e
        self._task = asyncio.create_task(self._read_answers())

    async def _call(self, body: Mapping[str, Any], unwrap: w.Unwrap) -> Any:
        request_id = f"r{next(self._ids)}"
        line = w.encode_line(request_id, body, self.max_line_bytes)
        if self._writer is None or self._closed or self._failure is not None:
            raise self._failure or DaemonConnectionError(
                "the connection to the sandbox daemon is closed")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (future, unwrap)
        try:
            async with self._send_lock:
                self._writer.write(line)
                await self._writer.drain()
        except OSError as e:
            self._pending.pop(request_id, None)
            raise DaemonConnectionError(f"sending to the sandbox daemon failed: {e}") from e
        except BaseException:
            self._pending.pop(request_id, None)
            raise
        # Cancelling the caller cancels `future`; the reader then drops its answer.
        return await future

    def _register_session(self, sid: str) -> AsyncSession:
        session = AsyncSession(self, sid)
        self._sessions[sid] = session
        return session

    async def _read_answers(self) -> None:
        assert self._reader is not None
        failure = DaemonConnectionError("the sandbox daemon closed the connection")
        try:
            while raw := await self._reader.readline():
                answer = json.loads(raw)
                if not isinstance(answer, dict):
                    raise ValueError("an answer line is not a JSON object")
                if "id" not in answer and "session" in answer:
                    session = self._sessions.get(answer["session"])
                    if session is None:
                        self.dropped_events += 1
                    else:
                        await session._deliver(w.event_chunk(answer))  # may wait: MAX_QUEUED
                    continue
                entry = self._pending.pop(answer.get("id"), None)  # type: ignore[arg-type]
                if entry is None:
                    self.unmatched.append(answer)
                    continue
                future, unwrap = entry
                if "error" in answer:
                    if not future.done():
                        future.set_exception(w.error_of(answer))
                    continue
                try:
                    value = unwrap(answer)
                except Exception as e:  # a malformed answer: report it on that request
                    if not future.done():
                        future.set_exception(e)
                    continue
                if not future.done():
                    future.set_result(value)
                elif isinstance(value, AsyncSession):  # its open_session was cancelled
                    value._closed = True
                    asyncio.create_task(self._close_quietly(value))
                elif isinstance(value, AsyncInterpreter):  # its open_interpreter was cancelled
                    value._closed = True
                    asyncio.create_task(self._close_interpreter_quietly(value))
        except (OSError, ValueError) as e:
            failure = DaemonConnectionError(f"reading from the sandbox daemon failed: {e}")
        self._fail(failure)

    async def _close_quietly(self, session: AsyncSession) -> None:
        with contextlib.suppress(Exception):
            await session.close()
        self._sessions.pop(session.id, None)

    async def _close_interpreter_quietly(self, interpreter: AsyncInterpreter) -> None:
        with contextlib.suppress(Exception):
            await interpreter.close()

    def _fail(self, failure: DaemonConnectionError) -> None:
        if self._failure is None:
            self._failure = failure
        pending, self._pending = self._pending, {}
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(self._failure)
        for session in self._sessions.values():
            session._gone.set()


class AsyncSession:
    """A live session opened by AsyncClient.open_session.

    Its stdout arrives as chunks (bytes, exactly as the server wrote them); at most
    MAX_QUEUED wait for `read`, beyond which the connection stops reading from the daemon
    (and the daemon from the server) until one is read.
    """

    MAX_QUEUED = w.SESSION_MAX_QUEUED
    #: readline's default bound on a line's length in bytes (its newline not counted).
    MAX_LINE_BYTES = w.SESSION_MAX_LINE_BYTES

    def __init__(self, client: AsyncClient, session_id: str) -> None:
        self._client = client
        #: The session's name on this connection.
        self.id = session_id
        self._chunks: asyncio.Queue[bytes | None] = asyncio.Queue(self.MAX_QUEUED)
        self._buffer = b""
        self._eof = False
        self._closed = False
        self._gone = asyncio.Event()  # the connection ended

    async def write(self, data: bytes | str) -> int:
        """Writes `data` (bytes, or str as UTF-8) to the server's stdin; returns the bytes
        written once all are in the session's stdin buffer. SandboxError `session_ended`,
        `session_not_found`."""
        return await self._client._call(w.session_write_body(self.id, data), w.unwrap_written)

    async def read(self) -> bytes:
        """The next chunk of the server's stdout; b"" once it ended (or the connection did)."""
        if self._buffer:
            chunk, self._buffer = self._buffer, b""
            return chunk
        if self._eof:
            return b""
        get = asyncio.ensure_future(self._chunks.get())
        gone = asyncio.ensure_future(self._gone.wait())
        try:
            await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not get.done():
                get.cancel()
        if get.done() and not get.cancelled():
            item = get.result()
        elif not self._chunks.empty():
            item = self._chunks.get_nowait()
        else:
            item = None
        if item is None:
            self._eof = True
            return b""
        return item

    async def readline(self, max_bytes: int | None = None) -> bytes:
        """The next line of the server's stdout with its b"\\n" (what is left at the end). A
        line longer than `max_bytes` (default MAX_LINE_BYTES) raises ValueError; cancelled or
        refused, the bytes read so far stay for the next read."""
        limit = self.MAX_LINE_BYTES if max_bytes is None else max_bytes
        buf = bytearray()
        scanned = 0
        try:
            while True:
                end = w.line_end(buf, scanned, limit, self.id)
                if end:
                    self._buffer = bytes(buf[end:]) + self._buffer
                    return bytes(buf[:end])
                scanned = len(buf)
                chunk = await self.read()
                if not chunk:
                    return bytes(buf)
                buf += chunk
        except BaseException:
            self._buffer = bytes(buf) + self._buffer
            raise

    async def close_stdin(self) -> None:
        """Closes the server's stdin after the writes sent before (EOF for the server)."""
        await self._client._call({"session_close_stdin": {"session": self.id}},
                                 w.unwrap_stdin_closed)

    async def close(self) -> SessionResult:
        """Stops the server (kill-and-confirm) and returns its SessionResult; output not read
        yet is dropped."""
        self._closed = True
        self._drain()
        try:
            return await self._client._call({"session_close": {"session": self.id}},
                                            w.unwrap_session_result)
        finally:
            self._client._sessions.pop(self.id, None)

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._closed:
            await self.close()

    def _drain(self) -> None:
        while not self._chunks.empty():
            self._chunks.get_nowait()

    async def _deliver(self, item: bytes | None) -> None:
        if self._closed:
            return
        while True:
            try:
                self._chunks.put_nowait(item)
                return
            except asyncio.QueueFull:
                await asyncio.sleep(0.05)
                if self._closed:
                    return


class AsyncInterpreter:
    """A live interpreter opened by AsyncClient.open_interpreter (see Interpreter)."""

    def __init__(self, client: AsyncClient, session_id: str) -> None:
        self._client = client
        self.id = session_id
        self._closed = False

    async def execute(self, code: str, timeout_ms: int | None = None,
                      files_in: Sequence[InputFile | Mapping[str, Any]] | None = None
                      ) -> CellResult:
        """Runs one cell and returns its CellResult (`files_in` as Interpreter.execute)."""
        return await self._client._call(
            w.interp_execute_body(self.id, code, timeout_ms, files_in), w.unwrap_cell_result)

    async def close(self) -> SessionResult:
        """Kills the interpreter (confirmed gone) and returns its SessionResult."""
        self._closed = True
        return await self._client._call({"interp_close": {"session": self.id}},
                                        w.unwrap_session_result)

    async def __aenter__(self) -> AsyncInterpreter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._closed:
            await self.close()
