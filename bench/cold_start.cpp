// Cold-start benchmark of the process backend: `print(1)` through the library against a bare
// interpreter started by the same process, measured in the same run (these machines are
// shared and noisy: only ratios within one run mean anything).
//
//   build/dev/bin/sandbox_bench_cold [runs=40]
//   build/dev/bin/sandbox_bench_cold --serve   # one run per line read on stdin
//
// Prints p50/p95 of: bare `/usr/bin/python3 -I -S -c 'print(1)'` (the issue's baseline),
// bare `/usr/bin/python3 -I <file>` (the flags the sandbox uses), and the sandboxed run split
// into setup (before the interpreter starts), user code (wall), and host-side total
// (call to result: includes teardown, output collection and blob storage).
//
// `--serve` lets another program interleave the library's cold run with its own series
// (bench/cli_cold.sh): after the warm-up it prints "ready", then for each line on stdin runs
// `print(1)` once and prints that run's call-to-result time in ms on a line of its own; it
// ends at the end of stdin (status 1 after printing "error <code>" for a failed run).
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "sandbox/sandbox.hpp"

using bench::clock_type;
using bench::ms_since;
using bench::spawn_ms;

int main(int argc, char** argv) {
  const bool serve = argc > 1 && std::strcmp(argv[1], "--serve") == 0;
  int runs = argc > 1 && !serve ? std::atoi(argv[1]) : 40;
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
    spawn_ms({"/usr/bin/python3", "-I", "-S", "-c", "print(1)"});
  }
  if (serve) {
    std::printf("ready\n");
    std::fflush(stdout);
    char line[64];
    while (std::fgets(line, sizeof line, stdin) != nullptr) {
      auto t0 = clock_type::now();
      auto r = rt->run(req, ticket);
      const double ms = ms_since(t0);
      if (r.code != sandbox::code::ok || r.std_out.summary != "1\n") {
        std::printf("error %s\n", std::string(to_string(r.code)).c_str());
        unlink(script);
        return 1;
      }
      std::printf("%.3f\n", ms);
      std::fflush(stdout);
    }
    unlink(script);
    return 0;
  }
  std::vector<double> bare_s, bare_i, total, setup, wall;
  for (int i = 0; i < runs; ++i) {  // interleaved so drift hits all series alike
    bare_s.push_back(spawn_ms({"/usr/bin/python3", "-I", "-S", "-c", "print(1)"}));
    bare_i.push_back(spawn_ms({"/usr/bin/python3", "-I", script}));
    auto t0 = clock_type::now();
    auto r = rt->run(req, ticket);
    total.push_back(ms_since(t0));
    if (r.code != sandbox::code::ok || r.std_out.summary != "1\n") {
      std::fprintf(stderr, "run failed: %s %s\n", std::string(to_string(r.code)).c_str(),
                   r.message.c_str());
      return 1;
    }
    setup.push_back(static_cast<double>(r.usage.setup.count()));
    wall.push_back(static_cast<double>(r.usage.wall.count()));
  }
  unlink(script);
  auto bs = bench::percentiles(bare_s), bi = bench::percentiles(bare_i),
       tt = bench::percentiles(total), su = bench::percentiles(setup),
       wa = bench::percentiles(wall);
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
