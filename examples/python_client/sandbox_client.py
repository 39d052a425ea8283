"""A client of `sandboxctl serve` (service mode), standard library only.

The daemon speaks JSON lines over a unix socket (docs/protocol.md, "Service mode"): each
request line carries an "id" of the client's choosing, and each answer line echoes it. Answers
come back as runs complete, in any order; this client matches them to requests by id, so any
number of threads may call it at once.

    from sandbox_client import SandboxClient

    with SandboxClient("/run/agent-sandbox/serve.sock") as sb:
        ticket = {"v": 1, "id": "t-1", "tenant": "acme", "actions": ["code.execute"],
                  "isolation": "process", "max_timeout_ms": 8000,
                  "max_memory_bytes": 536870912}
        result = sb.run(ticket, {"runtime": "python3", "source": "print(6 * 7)"})
        print(result["code"], result["stdout"]["summary"])   # ok 42

Sessions (a registered server with live stdin/stdout, e.g. a stdio MCP server) go through the
same connection; the ticket must grant `tool.run` for the entry:

        s = sb.open_session(tool_ticket, {"tool": "mcp-everything"})
        s.write(b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}\n')
        print(s.readline())          # the server's answer line (bytes)
        print(s.close()["end"])      # the session_result: "closed"
"""

import base64
import concurrent.futures
import itertools
import json
import queue
import socket
import threading
import time

__all__ = ["SandboxClient", "SandboxError", "Session"]


