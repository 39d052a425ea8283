#!/usr/bin/python3
"""Checks the deployment manifests in deploy/ against each other and against the real daemon.

    check_manifests.py <sandboxctl> <source dir>

Parses every manifest (Kubernetes YAML, the Nomad job as JSON and as HCL, the systemd units)
and fails, naming the file and the field, when: a document lacks the kind/apiVersion this
project ships; the daemon's arguments name a flag `sandboxctl serve --help` does not list (so
a renamed flag breaks this test); the socket path differs between the manifests and
docs/deployment.md; the advertised run slots differ from --max-running; a privilege the
daemon needs (or a host namespace it must not have) is missing; the HCL and JSON jobs differ.
Needs python3-yaml (tools/setup.sh). Exit 0: all good; 1: problems (listed).
"""
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

SOCKET = "/run/agent-sandbox/serve.sock"
problems = []


def problem(where, what):
    problems.append(f"{where}: {what}")


def serve_flags(sandboxctl):
    out = subprocess.run([sandboxctl, "serve", "--help"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    flags = set(re.findall(r"^\s+(?:-\w \[ )?(--[a-z][a-z0-9-]*)", out, re.M))
    if "--socket" not in flags or "--max-running" not in flags:
        sys.exit(f"check_manifests: cannot read the flags of `sandboxctl serve --help`:\n{out}")
    return flags


def value_of(args, flag):
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None


def check_serve_args(where, args, flags):
    """args: everything after the sandboxctl binary."""
    if not args or args[0] != "serve":
        problem(where, f"the daemon's command is not `sandboxctl serve`: {args}")
        return
    for a in args[1:]:
        if a.startswith("--") and a.split("=", 1)[0] not in flags:
            problem(where, f"`sandboxctl serve` has no flag {a} (see sandboxctl serve --help)")
    modes = [m for m in ("--socket", "--stdio", "--systemd-socket") if m in args]
    if len(modes) != 1:
        problem(where, f"give exactly one of --socket, --stdio, --systemd-socket, not {modes}")
    if "--socket" in args and value_of(args, "--socket") != SOCKET:
        problem(where, f"--socket is {value_of(args, '--socket')}, not {SOCKET}")
    if "--cgroup-delegated" not in args:
        problem(where, "the daemon must take over its own cgroup (--cgroup-delegated)")
    if value_of(args, "--max-running") is None:
        problem(where, "no --max-running: size the node's run slots explicitly")


def check_kubernetes(src, flags):
    path = src / "deploy/kubernetes/agent-sandbox-daemonset.yaml"
    docs = list(yaml.safe_load_all(path.read_text()))
    want = {("Namespace", "v1"), ("ServiceAccount", "v1"), ("DaemonSet", "apps/v1"),
            ("ClusterRole", "rbac.authorization.k8s.io/v1"),
            ("ClusterRoleBinding", "rbac.authorization.k8s.io/v1")}
    got = {(d.get("kind"), d.get("apiVersion")) for d in docs if d}
    for kind, api in sorted(want - got):
        problem(path.name, f"no {kind} ({api})")
    for kind, api in sorted(got - want):
        problem(path.name, f"unexpected document {kind} ({api})")
    ds = next((d for d in docs if d and d.get("kind") == "DaemonSet"), None)
    if ds is None:
        return
    where = f"{path.name}: DaemonSet"
    spec = ds["spec"]
    tmpl = spec["template"]
    labels = tmpl["metadata"].get("labels", {})
    for k, v in spec["selector"]["matchLabels"].items():
        if labels.get(k) != v:
            problem(where, f"selector {k}={v} does not match the pod template's labels")
    pod = tmpl["spec"]
    for host_ns in ("hostPID", "hostIPC", "hostNetwork"):
        if pod.get(host_ns, False):
            problem(where, f"{host_ns} must stay false: the daemon does not need it")
    daemon = next((c for c in pod["containers"] if c["name"] == "daemon"), None)
    if daemon is None:
        problem(where, "no container named daemon")
        return
    cmd = daemon.get("command", []) + daemon.get("args", [])
    if not cmd or not cmd[0].endswith("/sandboxctl"):
        problem(where, f"the daemon container does not run sandboxctl: {cmd[:1]}")
    check_serve_args(where, cmd[1:], flags)
    sc = daemon.get("securityContext", {})
    if sc.get("privileged") is not True:
        problem(where, "the daemon container must be privileged (docs/deployment.md says why)")
    if sc.get("runAsUser") != 0:
        problem(where, "the daemon must run as root (runAsUser: 0)")
    limits = daemon.get("resources", {}).get("limits", {})
    if "memory" not in limits:
        problem(where, "no memory limit: runs are charged to the daemon's container")
    if pod.get("terminationGracePeriodSeconds", 30) < 15:
        problem(where, "terminationGracePeriodSeconds below the daemon's 10 s shutdown grace")
    # The socket: the mount holding it is the hostPath the agent pods mount.
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    sock_dir = str(Path(SOCKET).parent)
    mount = next((m for m in daemon.get("volumeMounts", []) if m["mountPath"] == sock_dir), None)
    if mount is None:
        problem(where, f"nothing mounted at {sock_dir} (the socket's directory)")
    elif vols.get(mount["name"], {}).get("hostPath", {}).get("path") != sock_dir:
        problem(where, f"{sock_dir} is not the hostPath {sock_dir}")
    # Node capacity: the advertised slots are --max-running.
    slots = None
    for c in pod.get("initContainers", []):
        m = re.search(r'"agent-sandbox\.dev/runs"\s*:\s*"(\d+)"', " ".join(c.get("command", [])))
        if m:
            slots = m.group(1)
    if slots is None:
        problem(where, "no init container advertises agent-sandbox.dev/runs")
    elif slots != value_of(cmd, "--max-running"):
        problem(where, f"advertises {slots} runs but --max-running is {value_of(cmd, '--max-running')}")
    # The example agent pod: the same socket and one slot.
    agent_path = src / "deploy/kubernetes/example-agent-pod.yaml"
    agent = yaml.safe_load(agent_path.read_text())
    if (agent.get("kind"), agent.get("apiVersion")) != ("Pod", "v1"):
        problem(agent_path.name, "not a v1 Pod")
    a_vols = {v["name"]: v for v in agent["spec"].get("volumes", [])}
    c = agent["spec"]["containers"][0]
    if c.get("resources", {}).get("limits", {}).get("agent-sandbox.dev/runs") != "1":
        problem(agent_path.name, "the agent does not ask for one agent-sandbox.dev/runs")
    am = next((m for m in c.get("volumeMounts", []) if m["mountPath"] == sock_dir), None)
    if am is None or a_vols.get(am["name"], {}).get("hostPath", {}).get("path") != sock_dir:
        problem(agent_path.name, f"does not mount the hostPath {sock_dir}")
    gid = daemon.get("securityContext", {}).get("runAsGroup")
    if gid not in agent["spec"].get("securityContext", {}).get("supplementalGroups", []):
        problem(agent_path.name, f"not in the socket's group {gid} (supplementalGroups)")


def hcl_args(text):
    """The `args = [...]` list and `command` of the HCL job (a flat list of strings)."""
    m = re.search(r"\bargs\s*=\s*\[(.*?)\]", text, re.S)
    c = re.search(r'\bcommand\s*=\s*"([^"]*)"', text)
    t = re.search(r'\btype\s*=\s*"([^"]*)"', text)
    d = re.search(r'\bdriver\s*=\s*"([^"]*)"', text)
    return (re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)) if m else None,
            c and c.group(1), t and t.group(1), d and d.group(1))


