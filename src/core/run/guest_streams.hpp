// The run machine's wait for a guest's stream counts (private to src/; the microvm level).
//
// The guest agent counts the bytes the program wrote to stdout and stderr at its relay and
// reports them in `usage` (wire/guest_protocol.hpp) before its `quiet`. The ports deliver
// those bytes on their own way, so some may still be in flight when `quiet` arrives; the run
// machine waits until its capture holds the counts. The counts are untrusted (a guest kernel
// the code took over can claim any number), so the wait is bounded. This header is the
// verdict alone, pure, so every case of it is unit-tested (tests/unit/guest_streams_test.cpp).
#pragma once

#include <chrono>
#include <cstdint>

namespace sandbox::detail {

/// One look at a guest stream wait. Bytes are the host capture's totals and the guest's
/// counts; `*_open` is false once the host's end of that stream reached EOF or failed (no
/// more bytes can come); the durations are since the wait began and since the last new byte.
struct guest_stream_state {
  std::uint64_t received_stdout = 0, received_stderr = 0;
  std::uint64_t counted_stdout = 0, counted_stderr = 0;
  bool stdout_open = true, stderr_open = true;
  std::chrono::milliseconds since_start{0}, since_progress{0};
};

/// The bounds of the wait: `stall` without a new byte, `max` in all.
struct guest_stream_bounds {
  std::chrono::milliseconds stall{3000}, max{10000};
};

/// What to do now.
enum class guest_stream_verdict {
  wait,         ///< a count is not reached yet and bytes may still come
  complete,     ///< the capture holds at least the counts on both streams
  ended_short,  ///< a stream ended (EOF or error) short of its count
  stalled,      ///< no new byte for `stall`
  timed_out,    ///< `max` passed (a guest trickling bytes towards an inflated count)
};

/// The verdict for `s`: `complete` as soon as both counts are reached (bytes past a count
/// are not the wait's concern), else the first bound that holds, in the order listed.
constexpr guest_stream_verdict judge_guest_streams(const guest_stream_state& s,
                                                   const guest_stream_bounds& b) noexcept {
  const bool out_done = s.received_stdout >= s.counted_stdout;
  const bool err_done = s.received_stderr >= s.counted_stderr;
  if (out_done && err_done) return guest_stream_verdict::complete;
  if ((!out_done && !s.stdout_open) || (!err_done && !s.stderr_open))
    return guest_stream_verdict::ended_short;
  if (s.since_progress >= b.stall) return guest_stream_verdict::stalled;
  if (s.since_start >= b.max) return guest_stream_verdict::timed_out;
  return guest_stream_verdict::wait;
}

/// Short words for the host log.
constexpr const char* to_string(guest_stream_verdict v) noexcept {
  switch (v) {
    case guest_stream_verdict::wait:
      return "waiting";
    case guest_stream_verdict::complete:
      return "complete";
    case guest_stream_verdict::ended_short:
      return "the stream ended";
    case guest_stream_verdict::stalled:
      return "no byte came for the stall bound";
    case guest_stream_verdict::timed_out:
      return "the wait's bound passed";
  }
  return "?";
}

}  // namespace sandbox::detail
