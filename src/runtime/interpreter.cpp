// Interpreter sessions (sandbox/interpreter.hpp): admission like a run of the runtime, a
// session sandbox running the host's driver (src/helpers/interp/driver.py), and the host's
// side of each cell — its nonce, its timer, the interrupt and the kill, the frames read under
// caps, and the code and state taken from the host's own evidence.
#include "sandbox/interpreter.hpp"

#include <sys/random.h>

#include <atomic>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <nlohmann/json.hpp>

#include "core/run/capture.hpp"
#include "core/run/run_session.hpp"
#include "embedded/interp_driver.hpp"
#include "protocol/python_runtime.hpp"
#include "protocol/text_util.hpp"
#include "runtime/interp_frames.hpp"
#include "runtime/runtime_impl.hpp"
#include "sandbox/runtime.hpp"

namespace sandbox {

std::string_view to_string(interpreter_state s) noexcept {
  return s == interpreter_state::kept ? "kept" : "lost";
}

namespace {

using cell_handler =
    boost::asio::any_completion_handler<void(boost::system::error_code, cell_result)>;
using close_handler =
    boost::asio::any_completion_handler<void(boost::system::error_code, session_result)>;
using open_handler =
    boost::asio::any_completion_handler<void(boost::system::error_code, interpreter_start)>;

/// 32 random lowercase hex characters.
std::string new_nonce() {
  unsigned char b[16] = {};
  std::size_t got = 0;
  while (got < sizeof b) {
    const ssize_t n = ::getrandom(b + got, sizeof b - got, 0);
    if (n > 0) got += static_cast<std::size_t>(n);
  }
  static constexpr char hex[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s.push_back(hex[c >> 4]);
    s.push_back(hex[c & 15]);
  }
  return s;
}

/// What the interpreter's spans name besides the session id.
struct span_context {
  std::string tenant, ticket_id, runtime, isolation;
  std::function<void(const span&)> record;  ///< the runtime's span sink (if it still lives)
};

std::int64_t clamp64(std::uint64_t v) {
  return static_cast<std::int64_t>(std::min<std::uint64_t>(v, INT64_MAX));
}

/// Valid UTF-8 text of at most `cap` bytes from untrusted bytes (head and tail when longer).
std::string text_of(std::string_view bytes, std::uint32_t cap) {
  detail::stream_capture_buffer b(0, cap);
  b.append(std::span<const char>(bytes.data(), bytes.size()));
  return b.summary();
}

/**
 * One interpreter session. Everything runs on `strand_`. The read loop drains the session's
 * stdout for its whole life (frames of no running cell are dropped), so a driver or a cell's
 * child writing without end never blocks on the pipe nor grows host memory.
 */
class interp_session final : public interpreter,
                             public std::enable_shared_from_this<interp_session> {
 public:
  interp_session(std::shared_ptr<session> s, std::shared_ptr<blob_store> blobs, span_context sc,
                 const policy& pol, interpreter_options opts, std::chrono::milliseconds idle,
                 std::chrono::milliseconds lifetime, std::chrono::milliseconds ceiling,
                 const boost::asio::any_io_executor& ex)
      : s_(std::move(s)),
        run_(std::dynamic_pointer_cast<detail::run_session>(s_)),
        blobs_(std::move(blobs)),
        tenant_(sc.tenant),
        spans_(std::move(sc)),
        opened_at_(std::chrono::system_clock::now()),
        pol_(pol),
        opts_(opts),
        idle_(idle),
        ceiling_(ceiling),
        ends_at_(std::chrono::steady_clock::now() + lifetime),
        strand_(boost::asio::make_strand(ex)),
        cell_timer_(strand_),
        idle_timer_(strand_),
        gone_timer_(strand_),
        buf_(16 * 1024) {}

  ~interp_session() override = default;

  void start() {
    boost::asio::post(strand_, [self = shared_from_this()] {
      self->read();
      self->arm_idle();
    });
  }

  const std::string& id() const noexcept override { return s_->id(); }
  bool ended() const noexcept override { return ended_flag_.load(); }

 private:
  struct cell {
    std::string nonce;
    /// (Emplaced, never assigned: Boost 1.81's move assignment copies from an lvalue.)
    std::optional<cell_handler> handler;
    cell_result r;
    std::chrono::steady_clock::time_point start;
    std::chrono::system_clock::time_point started_at;  ///< for its span
    std::chrono::milliseconds timeout{0};
    std::uint64_t cpu0_usec = 0;        ///< the session's CPU when the cell was sent
    std::uint64_t egress0 = 0;          ///< the session's refused egress attempts then
    bool answered = false;              ///< the driver's "z" came: no further frame counts
    std::optional<cell_result> answer;  ///< its result, while its usage is read
    std::unique_ptr<detail::stream_capture_buffer> out, err;
    std::uint64_t out_claim = 0, err_claim = 0;
    std::string value, error;
    char open_kind = 0;  ///< 'f' or 'p': the item `d` frames append to
    std::string open_name;
    std::string open_data;
    bool open_over = false;
    std::uint64_t item_bytes = 0;
    bool timer_fired = false;     ///< our timeout fired
    bool cancelled = false;       ///< the caller cancelled the cell (its cancellation slot)
    bool interrupt_sent = false;  ///< SIGINT asked for; the grace timer runs
    bool sent = false;            ///< the cell went to the driver (its inputs were staged)
    std::uint64_t call = 0;       ///< which async_execute this is (cancellation's key)
    std::uint64_t timer_gen = 0;  ///< the arming of cell_timer_ whose expiry counts
    bool killing = false;
    std::string status;  ///< the driver's "z" (ok, error, interrupted)
  };

  void do_execute(cell_request c, cell_handler h) override {
    const std::uint64_t call = ++calls_;
    // Per-operation cancellation: assigned here, where the caller initiates (the slot is the
    // caller's to emit on); `complete` clears it before the handler runs. Acted on in order
    // on the strand, after the cell was started below.
    if (auto slot = boost::asio::get_associated_cancellation_slot(h); slot.is_connected()) {
      slot.assign([w = weak_from_this(), call](boost::asio::cancellation_type) {
        if (auto self = w.lock()) {
          boost::asio::post(self->strand_, [self, call] { self->cancel_cell(call); });
        }
      });
    }
    // (Held by a unique_ptr: Boost 1.81's any_completion_handler has an unconstrained
    // converting constructor, which makes a lambda holding one look copyable.)
    auto held = std::make_unique<cell_handler>(std::move(h));
    boost::asio::post(strand_, [self = shared_from_this(), c = std::move(c), call,
                                held = std::move(held)]() mutable {
      self->execute(std::move(c), std::move(*held), call);
    });
  }

  void do_close(close_handler h) override {
    boost::asio::post(strand_, [self = shared_from_this(), h = std::move(h)]() mutable {
      auto held = std::make_shared<close_handler>(std::move(h));
      self->end_session([self, held](const session_result& r) {
        complete(self->strand_, std::move(*held), boost::system::error_code{}, r);
      });
    });
  }

  /// Completes `h(ec, r)` never inline: posted to `ex`, then dispatched to the handler's
  /// associated executor. The handler travels in a unique_ptr: Boost 1.81's
  /// any_completion_handler has an unconstrained converting constructor, which makes a
  /// lambda holding one look copyable, and a strand copies what looks copyable.
  template <class Handler, class Result>
  static void complete(const boost::asio::strand<boost::asio::any_io_executor>& ex, Handler h,
                       boost::system::error_code ec, Result r) {
    auto held = std::make_unique<Handler>(std::move(h));
    boost::asio::post(ex, [held = std::move(held), ex, ec, r = std::move(r)]() mutable {
      auto to = boost::asio::get_associated_executor(*held, ex);
      boost::asio::dispatch(to, [held = std::move(held), ec, r = std::move(r)]() mutable {
        // The operation is over: its cancellation handler goes (on the caller's executor,
        // where the caller emits).
        boost::asio::get_associated_cancellation_slot(*held).clear();
        std::move (*held)(ec, std::move(r));
      });
    });
  }

  void execute(cell_request c, cell_handler h, std::uint64_t call) {
    cell_result r;
    if (ended_ || closing_) {
      // The caller's request names an interpreter that no longer runs: not a host fault.
      r.code = code::invalid_request;
      r.state = interpreter_state::lost;
      r.session_ended = true;
      r.message = "the interpreter session is over";
      return complete(strand_, std::move(h), boost::asio::error::operation_aborted, std::move(r));
    }
    r.state = interpreter_state::kept;
    if (cur_) {
      r.code = code::invalid_request;
      r.message = "a cell is running";
      return complete(strand_, std::move(h), boost::asio::error::in_progress, std::move(r));
    }
    if (c.code.size() > pol_.max_source_bytes) {
      r.code = code::source_too_large;
      r.message = "code: over " + std::to_string(pol_.max_source_bytes) + " bytes";
      return complete(strand_, std::move(h), {}, std::move(r));
    }
    if (c.timeout && c.timeout->count() <= 0) {
      r.code = code::invalid_request;
      r.message = "timeout: must be > 0";
      return complete(strand_, std::move(h), {}, std::move(r));
    }
    std::vector<input_file> to_add;
    if (auto why = check_inputs(c.files_in, to_add, r.message)) {
      r.code = *why;
      record_cell_span(r, std::chrono::system_clock::now(), {});
      return complete(strand_, std::move(h), {}, std::move(r));
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        ends_at_ - std::chrono::steady_clock::now());
    idle_timer_.cancel();
    cur_ = std::make_unique<cell>();
    cur_->nonce = new_nonce();
    cur_->call = call;
    cur_->handler.emplace(std::move(h));
    cur_->timeout = std::max(std::chrono::milliseconds(1),
                             std::min({c.timeout.value_or(run_request{}.timeout), ceiling_, left}));
    cur_->start = std::chrono::steady_clock::now();
    cur_->started_at = std::chrono::system_clock::now();
    cur_->out = std::make_unique<detail::stream_capture_buffer>(pol_.stream_capture_bytes,
                                                                pol_.summary_bytes);
    cur_->err = std::make_unique<detail::stream_capture_buffer>(pol_.stream_capture_bytes,
                                                                pol_.summary_bytes);
    frames_.expect(cur_->nonce);
    dropped_at_start_ = frames_.dropped();
    stage_then_send(std::move(c.code), std::move(to_add));
  }

  /**
   * A cell's `files_in` against the run's rules and the session's inputs so far: the code
   * of a refusal (with `message`), or none, with the files still to copy in `to_add`.
   */
  std::optional<code> check_inputs(const std::vector<input_file>& in,
                                   std::vector<input_file>& to_add, std::string& message) {
    if (in.empty()) return std::nullopt;
    if (!run_) {
      message = "files_in: this backend's sessions cannot take inputs";
      return code::runtime_unavailable;
    }
    std::map<std::string_view, std::size_t> seen;
    std::uint64_t bytes = staged_bytes_;
    for (std::size_t i = 0; i < in.size(); ++i) {
      const input_file& f = in[i];
      const std::string at = "files_in[" + std::to_string(i) + "]";
      if (auto why = check_file_name(f.name); !why.empty()) {
        message = at + ".name: " + why;
        return code::invalid_request;
      }
      if (auto [it, inserted] = seen.emplace(f.name, i); !inserted) {
        message = at + ".name: duplicate of files_in[" + std::to_string(it->second) + "].name";
        return code::invalid_request;
      }
      if (!is_valid_blob_id(f.blob)) {
        message = at + ".blob: not a blob id (expected 'sha256:' and 64 lowercase hex digits)";
        return code::invalid_request;
      }
      if (auto it = staged_.find(f.name); it != staged_.end()) {
        if (it->second == f.blob) continue;  // already there, the same bytes
        message = at + ".name: the session already has an input of that name";
        return code::invalid_request;
      }
      // Another tenant's blob answers exactly like a missing one.
      auto size = blobs_->size(tenant_, f.blob);
      if (!size) {
        if (size.error() == errc::io_error) {
          message = "the blob store failed";
          return code::internal;
        }
        message = at + ".blob: blob not found";
        return code::blob_not_found;
      }
      bytes += *size;
      to_add.push_back(f);
    }
    if (staged_.size() + to_add.size() > pol_.max_input_files) {
      message = "files_in: the session would hold " +
                std::to_string(staged_.size() + to_add.size()) +
                " inputs, more than the limit of " + std::to_string(pol_.max_input_files);
      return code::invalid_request;
    }
    if (bytes > pol_.max_input_bytes) {
      message = "files_in: the session's inputs would total more than " +
                std::to_string(pol_.max_input_bytes) + " bytes";
      return code::invalid_request;
    }
    return std::nullopt;
  }

  /// 1. The cell's new inputs into the session's input directory (on the run's strand);
  /// 2. the session's usage before the cell (its CPU, and a new peak window); 3. the cell.
  void stage_then_send(std::string code_text, std::vector<input_file> to_add) {
    if (to_add.empty()) return baseline_then_send(std::move(code_text));
    const std::string nonce = cur_->nonce;
    run_->stage_inputs(
        to_add, boost::asio::bind_executor(strand_, [self = shared_from_this(), nonce, to_add,
                                                     code_text = std::move(code_text)](
                                                        code rc, std::string message) mutable {
          if (!self->cur_ || self->cur_->nonce != nonce) return;  // session over
          if (rc != code::ok) return self->refuse_cell(rc, std::move(message));
          for (const auto& f : to_add) {
            self->staged_[f.name] = f.blob;
            if (auto n = self->blobs_->size(self->tenant_, f.blob)) {
              self->staged_bytes_ += *n;
            }
          }
          self->baseline_then_send(std::move(code_text));
        }));
  }

  /// The running cell did not start after all (its inputs were refused): state kept.
  void refuse_cell(code rc, std::string message) {
    cell_result r;
    r.code = rc;
    r.state = interpreter_state::kept;
    r.message = std::move(message);
    record_cell_span(r, cur_->started_at, cur_->timeout);
    const bool cancelled = cur_->cancelled;
    auto h = std::move(*cur_->handler);
    cur_.reset();
    frames_.expect({});
    complete(strand_, std::move(h),
             cancelled ? boost::asio::error::operation_aborted : boost::system::error_code{},
             std::move(r));
    arm_idle();
  }

  void baseline_then_send(std::string code_text) {
    if (!run_) return send_cell(code_text);
    const std::string nonce = cur_->nonce;
    run_->usage(true,
                boost::asio::bind_executor(
                    strand_, [self = shared_from_this(), nonce, code_text = std::move(code_text)](
                                 boost::system::error_code ec, detail::session_usage u) {
                      if (!self->cur_ || self->cur_->nonce != nonce) return;
                      if (!ec) {
                        self->cur_->cpu0_usec = u.cpu_usec;
                        self->cur_->egress0 = u.egress_attempts;
                      }
                      self->send_cell(code_text);
                    }));
  }

  void send_cell(const std::string& code_text) {
    if (cur_->cancelled) {
      return refuse_cell(code::internal,
                         "the cell was cancelled before it started; the interpreter lives on");
    }
    cur_->sent = true;
    cur_->start = std::chrono::steady_clock::now();
    cur_->started_at = std::chrono::system_clock::now();
    nlohmann::json msg{{"op", "exec"},
                       {"n", cur_->nonce},
                       {"code", code_text},
                       {"out_cap", pol_.stream_capture_bytes}};
    send(msg.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    arm_cell_timer(cur_->timeout);
  }

  /// (Re)arms the cell's timer; only the latest arming's expiry counts (an earlier one may
  /// already be queued when a cancellation re-arms it).
  void arm_cell_timer(std::chrono::milliseconds after) {
    const std::uint64_t gen = ++cur_->timer_gen;
    cell_timer_.expires_after(after);
    cell_timer_.async_wait(
        [self = shared_from_this(), n = cur_->nonce, gen](boost::system::error_code ec) {
          if (!ec) self->timer_fired(n, gen);
        });
  }

  /// Queues `line` towards the driver's stdin (in order; one write in flight).
  void send(std::string line) {
    out_q_.push_back(std::move(line));
    if (!writing_) write_next();
  }
  void write_next() {
    if (out_q_.empty() || ended_) {
      writing_ = false;
      return;
    }
    writing_ = true;
    auto line = std::make_shared<std::string>(std::move(out_q_.front()));
    out_q_.erase(out_q_.begin());
    s_->async_write(boost::asio::buffer(*line),
                    boost::asio::bind_executor(strand_, [self = shared_from_this(), line](
                                                            boost::system::error_code,
                                                            std::size_t) { self->write_next(); }));
  }

  void timer_fired(const std::string& nonce, std::uint64_t gen) {
    if (!cur_ || cur_->nonce != nonce || cur_->answered || cur_->timer_gen != gen) return;
    if (!cur_->interrupt_sent) {
      cur_->timer_fired = true;
      return interrupt();
    }
    // 2. It did not yield within the grace: the whole sandbox goes, and the state with it.
    cur_->killing = true;
    end_session([](const session_result&) {});
  }

  /// 1. Our timer fired, or the caller cancelled: interrupt the cell (SIGINT to the
  /// interpreter's main thread), and give it the grace to yield.
  void interrupt() {
    cur_->interrupt_sent = true;
    send(nlohmann::json{{"op", "int"}, {"n", cur_->nonce}}.dump() + "\n");
    arm_cell_timer(opts_.interrupt_grace);
  }

  /// The caller cancelled call `call`: when it is the running cell, it is interrupted as at
  /// its timeout (then killed if it does not yield); otherwise nothing (it is done).
  void cancel_cell(std::uint64_t call) {
    if (!cur_ || cur_->call != call || cur_->answered || cur_->killing || cur_->cancelled) return;
    cur_->cancelled = true;
    // A cell still staging its inputs is refused when they are in (send_cell).
    if (cur_->sent && !cur_->interrupt_sent) interrupt();
  }

  void read() {
    s_->async_read_some(
        boost::asio::buffer(buf_),
        boost::asio::bind_executor(
            strand_, [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
              if (n) {
                self->frames_.feed(std::string_view(self->buf_.data(), n),
                                   [&](char k, std::string_view p) { self->on_frame(k, p); });
              }
              if (ec) return self->channel_gone();
              self->read();
            }));
  }

  /// The driver's channel closed (it exited, was killed, or a cell closed it): the session
  /// ends; a running cell gets its code from the session's own end.
  void channel_gone() {
    // The evidence of an exit is the session's own end: give it a moment to show; a sandbox
    // still alive then has had its channel taken from the driver.
    gone_timer_.expires_after(std::chrono::milliseconds(300));
    gone_timer_.async_wait([self = shared_from_this()](boost::system::error_code) {
      if (!self->s_->stats().ended) self->channel_taken_ = true;
      self->end_session([](const session_result&) {});
    });
  }

  void arm_idle() {
    if (ended_ || closing_) return;
    idle_timer_.expires_after(idle_);
    idle_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!ec && !self->cur_) {
        self->idle_end_ = true;
        self->end_session([](const session_result&) {});
      }
    });
  }

