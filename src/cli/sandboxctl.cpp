// sandboxctl: the command-line front end of agent-sandbox.
//
// The CLI trusts its caller: it reads tickets from files the local operator controls (see
// docs/protocol.md). Exit status of `run`: 0 when the result's code is `ok`, 1 for any other
// code, 2 for usage errors (bad options, unreadable files). Other commands: 0 success, 1
// failure, 2 usage.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sandbox/sandbox.hpp"

namespace po = boost::program_options;

namespace {

constexpr int exit_ok = 0;
constexpr int exit_fail = 1;
constexpr int exit_usage = 2;

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const char* top_usage =
    "usage: sandboxctl <command> [options]\n"
    "\n"
    "commands:\n"
    "  run --request REQ.json --ticket TICKET.json   run a protocol request; prints the result JSON\n"
    "  run --ticket T.json [--file NAME=PATH]... [--timeout-ms N] [--runtime R]\n"
    "      [--memory-bytes N] [--out-dir DIR] [--json] SCRIPT\n"
    "                                                run a script file ('-' = stdin)\n"
    "  blob put FILE [--tenant T | --ticket T.json]  store a file; prints its blob id\n"
    "  blob get ID [--tenant T | --ticket T.json] [-o FILE]\n"
    "                                                write a blob's bytes (stdout by default)\n"
    "  blob rm ID [--tenant T | --ticket T.json]     delete a blob\n"
    "  blob ls [--tenant T | --ticket T.json]        list a tenant's blob ids\n"
    "  image build NAME [--package P]...             build a runtime image (python3, node, ...)\n"
    "  image import LAYOUT_DIR NAME [--ref REF]      import an OCI image layout as runtime NAME\n"
    "  image ls                                      list images (current and earlier)\n"
    "  image current NAME                            print the current digest of runtime NAME\n"
    "  image use NAME DIGEST                         make an earlier image current (rollback)\n"
    "  image verify DIGEST|NAME                      re-hash every blob of an image\n"
    "  image rm DIGEST                               remove an image that is not current\n"
    "  doctor                                        which backends work on this host, and why not\n"
    "\n"
    "store options (every command): --state-dir DIR --image-dir DIR --blob-dir DIR\n"
    "  --cgroup-parent PATH (unprivileged hosts: a delegated cgroup subtree)\n"
    "  -v/--verbose (host log lines on stderr)\n";

std::string read_file(const std::string& path) {
  std::ifstream in(path == "-" ? "/dev/stdin" : path, std::ios::binary);
  if (!in) throw usage_error(fmt::format("cannot read '{}'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct common {
  std::string state_dir, image_dir, blob_dir, cgroup_parent, tenant, ticket_path;
  bool verbose = false;
};

po::options_description common_options(common& c) {
  po::options_description d("options");
  d.add_options()("state-dir", po::value(&c.state_dir), "per-host state directory")(
      "image-dir", po::value(&c.image_dir), "image store directory")(
      "blob-dir", po::value(&c.blob_dir), "blob store directory")(
      "cgroup-parent", po::value(&c.cgroup_parent), "parent cgroup of runs")(
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
  return o;
}

po::variables_map parse(const std::vector<std::string>& args, const po::options_description& d,
                        const po::positional_options_description& pos) {
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(d).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw usage_error(e.what());
  }
  return vm;
}

// A ticket file: decoded by the local issuer (the CLI trusts its caller).
boost::system::result<sandbox::ticket, sandbox::rejection> load_ticket(const std::string& path) {
  sandbox::ticket_issuer issuer;
  auto r = issuer.decode(read_file(path));
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
    auto t = load_ticket(c.ticket_path);
    if (!t) throw usage_error(t.error().message);
    return t->tenant();
  }
  std::string t = c.tenant.empty() ? "default" : c.tenant;
  if (!sandbox::is_valid_tenant(t)) throw usage_error(fmt::format("invalid tenant name '{}'", t));
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

int cmd_blob(const std::vector<std::string>& args) {
  common c;
  std::string verb, arg, out;
  auto d = common_options(c);
  d.add_options()("verb", po::value(&verb))("arg", po::value(&arg))(
      "tenant", po::value(&c.tenant), "tenant (default: \"default\")")(
      "ticket", po::value(&c.ticket_path), "take the tenant from this ticket")(
      "output,o", po::value(&out), "write to FILE instead of stdout");
  po::positional_options_description pos;
  pos.add("verb", 1).add("arg", 1);
  parse(args, d, pos);
  std::string tenant = tenant_of(c);
  auto blobs = open_blobs(c);
  if (verb == "put") {
    if (arg.empty()) throw usage_error("blob put: FILE missing");
    int fd = arg == "-" ? dup(0) : ::open(arg.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw usage_error(fmt::format("cannot read '{}'", arg));
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
      if (!f) throw usage_error(fmt::format("cannot write '{}'", out));
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
  throw usage_error("blob: expected put, get, rm or ls");
}

// --- image -------------------------------------------------------------------------------

int cmd_image(const std::vector<std::string>& args) {
  common c;
  std::string verb, a1, a2, ref;
  std::vector<std::string> packages;
  auto d = common_options(c);
  d.add_options()("verb", po::value(&verb))("a1", po::value(&a1))("a2", po::value(&a2))(
      "ref", po::value(&ref), "import only manifests with this ref name")(
      "package", po::value(&packages), "Debian package for `image build` (repeatable)");
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
    auto store = open_images(c);
    auto digest = sandbox::build_debian_image(*store, {.name = a1, .packages = packages});
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

int print_result(const sandbox::run_result& r, bool json, const std::string& out_dir,
                 const sandbox::runtime* rt, const std::string& tenant) {
  if (json || rt == nullptr) {
    std::cout << sandbox::encode(r) << "\n";
  } else {
    auto blobs = rt->blobs();
    auto emit = [&](const sandbox::stream_capture& s, std::ostream& os) {
      if (s.blob.empty()) return;
      auto bytes = blobs->get(tenant, s.blob);
      if (bytes) os.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
    };
    emit(r.std_out, std::cout);
    std::cout.flush();
    emit(r.std_err, std::cerr);
    if (!out_dir.empty()) {
      for (const auto& f : r.files_out) {
        auto bytes = blobs->get(tenant, f.blob);
        if (!bytes) continue;
        std::ofstream(std::filesystem::path(out_dir) / f.name, std::ios::binary)
            .write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
      }
    }
    std::cerr << fmt::format("sandboxctl: {}{}{} (wall {} ms, cpu {} ms){}\n", to_string(r.code),
                             r.exit_code ? fmt::format(", exit {}", *r.exit_code) : "",
                             r.signal ? fmt::format(", signal {}", *r.signal) : "",
                             r.usage.wall.count(), r.usage.cpu.count(),
                             r.message.empty() ? "" : ": " + r.message);
  }
  return r.code == sandbox::code::ok ? exit_ok : exit_fail;
}

int cmd_run(const std::vector<std::string>& args) {
  common c;
  std::string request_path, runtime = "python3", out_dir, script;
  std::vector<std::string> files;
  std::int64_t timeout_ms = 0;
  std::uint64_t memory = 0;
  bool json = false;
  auto d = common_options(c);
  d.add_options()("request", po::value(&request_path), "request JSON file ('-' = stdin)")(
      "ticket", po::value(&c.ticket_path), "ticket JSON file")(
      "file", po::value(&files), "input NAME=PATH (repeatable)")(
      "timeout-ms", po::value(&timeout_ms), "timeout")("runtime", po::value(&runtime),
                                                      "runtime name (default python3)")(
      "memory-bytes", po::value(&memory), "memory limit")(
      "out-dir", po::value(&out_dir), "write output files here")(
      "json", po::bool_switch(&json), "print the result JSON")("script", po::value(&script));
  po::positional_options_description pos;
  pos.add("script", 1);
  parse(args, d, pos);
  if (c.ticket_path.empty()) throw usage_error("run: --ticket is required");
  if (request_path.empty() == script.empty()) {
    throw usage_error("run: give either --request REQ.json or a SCRIPT");
  }
  auto ticket = load_ticket(c.ticket_path);
  if (!ticket) return print_result(sandbox::rejected_result(ticket.error()), true, {}, nullptr, {});

  auto opts = options_from(c);
  auto rt = sandbox::runtime::create(opts);
  if (!rt) {
    std::cerr << "sandboxctl: cannot start the runtime: " << rt.error().message() << "\n";
    return exit_fail;
  }
  sandbox::run_request req;
  if (!request_path.empty()) {
    auto decoded = sandbox::decode_run_request(read_file(request_path));
    if (!decoded) return print_result(sandbox::rejected_result(decoded.error()), true, {}, nullptr, {});
    req = std::move(*decoded);
    json = true;
  } else {
    req.runtime = runtime;
    req.source = read_file(script);
    if (timeout_ms != 0) req.timeout = std::chrono::milliseconds(timeout_ms);
    if (memory != 0) req.memory_limit_bytes = memory;
    for (const auto& f : files) {
      auto eq = f.find('=');
      if (eq == std::string::npos || eq == 0) {
        throw usage_error(fmt::format("--file '{}': expected NAME=PATH", f));
      }
      std::string path = f.substr(eq + 1);
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) throw usage_error(fmt::format("cannot read '{}'", path));
      auto id = rt->blobs()->put_fd(ticket->tenant(), fd, 1ULL << 32);
      ::close(fd);
      if (!id) {
        std::cerr << "sandboxctl: storing '" << path << "': " << id.error().message() << "\n";
        return exit_fail;
      }
      req.files_in.push_back({.name = f.substr(0, eq), .blob = *id});
    }
  }
  auto result = rt->run(std::move(req), *ticket);
  return print_result(result, json, out_dir, &*rt, ticket->tenant());
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
  return any ? exit_ok : exit_fail;
}

}  // namespace

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
    throw usage_error(fmt::format("unknown command '{}'", cmd));
  } catch (const usage_error& e) {
    std::cerr << "sandboxctl: " << e.what() << "\n(see sandboxctl --help)\n";
    return exit_usage;
  } catch (const std::exception& e) {
    std::cerr << "sandboxctl: " << e.what() << "\n";
    return exit_fail;
  }
}
