// What sandboxctl's verbs share (cli/cli_util.hpp).
#include "cli/cli_util.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>

namespace sandboxctl {

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

std::string read_config(const std::string& path, std::string& text) {
  constexpr std::size_t max_config_bytes = 1U << 20;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return fmt::format("cannot read {}: {}", quote_name(path), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const bool dir = S_ISDIR(st.st_mode);
    ::close(fd);
    return fmt::format("{} is {}", quote_name(path), dir ? "a directory" : "not a regular file");
  }
  std::array<char, 65536> buf{};
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return fmt::format("cannot read {}: {}", quote_name(path), std::strerror(err));
    }
    if (n == 0) break;
    text.append(buf.data(), static_cast<std::size_t>(n));
    if (text.size() > max_config_bytes) {
      ::close(fd);
      return fmt::format("{} is larger than {} bytes", quote_name(path), max_config_bytes);
    }
  }
  ::close(fd);
  return {};
}

std::string load_config(const std::string& path, sandbox::runtime_options& options) {
  std::string text;
  if (auto why = read_config(path, text); !why.empty()) return "--config: " + why;
  if (auto applied = sandbox::apply_config(text, options); !applied) {
    return "--config: " + applied.error().message;
  }
  return {};
}

std::string load_trusted_keys(const std::vector<std::string>& paths,
                              sandbox::ticket_verifier& keys) {
  for (const auto& path : paths) {
    auto loaded = keys.load_keys(std::filesystem::absolute(path));
    if (!loaded) {
      return fmt::format("--trusted-keys {}: {}", quote_name(path), loaded.error().message());
    }
  }
  return {};
}

po::options_description common_options(common_flags& c) {
  po::options_description d("options");
  d.add_options()("state-dir", po::value(&c.state_dir), "per-host state directory")(
      "image-dir", po::value(&c.image_dir), "image store directory")(
      "blob-dir", po::value(&c.blob_dir), "blob store directory")(
      "cgroup-parent", po::value(&c.cgroup_parent), "parent cgroup of runs")(
      "config", po::value(&c.config_path), "host configuration file (as for serve --config)")(
      "verbose,v", po::bool_switch(&c.verbose), "host log lines on stderr");
  return d;
}

sandbox::runtime_options store_options_of(const common_flags& c, sandbox::log_level quiet) {
  auto o = sandbox::default_runtime_options();
  if (!c.state_dir.empty()) o.state_dir = std::filesystem::absolute(c.state_dir);
  if (!c.image_dir.empty()) o.image_dir = std::filesystem::absolute(c.image_dir);
  if (!c.blob_dir.empty()) o.blob_dir = std::filesystem::absolute(c.blob_dir);
  if (!c.cgroup_parent.empty()) o.process.cgroup_parent = c.cgroup_parent;
  o.log = sandbox::make_stderr_log_sink(c.verbose ? sandbox::log_level::debug : quiet);
  return o;
}

sandbox::runtime_options options_from(const common_flags& c) {
  auto o = store_options_of(c, sandbox::log_level::error);
  if (!c.config_path.empty()) {
    if (auto why = load_config(c.config_path, o); !why.empty()) throw usage_error(why);
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

sandbox::ticket_verifier trusted_keys_of(const std::vector<std::string>& paths) {
  sandbox::ticket_verifier v;
  if (auto why = load_trusted_keys(paths, v); !why.empty()) throw usage_error(why);
  return v;
}

boost::system::result<sandbox::ticket, sandbox::rejection> load_ticket(
    const std::string& path, const std::vector<std::string>& trusted_keys) {
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

std::string tenant_of(const common_flags& c) {
  if (!c.tenant.empty() && !c.ticket_path.empty()) {
    throw usage_error("give --tenant or --ticket, not both");
  }
  if (!c.ticket_path.empty()) {
    auto t = load_ticket(c.ticket_path, c.trusted_keys);
    if (!t) throw usage_error(t.error().message);
    return t->tenant();
  }
  std::string t = c.tenant.empty() ? "default" : c.tenant;
  if (!sandbox::is_valid_tenant(t)) {
    throw usage_error(fmt::format("invalid tenant name {}", quote_name(t)));
  }
  return t;
}

std::shared_ptr<sandbox::blob_store> open_blobs(const common_flags& c) {
  auto o = options_from(c);
  auto store = sandbox::open_fs_blob_store({.root = o.blob_dir});
  if (!store) throw std::runtime_error("cannot open the blob store: " + store.error().message());
  return *store;
}

std::shared_ptr<sandbox::image_store> open_images(const common_flags& c, bool read_only) {
  auto o = options_from(c);
  auto store = sandbox::open_image_store({.root = o.image_dir, .read_only = read_only});
  if (!store) throw std::runtime_error("cannot open the image store: " + store.error().message());
  return *store;
}

boost::system::result<sandbox::ticket, sandbox::rejection> local_ticket(const sandbox::policy& p,
                                                                        const std::string& tool,
                                                                        sandbox::isolation level) {
  sandbox::ticket_spec spec{.id = "local",
                            .tenant = "default",
                            .execute = tool.empty(),
                            .isolation = level,
                            .max_timeout = p.max_timeout,
                            .max_memory_bytes = p.max_memory_bytes};
  if (!tool.empty()) spec.tools = {tool};
  auto t = sandbox::ticket_issuer{}.issue(spec);
  if (!t)
    return sandbox::rejection{sandbox::code::invalid_request,
                              "local ticket: " + t.error().message()};
  return *t;
}

sandbox::isolation isolation_flag(const std::string& verb, bool given, const std::string& text,
                                  bool has_ticket) {
  if (!given) return sandbox::isolation::process;
  if (has_ticket) {
    throw usage_error(verb + ": --isolation is for the local ticket; --ticket's level decides");
  }
  auto parsed = sandbox::isolation_from_string(text);
  if (!parsed) {
    throw usage_error(verb + ": --isolation must be process, container, gvisor or microvm");
  }
  return *parsed;
}

}  // namespace sandboxctl
