// The runtime: stores, catalog, backends, and the life of one `async_run` call
// (admit → check blobs → pick backend → execute → fill result → span → complete).
#include "sandbox/runtime.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <pwd.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/execution_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/query.hpp>
#include <boost/asio/system_executor.hpp>
#include <cerrno>
#include <cstdlib>
#include <exception>
#include <future>
#include <random>
#include <system_error>
#include <utility>
#include <variant>

#include "backends/levels.hpp"
#include "core/egress/secret_file.hpp"
#include "protocol/sha256.hpp"
#include "protocol/text_util.hpp"
#include "runtime/runtime_impl.hpp"
#include "sandbox/admission.hpp"
#include "sandbox/egress.hpp"
#include "sys/random.hpp"

namespace sandbox {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using boost::system::error_code;

// (default_runtimes: src/protocol/registry.cpp, beside the runtime checks.)

namespace {

const fs::path root_state_dir = "/run/agent-sandbox";
const fs::path root_image_dir = "/var/lib/agent-sandbox/images";
const fs::path root_blob_dir = "/var/lib/agent-sandbox/blobs";

bool is_root() noexcept { return ::geteuid() == 0; }

/// An environment variable holding an absolute path (XDG: relative values are ignored).
std::optional<fs::path> absolute_env(const char* name) {
  const char* v = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): read-only use
  if (v == nullptr || *v == '\0') return std::nullopt;
  fs::path p(v);
  if (!p.is_absolute()) return std::nullopt;
  return p;
}

fs::path fallback_user_dir() {
  return fs::path("/tmp") / ("agent-sandbox-" + std::to_string(::geteuid()));
}

fs::path home_dir() {
  if (auto h = absolute_env("HOME")) return *h;
  std::array<char, 4096> buf{};
  passwd pw{};
  passwd* out = nullptr;
  if (::getpwuid_r(::geteuid(), &pw, buf.data(), buf.size(), &out) == 0 && out != nullptr &&
      out->pw_dir != nullptr && out->pw_dir[0] == '/') {
    return fs::path(out->pw_dir);
  }
  return fallback_user_dir();
}

fs::path user_data_dir() {
  if (auto x = absolute_env("XDG_DATA_HOME")) return *x / "agent-sandbox";
  return home_dir() / ".local" / "share" / "agent-sandbox";
}

fs::path default_state_dir() {
  if (is_root()) return root_state_dir;
  if (auto x = absolute_env("XDG_RUNTIME_DIR")) return *x / "agent-sandbox";
  return fallback_user_dir();
}

fs::path default_image_dir() { return is_root() ? root_image_dir : user_data_dir() / "images"; }
fs::path default_blob_dir() { return is_root() ? root_blob_dir : user_data_dir() / "blobs"; }

/// Why a registered tool's `binary` cannot run in its image's root `root` (empty: it can).
/// Resolved inside the root (openat2 RESOLVE_IN_ROOT: links resolve as the sandbox will see
/// them and never lead out of the image); it must be a regular file with an execute bit.
/// Where openat2 is missing (Linux < 5.6) nothing is checked: the run then fails at exec.
std::string check_tool_binary(const std::filesystem::path& root, const std::string& binary,
                              const std::string& image) {
  const int dir = ::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return {};
  open_how how{};
  how.flags = O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  const std::string rel = binary.empty() || binary[0] != '/' ? binary : binary.substr(1);
  const int fd = static_cast<int>(::syscall(SYS_openat2, dir, rel.c_str(), &how, sizeof how));
  const int err = errno;
  ::close(dir);
  const std::string where = "binary: " + detail::quote_for_message(binary);
  const std::string in = " in the image " + detail::quote_for_message(image);
  if (fd < 0) {
    if (err == ENOSYS || err == EPERM) return {};  // no openat2 here: exec will tell
    return where + " is missing" + in;
  }
  struct stat st {};
  const int rc = ::fstat(fd, &st);
  ::close(fd);
  if (rc != 0) return {};
  if (!S_ISREG(st.st_mode) || (st.st_mode & 0111) == 0) {
    return where + " is not a regular executable file" + in;
  }
  return {};
}

}  // namespace

runtime_options default_runtime_options() {
  runtime_options o;
  o.state_dir = default_state_dir();
  o.image_dir = default_image_dir();
  o.blob_dir = default_blob_dir();
  return o;
}

namespace detail {

// --- helpers ----------------------------------------------------------------------------

namespace {

/// Tracks whether an execution context is still alive: its `shutdown()` runs first thing
/// when the context is destroyed (before queued handlers are destroyed), after which
/// nothing may be posted to its executors.
class context_watch final : public asio::execution_context::service {
 public:
  using key_type = context_watch;
  static asio::execution_context::id id;  // NOLINT: asio's service-id protocol
  explicit context_watch(asio::execution_context& ctx)
      : asio::execution_context::service(ctx), alive(std::make_shared<std::atomic<bool>>(true)) {}
  std::shared_ptr<std::atomic<bool>> alive;