def check_nomad(src, flags):
    jpath = src / "deploy/nomad/agent-sandbox.nomad.json"
    hpath = src / "deploy/nomad/agent-sandbox.nomad.hcl"
    job = json.loads(jpath.read_text()).get("Job", {})
    where = jpath.name
    if job.get("Type") != "system":
        problem(where, "Job.Type must be system (one daemon per node)")
    tasks = [t for g in job.get("TaskGroups", []) for t in g.get("Tasks", [])]
    if len(tasks) != 1:
        problem(where, f"expected one task, found {len(tasks)}")
        return
    task = tasks[0]
    cfg = task.get("Config", {})
    if task.get("Driver") != "raw_exec" or not cfg.get("command", "").endswith("/sandboxctl"):
        problem(where, "the task must run sandboxctl with raw_exec")
    check_serve_args(where, cfg.get("args", []), flags)
    if task.get("KillTimeout", 0) < 15 * 10**9:
        problem(where, "KillTimeout below the daemon's 10 s shutdown grace")
    if "MemoryMB" not in task.get("Resources", {}):
        problem(where, "no Resources.MemoryMB: runs are charged to the task")
    args, command, jtype, driver = hcl_args(hpath.read_text())
    if args != cfg.get("args") or command != cfg.get("command") or jtype != job.get("Type") or \
            driver != task.get("Driver"):
        problem(hpath.name, "differs from agent-sandbox.nomad.json (command, args, type, driver)")


