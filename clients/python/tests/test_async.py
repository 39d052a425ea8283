"""The AsyncClient against a real daemon."""

import asyncio
import signal

import pytest

from agent_sandbox import (AsyncClient, Code, DaemonConnectionError, LineTooLongError,
                           RunRequest, SandboxError, SessionRequest)

WAIT = 60  # seconds


def python(source, **kw):
    return RunRequest(runtime="python3", source=source, **kw)


def test_concurrent_runs_from_tasks(daemon, ticket):
    async def main():
        async with AsyncClient(daemon.socket) as sb:
            async with asyncio.timeout(WAIT):
                results = await asyncio.gather(
                    *(sb.run(ticket, python(f"print({i} + 1)")) for i in range(8)))
            assert not sb._pending and not sb.unmatched
            return results

    results = asyncio.run(main())
    assert [r.stdout.summary for r in results] == [f"{i + 1}\n" for i in range(8)]
    assert all(r.code == Code.OK for r in results)


def test_blobs_record_replay_and_errors(daemon, ticket):
    async def main():
        async with AsyncClient(daemon.socket) as sb, asyncio.timeout(WAIT):
            blob = await sb.put_blob("pyclient", b"async bytes")
            assert await sb.get_blob("pyclient", blob) == b"async bytes"
            with pytest.raises(SandboxError) as e:
                await sb.get_blob("pyclient", "sha256:" + "1" * 64)
            assert e.value.code == "blob_not_found"
            with pytest.raises(LineTooLongError):
                await sb.put_blob("pyclient", b"\0" * (1 << 20))
            first, record = await sb.run_with_record(
                ticket, python("import secrets; print(secrets.token_hex(8))"))
            assert await sb.replay(ticket, record) == first
            r = await sb.run(ticket, python("import time; time.sleep(30)", timeout_ms=300))
            assert r.code == Code.TIMEOUT

    asyncio.run(main())


def test_session(daemon, ticket):
    async def main():
        async with AsyncClient(daemon.socket) as sb, asyncio.timeout(WAIT):
            async with await sb.open_session(ticket, SessionRequest(tool="cat")) as s:
                await s.write("hello\nwor")
                await s.write(b"ld\n")
                assert await s.readline() == b"hello\n"
                assert await s.readline() == b"world\n"
                await s.close_stdin()
                assert await s.read() == b""
                result = await s.close()
            assert result.bytes_to_server == 12 and result.result.code == Code.OK
            assert (await sb.stats()).sessions == 0

    asyncio.run(main())


def test_daemon_going_away_fails_pending_calls(own_daemon, ticket):
    async def main():
        async with AsyncClient(own_daemon.socket) as sb, asyncio.timeout(WAIT):
            session = await sb.open_session(ticket, SessionRequest(tool="cat"))
            run = asyncio.create_task(
                sb.run(ticket, python("import time; time.sleep(2)", timeout_ms=3000)))
            await asyncio.sleep(0.3)
            own_daemon.stop(signal.SIGKILL)
            with pytest.raises(DaemonConnectionError):
                await run
            assert await session.read() == b""
            with pytest.raises(DaemonConnectionError):
                await sb.stats()

    asyncio.run(main())
