// The first half of a run's setup (run_setup.hpp).
#include "core/run/run_setup.hpp"

#include <errno.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/run/init_messages.hpp"
#include "core/run/workspace.hpp"
#include "embedded/node_proxy_preload.hpp"
#include "sandbox/error.hpp"
#include "sys/random.hpp"

namespace sandbox::detail {

launch_outcome run_setup::launch(const host& h, run_resources& res, const run_job& job,
                                 bool selftest, bool network, session_stdio* stdin_pipe,
                                 run_times& times) {
  using clock = std::chrono::steady_clock;
  launch_outcome o;
  auto fail = [&](std::string why) {
    o.error = std::move(why);
    return std::move(o);
  };
  instance_id_ = job.run_id;  // resources are named by the instance, results by the run

  // 0. The image stays while this sandbox uses it: a shared lock on its unpacked root, which
  //    the image store's remove() must take exclusively (`busy` otherwise).
  if (!res.lock_image(job.rootfs)) return fail("the runtime's image is missing or being removed");

  // 1. Identity: a uid of the run's own (root hosts), or the single mapped id of a user
  //    namespace (unprivileged hosts: per-uid counters are per user namespace there).
  if (!res.acquire_uid()) return fail("no free sandbox uid in the configured range");

  // 2. The run's cgroup, with limits, before any process exists.
  cgroup_limits limits{job.admitted.request.memory_limit_bytes, job.policy.max_pids,
                       job.policy.cpu_quota_millicores};
  h.l.adjust_limits(job.policy, limits);
  std::string cg_name = "r-" + h.backend_instance_id + "-" + instance_id_;
  cgroup_path_ = h.cgroup_parent + "/" + cg_name;
  auto cg = h.cgroups.create(cg_name, limits);
  if (!cg) return fail("cgroup create failed: " + cg.error().message());
  res.adopt_cgroup(std::move(*cg));
  times.cgroup = clock::now();

  // 3. Workspace skeleton: an empty input dir and source file (bound by sandbox-init now,
  //    filled at activation), the staging mount point.
  auto ws = create_workspace(h.runs_dir, instance_id_,
                             selftest ? std::string("probe") : job.runtime.source_name);
  if (!ws) return fail("workspace: " + ws.error().message());
  res.adopt_workspace(std::move(*ws));
  times.workspace = clock::now();

  // 4. Channels: control socket, stdout/stderr pipes. (Failing here, each is closed.)
  int ctl[2], outp[2], errp[2];
  const bool stream = h.traits.stream_control;
  if (socketpair(AF_UNIX, (stream ? SOCK_STREAM : SOCK_SEQPACKET) | SOCK_CLOEXEC, 0, ctl) < 0) {
    return fail(fmt::format("socketpair: errno {}", errno));
  }
  unique_fd ctl_host(ctl[0]), ctl_child(ctl[1]);
  // (A launcher may want stream sockets instead of pipes: QEMU's socket chardevs wait
  // for a full peer, its file chardevs on a pipe were seen losing most of a flood.)
  auto make_pair = [&](int fds[2]) {
    return h.traits.stdio_sockets ? ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds)
                                  : ::pipe2(fds, O_CLOEXEC);
  };
  if (make_pair(outp) < 0) return fail(fmt::format("pipe2: errno {}", errno));
  unique_fd out_host(outp[0]), out_child(outp[1]);
  if (make_pair(errp) < 0) return fail(fmt::format("pipe2: errno {}", errno));
  unique_fd err_host(errp[0]), err_child(errp[1]);
  // Unpredictable: getrandom only, never a fallback.
  const auto input_suffix = random_hex(8);
  if (!input_suffix) {
    return fail(fmt::format("getrandom for the inputs' directory: errno {}", errno));
  }
  input_name_ = "in-" + *input_suffix;
  // A session's stdin (pipe mode): the host keeps the write end (non-blocking), the read end
  // goes to sandbox-init with the program (`go`, a = 1) and on to the program as its fd 0.
  // (Stream mode: sandbox-init makes the pipe and the bytes travel on the control stream,
  // init_protocol.hpp.)
  if (stdin_pipe && !stdin_pipe->make_pipe()) return fail(fmt::format("pipe2: errno {}", errno));

