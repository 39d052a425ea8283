// sandboxctl: the command-line front end of agent-sandbox.
//
// The CLI trusts its caller: it reads tickets from files the local operator controls (see
// docs/protocol.md). Exit status of `run`: 0 when the result's code is `ok`, 1 for any other
// code, 2 for usage errors (bad options, unreadable files). Other commands: 0 success, 1
// failure, 2 usage.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/program_options.hpp>
#include <cstdio>
#include <fstream>
#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/image_build.hpp"
#include "cli_util.hpp"
#include "sandbox/sandbox.hpp"
#include "serve.hpp"

namespace po = boost::program_options;

namespace {

constexpr int exit_ok = 0;
constexpr int exit_fail = 1;
constexpr int exit_usage = 2;

using sandboxctl::display_name;
using sandboxctl::parse_number;
using sandboxctl::quote_name;
using sandboxctl::usage_error;

const char* top_usage =
    "usage: sandboxctl <command> [options]\n"
    "\n"
    "commands:\n"
    "  run --request REQ.json --ticket TICKET.json   run a protocol request; prints the result "
    "JSON\n"
    "  run --ticket T.json [--file NAME=PATH]... [--timeout-ms N] [--runtime R]\n"
    "      [--memory-bytes N] [--env NAME=VALUE --allow-env NAME]... [--out-dir DIR]\n"
    "      [--force] [--json] SCRIPT\n"
    "                                                run a script file ('-' = stdin); the\n"
    "                                                runtime follows the extension (.py, .js)\n"
    "                                                unless --runtime is given. Output files go\n"
    "                                                to --out-dir (never over an existing\n"
    "                                                entry unless --force; links never followed)\n"
    "  run --ticket T.json --tool NAME [--stdin-file F] [--file NAME=PATH]... [--json]\n"
    "                                                run a registered tool (--config's tools);\n"
    "                                                F ('-' = stdin) is its standard input\n"
    "  tools [--config FILE]                         list the registered tools\n"
    "  blob put FILE [--tenant T | --ticket T.json]  store a file; prints its blob id\n"
    "  blob get ID [--tenant T | --ticket T.json] [-o FILE]\n"
    "                                                write a blob's bytes (stdout by default)\n"
    "  blob rm ID [--tenant T | --ticket T.json]     delete a blob\n"
    "  blob ls [--tenant T | --ticket T.json]        list a tenant's blob ids\n"
    "  blob pin|unpin ID --holder H [--tenant T]     keep a blob through gc (or stop keeping it)\n"
    "  blob gc [--older-than D] [--target-bytes N] [--tenant T] [--dry-run]\n"
    "                                                remove unpinned blobs last stored more than\n"
    "                                                D ago (default 1h; 90s, 30m, 24h, 7d)\n"
    "  image build NAME [--package P]...             build a runtime image (python3, node, ...)\n"
    "  image import LAYOUT_DIR NAME [--ref REF]      import an OCI image layout as runtime NAME\n"
    "  image ls                                      list images (current and earlier)\n"
    "  image current NAME                            print the current digest of runtime NAME\n"
    "  image use NAME DIGEST                         make an earlier image current (rollback)\n"
    "  image verify DIGEST|NAME                      re-hash every blob of an image\n"
    "  image rm DIGEST                               remove an image that is not current\n"
    "  doctor                                        which backends work on this host, and why "
    "not\n"
    "  audit [--isolation L] [--json] [--runtime R]  prove one level's guarantees on this host: "
    "an\n"
    "                                                in-sandbox probe and host checks (exit 0\n"
    "                                                only when every check passes)\n"
    "  ticket keygen --kid K --out DIR               new Ed25519 key pair DIR/K.pem, "
    "DIR/K.pub.pem\n"
    "  ticket sign --key K.pem [--parent DOC] TICKET.json\n"
    "                                                print the signed ticket document\n"
    "  ticket verify --trusted-keys PATH DOC         check a signed ticket; print its ticket\n"
    "  ticket derive --ticket T.json --approval A.json [--domain D]... [--ttl-s N]\n"
    "                                                print the ticket derived from an approval\n"
    "  receipt verify --trusted-keys PATH FILE       check an execution receipt (a receipt, a\n"
    "                                                result or a run record carrying one)\n"
    "  serve (--socket PATH | --stdio) [--config FILE] [--max-running N]\n"
    "      [--max-queued N] [--tenant-max-running N] [--tenant-max-queued N]\n"
    "      [--queue-deadline-ms N] [--trusted-keys PATH]...\n"
    "                                                a daemon: the JSON protocol, one line per\n"
    "                                                request, host-wide caps (serve --help)\n"
    "\n"
    "store options (every command): --state-dir DIR --image-dir DIR --blob-dir DIR\n"
    "  --cgroup-parent PATH (unprivileged hosts: a delegated cgroup subtree)\n"
    "  --config FILE (host configuration: policy, scheduler, warm pools, backends such as\n"
    "  {\"backends\": {\"container\": {\"runtime\": \"crun\"}}}; docs/operations.md)\n"
    "  -v/--verbose (host log lines on stderr)\n"
    "\n"
    "exit status: run: 0 when the result's code is ok, 1 for any other code, 2 for usage\n"
    "errors, 128+N when interrupted by signal N (the run is killed and cleaned up first).\n"
    "Other commands: 0 success, 1 failure, 2 usage. The program's output is escaped when\n"
    "it goes to a terminal. The CLI trusts its caller: ticket files are the operator's\n"
    "(a signed ticket document needs --trusted-keys, and is then verified).\n";

// Reads at most `max_bytes + 1` bytes of `path` ('-' = stdin): enough for the caller to tell
// "too large" without ever holding more (a request naming /dev/zero must not eat the host).
std::string read_file(const std::string& path, std::size_t max_bytes) {
  int fd = path == "-" ? ::dup(0) : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw usage_error(fmt::format("cannot read {}", quote_name(path)));
  std::string out;
  char buf[65536];
  while (out.size() <= max_bytes) {
    ssize_t n = ::read(fd, buf, std::min(sizeof buf, max_bytes + 1 - out.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      throw usage_error(fmt::format("cannot read {}", quote_name(path)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

// Opens an input file the caller named (`--file NAME=PATH`, `blob put FILE`) for reading.
// A directory, or a path that cannot be opened, is a usage error with a plain reason —
// never the blob store's own complaint about a failed read.
int open_input(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    throw usage_error(fmt::format("cannot read {}: {}", quote_name(path), std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    ::close(fd);
    throw usage_error(fmt::format("{} is a directory", quote_name(path)));
  }
  if (S_ISFIFO(st.st_mode)) {
    // A named pipe the caller gave: wait for its writer, as for --ticket (opened without
    // O_NONBLOCK, a read would see end-of-file before the writer came: an empty input).
    ::close(fd);
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      throw usage_error(fmt::format("cannot read {}: {}", quote_name(path), std::strerror(errno)));
    }
    return fd;
  }
  // Blocking reads from here on (O_NONBLOCK only kept open() from hanging on a FIFO
  // without a writer).
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

constexpr std::size_t max_ticket_file = 64 * 1024;
constexpr std::size_t max_request_file = 8ULL << 20;  // decode_options' default

struct common {
  std::string state_dir, image_dir, blob_dir, cgroup_parent, tenant, ticket_path, config_path;
  std::vector<std::string> trusted_keys;  ///< --trusted-keys: verify signed ticket files
  bool verbose = false;
};

po::options_description common_options(common& c) {
  po::options_description d("options");
  d.add_options()("state-dir", po::value(&c.state_dir), "per-host state directory")(
      "image-dir", po::value(&c.image_dir), "image store directory")(
      "blob-dir", po::value(&c.blob_dir), "blob store directory")(
      "cgroup-parent", po::value(&c.cgroup_parent), "parent cgroup of runs")(
      "config", po::value(&c.config_path), "host configuration file (as for serve --config)")(
      "verbose,v", po::bool_switch(&c.verbose), "host log lines on stderr");
  return d;
}

sandbox::runtime_options options_from(const common& c) {
  auto o = sandbox::default_runtime_options();
  if (!c.state_dir.empty()) o.state_dir = std::filesystem::absolute(c.state_dir);
  if (!c.image_dir.empty()) o.image_dir = std::filesystem::absolute(c.image_dir);
  if (!c.blob_dir.empty()) o.blob_dir = std::filesystem::absolute(c.blob_dir);
  if (!c.cgroup_parent.empty()) o.process.cgroup_parent = c.cgroup_parent;
  o.log = sandbox::make_stderr_log_sink(c.verbose ? sandbox::log_level::debug
                                                  : sandbox::log_level::error);
  if (!c.config_path.empty()) {
    std::string text;
    if (auto why = sandboxctl::read_config(c.config_path, text); !why.empty()) {
      throw usage_error("--config: " + why);
    }
    if (auto applied = sandbox::apply_config(text, o); !applied) {
      throw usage_error("--config: " + applied.error().message);
    }
  }
  return o;
}

po::variables_map parse(const std::vector<std::string>& args, const po::options_description& d,
                        const po::positional_options_description& pos) {
  // `sandboxctl <command> --help` (or -h): the command's options, exit 0.
  if (std::find(args.begin(), args.end(), "--help") != args.end() ||
      std::find(args.begin(), args.end(), "-h") != args.end()) {
    std::cout << d << "\n";
    std::exit(0);
  }
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(d).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw usage_error(e.what());
  }
  return vm;
}

// The verifier of --trusted-keys (empty when none were given).
sandbox::ticket_verifier trusted_keys_of(const std::vector<std::string>& paths) {
  sandbox::ticket_verifier v;
  for (const auto& path : paths) {
    auto loaded = v.load_keys(std::filesystem::absolute(path));
    if (!loaded) {
      throw usage_error(
          fmt::format("--trusted-keys {}: {}", quote_name(path), loaded.error().message()));
    }
  }
  return v;
}

// A ticket file. A plain ticket is decoded by the local issuer (the CLI trusts its caller);
// a signed document is verified against --trusted-keys, which it needs; with --trusted-keys,
// only signed documents are accepted (as the daemon does).
boost::system::result<sandbox::ticket, sandbox::rejection> load_ticket(
    const std::string& path, const std::vector<std::string>& trusted_keys = {}) {
  auto text = read_file(path, std::max(max_ticket_file, sandbox::max_signed_ticket_bytes));
  const bool is_signed = sandbox::is_signed_ticket_document(text);
  if (text.size() > (is_signed ? sandbox::max_signed_ticket_bytes : max_ticket_file)) {
    throw usage_error(fmt::format("ticket file {} is too large", quote_name(path)));
  }
  boost::system::result<sandbox::ticket, sandbox::rejection> r =
      sandbox::rejection{sandbox::code::internal, "internal error"};
  if (!trusted_keys.empty()) {
    if (!is_signed) {
      r = sandbox::rejection{sandbox::code::action_denied,
                             "unsigned ticket: --trusted-keys accepts only signed tickets"};
    } else {
      r = trusted_keys_of(trusted_keys).verify(text, std::chrono::system_clock::now());
    }
  } else if (is_signed) {
    throw usage_error(fmt::format(
        "ticket file {} is a signed ticket: give --trusted-keys to verify it", quote_name(path)));
  } else {
    r = sandbox::ticket_issuer{}.decode(text);
  }
  if (!r) {
    auto rej = r.error();
    rej.message = "ticket: " + rej.message;
    return rej;
  }
  return r;
}

std::string tenant_of(const common& c) {
  if (!c.tenant.empty() && !c.ticket_path.empty()) {
    throw usage_error("give --tenant or --ticket, not both");
  }
  if (!c.ticket_path.empty()) {
    auto t = load_ticket(c.ticket_path, c.trusted_keys);
    if (!t) throw usage_error(t.error().message);
    return t->tenant();
  }
  std::string t = c.tenant.empty() ? "default" : c.tenant;
  if (!sandbox::is_valid_tenant(t)) throw usage_error(fmt::format("invalid tenant name {}", quote_name(t)));
  return t;
}

std::shared_ptr<sandbox::blob_store> open_blobs(const common& c) {
  auto o = options_from(c);
  auto store = sandbox::open_fs_blob_store({.root = o.blob_dir});
  if (!store) throw std::runtime_error("cannot open the blob store: " + store.error().message());
  return *store;
}

std::shared_ptr<sandbox::image_store> open_images(const common& c, bool read_only = false) {
  auto o = options_from(c);
  auto store = sandbox::open_image_store({.root = o.image_dir, .read_only = read_only});
  if (!store) throw std::runtime_error("cannot open the image store: " + store.error().message());
  return *store;
}

// --- blob --------------------------------------------------------------------------------

// "90s", "30m", "24h", "7d" or plain seconds → seconds (at most ten years).
std::chrono::seconds parse_age(const std::string& text) {
  std::string digits = text;
  std::uint64_t unit = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 's': unit = 1; digits.pop_back(); break;
      case 'm': unit = 60; digits.pop_back(); break;
      case 'h': unit = 3600; digits.pop_back(); break;
      case 'd': unit = 86400; digits.pop_back(); break;
      default: break;
    }
  }
  constexpr std::uint64_t max_s = 10ULL * 366 * 86400;
  const auto n = parse_number<std::uint64_t>("older-than", digits, 0, max_s / unit);
  return std::chrono::seconds(static_cast<std::int64_t>(n * unit));
}

// `blob gc`: collects unpinned blobs past the grace period (docs/operations.md, "Blob
// retention"). Prints one line per removed blob and a summary.
int blob_gc(const common& c, const std::string& older_than, const std::string& target_bytes,
            bool dry_run) {
  sandbox::gc_options o;
  if (!older_than.empty()) o.older_than = parse_age(older_than);
  if (!target_bytes.empty()) {
    o.target_tenant_bytes = parse_number<std::uint64_t>("target-bytes", target_bytes, 0,
                                                        std::uint64_t{1} << 62);
  }
  o.dry_run = dry_run;
  if (!c.tenant.empty() || !c.ticket_path.empty()) o.tenants.push_back(tenant_of(c));
  auto blobs = open_blobs(c);
  auto report = blobs->collect_garbage(o);
  if (!report) {
    std::cerr << "sandboxctl: blob gc: " << report.error().message() << "\n";
    return exit_fail;
  }
  for (const auto& e : report->removed) {
    std::cout << (dry_run ? "would remove " : "removed ") << e.tenant << " " << e.blob << " "
              << e.bytes << "\n";
  }
  std::cout << fmt::format("{} {} blobs ({} bytes); kept {} pinned, {} recent, {} by size\n",
                           dry_run ? "would remove" : "removed", report->removed.size(),
                           report->bytes_removed, report->kept_pinned, report->kept_recent,
                           report->kept_by_size);
  return exit_ok;
}

int cmd_blob(const std::vector<std::string>& args) {
  common c;
  std::string verb, arg, out, older_than, target_bytes, holder;
  bool dry_run = false;
  auto d = common_options(c);
  d.add_options()("verb", po::value(&verb))("arg", po::value(&arg))(
      "older-than", po::value(&older_than), "gc: grace period (default 1h)")(
      "target-bytes", po::value(&target_bytes), "gc: stop once a tenant uses at most N bytes")(
      "dry-run", po::bool_switch(&dry_run), "gc: only print what would be removed")(
      "holder", po::value(&holder), "pin/unpin: the holder name (e.g. a run record id)")(
      "tenant", po::value(&c.tenant), "tenant (default: \"default\")")(
      "ticket", po::value(&c.ticket_path), "take the tenant from this ticket")(
      "trusted-keys", po::value(&c.trusted_keys), "verify a signed --ticket with these keys")(
      "output,o", po::value(&out), "write to FILE instead of stdout");
  po::positional_options_description pos;
  pos.add("verb", 1).add("arg", 1);
  parse(args, d, pos);
  if (verb == "gc") {
    if (!arg.empty()) throw usage_error("blob gc: unexpected argument " + quote_name(arg));
    return blob_gc(c, older_than, target_bytes, dry_run);
  }
  std::string tenant = tenant_of(c);
  auto blobs = open_blobs(c);
  if (verb == "pin" || verb == "unpin") {
    if (arg.empty() || holder.empty()) throw usage_error("blob " + verb + ": ID and --holder needed");
    auto r = verb == "pin" ? blobs->pin(tenant, arg, holder) : blobs->unpin(tenant, arg, holder);
    if (!r) {
      std::cerr << "sandboxctl: blob " << verb << ": " << r.error().message() << "\n";
      return exit_fail;
    }
    return exit_ok;
  }
  if (verb == "put") {
    if (arg.empty()) throw usage_error("blob put: FILE missing");
    int fd = arg == "-" ? dup(0) : open_input(arg);
    if (fd < 0) throw usage_error(fmt::format("cannot read stdin: {}", std::strerror(errno)));
    auto id = blobs->put_fd(tenant, fd, 1ULL << 40);
    ::close(fd);
    if (!id) {
      std::cerr << "sandboxctl: blob put: " << id.error().message() << "\n";
      return exit_fail;
    }
    std::cout << *id << "\n";
    return exit_ok;
  }
  if (verb == "get") {
    if (arg.empty()) throw usage_error("blob get: ID missing");
    auto bytes = blobs->get(tenant, arg);
    if (!bytes) {
      std::cerr << "sandboxctl: blob get: " << bytes.error().message() << "\n";
      return exit_fail;
    }
    if (out.empty()) {
      std::cout.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
    } else {
      std::ofstream f(out, std::ios::binary);
      f.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
      if (!f) throw usage_error(fmt::format("cannot write {}", quote_name(out)));
    }
    return exit_ok;
  }
  if (verb == "rm") {
    auto r = blobs->remove(tenant, arg);
    if (!r) {
      std::cerr << "sandboxctl: blob rm: " << r.error().message() << "\n";
      return exit_fail;
    }
    return exit_ok;
  }
  if (verb == "ls") {
    auto ids = blobs->list(tenant);
    if (!ids) {
      std::cerr << "sandboxctl: blob ls: " << ids.error().message() << "\n";
      return exit_fail;
    }
    for (const auto& id : *ids) std::cout << id << "\n";
    return exit_ok;
  }
  throw usage_error("blob: expected put, get, rm, ls, pin, unpin or gc");
}

// --- image -------------------------------------------------------------------------------

int cmd_image(const std::vector<std::string>& args) {
  common c;
  std::string verb, a1, a2, ref;
  std::vector<std::string> packages, npm_packages;
  auto d = common_options(c);
  d.add_options()("verb", po::value(&verb))("a1", po::value(&a1))("a2", po::value(&a2))(
      "ref", po::value(&ref), "import only manifests with this ref name")(
      "package", po::value(&packages), "Debian package for `image build` (repeatable)")(
      "npm", po::value(&npm_packages),
      "npm package pinned to an exact version (NAME@X.Y.Z) for `image build`, installed "
      "with scripts disabled into /opt/npm of the image (repeatable)");
  po::positional_options_description pos;
  pos.add("verb", 1).add("a1", 1).add("a2", 1);
  parse(args, d, pos);
  auto fail = [](const char* what, const boost::system::error_code& ec) {
    std::cerr << "sandboxctl: image " << what << ": " << ec.message() << "\n";
    return exit_fail;
  };
  if (verb == "build") {
    if (a1.empty()) throw usage_error("image build: NAME missing");
    if (packages.empty()) {
      if (a1 == "python3") packages = {"python3"};
      else if (a1 == "node") packages = {"nodejs"};
      else throw usage_error("image build: give --package for a runtime other than python3/node");
    }
    for (const auto& n : npm_packages) {
      if (!sandbox::detail::is_pinned_npm_package(n)) {
        throw usage_error(fmt::format(
            "image build: --npm {}: not an npm package pinned to one exact version "
            "(NAME@X.Y.Z or @SCOPE/NAME@X.Y.Z)",
            quote_name(n)));
      }
    }
    auto store = open_images(c);
    auto digest = sandbox::build_debian_image(
        *store, {.name = a1, .packages = packages, .npm_packages = npm_packages});
    if (!digest) return fail("build", digest.error());
    std::cout << *digest << "\n";
    return exit_ok;
  }
  if (verb == "import") {
    if (a1.empty() || a2.empty()) throw usage_error("image import: LAYOUT_DIR and NAME needed");
    auto store = open_images(c);
    auto digest = store->import_layout(std::filesystem::absolute(a1), a2, ref);
    if (!digest) return fail("import", digest.error());
    std::cout << *digest << "\n";
    return exit_ok;
  }
  if (verb == "ls") {
    auto list = open_images(c, true)->list();
    if (!list) return fail("ls", list.error());
    for (const auto& i : *list) {
      std::cout << fmt::format("{:<10} {} {:>10} {} {}\n", i.name, i.digest, i.size_bytes,
                               i.created, i.current ? "current" : "");
    }
    return exit_ok;
  }
  if (verb == "current") {
    if (a1.empty()) throw usage_error("image current: NAME missing");
    auto d2 = open_images(c, true)->current_digest(a1);
    if (!d2) return fail("current", d2.error());
    std::cout << *d2 << "\n";
    return exit_ok;
  }
  if (verb == "use") {
    if (a1.empty() || a2.empty()) throw usage_error("image use: NAME and DIGEST needed");
    auto r = open_images(c)->set_current(a1, a2);
    if (!r) return fail("use", r.error());
    return exit_ok;
  }
  if (verb == "verify") {
    if (a1.empty()) throw usage_error("image verify: DIGEST or NAME missing");
    auto store = open_images(c, true);
    std::string digest = a1;
    if (a1.rfind("sha256:", 0) != 0) {
      auto cur = store->current_digest(a1);
      if (!cur) return fail("verify", cur.error());
      digest = *cur;
    }
    auto r = store->verify(digest);
    if (!r) return fail("verify", r.error());
    std::cout << digest << ": ok\n";
    return exit_ok;
  }
  if (verb == "rm") {
    auto r = open_images(c)->remove(a1);
    if (!r) return fail("rm", r.error());
    return exit_ok;
  }
  throw usage_error("image: expected build, import, ls, current, use, verify or rm");
}

// --- run ---------------------------------------------------------------------------------

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
      if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) esc(c);
      else out.push_back(static_cast<char>(c));
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
    throw usage_error(fmt::format("--out-dir {} is a symbolic link (outputs are never written "
                                  "through a link)", quote_name(dir)));
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
    std::size_t off = 0;
    while (off < bytes->size()) {
      ssize_t n = ::write(fd, bytes->data() + off, bytes->size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      off += static_cast<std::size_t>(n);
    }
    ::close(fd);
    if (off != bytes->size()) {
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
                             sandboxctl::escape_format_chars(d.name_display),
                             to_string(d.reason));
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
                             r.message.empty() ? "" : ": " + sandboxctl::escape_format_chars(r.message));
  }
  return r.code == sandbox::code::ok ? exit_ok : exit_fail;
}

// Runs one request; SIGINT, SIGTERM and SIGHUP cancel it (the run is killed and cleaned up)
// and the exit status is 128 + the signal.
int run_with_signals(sandbox::runtime_options opts, sandbox::run_request req,
                     const sandbox::ticket& ticket, sandbox::run_result* out) {
  // One run: a configuration's warm pools would only be prepared to be thrown away.
  opts.process.warm_pool.clear();
  opts.container.warm_pool.clear();
  opts.gvisor.warm_pool.clear();
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

int cmd_run(const std::vector<std::string>& args) {
  common c;
  std::string request_path, runtime, out_dir, script, tool, stdin_file;
  std::vector<std::string> files, env, allow_env, egress;
  std::string timeout_text, memory_text;
  bool json = false, force = false, network = false;
  auto d = common_options(c);
  d.add_options()("request", po::value(&request_path), "request JSON file ('-' = stdin)")(
      "ticket", po::value(&c.ticket_path), "ticket JSON file (or signed ticket document)")(
      "trusted-keys", po::value(&c.trusted_keys),
      "Ed25519 public key file or directory of <kid>.pub.pem: --ticket must be a signed "
      "ticket that verifies against them (repeatable)")(
      "file", po::value(&files), "input NAME=PATH (repeatable)")(
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
      "tool", po::value(&tool), "run this registered tool (--config's tools) instead of a SCRIPT")(
      "stdin-file", po::value(&stdin_file),
      "--tool only: the tool's standard input, byte for byte ('-' = stdin)")(
      "out-dir", po::value(&out_dir), "write output files here")(
      "force", po::bool_switch(&force), "replace existing entries in --out-dir")(
      "json", po::bool_switch(&json), "print the result JSON")("script", po::value(&script));
  po::positional_options_description pos;
  pos.add("script", 1);
  auto vm = parse(args, d, pos);
  if (c.ticket_path.empty()) throw usage_error("run: --ticket is required");
  // Numbers are checked here, strictly: "-1" must not wrap to 2^64-1, and 0 is refused as
  // the protocol refuses timeout_ms <= 0 (no silent default).
  std::optional<std::int64_t> timeout_ms;
  std::optional<std::uint64_t> memory;
  if (!timeout_text.empty() || vm.count("timeout-ms") != 0) {
    timeout_ms = parse_number<std::int64_t>("timeout-ms", timeout_text, 1,
                                            sandboxctl::max_duration_ms);
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
  auto ticket = load_ticket(c.ticket_path, c.trusted_keys);
  if (!ticket) return print_result(sandbox::rejected_result(ticket.error()), true, nullptr, {});

  auto opts = options_from(c);
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
    req.egress = egress;  // admission checks them (and that they come with --network)
    for (const auto& e : env) {
      auto eq = e.find('=');
      if (eq == std::string::npos || eq == 0) {
        throw usage_error(fmt::format("--env {}: expected NAME=VALUE", quote_name(e)));
      }
      if (!req.env.emplace(e.substr(0, eq), e.substr(eq + 1)).second) {
        // As in a request's JSON, where a repeated key is refused: never keep one silently.
        throw usage_error(fmt::format("--env {}: given more than once", quote_name(e.substr(0, eq))));
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

// --- ticket ------------------------------------------------------------------------------

// True when `flag` was given (also as `flag=value`), even with an empty value.
bool vm_has(const std::vector<std::string>& args, const std::string& flag) {
  for (const auto& a : args) {
    if (a == flag || a.rfind(flag + "=", 0) == 0) return true;
  }
  return false;
}

// `ticket keygen --kid K --out DIR`, `ticket sign --key FILE [--kid K] [--parent DOC] T.json`,
// `ticket verify --trusted-keys PATH... DOC`, `ticket derive --ticket T --approval A [...]`.
int cmd_ticket(const std::vector<std::string>& args) {
  std::string verb, file, kid, out_dir, key_path, parent_path, ticket_path, approval_path, id;
  std::string ttl_text;
  std::vector<std::string> trusted, domains;
  po::options_description d("ticket options");
  d.add_options()("verb", po::value(&verb))("file", po::value(&file))(
      "kid", po::value(&kid), "key id (keygen: required; sign: default from the key file)")(
      "out", po::value(&out_dir), "keygen: directory for <kid>.pem and <kid>.pub.pem")(
      "key", po::value(&key_path), "sign: the private key file (<kid>.pem)")(
      "parent", po::value(&parent_path), "sign: the parent's signed document (derived ticket)")(
      "trusted-keys", po::value(&trusted), "verify: public key file or directory (repeatable)")(
      "ticket", po::value(&ticket_path), "derive: the parent ticket (plain, or signed with "
                                         "--trusted-keys)")(
      "approval", po::value(&approval_path),
      "derive: the approval request (or a run result carrying one)")(
      "domain", po::value(&domains), "derive: approve only this domain (repeatable)")(
      "ttl-s", po::value(&ttl_text), "derive: lifetime in seconds (1-3600, default 600)")(
      "id", po::value(&id), "derive: the derived ticket's id (default: random)");
  po::positional_options_description pos;
  pos.add("verb", 1).add("file", 1);
  parse(args, d, pos);
  if (verb == "keygen") {
    if (kid.empty() || out_dir.empty()) throw usage_error("ticket keygen: --kid and --out needed");
    if (!sandbox::is_valid_key_id(kid)) {
      throw usage_error(fmt::format("ticket keygen: invalid key id {} (1-64 of [A-Za-z0-9._-])",
                                    quote_name(kid)));
    }
    auto r = sandbox::write_ed25519_key_files(std::filesystem::absolute(out_dir), kid);
    if (!r) {
      std::cerr << fmt::format("sandboxctl: ticket keygen: {}: {}\n", quote_name(out_dir),
                               r.error().message());
      return exit_fail;
    }
    std::cout << (std::filesystem::path(out_dir) / (kid + ".pem")).string() << "\n"
              << (std::filesystem::path(out_dir) / (kid + ".pub.pem")).string() << "\n";
    return exit_ok;
  }
  if (verb == "sign") {
    if (key_path.empty() || file.empty()) throw usage_error("ticket sign: --key FILE and TICKET.json needed");
    auto signer = sandbox::ticket_signer::load(std::filesystem::absolute(key_path), kid);
    if (!signer) {
      std::cerr << fmt::format("sandboxctl: ticket sign: --key {}: {}\n", quote_name(key_path),
                               signer.error().message());
      return exit_fail;
    }
    auto text = read_file(file, max_ticket_file);
    if (text.size() > max_ticket_file) throw usage_error(fmt::format("ticket file {} is too large", quote_name(file)));
    auto t = sandbox::ticket_issuer{}.decode(text);
    if (!t) {
      std::cerr << "sandboxctl: ticket sign: ticket: " << t.error().message << "\n";
      return exit_fail;
    }
    sandbox::result<std::string> doc = sandbox::make_error_code(sandbox::errc::invalid_argument);
    if (t->is_derived()) {
      if (parent_path.empty()) {
        throw usage_error("ticket sign: a derived ticket needs --parent (its parent's signed document)");
      }
      auto parent = read_file(parent_path, sandbox::max_signed_ticket_bytes);
      doc = signer->sign(*t, parent);
    } else {
      if (!parent_path.empty()) throw usage_error("ticket sign: --parent is for derived tickets only");
      doc = signer->sign(*t);
    }
    if (!doc) {
      std::cerr << "sandboxctl: ticket sign: " << doc.error().message()
                << (t->is_derived() ? " (is --parent the signed parent of this ticket?)" : "")
                << "\n";
      return exit_fail;
    }
    std::cout << *doc << "\n";
    return exit_ok;
  }
  if (verb == "verify") {
    if (trusted.empty() || file.empty()) {
      throw usage_error("ticket verify: --trusted-keys PATH and a signed ticket document needed");
    }
    auto keys = trusted_keys_of(trusted);
    auto text = read_file(file, sandbox::max_signed_ticket_bytes);
    auto t = keys.verify(text, std::chrono::system_clock::now());
    if (!t) {
      std::cerr << "sandboxctl: ticket verify: " << t.error().message << "\n";
      return exit_fail;
    }
    std::cout << sandbox::encode(*t) << "\n";
    return exit_ok;
  }
  if (verb == "derive") {
    if (ticket_path.empty() || approval_path.empty()) {
      throw usage_error("ticket derive: --ticket PARENT and --approval FILE needed");
    }
    auto parent = load_ticket(ticket_path, trusted);
    if (!parent) {
      std::cerr << "sandboxctl: ticket derive: " << parent.error().message << "\n";
      return exit_fail;
    }
    // An approval request, or the approval_required result that carries one.
    const auto text = read_file(approval_path, max_request_file);
    std::optional<sandbox::approval_request> approval;
    if (auto q = sandbox::decode_approval_request(text)) {
      approval = std::move(*q);
    } else if (auto r = sandbox::decode_run_result(text); r && r->approval) {
      approval = std::move(*r->approval);
    } else {
      std::cerr << "sandboxctl: ticket derive: --approval: " << q.error().message << "\n";
      return exit_fail;
    }
    sandbox::derive_options o;
    o.id = id;
    if (!ttl_text.empty() || vm_has(args, "--ttl-s")) {
      o.ttl = std::chrono::seconds(parse_number<std::int64_t>(
          "ttl-s", ttl_text, 1, sandbox::max_derived_ttl.count()));
    }
    if (!domains.empty()) o.domains = domains;
    auto d = sandbox::ticket_issuer{}.derive(*parent, *approval, o);
    if (!d) {
      std::cerr << "sandboxctl: ticket derive: the approval is not for this ticket, or the "
                   "options are out of range (domains must be among the requested ones)\n";
      return exit_fail;
    }
    std::cout << sandbox::encode(*d) << "\n";
    return exit_ok;
  }
  throw usage_error("ticket: expected keygen, sign, verify or derive");
}

// Host tuning the operator may want (never applied by us: it is a host-wide kernel setting).
// Moving a process between cgroups takes a global lock whose write side waits for an RCU
// grace period unless some cgroup hierarchy is mounted with `favordynmods` (Linux ≥ 6.1;
// Documentation/admin-guide/cgroup-v2.rst); every run pays that wait once when it attaches.
void doctor_tuning_hints() {
  std::ifstream mounts("/proc/self/mounts");
  std::string dev, dir, type, opts, line;
  std::string cgroup2_dir;
  bool favored = false, any_cgroup = false;
  while (std::getline(mounts, line)) {
    std::istringstream in(line);
    if (!(in >> dev >> dir >> type >> opts)) continue;
    if (type != "cgroup" && type != "cgroup2") continue;
    any_cgroup = true;
    if (("," + opts + ",").find(",favordynmods,") != std::string::npos) favored = true;
    if (type == "cgroup2" && cgroup2_dir.empty()) cgroup2_dir = dir;
  }
  if (!any_cgroup || favored) return;
  std::cout << fmt::format(
      "hint: no cgroup hierarchy is mounted with favordynmods, so each run's cgroup attach waits "
      "for an RCU grace period (milliseconds on a busy host); as root: mount -o "
      "remount,favordynmods {} (see docs/operations.md, Tuning)\n",
      cgroup2_dir.empty() ? "<a cgroup mount>" : cgroup2_dir);
}

int cmd_doctor(const std::vector<std::string>& args) {
  common c;
  auto d = common_options(c);
  parse(args, d, {});
  auto statuses = sandbox::probe_backends(options_from(c));
  bool any = false;
  for (const auto& s : statuses) {
    std::cout << fmt::format("{:<10} {:<8} {}\n", to_string(s.isolation), s.registered ? "ok" : "refused",
                             s.reason);
    any = any || s.registered;
  }
  doctor_tuning_hints();
  return any ? exit_ok : exit_fail;
}

// `sandboxctl audit`: the audited level's backend alone (so no other level can serve its
// runs), the audit's runs, the verdict as a table or one line of JSON. Exit 0 only when
// every check passed; 1 otherwise (the failing checks named), 2 for usage errors.
int cmd_audit(const std::vector<std::string>& args) {
  common c;
  std::string level_name = "process", runtime = "python3";
  bool json = false;
  auto d = common_options(c);
  d.add_options()("isolation", po::value(&level_name),
                  "level to audit: process (default), container, gvisor or microvm")(
      "runtime", po::value(&runtime), "a Python 3 runtime to run the probe with (python3)")(
      "json", po::bool_switch(&json), "print the report as one line of JSON");
  parse(args, d, {});
  auto level = sandbox::isolation_from_string(level_name);
  if (!level) {
    throw usage_error(fmt::format("--isolation {}: expected process, container, gvisor or microvm",
                                  quote_name(level_name)));
  }
  auto o = options_from(c);
  // The probe is Python: a runtime that is not configured, or whose interpreter is not a
  // Python (argv[0]'s file name "python", "python3", "python3.11", ...), is a usage error,
  // not a failed audit.
  {
    auto spec = std::find_if(o.runtimes.begin(), o.runtimes.end(),
                             [&](const sandbox::runtime_spec& r) { return r.name == runtime; });
    if (spec == o.runtimes.end()) {
      std::string known;
      for (const auto& r : o.runtimes) known += (known.empty() ? "" : ", ") + r.name;
      throw usage_error(fmt::format("--runtime {}: unknown runtime (configured: {})",
                                    quote_name(runtime), known.empty() ? "none" : known));
    }
    std::string base = spec->argv.empty()
                           ? std::string()
                           : std::filesystem::path(spec->argv.front()).filename().string();
    const bool python =
        base.starts_with("python") && base.find_first_not_of("0123456789.", 6) == std::string::npos;
    if (!python) {
      throw usage_error(fmt::format(
          "--runtime {}: its interpreter {} is not Python (the audit's probe is Python)",
          quote_name(runtime), quote_name(spec->argv.empty() ? "(none)" : spec->argv.front())));
    }
  }
  o.process_backend = *level == sandbox::isolation::process;
  o.container.enabled = *level == sandbox::isolation::container;
  o.gvisor.enabled = *level == sandbox::isolation::gvisor;
  o.microvm.enabled = *level == sandbox::isolation::microvm;  // the config's settings kept
  o.microvm.warm_pool.clear();
  auto rt = sandbox::runtime::create(o);
  if (!rt) {
    std::cerr << "sandboxctl: audit: the runtime cannot be created: " << rt.error().message()
              << "\n";
    return exit_fail;
  }
  sandbox::audit_options ao;
  ao.isolation = *level;
  ao.runtime = runtime;
  auto report = sandbox::evaluate_audit(sandbox::gather_audit_evidence(*rt, ao));
  if (json) {
    std::cout << sandbox::encode_audit_report(report) << "\n";
  } else {
    std::cout << sandbox::format_audit_table(report);
  }
  return report.passed() ? exit_ok : exit_fail;
}

}  // namespace

// `tools`: the registry as the configuration gives it (name, image, program, level, profile).
int cmd_tools(const std::vector<std::string>& args) {
  common c;
  auto d = common_options(c);
  po::positional_options_description pos;
  parse(args, d, pos);
  auto opts = options_from(c);
  if (opts.tools.empty()) {
    std::cerr << "sandboxctl: no registered tools (the configuration's \"tools\" section)\n";
    return exit_ok;
  }
  for (const auto& t : opts.tools) {
    std::string argv = t.binary;
    for (const auto& a : t.args) argv += " " + quote_name(a);
    std::cout << fmt::format("{:<16} {:<10} {:<10} {:<10} {}\n", t.name, t.image,
                             sandbox::to_string(t.isolation), t.profile.empty() ? "-" : t.profile,
                             sandboxctl::escape_format_chars(argv));
  }
  return exit_ok;
}

// --- receipt -----------------------------------------------------------------------------

// `receipt verify --trusted-keys PATH FILE`: FILE is a receipt document, a run result with a
// "receipt", or a run record whose result has one. The signature is checked, and for a
// result or record the receipt must also describe that result (`receipt_mismatch`). Prints
// the verified claims; exit 1 naming what failed.
int cmd_receipt(const std::vector<std::string>& args) {
  std::string verb, file;
  std::vector<std::string> keys;
  po::options_description d("options");
  d.add_options()("verb", po::value(&verb))("file", po::value(&file))(
      "trusted-keys", po::value(&keys), "public key file or directory of <kid>.pub.pem");
  po::positional_options_description pos;
  pos.add("verb", 1).add("file", 1);
  parse(args, d, pos);
  if (verb != "verify") throw usage_error("receipt: expected verify");
  if (file.empty() || keys.empty()) throw usage_error("receipt verify: --trusted-keys and FILE needed");
  sandbox::receipt_verifier v;
  for (const auto& k : keys) {
    auto loaded = v.load_keys(std::filesystem::absolute(k));
    if (!loaded) {
      throw usage_error(fmt::format("--trusted-keys {}: {}", quote_name(k), loaded.error().message()));
    }
  }
  const std::size_t max_bytes = max_request_file * 2;
  auto text = read_file(file, max_bytes);
  if (text.size() > max_bytes) throw usage_error(fmt::format("{} is too large", quote_name(file)));
  auto fail = [](const std::string& why) {
    std::cerr << "sandboxctl: receipt verify: " << why << "\n";
    return exit_fail;
  };
  // Which kind of document: judged by its top-level members only; each is then decoded
  // strictly by its own decoder.
  std::optional<sandbox::run_result> result;
  std::string receipt_doc = text;
  nlohmann::json probe = nlohmann::json::parse(text, nullptr, false);
  if (probe.is_object() && probe.contains("result") && probe.contains("record_id")) {
    auto rec = sandbox::decode_run_record(text);
    if (!rec) return fail(rec.error().message);
    result = rec->result;
  } else if (probe.is_object() && probe.contains("code")) {
    auto r = sandbox::decode_run_result(text);
    if (!r) return fail("result: " + r.error().message);
    result = *r;
  }
  if (result) {
    if (!result->receipt) return fail("the result carries no receipt");
    receipt_doc = *result->receipt;
  }
  auto claims = v.verify(receipt_doc);
  if (!claims) return fail(claims.error().message);
  if (result) {
    if (auto field = sandbox::receipt_mismatch(*claims, *result)) {
      return fail("the receipt does not describe this result: " + *field + " differs");
    }
  }
  std::cout << sandbox::encode(*claims) << "\n";
  return exit_ok;
}

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    std::cout << top_usage;
    return args.empty() ? exit_usage : exit_ok;
  }
  std::string cmd = args[0];
  args.erase(args.begin());
  try {
    if (cmd == "run") return cmd_run(args);
    if (cmd == "blob") return cmd_blob(args);
    if (cmd == "image") return cmd_image(args);
    if (cmd == "doctor") return cmd_doctor(args);
    if (cmd == "audit") return cmd_audit(args);
    if (cmd == "tools") return cmd_tools(args);
    if (cmd == "ticket") return cmd_ticket(args);
    if (cmd == "receipt") return cmd_receipt(args);
    if (cmd == "serve") return sandboxctl::cmd_serve(args);
    throw usage_error(fmt::format("unknown command {}", quote_name(cmd)));
  } catch (const usage_error& e) {
    std::cerr << "sandboxctl: " << e.what() << "\n(see sandboxctl --help)\n";
    return exit_usage;
  } catch (const std::exception& e) {
    std::cerr << "sandboxctl: " << e.what() << "\n";
    return exit_fail;
  }
}