  void on_frame(char kind, std::string_view p) {
    if (!cur_ || cur_->answered) return;
    cell& c = *cur_;
    switch (kind) {
      case 'o':
        c.out->append(std::span<const char>(p.data(), p.size()));
        break;
      case 'e':
        c.err->append(std::span<const char>(p.data(), p.size()));
        break;
      case 'O':
      case 'E': {
        std::uint64_t v = 0;
        for (char d : p.substr(0, 19)) {
          if (d < '0' || d > '9') break;
          v = v * 10 + static_cast<std::uint64_t>(d - '0');
        }
        (kind == 'O' ? c.out_claim : c.err_claim) = v;
        break;
      }
      case 'v':
        if (c.value.size() <= opts_.max_value_bytes) {
          c.value.append(p.substr(0, opts_.max_value_bytes + 1 - c.value.size()));
        }
        break;
      case 'x':
        if (c.error.size() <= 4096) c.error.append(p.substr(0, 4097 - c.error.size()));
        break;
      case 'f':
      case 'p':
        close_item();
        c.open_kind = kind;
        c.open_name = text_of(p, 1024);
        c.open_data.clear();
        c.open_over = false;
        break;
      case 'd':
        if (!c.open_kind || c.open_over) break;
        if (c.item_bytes + c.open_data.size() + p.size() > opts_.max_cell_file_bytes) {
          c.open_over = true;
          c.open_data.clear();
          c.r.outputs_truncated = true;
          break;
        }
        c.open_data.append(p);
        break;
      case 'z':
        close_item();
        c.status = text_of(p, 32);
        finish_alive();
        break;
      default:
        break;
    }
  }

