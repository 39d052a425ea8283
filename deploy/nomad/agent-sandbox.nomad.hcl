# One agent-sandbox daemon per client node (docs/deployment.md, "Nomad"): a system job, the
# raw_exec driver (sandboxctl installed on the node; the daemon needs root and builds every
# run's sandbox itself, so it runs on the host, not in a container). Nomad puts the task in
# a cgroup of its own; --cgroup-delegated moves the daemon into <it>/daemon and runs go
# under <it>/runs. Agent tasks reach it through /run/agent-sandbox/serve.sock on the node.
# Placement across nodes is Nomad's; caps and the queue stay per node, in the daemon.
#
# The same job as JSON (for `nomad job run -json`, and checked by tests/deploy):
# agent-sandbox.nomad.json. Keep the two in step.
job "agent-sandbox" {
  type        = "system"
  datacenters = ["*"]

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }

  group "daemon" {
    restart {
      attempts = 10
      interval = "5m"
      delay    = "2s"
      mode     = "delay"
    }

    task "serve" {
      driver = "raw_exec"

      config {
        command = "/usr/local/bin/sandboxctl"
        args = [
          "serve",
          "--socket", "/run/agent-sandbox/serve.sock",
          "--cgroup-delegated",
          "--state-dir", "/var/lib/agent-sandbox/state",
          "--max-running", "8",
          "--tenant-max-running", "4",
          "--max-queued", "256",
        ]
      }

      # The daemon cancels every run (killed, confirmed dead) and answers clients on SIGTERM.
      kill_signal  = "SIGTERM"
      kill_timeout = "45s"

      # Runs are children of this task's cgroup: memory must hold --max-running runs at
      # their largest limit plus the daemon (8 x 1 GiB + 1 GiB).
      resources {
        cpu    = 1000
        memory = 9216
      }
    }
  }
}
