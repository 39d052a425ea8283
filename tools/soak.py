#!/usr/bin/python3
"""Soak and faults through one daemon (docs/security.md, "Soak and faults").

Starts `sandboxctl serve --socket` with a private state dir and blob dir, sends N mixed runs
(normal, stdout+stderr flood past the capture cap, timeout, OOM, fork bomb, output files at
their caps, a network attempt without network) from C concurrent client connections, checks
every run's code, then checks the host: no process of a run left (in one of this daemon's run
cgroups, or of a sandbox uid outside every run cgroup), no run cgroup, no mount under the
state dir, no work dir, no `.tmp-` file in the blob dir, and the daemon's descriptor count and
RSS back within a bound of their figures after a warm-up.

With --faults it then injects faults: (a) SIGKILL of the daemon with runs in flight, restart
on the same state dir, reclaim and blob-store consistency; (b) a blob dir on a tiny tmpfs
that fills up; (c) container level only: the OCI runtime binary missing, or exiting 1 mid-run;
(d) microvm level only: the run's QEMU killed mid-run; (e) a state dir on a small tmpfs that
fills up.

    sudo /usr/bin/python3 tools/soak.py --level process --runs 1000 --clients 8 [--faults]

Root only (sandbox uids, cgroups, tmpfs). Exits 0 when every check held, 1 otherwise, 2 on
bad arguments, 77 with --skip-unavailable when not root (unless CI=true or
SANDBOX_MUST_WORK=1). Standard library only.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The client package in the source tree (clients/python), unless it is installed.
sys.path.insert(1, os.path.join(REPO, "clients", "python", "src"))
from agent_sandbox import Client, SandboxError  # noqa: E402

SANDBOX_UID_MIN = 2_100_000_000  # the uid pool's first uid (src/core/run/uid_pool.cpp)
CGROUP_PARENT = "agent-sandbox"  # sandboxctl's default --cgroup-parent as root
CAPTURE = 1 << 20  # policy.stream_capture_bytes
RSS_SLACK = 32 << 20  # bytes the daemon's RSS may grow over the soak (as the in-process soak)
WAIT = 120  # seconds: longest wait for one answer; a hang fails instead of blocking
KINDS = ["normal", "flood", "timeout", "oom", "fork_bomb", "files", "network"]

FORK_BOMB = """
import os, time
made = failed = 0
for i in range(200):
    try:
        pid = os.fork()
    except OSError:
        failed += 1; continue
    if pid == 0:
        time.sleep(30); os._exit(0)
    made += 1
print(made, failed)
"""
FILES = """
import os
d = os.environ['SANDBOX_OUTPUT_DIR']
for i in range(5):
    with open(os.path.join(d, 'f%d' % i), 'wb') as f: f.write(bytes([65 + i]) * 16384)
"""
NETWORK = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM); s.settimeout(2)
try: s.connect(('192.0.2.1', 80)); print('connected')
except OSError as e: print('refused', e.errno)
"""


def request_for(kind, i):
    # 8 s (the policy's most) for all but the timeout kind: floods and fork bombs take seconds
    # under TCG emulation (the microvm level without KVM).
    py = lambda src, **kw: {"runtime": "python3", "source": src, "timeout_ms": 8000,  # noqa: E731
                            **kw}
    if kind == "normal":
        return py(f"print(sum(range(1000)), {i})")
    if kind == "flood":  # 2 MiB on stdout, 1.5 MiB on stderr: both past the 1 MiB cap
        return py("import sys\nc = b'y' * 65536\n"
                  "for _ in range(32): sys.stdout.buffer.write(c)\n"
                  "for _ in range(24): sys.stderr.buffer.write(c)\n")
    if kind == "timeout":
        return py("import time\ntime.sleep(30)", timeout_ms=1000)
    if kind == "oom":
        return py("x = b'x' * (400 << 20)\nprint('survived')", memory_limit_bytes=64 << 20)
    if kind == "fork_bomb":
        return py(FORK_BOMB)
    if kind == "files":  # 5 files of 16 KiB: 4 fill both caps exactly, the 5th is dropped
        return py(FILES, files_out={"max_files": 4, "max_bytes": 4 * 16384})
    if kind == "network":
        return py(NETWORK)
    raise ValueError(kind)


