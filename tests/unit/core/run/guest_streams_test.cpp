// The verdict of the run machine's wait for a guest's stream counts (core/guest_streams.hpp):
// an honest count ends the wait once reached; a count the host cannot reach — a lying guest, a
// short delivery, a trickle towards an inflated count — ends it within its bounds.
#include "core/run/guest_streams.hpp"

#include <catch2/catch.hpp>

using namespace std::chrono_literals;
using sandbox::detail::guest_stream_bounds;
using sandbox::detail::guest_stream_state;
using sandbox::detail::guest_stream_verdict;
using sandbox::detail::judge_guest_streams;

namespace {
constexpr guest_stream_bounds bounds{.stall = 3000ms, .max = 10000ms};
}

TEST_CASE("guest streams: both counts reached completes the wait", "[microvm][streams]") {
  guest_stream_state s{.received_stdout = 16 << 20,
                       .received_stderr = 4 << 20,
                       .counted_stdout = 16 << 20,
                       .counted_stderr = 4 << 20};
  CHECK(judge_guest_streams(s, bounds) == guest_stream_verdict::complete);
  // Zero counts (a silent program) complete at once, whatever the time.
  CHECK(judge_guest_streams(guest_stream_state{}, bounds) == guest_stream_verdict::complete);
  // More than counted (a guest under-reporting) is not waited on; the capture keeps what came.
  s.received_stderr += 1;
  CHECK(judge_guest_streams(s, bounds) == guest_stream_verdict::complete);
  // Reached even though the host's ends closed and the bounds passed.
  s.stdout_open = s.stderr_open = false;
  s.since_start = s.since_progress = 1h;
  CHECK(judge_guest_streams(s, bounds) == guest_stream_verdict::complete);
}

TEST_CASE("guest streams: bytes in flight are waited for", "[microvm][streams]") {
  guest_stream_state s{.received_stdout = 12 << 20,
                       .received_stderr = 4 << 20,
                       .counted_stdout = 16 << 20,
                       .counted_stderr = 4 << 20,
                       .since_start = 9999ms,
                       .since_progress = 2999ms};
  CHECK(judge_guest_streams(s, bounds) == guest_stream_verdict::wait);
  s.received_stdout = 16 << 20;
  CHECK(judge_guest_streams(s, bounds) == guest_stream_verdict::complete);
}

TEST_CASE("guest streams: a count the host cannot reach ends the wait within its bounds",
          "[microvm][streams]") {
  // A lying guest: a count far above what it sends, on either stream.
  for (bool on_stdout : {true, false}) {
    guest_stream_state s{.received_stdout = 10,
                         .received_stderr = 10,
                         .counted_stdout = on_stdout ? ~0ULL : 10,
                         .counted_stderr = on_stdout ? 10 : ~0ULL};
    INFO("on stdout: " << on_stdout);
    CHECK(judge_guest_streams(s, bounds) == guest_stream_verdict::wait);
    // No byte for the stall bound.
    s.since_progress = 3000ms;
    CHECK(judge_guest_streams(s, bounds) == guest_stream_verdict::stalled);
    // A trickle (progress all along) still ends at the wait's bound.
    s.since_progress = 1ms;
    s.since_start = 10000ms;
    CHECK(judge_guest_streams(s, bounds) == guest_stream_verdict::timed_out);
    // The host's end of the short stream closed (the VMM died): no more can come.
    s.since_start = 0ms;
    (on_stdout ? s.stdout_open : s.stderr_open) = false;
    CHECK(judge_guest_streams(s, bounds) == guest_stream_verdict::ended_short);
  }
  // The other stream's end closing does not end the wait for a stream still open and short.
  guest_stream_state s{.received_stdout = 5,
                       .received_stderr = 10,
                       .counted_stdout = 10,
                       .counted_stderr = 10,
                       .stderr_open = false};
  CHECK(judge_guest_streams(s, bounds) == guest_stream_verdict::wait);
}
