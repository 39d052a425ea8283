// `sandboxctl run`: one run (a protocol request, a script or a registered tool), its
// result printed as JSON or for a terminal, its output files written to --out-dir.
//
// Exit status: 0 when the result's code is `ok`, 1 for any other code or an output file that
// could not be written to --out-dir, 2 for usage errors,
// 128+N when interrupted by signal N (the run is killed and cleaned up first).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>

#include "cli/cli_util.hpp"
#include "cli/verbs.hpp"
#include "sandbox/runtime.hpp"
#include "sys/io.hpp"

namespace sandboxctl {
namespace {

// Bytes the sandboxed program chose, made safe for a terminal: C0 controls (but newline and
// tab), DEL, C1 controls and invalid UTF-8 become `\xNN`, so the program can neither move the
// cursor, retitle the window, hide text, nor fake the status line that follows.
std::string terminal_safe(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  auto esc = [&](unsigned char c) { out += fmt::format("\\x{:02x}", c); };
  for (std::size_t i = 0; i < in.size();) {
    auto c = static_cast<unsigned char>(in[i]);
    if (c < 0x80) {
      if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f)
        esc(c);
      else
        out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    std::size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 0;
    if (len == 0 || i + len > in.size() || !sandbox::is_valid_utf8(in.substr(i, len)) ||
        (c == 0xc2 && static_cast<unsigned char>(in[i + 1]) < 0xa0)) {  // C1: U+0080..U+009F
      esc(c);
      ++i;
      continue;
    }
    out.append(in.substr(i, len));
    i += len;
  }
  return out;
}

// Opens --out-dir for writing the outputs into: a directory, never through a link (a
// symlink in its place is refused rather than followed, so outputs land nowhere but in the
// directory the operator named). Returns the descriptor; throws usage_error.
int open_out_dir(std::string dir) {
  // "od/" would resolve a symlink "od" despite O_NOFOLLOW: drop trailing slashes.
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd >= 0) return dfd;
  const int err = errno;
  struct stat st {};
  if (::lstat(dir.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    throw usage_error(
        fmt::format("--out-dir {} is a symbolic link (outputs are never written "
                    "through a link)",
                    quote_name(dir)));
  }
  if (err == ENOTDIR || err == ELOOP) {
    throw usage_error(fmt::format("--out-dir {} is not a directory", quote_name(dir)));
  }
  throw usage_error(fmt::format("--out-dir {}: {}", quote_name(dir), std::strerror(err)));
}

// Writes the output files into the directory `dfd` without following links, never replacing
// an existing entry (unless `force`: then a new file is renamed over it, which replaces a
// link rather than writing through it), never blocking on a FIFO. Returns false if any file
// could not be written (each is reported on stderr).
bool write_outputs(const sandbox::run_result& r, int dfd, bool force,
                   const sandbox::blob_store& blobs, const std::string& tenant) {
  bool ok = true;
  for (const auto& f : r.files_out) {
    auto fail = [&](const char* why) {
      std::cerr << fmt::format("sandboxctl: output {} not written: {}\n", quote_name(f.name), why);
      ok = false;
    };
    // The library checked the name; check again before it becomes a path here.
    if (f.name.empty() || f.name == "." || f.name == ".." ||
        f.name.find_first_of(std::string_view("/\0", 2)) != std::string::npos) {
      fail("not a valid file name");
      continue;
    }
    auto bytes = blobs.get(tenant, f.blob);
    if (!bytes) {
      fail("blob unavailable");
      continue;
    }
    std::string tmp = force ? ".sandboxctl-tmp-" + std::to_string(::getpid()) : f.name;
    int fd = ::openat(dfd, tmp.c_str(),
                      O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0) {
      fail(errno == EEXIST ? "an entry of that name exists (use --force to replace it)"
                           : std::strerror(errno));
      continue;
    }
    const bool written = sandbox::detail::write_all(fd, bytes->data(), bytes->size());
    ::close(fd);
    if (!written) {
      ::unlinkat(dfd, tmp.c_str(), 0);
      fail("write failed");
      continue;
    }
    if (force && ::renameat(dfd, tmp.c_str(), dfd, f.name.c_str()) < 0) {
      const int err = errno;
      ::unlinkat(dfd, tmp.c_str(), 0);
      fail(std::strerror(err));
    }
  }
  return ok;
}

// One stderr line per output entry the run did not return (human form: the JSON carries
// them as `files_dropped`), and per output file that goes nowhere (no --out-dir).
void report_outputs(const sandbox::run_result& r, bool have_out_dir) {
  for (const auto& d : r.files_dropped) {
    std::cerr << fmt::format("sandboxctl: output '{}' dropped: {}\n",
                             escape_format_chars(d.name_display), to_string(d.reason));
  }
  if (!have_out_dir) {
    for (const auto& f : r.files_out) {
      std::cerr << fmt::format("sandboxctl: output {} not written: no --out-dir given\n",
                               quote_name(f.name));
    }
  }
}

// Prints the result: JSON, or (human form, with `blobs`) the program's stdout and stderr
// followed by a status line.
int print_result(const sandbox::run_result& r, bool json, const sandbox::blob_store* blobs,
                 const std::string& tenant, bool have_out_dir = false) {
  if (json || blobs == nullptr) {
    std::cout << sandbox::encode(r) << "\n";
  } else {
    auto emit = [&](const sandbox::stream_capture& s, int fd, std::ostream& os) {
      if (s.blob.empty()) return std::string{};
      auto bytes = blobs->get(tenant, s.blob);
      if (!bytes) return std::string{};
      std::string text = ::isatty(fd) ? terminal_safe(*bytes) : *bytes;
      os.write(text.data(), static_cast<std::streamsize>(text.size()));
      return text;
    };
    emit(r.std_out, 1, std::cout);
    std::cout.flush();
    auto err = emit(r.std_err, 2, std::cerr);
    // The status line always starts on a line of its own.
    if (!err.empty() && err.back() != '\n') std::cerr << "\n";
    report_outputs(r, have_out_dir);
    std::cerr << fmt::format("sandboxctl: {}{}{} (wall {} ms, cpu {} ms){}\n", to_string(r.code),
                             r.exit_code ? fmt::format(", exit {}", *r.exit_code) : "",
                             r.signal ? fmt::format(", signal {}", *r.signal) : "",
                             r.usage.wall.count(), r.usage.cpu.count(),
                             // Messages quote names escaped, but not format characters.
                             r.message.empty() ? "" : ": " + escape_format_chars(r.message));
  }
  return r.code == sandbox::code::ok ? exit_ok : exit_fail;
}

// One run needs one catalog entry: resolving the others (image lookups, unpack checks) is
// a fifth of a one-shot invocation's time before the sandbox starts (docs/performance.md).
// Keeps only the runtime or tool `req` names, when the configuration has it; otherwise
// everything, so that admission answers exactly as with the whole catalog.
void keep_only_what_runs(sandbox::runtime_options& opts, const sandbox::run_request& req) {
  const auto named = [](const auto& list, const std::string& name) {
    return std::find_if(list.begin(), list.end(), [&](const auto& e) { return e.name == name; });
  };
  if (!req.tool.empty()) {
    auto t = named(opts.tools, req.tool);
    if (t == opts.tools.end()) return;
    auto kept = *t;
    opts.tools = {std::move(kept)};
    opts.runtimes.clear();
  } else if (!req.runtime.empty()) {
    auto r = named(opts.runtimes, req.runtime);
    if (r == opts.runtimes.end()) return;
    auto kept = *r;
    opts.runtimes = {std::move(kept)};
    opts.tools.clear();
  }
}

// Runs one request; SIGINT, SIGTERM and SIGHUP cancel it (the run is killed and cleaned up)
// and the exit status is 128 + the signal.
int run_with_signals(sandbox::runtime_options opts, sandbox::run_request req,
                     const sandbox::ticket& ticket, sandbox::run_result* out) {
  // One run: a configuration's warm pools would only be prepared to be thrown away, and a
  // level this run cannot use need not prove itself (no VM boots for a process-level run).
  opts.process.warm_pool.clear();
  opts.container.warm_pool.clear();
  opts.gvisor.warm_pool.clear();
  opts.microvm.warm_pool.clear();
  opts.levels_on_demand = true;
  keep_only_what_runs(opts, req);
  boost::asio::io_context io;
  auto rt = sandbox::runtime::create(io.get_executor(), std::move(opts));
  if (!rt) {
    std::cerr << "sandboxctl: cannot start the runtime: " << rt.error().message() << "\n";
    return exit_fail;
  }
  boost::asio::cancellation_signal cancel;
  boost::asio::signal_set signals(io, SIGINT, SIGTERM, SIGHUP);
  int caught = 0;
  signals.async_wait([&](boost::system::error_code ec, int sig) {
    if (ec) return;
    caught = sig;
    cancel.emit(boost::asio::cancellation_type::terminal);
  });
  rt->async_run(std::move(req), ticket,
                boost::asio::bind_cancellation_slot(
                    cancel.slot(), [&](boost::system::error_code, sandbox::run_result r) {
                      *out = std::move(r);
                      signals.cancel();
                      // Nothing else is ours to wait for: whatever the runtime still keeps
                      // going (pools, timers) ends with it, below.
                      io.stop();
                    }));
  io.run();
  if (caught != 0) {
    std::cerr << fmt::format("sandboxctl: interrupted by signal {}; the run was killed\n", caught);
    return 128 + caught;
  }
  return -1;
}

}  // namespace

int cmd_run(const std::vector<std::string>& args) {
  common_flags c;
  std::string request_path, runtime, out_dir, script, tool, stdin_file;
  std::vector<std::string> files, env, allow_env, egress, secrets;
  std::string timeout_text, memory_text, isolation_text;
  bool json = false, force = false, network = false;
  auto d = common_options(c);
  d.add_options()("request", po::value(&request_path), "request JSON file ('-' = stdin)")(
      "ticket", po::value(&c.ticket_path),
      "ticket JSON file (or signed ticket document); without it, a local ticket: tenant "
      "'default', code.execute at the --isolation level, the policy's ceilings, no network "
      "(printed with -v)")(
      "isolation", po::value(&isolation_text),
      "without --ticket: the local ticket's level, process (default), container, gvisor or "
      "microvm (the weakest registered backend at or above it runs)")(
      "trusted-keys", po::value(&c.trusted_keys),
      "Ed25519 public key file or directory of <kid>.pub.pem: --ticket must be a signed "
      "ticket that verifies against them (repeatable)")("file", po::value(&files),
                                                        "input NAME=PATH (repeatable)")(
      "timeout-ms", po::value(&timeout_text), "timeout")(
      "runtime", po::value(&runtime), "runtime name (default: from the extension, else python3)")(
      "memory-bytes", po::value(&memory_text), "memory limit")(
      "env", po::value(&env), "environment NAME=VALUE for the program (repeatable)")(
      "allow-env", po::value(&allow_env), "let requests set NAME (policy; repeatable)")(
      "network", po::bool_switch(&network),
      "the run needs the network: reaches only the --egress names, through its egress proxy "
      "(needs code.network on the ticket for them, and container isolation or stronger)")(
      "egress", po::value(&egress),
      "a host name (or *.suffix) a --network run may reach (repeatable)")(
      "secret", po::value(&secrets),
      "a host-held secret (--config's secrets) the --network run uses by its placeholder "
      "(repeatable)")("tool", po::value(&tool),
                      "run this registered tool (--config's tools) instead of a SCRIPT")(
      "stdin-file", po::value(&stdin_file),
      "--tool only: the tool's standard input, byte for byte ('-' = stdin)")(
      "out-dir", po::value(&out_dir), "write output files here")(
      "force", po::bool_switch(&force), "replace existing entries in --out-dir")(
      "json", po::bool_switch(&json), "print the result JSON")("script", po::value(&script));
  po::positional_options_description pos;
  pos.add("script", 1);
  auto vm = parse(args, d, pos);
  if (c.ticket_path.empty() && !c.trusted_keys.empty()) {
    throw usage_error("run: --trusted-keys needs --ticket (the ticket to verify)");
  }
  const auto level =
      isolation_flag("run", vm.count("isolation") != 0, isolation_text, !c.ticket_path.empty());
  // Numbers are checked here, strictly: "-1" must not wrap to 2^64-1, and 0 is refused as
  // the protocol refuses timeout_ms <= 0 (no silent default).
  std::optional<std::int64_t> timeout_ms;
  std::optional<std::uint64_t> memory;
  if (!timeout_text.empty() || vm.count("timeout-ms") != 0) {
    timeout_ms = parse_number<std::int64_t>("timeout-ms", timeout_text, 1, max_duration_ms);
  }
  if (!memory_text.empty() || vm.count("memory-bytes") != 0) {
    memory = parse_number<std::uint64_t>("memory-bytes", memory_text, 1,
                                         std::numeric_limits<std::uint64_t>::max());
  }
  if (!tool.empty() && !script.empty()) throw usage_error("run: give either --tool or a SCRIPT");
  if (!stdin_file.empty() && tool.empty()) throw usage_error("run: --stdin-file needs --tool");
  if (request_path.empty() == (script.empty() && tool.empty())) {
    throw usage_error("run: give either --request REQ.json, --tool NAME or a SCRIPT");
  }
  // Opened now, and kept: the directory checked is the one written into.
  struct fd_guard {
    int fd = -1;
    ~fd_guard() {
      if (fd >= 0) ::close(fd);
    }
  } out_dfd;
  if (!out_dir.empty()) out_dfd.fd = open_out_dir(out_dir);
  auto opts = options_from(c);
  // Without --ticket, a local one (the CLI acts for the user who runs it): tenant "default",
  // code.execute (and tool.run for the --tool given) at the --isolation level or stronger,
  // the policy's ceilings, never the network — a network run needs a ticket that grants it.
  auto ticket = c.ticket_path.empty() ? local_ticket(opts.policy, tool, level)
                                      : load_ticket(c.ticket_path, c.trusted_keys);
  if (!ticket) return print_result(sandbox::rejected_result(ticket.error()), true, nullptr, {});
  if (c.ticket_path.empty() && c.verbose) {
    std::cerr << "sandboxctl: local ticket: " << sandbox::encode(*ticket) << "\n";
  }

  for (const auto& name : allow_env) opts.policy.allowed_env.insert(name);
  sandbox::run_request req;
  if (!request_path.empty()) {
    auto decoded = sandbox::decode_run_request(read_file(request_path, max_request_file));
    if (!decoded) return print_result(sandbox::rejected_result(decoded.error()), true, nullptr, {});
    req = std::move(*decoded);
    json = true;
  } else {
    if (!tool.empty()) {
      if (!runtime.empty()) throw usage_error("run: give either --tool or --runtime");
      req.tool = tool;
    } else {
      if (runtime.empty()) {
        auto ext = std::filesystem::path(script).extension().string();
        runtime = ext == ".js" || ext == ".mjs" || ext == ".cjs" ? "node" : "python3";
      }
      req.runtime = runtime;
      // One byte over the policy cap is enough for admission to answer source_too_large.
      req.source = read_file(script, opts.policy.max_source_bytes);
    }
    if (timeout_ms) req.timeout = std::chrono::milliseconds(*timeout_ms);
    if (memory) req.memory_limit_bytes = *memory;
    req.network = network;
    req.egress = egress;    // admission checks them (and that they come with --network)
    req.secrets = secrets;  // likewise: granted by the ticket, defined by --config
    for (const auto& e : env) {
      auto eq = e.find('=');
      if (eq == std::string::npos || eq == 0) {
        throw usage_error(fmt::format("--env {}: expected NAME=VALUE", quote_name(e)));
      }
      if (!req.env.emplace(e.substr(0, eq), e.substr(eq + 1)).second) {
        // As in a request's JSON, where a repeated key is refused: never keep one silently.
        throw usage_error(
            fmt::format("--env {}: given more than once", quote_name(e.substr(0, eq))));
      }
    }
  }
  std::shared_ptr<sandbox::blob_store> blobs;
  if (!files.empty() || !out_dir.empty() || !json || !stdin_file.empty()) {
    blobs = open_blobs(c);
    opts.blobs = blobs;
  }
  if (!stdin_file.empty()) {
    // As a blob of the ticket's tenant: any bytes (NUL, invalid UTF-8) arrive exactly. One
    // byte over the cap is stored so that the runtime answers with the limit.
    int fd = stdin_file == "-" ? ::dup(0) : open_input(stdin_file);
    if (fd < 0) throw usage_error("--stdin-file -: cannot read standard input");
    auto id = blobs->put_fd(ticket->tenant(), fd, opts.policy.max_stdin_bytes + 1);
    ::close(fd);
    if (!id) {
      std::cerr << "sandboxctl: storing '" << stdin_file << "': " << id.error().message() << "\n";
      return exit_fail;
    }
    req.stdin_blob = *id;
  }
  for (const auto& f : files) {
    auto eq = f.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw usage_error(fmt::format("--file {}: expected NAME=PATH", quote_name(f)));
    }
    std::string path = f.substr(eq + 1);
    int fd = open_input(path);
    auto id = blobs->put_fd(ticket->tenant(), fd, opts.policy.max_input_bytes);
    ::close(fd);
    if (!id) {
      std::cerr << "sandboxctl: storing '" << path << "': " << id.error().message() << "\n";
      return exit_fail;
    }
    req.files_in.push_back({.name = f.substr(0, eq), .blob = *id});
  }
  sandbox::run_result result;
  int interrupted = run_with_signals(opts, std::move(req), *ticket, &result);
  if (interrupted >= 0) return interrupted;
  int rc = print_result(result, json, blobs.get(), ticket->tenant(), !out_dir.empty());
  if (out_dfd.fd >= 0 && !write_outputs(result, out_dfd.fd, force, *blobs, ticket->tenant())) {
    rc = exit_fail;
  }
  return rc;
}

}  // namespace sandboxctl