def check_result(level, kind, i, r):
    """The reason a run_result (its JSON document) is wrong for its kind, or None."""
    c = r.get("code")
    out = r.get("stdout", {})
    if kind == "normal":
        ok = c == "ok" and out.get("summary") == f"499500 {i}\n"
    elif kind == "flood":
        err = r.get("stderr", {})
        ok = (c == "ok" and out.get("truncated") and out.get("bytes") == CAPTURE
              and out.get("total_bytes") == 2 << 20 and err.get("truncated")
              and err.get("total_bytes") == 24 * 65536)
    elif kind == "timeout":
        ok = c == "timeout"
    elif kind == "oom":
        ok = c == "oom" and "survived" not in out.get("summary", "")
    elif kind == "fork_bomb":
        if c == "pids_limit":
            ok = level == "gvisor"  # gVisor's Sentry may end the run (security.md)
        else:
            parts = out.get("summary", "").split()
            ok = (c == "ok" and len(parts) == 2 and 0 < int(parts[0]) < 1024
                  and int(parts[1]) > 0)
    elif kind == "files":
        files = r.get("files_out", [])
        dropped = r.get("files_dropped", [])
        ok = (c == "ok" and len(files) == 4 and all(f["bytes"] == 16384 for f in files)
              and len(dropped) == 1
              and dropped[0].get("reason") in ("count_limit", "bytes_limit"))
    elif kind == "network":
        ok = c == "network_disabled" or (c == "ok" and level in ("gvisor", "microvm"))
        ok = ok and "connected" not in out.get("summary", "")
    else:
        ok = False
    if ok:
        return None
    brief = {k: r.get(k) for k in ("code", "message", "exit_code", "files_dropped", "run_id")}
    for name in ("stdout", "stderr"):
        stream = r.get(name, {})
        brief[name] = {"summary": stream.get("summary", "")[:120],
                       "total_bytes": stream.get("total_bytes"),
                       "truncated": stream.get("truncated")}
    return f"run {i} ({kind}): {json.dumps(brief)}"


# --- the host --------------------------------------------------------------------------------


def listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def instances(state):
    """The ids of the runtime instances alive on `state`: <state>[/<backend>]/instances/*.lock."""
    dirs = [os.path.join(state, "instances")] + [os.path.join(state, d, "instances")
                                                 for d in listdir(state)]
    return {f[:-5] for d in dirs for f in listdir(d) if f.endswith(".lock")}


def host_leftovers(state, blob_dir, insts):
    """What runs of the instances `insts` left on the host: a dict of non-empty lists."""
    own = lambda name: any(name.startswith(f"r-{x}-") for x in insts)  # noqa: E731
    cgroups = []
    for root in ["/sys/fs/cgroup"] + [os.path.join("/sys/fs/cgroup", h)
                                      for h in listdir("/sys/fs/cgroup")]:
        for n in listdir(os.path.join(root, CGROUP_PARENT)):
            if own(n):
                cgroups.append(os.path.join(root, CGROUP_PARENT, n))
    procs = []
    for p in listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cgroup") as f:
                lines = f.read().splitlines()
            uid = os.stat(f"/proc/{p}").st_uid
        except OSError:
            continue
        in_run = [ln for ln in lines if "/r-" in ln]
        mine = any(own(ln.split(f"/{CGROUP_PARENT}/", 1)[-1]) for ln in in_run
                   if f"/{CGROUP_PARENT}/r-" in ln)
        if mine or (not in_run and uid >= SANDBOX_UID_MIN):
            procs.append(f"{p} uid {uid}")
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4]
            if point.startswith(state + "/"):
                mounts.append(point)
    work = []
    for runs in [os.path.join(state, "runs")] + [os.path.join(state, d, "runs")
                                                 for d in listdir(state)]:
        for inst in listdir(runs):
            work += [f"{runs}/{inst}/{r}" for r in listdir(os.path.join(runs, inst))
                     if not r.startswith("w")]
    tmp = []
    for d, _, files in os.walk(blob_dir):
        tmp += [os.path.join(d, f) for f in files if f.startswith(".tmp-")]
    found = {"processes": procs, "cgroups": cgroups, "mounts": mounts, "work dirs": work,
             "blob temp files": tmp}
    return {k: v for k, v in found.items() if v}


