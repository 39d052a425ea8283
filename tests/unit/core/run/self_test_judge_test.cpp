// The start-up self-test's verdict (core/run/self_test.hpp) and a run's warm-pool face
// (core/run/pool_instance.hpp): pure, so checked without a sandbox.
#include <catch2/catch.hpp>
#include <string>

#include "core/run/pool_instance.hpp"
#include "core/run/self_test.hpp"

namespace {

using sandbox::code;
using sandbox::detail::judge_self_test;
using sandbox::detail::pool_instance;
using sandbox::detail::prepare_failure;

sandbox::run_result passing(bool with_udp) {
  sandbox::run_result r;
  r.code = code::network_disabled;
  r.exit_code = 0;
  r.std_out.summary = "probe ok\n";
  r.egress_attempts.push_back({.protocol = "dns", .host = "probe.invalid", .address = ""});
  if (with_udp)
    r.egress_attempts.push_back({.protocol = "udp", .host = "", .address = "192.0.2.1"});
  return r;
}

}  // namespace

TEST_CASE("self-test passes only with the probe's output and the egress evidence", "[selftest]") {
  CHECK(judge_self_test(passing(true), "", false).empty());
  // Stream mode has no seccomp user notification: the DNS record is the evidence.
  CHECK(judge_self_test(passing(false), "", true).empty());
  // Packet mode without the seccomp record of the UDP connect fails.
  CHECK(judge_self_test(passing(false), "", false) ==
        "probe ended with code network_disabled (exit 0, egress recorded: 1)");
  auto ok_code = passing(true);
  ok_code.code = code::ok;  // the egress attempt went unnoticed by the classification
  CHECK(!judge_self_test(ok_code, "", false).empty());
}

TEST_CASE("self-test reason: the run machine's detail, else the probe's stderr", "[selftest]") {
  auto r = passing(true);
  r.exit_code = 3;
  r.std_err.summary = "uid check failed\n\n";
  CHECK(judge_self_test(r, "sandbox-init exited during setup", false) ==
        "sandbox-init exited during setup");
  CHECK(judge_self_test(r, "", false) == "uid check failed");
}

TEST_CASE("pool instance: the pool hears of its instance once", "[warm_pool]") {
  pool_instance p;
  int prepared_ok = 0, prepared_failed = 0, lost = 0, started = 0;
  auto count = [&](bool ok, const prepare_failure&) { ++(ok ? prepared_ok : prepared_failed); };
  p.expect(count, [&] { ++lost; });
  CHECK(!p.is_ready_idle());
  p.became_ready();
  CHECK(prepared_ok == 1);
  CHECK(p.is_ready_idle());
  // Lost idle: `on_lost`, once.
  p.gone({});
  p.gone({});
  CHECK(lost == 1);
  CHECK(prepared_failed == 0);

  pool_instance q;
  prepare_failure heard;
  q.expect(
      [&](bool ok, const prepare_failure& f) {
        ++(ok ? prepared_ok : prepared_failed);
        heard = f;
      },
      [&] { ++lost; });
  q.gone({.why = "importing 'x' raised", .preload_raised = true});  // failed while preparing
  CHECK(prepared_failed == 1);
  CHECK(heard.why == "importing 'x' raised");  // the pool hears why
  CHECK(heard.preload_raised);
  CHECK(lost == 1);

  pool_instance h;
  h.expect(count, [&] { ++lost; });
  h.became_ready();
  h.hand_out([&] { ++started; });
  h.activate();
  CHECK(!h.is_ready_idle());
  h.started();
  h.started();
  CHECK(started == 1);
  h.gone({});  // handed out: its loss is no longer the pool's
  CHECK(lost == 1);
}