class SandboxError(Exception):
    """An `error` answer: the line itself was refused, or a blob request failed.

    `code` is a stable string (`invalid_request`, `blob_not_found`, `too_large`,
    `quota_exceeded`, `capacity`, `session_not_found`, `session_ended`, `action_denied`,
    `runtime_unavailable`, `internal`); `message` is short and sanitized.
    """

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class SandboxClient:
    """One connection to the daemon. Thread-safe; use it as a context manager or call close().

    Closing the connection (or the process exiting) cancels every run still in flight: the
    daemon kills them.
    """

    #: The daemon's longest request line in bytes, without its newline (docs/protocol.md,
    #: "Service mode": 1 MiB + 64 KiB). Longer lines are refused here, before sending.
    MAX_LINE_BYTES = (1 << 20) + (64 << 10)

    def __init__(self, socket_path, connect_timeout=10.0, max_line_bytes=None):
        """Connects to the daemon's unix socket at `socket_path` (a str or path)."""
        self.max_line_bytes = max_line_bytes or self.MAX_LINE_BYTES
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(connect_timeout)
        self._sock.connect(str(socket_path))
        self._sock.settimeout(None)
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._pending = {}  # id -> Future
        self._ids = itertools.count(1)
        self._closed = False
        self._failure = None
        self.unmatched = []  # answers with "id": null or an id we did not send
        self._sessions = {}  # session id -> Session
        #: Session events of no session of this client (one closed, or abandoned by a timed-out
        #: open_session): dropped, only counted.
        self.dropped_events = 0
        self._reader = threading.Thread(target=self._read_answers, daemon=True)
        self._reader.start()

    # --- requests ---------------------------------------------------------------------------

    def submit(self, ticket, request, request_id=None):
        """Starts a run; returns a concurrent.futures.Future of its `run_result` dict.

        `ticket` and `request` are the protocol's documents (dicts). The future's result is
        the run_result whatever its code (`ok`, `timeout`, `network_disabled`, ...); it fails
        with SandboxError when the daemon refuses the line, or ConnectionError when the
        connection ends first.
        """
        return self._send({"ticket": ticket, "request": request}, request_id,
                          lambda answer: answer["result"])

    def run(self, ticket, request, timeout=None):
        """Runs one request and waits for its run_result (see submit)."""
        return self.submit(ticket, request).result(timeout)

    def run_with_record(self, ticket, request, timeout=None):
        """Runs one request; returns (run_result, run_record), both dicts.

        Store the record (plain JSON) as the checkpoint: after a restart, `replay(ticket,
        record)` returns the same run_result without running anything.
        """
        return self._send({"ticket": ticket, "request": request, "record": True}, None,
                          lambda a: (a["result"], a["record"])).result(timeout)

    def replay(self, ticket, record, timeout=None):
        """The stored run_result of `record` (a run record dict), nothing executed.

        Whatever the outcome the answer is a run_result: its code is `blob_not_found` (the
        message names the collected blob), `action_denied` (a ticket of another tenant) or
        `invalid_request` (a malformed record) when the stored result cannot be returned.
        """
        return self._send({"replay": {"ticket": ticket, "record": record}}, None,
                          lambda a: a["result"]).result(timeout)

    def put_blob(self, tenant, data, timeout=None):
        """Stores `data` (bytes, at most 768 KiB) for `tenant`; returns its blob id."""
        op = {"tenant": tenant, "data_b64": base64.b64encode(data).decode("ascii")}
        return self._send({"blob_put": op}, None, lambda a: a["blob"]).result(timeout)

    def get_blob(self, tenant, blob, timeout=None):
        """The bytes of blob id `blob` of `tenant` (at most 8 MiB)."""
        op = {"tenant": tenant, "blob": blob}
        return self._send({"blob_get": op}, None,
                          lambda a: base64.b64decode(a["data_b64"], validate=True)).result(timeout)

    def open_session(self, ticket, request, timeout=None):
        """Starts a session of a registered server; returns a Session once it runs.

        `request` is a session request dict (`{"tool": NAME}`, optionally `max_lifetime_ms`,
        `idle_timeout_ms`). Raises SandboxError when the daemon refuses it (`invalid_request`
        for an unknown tool, `action_denied` when the ticket lacks `tool.run` for it,
        `capacity` at the session caps, `queue_timeout`, `runtime_unavailable`).

        After `timeout` seconds without the answer it raises concurrent.futures.TimeoutError;
        the request stays known by its id: should the session open later, this client closes
        it (kill-and-confirm) as soon as the answer arrives and drops its output, so a
        timed-out open leaves neither a live session nor memory behind.
        """
        future = self._send({"session_open": {"ticket": ticket, "request": request}}, None,
                            lambda a: self._register_session(a["session"]))
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            # Runs at once when the answer came meanwhile, else in the reader thread when it
            # comes (the session is registered first, so none of its output is kept).
            future.add_done_callback(self._abandon_open)
            raise

    def stats(self, timeout=None):
        """The daemon's counters (`service_stats`): sessions, session_stdout_bytes, ..."""
        return self._send({"service_stats": {}}, None,
                          lambda a: a["service_stats"]).result(timeout)

    def close(self):
        """Closes the connection; runs still in flight are cancelled by the daemon."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._reader.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- internals --------------------------------------------------------------------------

    def _send(self, body, request_id, unwrap):
        request_id = request_id or f"r{next(self._ids)}"
        # Encoded before anything is registered, so that a request that cannot be sent never
        # waits for an answer: NaN and infinities are not JSON (allow_nan=False raises
        # ValueError), a lone surrogate is not UTF-8 (UnicodeEncodeError), and a line the
        # daemon would refuse by its length alone is refused here. The id goes first: when the
        # daemon cannot parse a line (too deep, say) it still answers under that leading id,
        # so the error reaches this request's future instead of `unmatched`.
        line = json.dumps({"id": request_id, **body}, ensure_ascii=False,
                          allow_nan=False).encode("utf-8")
        if len(line) > self.max_line_bytes:
            raise ValueError(f"the request line is {len(line)} bytes; the sandbox daemon "
                             f"accepts at most {self.max_line_bytes}")
        line += b"\n"
        future = concurrent.futures.Future()
        future.unwrap = unwrap
        with self._lock:
            if self._closed or self._failure is not None:
                raise ConnectionError("the connection to the sandbox daemon is closed")
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
                raise ConnectionError(f"sending to the sandbox daemon failed: {e}") from e
            raise
        return future

    def _register_session(self, sid):
        """Reader thread, at the session_open answer: the Session, registered before any of its
        events is read (the daemon sends the answer before the session's first event)."""
        session = Session(self, sid)
        with self._lock:
            self._sessions[sid] = session
        return session

    def _abandon_open(self, future):
        """Done-callback of a timed-out open_session: closes the session it opened, if any."""
        if future.cancelled() or future.exception() is not None:
            return
        session = future.result()
        session._closed.set()  # its output is dropped from now on
        session._drain()

        def close_quietly():
            try:
                session.close(timeout=600)
            except Exception:  # noqa: BLE001 - nobody waits for it; the connection may be gone
                with self._lock:
                    self._sessions.pop(session.id, None)

        # Not in the reader thread: a close waits for the reader to bring its answer.
        threading.Thread(target=close_quietly, daemon=True).start()

    def _read_answers(self):
        failure = ConnectionError("the sandbox daemon closed the connection")
        try:
            for raw in self._sock.makefile("rb"):
                answer = json.loads(raw)
                if "id" not in answer and "session" in answer:
                    with self._lock:
                        session = self._sessions.get(answer["session"])
                        if session is None:
                            self.dropped_events += 1
                    if session is not None:
                        session._deliver(answer)  # may wait: see Session.MAX_QUEUED
                    continue
                with self._lock:
                    future = self._pending.pop(answer.get("id"), None)
                if future is None:
                    self.unmatched.append(answer)
                elif "error" in answer:
                    err = answer["error"]
                    future.set_exception(SandboxError(err.get("code"), err.get("message")))
                else:
                    try:
                        future.set_result(future.unwrap(answer))
                    except Exception as e:  # a malformed answer: report it on that request
                        future.set_exception(e)
        except (OSError, ValueError) as e:
            failure = ConnectionError(f"reading from the sandbox daemon failed: {e}")
        with self._lock:
            self._failure = failure
            pending, self._pending = self._pending, {}
            sessions = list(self._sessions.values())
        for future in pending.values():
            future.set_exception(failure)
        for session in sessions:
            session._gone.set()


class Session:
    """A live session opened by SandboxClient.open_session. Thread-safe.

    Its stdout arrives as chunks (bytes, exactly as the server wrote them). At most
    MAX_QUEUED chunks (16 KiB each at most) wait here for `read`; beyond, this connection
    stops reading from the daemon until `read` takes one, and the daemon in turn stops reading
    the server's stdout: a server's output never piles up without bound. Answers of the other
    requests on the connection wait meanwhile, so read what you asked for.
    """

    MAX_QUEUED = 256
    #: readline's default bound on a line's length in bytes (its newline not counted).
    MAX_LINE_BYTES = 4 << 20

    def __init__(self, client, session_id):
        self._client = client
        self.id = session_id
        self._chunks = queue.Queue(self.MAX_QUEUED)
        self._pending = b""
        self._eof = False
        self._closed = threading.Event()
        self._gone = threading.Event()  # the connection ended

    def write(self, data, timeout=None):
        """Writes `data` (bytes, or str sent as UTF-8) to the server's stdin.

        Returns once the daemon accepted every byte (it waits while the session's stdin buffer
        is full); raises SandboxError `session_ended` when the server or the session is gone.
        """
        if isinstance(data, str):
            op = {"session": self.id, "text": data}
        else:
            op = {"session": self.id, "data_b64": base64.b64encode(data).decode("ascii")}
        return self._client._send({"session_write": op}, None,
                                  lambda a: a["written"]).result(timeout)

    def read(self, timeout=None):
        """The next chunk of the server's stdout (bytes); b"" once it ended.

        Raises queue.Empty after `timeout` seconds without output.
        """
        if self._pending:
            chunk, self._pending = self._pending, b""
            return chunk
        if self._eof:
            return b""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                chunk = self._chunks.get(timeout=0.2)
                break
            except queue.Empty:
                if self._gone.is_set() and self._chunks.empty():
                    chunk = None
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    raise
        if chunk is None:
            self._eof = True
            return b""
        return chunk

    def readline(self, timeout=None, max_bytes=None):
        """The next line of the server's stdout, with its b"\n" (what is left at the end).

        `timeout` (seconds) bounds the whole call: queue.Empty once it passed without a whole
        line. A line longer than `max_bytes` (default MAX_LINE_BYTES; its newline not counted)
        raises ValueError as soon as that many bytes came without a newline. Either way
        nothing is lost: the bytes read so far are returned by the next read or readline.
        """
        limit = self.MAX_LINE_BYTES if max_bytes is None else max_bytes
        deadline = None if timeout is None else time.monotonic() + timeout
        buf = bytearray()
        scanned = 0  # the newline search resumes here: linear in the line's length
        try:
            while True:
                nl = buf.find(b"\n", scanned)
                if nl > limit or (nl < 0 and len(buf) > limit):
                    raise ValueError(f"session {self.id}: the server's line is longer than "
                                     f"{limit} bytes (readline's max_bytes)")
                if nl >= 0:
                    self._pending = bytes(buf[nl + 1:]) + self._pending
                    return bytes(buf[:nl + 1])
                scanned = len(buf)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise queue.Empty  # output keeps coming, but no whole line in time
                chunk = self.read(left)
                if not chunk:
                    return bytes(buf)
                buf += chunk
        except BaseException:
            self._pending = bytes(buf) + self._pending  # returned by the next read
            raise

    def close_stdin(self, timeout=None):
        """Closes the server's stdin after the writes sent before (EOF for the server)."""
        self._client._send({"session_close_stdin": {"session": self.id}}, None,
                           lambda a: a["stdin_closed"]).result(timeout)

    def close(self, timeout=None):
        """Stops the server (kill-and-confirm) and returns the session_result dict."""
        self._closed.set()
        self._drain()  # the reader may be waiting to hand this session a chunk
        result = self._client._send({"session_close": {"session": self.id}}, None,
                                    lambda a: a["session_result"]).result(timeout)
        with self._client._lock:
            self._client._sessions.pop(self.id, None)
        return result

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._closed.is_set():
            self.close()

    def _drain(self):
        try:
            while True:
                self._chunks.get_nowait()
        except queue.Empty:
            pass

    def _deliver(self, event):
        """Called by the reader thread: one event (None: the connection ended)."""
        if event is None or "eof" in event:
            item = None
        else:
            item = base64.b64decode(event["stdout"], validate=True)
        while True:
            if self._closed.is_set():
                return  # output of a closing session is dropped
            try:
                self._chunks.put(item, timeout=0.2)
                return
            except queue.Full:
                continue