  // 5. sandbox-init, in the run's namespaces and cgroup, waiting for its configuration.
  launch_request lr{.job = job,
                    .instance_id = instance_id_,
                    .ws = res.workspace(),
                    .cgroup = *res.cgroup(),
                    .cgroup_path = cgroup_path_,
                    .uid = res.uid(),
                    .selftest = selftest,
                    .network = network,
                    .input_name = input_name_,
                    .ctl_fd = ctl_child.get(),
                    .out_fd = h.traits.stdio_over_control ? -1 : out_child.get(),
                    .err_fd = h.traits.stdio_over_control ? -1 : err_child.get()};
  std::string why;
  auto sp = h.l.launch(lr, &why);
  ctl_child.reset();
  o.ctl = std::move(ctl_host);
  o.out = std::move(out_host);
  o.err = std::move(err_host);
  // Launchers whose runtime process would hold the pipes (an OCI runtime waits in the
  // foreground) get them to sandbox-init with the configuration instead (`a` = 1).
  if (h.traits.stdio_over_control) {
    o.child_out = std::move(out_child);
    o.child_err = std::move(err_child);
  }
  if (!sp) {
    return fail(fmt::format("starting sandbox-init ({}) failed: {}{}", h.traits.name,
                            sp.error().message(), why.empty() ? "" : ": " + why));
  }
  o.made = std::move(*sp);
  return o;
}

std::string run_setup::send_config(control_channel& ctl, const run_job& job, const program_facts& f,
                                   std::string_view launcher_entries,
                                   std::span<const int> stdio_fds) {
  namespace ip = init_protocol;
  std::string packet = init_packet(ip::msg::config, stdio_fds.empty() ? 0U : 1U,
                                   config_payload(job, {.selftest = f.selftest,
                                                        .input_name = input_name_,
                                                        .uid = f.uid,
                                                        .userns = f.userns,
                                                        .launcher_entries = launcher_entries}));
  if (packet.size() > ip::max_packet) return "configuration too large";
  if (ctl.send_packet(packet, stdio_fds) < 0) {
    return fmt::format("sending configuration failed: errno {}", errno);
  }
  return {};
}

std::string staging_outcome::note(
    run_evidence& ev, const std::function<void(log_level, const std::string&)>& log) const {
  switch (what) {
    case kind::ok:
      break;
    case kind::blob_missing:
      ev.blob_missing = index;
      break;
    case kind::digest_mismatch:
      log(log_level::error,
          fmt::format("files_in[{}]: stored blob does not match its digest", index));
      ev.internal_error =
          fmt::format("files_in[{}].blob: the stored content does not match its digest", index);
      break;
    case kind::failed:
      return error;
  }
  return {};
}

staging_outcome run_setup::stage(const run_workspace& ws, const run_job& job) {
  const auto& req = job.admitted.request;
  std::size_t missing = 0;
  auto staged = stage_workspace(ws, job.stdin_bytes ? *job.stdin_bytes : req.source, req.files_in,
                                *job.blobs, job.admitted.tenant, &missing);
  if (staged) return {};
  if (staged.error() == make_error_code(errc::not_found)) {
    return {.what = staging_outcome::kind::blob_missing, .index = missing, .error = {}};
  }
  if (staged.error() == make_error_code(errc::digest_mismatch)) {
    return {.what = staging_outcome::kind::digest_mismatch, .index = missing, .error = {}};
  }
  return {.what = staging_outcome::kind::failed, .error = "workspace: " + staged.error().message()};
}

std::string run_setup::send_go(control_channel& ctl, const run_job& job, const launcher_traits& t,
                               const program_facts& f, session_stdio& stdio) {
  namespace ip = init_protocol;
  const bool stream = t.stream_control;
  if (f.network && !f.proxy_served && stream) {
    // (A launcher without descriptor passing makes the namespace itself; this instance has
    // none: a warm-pool one, which network runs never take.)
    return "network run on an instance without its own network namespace";
  }
  const bool with_stdin = f.session && (stream || stdio.child_fd() >= 0);
  std::string packet = init_packet(
      ip::msg::go, with_stdin ? 1U : 0U,
      go_payload(job,
                 {.selftest = f.selftest,
                  .session = f.session,
                  .input_name = input_name_,
                  .uid = f.uid,
                  .probe_path = t.probe_path,
                  .probe_in_gvisor = stream && t.isolation == sandbox::isolation::gvisor,
                  .network = f.network,
                  .proxy_served = f.proxy_served,
                  .node_proxy_preload_path = t.node_proxy_preload_path,
                  .node_proxy_preload = t.node_proxy_preload_in_go ? embedded::node_proxy_preload()
                                                                   : std::string_view{},
                  .run_ca_pem = f.run_ca_pem}));
  if (packet.size() > ip::max_packet) return "program description too large";
  const int stdin_fds[1] = {stdio.child_fd()};
  const int sent =
      with_stdin && !stream ? ctl.send_packet(packet, stdin_fds) : ctl.send_packet(packet, {});
  const int e = errno;
  stdio.go_sent(with_stdin);  // only sandbox-init (then the program) holds the read end
  if (sent < 0) return fmt::format("sending the program failed: errno {}", e);
  return {};
}

}  // namespace sandbox::detail
