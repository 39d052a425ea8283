// The process backend's launcher: the host spawns sandbox-init itself as PID 1 of new pid,
// mount, net, ipc and uts namespaces (plus a user namespace on unprivileged hosts), created
// in the run's cgroup2 directory (clone3 CLONE_INTO_CGROUP) and moved into its v1 cgroups,
// and, for a user namespace, writes its uid/gid maps. sandbox-init
// then builds the run's filesystem itself (helpers/init/mounts.cpp).
#include <fcntl.h>
#include <fmt/format.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/process/process_backend.hpp"
#include "sys/pidfd.hpp"
#include "sys/spawn.hpp"

namespace sandbox::detail {
namespace {

class process_launcher final : public launcher {
 public:
  process_launcher(int init_exec_fd, bool userns)
      : init_exec_fd_(init_exec_fd),
        userns_(userns),
        host_uid_(::geteuid()),
        host_gid_(::getegid()) {}
  ~process_launcher() override {
    if (init_exec_fd_ >= 0) ::close(init_exec_fd_);
  }

  launcher_traits traits() const override {
    return {.isolation = sandbox::isolation::process,
            .name = "process",
            .description = "process",
            .unprivileged = true,
            .probe_path = "sandbox-init"};
  }

  result<std::unique_ptr<launched>> launch(const launch_request& r, std::string* why) override {
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    spawn_request sr;
    sr.exec_fd = init_exec_fd_;
    sr.argv = {"sandbox-init"};
    sr.fd0 = devnull;
    sr.fd1 = r.out_fd;
    sr.fd2 = r.err_fd;
    sr.fd3 = r.ctl_fd;
    if (r.selftest) sr.fd4 = init_exec_fd_;  // the probe is sandbox-init itself
    sr.clone_flags = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS |
                     (userns_ ? CLONE_NEWUSER : 0);
    // Created in the run's cgroup2 directory where there is one (pure v2, or the unified
    // part of a hybrid host): that hierarchy needs no migration.
    sr.into_cgroup_fd = r.cgroup.open_unified_dir();
    auto sp = spawn_process(sr);
    ::close(devnull);
    if (sr.into_cgroup_fd >= 0) ::close(sr.into_cgroup_fd);
    if (!sp) return sp.error();
    auto l = std::make_unique<launched>();
    l->pid = sp->pid;
    l->pidfd.reset(sp->pidfd);
    auto fail = [&](std::string what) -> result<std::unique_ptr<launched>> {
      *why = std::move(what);
      ::kill(l->pid, SIGKILL);  // the run reaps it through the pidfd it never gets: do it here
      siginfo_t si{};
      waitid_pidfd(l->pidfd.get(), &si, WEXITED);
      return make_error_code(errc::io_error);
    };
    // Into the cgroup (sandbox-init waits for the configuration before doing anything): the
    // hierarchies it was not created in.
    if (auto a = sp->in_cgroup ? r.cgroup.attach_except_unified(l->pid) : r.cgroup.attach(l->pid);
        !a) {
      return fail("cgroup attach failed: " + a.error().message());
    }
    if (userns_) {
      std::string proc = "/proc/" + std::to_string(l->pid);
      bool ok = write_existing_file(proc + "/uid_map",
                                    fmt::format("{} {} 1\n", userns_inside_id, host_uid_)) &&
                write_existing_file(proc + "/setgroups", "deny") &&
                write_existing_file(proc + "/gid_map",
                                    fmt::format("{} {} 1\n", userns_inside_id, host_gid_));
      if (!ok) return fail(fmt::format("writing uid/gid maps failed: errno {}", errno));
    }
    // The host paths sandbox-init binds itself.
    l->config.add("rootfs", r.job.rootfs.string());
    l->config.add("staging", r.ws.staging.string());
    l->config.add("inputs", r.ws.inputs.string());
    l->config.add("source", r.ws.source.string());
    return l;
  }

 private:
  int init_exec_fd_;
  bool userns_;
  uid_t host_uid_;
  gid_t host_gid_;
};

}  // namespace

std::variant<std::shared_ptr<backend>, std::string> make_process_backend(
    const process_backend_context& ctx) {
  int fd = open_init_executable(ctx.options.init_path);
  if (fd < 0) return std::string("cannot load the sandbox-init helper");
  return make_run_machine(ctx, std::make_shared<process_launcher>(fd, ::geteuid() != 0));
}

}  // namespace sandbox::detail
