// The `config` and `go` payloads (init_messages.hpp).
#include "core/run/init_messages.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "sandbox/backend_options.hpp"

namespace sandbox::detail {

namespace ip = init_protocol;

sandbox_size_set sandbox_sizes(const run_job& job) {
  const auto& req = job.admitted.request;
  const std::uint64_t mem = req.memory_limit_bytes;
  // tmpfs treats size=0 as "unlimited": every size has a floor.
  auto tmpfs_size = [](std::uint64_t want, std::uint64_t cap) {
    return std::max<std::uint64_t>(std::min(want, cap), 64 * 1024);
  };
  sandbox_size_set s;
  s.tmp_bytes = tmpfs_size(job.policy.tmp_bytes, mem / 8);
  s.home_bytes = tmpfs_size(job.policy.home_bytes, mem / 8);
  s.shm_bytes = tmpfs_size(job.policy.shm_bytes, mem / 8);
  s.out_bytes = tmpfs_size(req.files_out.max_bytes + (1 << 20), mem / 4);
  s.tmpfs_inodes = job.policy.tmpfs_inodes;
  s.out_inodes = std::max<std::uint32_t>(req.files_out.max_files * 2, 64) + 16;
  s.nofile = job.policy.max_open_files;
  s.fsize_bytes = std::uint64_t{1} << 30;
  return s;
}

bool is_network_granted(const run_job& job, bool selftest) noexcept {
  return !selftest && job.admitted.request.network && !job.admitted.request.egress.empty();
}

std::vector<std::string> base_env(std::string_view input_name) {
  return {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/home/sandbox", "LANG=C.UTF-8",
          "SANDBOX_INPUT_DIR=/sandbox/" + std::string(input_name),
          "SANDBOX_OUTPUT_DIR=/sandbox/out"};
}

std::string config_payload(const run_job& job, const config_params& p) {
  ip::config_writer w;
  w.add("mode", p.selftest ? "selftest" : "run");
  w.add("input_name", p.input_name);
  w.add("source_name", p.selftest ? std::string("probe") : job.runtime.source_name);
  w.add("uid", std::uint64_t{p.uid});
  w.add("gid", std::uint64_t{p.uid});
  w.add("userns", p.userns ? "1" : "0");
  const auto sizes = sandbox_sizes(job);
  w.add("tmp_bytes", sizes.tmp_bytes);
  w.add("home_bytes", sizes.home_bytes);
  w.add("shm_bytes", sizes.shm_bytes);
  w.add("out_bytes", sizes.out_bytes);
  w.add("tmpfs_inodes", sizes.tmpfs_inodes);
  w.add("out_inodes", sizes.out_inodes);
  w.add("nofile", sizes.nofile);
  w.add("fsize_bytes", sizes.fsize_bytes);
  if (job.prestart && !p.selftest) {
    // A pre-started instance: the interpreter, the environment the host knows ahead (the
    // request's own variables come with `go`), and the modules to import.
    w.add("prestart", job.runtime.argv.empty() ? std::string() : job.runtime.argv[0]);
    for (const auto& e : base_env(p.input_name)) w.add("prestart_env", e);
    for (const auto& m : *job.prestart) w.add("preload", m);
    w.add("prestart_kind",
          prestart_kind_of(job.runtime) == prestart_kind::node ? "node" : "python");
  }
  // (Entries are NUL-terminated "key=value" strings: the launcher's follow as they are.)
  return w.bytes() + std::string(p.launcher_entries);
}

std::string go_payload(const run_job& job, const go_params& p) {
  const auto& req = job.admitted.request;
  ip::config_writer w;
  const std::string source_path = "/sandbox/" + job.runtime.source_name;
  if (p.selftest) {
    w.add("argv", p.probe_path);
    w.add("argv", "--probe");
    w.add("argv", std::to_string(p.uid));
    // gVisor's procfs shows PID 1's environ (the probe is told); a microVM's is Linux's.
    if (p.probe_in_gvisor) w.add("argv", "gvisor");
  } else if (p.session) {
    for (const auto& a : job.runtime.argv) w.add("argv", a);  // the entry's, as is
  } else {
    for (const auto& a : job.runtime.argv) w.add("argv", a == "{source}" ? source_path : a);
    // A registered tool's standard input: the staged file, opened read-only as fd 0.
    if (job.stdin_bytes) w.add("stdin", source_path);
  }
  for (const auto& e : base_env(p.input_name)) w.add("env", e);
  if (p.network) {
    // The proxy, for the clients that honour the usual variables (curl, urllib, requests,
    // pip, the node image's preload). Ours come first: the first of equal names wins.
    // sandbox-init makes its listener unless the launcher already did.
    if (!p.proxy_served) w.add("egress_proxy", std::uint64_t{ip::egress_proxy_port});
    const std::string url = fmt::format("http://127.0.0.1:{}", ip::egress_proxy_port);
    for (const char* n : {"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"}) {
      w.add("env", std::string(n) + "=" + url);
    }
    w.add("env", "NO_PROXY=localhost,127.0.0.1,::1");
    w.add("env", "no_proxy=localhost,127.0.0.1,::1");
    // Node's http, https and fetch ignore those variables: the preload makes them use it.
    if (!p.node_proxy_preload_path.empty()) {
      w.add("env", "NODE_OPTIONS=--require " + std::string(p.node_proxy_preload_path));
    }
    // A launcher without a file of it: sandbox-init writes it where that path says.
    if (!p.node_proxy_preload.empty()) w.add("node_proxy_preload", p.node_proxy_preload);
    // Host-held secrets: only their per-run placeholders, never a value (sandbox/secrets.hpp).
    for (const auto& s : job.secrets) w.add("env", secret_env_name(s.name) + "=" + s.placeholder);
    // Its HTTPS is terminated by the proxy with the run's CA: that CA is all the program
    // needs to trust (the proxy verifies the origins against the host's store).
    if (!p.run_ca_pem.empty()) {
      w.add("run_ca_pem", p.run_ca_pem);
      for (const char* n :
           {"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"}) {
        w.add("env", std::string(n) + "=" + ip::run_ca_path);
      }
    }
  }
  for (const auto& [k, v] : req.env) {
    // A network run's NODE_OPTIONS is ours (the proxy preload). The proxy variables need no
    // such care: admission refuses them in any request (env_rules.hpp, is_reserved_env).
    if (p.network && k == "NODE_OPTIONS") continue;
    w.add("env", k + "=" + v);
  }
  return w.bytes();
}

std::string init_packet(ip::msg type, std::uint32_t a, std::string_view payload) {
  const ip::init_header h{type, a, 0};
  std::string packet(reinterpret_cast<const char*>(&h), sizeof h);
  packet.append(payload);
  return packet;
}

const char* describe_step(ip::step s) noexcept {
  switch (s) {
    case ip::step::config:
      return "reading the configuration";
    case ip::step::cgroup_namespace:
      return "a cgroup namespace";
    case ip::step::mount_private:
      return "a private mount namespace";
    case ip::step::root_tmpfs:
      return "mounting tmpfs";
    case ip::step::rootfs_bind:
      return "read-only bind mounts of the image";
    case ip::step::proc:
      return "mounting a fresh /proc in the new pid namespace";
    case ip::step::dev:
      return "a minimal /dev (bind mounts of host device nodes)";
    case ip::step::tmpfs:
      return "size-capped tmpfs for /tmp and $HOME";
    case ip::step::inputs:
      return "a read-only bind of the inputs";
    case ip::step::outputs:
      return "the output tmpfs";
    case ip::step::source:
      return "a read-only bind of the source";
    case ip::step::etc_files:
      return "replacing /etc/resolv.conf, hosts, hostname";
    case ip::step::hostname:
      return "a UTS namespace";
    case ip::step::loopback:
      return "bringing up loopback in the new network namespace";
    case ip::step::dns_socket:
      return "binding the DNS sink on the run's loopback";
    case ip::step::pivot_root:
      return "pivot_root into the new root";
    case ip::step::remount_readonly:
      return "remounting the new root read-only";
    case ip::step::fork:
      return "starting the program's process";
    case ip::step::rlimits:
      return "resource limits";
    case ip::step::drop_privileges:
      return "dropping uid, gid and capabilities";
    case ip::step::no_new_privs:
      return "no_new_privs";
    case ip::step::seccomp:
      return "loading the seccomp filter with user notification";
    case ip::step::exec:
      return "executing the interpreter";
    case ip::step::drop_init_privileges:
      return "dropping sandbox-init's own capabilities";
    case ip::step::egress_proxy:
      return "the egress proxy's listener on the run's loopback";
    case ip::step::run_ca:
      return "writing the run's CA certificate";
    case ip::step::prestart:
      return "pre-starting the interpreter and importing its preload list";
    case ip::step::node_proxy:
      return "writing the Node proxy preload";
  }
  return "an unknown step";
}

}  // namespace sandbox::detail
