// Start-up benchmark of the microvm level against the process level, measured in the same
// run (these machines are shared and noisy: only ratios within one run mean anything).
//
//   build/<preset>/bin/sandbox_bench_microvm [runs=5]
//
// For `print(1)` at each level, interleaved: setup (call → the program started; at the
// microvm level this is VMM start, guest boot to the agent's `agent_ready`, the guest's
// sandbox set-up — the cost a warm pool would hide) and acquire-to-result (call → result).
// Prints p50/p95 and the microvm/process ratios. Exit 77 when either level is unavailable.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "sandbox/sandbox.hpp"

using bench::clock_type;
using bench::ms_since;

int main(int argc, char** argv) {
  int runs = argc > 1 ? std::atoi(argv[1]) : 5;
  auto opts = sandbox::default_runtime_options();
  opts.blobs = sandbox::make_memory_blob_store();
  opts.microvm.enabled = true;
  opts.policy.setup_budget = std::chrono::seconds(90);
  auto rt = sandbox::runtime::create(opts);
  if (!rt) {
    std::fprintf(stderr, "runtime: %s\n", rt.error().message().c_str());
    return 1;
  }
  bool process = false, microvm = false;
  std::string describe;
  for (const auto& b : rt->backends()) {
    if (b.isolation == sandbox::isolation::process) process = b.registered;
    if (b.isolation == sandbox::isolation::microvm) {
      microvm = b.registered;
      if (!b.registered) std::fprintf(stderr, "microvm: %s\n", b.reason.c_str());
    }
  }
  if (!process || !microvm) return 77;
  sandbox::ticket_issuer issuer;
  auto t_proc = issuer.issue({.id = "bench-p", .tenant = "bench"}).value();
  auto t_vm =
      issuer.issue({.id = "bench-m", .tenant = "bench", .isolation = sandbox::isolation::microvm})
          .value();
  sandbox::run_request req{.runtime = "python3", .source = "print(1)"};
  for (int i = 0; i < 2; ++i) {  // warm-up: page cache, image disk, reactor
    rt->run(req, t_proc);
    auto r = rt->run(req, t_vm);
    describe = r.backend;
  }
  std::vector<double> p_setup, p_total, m_setup, m_total;
  int failed = 0;
  for (int i = 0; i < runs; ++i) {
    auto t0 = clock_type::now();
    auto a = rt->run(req, t_proc);
    p_total.push_back(ms_since(t0));
    p_setup.push_back(static_cast<double>(a.usage.setup.count()));
    t0 = clock_type::now();
    auto b = rt->run(req, t_vm);
    m_total.push_back(ms_since(t0));
    m_setup.push_back(static_cast<double>(b.usage.setup.count()));
    if (a.code != sandbox::code::ok || b.code != sandbox::code::ok) ++failed;
  }
  auto ps = bench::percentiles(p_setup), pt = bench::percentiles(p_total);
  auto ms = bench::percentiles(m_setup), mt = bench::percentiles(m_total);
  std::printf("microvm backend: %s; %d runs each, %d failed\n", describe.c_str(), runs, failed);
  std::printf("%-34s %10s %10s\n", "print(1)", "p50 ms", "p95 ms");
  std::printf("%-34s %10.0f %10.0f\n", "process: setup", ps.p50, ps.p95);
  std::printf("%-34s %10.0f %10.0f\n", "process: acquire-to-result", pt.p50, pt.p95);
  std::printf("%-34s %10.0f %10.0f\n", "microvm: setup (boot to started)", ms.p50, ms.p95);
  std::printf("%-34s %10.0f %10.0f\n", "microvm: acquire-to-result", mt.p50, mt.p95);
  std::printf("ratio microvm/process: setup %.1fx, acquire-to-result %.1fx (p50)\n",
              ps.p50 > 0 ? ms.p50 / ps.p50 : 0.0, pt.p50 > 0 ? mt.p50 / pt.p50 : 0.0);
  return failed == 0 ? 0 : 1;
}