  /// Stores the item the `d` frames were filling (a file or a rich output), within the caps.
  void close_item() {
    cell& c = *cur_;
    if (!c.open_kind) return;
    const char kind = c.open_kind;
    c.open_kind = 0;
    if (c.open_over) return;
    const bool file = kind == 'f';
    const std::size_t n = file ? c.r.files_out.size() : c.r.outputs.size();
    if (n >= (file ? pol_.max_output_files : opts_.max_outputs)) {
      c.r.outputs_truncated = true;
      return;
    }
    auto id = blobs_->put(tenant_, c.open_data);
    if (!id) {
      c.r.outputs_truncated = true;
      return;
    }
    c.item_bytes += c.open_data.size();
    if (file) {
      c.r.files_out.push_back({.name = c.open_name, .blob = *id, .bytes = c.open_data.size()});
    } else {
      c.r.outputs.push_back({.mime_type = c.open_name, .blob = *id, .bytes = c.open_data.size()});
    }
    c.open_data.clear();
  }

  stream_capture capture_of(const detail::stream_capture_buffer& b, std::uint64_t claim) {
    stream_capture s;
    s.summary = b.summary();
    s.bytes = b.stored().size();
    s.total_bytes = std::max<std::uint64_t>(claim, b.total_bytes());
    s.truncated = s.total_bytes > s.bytes;
    if (!b.stored().empty()) {
      if (auto id = blobs_->put(tenant_, b.stored())) s.blob = *id;
    }
    return s;
  }

