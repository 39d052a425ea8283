// The scripted fake backend (target sandbox::testing). No process is started: each run is
// answered from the first matching rule, its streams and output files stored as real blobs
// in the job's blob store, and completed on the handler's associated executor — never inline.
#include "sandbox/testing/fake_backend.hpp"

#include <algorithm>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/system_executor.hpp>
#include <csignal>
#include <exception>
#include <string>
#include <utility>

#include "sandbox/admission.hpp"

namespace sandbox::testing {

namespace asio = boost::asio;
using boost::system::error_code;
using handler_type = asio::any_completion_handler<void(error_code, run_result)>;

namespace {

// --- summaries (same shape as the real capture: head + marker + tail, valid UTF-8) --------

bool is_ascii_control(unsigned char c) { return c < 0x20 || c == 0x7f; }

void append_hex_escape(std::string& out, unsigned char c) {
  static constexpr char hex[] = "0123456789abcdef";
  out += "\\x";
  out += hex[c >> 4];
  out += hex[c & 0xf];
}

std::size_t utf8_length(unsigned char lead) {
  if (lead >= 0xc2 && lead <= 0xdf) return 2;
  if (lead >= 0xe0 && lead <= 0xef) return 3;
  if (lead >= 0xf0 && lead <= 0xf4) return 4;
  return 0;
}

/// Display form of the character at `in[i]`; sets `used` to the bytes consumed. Keeps
/// \n, \r, \t; escapes other control characters and invalid bytes as `\xNN`.
std::string display_char(std::string_view in, std::size_t i, std::size_t& used) {
  std::string out;
  const auto c = static_cast<unsigned char>(in[i]);
  if (c < 0x80) {
    used = 1;
    if (is_ascii_control(c) && c != '\n' && c != '\r' && c != '\t') {
      append_hex_escape(out, c);
    } else {
      out += static_cast<char>(c);
    }
    return out;
  }
  const std::size_t n = utf8_length(c);
  if (n != 0 && i + n <= in.size() && is_valid_utf8(in.substr(i, n))) {
    used = n;
    const bool c1_control = n == 2 && c == 0xc2 && static_cast<unsigned char>(in[i + 1]) < 0xa0;
    if (c1_control) {
      append_hex_escape(out, c);
      append_hex_escape(out, static_cast<unsigned char>(in[i + 1]));
    } else {
      out.append(in.substr(i, n));
    }
    return out;
  }
  used = 1;
  append_hex_escape(out, c);
  return out;
}

/// Escapes a prefix of `in` into at most `budget` bytes; `consumed` gets the input bytes used.
std::string escape_prefix(std::string_view in, std::size_t budget, std::size_t& consumed) {
  std::string out;
  std::size_t i = 0;
  while (i < in.size()) {
    std::size_t used = 0;
    std::string piece = display_char(in, i, used);
    if (out.size() + piece.size() > budget) break;
    out += piece;
    i += used;
  }
  consumed = i;
  return out;
}

/// Escapes a suffix of `in` into at most `budget` bytes; `consumed` gets the input bytes used.
std::string escape_suffix(std::string_view in, std::size_t budget, std::size_t& consumed) {
  std::size_t take = std::min(budget, in.size());
  for (;;) {
    std::size_t start = in.size() - take;
    // Do not start inside a UTF-8 sequence (at most 3 continuation bytes to skip).
    for (int k = 0;
         k < 3 && start < in.size() && (static_cast<unsigned char>(in[start]) & 0xc0) == 0x80;
         ++k) {
      ++start;
    }
    std::size_t used = 0;
    std::string out = escape_prefix(in.substr(start), SIZE_MAX, used);
    if (out.size() <= budget) {
      consumed = in.size() - start;
      return out;
    }
    const std::size_t excess = out.size() - budget;
    if (take == 0) {
      consumed = 0;
      return {};
    }
    take -= std::min(take, std::max<std::size_t>(1, excess / 4));
  }
}

std::string summarize(std::string_view text, std::size_t limit) {
  std::size_t used = 0;
  std::string full = escape_prefix(text, limit, used);
  if (used == text.size()) return full;
  const std::string max_marker = "\n…[" + std::to_string(text.size()) + " bytes omitted]…\n";
  if (limit < max_marker.size() + 2) return full;  // too small for head + tail: head only
  const std::size_t budget = limit - max_marker.size();
  std::size_t head_used = 0;
  std::string head = escape_prefix(text, budget / 2, head_used);
  std::size_t tail_used = 0;
  std::string tail = escape_suffix(text.substr(head_used), budget - head.size(), tail_used);
  const std::size_t omitted = text.size() - head_used - tail_used;
  return head + "\n…[" + std::to_string(omitted) + " bytes omitted]…\n" + tail;
}

// --- building the result --------------------------------------------------------------

stream_capture capture(const run_job& job, std::string_view text, bool& store_failed) {
  stream_capture c;
  const std::uint64_t cap = job.policy.stream_capture_bytes;
  const std::string_view stored =
      text.substr(0, static_cast<std::size_t>(std::min<std::uint64_t>(cap, text.size())));
  c.bytes = stored.size();
  c.total_bytes = text.size();
  c.truncated = c.total_bytes > c.bytes;
  c.summary = summarize(text, job.policy.summary_bytes);
  if (job.blobs) {
    auto id = job.blobs->put(job.admitted.tenant, stored);
    if (id) {
      c.blob = *id;
    } else {
      store_failed = true;
    }
  }
  return c;
}

run_result build_result(const run_job& job, scripted_run run) {
  run_result r;
  r.code = run.code;
  r.message = std::move(run.message);
  r.exit_code = run.exit_code;
  r.signal = run.signal;
  r.usage = run.usage;
  r.oom_kills = run.oom_kills;
  r.violation = std::move(run.violation);

  bool store_failed = false;
  r.std_out = capture(job, run.std_out, store_failed);
  r.std_err = capture(job, run.std_err, store_failed);

  // Output files: like the collector, visited in byte order of their names, capped by the
  // request's (already clamped) limits.
  std::stable_sort(run.files_out.begin(), run.files_out.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  const output_limits& lim = job.admitted.request.files_out;
  std::uint64_t total = 0;
  for (auto& [name, content] : run.files_out) {
    dropped_file d{.name_display = escape_name_for_display(name), .reason = drop_reason::bad_name};
    if (!check_file_name(name).empty()) {
      r.files_dropped.push_back(std::move(d));
      continue;
    }
    if (r.files_out.size() >= lim.max_files) {
      d.reason = drop_reason::count_limit;
      r.files_dropped.push_back(std::move(d));
      continue;
    }
    if (total + content.size() > lim.max_bytes) {
      d.reason = drop_reason::bytes_limit;
      r.files_dropped.push_back(std::move(d));
      continue;
    }
    std::string id;
    if (job.blobs) {
      auto put = job.blobs->put(job.admitted.tenant, content);
      if (!put) {
        d.reason = drop_reason::quota_exceeded;
        r.files_dropped.push_back(std::move(d));
        continue;
      }
      id = std::move(*put);
    }
    total += content.size();
    r.files_out.push_back(
        output_file{.name = name, .blob = std::move(id), .bytes = content.size()});
  }
  for (auto& d : run.files_dropped) r.files_dropped.push_back(std::move(d));

  constexpr std::size_t max_egress = 64;
  for (auto& e : run.egress_attempts) {
    if (r.egress_attempts.size() < max_egress) {
      r.egress_attempts.push_back(std::move(e));
    } else {
      ++r.egress_attempts_dropped;
    }
  }

  if (store_failed) {
    r.code = code::internal;
    r.message = "could not store the run's output";
  }

  r.run_id = job.run_id;
  r.backend = "fake";
  note_admitted(r, job.admitted);
  return r;
}

/// One run held by the fake until it completes, is cancelled, or its delay passes.
struct fake_op : std::enable_shared_from_this<fake_op> {
  std::mutex mu;
  bool done = false;
  std::optional<handler_type> handler;
  asio::any_completion_executor work;  // the handler's executor, tracking work
  asio::any_io_executor io;            // the runtime's executor (may be empty)
  std::optional<asio::steady_timer> timer;
  run_result result;
  run_result aborted;

  /// Completes once: with the scripted result, or (cancelled) with operation_aborted.
  void finish(bool cancelled) {
    std::optional<handler_type> h;
    asio::any_completion_executor ex;
    {
      std::lock_guard lk(mu);
      if (done || !handler) return;
      done = true;
      h.emplace(std::move(*handler));
      handler.reset();
      ex = std::move(work);
      if (cancelled && timer) timer->cancel();
    }
    error_code ec = cancelled ? error_code(asio::error::operation_aborted) : error_code();
    run_result r = cancelled ? std::move(aborted) : std::move(result);
    auto fn = [h = std::move(*h), ec, r = std::move(r)]() mutable {
      std::move(h)(ec, std::move(r));
    };
    if (cancelled) {
      // Inside a cancellation emit: never complete inline; post through the runtime's (or
      // the system) executor and dispatch from there (any_completion_executor cannot
      // promise not to block).
      auto hop = [ex, fn = std::move(fn)]() mutable { asio::dispatch(ex, std::move(fn)); };
      if (io) {
        asio::post(io, std::move(hop));
      } else {
        asio::post(asio::system_executor(), std::move(hop));
      }
    } else {
      asio::dispatch(ex, std::move(fn));
    }
  }
};

}  // namespace

// --- result_with ------------------------------------------------------------------------

scripted_run result_with(sandbox::code c, scripted_run base) {
  base.code = c;
  auto default_message = [&](std::string_view m) {
    if (base.message.empty()) base.message = std::string(m);
  };
  switch (c) {
    case code::ok:
      break;
    case code::timeout:
      default_message("wall-clock timeout hit; the run was killed");
      base.exit_code.reset();
      if (!base.signal) base.signal = SIGKILL;
      break;
    case code::oom:
      default_message("memory limit hit; the run was killed");
      base.exit_code.reset();
      if (!base.signal) base.signal = SIGKILL;
      if (base.oom_kills == 0) base.oom_kills = 1;
      break;
    case code::seccomp_violation:
      if (!base.violation) base.violation = "ptrace";
      default_message("forbidden system call: " + *base.violation);
      base.exit_code.reset();
      if (!base.signal) base.signal = SIGSYS;
      break;
    case code::network_disabled:
      default_message("the code tried to reach the network; network is disabled for this run");
      if (base.egress_attempts.empty()) {
        base.egress_attempts.push_back(egress_attempt{.protocol = "tcp",
                                                      .host = "",
                                                      .address = "192.0.2.1",
                                                      .port = 443,
                                                      .allowed = false,
                                                      .reason = "network disabled"});
      }
      break;
    case code::output_limit:
      default_message("output over the limit");
      break;
    case code::invalid_request:
      default_message("invalid request");
      base.exit_code.reset();
      break;
    case code::source_too_large:
      default_message("source: over the size limit");
      base.exit_code.reset();
      break;
    case code::action_denied:
      default_message("the ticket does not allow code.execute");
      base.exit_code.reset();
      break;
    case code::approval_required:
      default_message("network access needs approval");
      base.exit_code.reset();
      break;
    case code::approval_denied:
      default_message("network access was not approved");
      base.exit_code.reset();
      break;
    case code::blob_not_found:
      default_message("files_in[0].blob: not found");
      base.exit_code.reset();
      break;
    case code::queue_timeout:
      default_message("waited in the queue past its deadline");
      base.exit_code.reset();
      break;
    case code::capacity:
      default_message("the host's queue is full");
      base.exit_code.reset();
      break;
    case code::runtime_unavailable:
      default_message("no backend at the ticket's isolation level");
      base.exit_code.reset();
      break;
    case code::digest_mismatch:
      default_message("runtime_digest: not the installed image");
      base.exit_code.reset();
      break;
    case code::internal:
      default_message("internal error");
      base.exit_code.reset();
      break;
    case code::pids_limit:
      default_message("too many processes: the sandbox reached the run's pids limit");
      base.exit_code.reset();
      if (!base.signal) base.signal = SIGKILL;
      break;
    case code::error:  // an interpreter cell's code; a scripted run may still use it
      default_message("the cell raised an exception");
      base.exit_code.reset();
      break;
  }
  return base;
}

// --- rules ------------------------------------------------------------------------------

fake_backend::rule& fake_backend::rule::respond(scripted_run run) {
  answer_ = [run = std::move(run)](const admitted&) { return run; };
  return *this;
}

fake_backend::rule& fake_backend::rule::respond_stdout(std::string stdout_text) {
  scripted_run run;
  run.std_out = std::move(stdout_text);
  return respond(std::move(run));
}

fake_backend::rule& fake_backend::rule::respond_with(
    std::function<scripted_run(const admitted&)> fn) {
  answer_ = std::move(fn);
  return *this;
}

fake_backend::rule& fake_backend::rule::times(std::size_t n) {
  remaining_ = n;
  return *this;
}

fake_backend::fake_backend(sandbox::isolation level) : level_(level) {}

fake_backend::rule& fake_backend::on(std::function<bool(const admitted&)> matcher) {
  auto r = std::make_unique<rule>();
  r->matcher_ = std::move(matcher);
  std::lock_guard lk(mu_);
  rules_.push_back(std::move(r));
  return *rules_.back();
}

fake_backend::rule& fake_backend::on_source_contains(std::string needle) {
  return on([needle = std::move(needle)](const admitted& a) {
    return a.request.source.find(needle) != std::string::npos;
  });
}

fake_backend::rule& fake_backend::otherwise() { return fallback_; }

std::vector<admitted> fake_backend::requests() const {
  std::lock_guard lk(mu_);
  return seen_;
}

// --- execution --------------------------------------------------------------------------

void fake_backend::do_execute(run_job job, handler_type handler) {
  // 1. Pick the answer (first matching rule with uses left; else the fallback) and record
  //    the request. The answer function runs outside the lock: it may call requests().
  std::function<scripted_run(const admitted&)> answer;
  {
    std::lock_guard lk(mu_);
    seen_.push_back(job.admitted);
    for (auto& r : rules_) {
      if (r->remaining_ == 0 || !r->matcher_) continue;
      bool match = false;
      try {
        match = r->matcher_(job.admitted);
      } catch (...) {
        match = false;
      }
      if (!match) continue;
      if (r->remaining_ != static_cast<std::size_t>(-1)) --r->remaining_;
      answer = r->answer_;
      if (!answer) answer = [](const admitted&) { return scripted_run{}; };
      break;
    }
    if (!answer && fallback_.remaining_ != 0 && fallback_.answer_) {
      if (fallback_.remaining_ != static_cast<std::size_t>(-1)) --fallback_.remaining_;
      answer = fallback_.answer_;
    }
  }
  scripted_run run;
  bool threw = false;
  if (answer) {
    try {
      run = answer(job.admitted);
    } catch (...) {
      threw = true;
    }
  }
  const auto delay = run.delay;

  auto op = std::make_shared<fake_op>();
  op->io = job.executor;
  if (threw) {
    op->result.code = code::internal;
    op->result.message = "internal error";  // the rule's function threw
    op->result.exit_code.reset();
    op->result.run_id = job.run_id;
    op->result.isolation = job.admitted.isolation;
    op->result.runtime = job.admitted.runtime;
  } else {
    op->result = build_result(job, std::move(run));
  }
  op->aborted.code = code::internal;
  op->aborted.message = "the run was cancelled";
  op->aborted.run_id = job.run_id;
  op->aborted.isolation = job.admitted.isolation;
  op->aborted.runtime = job.admitted.runtime;
  op->aborted.timeout = job.admitted.request.timeout;
  op->aborted.memory_limit_bytes = job.admitted.request.memory_limit_bytes;

  auto ex = asio::get_associated_executor(handler, asio::system_executor());
  auto slot = asio::get_associated_cancellation_slot(handler);
  op->work = asio::prefer(ex, asio::execution::outstanding_work.tracked);

  // 2. Arm the delay (if any) and the cancellation slot under the op's lock, so that a
  //    cancellation cannot slip in between.
  std::lock_guard lk(op->mu);
  op->handler.emplace(std::move(handler));
  if (delay.count() > 0) {
    if (job.executor) {
      op->timer.emplace(job.executor, delay);
    } else {
      op->timer.emplace(asio::system_executor(), delay);  // used without a runtime
    }
    op->timer->async_wait([op](error_code) { op->finish(false); });
  } else {
    // Never inline inside async_execute: complete on the next turn of the executor.
    if (job.executor) {
      asio::post(job.executor, [op] { op->finish(false); });
    } else {
      asio::post(asio::system_executor(), [op] { op->finish(false); });
    }
  }
  if (slot.is_connected()) {
    slot.assign([w = std::weak_ptr<fake_op>(op)](asio::cancellation_type type) {
      if (type == asio::cancellation_type::none) return;
      if (auto o = w.lock()) o->finish(true);
    });
  }
}

// --- runtime for tests ------------------------------------------------------------------

std::string fake_digest(std::string_view runtime_name) {
  return blob_id_of("agent-sandbox fake runtime image: " + std::string(runtime_name));
}

result<runtime> make_runtime(std::shared_ptr<fake_backend> fake, sandbox::policy policy,
                             std::shared_ptr<sandbox::approver> approver) {
  runtime_options o;
  o.approver = std::move(approver);
  o.blobs = make_memory_blob_store();
  o.policy = std::move(policy);
  o.runtimes = default_runtimes();
  o.fixed_digests = {{"python3", fake_digest("python3")}, {"node", fake_digest("node")}};
  o.process_backend = false;
  auto rt = runtime::create(std::move(o));
  if (!rt) return rt.error();
  if (fake) rt->add_backend(std::move(fake));
  return rt;
}

}  // namespace sandbox::testing
