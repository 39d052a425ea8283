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
"""

import base64
import concurrent.futures
import itertools
import json
import socket
import threading

__all__ = ["SandboxClient", "SandboxError"]


class SandboxError(Exception):
    """An `error` answer: the line itself was refused, or a blob request failed.

    `code` is a stable string (`invalid_request`, `blob_not_found`, `too_large`,
    `quota_exceeded`, `capacity`, `internal`); `message` is short and sanitized.
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

    def _read_answers(self):
        failure = ConnectionError("the sandbox daemon closed the connection")
        try:
            for raw in self._sock.makefile("rb"):
                answer = json.loads(raw)
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
        for future in pending.values():
            future.set_exception(failure)
