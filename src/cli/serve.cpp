// `sandboxctl serve`: parses the daemon's flags and runs it (the daemon itself is the
// service room, src/service; docs/protocol.md, "Service mode").
//
// Exit status: 0 after a clean shutdown, 1 when the daemon cannot start (an unusable
// inherited socket or delegated cgroup included), 2 for usage errors (including a bad
// --config or --trusted-keys, reported without the pointer to --help).
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>

#include "cli/cli_util.hpp"
#include "cli/verbs.hpp"
#include "sandbox/receipt.hpp"
#include "service/service.hpp"
#include "service/systemd.hpp"

namespace sandboxctl {

int cmd_serve(const std::vector<std::string>& args) {
  common_flags c;
  std::string socket;
  std::vector<std::string> trusted_keys;
  std::string receipt_key;
  bool stdio = false, help = false, systemd_socket = false, cgroup_delegated = false;
  // Numbers are read as text and checked strictly below: "-1" must not wrap to 2^32-1.
  std::string max_running, max_queued, tenant_max_running, tenant_max_queued, queue_deadline_ms;
  std::string max_sessions, client_max_sessions;
  std::string max_session_slots, tenant_max_session_slots;  // scheduler slots for sessions
  po::options_description d("serve options");
  d.add_options()("socket", po::value(&socket), "listen on this unix socket (mode 0660)")(
      "stdio", po::bool_switch(&stdio), "serve one client on stdin/stdout")(
      "systemd-socket", po::bool_switch(&systemd_socket),
      "serve the listening unix socket systemd passed (socket activation: $LISTEN_FDS=1, "
      "descriptor 3; deploy/systemd/agent-sandbox.socket)")(
      "cgroup-delegated", po::bool_switch(&cgroup_delegated),
      "take over the cgroup the daemon was started in (systemd Delegate=yes, cgroup v2): the "
      "daemon moves into <it>/daemon, runs go under <it>/runs; excludes --cgroup-parent")(
      "state-dir", po::value(&c.state_dir), "per-host state directory")(
      "image-dir", po::value(&c.image_dir), "image store directory")(
      "blob-dir", po::value(&c.blob_dir), "blob store directory")(
      "cgroup-parent", po::value(&c.cgroup_parent), "parent cgroup of runs")(
      "config", po::value(&c.config_path),
      "host configuration JSON: scheduler classes, warm pools, policy (docs/operations.md); "
      "the flags below override it")("max-running", po::value(&max_running),
                                     "runs starting or running at once, host-wide")(
      "max-queued", po::value(&max_queued), "runs queued at once, host-wide")(
      "tenant-max-running", po::value(&tenant_max_running), "runs of one tenant at once")(
      "tenant-max-queued", po::value(&tenant_max_queued), "queued runs of one tenant")(
      "queue-deadline-ms", po::value(&queue_deadline_ms), "longest wait for a slot")(
      "max-sessions", po::value(&max_sessions), "sessions open at once, all clients (default 64)")(
      "max-session-slots", po::value(&max_session_slots),
      "scheduler slots sessions may hold, host-wide (default: half of max-running)")(
      "tenant-max-session-slots", po::value(&tenant_max_session_slots),
      "scheduler slots one tenant's sessions may hold (default: half of tenant-max-running)")(
      "client-max-sessions", po::value(&client_max_sessions),
      "sessions one client may have open at once (default 8)")(
      "trusted-keys", po::value(&trusted_keys),
      "accept only tickets signed by these Ed25519 public keys: a <kid>.pub.pem file, or a "
      "directory of them (repeatable)")(
      "receipt-key", po::value(&receipt_key),
      "sign an execution receipt for every run with this Ed25519 private key (<kid>.pem, as "
      "`ticket keygen` writes it); results then carry \"receipt\"")(
      "verbose,v", po::bool_switch(&c.verbose), "host log lines on stderr")(
      "help,h", po::bool_switch(&help), "this text");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(d).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "sandboxctl: serve: " << e.what() << "\n(see sandboxctl serve --help)\n";
    return exit_usage;
  }
  // Socket-activation variables are for this process only: unset at once, whatever the
  // flags, so nothing the daemon starts ever inherits them (sd_listen_fds(3)).
  const auto listen_env = sandbox::service::take_listen_env();
  if (help) {
    std::cout << "usage: sandboxctl serve (--socket PATH | --stdio | --systemd-socket) "
                 "[options]\n\n"
                 "Serves the JSON protocol, one request per line (docs/protocol.md,\n"
                 "\"Service mode\"). Without --trusted-keys, clients' tickets are trusted: the\n"
                 "socket's permissions (0660) are the access control; with it, only signed\n"
                 "tickets that verify are accepted. SIGINT/SIGTERM: cancel every run, remove\n"
                 "the socket, exit 0.\n\n"
              << d;
    return exit_ok;
  }
  auto usage = [](const std::string& m) {
    std::cerr << "sandboxctl: serve: " << m << "\n(see sandboxctl serve --help)\n";
    return exit_usage;
  };
  // A bad configuration or key file is not a bad command line: exit 2 as documented, but
  // without the pointer to --help, and with a plain reason instead of the stream library's.
  auto bad_file = [](const std::string& m) {
    std::cerr << "sandboxctl: serve: " << m << "\n";
    return exit_usage;
  };
  if (int(stdio) + int(!socket.empty()) + int(systemd_socket) != 1) {
    return usage("give one of --socket PATH, --stdio or --systemd-socket");
  }
  if (cgroup_delegated && !c.cgroup_parent.empty()) {
    return usage("--cgroup-delegated chooses the runs' cgroup itself: drop --cgroup-parent");
  }
  constexpr std::uint32_t u32_max = std::numeric_limits<std::uint32_t>::max();
  // The same ranges as the configuration file's fields (docs/operations.md).
  auto u32 = [&](const char* option, const std::string& text, std::uint32_t min) {
    return vm.count(option) != 0 ? std::optional<std::uint32_t>(
                                       parse_number<std::uint32_t>(option, text, min, u32_max))
                                 : std::nullopt;
  };
  std::optional<std::uint32_t> max_running_n, max_queued_n, tenant_max_running_n,
      tenant_max_queued_n;
  std::optional<std::int64_t> queue_deadline_n;
  std::optional<std::uint32_t> max_sessions_n, client_max_sessions_n;
  std::optional<std::uint32_t> max_session_slots_n, tenant_max_session_slots_n;
  try {
    max_session_slots_n = u32("max-session-slots", max_session_slots, 0);
    tenant_max_session_slots_n = u32("tenant-max-session-slots", tenant_max_session_slots, 0);
    max_sessions_n = u32("max-sessions", max_sessions, 0);
    client_max_sessions_n = u32("client-max-sessions", client_max_sessions, 0);
    max_running_n = u32("max-running", max_running, 0);
    max_queued_n = u32("max-queued", max_queued, 0);
    tenant_max_running_n = u32("tenant-max-running", tenant_max_running, 1);
    tenant_max_queued_n = u32("tenant-max-queued", tenant_max_queued, 0);
    if (vm.count("queue-deadline-ms") != 0) {
      queue_deadline_n =
          parse_number<std::int64_t>("queue-deadline-ms", queue_deadline_ms, 1, max_duration_ms);
    }
  } catch (const usage_error& e) {
    return usage(e.what());
  }