 private:
  void shutdown() override { alive->store(false); }
};
asio::execution_context::id context_watch::id;

std::shared_ptr<std::atomic<bool>> watch_context(const asio::any_io_executor& ex) {
  asio::execution_context& ctx = asio::query(ex, asio::execution::context);
  return asio::use_service<context_watch>(ctx).alive;
}

run_result internal_result(std::string message, std::string run_id = {}) {
  run_result r;
  r.code = code::internal;
  r.message = std::move(message);
  r.run_id = std::move(run_id);
  return r;
}

/// Completes `h` on its associated executor (or the system executor) without a runtime.
void complete_without_runtime(run_handler h, error_code ec, run_result r) noexcept {
  try {
    auto ex = asio::get_associated_executor(h, asio::system_executor());
    // any_completion_executor cannot promise never to block, so post through the system
    // executor and dispatch from there.
    asio::post(asio::system_executor(),
               [h = std::move(h), ex = std::move(ex), ec, r = std::move(r)]() mutable {
                 asio::dispatch(ex, [h = std::move(h), ec, r = std::move(r)]() mutable {
                   std::move(h)(ec, std::move(r));
                 });
               });
  } catch (...) {
    // Allocation failure: the handler is destroyed without being called; nothing else can
    // be done without an executor.
  }
}

std::string display_capped(std::string_view s, std::size_t cap) {
  std::string out = escape_for_display(s.substr(0, cap));
  if (s.size() > cap) out += "…";
  return out;
}

}  // namespace

std::string new_run_id() { return unique_hex(8); }

// --- runtime_impl -----------------------------------------------------------------------

runtime_impl::runtime_impl(asio::any_io_executor executor, std::shared_ptr<asio::io_context> own_io,
                           log_sink log)
    : executor_(std::move(executor)), own_io_(std::move(own_io)), log_(std::move(log)) {
  ctx_alive_ = watch_context(executor_);
  if (own_io_) own_work_.emplace(own_io_->get_executor());
}

runtime_impl::~runtime_impl() {
  // shutdown() normally joined or detached the thread; never let std::thread terminate us.
  if (thread_.joinable()) thread_.detach();
}

error_code runtime_impl::start_thread() noexcept {
  if (!own_io_) return {};
  try {
    thread_ = std::thread([io = own_io_, this_log = log_] {
      for (;;) {
        try {
          io->run();
          return;
        } catch (const std::exception& e) {
          // A completion handler threw: asio lets the exception out of run(). Keep serving
          // the other runs.
          if (this_log) this_log(log_level::error, std::string("handler threw: ") + e.what());
        } catch (...) {
          if (this_log) this_log(log_level::error, "handler threw a non-standard exception");
        }
      }
    });
  } catch (const std::system_error& e) {
    log(log_level::error, std::string("cannot start the runtime thread: ") + e.what());
    return make_error_code(errc::io_error);
  }
  return {};
}

void runtime_impl::log(log_level level, std::string_view line) const noexcept {
  try {
    if (log_) log_(level, line);
  } catch (...) {
    // A log sink must not throw; if it does, the line is lost.
  }
}

error_code runtime_impl::init(runtime_options o) noexcept {
  try {
    policy_ = o.policy;
    if (auto ec = check_open_files_limit()) return ec;
    spans_ = o.spans;
    approver_ = o.approver;
    receipt_signer_ = o.receipt_signer;
    sessions_ = o.sessions;
    interpreters_ = o.interpreters;
    scheduler_ = scheduler::create(executor_, o.scheduler);
    if (o.state_dir.empty()) o.state_dir = default_state_dir();
    if (auto ec = open_stores(o)) return ec;
    if (auto ec = resolve_runtimes(o)) return ec;
    if (auto ec = resolve_tools(o)) return ec;
    if (auto ec = resolve_secrets(o)) return ec;
    log_clamped_profiles();
    register_levels(o);
    return {};
  } catch (const std::exception& e) {
    log(log_level::error, std::string("runtime initialisation failed: ") + e.what());
    return make_error_code(errc::io_error);
  } catch (...) {
    log(log_level::error, "runtime initialisation failed");
    return make_error_code(errc::io_error);
  }
}

error_code runtime_impl::open_stores(runtime_options& o) {
  // 1. Blob store.
  if (o.blobs) {
    blobs_ = o.blobs;
  } else {
    fs::path dir = o.blob_dir.empty() ? default_blob_dir() : o.blob_dir;
    auto s = open_fs_blob_store({.root = dir, .log = log_});
    if (!s) {
      log(log_level::error, "cannot open blob store " + dir.string() + ": " + s.error().message());
      return s.error();
    }
    blobs_ = *s;
  }

  // 2. Image store (none for fixed digests without an explicit store).
  if (o.images) {
    images_ = o.images;
    return {};
  }
  if (!o.fixed_digests.empty()) return {};

  const fs::path user_default = default_image_dir();
  fs::path dir = o.image_dir.empty() ? user_default : o.image_dir;
  auto has_images = [](image_store& s) {
    auto l = s.list();
    return l && !l->empty();
  };
  // An ordinary user whose own store has no images uses root's, read-only, if it has some.
  if (!is_root() && dir == user_default && dir != root_image_dir) {
    std::error_code fec;
    if (fs::is_directory(root_image_dir, fec)) {
      if (fs::is_directory(dir, fec)) {
        auto own = open_image_store({.root = dir, .log = log_});
        if (own && has_images(**own)) {
          images_ = *own;
          return {};
        }
      }
      auto shared = open_image_store({.root = root_image_dir, .read_only = true, .log = log_});
      if (shared && has_images(**shared)) {
        log(log_level::info, "using the root image store " + root_image_dir.string() +
                                 " read-only (" + dir.string() + " has no images)");
        images_ = *shared;
        return {};
      }
    }
  }
  // A store this user may read but not write (e.g. root's) is opened read-only: it then
  // serves the images that are already unpacked.
  bool writable = ::access(dir.c_str(), W_OK) == 0 || !fs::exists(dir);
  auto s = open_image_store({.root = dir, .read_only = !writable, .log = log_});
  if (!s && writable && s.error() == make_error_code(errc::permission_denied)) {
    // A store this user may read but not write (e.g. root's): serve what is unpacked.
    s = open_image_store({.root = dir, .read_only = true, .log = log_});
    if (s) log(log_level::info, "image store " + dir.string() + " opened read-only");
  }
  if (!s) {
    log(log_level::error, "cannot open image store " + dir.string() + ": " + s.error().message());
    return s.error();
  }
  images_ = *s;
  return {};
}

error_code runtime_impl::resolve_runtimes(const runtime_options& o) {
  const auto bad = make_error_code(errc::invalid_argument);
  for (std::size_t i = 0; i < o.runtimes.size(); ++i) {
    const runtime_spec& spec = o.runtimes[i];
    const std::string where = "runtimes[" + std::to_string(i) + "]";
    if (auto problem = check_runtime_spec(spec)) {
      log(log_level::error, "runtime definition " + where + "." + *problem);
      return bad;
    }
    if (catalog_.runtimes.contains(spec.name)) {
      log(log_level::error,
          "runtime definition " + where + ".name: duplicate runtime " + spec.name);
      return bad;
    }
    specs_.push_back(spec);
    std::optional<std::string> digest;
    if (auto f = o.fixed_digests.find(spec.name); f != o.fixed_digests.end()) {
      digest = f->second;
    } else if (images_) {
      auto d = images_->current_digest(spec.image.empty() ? spec.name : spec.image);
      if (!d) {
        log(d.error() == errc::not_found ? log_level::info : log_level::warning,
            "runtime " + spec.name + ": no current image (" + d.error().message() + ")");
      } else {
        // Unpack now so that the first run does not pay for it.
        auto root = images_->rootfs(*d);
        const std::string image = spec.image.empty() ? spec.name : spec.image;
        std::string unusable;
        if (root) unusable = check_tool_binary(*root, spec.argv.front(), image);
        if (!root) {
          log(log_level::warning, "runtime " + spec.name + ": image " + *d +
                                      " cannot be unpacked: " + root.error().message());
        } else if (!unusable.empty()) {
          // Its runs answer runtime_unavailable, as for an image that is not installed.
          log(log_level::warning, "runtime " + spec.name + ": argv[0]" +
                                      unusable.substr(unusable.find(':')) +
                                      "; its runs answer runtime_unavailable");
        } else {
          digest = *d;
          rootfs_.emplace(spec.name, *root);
        }
      }
    } else {
      log(log_level::info, "runtime " + spec.name + ": no image store and no fixed digest");
    }
    catalog_.runtimes.emplace(spec.name, std::move(digest));
  }
  return {};
}

error_code runtime_impl::resolve_tools(const runtime_options& o) {
  const auto bad = make_error_code(errc::invalid_argument);
  for (std::size_t i = 0; i < o.tools.size(); ++i) {
    const tool_entry& e = o.tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (auto problem = check_tool_entry(e, policy_)) {
      log(log_level::error, "registry: " + where + "." + *problem);
      return bad;
    }
    if (catalog_.tools.contains(e.name)) {
      log(log_level::error, "registry: " + where + ".name: duplicate tool " + e.name);
      return bad;
    }
    std::optional<std::string> digest;
    std::string unusable;
    if (auto f = o.fixed_digests.find(e.image); f != o.fixed_digests.end()) {
      digest = f->second;
    } else if (images_) {
      auto d = images_->current_digest(e.image);
      if (d) {
        auto root = images_->rootfs(*d);
        if (root) {
          digest = *d;
          tool_rootfs_.emplace(e.name, *root);
          unusable = check_tool_binary(*root, e.binary, e.image);
          if (!unusable.empty()) {
            log(log_level::warning, "registry: " + where + "." + unusable +
                                        "; the tool's runs and sessions answer "
                                        "runtime_unavailable");
          }
        } else {
          log(log_level::error, "registry: " + where + ".image: image " + *d +
                                    " cannot be unpacked: " + root.error().message() +
                                    "; the tool's runs answer runtime_unavailable");
        }
      }
    }
    if (!digest && !(images_ && images_->current_digest(e.image))) {
      // Like a runtime without its image: the host still starts (other tools and runtimes
      // work); this tool's runs answer runtime_unavailable until the image is built.
      log(log_level::warning, "registry: " + where + ".image: no image " + e.image +
                                  " in the image store (sandboxctl image build " + e.image +
                                  "); the tool's runs answer runtime_unavailable");
    }
    // A pinned entry whose image moved on is kept: its runs answer digest_mismatch.
    if (e.image_digest && digest && *e.image_digest != *digest) {
      log(log_level::warning, "registry: " + where + ".image_digest: the current image of " +
                                  e.image + " is " + *digest + "; its runs are refused");
    }
    // The entry's egress in the canonical form the egress proxy matches (checked above).
    tool_entry entry = e;
    entry.egress.clear();
    for (const auto& pattern : e.egress) {
      auto c = canonical_egress_pattern(pattern);
      if (c && std::find(entry.egress.begin(), entry.egress.end(), *c) == entry.egress.end()) {
        entry.egress.push_back(*c);
      }
    }
    catalog_.tools.emplace(e.name, host_catalog::tool{.entry = std::move(entry),
                                                      .digest = std::move(digest),
                                                      .unusable = std::move(unusable)});
  }
  return {};
}

error_code runtime_impl::resolve_secrets(const runtime_options& o) {
  const auto bad = make_error_code(errc::invalid_argument);
  if (o.secrets.size() > max_secrets) {
    log(log_level::error, "secrets: more than " + std::to_string(max_secrets) + " secrets");
    return bad;
  }
  for (const auto& [name, def] : o.secrets) {
    const std::string where = "secrets[" + detail::quote_for_message(name) + "]";
    if (!is_valid_secret_name(name)) {
      log(log_level::error, where + ": not a secret name");
      return bad;
    }
    secret_definition d = def;
    if (auto problem = check_secret_definition(d)) {
      log(log_level::error, where + "." + *problem);
      return bad;
    }
    // The value stays in this process; the message names the file, never its content.
    auto read = detail::read_secret_file(d.file, ::geteuid());
    if (!read.problem.empty()) {
      log(log_level::error,
          where + ".file: " + detail::quote_for_message(d.file, 256) + " " + read.problem);
      return bad;
    }
    secret_values_.emplace(name, std::make_shared<const std::string>(std::move(read.value)));
    catalog_.secrets.emplace(name, std::move(d));
  }
  return {};
}

std::optional<std::vector<run_secret>> runtime_impl::run_secrets(const admitted& a) const {
  std::vector<run_secret> out;
  for (const auto& name : a.request.secrets) {
    const auto v = secret_values_.find(name);
    std::optional<secret_definition> def;
    {
      std::lock_guard lk(mu_);
      if (auto d = catalog_.secrets.find(name); d != catalog_.secrets.end()) def = d->second;
    }
    if (v == secret_values_.end() || !def) return std::nullopt;
    // 128 random bits: the program can neither guess another run's placeholder nor find a
    // value from it; the proxy recognizes it byte for byte.
    auto hex = detail::random_hex(16);
    if (!hex) return std::nullopt;
    out.push_back(run_secret{.name = name,
                             .placeholder = "sbx-secret-" + *hex,
                             .definition = std::move(*def),
                             .value = v->second});
  }
  return out;
}

error_code runtime_impl::check_open_files_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_max == RLIM_INFINITY) return {};
  const auto hard = static_cast<std::uint64_t>(rl.rlim_max);
  if (policy_.max_open_files > hard) {
    // Refused, not clamped: this is every default run's value, and a host whose operator
    // asked for more descriptors than it can give should hear so before serving runs that
    // would all end `internal`.
    log(log_level::error, "policy.max_open_files: " + std::to_string(policy_.max_open_files) +
                              " is above the host's hard RLIMIT_NOFILE (" + std::to_string(hard) +
                              "); every run would fail to start (lower it, or raise the "
                              "host's limit: ulimit -Hn, LimitNOFILE=)");
    return make_error_code(errc::invalid_argument);
  }
  if (policy_.ceilings.max_open_files > hard) {
    log(log_level::warning,
        "policy.ceilings.max_open_files: " + std::to_string(policy_.ceilings.max_open_files) +
            " is above the host's hard RLIMIT_NOFILE; clamped to " + std::to_string(hard));
    policy_.ceilings.max_open_files = static_cast<std::uint32_t>(hard);
  }
  return {};
}

