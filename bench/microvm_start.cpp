// Start-up benchmark of the microvm level against the process level, measured in the same
// run (these machines are shared and noisy: only ratios within one run mean anything).
//
//   build/<preset>/bin/sandbox_bench_microvm [runs=5]
//
// For `print(1)` at each level, interleaved: setup (call → the program started; at the
// microvm level this is VMM start, guest boot to the agent's `agent_ready`, the guest's
// sandbox set-up — the cost a warm pool hides) and acquire-to-result (call → result). Then
// the same through a warm pool of one VM (a second runtime; each run waits until the pool
// has refilled, so every measured run takes a booted VM), and what an idle pooled VM costs
// the host (QEMU's CPU time while it waits); then through a pre-started pool of one VM (booted
// to a waiting interpreter: `warm_pool_class::prestart`). Prints p50/p95 and the ratios against the
// process level and the cold microvm run. Exit 77 when either level is unavailable.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "sandbox/sandbox.hpp"

using bench::clock_type;
using bench::ms_since;

namespace {

// CPU seconds (user + system) of the QEMU processes of the runtime whose state dir is
// `state` (in a run cgroup "r-<instance>-…" of an instance locked there): other runtimes'
// VMs on a shared host are not counted.
double qemu_cpu_seconds(const std::filesystem::path& state) {
  std::vector<std::string> mine;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(state / "microvm" / "instances", ec)) {
    auto n = e.path().filename().string();
    if (n.size() > 5 && n.substr(n.size() - 5) == ".lock")
      mine.push_back(n.substr(0, n.size() - 5));
  }
  double total = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    std::ifstream comm(e.path() / "comm");
    std::string c;
    if (!comm || !std::getline(comm, c) || c.rfind("qemu-system", 0) != 0) continue;
    std::ifstream cg(e.path() / "cgroup");
    std::string groups((std::istreambuf_iterator<char>(cg)), {});
    if (std::none_of(mine.begin(), mine.end(), [&](const std::string& inst) {
          return groups.find("/r-" + inst + "-") != std::string::npos;
        })) {
      continue;
    }
    std::ifstream st(e.path() / "stat");
    std::string line;
    std::getline(st, line);
    auto rp = line.rfind(')');
    if (rp == std::string::npos) continue;
    std::istringstream in(line.substr(rp + 2));
    std::string f;
    unsigned long long ut = 0, stt = 0;
    for (int i = 3; i <= 15 && in >> f; ++i) {
      if (i == 14) ut = std::stoull(f);
      if (i == 15) stt = std::stoull(f);
    }
    total += static_cast<double>(ut + stt) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  }
  return total;
}

std::uint32_t pool_ready(const sandbox::runtime& rt) {
  for (const auto& s : rt.warm_pool_stats()) return s.ready;
  return 0;
}

