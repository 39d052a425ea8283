// The run machine's start-up self-test (self_test.hpp).
#include "core/run/self_test.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "sandbox/blob_store.hpp"
#include "sys/random.hpp"

namespace sandbox::detail {

run_job self_test_job(sandbox::isolation level, const std::filesystem::path& empty_root) {
  run_job job;
  job.run_id = "selftest-" + random_hex(4).value_or("0");
  job.admitted.tenant = "selftest";
  job.admitted.request.runtime = "selftest";
  job.admitted.request.timeout = std::chrono::milliseconds(5000);
  job.admitted.request.memory_limit_bytes = 64ULL << 20;
  job.rootfs = empty_root;
  job.blobs = make_memory_blob_store(64ULL << 20);
  job.runtime.source_name = "probe";
  job.policy = sandbox::policy{};
  job.admitted.isolation = level;
  return job;
}

std::string judge_self_test(const run_result& r, std::string_view detail, bool stream_control) {
  // Egress evidence: the DNS sink recorded the probe's query, and — with user
  // notification — the seccomp record has its UDP connect to 192.0.2.1.
  auto recorded = [&](std::string_view proto, std::string_view host, std::string_view addr) {
    return std::any_of(r.egress_attempts.begin(), r.egress_attempts.end(), [&](const auto& a) {
      return a.protocol == proto && a.host == host && a.address == addr;
    });
  };
  const bool evidence =
      recorded("dns", "probe.invalid", "") && (stream_control || recorded("udp", "", "192.0.2.1"));
  if (r.code == sandbox::code::network_disabled && r.exit_code == 0 &&
      r.std_out.summary == "probe ok\n" && evidence) {
    return {};
  }
  if (!detail.empty()) return std::string(detail);
  if (!r.std_err.summary.empty()) {
    std::string reason = r.std_err.summary;
    while (!reason.empty() && reason.back() == '\n') reason.pop_back();
    return reason;
  }
  return fmt::format("probe ended with code {} (exit {}, egress recorded: {})", to_string(r.code),
                     r.exit_code.value_or(-1), r.egress_attempts.size());
}

}  // namespace sandbox::detail