void runtime_impl::log_clamped_profiles() const {
  for (const auto& [name, profile] : policy_.profiles) {
    auto eff = effective_limits(policy_, name);
    if (!eff) continue;
    for (const auto& field : eff->clamped) {
      log(log_level::warning, "policy.profiles." + name + "." + field + ": above policy.ceilings." +
                                  field + "; clamped to it");
    }
  }
}

std::optional<std::pair<runtime_spec, fs::path>> runtime_impl::tool_launch(
    std::string_view name) const {
  std::lock_guard lk(mu_);
  const auto t = catalog_.tools.find(std::string(name));
  if (t == catalog_.tools.end()) return std::nullopt;
  const tool_entry& e = t->second.entry;
  runtime_spec spec{.name = e.name, .argv = {e.binary}, .source_name = "stdin", .image = e.image};
  spec.argv.insert(spec.argv.end(), e.args.begin(), e.args.end());
  const auto root = tool_rootfs_.find(name);
  return std::make_pair(std::move(spec), root == tool_rootfs_.end() ? fs::path{} : root->second);
}

level_options level_options_of(const runtime_options& o, run_machine_context ctx) {
  return {.context = std::move(ctx),
          .process = o.process_backend,
          .container = o.container,
          .gvisor = o.gvisor,
          .microvm = o.microvm};
}

run_machine_context runtime_impl::backend_context(const runtime_options& o) {
  return {.executor = executor_,
          .options = o.process,
          .state_dir = o.state_dir,
          .log = log_,
          .policy = policy_,
          .resolve_runtime = [this](std::string_view name)
              -> std::optional<std::pair<runtime_spec, std::filesystem::path>> {
            const runtime_spec* s = spec(name);
            auto root = rootfs_of(name);
            if (s == nullptr || root.empty()) return std::nullopt;
            return std::make_pair(*s, root);
          },
          .egress = o.egress,
          .reuse_self_test_verdict = o.reuse_self_test_verdict,
          .self_test_deps = {}};
}

void runtime_impl::register_levels(const runtime_options& o) {
  level_options lo = level_options_of(o, backend_context(o));
  if (o.levels_on_demand) {
    std::lock_guard g(demand_mu_);
    for (const builtin_level& l : builtin_levels()) {
      if (l.enabled(lo)) untried_levels_.push_back(&l);  // weakest first, as the table
    }
    demand_options_ = std::move(lo);
    return;
  }
  for (const builtin_level& l : builtin_levels()) {
    if (!l.enabled(lo)) continue;  // a level the host did not ask for has no status
    register_level(l, lo);
  }
}

void runtime_impl::register_level(const builtin_level& l, const level_options& lo) {
  level_attempt a = try_level(l, lo);
  if (a.made) {
    std::unique_lock lk(mu_);
    if (shutting_down_) {
      lk.unlock();
      a.made->shutdown();  // made while the runtime was shutting down: never serves a run
      return;
    }
    backends_[l.isolation] = std::move(a.made);
  }
  record_status(std::move(a.status));
}

void runtime_impl::ensure_level(sandbox::isolation need) noexcept {
  if (!demand_options_) return;  // levels were registered at creation (set in init only)
  try {
    std::lock_guard g(demand_mu_);
    while (!untried_levels_.empty()) {
      // The weakest untried level at or above `need` (the list is weakest first) is worth
      // trying only when it is weaker than every registered level at or above `need` (one
      // that `add_backend` already serves is never tried: it would replace that backend).
      auto it =
          std::find_if(untried_levels_.begin(), untried_levels_.end(),
                       [need](const builtin_level* l) { return is_at_least(l->isolation, need); });
      if (it == untried_levels_.end()) return;
      const auto have = backend_at_least(need);
      if (have && is_at_least((*it)->isolation, have->isolation())) return;
      const builtin_level* l = *it;
      untried_levels_.erase(it);
      {
        std::lock_guard lk(mu_);
        if (shutting_down_) return;
      }
      register_level(*l, *demand_options_);
    }
  } catch (const std::exception& e) {
    log(log_level::error, std::string("registering a level on demand: ") + e.what());
  } catch (...) {
    log(log_level::error, "registering a level on demand: unknown exception");
  }
}

void runtime_impl::record_status(backend_status st) {
  if (!st.registered) {
    log(log_level::warning,
        std::string(to_string(st.isolation)) + " backend not registered: " + st.reason);
  }
  std::lock_guard lk(mu_);
  statuses_.push_back(std::move(st));
  refresh_levels_locked();
}

void runtime_impl::refresh_levels_locked() {
  catalog_.levels.clear();
  for (const auto& [level, b] : backends_) catalog_.levels.push_back(level);  // map: sorted
}