bool wait_pool_ready(const sandbox::runtime& rt) {
  auto until = clock_type::now() + std::chrono::seconds(180);
  while (clock_type::now() < until) {
    if (pool_ready(rt) >= 1) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// One pooled series: a runtime of its own (only the microvm level) with a pool of one VM of
// class `cls`; each measured run waits until the pool has refilled, so it takes a booted VM.
struct pooled_series {
  std::vector<double> setup, total;
  double idle_cpu_pct = -1;  ///< what an idle pooled VM costs: its QEMU's CPU over 5 s
  int failed = 0;
};

pooled_series measure_pool(sandbox::runtime_options opts, sandbox::warm_pool_class cls, int runs,
                           const sandbox::run_request& req, const sandbox::ticket& t_vm) {
  pooled_series out;
  opts.process_backend = false;
  char tmpl[] = "/tmp/sandbox-bench-pool-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    out.failed = runs;
    return out;
  }
  opts.state_dir = std::filesystem::path(tmpl) / "state";
  opts.microvm.warm_pool = {std::move(cls)};
  auto prt = sandbox::runtime::create(opts);
  if (!prt) {
    std::fprintf(stderr, "pooled runtime: %s\n", prt.error().message().c_str());
    out.failed = runs;
    return out;
  }
  if (!wait_pool_ready(*prt)) {
    std::fprintf(stderr, "the warm pool never became ready\n");
    out.failed = runs;
    return out;
  }
  const double c0 = qemu_cpu_seconds(opts.state_dir);
  std::this_thread::sleep_for(std::chrono::seconds(5));
  out.idle_cpu_pct = (qemu_cpu_seconds(opts.state_dir) - c0) / 5.0 * 100.0;
  for (int i = 0; i < runs; ++i) {
    if (!wait_pool_ready(*prt)) {
      ++out.failed;
      break;
    }
    auto t0 = clock_type::now();
    auto w = prt->run(req, t_vm);
    out.total.push_back(ms_since(t0));
    out.setup.push_back(static_cast<double>(w.usage.setup.count()));
    if (w.code != sandbox::code::ok) ++out.failed;
  }
  return out;
}

}  // namespace

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
  // 8 s (the default ticket ceiling): an emulated guest on a loaded host is slow to start
  // Python, and a run that misses its deadline is a failure, not a figure.
  sandbox::run_request req{
      .runtime = "python3", .source = "print(1)", .timeout = std::chrono::seconds(8)};
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
  // A warm pool of one VM, then one of a pre-started VM (booted to a waiting interpreter),
  // each in a runtime of its own.
  const auto plain = measure_pool(opts, {.runtime = "python3", .size = 1}, runs, req, t_vm);
  const auto pre =
      measure_pool(opts, {.runtime = "python3", .size = 1, .prestart = true}, runs, req, t_vm);
  failed += plain.failed + pre.failed;
  const double idle_cpu_pct = plain.idle_cpu_pct;
  auto ps = bench::percentiles(p_setup), pt = bench::percentiles(p_total);
  auto ms = bench::percentiles(m_setup), mt = bench::percentiles(m_total);
  auto ws = bench::percentiles(plain.setup), wt = bench::percentiles(plain.total);
  auto xs = bench::percentiles(pre.setup), xt = bench::percentiles(pre.total);
  std::printf("microvm backend: %s; %d runs each, %d failed\n", describe.c_str(), runs, failed);
  std::printf("%-34s %10s %10s\n", "print(1)", "p50 ms", "p95 ms");
  std::printf("%-34s %10.0f %10.0f\n", "process: setup", ps.p50, ps.p95);
  std::printf("%-34s %10.0f %10.0f\n", "process: acquire-to-result", pt.p50, pt.p95);
  std::printf("%-34s %10.0f %10.0f\n", "microvm: setup (boot to started)", ms.p50, ms.p95);
  std::printf("%-34s %10.0f %10.0f\n", "microvm: acquire-to-result", mt.p50, mt.p95);
  std::printf("%-34s %10.0f %10.0f\n", "microvm pooled: setup", ws.p50, ws.p95);
  std::printf("%-34s %10.0f %10.0f\n", "microvm pooled: acquire-to-result", wt.p50, wt.p95);
  std::printf("%-34s %10.0f %10.0f\n", "microvm pre-started: setup", xs.p50, xs.p95);
  std::printf("%-34s %10.0f %10.0f\n", "microvm pre-started: acq-to-result", xt.p50, xt.p95);
  std::printf("ratio microvm/process: setup %.1fx, acquire-to-result %.1fx (p50)\n",
              ps.p50 > 0 ? ms.p50 / ps.p50 : 0.0, pt.p50 > 0 ? mt.p50 / pt.p50 : 0.0);
  std::printf("ratio pooled/cold microvm: acquire-to-result %.2fx; pooled/process %.1fx (p50)\n",
              mt.p50 > 0 ? wt.p50 / mt.p50 : 0.0, pt.p50 > 0 ? wt.p50 / pt.p50 : 0.0);
  std::printf("an idle pooled VM: %.1f%% of one core (QEMU, over 5 s)\n", idle_cpu_pct);
  std::printf(
      "ratio pre-started/pooled microvm: acquire-to-result %.2fx (p50); an idle "
      "pre-started VM: %.1f%% of one core\n",
      wt.p50 > 0 ? xt.p50 / wt.p50 : 0.0, pre.idle_cpu_pct);
  return failed == 0 ? 0 : 1;
}