def settled_leftovers(state, blob_dir, insts, seconds=15):
    """host_leftovers, polled until empty or `seconds` passed (cleanup is asynchronous)."""
    deadline = time.monotonic() + seconds
    while True:
        left = host_leftovers(state, blob_dir, insts)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.25)


def blob_store_errors(blob_dir):
    """Every blob whose content does not hash to its name, and temp files."""
    errors = []
    tenants = os.path.join(blob_dir, "tenants")
    for t in listdir(tenants):
        for name in listdir(os.path.join(tenants, t)):
            path = os.path.join(tenants, t, name)
            if name.startswith(".tmp-"):
                errors.append(f"temp file {path}")
            elif re.fullmatch(r"[0-9a-f]{64}", name):
                h = hashlib.sha256()
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
                if h.hexdigest() != name:
                    errors.append(f"blob {path} hashes to {h.hexdigest()}")
    return errors


def proc_figures(pid):
    """(descriptors other than pidfds, RSS bytes) of process `pid`."""
    fds = 0
    for fd in listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:[pidfd]":
                fds += 1
        except OSError:
            pass
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return fds, rss


# --- the daemon ------------------------------------------------------------------------------


DAEMONS = []  # every Daemon made: main() stops those still alive on the way out


class Daemon:
    """One `sandboxctl serve --socket` with its own state, blob dir and config."""

    def __init__(self, sandboxctl, work, config, state=None, blob_dir=None, tag="d"):
        self.sandboxctl, self.work = sandboxctl, work
        self.state = state or os.path.join(work, "state")
        self.blob_dir = blob_dir or os.path.join(work, "blobs")
        self.sock = os.path.join(work, f"{tag}.sock")
        self.log_path = os.path.join(work, f"{tag}.log")
        self.config = os.path.join(work, f"{tag}.json")
        with open(self.config, "w") as f:
            json.dump(config, f)
        self.proc = None
        DAEMONS.append(self)

    def start(self, timeout=60):
        """Starts it; returns None once the socket answers, else the reason (log tail)."""
        for d in (self.state, self.blob_dir):
            os.makedirs(d, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.sandboxctl, "serve", "--socket", self.sock, "--state-dir", self.state,
             "--blob-dir", self.blob_dir, "--config", self.config, "-v"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return f"exited {self.proc.returncode}: {self.log_tail()}"
            if os.path.exists(self.sock):
                try:
                    Client(self.sock, connect_timeout=2).close()
                    return None
                except OSError:
                    pass
            time.sleep(0.1)
        return "socket not ready in time"

    def log_tail(self, n=5):
        try:
            with open(self.log_path, errors="replace") as f:
                return " | ".join(f.read().splitlines()[-n:])
        except OSError:
            return ""

    def log_count(self, text):
        """How many lines of the daemon's log hold `text`."""
        try:
            with open(self.log_path, errors="replace") as f:
                return sum(text in line for line in f)
        except OSError:
            return 0

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        """SIGTERM (clean shutdown); True when it exited 0."""
        if not self.alive():
            return False
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30) == 0
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return False

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def ticket(level):
    return {"v": 1, "id": "soak", "tenant": "soak", "actions": ["code.execute"],
            "isolation": level, "max_timeout_ms": 8000, "max_memory_bytes": 536870912}


def level_config(level, container_path=None):
    cfg = {"v": 1}
    if level == "container":
        cfg["backends"] = {"container": {"runtime": "crun"}}
        if container_path:
            cfg["backends"]["container"]["path"] = container_path
    elif level == "gvisor":
        cfg["backends"] = {"gvisor": {"runtime": "runsc"}}
    elif level == "microvm":
        cfg["backends"] = {"microvm": {}}
    return cfg


