"""Fixtures: a real `sandboxctl serve` with private stores, as tests/service starts it.

The binary comes from $SANDBOXCTL; $SANDBOX_IMAGE_DIR and $SANDBOX_CGROUP_PARENT, when set,
become --image-dir and --cgroup-parent (tests/service/service_harness.cpp, store_flags).
"""

import json
import os
import signal
import subprocess
import time

import pytest

from agent_sandbox import Ticket

# A registry with a cat-like server for the session tests (tests/service uses the same).
CONFIG = {"v": 1, "tools": [{"name": "cat", "image": "python3", "binary": "/bin/cat"}]}


class Daemon:
    """A running `sandboxctl serve --socket <dir>/s.sock`; stop() ends it (SIGTERM, then
    SIGKILL after 15 s)."""

    def __init__(self, directory, *extra):
        binary = os.environ.get("SANDBOXCTL")
        if not binary:
            if os.environ.get("CI") == "true":
                pytest.fail("SANDBOXCTL is not set (the sandboxctl binary to test)")
            pytest.skip("SANDBOXCTL is not set (the sandboxctl binary to test)")
        self.socket = str(directory / "s.sock")
        config = directory / "config.json"
        config.write_text(json.dumps(CONFIG))
        args = [binary, "serve", "--socket", self.socket, "--state-dir",
                str(directory / "state"), "--blob-dir", str(directory / "blobs"),
                "--config", str(config), *extra]
        if os.environ.get("SANDBOX_IMAGE_DIR"):
            args += ["--image-dir", os.environ["SANDBOX_IMAGE_DIR"]]
        if os.environ.get("SANDBOX_CGROUP_PARENT"):
            args += ["--cgroup-parent", os.environ["SANDBOX_CGROUP_PARENT"]]
        self.log_path = directory / "daemon.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"sandboxctl serve did not start: {self.log()}")
            time.sleep(0.02)

    def log(self):
        return self.log_path.read_text(errors="replace")

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("daemon"))
    yield d
    d.stop()
    assert d.proc.returncode == 0, d.log()


@pytest.fixture
def own_daemon(tmp_path):
    """A daemon of this test alone (for tests that kill it)."""
    d = Daemon(tmp_path)
    yield d
    d.stop()


@pytest.fixture
def ticket():
    return Ticket(id="t-py", tenant="pyclient", actions=["code.execute", "tool.run"],
                  tools=["cat"], isolation="process", max_timeout_ms=8000,
                  max_memory_bytes=512 << 20)
