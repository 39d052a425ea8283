"""Checks that agent_sandbox.Client's sessions leave nothing behind and never wait without bound.

Run against a live daemon whose registry has `cat` (/bin/cat), `flood` (writes b"x"
forever, no newline) and `drip` (b"x" every 50 ms, no newline) and that has ONE scheduler slot (`--max-running 1`, a long
`--queue-deadline-ms`); tests/service runs it:

    /usr/bin/python3 examples/python_client/session_limits_test.py --socket /tmp/sandbox.sock

- An open_session that times out (queued behind a session holding the only slot) leaves no
  live session once its answer comes: the client closes it and drops its output.
- readline(timeout) on output without newlines returns (TimeoutError) instead of waiting
  chunk after chunk; readline(max_bytes) refuses an over-long line with ValueError; in both
  cases the bytes read are kept for the next read.

Exits 0 when all hold, 1 otherwise. No assertion is about speed: every wait is bounded far
above what it needs, so that a hang fails instead of blocking.
"""

import argparse
import os
import sys
import time

# The package in the source tree, unless it is installed (clients/python).
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "clients", "python", "src"))
from agent_sandbox import Client  # noqa: E402

TICKET = {"v": 1, "id": "t-s", "tenant": "sesspy", "actions": ["tool.run"],
          "tools": ["cat", "flood", "drip"], "isolation": "process", "max_timeout_ms": 8000,
          "max_memory_bytes": 536870912}
WAIT = 60  # seconds


def eventually(pred, limit=WAIT):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    args = parser.parse_args()
    failures = []

    def check(what, ok):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            failures.append(what)

    with Client(args.socket) as sb:
        # 1. A timed-out open: `flood` waits for the only slot, held by `cat`.
        holder = sb.open_session(TICKET, {"tool": "cat"}, timeout=WAIT)
        try:
            sb.open_session(TICKET, {"tool": "flood"}, timeout=0.5)
            check("timed-out open: expected a TimeoutError (the slot is held)", False)
        except TimeoutError:
            check("timed-out open: TimeoutError while queued", True)
        holder.close(timeout=WAIT)  # frees the slot: the flood session opens now
        # The client closes it when its answer comes; the daemon then counts no session.
        check("timed-out open: its session is closed once it opened",
              eventually(lambda: sb.stats(timeout=WAIT).sessions == 0))
        check("timed-out open: the client holds no session",
              eventually(lambda: not sb._sessions and not sb._pending))
        check("timed-out open: no early-event store", not hasattr(sb, "_early_events"))

        # 2. readline on output without newlines: a chunk comes every 50 ms, none a line.
        with sb.open_session(TICKET, {"tool": "drip"}, timeout=WAIT) as drip:
            try:
                drip.readline(timeout=1)
                check("readline(timeout) on a drip without newlines: expected TimeoutError", False)
            except TimeoutError:
                check("readline(timeout) on a drip without newlines: TimeoutError", True)
            kept = drip.read(timeout=WAIT)
            check("readline(timeout): the bytes read are kept for read()",
                  len(kept) > 0 and kept.strip(b"x") == b"")
        flood = sb.open_session(TICKET, {"tool": "flood"}, timeout=WAIT)
        try:
            flood.readline(max_bytes=100_000)
            check("readline(max_bytes): expected ValueError", False)
        except ValueError as e:
            check(f"readline(max_bytes): ValueError ({e})", "100000" in str(e))
        kept = flood.read(timeout=WAIT)
        check("readline(max_bytes): the bytes read are kept for read()",
              len(kept) > 100_000 and kept.strip(b"x") == b"")
        result = flood.close(timeout=WAIT)
        check("flood closed", result.end == "closed")

        # 3. A line: readline returns it whole, the rest stays.
        with sb.open_session(TICKET, {"tool": "cat"}, timeout=WAIT) as cat:
            cat.write(b"one\ntw")
            cat.write(b"o\nthree")
            check("readline: first line", cat.readline(timeout=WAIT) == b"one\n")
            check("readline: a line written in two parts", cat.readline(timeout=WAIT) == b"two\n")
            try:
                cat.readline(timeout=0.5)
                check("readline: a partial line times out", False)
            except TimeoutError:
                check("readline: a partial line times out", True)
            cat.write(b"\n")
            check("readline: the partial line is kept", cat.readline(timeout=WAIT) == b"three\n")
            cat.close(timeout=WAIT)
        check("no sessions left", eventually(lambda: sb.stats(timeout=WAIT).sessions == 0))
        check("no unmatched answers", not sb.unmatched)

    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