void runtime_impl::add_backend(std::shared_ptr<backend> b) {
  if (!b) {
    log(log_level::warning, "add_backend: null backend ignored");
    return;
  }
  const sandbox::isolation level = b->isolation();
  backend_status st{
      .isolation = level, .name = std::string(b->name()), .registered = true, .reason = {}};
  std::lock_guard lk(mu_);
  if (shutting_down_) return;
  auto& slot = backends_[level];
  if (slot && slot != b) retired_.push_back(slot);
  slot = std::move(b);
  auto same_level = [level](const backend_status& s) { return s.isolation == level; };
  statuses_.erase(std::remove_if(statuses_.begin(), statuses_.end(), same_level), statuses_.end());
  statuses_.push_back(std::move(st));
  refresh_levels_locked();
}

std::vector<backend_status> runtime_impl::backends() const {
  std::lock_guard lk(mu_);
  return statuses_;
}

host_catalog runtime_impl::catalog() const {
  std::lock_guard lk(mu_);
  return catalog_;
}

std::shared_ptr<backend> runtime_impl::backend_at(sandbox::isolation level) const {
  std::lock_guard lk(mu_);
  auto it = backends_.find(level);
  return it == backends_.end() ? nullptr : it->second;
}

std::shared_ptr<backend> runtime_impl::backend_at_least(sandbox::isolation need) const {
  std::lock_guard lk(mu_);
  auto it = backends_.lower_bound(need);  // map: ordered weakest first, like the levels
  return it == backends_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<backend>> runtime_impl::registered() const {
  std::vector<std::shared_ptr<backend>> out;
  std::lock_guard lk(mu_);
  out.reserve(backends_.size());
  for (const auto& [level, b] : backends_) out.push_back(b);
  return out;
}

const runtime_spec* runtime_impl::spec(std::string_view name) const noexcept {
  for (const auto& s : specs_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

fs::path runtime_impl::rootfs_of(std::string_view name) const {
  auto it = rootfs_.find(name);
  return it == rootfs_.end() ? fs::path{} : it->second;
}

void runtime_impl::unregister(std::uint64_t key) noexcept {
  std::lock_guard lk(mu_);
  ops_.erase(key);
}

void runtime_impl::record_span(const span& s) const noexcept {
  if (spans_) spans_->record(s);
}

void runtime_impl::record_span(const run_op& op, error_code ec,
                               const run_result& r) const noexcept {
  if (!spans_) return;
  try {
    span s;
    s.start = op.started();
    s.end = std::chrono::system_clock::now();
    const run_result k = op.known();
    auto& a = s.attributes;
    a["sandbox.run_id"] = op.run_id();
    a["sandbox.tenant"] = op.ticket().tenant();
    a["sandbox.ticket_id"] = op.ticket().id();
    a["sandbox.isolation"] = std::string(to_string(k.isolation));
    a["sandbox.timeout"] = static_cast<std::int64_t>(k.timeout.count());
    a["sandbox.runtime"] = k.runtime.name;
    a["sandbox.runtime_digest"] = k.runtime.digest;
    a["error_code"] = std::string(to_string(r.code));
    if (r.exit_code) a["sandbox.exit_code"] = static_cast<std::int64_t>(*r.exit_code);
    a["sandbox.usage.setup_ms"] = static_cast<std::int64_t>(r.usage.setup.count());
    a["sandbox.usage.wall_ms"] = static_cast<std::int64_t>(r.usage.wall.count());
    a["sandbox.usage.cpu_ms"] = static_cast<std::int64_t>(r.usage.cpu.count());
    a["sandbox.usage.peak_memory_bytes"] =
        static_cast<std::int64_t>(std::min<std::uint64_t>(r.usage.peak_memory_bytes, INT64_MAX));
    a["sandbox.egress_attempts"] =
        static_cast<std::int64_t>(r.egress_attempts.size() + r.egress_attempts_dropped);
    a["sandbox.oom_kills"] = static_cast<std::int64_t>(r.oom_kills);
    // Host-held secrets: how many the run used, and how often it sent a placeholder where its
    // value may not go (egress attempts refused "secret_misuse"; never a name or value).
    if (!op.request().secrets.empty()) {
      a["sandbox.secrets"] = static_cast<std::int64_t>(op.request().secrets.size());
      a["sandbox.secret_misuse"] = static_cast<std::int64_t>(
          std::count_if(r.egress_attempts.begin(), r.egress_attempts.end(),
                        [](const egress_attempt& e) { return e.reason == "secret_misuse"; }));
    }
    // L7 egress rules: how many of the listed attempts a rule refused (rule_refused,
    // budget_exhausted, unsafe_path); absent when none was.
    if (const auto refused = std::count_if(r.egress_attempts.begin(), r.egress_attempts.end(),
                                           [](const egress_attempt& e) {
                                             return !e.allowed && (e.reason == "rule_refused" ||
                                                                   e.reason == "budget_exhausted" ||
                                                                   e.reason == "unsafe_path");
                                           });
        refused > 0) {
      a["sandbox.egress_rule_refusals"] = static_cast<std::int64_t>(refused);
    }
    if (ec == asio::error::operation_aborted) a["sandbox.cancelled"] = true;
    spans_->record(s);
  } catch (...) {
    log(log_level::warning, "span for run " + op.run_id() + " lost (allocation failed)");
  }
}

void runtime_impl::start_run(run_request request, ticket ticket, run_handler handler) noexcept {
  if (!executor_alive()) {
    // The execution context is gone: nothing can run or complete there. The handler is
    // destroyed uncalled, as it would have been had it been queued there.
    return;
  }
  std::shared_ptr<run_op> op;
  try {
    op = std::make_shared<run_op>(shared_from_this(), std::move(request), std::move(ticket),
                                  std::move(handler));
  } catch (...) {
    if (handler) {
      complete_without_runtime(std::move(handler), asio::error::operation_aborted,
                               internal_result("out of memory"));
    }
    return;
  }
  bool shutting = false;
  {
    std::lock_guard lk(mu_);
    shutting = shutting_down_;
    if (!shutting) {
      op->key = ++next_key_;
      try {
        ops_.emplace(op->key, op);
      } catch (...) {
        shutting = true;  // cannot track it: refuse it like a shutting-down runtime
      }
    }
  }
  if (shutting) {
    op->abort("the runtime is shutting down");
    return;
  }
  try {
    op->connect_cancellation();
    asio::post(executor_, [op] { op->start(); });
  } catch (...) {
    op->abort("internal error");
  }
}

run_result runtime_impl::run_blocking(run_request request, const ticket& ticket) {
  if (own_io_ && own_io_->get_executor().running_in_this_thread()) {
    return internal_result("run() called on the runtime's own thread; use async_run");
  }
  try {
    std::promise<run_result> p;
    auto f = p.get_future();
    start_run(std::move(request), ticket,
              [p = std::move(p)](error_code, run_result r) mutable { p.set_value(std::move(r)); });
    return f.get();
  } catch (const std::future_error&) {
    return internal_result("the runtime was shut down before the run completed");
  } catch (...) {
    return internal_result("internal error");
  }
}

void runtime_impl::shutdown() noexcept {
  std::vector<std::shared_ptr<backend>> bs;
  std::vector<std::weak_ptr<run_op>> ops;
  {
    std::lock_guard lk(mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    try {
      for (auto& [level, b] : backends_) bs.push_back(b);
      for (auto& b : retired_) bs.push_back(b);
      for (auto& [key, w] : ops_) ops.push_back(w);
    } catch (...) {
      // Out of memory while shutting down: the backends' own destructors still kill runs.
    }
  }
  // 1. Queued runs are refused; backends kill their live runs and confirm them dead
  //    (bounded by their budget).
  if (scheduler_ && executor_alive()) {
    scheduler_->shutdown();
  } else if (scheduler_) {
    // The executor's execution context is already gone: the scheduler's timer and queued
    // completions belong to it, and touching them (cancel, post, or destroy) would use freed
    // memory. Keep the scheduler for the life of the process instead (as abort_locked leaks
    // such completions), reachable so that leak checkers do not report it.
    static std::mutex graveyard_mu;
    static auto* graveyard = new std::vector<std::shared_ptr<scheduler>>();  // NOLINT
    try {
      std::lock_guard lk(graveyard_mu);
      graveyard->push_back(std::move(scheduler_));
    } catch (...) {
      new std::shared_ptr<scheduler>(std::move(scheduler_));  // NOLINT: out of memory
    }
  }
  for (auto& b : bs) b->shutdown();
  // 2. Every run still in flight completes with operation_aborted (posted to its executor).
  for (auto& w : ops) {
    if (auto op = w.lock()) op->abort("the runtime was shut down");
  }
  ops.clear();
  // 3. Release the backends (their I/O objects must go before a private io_context does).
  {
    std::lock_guard lk(mu_);
    backends_.clear();
    retired_.clear();
  }
  bs.clear();
  // 4. Private io_context: run what was just posted, then stop and join.
  if (own_io_) {
    own_work_.reset();
    const bool on_own_thread = thread_.get_id() == std::this_thread::get_id();
    try {
      asio::post(*own_io_, [io = own_io_.get()] { io->stop(); });
    } catch (...) {
      own_io_->stop();
    }
    if (on_own_thread) {
      // Destroyed from one of its own handlers: the thread finishes that handler, runs the
      // queue up to the stop, and destroys the io_context (its lambda holds the last
      // reference).
      thread_.detach();
    } else if (thread_.joinable()) {
      thread_.join();
      // I/O objects go before the io_context they belong to: the scheduler's deadline timer
      // would otherwise be destroyed (with this impl) after its timer service. Nothing runs
      // on the executor any more, and every run was aborted above, so nobody reads it.
      scheduler_.reset();
    }
    own_io_.reset();  // off-thread: destroys the io_context and every handler still queued
  }
}

// --- run_op -----------------------------------------------------------------------------

run_op::run_op(std::shared_ptr<runtime_impl> rt, run_request request, sandbox::ticket ticket,
               run_handler handler)
    : rt_(std::move(rt)),
      request_(std::move(request)),
      ticket_(std::move(ticket)),
      run_id_(new_run_id()),
      started_(std::chrono::system_clock::now()) {
  handler_ex_ = asio::get_associated_executor(handler, rt_->executor());
  handler_work_ = asio::prefer(handler_ex_, asio::execution::outstanding_work.tracked);
  known_.run_id = run_id_;
  known_.isolation = ticket_.isolation();
  known_.timeout = request_.timeout;
  known_.memory_limit_bytes = request_.memory_limit_bytes;
  known_.runtime.name = display_capped(request_.runtime, 64);
  handler_.emplace(std::move(handler));
}

run_op::~run_op() {
  if (key != 0) rt_->unregister(key);
}

void run_op::connect_cancellation() {
  std::lock_guard lk(mu_);
  if (!handler_) return;
  auto slot = handler_->get_cancellation_slot();
  if (!slot.is_connected()) return;
  // Installed by the initiating function, as asio requires. Holds only a weak pointer: the
  // caller's signal may outlive the run.
  slot.assign([w = weak_from_this()](asio::cancellation_type type) {
    if (auto op = w.lock()) op->cancel(type);
  });
}

std::optional<run_op::completion> run_op::take_locked() {
  if (done_ || !handler_) return std::nullopt;
  done_ = true;
  std::optional<completion> c;
  c.emplace(completion{std::move(*handler_), std::move(handler_ex_), std::move(handler_work_)});
  handler_.reset();
  // A run waiting for its approver kept itself alive; every caller here holds a reference of
  // its own, so this never destroys the run under its lock.
  awaiting_self_.reset();
  return c;
}

void run_op::fill_known(run_result& r) const {
  r.v = protocol_version;
  r.run_id = known_.run_id;
  r.isolation = known_.isolation;
  r.runtime = known_.runtime;
  r.timeout = known_.timeout;
  r.memory_limit_bytes = known_.memory_limit_bytes;
  r.timeout_clamped = known_.timeout_clamped;
  r.memory_clamped = known_.memory_clamped;
}

void run_op::remember_admitted(const admitted& adm) {
  std::lock_guard lk(mu_);
  note_admitted(known_, adm);  // admission's facts, written as every admitted result has them
}

run_result run_op::aborted_result(std::string_view message) const {
  run_result r;
  if (backend_started_) fill_known(r);  // admitted: the runtime knows the effective limits
  r.run_id = run_id_;
  r.code = code::internal;
  r.message = std::string(message);
  return r;
}

void run_op::start() noexcept {
  try {
    start_impl();
  } catch (const std::exception& e) {
    rt_->log(log_level::error, "run " + run_id_ + ": " + e.what());
    finish({}, internal_result("internal error", run_id_), false);
  } catch (...) {
    rt_->log(log_level::error, "run " + run_id_ + ": unknown exception");
    finish({}, internal_result("internal error", run_id_), false);
  }
}

void run_op::start_impl() {
  {
    std::lock_guard lk(mu_);
    if (done_) return;  // cancelled before it started
  }
  // 1. Admission: request × ticket × policy × what this host has, now. A network request
  //    whose ticket lacks code.network goes to the approver, if the host installed one,
  //    once everything else admits.
  const auto now = std::chrono::system_clock::now();
  const bool ask = request_.network && !ticket_.allows(action::code_network) && rt_->approver();
  rt_->ensure_level(required_level(request_, ticket_, rt_->catalog()));
  auto verdict = ask ? admit_pending_approval(request_, ticket_, rt_->policy(), rt_->catalog(), now)
                     : admit(request_, ticket_, rt_->policy(), rt_->catalog(), now);
  if (auto* rej = std::get_if<rejection>(&verdict)) {
    finish({}, rejected_result(*rej, run_id_), false);
    return;
  }
  admitted& adm = std::get<admitted>(verdict);
  remember_admitted(adm);

  // 2. Inputs (before asking anyone: a question about a run that cannot start is wasted).
  std::vector<std::uint64_t> sizes;
  if (!check_inputs(adm, sizes)) return;

  // 2a. The approval. The run does not start before the answer.
  if (ask) {
    ask_approval(adm, sizes);
    return;
  }
  proceed(std::move(adm));
}

bool run_op::check_inputs(const admitted& adm, std::vector<std::uint64_t>& sizes) {
  // Every blob must exist for this tenant. Another tenant's blob answers exactly like a
  // missing one (the store says not_found for both; so do we). Their total (each name
  // counts, even when two name the same blob) is capped: inputs are staged on the host's
  // disk for the run.
  const auto& store = rt_->blob_store_ref();
  std::uint64_t total_input = 0;
  sizes.clear();
  for (std::size_t i = 0; i < adm.request.files_in.size(); ++i) {
    const auto& f = adm.request.files_in[i];
    auto size = store->size(adm.tenant, f.blob);
    if (size) {
      sizes.push_back(*size);
      total_input += *size;
      if (total_input > rt_->policy().max_input_bytes) {
        rejection rej{.code = code::invalid_request,
                      .message = "files_in: inputs total more than " +
                                 std::to_string(rt_->policy().max_input_bytes) + " bytes"};
        finish({}, rejected_result(rej, run_id_), false);
        return false;
      }
      continue;
    }
    if (size.error() == errc::io_error) {
      rt_->log(log_level::error, "run " + run_id_ + ": blob store failed on files_in[" +
                                     std::to_string(i) + "]: " + size.error().message());
      finish({}, internal_result("the blob store failed", run_id_), false);
      return false;
    }
    rejection rej{.code = code::blob_not_found,
                  .message = "files_in[" + std::to_string(i) + "].blob: blob not found"};
    finish({}, rejected_result(rej, run_id_), false);
    return false;
  }
  // A tool run's standard input from a blob: the tenant's, within the stdin cap.
  if (const auto& id = adm.request.stdin_blob) {
    auto size = store->size(adm.tenant, *id);
    if (!size && size.error() == errc::io_error) {
      rt_->log(log_level::error,
               "run " + run_id_ + ": blob store failed on stdin_blob: " + size.error().message());
      finish({}, internal_result("the blob store failed", run_id_), false);
      return false;
    }
    if (!size) {
      finish({}, rejected_result({code::blob_not_found, "stdin_blob: blob not found"}, run_id_),
             false);
      return false;
    }
    if (*size > rt_->policy().max_stdin_bytes) {
      rejection rej{.code = code::invalid_request,
                    .message = "stdin_blob: " + std::to_string(*size) +
                               " bytes, over the limit of " +
                               std::to_string(rt_->policy().max_stdin_bytes)};
      finish({}, rejected_result(rej, run_id_), false);
      return false;
    }
  }
  return true;
}

void run_op::proceed(admitted adm) {
  // 3. The backend registered at the level admission chose (never a weaker one).
  const auto& store = rt_->blob_store_ref();
  auto b = rt_->backend_at(adm.isolation);
  // A registered tool starts its entry's binary and args in its entry's image; a runtime its
  // interpreter. Both resolved at creation and never changed afterwards.
  std::optional<std::pair<runtime_spec, std::filesystem::path>> launch;
  if (!adm.request.tool.empty()) {
    launch = rt_->tool_launch(adm.request.tool);
  } else if (const runtime_spec* spec = rt_->spec(adm.runtime.name)) {
    launch.emplace(*spec, rt_->rootfs_of(spec->name));
  }
  // The per-run limits under the run's workload profile (admission checked it exists).
  auto limits = effective_limits(rt_->policy(), adm.profile);
  if (!b || !launch || !limits) {
    rejection rej{
        .code = code::runtime_unavailable,
        .message = "no backend at isolation level " + std::string(to_string(adm.isolation))};
    finish({}, rejected_result(rej, run_id_), false);
    return;
  }
  // A tool's standard input: the request's text, or its blob read now (size checked).
  std::optional<std::string> stdin_bytes = adm.request.std_in;
  if (adm.request.stdin_blob) {
    auto bytes = store->get(adm.tenant, *adm.request.stdin_blob);
    if (!bytes) {
      const bool gone = bytes.error() == errc::not_found;
      if (!gone) {
        rt_->log(log_level::error, "run " + run_id_ + ": blob store failed on stdin_blob: " +
                                       bytes.error().message());
      }
      finish({},
             gone ? rejected_result({code::blob_not_found, "stdin_blob: blob not found"}, run_id_)
                  : internal_result("the blob store failed", run_id_),
             false);
      return;
    }
    if (bytes->size() > rt_->policy().max_stdin_bytes) {  // replaced since it was measured
      finish({},
             rejected_result({code::invalid_request, "stdin_blob: over the stdin limit"}, run_id_),
             false);
      return;
    }
    stdin_bytes = std::move(*bytes);
  }

  // The rootfs is the image whose digest admission checked the ticket's and the request's
  // pins against: both come from resolve_runtimes and never change afterwards.
  auto secrets = rt_->run_secrets(adm);
  if (!secrets) {
    finish({}, internal_result("the run's secret placeholders could not be made", run_id_), false);
    return;
  }
  run_job job{.run_id = run_id_,
              .admitted = std::move(adm),
              .runtime = std::move(launch->first),
              .rootfs = std::move(launch->second),
              .blobs = store,
              .policy = std::move(limits->limits),
              .stdin_bytes = std::move(stdin_bytes),
              .secrets = std::move(*secrets),
              .executor = rt_->executor()};

  // 4. Wait for a slot: the host's and the tenant's caps count runs that are starting, so a
  //    burst never over-admits; no thread blocks while waiting.
  const std::string tenant = job.admitted.tenant;
  auto sched = rt_->sched();
  std::lock_guard lk(mu_);
  if (done_) return;
  auto pending = std::make_shared<std::pair<std::shared_ptr<backend>, run_job>>(b, std::move(job));
  queued_id_ = sched->submit(tenant, [self = shared_from_this(), pending](scheduler::outcome o) {
    std::unique_lock lk2(self->mu_);
    self->queued_id_.reset();
    if (self->done_) return;  // cancelled or aborted meanwhile; dropping the slot frees it
    if (!o.granted) {
      lk2.unlock();
      rejection rej = o.rejected.value_or(rejection{code::internal, "internal error"});
      run_result r = rejected_result(rej, self->run_id_);
      r.queue = o.queue;
      r.queue_wait = o.waited;
      {
        std::lock_guard lk3(self->mu_);
        self->fill_known(r);
      }
      self->finish({}, std::move(r), false);
      return;
    }
    self->slot_ = std::move(o.granted);
    lk2.unlock();
    self->launch(std::move(pending->first), std::move(pending->second));
  });
}

// --- approval ---------------------------------------------------------------------------

run_op::approval_wait::~approval_wait() {
  // The approver dropped its handler without answering: the run ends as if deferred (the
  // host still gets the approval request and can ask again).
  if (answered.load()) return;
  if (auto o = op.lock()) {
    o->post_approval({}, approval_decision::defer("the approver gave no answer"));
  }
}

void run_op::ask_approval(const admitted& adm, const std::vector<std::uint64_t>& sizes) {
  // What the human is asked: the run exactly as admission would let it start once approved.
  approval_request q;
  q.ticket_id = ticket_.id();
  q.tenant = ticket_.tenant();
  q.domains = adm.request.egress;
  q.timeout = adm.request.timeout;
  q.memory_limit_bytes = adm.request.memory_limit_bytes;
  for (std::size_t i = 0; i < adm.request.files_in.size(); ++i) {
    const auto& f = adm.request.files_in[i];
    // Blob ids are `sha256:` and the hex SHA-256 of the content (blob_store.hpp), so the
    // id's hex is the file's hash.
    q.files_in.push_back(approval_file{.name = f.name,
                                       .sha256 = f.blob.substr(std::string_view("sha256:").size()),
                                       .bytes = i < sizes.size() ? sizes[i] : 0});
  }
  q.source_sha256 = sha256_hex(adm.request.source);
  q.source_bytes = adm.request.source.size();
  q.env = adm.request.env;
  // The secrets by name, with where the host would send each: never a value.
  {
    const host_catalog cat = rt_->catalog();
    for (const auto& name : adm.request.secrets) {
      const auto d = cat.secrets.find(name);
      if (d == cat.secrets.end()) continue;  // admission refused those
      q.secrets.push_back(approval_secret{.name = name,
                                          .domains = d->second.domains,
                                          .header = std::string(secret_header_name(d->second))});
    }
  }
  q.isolation = adm.isolation;
  q.runtime = adm.runtime;
  if (q.source_sha256.empty()) {
    finish({}, internal_result("internal error", run_id_), false);
    return;
  }

  auto wait = std::make_shared<approval_wait>();
  wait->op = weak_from_this();
  {
    std::lock_guard lk(mu_);
    if (done_) return;
    approval_ = q;
    approval_wait_ = wait;
    awaiting_self_ = shared_from_this();
  }
  // The handler holds `wait` (and so the signal its slot is bound to) and reaches the run
  // only weakly; it has no associated executor: whatever thread runs it, post_approval
  // re-posts to the runtime's executor.
  auto& slot_signal = wait->signal;
  auto handler = asio::bind_cancellation_slot(
      slot_signal.slot(), [wait = std::move(wait)](error_code ec, approval_decision d) mutable {
        if (wait->answered.exchange(true)) return;
        if (auto o = wait->op.lock()) o->post_approval(ec, std::move(d));
      });
  try {
    rt_->approver()->async_approve(std::move(q), std::move(handler));
  } catch (const std::exception& e) {
    rt_->log(log_level::error, "run " + run_id_ + ": the approver threw: " + e.what());
    post_approval(asio::error::fault, approval_decision::defer());
  }
}

void run_op::post_approval(error_code ec, approval_decision d) noexcept {
  if (!rt_->executor_alive()) return;
  try {
    asio::post(rt_->executor(), [self = shared_from_this(), ec, d = std::move(d)]() mutable {
      self->on_approval(ec, std::move(d));
    });
  } catch (...) {
    rt_->log(log_level::error, "run " + run_id_ + ": approval answer lost (allocation failed)");
  }
}

void run_op::on_approval(error_code ec, approval_decision d) noexcept {
  try {
    on_approval_impl(ec, std::move(d));
  } catch (const std::exception& e) {
    rt_->log(log_level::error, "run " + run_id_ + ": " + e.what());
    finish({}, internal_result("internal error", run_id_), false);
  } catch (...) {
    finish({}, internal_result("internal error", run_id_), false);
  }
}

void run_op::on_approval_impl(error_code ec, approval_decision d) {
  std::shared_ptr<run_op> keep;  // the run's own reference while it waited
  approval_request q;
  {
    std::lock_guard lk(mu_);
    if (done_ || !approval_ || !awaiting_self_) return;  // cancelled, aborted, or answered
    keep = std::move(awaiting_self_);
    approval_wait_.reset();
    q = *approval_;
  }
  // Host text goes into a result: escaped and capped.
  auto reason = [&](const std::string& prefix) {
    return d.reason.empty() ? prefix : prefix + ": " + display_capped(d.reason, 200);
  };
  auto end_with_request = [&](code c, std::string message) {
    run_result r = rejected_result(rejection{c, std::move(message)}, run_id_);
    r.approval = q;
    finish({}, std::move(r), false);
  };
  if (ec) {
    rt_->log(log_level::warning, "run " + run_id_ + ": the approver failed: " + ec.message());
    end_with_request(code::approval_required,
                     "network needs approval: the approver failed; ask again and resume with "
                     "a derived ticket");
    return;
  }
  switch (d.verdict) {
    case approval_verdict::deny:
      finish({},
             rejected_result(rejection{code::approval_denied, reason("approval denied")}, run_id_),
             false);
      return;
    case approval_verdict::defer:
      end_with_request(code::approval_required, reason("network needs approval"));
      return;
    case approval_verdict::approve:
      break;
  }
  // Approved: the derived ticket is checked, never trusted.
  if (!d.derived) {
    finish(
        {},
        rejected_result(
            rejection{code::action_denied, "approval: approved without a derived ticket"}, run_id_),
        false);
    return;
  }
  const auto now = std::chrono::system_clock::now();
  if (auto why = check_derived_ticket(ticket_, q, *d.derived, now)) {
    rt_->log(log_level::warning, "run " + run_id_ + ": derived ticket refused: " + *why);
    finish(
        {},
        rejected_result(rejection{code::action_denied, "approval: derived ticket refused: " + *why},
                        run_id_),
        false);
    return;
  }
  {
    // The run proceeds under the derived ticket, reaching only the approved domains (a
    // subset of the requested ones), with only the approved secrets.
    std::lock_guard lk(mu_);
    if (done_) return;
    ticket_ = *d.derived;
    request_.egress = d.derived->egress();
    std::erase_if(request_.secrets,
                  [&](const std::string& name) { return !ticket_.allows_secret(name); });
  }
  rt_->ensure_level(required_level(request_, ticket_, rt_->catalog()));
  auto verdict = admit(request_, ticket_, rt_->policy(), rt_->catalog(), now);
  if (auto* rej = std::get_if<rejection>(&verdict)) {
    finish({}, rejected_result(*rej, run_id_), false);
    return;
  }
  admitted& adm = std::get<admitted>(verdict);
  remember_admitted(adm);
  // The inputs again: they may have been deleted while the human thought.
  std::vector<std::uint64_t> sizes;
  if (!check_inputs(adm, sizes)) return;
  proceed(std::move(adm));
}

void run_op::launch(std::shared_ptr<backend> b, run_job job) {
  // Under the lock so that a cancellation cannot slip between the check and the backend
  // installing its slot handler.
  std::lock_guard lk(mu_);
  if (done_) return;
  backend_started_ = true;
  try {
    b->async_execute(std::move(job),
                     asio::bind_cancellation_slot(
                         backend_cancel_.slot(),
                         asio::bind_executor(rt_->executor(), [self = shared_from_this()](
                                                                  error_code ec, run_result r) {
                           self->on_backend_done(ec, std::move(r));
                         })));
  } catch (const std::exception& e) {
    rt_->log(log_level::error,
             "run " + run_id_ + ": backend " + std::string(b->name()) + " threw: " + e.what());
    finish({}, internal_result("internal error", run_id_), true);
  }
}

void run_op::on_backend_done(error_code ec, run_result r) noexcept {
  try {
    {
      // The run is over: its slot goes to the next queued run now.
      std::lock_guard lk(mu_);
      if (slot_) r.queue_wait = slot_->waited();
      slot_.reset();
    }
    if (ec && ec != asio::error::operation_aborted) {
      rt_->log(log_level::error, "run " + run_id_ + ": backend failed: " + ec.message());
      r.code = code::internal;
      r.message = "internal error";
      ec = {};
    }
    {
      std::lock_guard lk(mu_);
      fill_known(r);
    }
  } catch (...) {
    r = internal_result("internal error", run_id_);
  }
  finish(ec, std::move(r), false);
}

void run_op::cancel(asio::cancellation_type type) noexcept {
  using ct = asio::cancellation_type;
  if ((type & (ct::terminal | ct::partial | ct::total)) == ct::none) return;
  std::unique_lock lk(mu_);
  if (done_) return;
  if (!backend_started_) {
    // Not started yet (perhaps queued): nothing to kill. Free its queue place, and complete
    // now, atomically with the check, so that start() cannot launch it afterwards.
    if (queued_id_) {
      rt_->sched()->cancel(*queued_id_);
      queued_id_.reset();
    }
    abort_locked(lk, "the run was cancelled");
    return;
  }
  lk.unlock();
  if (!rt_->executor_alive()) return;
  // Forward to the backend's operation on the runtime's executor, where backends expect
  // their slot handlers to run.
  try {
    asio::dispatch(rt_->executor(), [self = shared_from_this(), type] {
      std::lock_guard lk2(self->mu_);
      if (!self->done_) self->backend_cancel_.emit(type);
    });
  } catch (...) {
    rt_->log(log_level::error, "run " + run_id_ + ": cancellation lost (allocation failed)");
  }
}

void run_op::abort(std::string_view message) noexcept {
  std::unique_lock lk(mu_);
  if (done_) return;
  abort_locked(lk, message);
}

void run_op::abort_locked(std::unique_lock<std::recursive_mutex>& lk,
                          std::string_view message) noexcept {
  std::optional<completion> c;
  run_result r;
  bool started = false;
  std::shared_ptr<approval_wait> asking = approval_wait_.lock();
  try {
    r = aborted_result(message);
    started = backend_started_;
    c = take_locked();
  } catch (...) {
    // Out of memory: fall through with what was taken (if anything).
  }
  lk.unlock();
  if (!c) return;
  if (asking && rt_->executor_alive()) {
    // The approver still holds its question: tell it (on the runtime's executor, where its
    // slot handler may run) that nobody waits for the answer any more.
    try {
      asio::post(rt_->executor(), [asking = std::move(asking)] {
        asking->signal.emit(asio::cancellation_type::terminal);
      });
    } catch (...) {
    }
  }
  if (started && rt_->executor_alive()) {
    // A backend whose shutdown() does not kill its runs (the fake) still learns of the end
    // through its cancellation slot, so that it stops holding work on the executor.
    try {
      asio::post(rt_->executor(), [self = shared_from_this()] {
        std::lock_guard lk2(self->mu_);
        self->backend_cancel_.emit(asio::cancellation_type::terminal);
      });
    } catch (...) {
    }
  }
  rt_->record_span(*this, asio::error::operation_aborted, r);
  if (!rt_->executor_alive()) {
    // The execution context was destroyed while this run was still referenced from
    // elsewhere (a backend holding it past the context's end). Its handler and the work it
    // counts belong to that dead context: leak them rather than touch freed memory.
    new completion(std::move(*c));  // NOLINT(cppcoreguidelines-owning-memory): see above
    return;
  }
  deliver(std::move(*c), asio::error::operation_aborted, std::move(r), true);
}

run_result run_op::known() const {
  std::lock_guard lk(mu_);
  return known_;
}

void run_op::finish(error_code ec, run_result r, bool post) noexcept {
  std::optional<completion> c;
  {
    std::lock_guard lk(mu_);
    c = take_locked();
  }
  if (!c) return;  // already completed (aborted by shutdown, or cancelled)
  // A run a backend ran gets a signed receipt of what the host observed, under the ticket
  // it ran under (the derived one after an approval). Signing never fails the run: a
  // signer failure is logged and the result goes out without a receipt.
  if (const auto& signer = rt_->receipt_signer(); signer && !ec && !r.backend.empty()) {
    try {
      auto doc =
          signer->sign(make_receipt_claims(request_, ticket_, r, std::chrono::system_clock::now()));
      if (doc) {
        r.receipt = std::move(*doc);
      } else {
        rt_->log(log_level::error,
                 "run " + run_id_ + ": receipt not signed: " + doc.error().message());
      }
    } catch (...) {
      rt_->log(log_level::error, "run " + run_id_ + ": receipt not signed (out of memory)");
    }
  }
  rt_->record_span(*this, ec, r);
  deliver(std::move(*c), ec, std::move(r), post);
}

void run_op::deliver(completion c, error_code ec, run_result r, bool post) noexcept {
  if (key != 0) rt_->unregister(key);
  try {
    auto fn = [h = std::move(c.handler), ec, r = std::move(r)]() mutable {
      std::move(h)(ec, std::move(r));
    };
    if (post) {
      // any_completion_executor cannot promise never to block: post through the runtime's
      // executor (never inline), then dispatch to the handler's.
      // The lambda carries the work-tracking executor, so the handler's context keeps
      // outstanding work until the handler has run.
      asio::post(rt_->executor(), [ex = std::move(c.work), fn = std::move(fn)]() mutable {
        asio::dispatch(ex, std::move(fn));
      });
    } else {
      asio::dispatch(c.executor, std::move(fn));
    }
  } catch (...) {
    rt_->log(log_level::error, "run " + run_id_ + ": completion could not be scheduled");
  }
  // c.work (outstanding work on the handler's executor) is released here, after the
  // completion was queued.
}

}  // namespace detail

// --- runtime ----------------------------------------------------------------------------

runtime::runtime(std::shared_ptr<detail::runtime_impl> impl) : impl_(std::move(impl)) {}
runtime::runtime(runtime&&) noexcept = default;

runtime& runtime::operator=(runtime&& other) noexcept {
  if (this != &other) {
    if (impl_) impl_->shutdown();
    impl_ = std::move(other.impl_);
  }
  return *this;
}

runtime::~runtime() {
  if (impl_) impl_->shutdown();
}

result<runtime> runtime::create(asio::any_io_executor executor, runtime_options options) {
  if (!executor) return make_error_code(errc::invalid_argument);
  std::shared_ptr<detail::runtime_impl> impl;
  try {
    log_sink log = options.log ? options.log : make_stderr_log_sink();
    impl = std::make_shared<detail::runtime_impl>(std::move(executor), nullptr, std::move(log));
    if (auto ec = impl->init(std::move(options))) {
      impl->shutdown();
      return ec;
    }
    return runtime(std::move(impl));
  } catch (...) {
    if (impl) impl->shutdown();
    return make_error_code(errc::io_error);
  }
}

result<runtime> runtime::create(runtime_options options) {
  std::shared_ptr<detail::runtime_impl> impl;
  try {
    auto io = std::make_shared<asio::io_context>(1);
    log_sink log = options.log ? options.log : make_stderr_log_sink();
    impl = std::make_shared<detail::runtime_impl>(io->get_executor(), io, std::move(log));
    io.reset();
    // The thread runs from the start: a backend's self-test may use the executor.
    error_code ec = impl->start_thread();
    if (!ec) ec = impl->init(std::move(options));
    if (ec) {
      impl->shutdown();
      return ec;
    }
    return runtime(std::move(impl));
  } catch (...) {
    if (impl) impl->shutdown();
    return make_error_code(errc::io_error);
  }
}

void runtime::do_run(run_request request, ticket ticket, detail::run_handler handler) {
  if (!impl_) {
    detail::complete_without_runtime(std::move(handler), asio::error::operation_aborted,
                                     detail::internal_result("the runtime was moved from"));
    return;
  }
  impl_->start_run(std::move(request), std::move(ticket), std::move(handler));
}

run_result runtime::run(run_request request, const ticket& ticket) {
  if (!impl_) return detail::internal_result("the runtime was moved from");
  return impl_->run_blocking(std::move(request), ticket);
}

void runtime::add_backend(std::shared_ptr<backend> b) {
  if (impl_) impl_->add_backend(std::move(b));
}

std::vector<backend_status> runtime::backends() const {
  return impl_ ? impl_->backends() : std::vector<backend_status>{};
}

host_catalog runtime::catalog() const { return impl_ ? impl_->catalog() : host_catalog{}; }

std::shared_ptr<blob_store> runtime::blobs() const { return impl_ ? impl_->blobs() : nullptr; }

boost::system::result<run_result, rejection> runtime::replay(const run_record& record,
                                                             const ticket& ticket) const {
  auto store = blobs();
  if (!store) return rejection{code::internal, "replay: the runtime has no blob store"};
  return replay_run(*store, record, ticket);
}

std::shared_ptr<image_store> runtime::images() const { return impl_ ? impl_->images() : nullptr; }

const sandbox::policy& runtime::policy() const {
  static const sandbox::policy defaults{};
  return impl_ ? impl_->policy() : defaults;
}

std::vector<pool_stats> runtime::warm_pool_stats() const {
  std::vector<pool_stats> out;
  if (!impl_) return out;
  for (const auto& b : impl_->registered()) {
    for (auto& s : b->warm_pool_stats()) {
      s.isolation = b->isolation();
      out.push_back(std::move(s));
    }
  }
  return out;
}

sandbox::scheduler_stats runtime::queue_stats() const {
  return impl_ && impl_->sched() ? impl_->sched()->stats() : sandbox::scheduler_stats{};
}

// --- probe ------------------------------------------------------------------------------

std::vector<backend_status> probe_backends(const runtime_options& options) {
  std::vector<backend_status> out;
  const log_sink log = options.log ? options.log : make_stderr_log_sink();
  const fs::path state_dir = options.state_dir.empty() ? default_state_dir() : options.state_dir;
  for (const detail::builtin_level& l : detail::builtin_levels()) {
    backend_status st{.isolation = l.isolation, .name = std::string(l.name), .reason = {}};
    try {
      // Each level's self-test on an executor of its own, drained before the next level.
      // A probe runs only the self-test: no policy, no runtimes (so no warm-pool
      // templates), no egress, and no warm pools.
      asio::io_context io(1);
      detail::level_options lo =
          detail::level_options_of(options, {.executor = io.get_executor(),
                                             .options = options.process,
                                             .state_dir = state_dir,
                                             .log = log,
                                             .policy = {},
                                             .resolve_runtime = {},
                                             .egress = {},
                                             // always tests (records a pass)
                                             .reuse_self_test_verdict = false,
                                             .self_test_deps = {}});
      lo.context.options.warm_pool.clear();
      lo.container.warm_pool.clear();
      lo.gvisor.warm_pool.clear();
      lo.microvm.warm_pool.clear();  // a probe boots only the self-test's VM
      if (!l.enabled(lo)) {
        // Levels the host never asked for are not listed; one it turned off is.
        if (!l.on_by_default) continue;
        st = detail::disabled_status(l, lo);
      } else {
        detail::level_attempt a = detail::try_level(l, lo);
        st = std::move(a.status);
        if (a.made) {
          a.made->shutdown();
          a.made.reset();  // before the io_context it may hold I/O objects of
        }
        io.run_for(std::chrono::seconds(5));  // e.g. the self-test container's delete
      }
    } catch (const std::exception& e) {
      st.registered = false;
      st.reason = std::string("self-test threw: ") + e.what();
    } catch (...) {
      st.registered = false;
      st.reason = "self-test threw";
    }
    try {
      out.push_back(std::move(st));
    } catch (...) {
    }
  }
  return out;
}

}  // namespace sandbox
