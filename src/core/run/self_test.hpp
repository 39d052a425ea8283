// The run machine's start-up self-test (private to src/): a real sandbox whose probe checks
// uid, capabilities, no_new_privs and seccomp from the inside, and whose egress attempt the
// run machine must record.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "sandbox/backend.hpp"
#include "sandbox/protocol.hpp"

namespace sandbox::detail {

/// The self-test's run: the probe as program, `empty_root` as its image root, 5 s, 64 MiB,
/// the default policy, a private in-memory blob store, at isolation `level`.
run_job self_test_job(sandbox::isolation level, const std::filesystem::path& empty_root);

/**
 * Empty when the self-test's run `r` passed: the probe printed "probe ok", exited 0, and
 * the run ended `network_disabled` with the egress evidence recorded — the DNS sink's
 * record of its query and, with seccomp user notification (`stream_control` false), the
 * record of its UDP connect to 192.0.2.1. Otherwise the reason: the run machine's own
 * detail (`detail`, host log only), else the probe's stderr, else the code and figures.
 */
std::string judge_self_test(const run_result& r, std::string_view detail, bool stream_control);

}  // namespace sandbox::detail