def unit_values(text):
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            k, v = line.split("=", 1)
            out.setdefault(k.strip(), []).append(v.strip())
    return out


def check_systemd(src, flags):
    svc = unit_values((src / "deploy/systemd/agent-sandbox.service").read_text())
    sock = unit_values((src / "deploy/systemd/agent-sandbox.socket").read_text())
    where = "agent-sandbox.service"
    for key, want in (("Type", "notify"), ("Delegate", "yes"), ("OOMPolicy", "continue"),
                      ("KillMode", "mixed")):
        if svc.get(key) != [want]:
            problem(where, f"{key}= must be {want}, is {svc.get(key)}")
    cmd = shlex.split(svc.get("ExecStart", [""])[0])
    if not cmd or not cmd[0].endswith("/sandboxctl"):
        problem(where, "ExecStart= does not run sandboxctl")
    else:
        check_serve_args(where, cmd[1:], flags)
        if "--systemd-socket" not in cmd:
            problem(where, "ExecStart= must serve the socket unit's socket (--systemd-socket)")
    if sock.get("ListenStream") != [SOCKET]:
        problem("agent-sandbox.socket", f"ListenStream= is {sock.get('ListenStream')}, not {SOCKET}")
    if sock.get("Accept", ["no"]) != ["no"]:
        problem("agent-sandbox.socket", "Accept= must be no (one daemon for every connection)")


def check_docs(src):
    doc = (src / "docs/deployment.md").read_text()
    if SOCKET not in doc:
        problem("docs/deployment.md", f"does not name the socket {SOCKET}")
    for f in ("deploy/systemd/agent-sandbox.service", "deploy/kubernetes/agent-sandbox-daemonset.yaml",
              "deploy/nomad/agent-sandbox.nomad.hcl"):
        if f not in doc:
            problem("docs/deployment.md", f"does not link {f}")
    for page in ("README.md", "docs/operations.md"):
        if "deployment.md" not in (src / page).read_text():
            problem(page, "does not link docs/deployment.md")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sandboxctl, src = sys.argv[1], Path(sys.argv[2])
    flags = serve_flags(sandboxctl)
    for check in (check_kubernetes, check_nomad, check_systemd):
        try:
            check(src, flags)
        except (KeyError, TypeError, IndexError, ValueError, yaml.YAMLError) as e:
            problem(check.__name__, f"cannot read the manifest: {type(e).__name__}: {e}")
    check_docs(src)
    for p in problems:
        print(f"check_manifests: {p}")
    print(f"check_manifests: {len(problems)} problem(s); serve has {len(flags)} flags")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
