// `sandboxctl blob`: the blob store (put, get, rm, ls, pin, unpin, gc).
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>

#include "cli/cli_util.hpp"
#include "cli/verbs.hpp"

namespace sandboxctl {
namespace {

// "90s", "30m", "24h", "7d" or plain seconds → seconds (at most ten years).
std::chrono::seconds parse_age(const std::string& text) {
  std::string digits = text;
  std::uint64_t unit = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 's':
        unit = 1;
        digits.pop_back();
        break;
      case 'm':
        unit = 60;
        digits.pop_back();
        break;
      case 'h':
        unit = 3600;
        digits.pop_back();
        break;
      case 'd':
        unit = 86400;
        digits.pop_back();
        break;
      default:
        break;
    }
  }
  constexpr std::uint64_t max_s = 10ULL * 366 * 86400;
  const auto n = parse_number<std::uint64_t>("older-than", digits, 0, max_s / unit);
  return std::chrono::seconds(static_cast<std::int64_t>(n * unit));
}

// `blob gc`: collects unpinned blobs past the grace period (docs/operations.md, "Blob
// retention"). Prints one line per removed blob and a summary.
int blob_gc(const common_flags& c, const std::string& older_than, const std::string& target_bytes,
            bool dry_run) {
  sandbox::gc_options o;
  if (!older_than.empty()) o.older_than = parse_age(older_than);
  if (!target_bytes.empty()) {
    o.target_tenant_bytes =
        parse_number<std::uint64_t>("target-bytes", target_bytes, 0, std::uint64_t{1} << 62);
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

}  // namespace

int cmd_blob(const std::vector<std::string>& args) {
  common_flags c;
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
    if (arg.empty() || holder.empty())
      throw usage_error("blob " + verb + ": ID and --holder needed");
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

}  // namespace sandboxctl
