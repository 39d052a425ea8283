"""Exceptions of the client. A run that ends with a non-ok code is *not* one of them: it is a
RunResult whose `code` says how it ended (docs/protocol.md, "Codes")."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["SandboxError", "DaemonConnectionError", "LineTooLongError", "ProtocolError"]


class SandboxError(Exception):
    """An `error` answer of the daemon: the line itself was refused, a blob request failed, or
    a session request failed.

    `code` is the protocol's stable string: `invalid_request`, `blob_not_found`, `too_large`,
    `quota_exceeded`, `capacity`, `session_not_found`, `session_ended`, and for a refused
    `session_open` also `action_denied`, `runtime_unavailable`, `digest_mismatch`,
    `queue_timeout`, `internal`. `message` is short and sanitized by the daemon.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class DaemonConnectionError(ConnectionError):
    """The connection to the daemon is closed or failed: the request was not sent, or its
    answer will never come. Every request still pending when the connection ends fails with
    it."""


def connect_failed(socket_path: Any, cause: OSError) -> DaemonConnectionError:
    """The error for a connection to `socket_path` that could not be made: the cause's errno
    and a message naming the path and why."""
    why = cause.strerror or str(cause) or type(cause).__name__
    return DaemonConnectionError(
        cause.errno, f"cannot connect to the sandbox daemon at {os.fspath(socket_path)}: {why}")


class LineTooLongError(ValueError):
    """The request line would be longer than the daemon accepts (`max_line_bytes`, by default
    1114112 bytes without its newline); refused before anything is sent."""


class ProtocolError(ValueError):
    """A document that does not have the protocol's shape: an answer missing a required field
    or with a field of the wrong type, or a request document with an unknown field. The
    message starts with the field's path, e.g. `result.stdout.bytes: expected an integer`."""