def stop_check(checks, d, what):
    """Stops daemon `d` with SIGTERM and checks it exited 0 (its log's tail when not)."""
    ok = d.stop()
    checks.check(what, ok, "" if ok else d.log_tail())


class Checks:
    def __init__(self):
        self.failed = []

    def check(self, what, ok, detail=""):
        print(("ok   " if ok else "FAIL ") + what + (f": {detail}" if detail else ""),
              flush=True)
        if not ok:
            self.failed.append(what)
        return ok


# --- the soak --------------------------------------------------------------------------------


def run_batch(clients, level, first, count, codes, bad):
    """Runs `count` runs (kinds in turn from index `first`) over the clients, in parallel."""
    lock = threading.Lock()
    nxt = [first]

    def worker(client):
        while True:
            with lock:
                i = nxt[0]
                if i >= first + count:
                    return
                nxt[0] += 1
            kind = KINDS[i % len(KINDS)]
            try:
                r = client.run(ticket(level), request_for(kind, i), timeout=WAIT).to_json()
                why = check_result(level, kind, i, r)
                code = r.get("code")
            except Exception as e:  # noqa: BLE001 - any failure of one run is reported
                why, code = f"run {i} ({kind}): {e!r}", "error"
            with lock:
                codes[(kind, code)] = codes.get((kind, code), 0) + 1
                if why:
                    bad.append(why)

    threads = [threading.Thread(target=worker, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def soak(args, work, checks):
    d = Daemon(args.sandboxctl, work, level_config(args.level), tag="soak")
    why = d.start()
    if not checks.check("daemon starts", why is None, why or ""):
        return
    clients = [Client(d.sock) for _ in range(args.clients)]
    codes, bad = {}, []
    try:
        run_batch(clients, args.level, 0, len(KINDS), codes, bad)  # warm-up: one of each
        checks.check("warm-up runs", not bad, "; ".join(bad[:3]))
        time.sleep(1)
        fds0, rss0 = proc_figures(d.proc.pid)
        codes, bad = {}, []
        t0 = time.monotonic()
        run_batch(clients, args.level, len(KINDS), args.runs, codes, bad)
        secs = time.monotonic() - t0
        checks.check(f"{args.runs} runs end with their codes", not bad,
                     f"{len(bad)} wrong; " + "; ".join(bad[:5]))
        insts = instances(d.state)
        left = settled_leftovers(d.state, d.blob_dir, insts)
        checks.check("host: nothing left", not left, json.dumps(left)[:800])
        # Descriptors come back once asynchronous cleanups end; allow them a few seconds.
        deadline = time.monotonic() + 10
        while True:
            fds1, rss1 = proc_figures(d.proc.pid)
            if fds1 <= fds0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        print(f"daemon after warm-up: {fds0} fds, RSS {rss0 / 2**20:.1f} MiB; after the soak:"
              f" {fds1} fds, RSS {rss1 / 2**20:.1f} MiB")
        checks.check("daemon descriptors back", fds1 <= fds0, f"{fds0} -> {fds1}")
        checks.check("daemon RSS bounded", rss1 <= rss0 + RSS_SLACK,
                     f"{rss0 >> 20} -> {rss1 >> 20} MiB")
        print(f"\n{'kind':<10} {'code':<18} {'runs':>6}")
        for (kind, code), n in sorted(codes.items()):
            print(f"{kind:<10} {code:<18} {n:>6}")
        print(f"{args.runs} runs, level {args.level}, {args.clients} clients: {secs:.1f} s "
              f"({args.runs / secs:.1f} runs/s); leftovers: {'none' if not left else left}\n")
    finally:
        for c in clients:
            c.close()
    stop_check(checks, d, "daemon stops cleanly")


# --- faults ----------------------------------------------------------------------------------


def fault_sigkill(args, work, checks):
    """(a) SIGKILL with runs in flight; restart on the same state dir."""
    d = Daemon(args.sandboxctl, work, level_config(args.level), tag="kill")
    why = d.start()
    if not checks.check("(a) daemon starts", why is None, why or ""):
        return
    insts = instances(d.state)
    c = Client(d.sock)
    futures = [c.submit(ticket(args.level), request_for(k, i))
               for i, k in enumerate(["flood", "timeout", "fork_bomb", "files"] * 2)]
    futures += [c.submit(ticket(args.level), {"runtime": "python3", "timeout_ms": 8000,
                                              "source": "import time\ntime.sleep(30)"})
                for _ in range(4)]
    # Wait until runs are in flight: processes in this daemon's run cgroups.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if "processes" in host_leftovers(d.state, d.blob_dir, insts):
            break
        time.sleep(0.1)
    inflight = host_leftovers(d.state, d.blob_dir, insts)
    checks.check("(a) runs in flight before the kill", "processes" in inflight,
                 f"{len(inflight.get('processes', []))} processes, "
                 f"{len(inflight.get('cgroups', []))} cgroups")
    d.kill()
    c.close()
    after = settled_leftovers(d.state, d.blob_dir, insts, seconds=10)
    checks.check("(a) no process of the runs survives the kill", "processes" not in after,
                 json.dumps(after.get("processes", []))[:300])
    print(f"     left for the next start to reclaim: "
          f"{ {k: len(v) for k, v in after.items()} }")
    why = d.start()
    if not checks.check("(a) restart on the same state dir", why is None, why or ""):
        return
    left = settled_leftovers(d.state, d.blob_dir, insts | instances(d.state))
    checks.check("(a) the restart reclaims everything", not left, json.dumps(left)[:600])
    errors = blob_store_errors(d.blob_dir)
    checks.check("(a) blob store consistent", not errors, "; ".join(errors[:3]))
    with Client(d.sock) as c2:
        r = c2.run(ticket(args.level), request_for("normal", 7), timeout=WAIT).to_json()
    checks.check("(a) serves after the restart", check_result(args.level, "normal", 7, r) is None,
                 r.get("code"))
    stop_check(checks, d, "(a) daemon stops cleanly")


def small_tmpfs(work, name, options, checks, fault):
    """Mounts a tmpfs (`options`, e.g. "size=4m,mode=0700") at work/name; None if it fails."""
    mnt = os.path.join(work, name)
    os.makedirs(mnt)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", mnt]).returncode:
        checks.check(f"({fault}) mount a small tmpfs", False)
        return None
    return mnt


def fill(path):
    """Writes zeros to `path` until the file system is full (ENOSPC)."""
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def fault_disk_full(args, work, checks):
    """(b) blob dir on a 4 MiB tmpfs, filled: clean codes, serving again once space is back."""
    mnt = small_tmpfs(work, "tiny", "size=4m,mode=0700", checks, "b")
    if mnt is None:
        return
    d = None
    try:
        d = Daemon(args.sandboxctl, work, level_config(args.level), tag="full",
                   state=os.path.join(work, "state-full"), blob_dir=os.path.join(mnt, "blobs"))
        why = d.start()
        if not checks.check("(b) daemon starts", why is None, why or ""):
            return
        filler = os.path.join(mnt, "filler")
        fill(filler)
        seen = {}
        with Client(d.sock) as c:
            for i, kind in enumerate(["flood", "files", "normal", "flood", "files", "normal"]):
                try:
                    r = c.run(ticket(args.level), request_for(kind, i), timeout=WAIT).to_json()
                except SandboxError as e:
                    r = {"code": f"error:{e.code}"}
                code = r.get("code")
                drops = sorted({x.get("reason") for x in r.get("files_dropped", [])})
                key = f"{kind}:{code}:{','.join(drops)}"
                seen[key] = seen.get(key, 0) + 1
                # What protocol.md promises: a run still ends `ok`; a stream that could not be
                # stored has no blob (the message says so), an output file is dropped with
                # `store_error`.
                if kind == "flood":
                    ok = (code == "ok" and r["stdout"].get("blob") == ""
                          and "could not be stored" in r.get("message", ""))
                elif kind == "files":
                    ok = code == "ok" and not r.get("files_out") and "store_error" in drops
                else:
                    ok = check_result(args.level, kind, i, r) is None
                checks.check(f"(b) disk full, {kind}: a clean code", ok and d.alive(),
                             f"{code} {drops} {r.get('message', '')}")
            print(f"     with the disk full: {seen}")
            os.unlink(filler)
            for i, kind in enumerate(["normal", "files", "flood"]):
                r = c.run(ticket(args.level), request_for(kind, i), timeout=WAIT).to_json()
                checks.check(f"(b) space back, {kind}",
                             check_result(args.level, kind, i, r) is None, r.get("code"))
        left = settled_leftovers(d.state, d.blob_dir, instances(d.state))
        checks.check("(b) host: nothing left", not left, json.dumps(left)[:600])
        errors = blob_store_errors(d.blob_dir)
        checks.check("(b) blob store consistent", not errors, "; ".join(errors[:3]))
        stop_check(checks, d, "(b) daemon stops cleanly")
    finally:
        if d is not None and d.alive():
            d.kill()
        subprocess.run(["umount", mnt])



def fault_state_full(args, work, checks):
    """(e) state dir on a small tmpfs, filled: clean codes, serving again once space is back."""
    mnt = small_tmpfs(work, "tiny-state", "size=64m,mode=0755", checks, "e")
    if mnt is None:
        return
    d = None
    try:
        d = Daemon(args.sandboxctl, work, level_config(args.level), tag="statefull",
                   state=os.path.join(mnt, "state"), blob_dir=os.path.join(work, "blobs-sf"))
        why = d.start()
        if not checks.check("(e) daemon starts", why is None, why or ""):
            return
        # One run of each kind first, so that whatever a level installs on its first run
        # (helpers, root skeletons) is there before the disk fills.
        with Client(d.sock) as c:
            for i, kind in enumerate(["normal", "files"]):
                c.run(ticket(args.level), request_for(kind, i), timeout=WAIT)
        # Wait until the pools (if any) are refilled, then fill every block.
        time.sleep(2)
        filler = os.path.join(mnt, "filler")
        fill(filler)
        seen = {}
        with Client(d.sock) as c:
            for i, kind in enumerate(["normal", "files", "flood", "normal", "timeout"]):
                try:
                    r = c.run(ticket(args.level), request_for(kind, i), timeout=WAIT).to_json()
                except SandboxError as e:
                    r = {"code": f"error:{e.code}", "message": str(e)}
                code = r.get("code")
                msg = r.get("message", "")
                seen[f"{kind}:{code}"] = seen.get(f"{kind}:{code}", 0) + 1
                # Either the run could be prepared (a pool instance made before the disk
                # filled, or nothing to write) and ends with its own code, or it could not:
                # then `internal`, a message that names no host path, and the daemon lives.
                right = check_result(args.level, kind, i, r) is None
                refused = code == "internal" and mnt not in msg and "/" not in msg
                checks.check(f"(e) state disk full, {kind}: a clean code",
                             (right or refused) and d.alive(), f"{code} {msg[:200]}")
            print(f"     with the state disk full: {seen}")
            os.unlink(filler)
            for i, kind in enumerate(["normal", "files", "flood", "timeout"]):
                r = c.run(ticket(args.level), request_for(kind, i), timeout=WAIT).to_json()
                checks.check(f"(e) space back, {kind}",
                             check_result(args.level, kind, i, r) is None,
                             f"{r.get('code')} {r.get('message', '')[:200]}")
        left = settled_leftovers(d.state, d.blob_dir, instances(d.state))
        checks.check("(e) host: nothing left", not left, json.dumps(left)[:600])
        stop_check(checks, d, "(e) daemon stops cleanly")
    finally:
        if d is not None and d.alive():
            d.kill()
        subprocess.run(["umount", "-l", mnt])

CRUN_FAILS_C = r"""
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char** argv) {
  argv[0] = "@CRUN@";
  int fail = access("@ARMED@", F_OK) == 0;
  for (int i = 1; fail && i < argc; ++i) {
    if (strcmp(argv[i], "run") != 0) continue;
    pid_t pid = fork();
    if (pid == 0) { execv("@CRUN@", argv); _exit(127); }
    usleep(500000);
    kill(pid, SIGKILL);
    waitpid(pid, 0, 0);
    return 1;
  }
  execv("@CRUN@", argv);
  return 127;
}
"""


def fault_oci_runtime(args, work, checks):
    """(c) container level: the OCI runtime binary missing, then one that exits 1 mid-run."""
    crun = shutil.which("crun") or "/usr/bin/crun"
    failing = os.path.join(work, "crun-fails")
    armed = os.path.join(work, "crun-fails.armed")
    # A binary, not a script: the backend executes the runtime by descriptor (fexecve), which
    # a script's interpreter cannot reopen. Until `armed` exists (the backend's start-up
    # self-test passes) it is crun; then a `run` (the container's life) starts crun, kills it
    # after 0.5 s and exits 1.
    src = os.path.join(work, "crun-fails.c")
    with open(src, "w") as f:
        f.write(CRUN_FAILS_C.replace("@CRUN@", crun).replace("@ARMED@", armed))
    cc = subprocess.run(["cc", "-O1", "-o", failing, src], capture_output=True, text=True)
    if not checks.check("(c) build the failing runtime wrapper", cc.returncode == 0, cc.stderr):
        return
    for tag, path in (("missing", os.path.join(work, "no-such-crun")), ("exits-1", failing)):
        d = Daemon(args.sandboxctl, work, level_config("container", path), tag=f"oci-{tag}",
                   state=os.path.join(work, f"state-oci-{tag}"))
        why = d.start()
        if why is not None:
            checks.check(f"(c) runtime {tag}: the daemon refuses to start with a reason",
                         "exited" in why and "exited -" not in why, why)
            continue
        if path == failing:
            open(armed, "w").close()
        # Missing: every run `runtime_unavailable`. Exiting 1 at 0.5 s: a run that ends before
        # keeps its own code (`ok`), one still running then ends `internal` (the runtime died
        # under it: the run machine's own failure, never the program's).
        sleeper = {"runtime": "python3", "source": "import time\ntime.sleep(3)\nprint(1)",
                   "timeout_ms": 8000}
        cases = [("normal", request_for("normal", 0)), ("files", request_for("files", 1)),
                 ("sleep 3 s", sleeper)]
        want = ({"runtime_unavailable"}, {"runtime_unavailable"}, {"runtime_unavailable"}) \
            if path != failing else ({"ok", "internal"}, {"ok", "internal"}, {"internal"})
        codes = {}
        with Client(d.sock) as c:
            for (what, req), w in zip(cases, want):
                try:
                    code = c.run(ticket("container"), req, timeout=WAIT).code
                except SandboxError as e:
                    code = f"error:{e.code}"
                codes[what] = code
                checks.check(f"(c) runtime {tag}, {what}: {' or '.join(sorted(w))}",
                             code in w and d.alive(), code)
        left = settled_leftovers(d.state, d.blob_dir, instances(d.state))
        checks.check(f"(c) runtime {tag}: host: nothing left", not left, json.dumps(left)[:600])
        stop_check(checks, d, f"(c) runtime {tag}: daemon stops cleanly")


def fault_qemu_killed(args, work, checks):
    """(d) microvm level: the run's QEMU killed with SIGKILL mid-run."""
    d = Daemon(args.sandboxctl, work, level_config("microvm"), tag="qemu",
               state=os.path.join(work, "state-qemu"))
    why = d.start()
    if not checks.check("(d) daemon starts", why is None, why or ""):
        return
    insts = instances(d.state)
    with Client(d.sock) as c:
        # A whole short run's time bounds the boot: the kill comes after it, in the program.
        t0 = time.monotonic()
        r = c.run(ticket("microvm"), request_for("normal", 2), timeout=WAIT).to_json()
        boot = time.monotonic() - t0
        checks.check("(d) a first run ends ok", check_result("microvm", "normal", 2, r) is None,
                     f"{r.get('code')} in {boot:.1f} s")
        started = d.log_count("setup breakdown")
        future = c.submit(ticket("microvm"), {"runtime": "python3", "timeout_ms": 8000,
                                              "source": "import time\ntime.sleep(6)\nprint(1)"})
        qemu = None
        deadline = time.monotonic() + 60
        while qemu is None and time.monotonic() < deadline and not future.done():
            for entry in host_leftovers(d.state, d.blob_dir, insts).get("processes", []):
                pid = entry.split()[0]
                try:
                    with open(f"/proc/{pid}/comm") as f:
                        if f.read().startswith("qemu"):
                            qemu = int(pid)
                except OSError:
                    pass
            time.sleep(0.1)
        if not checks.check("(d) the run's QEMU found", qemu is not None):
            return
        # The program runs once the host logs the run's setup breakdown (-v); it sleeps 6 s.
        while d.log_count("setup breakdown") == started and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        os.kill(qemu, signal.SIGKILL)
        try:
            r = future.result(WAIT).to_json()
            code = r.get("code")
        except Exception as e:  # noqa: BLE001 - reported as the check's detail
            r, code = {}, repr(e)
        checks.check("(d) QEMU killed: the run ends `internal`", code == "internal" and d.alive(),
                     f"{code} {r.get('message', '')}")
        r = c.run(ticket("microvm"), request_for("normal", 3), timeout=WAIT).to_json()
        checks.check("(d) the next run ends ok", check_result("microvm", "normal", 3, r) is None,
                     r.get("code"))
    left = settled_leftovers(d.state, d.blob_dir, insts | instances(d.state))
    checks.check("(d) host: nothing left", not left, json.dumps(left)[:600])
    stop_check(checks, d, "(d) daemon stops cleanly")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--level", choices=["process", "container", "gvisor", "microvm"],
                   default="process")
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--faults", action="store_true", help="then inject the faults")
    p.add_argument("--faults-only", action="store_true", help="skip the soak")
    p.add_argument("--sandboxctl", default=os.path.join(REPO, "build/dev/bin/sandboxctl"))
    p.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    p.add_argument("--skip-unavailable", action="store_true",
                   help="exit 77 (skipped) when not root, unless CI=true "
                        "or SANDBOX_MUST_WORK=1")
    args = p.parse_args()
    if args.runs < 1 or args.clients < 1:
        p.error("--runs and --clients must be at least 1")
    if not os.access(args.sandboxctl, os.X_OK):
        p.error(f"{args.sandboxctl}: not an executable (build it, or pass --sandboxctl)")
    must_work = os.environ.get("CI") == "true" or os.environ.get("SANDBOX_MUST_WORK") == "1"
    missing = None
    if os.geteuid() != 0:
        missing = "needs root (sandbox uids, cgroups, tmpfs)"
    if missing:
        print(f"soak: {missing}", file=sys.stderr)
        return 77 if args.skip_unavailable and not must_work else 1
    work = tempfile.mkdtemp(prefix="sandbox-soak-")
    os.chmod(work, 0o755)
    checks = Checks()
    t0 = time.monotonic()
    # SIGTERM (a timeout(1), say) unwinds like ^C, so that the daemons are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if not args.faults_only:
            soak(args, work, checks)
        if args.faults or args.faults_only:
            fault_sigkill(args, work, checks)
            fault_disk_full(args, work, checks)
            fault_state_full(args, work, checks)
            if args.level == "container":
                fault_oci_runtime(args, work, checks)
            else:
                print("(c) OCI runtime faults: container level only (--level container)")
            if args.level == "microvm":
                fault_qemu_killed(args, work, checks)
            else:
                print("(d) QEMU killed mid-run: microvm level only (--level microvm)")
    finally:
        for d in DAEMONS:
            if d.alive():
                d.stop()
        if args.keep or checks.failed:
            print(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{len(checks.failed)} failed checks; {time.monotonic() - t0:.1f} s in all")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
