#include "core/run/guest_stream_wait.hpp"

#include <fmt/format.h>

#include <tuple>
#include <utility>

namespace sandbox::detail {

using clock = std::chrono::steady_clock;

void guest_stream_wait::begin(const stream_reader& out, const stream_reader& err,
                              std::weak_ptr<void> owner, hooks h) {
  out_ = &out;
  err_ = &err;
  owner_ = std::move(owner);
  h_ = std::move(h);
  awaiting_ = true;
  since_ = last_progress_ = clock::now();
  seen_ = out_->capture().total_bytes() + err_->capture().total_bytes();
  check();
}

void guest_stream_wait::check() {
  if (!awaiting_ || h_.stopped()) return;
  const auto now = clock::now();
  const auto u = h_.usage();
  const auto& out = out_->capture();
  const auto& err = err_->capture();
  const std::uint64_t seen = out.total_bytes() + err.total_bytes();
  if (seen != seen_) {
    seen_ = seen;
    last_progress_ = now;
  }
  using std::chrono::duration_cast;
  using std::chrono::milliseconds;
  const guest_stream_state st{.received_stdout = out.total_bytes(),
                              .received_stderr = err.total_bytes(),
                              .counted_stdout = u ? u->stdout_bytes : 0,
                              .counted_stderr = u ? u->stderr_bytes : 0,
                              .stdout_open = out_->open(),
                              .stderr_open = err_->open(),
                              .since_start = duration_cast<milliseconds>(now - since_),
                              .since_progress = duration_cast<milliseconds>(now - last_progress_)};
  const auto verdict = judge_guest_streams(st, {.stall = stall, .max = max_});
  if (verdict == guest_stream_verdict::wait) {
    timer_.expires_after(std::chrono::milliseconds(100));
    timer_.async_wait([this, keep = owner_.lock()](boost::system::error_code ec) {
      if (!ec) check();
    });
    return;
  }
  awaiting_ = false;
  settled_ = true;
  timer_.cancel();
  if (!u) {
    h_.log(log_level::warning,
           "guest agent: quiet without a usage report; stream counts unchecked");
  } else {
    auto judge = [&](const char* name, const stream_capture_buffer& cap, std::uint64_t counted,
                     std::uint64_t& missing) {
      if (cap.total_bytes() < counted) {
        missing = counted - cap.total_bytes();
        h_.log(log_level::warning,
               fmt::format("guest agent: {} counted {} bytes, the host received {} ({})", name,
                           counted, cap.total_bytes(), to_string(verdict)));
      } else if (cap.total_bytes() > counted) {
        h_.log(log_level::warning,
               fmt::format("guest agent: {} counted {} bytes, the host received {} (more)", name,
                           counted, cap.total_bytes()));
      }
    };
    judge("stdout", out, u->stdout_bytes, stdout_missing_);
    judge("stderr", err, u->stderr_bytes, stderr_missing_);
  }
  h_.settled();
}

void guest_stream_wait::note_shortfall(run_result& r) const {
  std::string note;
  for (auto [s, missing, name] : {std::tuple{&r.std_out, stdout_missing_, "stdout"},
                                  std::tuple{&r.std_err, stderr_missing_, "stderr"}}) {
    if (missing == 0) continue;
    s->truncated = true;
    note += fmt::format("{}{}: {} bytes the guest counted did not arrive", note.empty() ? "" : "; ",
                        name, missing);
  }
  if (!note.empty()) r.message += (r.message.empty() ? "" : "; ") + note;
}

}  // namespace sandbox::detail