  /// The common part of a cell's result: what the driver sent, under the caps.
  cell_result take_cell() {
    cell& c = *cur_;
    cell_result r = std::move(c.r);
    r.std_out = capture_of(*c.out, c.out_claim);
    r.std_err = capture_of(*c.err, c.err_claim);
    r.value_truncated = c.value.size() > opts_.max_value_bytes;
    r.value = text_of(c.value, opts_.max_value_bytes);
    r.error = text_of(c.error, 4096);
    r.frames_dropped = frames_.dropped() - dropped_at_start_;
    r.usage.wall = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - c.start);
    return r;
  }

  /// The driver answered for this cell, and the sandbox is alive: state kept. Its usage is
  /// read from the session's cgroup before it completes.
  void finish_alive() {
    cell_timer_.cancel();
    const bool timed_out = cur_->timer_fired;
    const bool cancelled = cur_->cancelled;
    const std::string status = cur_->status;
    cell_result r = take_cell();
    r.state = interpreter_state::kept;
    if (timed_out) {
      r.code = code::timeout;
      r.message = "the cell was interrupted at its timeout; the interpreter lives on";
    } else if (cancelled) {
      r.code = code::internal;
      r.message = "the cell was cancelled and interrupted; the interpreter lives on";
    } else if (status == "error" || status == "interrupted") {
      // (An interrupt we did not send: a KeyboardInterrupt the cell raised itself.)
      r.code = code::error;
      r.message = "the cell raised an exception";
    } else {
      r.code = code::ok;
    }
    cur_->answered = true;
    cur_->answer = std::move(r);
    frames_.expect({});
    if (!run_) return deliver_answer({});
    run_->usage(false, boost::asio::bind_executor(
                           strand_, [self = shared_from_this(), nonce = cur_->nonce](
                                        boost::system::error_code ec, detail::session_usage u) {
                             if (!self->cur_ || self->cur_->nonce != nonce) return;
                             self->deliver_answer(ec ? std::nullopt : std::optional(u));
                           }));
  }

  void deliver_answer(std::optional<detail::session_usage> u) {
    const bool cancelled = cur_->cancelled;
    cell_result r = std::move(*cur_->answer);
    if (u) {
      r.usage.cpu = std::chrono::milliseconds(
          (u->cpu_usec > cur_->cpu0_usec ? u->cpu_usec - cur_->cpu0_usec : 0) / 1000);
      r.usage.peak_memory_bytes = u->peak_memory_bytes;
      // Network attempts the host refused during the cell: `network_disabled`, as a run's
      // (after a timeout, as a run classifies).
      if (u->egress_attempts > cur_->egress0 && r.code != code::timeout && !cancelled) {
        r.code = code::network_disabled;
        r.message = "network access is disabled for this session; " +
                    std::to_string(u->egress_attempts - cur_->egress0) +
                    " attempt(s) refused during the cell; the interpreter lives on";
      }
    }
    record_cell_span(r, cur_->started_at, cur_->timeout);
    auto h = std::move(*cur_->handler);
    cur_.reset();
    complete(strand_, std::move(h),
             cancelled ? boost::asio::error::operation_aborted : boost::system::error_code{},
             std::move(r));
    arm_idle();
  }

  /// A span of this interpreter, `name`, from `start` to now, with the attributes all of its
  /// spans carry (the session's run id, tenant, ticket, runtime, level).
  span base_span(std::string name, std::chrono::system_clock::time_point start) const {
    span sp;
    sp.name = std::move(name);
    sp.start = start;
    sp.end = std::chrono::system_clock::now();
    auto& a = sp.attributes;
    a["sandbox.run_id"] = s_->id();
    a["sandbox.tenant"] = spans_.tenant;
    a["sandbox.ticket_id"] = spans_.ticket_id;
    a["sandbox.runtime"] = spans_.runtime;
    a["sandbox.isolation"] = spans_.isolation;
    return sp;
  }

  /// The cell's span (`sandbox.cell`): the session's id, the cell's number, its code, state
  /// and usage, from the host's evidence as the result is.
  void record_cell_span(const cell_result& r, std::chrono::system_clock::time_point start,
                        std::chrono::milliseconds timeout) {
    ++cells_;
    if (r.state == interpreter_state::lost) state_lost_ = true;
    if (!spans_.record) return;
    try {
      span sp = base_span("sandbox.cell", start);
      auto& a = sp.attributes;
      a["sandbox.cell.index"] = static_cast<std::int64_t>(cells_);
      a["sandbox.cell.state"] = std::string(to_string(r.state));
      a["sandbox.cell.session_ended"] = r.session_ended;
      a["sandbox.cell.frames_dropped"] = clamp64(r.frames_dropped);
      a["sandbox.timeout"] = static_cast<std::int64_t>(timeout.count());
      a["error_code"] = std::string(to_string(r.code));
      a["sandbox.usage.wall_ms"] = static_cast<std::int64_t>(r.usage.wall.count());
      a["sandbox.usage.cpu_ms"] = static_cast<std::int64_t>(r.usage.cpu.count());
      a["sandbox.usage.peak_memory_bytes"] = clamp64(r.usage.peak_memory_bytes);
      if (r.exit_code) a["sandbox.exit_code"] = static_cast<std::int64_t>(*r.exit_code);
      spans_.record(sp);
    } catch (...) {
      // (A span lost to an allocation failure costs nothing else.)
    }
  }

  /// The interpreter session's span (`sandbox.interpreter`), once, at its end: how it
  /// ended, how many cells ran and whether one of them lost the state.
  void record_session_span(const session_result& r) {
    if (!spans_.record) return;
    try {
      span sp = base_span("sandbox.interpreter", opened_at_);
      auto& a = sp.attributes;
      a["sandbox.session.end"] = std::string(to_string(r.end));
      a["sandbox.interpreter.cells"] = static_cast<std::int64_t>(cells_);
      a["sandbox.interpreter.state"] = std::string(state_lost_ ? "lost" : "kept");
      a["error_code"] = std::string(to_string(r.result.code));
      a["sandbox.usage.wall_ms"] = static_cast<std::int64_t>(r.result.usage.wall.count());
      a["sandbox.usage.cpu_ms"] = static_cast<std::int64_t>(r.result.usage.cpu.count());
      a["sandbox.usage.peak_memory_bytes"] = clamp64(r.result.usage.peak_memory_bytes);
      spans_.record(sp);
    } catch (...) {
    }
  }

  /// Ends the session (idempotent): `then` gets its closing record; a running cell
  /// completes with state lost and its code from the evidence.
  void end_session(std::function<void(const session_result&)> then) {
    if (closed_) {
      then(*closed_);
      return;
    }
    waiting_close_.push_back(std::move(then));
    if (closing_) return;
    closing_ = true;
    idle_timer_.cancel();
    s_->async_close(boost::asio::bind_executor(
        strand_, [self = shared_from_this()](boost::system::error_code, session_result r) {
          self->closed(std::move(r));
        }));
  }

  void closed(session_result r) {
    ended_ = true;
    ended_flag_ = true;
    cell_timer_.cancel();
    if (idle_end_ && r.end == session_end::closed) {
      r.end = session_end::idle_timeout;
      r.result.code = code::timeout;
    }
    closed_ = r;
    if (cur_ && cur_->answered) {
      // The driver had answered; the session ended while its usage was read.
      cell_result c = std::move(*cur_->answer);
      c.state = interpreter_state::lost;
      c.session_ended = true;
      c.message = "the session ended as the cell completed";
      record_cell_span(c, cur_->started_at, cur_->timeout);
      const bool cancelled = cur_->cancelled;
      auto h = std::move(*cur_->handler);
      cur_.reset();
      complete(strand_, std::move(h),
               cancelled ? boost::asio::error::operation_aborted : boost::system::error_code{},
               std::move(c));
    }
    if (cur_) {
      const bool killed = cur_->killing;
      const bool cancelled = cur_->cancelled;
      close_item();
      cell_result c = take_cell();
      c.state = interpreter_state::lost;
      c.session_ended = true;
      c.exit_code = r.result.exit_code;
      c.signal = r.result.signal;
      if (killed && cancelled && !cur_->timer_fired) {
        c.code = code::internal;
        c.message =
            "the cell was cancelled and did not yield to the interrupt; the sandbox was killed";
      } else if (killed) {
        c.code = code::timeout;
        c.message = "the cell did not yield to the interrupt; the sandbox was killed";
      } else if (!channel_taken_ && (r.end == session_end::server_exited ||
                                     (r.end == session_end::closed && r.result.exit_code))) {
        // It exited by itself (its channel closed first, then our close found it gone).
        c.code = code::ok;
        c.message = "the interpreter exited; its state is lost";
      } else if (r.end == session_end::closed) {
        c.code = code::internal;
        c.message = "the interpreter closed its channel; the sandbox was killed";
      } else {
        c.code = r.result.code == code::ok ? code::internal : r.result.code;
        c.message = "the sandbox ended (" + std::string(to_string(r.end)) + ")";
      }
      // The session's figures at its end: CPU since the cell was sent, the session's peak.
      const auto cpu_usec = static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::microseconds>(r.result.usage.cpu).count());
      c.usage.cpu = std::chrono::milliseconds(
          (cpu_usec > cur_->cpu0_usec ? cpu_usec - cur_->cpu0_usec : 0) / 1000);
      c.usage.peak_memory_bytes = r.result.usage.peak_memory_bytes;
      record_cell_span(c, cur_->started_at, cur_->timeout);
      auto h = std::move(*cur_->handler);
      cur_.reset();
      complete(strand_, std::move(h),
               cancelled ? boost::asio::error::operation_aborted : boost::system::error_code{},
               std::move(c));
    }
    record_session_span(r);
    auto waiting = std::move(waiting_close_);
    for (auto& w : waiting) w(r);
  }

  std::shared_ptr<session> s_;
  /// The run machine's session (usage, inputs); null for another backend's.
  std::shared_ptr<detail::run_session> run_;
  std::shared_ptr<blob_store> blobs_;
  std::string tenant_;
  span_context spans_;
  std::chrono::system_clock::time_point opened_at_;
  std::uint64_t cells_ = 0;
  bool state_lost_ = false;
  std::map<std::string, std::string> staged_;  ///< inputs added so far: name → blob
  std::uint64_t staged_bytes_ = 0;
  policy pol_;
  interpreter_options opts_;
  std::chrono::milliseconds idle_;
  std::chrono::milliseconds ceiling_;
  std::chrono::steady_clock::time_point ends_at_;
  boost::asio::strand<boost::asio::any_io_executor> strand_;
  boost::asio::steady_timer cell_timer_;
  boost::asio::steady_timer idle_timer_;
  boost::asio::steady_timer gone_timer_;
  bool channel_taken_ = false;  ///< the channel closed while the sandbox lived on
  std::vector<char> buf_;
  detail::interp_frame_reader frames_;
  std::uint64_t dropped_at_start_ = 0;
  std::unique_ptr<cell> cur_;
  std::atomic<std::uint64_t> calls_{0};  ///< async_execute calls so far
  std::vector<std::string> out_q_;
  bool writing_ = false;
  bool closing_ = false;
  bool ended_ = false;
  bool idle_end_ = false;
  std::atomic<bool> ended_flag_{false};
  std::optional<session_result> closed_;
  std::vector<std::function<void(const session_result&)>> waiting_close_;
};

