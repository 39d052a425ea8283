// Shared by the benchmarks: timing, percentiles, and the bare-spawn baseline.
#pragma once

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

namespace bench {

using clock_type = std::chrono::steady_clock;

inline double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

struct pct {
  double p50 = 0, p95 = 0;
};

inline pct percentiles(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
  };
  return {at(0.5), at(0.95)};
}

/// Spawns argv with stdout to a pipe (drained) and an empty environment; wall ms until it has
/// exited.
inline double spawn_ms(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int p[2];
  if (pipe(p) < 0) std::abort();
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, p[1], 1);
  posix_spawn_file_actions_addclose(&fa, p[0]);
  char* env[] = {nullptr};
  auto t0 = clock_type::now();
  pid_t pid;
  if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), env) != 0) std::abort();
  close(p[1]);
  char buf[256];
  while (read(p[0], buf, sizeof buf) > 0) {
  }
  int st;
  waitpid(pid, &st, 0);
  double ms = ms_since(t0);
  close(p[0]);
  posix_spawn_file_actions_destroy(&fa);
  return ms;
}

}  // namespace bench