  sandbox::service::serve_options o;
  o.stdio = stdio;
  o.cgroup_delegated = cgroup_delegated;
  if (!socket.empty()) o.socket_path = std::filesystem::absolute(socket);
  if (systemd_socket) {
    auto taken = sandbox::service::take_activated_socket(listen_env, ::getpid());
    if (auto* why = std::get_if<std::string>(&taken)) {
      // Not a usage error: the daemon cannot start with what it was given (exit 1).
      std::cerr << "sandboxctl: serve: " << *why << "\n";
      return exit_fail;
    }
    auto& s = std::get<sandbox::service::activated_socket>(taken);
    o.listen_fd = s.fd;
    o.listen_description = s.address.empty() ? "descriptor 3" : display_name(s.address);
    if (!s.name.empty()) o.listen_description += " (" + s.name + ")";
  } else if (listen_env.listen_fds && listen_env.listen_pid &&
             *listen_env.listen_pid == std::to_string(::getpid())) {
    std::cerr << "sandboxctl: serve: socket-activated ($LISTEN_FDS) but --systemd-socket was "
                 "not given: the passed socket is not served\n";
  }
  o.runtime = store_options_of(c, sandbox::log_level::warning);
  if (!receipt_key.empty()) {
    auto signer = sandbox::receipt_signer::load(std::filesystem::absolute(receipt_key));
    if (!signer) {
      return usage(
          fmt::format("--receipt-key {}: {}", quote_name(receipt_key), signer.error().message()));
    }
    o.runtime.receipt_signer = std::make_shared<const sandbox::receipt_signer>(std::move(*signer));
  }
  if (!c.config_path.empty()) {
    if (auto why = load_config(c.config_path, o.runtime); !why.empty()) return bad_file(why);
  }
  if (auto why = load_trusted_keys(trusted_keys, o.trusted_keys); !why.empty()) {
    return bad_file(why);
  }
  if (max_sessions_n) o.limits.max_sessions = *max_sessions_n;
  if (client_max_sessions_n) o.limits.max_sessions_per_client = *client_max_sessions_n;
  auto& s = o.runtime.scheduler;
  if (max_running_n) s.max_running = *max_running_n;
  if (max_queued_n) s.max_queued = *max_queued_n;
  if (tenant_max_running_n) s.default_class.max_running = *tenant_max_running_n;
  if (tenant_max_queued_n) s.default_class.max_queued = *tenant_max_queued_n;
  if (max_session_slots_n) s.max_session_slots = *max_session_slots_n;
  if (tenant_max_session_slots_n) s.default_class.max_session_slots = *tenant_max_session_slots_n;
  if (queue_deadline_n) {
    s.default_class.queue_deadline = std::chrono::milliseconds(*queue_deadline_n);
  }
  if (!stdio) {
    o.on_ready = [&o] {
      std::cerr << "sandboxctl: serving on "
                << (o.listen_fd >= 0 ? o.listen_description + " (socket activation)"
                                     : display_name(o.socket_path.string()))
                << "\n";
    };
  }
  auto end = sandbox::service::run_service(o);
  if (!end.error.empty()) std::cerr << "sandboxctl: serve: " << end.error << "\n";
  return end.status;
}

}  // namespace sandboxctl
