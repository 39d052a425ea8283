// The soak: many mixed runs — normal, stdout flood, timeout, OOM, fork bomb — through one
// runtime in one process, four at a time. Every run must still end with its right code late
// in the soak (nothing degrades: no uid, cgroup or descriptor runs out), and at the end the
// host must hold exactly what it held before: no leaked descriptors, threads, run cgroups,
// mounts, work dirs or processes, and the supervising process's resident memory bounded.
//
// 60 runs in [core]; the full soak, 1,000 runs, in [heavy]:
//   build/dev/tests/sandbox_conformance "soak: 1,000*"
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <sstream>
#include <thread>

#include "conformance/suite.hpp"

using conformance::py;
using sandbox::code;

namespace {

enum class kind { normal, flood, timeout, oom, fork_bomb };
constexpr kind kinds[] = {kind::normal, kind::flood, kind::timeout, kind::oom, kind::fork_bomb};
constexpr const char* tenant = "conformance-soak";

/// Waits (bounded) until the backend's warm pools, if it has any, are full and idle, so that
/// a snapshot compares what runs left behind, not a pool's refill in progress.
void settle_pools(conformance::backend& b) {
  for (int i = 0; i < 500; ++i) {
    bool idle = true;
    for (const auto& p : b.rt().warm_pool_stats()) {
      idle = idle && p.ready == p.size && p.starting == 0;
    }
    if (idle) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

sandbox::run_request request_for(kind k, int i) {
  using std::chrono::milliseconds;
  switch (k) {
    case kind::normal:
      return py(fmt::format("print(sum(range(1000)), {})", i));
    case kind::flood:
      // 16 MiB on stdout and 4 MiB on stderr, no newlines.
      return py(
          "import sys\nc = b'y' * 65536\n"
          "for _ in range(256): sys.stdout.buffer.write(c)\n"
          "for _ in range(64): sys.stderr.buffer.write(c)\n");
    case kind::timeout:
      return py("while True: pass", milliseconds(1000));
    case kind::oom: {
      auto r = py("x = b'x' * (400 << 20)\nprint('survived')");
      r.memory_limit_bytes = 64ULL << 20;
      return r;
    }
    case kind::fork_bomb:
      return py(R"PY(
import os, time
made = failed = 0
for i in range(200):
    try:
        pid = os.fork()
    except OSError:
        failed += 1; continue
    if pid == 0:
        time.sleep(30); os._exit(0)
    made += 1
print(made, failed)
)PY");
  }
  return {};
}

/// Checks a run ended the way its kind must, then drops its blobs (so the store's content does
/// not count as the supervisor's memory).
void check_and_forget(conformance::backend& b, kind k, int i, const sandbox::run_result& r) {
  INFO("run " << i << ": code=" << to_string(r.code) << " message=" << r.message
              << "\nstdout: " << r.std_out.summary.substr(0, 200)
              << "\nstderr: " << r.std_err.summary.substr(0, 200));
  const auto& policy = b.rt().policy();
  switch (k) {
    case kind::normal:
      CHECK(r.code == code::ok);
      CHECK(r.std_out.summary == fmt::format("499500 {}\n", i));
      break;
    case kind::flood:
      CHECK(r.code == code::ok);
      CHECK(r.std_out.truncated);
      CHECK(r.std_out.bytes == policy.stream_capture_bytes);
      CHECK(r.std_out.total_bytes == 16ULL << 20);
      CHECK(r.std_err.truncated);
      CHECK(r.std_err.total_bytes == 4ULL << 20);
      break;
    case kind::timeout:
      CHECK(r.code == code::timeout);
      break;
    case kind::oom:
      CHECK(r.code == code::oom);
      CHECK(r.std_out.summary.find("survived") == std::string::npos);
      break;
    case kind::fork_bomb: {
      CHECK(r.code == code::ok);
      int made = 0, failed = 0;
      std::istringstream(r.std_out.summary) >> made >> failed;
      CHECK(made > 0);
      CHECK(made < static_cast<int>(policy.max_pids));
      CHECK(failed > 0);
      break;
    }
  }
  for (const auto* id : {&r.std_out.blob, &r.std_err.blob}) {
    if (!id->empty()) (void)b.rt().blobs()->remove(tenant, *id);
  }
  for (const auto& f : r.files_out) (void)b.rt().blobs()->remove(tenant, f.blob);
}

void soak(conformance::backend& b, int runs) {
  constexpr int parallel = 4;
  auto batch = [&](int first, int count) {
    std::vector<std::future<sandbox::run_result>> fs;
    for (int i = first; i < first + count; ++i) {
      fs.push_back(b.submit(request_for(kinds[i % 5], i), tenant));
    }
    for (int i = first; i < first + count; ++i) {
      check_and_forget(b, kinds[i % 5], i, fs[static_cast<std::size_t>(i - first)].get());
    }
  };
  // Warm-up: one of each kind, so that what is allocated once for good (allocator arenas of
  // the runtime's threads, lazily created descriptors) is in the baseline.
  batch(0, 5);
  settle_pools(b);
  const auto before = conformance::settled_snapshot();
  const std::uint64_t rss_before = conformance::self_rss_bytes();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < runs; i += parallel) batch(5 + i, std::min(parallel, runs - i));
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  settle_pools(b);
  const auto after = conformance::snapshot_back_to(before);
  const std::uint64_t rss_after = conformance::self_rss_bytes();
  std::fprintf(stderr,
               "conformance: soak (%s): %d mixed runs in %.1f s; supervisor RSS %.1f MiB before, "
               "%.1f MiB after; fds %d -> %d, threads %d -> %d\n",
               b.name().c_str(), runs, secs, static_cast<double>(rss_before) / (1 << 20),
               static_cast<double>(rss_after) / (1 << 20), before.fds, after.fds, before.threads,
               after.threads);
  conformance::check_unchanged(before, after);
  // Bounded: a leak of even 32 KiB per run would pass this only for a short soak, and each run
  // moves ~20 MiB of output through the supervisor.
  CHECK(rss_after <= rss_before + (32ULL << 20));
}

}  // namespace

TEST_CASE("soak: 60 mixed runs leave nothing behind and the supervisor's memory bounded",
          "[soak][core]") {
  CONFORMANCE_BACKEND(b);
  soak(b, 60);
}

TEST_CASE("soak: 1,000 mixed runs leave nothing behind and the supervisor's memory bounded",
          "[soak][heavy]") {
  CONFORMANCE_BACKEND(b);
  soak(b, 1000);
}
