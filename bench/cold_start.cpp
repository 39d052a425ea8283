// Cold-start benchmark of the process backend: `print(1)` through the library against a bare
// interpreter started by the same process, measured in the same run (these machines are
// shared and noisy: only ratios within one run mean anything).
//
//   build/dev/bin/sandbox_bench_cold [runs=40]
//
// Prints p50/p95 of: bare `/usr/bin/python3 -I -S -c 'print(1)'` (the issue's baseline),
// bare `/usr/bin/python3 -I <file>` (the flags the sandbox uses), and the sandboxed run split
// into setup (before the interpreter starts), user code (wall), and host-side total
// (call to result: includes teardown, output collection and blob storage).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <string>
#include <vector>

#include "sandbox/sandbox.hpp"

extern char** environ;

namespace {

using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

struct stats {
  double p50, p95;
};

stats summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<std::size_t>(q * v.size()))]; };
  return {at(0.5), at(0.95)};
}

double bare(const std::vector<const char*>& argv) {
  int p[2];
  if (pipe(p) < 0) std::abort();
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, p[1], 1);
  posix_spawn_file_actions_addclose(&fa, p[0]);
  char* empty_env[] = {nullptr};
  auto t0 = clock_type::now();
  pid_t pid;
  if (posix_spawn(&pid, argv[0], &fa, nullptr, const_cast<char* const*>(argv.data()), empty_env) != 0) std::abort();
  close(p[1]);
  char buf[64];
  while (read(p[0], buf, sizeof buf) > 0) {
  }
  int st;
  waitpid(pid, &st, 0);
  double ms = ms_since(t0);
  close(p[0]);
  posix_spawn_file_actions_destroy(&fa);
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = argc > 1 ? std::atoi(argv[1]) : 40;
  auto opts = sandbox::default_runtime_options();
  opts.blobs = sandbox::make_memory_blob_store();
  auto rt = sandbox::runtime::create(opts);
  if (!rt) {
    std::fprintf(stderr, "runtime: %s\n", rt.error().message().c_str());
    return 1;
  }
  bool ok = false;
  for (const auto& b : rt->backends()) ok = ok || (b.registered && b.name == "process");
  if (!ok) {
    std::fprintf(stderr, "process backend unavailable\n");
    return 77;
  }
  auto ticket = sandbox::ticket_issuer{}.issue({.id = "bench", .tenant = "bench"}).value();
  sandbox::run_request req{.runtime = "python3", .source = "print(1)"};
  char script[] = "/tmp/sandbox-bench-XXXXXX.py";
  int sfd = mkstemps(script, 3);
  (void)!write(sfd, "print(1)\n", 9);
  close(sfd);

  for (int i = 0; i < 3; ++i) {  // warm-up: page cache, reactor, cgroup parent
    rt->run(req, ticket);
    bare({"/usr/bin/python3", "-I", "-S", "-c", "print(1)", nullptr});
  }
  std::vector<double> bare_s, bare_i, total, setup, wall;
  for (int i = 0; i < runs; ++i) {  // interleaved so drift hits all series alike
    bare_s.push_back(bare({"/usr/bin/python3", "-I", "-S", "-c", "print(1)", nullptr}));
    bare_i.push_back(bare({"/usr/bin/python3", "-I", script, nullptr}));
    auto t0 = clock_type::now();
    auto r = rt->run(req, ticket);
    total.push_back(ms_since(t0));
    if (r.code != sandbox::code::ok || r.std_out.summary != "1\n") {
      std::fprintf(stderr, "run failed: %s %s\n", std::string(to_string(r.code)).c_str(), r.message.c_str());
      return 1;
    }
    setup.push_back(static_cast<double>(r.usage.setup.count()));
    wall.push_back(static_cast<double>(r.usage.wall.count()));
  }
  unlink(script);
  auto bs = summarize(bare_s), bi = summarize(bare_i), tt = summarize(total),
       su = summarize(setup), wa = summarize(wall);
  std::printf("runs: %d (interleaved)\n", runs);
  std::printf("%-44s %8s %8s\n", "", "p50 ms", "p95 ms");
  std::printf("%-44s %8.1f %8.1f\n", "bare python3 -I -S -c 'print(1)'", bs.p50, bs.p95);
  std::printf("%-44s %8.1f %8.1f\n", "bare python3 -I main.py (sandbox's flags)", bi.p50, bi.p95);
  std::printf("%-44s %8.1f %8.1f\n", "sandboxed: setup (before the interpreter)", su.p50, su.p95);
  std::printf("%-44s %8.1f %8.1f\n", "sandboxed: user code (wall_ms)", wa.p50, wa.p95);
  std::printf("%-44s %8.1f %8.1f\n", "sandboxed: total, call to result", tt.p50, tt.p95);
  std::printf("ratio total / bare -I -S (p50): %.2fx; total - bare -I: %.1f ms\n", tt.p50 / bs.p50,
              tt.p50 - bi.p50);
  return 0;
}
