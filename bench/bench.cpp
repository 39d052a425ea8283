// The benchmark suite (docs/performance.md): every figure is printed with a baseline
// measured in the same run, on the same machine, interleaved where it makes sense — these
// machines are shared and noisy, so only ratios within one run mean anything. No figure is
// asserted.
//
//   build/dev/bin/sandbox_bench [--runs N] [--section cold|pool|throughput|flood|scheduler|breakdown]
//
// Needs root for the unshare/bwrap baselines (skipped otherwise) and the python3 image.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "bench_util.hpp"
#include "core/scheduler.hpp"
#include "sandbox/sandbox.hpp"


namespace {

using bench::clock_type;
using bench::ms_since;
using bench::pct;
using bench::percentiles;
using bench::spawn_ms;

bool have(const char* path) { return ::access(path, X_OK) == 0; }


const std::vector<std::string> bare_py = {"/usr/bin/python3", "-I", "-S", "-c", "print(1)"};
const std::vector<std::string> unshare_py = {
    "/usr/bin/unshare", "--pid", "--fork", "--net", "--mount", "--ipc", "--uts", "--cgroup",
    "--mount-proc", "/usr/bin/python3", "-I", "-S", "-c", "print(1)"};
const std::vector<std::string> bwrap_py = {
    "/usr/bin/bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
    "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64",
    "/lib64", "--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev", "--tmpfs",
    "/tmp", "--remount-ro", "/", "/usr/bin/python3", "-I", "-S", "-c", "print(1)"};

// A runtime for the benchmark: memory blobs, optional warm pool, a runtime spec with the
// baseline's interpreter flags (-I -S) so that the comparison is like for like.
std::unique_ptr<sandbox::runtime> make_runtime(std::vector<sandbox::warm_pool_class> pool,
                                               sandbox::log_sink log = {}) {
  auto o = sandbox::default_runtime_options();
  o.blobs = sandbox::make_memory_blob_store(8ULL << 30);
  o.runtimes.push_back({.name = "python3-S", .argv = {"/usr/bin/python3", "-I", "-S", "{source}"},
                        .source_name = "main.py", .image = "python3"});
  o.process.warm_pool = std::move(pool);
  o.scheduler.max_running = 64;
  o.scheduler.default_class.max_running = 64;
  o.log = log ? log : [](sandbox::log_level l, std::string_view s) {
    if (l >= sandbox::log_level::error) std::fprintf(stderr, "agent-sandbox: %.*s\n", int(s.size()), s.data());
  };
  auto rt = sandbox::runtime::create(o);
  if (!rt) {
    std::fprintf(stderr, "runtime: %s\n", rt.error().message().c_str());
    std::exit(1);
  }
  bool ok = false;
  for (const auto& b : rt->backends()) ok = ok || (b.registered && b.name == "process");
  if (!ok) {
    std::fprintf(stderr, "process backend unavailable on this host\n");
    std::exit(77);
  }
  return std::make_unique<sandbox::runtime>(std::move(*rt));
}

sandbox::ticket bench_ticket(const std::string& tenant = "bench") {
  return sandbox::ticket_issuer{}
      .issue({.id = "bench", .tenant = tenant, .max_timeout = std::chrono::milliseconds(8000),
              .max_memory_bytes = 1ULL << 30})
      .value();
}

double run_ms(sandbox::runtime& rt, const std::string& runtime, sandbox::run_result* out = nullptr) {
  auto t0 = clock_type::now();
  auto r = rt.run({.runtime = runtime, .source = "print(1)"}, bench_ticket());
  double ms = ms_since(t0);
  if (r.code != sandbox::code::ok || r.std_out.summary != "1\n") {
    std::fprintf(stderr, "run failed: %s %s\n", std::string(to_string(r.code)).c_str(),
                 r.message.c_str());
    std::exit(1);
  }
  if (out) *out = std::move(r);
  return ms;
}

void wait_pool_full(sandbox::runtime& rt) {
  for (int i = 0; i < 1000; ++i) {
    bool full = true;
    for (auto& p : rt.warm_pool_stats()) full = full && p.ready == p.size && p.starting == 0;
    if (full) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void row(const char* name, pct p, double base_p50) {
  std::printf("  %-52s %8.1f %8.1f %8.2fx\n", name, p.p50, p.p95, base_p50 > 0 ? p.p50 / base_p50 : 0);
}

// --- sections ----------------------------------------------------------------------------

void section_cold(int runs) {
  std::printf("\n== cold start: print(1), %d runs each, interleaved (ms)\n", runs);
  std::printf("  %-52s %8s %8s %9s\n", "", "p50", "p95", "vs bare");
  auto rt = make_runtime({});
  const bool root = ::geteuid() == 0;
  const bool unshare_ok = root && have("/usr/bin/unshare");
  const bool bwrap_ok = have("/usr/bin/bwrap");
  std::vector<double> bare, uns, bw, ours_s, ours_i, setup;
  for (int i = 0; i < 3; ++i) {  // warm-up
    spawn_ms(bare_py);
    run_ms(*rt, "python3-S");
  }
  // The order rotates every round: a namespace's teardown finishes in the kernel after its
  // last process is gone (network namespaces especially), and slows whatever creates the
  // next ones, so no contender may always follow the same one.
  std::vector<std::function<void()>> contenders;
  contenders.push_back([&] { bare.push_back(spawn_ms(bare_py)); });
  if (unshare_ok) contenders.push_back([&] { uns.push_back(spawn_ms(unshare_py)); });
  if (bwrap_ok) contenders.push_back([&] { bw.push_back(spawn_ms(bwrap_py)); });
  contenders.push_back([&] {
    sandbox::run_result r;
    ours_s.push_back(run_ms(*rt, "python3-S", &r));
    setup.push_back(static_cast<double>(r.usage.setup.count()));
  });
  contenders.push_back([&] { ours_i.push_back(run_ms(*rt, "python3")); });
  for (int i = 0; i < runs; ++i) {
    for (std::size_t k = 0; k < contenders.size(); ++k) contenders[(i + k) % contenders.size()]();
  }
  auto b = percentiles(bare);
  row("bare python3 -I -S -c 'print(1)'", b, b.p50);
  if (unshare_ok) row("unshare (pid,net,mnt,ipc,uts,cgroup) + python", percentiles(uns), b.p50);
  if (bwrap_ok) row("bwrap --unshare-all + python", percentiles(bw), b.p50);
  row("agent-sandbox process level, python3 -I -S", percentiles(ours_s), b.p50);
  row("agent-sandbox process level, python3 -I (default)", percentiles(ours_i), b.p50);
  row("  of which setup (before the interpreter starts)", percentiles(setup), b.p50);
  if (bwrap_ok) {
    double ours_over = percentiles(ours_s).p50 - b.p50;
    double bwrap_over = percentiles(bw).p50 - b.p50;
    std::printf("  overhead over bare (p50): ours %.1f ms, bwrap %.1f ms → ratio %.2f (aim ≤ 0.5)\n",
                ours_over, bwrap_over, bwrap_over > 0 ? ours_over / bwrap_over : 0);
  }
}

void section_pool(int runs) {
  std::printf("\n== warm pool: print(1), %d runs each (ms)\n", runs);
  std::printf("  %-52s %8s %8s %9s\n", "", "p50", "p95", "vs bare");
  auto rt = make_runtime({{.runtime = "python3-S", .size = 2}});
  std::vector<double> bare, pooled, setup;
  wait_pool_full(*rt);
  for (int i = 0; i < runs; ++i) {
    bare.push_back(spawn_ms(bare_py));
    wait_pool_full(*rt);  // measure acquire-to-result from a full pool, not the refill
    sandbox::run_result r;
    pooled.push_back(run_ms(*rt, "python3-S", &r));
    setup.push_back(static_cast<double>(r.usage.setup.count()));
  }
  auto b = percentiles(bare);
  row("bare python3 -I -S -c 'print(1)'", b, b.p50);
  row("pooled run, acquire to result", percentiles(pooled), b.p50);
  row("  of which setup (hand-out to interpreter start)", percentiles(setup), b.p50);
  std::printf("  aim: pooled ≤ 0.5× bare (p50)\n");
}

// CPU time used on the whole host so far (all cores, user + system + interrupts), in ms:
// what a run costs includes kernel work done outside its processes (namespace teardown).
double host_cpu_ms() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0;
  in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq;
  return static_cast<double>(user + nice + system + irq + softirq) * 1000.0 /
         static_cast<double>(::sysconf(_SC_CLK_TCK));
}

void section_throughput(int runs) {
  std::printf("\n== throughput: %d runs of print(1) per level (runs/s; host CPU ms per run)\n", runs);
  std::printf("  %-12s %14s %14s %14s %14s %8s\n", "concurrency", "bare", "unshare", "bwrap",
              "sandboxed", "ratio");
  auto rt = make_runtime({});
  const bool unshare_ok = ::geteuid() == 0 && have("/usr/bin/unshare");
  const bool bwrap_ok = have("/usr/bin/bwrap");
  for (int c : {1, 2, 4, 8}) {
    auto measure = [&](auto one) {
      std::atomic<int> next{0};
      // Let the previous contender's namespace teardowns finish (kernel work queues).
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const double cpu0 = host_cpu_ms();
      auto t0 = clock_type::now();
      std::vector<std::thread> ts;
      for (int i = 0; i < c; ++i) {
        ts.emplace_back([&] {
          while (next.fetch_add(1) < runs) one();
        });
      }
      for (auto& t : ts) t.join();
      const double rate = runs / (ms_since(t0) / 1000.0);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // deferred kernel work
      return std::pair{rate, (host_cpu_ms() - cpu0) / runs};
    };
    auto cell = [](std::pair<double, double> m) { return fmt::format("{:7.1f} {:5.1f}", m.first, m.second); };
    auto bare = measure([] { spawn_ms(bare_py); });
    auto uns = unshare_ok ? measure([] { spawn_ms(unshare_py); }) : std::pair{0.0, 0.0};
    auto bw = bwrap_ok ? measure([] { spawn_ms(bwrap_py); }) : std::pair{0.0, 0.0};
    auto ours = measure([&] { run_ms(*rt, "python3-S"); });
    std::printf("  %-12d %14s %14s %14s %14s %7.2fx\n", c, cell(bare).c_str(), cell(uns).c_str(),
                cell(bw).c_str(), cell(ours).c_str(), ours.first / bare.first);
  }
  std::printf("  ratio = sandboxed / bare runs/s (aim at 4: ≥ 0.8×); CPU ms per run is host-wide, so\n"
              "  it includes the kernel's namespace and cgroup teardown done outside the run\n");
}

std::uint64_t rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

void section_flood() {
  std::printf("\n== supervisor RSS during a 1 GiB stdout flood\n");
  auto rt = make_runtime({});
  run_ms(*rt, "python3");
  std::uint64_t before = rss_bytes();
  std::atomic<bool> done{false};
  std::uint64_t peak = before;
  std::thread sampler([&] {
    while (!done) {
      peak = std::max(peak, rss_bytes());
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  auto r = rt->run({.runtime = "python3",
                    .source = "import sys\nb = b'x' * (1 << 20)\nfor i in range(1024): sys.stdout.buffer.write(b)\n",
                    .timeout = std::chrono::milliseconds(8000)},
                   bench_ticket());
  done = true;
  sampler.join();
  double growth_mib = static_cast<double>(peak - before) / (1 << 20);
  std::printf("  code %s, stdout total %.0f MiB, kept %.0f MiB\n", std::string(to_string(r.code)).c_str(),
              r.std_out.total_bytes / 1048576.0, r.std_out.bytes / 1048576.0);
  std::printf("  RSS before %.1f MiB, peak %.1f MiB, growth %.1f MiB (aim ≤ cap 1 MiB + 2 MiB)\n",
              before / 1048576.0, peak / 1048576.0, growth_mib);
}

void section_scheduler() {
  std::printf("\n== scheduler: 10,000 queued requests from 100 tenants\n");
  boost::asio::io_context io;
  sandbox::scheduler_options opts;
  opts.max_running = 8;
  opts.max_queued = 20000;
  opts.default_class.max_running = 8;
  opts.default_class.max_queued = 20000;
  opts.default_class.queue_deadline = std::chrono::hours(1);
  auto s = sandbox::detail::scheduler::create(io.get_executor(), opts);
  std::vector<std::shared_ptr<sandbox::detail::scheduler::slot>> held;
  std::map<std::string, int> completed;
  std::vector<std::string> order;
  // Uneven demand: tenant i queues (i % 10 + 1) × 18 runs, about 10,000 in all.
  int total = 0;
  auto t_submit = clock_type::now();
  for (int round = 0; round < 200; ++round) {
    for (int t = 0; t < 100; ++t) {
      if (round < (t % 10 + 1) * 18 && total < 10000) {
        std::string tenant = "tenant-" + std::to_string(t);
        s->submit(tenant, [&, tenant](sandbox::detail::scheduler::outcome o) {
          if (!o.granted) return;
          order.push_back(tenant);
          held.push_back(std::move(o.granted));
        });
        ++total;
      }
    }
  }
  double submit_ms = ms_since(t_submit);
  io.poll();
  auto t0 = clock_type::now();
  std::size_t dispatched = 0;
  while (true) {
    held.clear();  // every run finishes at once: the next ones are dispatched
    io.poll();
    if (order.size() == dispatched) break;
    dispatched = order.size();
  }
  double dispatch_ms = ms_since(t0);
  // Fairness while every tenant is backlogged: the first 1,800 dispatches (each tenant has at
  // least 18 queued), completed work per tenant; Jain's index (Σx)² / (n Σx²).
  for (std::size_t i = 0; i < std::min<std::size_t>(1800, order.size()); ++i) ++completed[order[i]];
  double sum = 0, sq = 0;
  for (int t = 0; t < 100; ++t) {
    double x = completed["tenant-" + std::to_string(t)];
    sum += x;
    sq += x * x;
  }
  double jain = sq > 0 ? sum * sum / (100 * sq) : 0;
  std::printf("  submitted %d in %.1f ms (%.2f µs each)\n", total, submit_ms, submit_ms * 1000 / total);
  std::printf("  dispatched %zu in %.1f ms: %.2f µs per dispatch (grant + release) (aim ≤ 5 µs)\n",
              order.size(), dispatch_ms, dispatch_ms * 1000 / static_cast<double>(order.size()));
  std::printf("  Jain's fairness index over the backlogged phase: %.4f (aim ≥ 0.99)\n", jain);
}

void section_breakdown(int runs) {
  std::printf("\n== cold-path breakdown: %d runs, median µs per phase\n", runs);
  std::mutex mu;
  std::vector<std::map<std::string, long long>> samples, post;
  auto log = [&](sandbox::log_level, std::string_view line) {
    constexpr std::string_view setup_tag = "setup breakdown us:", post_tag = "teardown breakdown us:";
    auto at = line.find(setup_tag);
    auto pt = line.find(post_tag);
    if (at == std::string_view::npos && pt == std::string_view::npos) return;
    std::map<std::string, long long> m;
    std::istringstream in(std::string(
        at != std::string_view::npos ? line.substr(at + setup_tag.size()) : line.substr(pt + post_tag.size())));
    std::string kv;
    while (in >> kv) {
      auto eq = kv.find('=');
      if (eq != std::string::npos) m[kv.substr(0, eq)] = std::stoll(kv.substr(eq + 1));
    }
    std::lock_guard lock(mu);
    (at != std::string_view::npos ? samples : post).push_back(std::move(m));
  };
  auto rt = make_runtime({}, log);
  std::vector<double> wall, total;
  {
    std::lock_guard lock(mu);
    samples.clear();
  }
  for (int i = 0; i < runs; ++i) {
    sandbox::run_result r;
    total.push_back(run_ms(*rt, "python3-S", &r));
    wall.push_back(static_cast<double>(r.usage.wall.count()));
  }
  struct phase {
    const char* name;
    const char* from;
    const char* to;
  };
  const phase phases[] = {
      {"cgroup: create run cgroup(s) + limits", "t0", "cgroup"},
      {"workspace: host dirs and files", "cgroup", "workspace"},
      {"spawn: clone(namespaces) + exec sandbox-init", "workspace", "spawned"},
      {"attach: cgroup.procs + (uid maps) + send config", "spawned", "config_sent"},
      {"init: start until the config is read", "config_sent", "config_received"},
      {"init: mounts, /proc, /dev, tmpfs, pivot_root, DNS", "config_received", "filesystem_ready"},
      {"init: ready → program received", "filesystem_ready", "go_received"},
      {"init: fork, privileges, seccomp, exec", "go_received", "program_execed"},
      {"host: 'started' received", "program_execed", "started"},
  };
  // One row per phase: the median of (to - from) over the log lines that have both.
  auto print_phases = [](std::span<const phase> list, std::vector<std::map<std::string, long long>>& logged) {
    for (const auto& p : list) {
      std::vector<double> v;
      for (auto& m : logged) {
        if (m.count(p.from) && m.count(p.to)) v.push_back(static_cast<double>(m[p.to] - m[p.from]));
      }
      std::printf("  %-52s %10.0f\n", p.name, percentiles(v).p50);
    }
  };
  std::printf("  %-52s %10s\n", "phase", "median µs");
  print_phases(phases, samples);
  std::printf("  %-52s %10.0f\n", "interpreter: python3 -I -S print(1) (wall_ms × 1000)",
              percentiles(wall).p50 * 1000);
  const phase post_phases[] = {
      {"host: exit → end of output seen", "exited", "finish"},
      {"teardown: kill, confirm the cgroup empty, reap", "finish", "dead"},
      {"teardown: store streams, collect files_out, stats", "dead", "collected"},
      {"teardown: remove cgroup, workspace (before result)", "collected", "destroyed"},
      {"teardown: hand the result over", "destroyed", "delivered"},
  };
  print_phases(post_phases, post);
  std::size_t busy = 0;
  for (auto& m : post) busy += m.count("cgroup_busy") && m["cgroup_busy"] != 0 ? 1 : 0;
  std::printf("  %-52s %10.0f\n", "total, call to result", percentiles(total).p50 * 1000);
  std::printf("  (%zu of %zu runs found their empty cgroup still busy and removed it after the result)\n",
              busy, post.size());
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 30;
  std::string section = "all";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) runs = std::atoi(argv[++i]);
    else if (a == "--section" && i + 1 < argc) section = argv[++i];
    else {
      std::fprintf(stderr, "usage: sandbox_bench [--runs N] [--section cold|pool|throughput|flood|scheduler|breakdown]\n");
      return 2;
    }
  }
  std::printf("agent-sandbox benchmarks — %u CPUs; load average now: ", std::thread::hardware_concurrency());
  std::ifstream la("/proc/loadavg");
  std::string l;
  std::getline(la, l);
  std::printf("%s\n", l.c_str());
  auto want = [&](const char* s) { return section == "all" || section == s; };
  if (want("cold")) section_cold(runs);
  if (want("pool")) section_pool(runs);
  if (want("throughput")) section_throughput(runs * 2);
  if (want("flood")) section_flood();
  if (want("scheduler")) section_scheduler();
  if (want("breakdown")) section_breakdown(runs);
  return 0;
}
