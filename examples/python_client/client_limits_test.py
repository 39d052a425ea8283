"""Checks that agent_sandbox.Client never waits forever on a request the daemon cannot attribute.

Run against a live daemon (tests/service runs it):

    /usr/bin/python3 examples/python_client/client_limits_test.py --socket /tmp/sandbox.sock

Every request that cannot be sent (NaN, a lone surrogate, a line longer than the daemon
accepts) fails at once with nothing left pending; one the daemon cannot parse (nested too
deep) fails with SandboxError under its own id. Exits 0 when all hold, 1 otherwise.
"""

import argparse
import os
import sys

# The package in the source tree, unless it is installed (clients/python).
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "clients", "python", "src"))
from agent_sandbox import Client, SandboxError  # noqa: E402

TICKET = {"v": 1, "id": "t-1", "tenant": "acme", "actions": ["code.execute"],
          "isolation": "process", "max_timeout_ms": 8000, "max_memory_bytes": 536870912}
WAIT = 30  # seconds: far more than any answer needs; a hang fails instead of blocking


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    args = parser.parse_args()
    failures = []

    def check(what, ok):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    with Client(args.socket) as sb:
        def raises_at_once(what, exc_type, call):
            try:
                call()
            except exc_type as e:
                check(f"{what}: {exc_type.__name__} ({e})", not sb._pending)
            except Exception as e:  # noqa: BLE001 - report anything else as a failure
                check(f"{what}: expected {exc_type.__name__}, got {e!r}", False)
            else:
                check(f"{what}: expected {exc_type.__name__}, got no exception", False)

        python = {"runtime": "python3", "source": "print(1)"}
        raises_at_once("timeout_ms NaN", ValueError,
                       lambda: sb.submit(TICKET, {**python, "timeout_ms": float("nan")}))
        raises_at_once("a 2 MB source", ValueError,
                       lambda: sb.submit(TICKET, {**python, "source": "#" * 2_000_000}))
        raises_at_once("a 1 MiB blob", ValueError,
                       lambda: sb.put_blob("acme", b"\0" * (1 << 20), timeout=WAIT))
        raises_at_once("a lone surrogate", UnicodeEncodeError,
                       lambda: sb.submit(TICKET, {**python, "source": "print('\ud800')"}))

        deep = 1
        for _ in range(20):
            deep = [deep]
        future = sb.submit(TICKET, {**python, "env": {"X": deep}})
        try:
            future.result(WAIT)
            check("20-deep nesting: expected SandboxError, got a result", False)
        except SandboxError as e:
            check(f"20-deep nesting: SandboxError {e.code} under its own id",
                  e.code == "invalid_request" and not sb._pending)
            # The documented limit of a document (16 levels), the line's own level named apart.
            check(f"20-deep nesting: the message names the documented limit ({e.message})",
                  e.message.startswith("nesting deeper than 16 levels"))
        except TimeoutError:
            check("20-deep nesting: no answer (the client would hang)", False)

        result = sb.run(TICKET, {"runtime": "python3", "source": "print(6 * 7)"}, timeout=WAIT)
        check("a run after all that", result.code == "ok"
              and result.stdout.summary == "42\n")
        check("no unmatched answers", not sb.unmatched)

    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