void refuse(open_handler h, const boost::asio::any_io_executor& ex, code c, std::string message) {
  detail::post_completion(
      ex, std::move(h), boost::system::error_code{},
      interpreter_start{.interpreter = nullptr, .code = c, .message = std::move(message)});
}

}  // namespace

void runtime::do_open_interpreter(interpreter_request request, ticket t, open_handler handler) {
  if (!impl_) {
    std::move(handler)(boost::asio::error::operation_aborted,
                       interpreter_start{.interpreter = nullptr,
                                         .code = code::internal,
                                         .message = "the runtime was moved from"});
    return;
  }
  auto impl = impl_;
  const auto& ex = impl->executor();
  const auto& opts = impl->sessions();

  // 1. The runtime: a configured one whose interpreter is Python (the driver is Python).
  const host_catalog catalog = impl->catalog();
  const auto found = catalog.runtimes.find(request.runtime);
  const runtime_spec* spec = impl->spec(request.runtime);
  if (found == catalog.runtimes.end() || !spec || spec->argv.empty()) {
    return refuse(std::move(handler), ex, code::invalid_request,
                  "runtime: unknown runtime " + detail::quote_for_message(request.runtime));
  }
  const std::string& binary = spec->argv.front();
  if (!detail::is_python_runtime(*spec)) {
    return refuse(
        std::move(handler), ex, code::invalid_request,
        "runtime: " + detail::quote_for_message(request.runtime) + " is not a Python runtime");
  }
  if (request.max_lifetime && request.max_lifetime->count() <= 0) {
    return refuse(std::move(handler), ex, code::invalid_request, "max_lifetime: must be > 0");
  }
  if (request.idle_timeout && request.idle_timeout->count() <= 0) {
    return refuse(std::move(handler), ex, code::invalid_request, "idle_timeout: must be > 0");
  }
  // 2. The ticket: unexpired, `code.execute` (a cell is code the model wrote, as a run is).
  if (t.is_expired(std::chrono::system_clock::now())) {
    return refuse(std::move(handler), ex, code::action_denied, "ticket expired");
  }
  if (!t.allows(action::code_execute)) {
    return refuse(std::move(handler), ex, code::action_denied, "ticket: code.execute not granted");
  }
  // 3. The level: the ticket's, as for a run of the runtime.
  const isolation need = required_level(run_request{.runtime = request.runtime}, t, catalog);
  impl->ensure_level(need);
  std::shared_ptr<backend> chosen = impl->backend_at_least(need);
  if (!chosen) {
    return refuse(std::move(handler), ex, code::runtime_unavailable, no_backend_message(need));
  }
  // 4. The image and its pin.
  if (!found->second) {
    return refuse(std::move(handler), ex, code::runtime_unavailable,
                  "runtime: the image of " + detail::quote_for_message(request.runtime) +
                      " is not installed");
  }
  if (t.runtime_digest() && *t.runtime_digest() != *found->second) {
    return refuse(std::move(handler), ex, code::digest_mismatch,
                  "ticket.runtime_digest: the image is not the pinned one");
  }
  // 5. The job: the driver on the interpreter's command line (-I: no user site, no
  //    PYTHON* variables, no script directory on the path; -u: unbuffered).
  const sandbox::policy& pol = impl->policy();
  const auto lifetime = std::min(
      {request.max_lifetime.value_or(opts.default_lifetime), opts.max_lifetime, t.max_timeout()});
  const auto idle = std::min(request.idle_timeout.value_or(opts.idle_timeout), opts.idle_timeout);
  runtime_spec launch = *spec;
  launch.argv = {binary, "-I", "-u", "-c", std::string(detail::embedded::interp_driver())};
  admitted adm;
  adm.request.runtime = request.runtime;
  adm.request.timeout = lifetime;
  adm.request.memory_limit_bytes =
      std::min({adm.request.memory_limit_bytes, pol.max_memory_bytes, t.max_memory_bytes()});
  adm.tenant = t.tenant();
  adm.ticket_id = t.id();
  adm.isolation = chosen->isolation();
  adm.runtime = runtime_info{.name = request.runtime, .digest = *found->second};
  adm.timeout_clamped = request.max_lifetime && *request.max_lifetime > lifetime;
  run_job job{.run_id = detail::new_run_id(),
              .admitted = std::move(adm),
              .runtime = std::move(launch),
              .rootfs = impl->rootfs_of(request.runtime),
              .blobs = impl->blobs(),
              .policy = pol,
              .executor = ex};
  // 6. Started like any session (scheduler slot, caps, span). The session's own idle timer
  //    is off (a cell may run silently for long): the interpreter keeps its own, between
  //    cells.
  auto caller_ex = boost::asio::get_associated_executor(handler, ex);
  span_context sc{.tenant = t.tenant(),
                  .ticket_id = t.id(),
                  .runtime = request.runtime,
                  .isolation = std::string(to_string(chosen->isolation())),
                  .record = [weak = std::weak_ptr<detail::runtime_impl>(impl)](const span& sp) {
                    if (auto rt = weak.lock()) rt->record_span(sp);
                  }};
  const auto ceiling = std::min(t.max_timeout(), pol.max_timeout);
  const auto iopts = impl->interpreters();
  // The session's own idle timer must never fire: a minute past the lifetime, whose deadline
  // ends the session first. (At exactly the lifetime the two raced, and a session the
  // lifetime ended could report `idle_timeout`: seen under emulation in the cgroup2 guest.)
  const auto session_idle_off = lifetime + std::chrono::minutes(1);
  detail::start_session(
      impl, t, std::move(chosen), std::move(job), session_idle_off, 64 * 1024,
      [impl, h = std::make_shared<open_handler>(std::move(handler)), caller_ex, sc, pol, iopts,
       idle, lifetime, ceiling](boost::system::error_code ec, session_start st) mutable {
        interpreter_start out{.interpreter = nullptr, .code = st.code, .message = st.message};
        if (st.session) {
          auto i =
              std::make_shared<interp_session>(std::move(st.session), impl->blobs(), sc, pol, iopts,
                                               idle, lifetime, ceiling, impl->executor());
          i->start();
          out.interpreter = std::move(i);
        }
        boost::asio::dispatch(caller_ex, [h, ec, out = std::move(out)]() mutable {
          std::move (*h)(ec, std::move(out));
        });
      });
}

}  // namespace sandbox
