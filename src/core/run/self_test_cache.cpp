#include "core/run/self_test_cache.hpp"

#include <elf.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <link.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "store/store_io.hpp"
#include "sys/unique_fd.hpp"

namespace sandbox::detail {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr std::size_t max_record_bytes = 256 << 10;

// --- what a file is, without reading it, and what it holds -------------------------------

/// A file's identity: any write, rename over, chmod or chown changes at least one field
/// (ctime cannot be set back by anyone but the kernel).
struct file_identity {
  std::uint64_t dev = 0, ino = 0, size = 0;
  std::int64_t mtime_ns = 0, ctime_ns = 0;
  bool operator==(const file_identity&) const = default;
};

std::optional<file_identity> identity_of(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return file_identity{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
                       static_cast<std::uint64_t>(st.st_size),
                       st.st_mtim.tv_sec * 1'000'000'000LL + st.st_mtim.tv_nsec,
                       st.st_ctim.tv_sec * 1'000'000'000LL + st.st_ctim.tv_nsec};
}

/// SHA-256 of a regular file's content; "" when it cannot be read.
std::string digest_of(const fs::path& p) {
  unique_fd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return {};
  auto h = hash_fd(fd.get());
  return h ? std::move(h->first) : std::string();
}

json identity_json(const file_identity& id) {
  return {{"dev", id.dev},
          {"ino", id.ino},
          {"size", id.size},
          {"mtime_ns", id.mtime_ns},
          {"ctime_ns", id.ctime_ns}};
}

std::optional<file_identity> identity_from(const json& j) {
  try {
    return file_identity{j.at("dev").get<std::uint64_t>(), j.at("ino").get<std::uint64_t>(),
                         j.at("size").get<std::uint64_t>(), j.at("mtime_ns").get<std::int64_t>(),
                         j.at("ctime_ns").get<std::int64_t>()};
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

// --- this library's build -----------------------------------------------------------------

struct build_search {
  std::uintptr_t address = 0;
  bool found = false;
  std::string path;      // the object's file ("" for the main program)
  std::string build_id;  // hex, "" when it has none
};

int find_own_object(dl_phdr_info* info, std::size_t, void* data) {
  auto* s = static_cast<build_search*>(data);
  bool mine = false;
  for (int i = 0; i < info->dlpi_phnum && !mine; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    const std::uintptr_t start = info->dlpi_addr + ph.p_vaddr;
    mine = ph.p_type == PT_LOAD && s->address >= start && s->address < start + ph.p_memsz;
  }
  if (!mine) return 0;
  s->found = true;
  s->path = info->dlpi_name != nullptr ? info->dlpi_name : "";
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    // Notes: a header, the name and the descriptor, each padded to the segment's alignment
    // (4, or 8 for .note.gnu.property), as elf(5) says.
    const std::size_t align = ph.p_align == 8 ? 8 : 4;
    auto pad = [align](std::size_t n) { return (n + align - 1) & ~(align - 1); };
    const auto* p = reinterpret_cast<const unsigned char*>(info->dlpi_addr + ph.p_vaddr);
    std::size_t off = 0;
    while (off + sizeof(ElfW(Nhdr)) <= ph.p_memsz) {
      const auto* n = reinterpret_cast<const ElfW(Nhdr)*>(p + off);
      const std::size_t name_at = off + sizeof(ElfW(Nhdr));
      const std::size_t desc_at = name_at + pad(n->n_namesz);
      const std::size_t next = desc_at + pad(n->n_descsz);
      if (next > ph.p_memsz || next <= off) break;
      if (n->n_type == NT_GNU_BUILD_ID && n->n_namesz == 4 &&
          std::string_view(reinterpret_cast<const char*>(p + name_at), 4) ==
              std::string_view("GNU\0", 4)) {
        static constexpr char digits[] = "0123456789abcdef";
        for (std::size_t k = 0; k < n->n_descsz; ++k) {
          s->build_id += digits[p[desc_at + k] >> 4];
          s->build_id += digits[p[desc_at + k] & 15];
        }
        return 1;
      }
      off = next;
    }
  }
  return 1;
}

std::string own_build() {
  build_search s;
  s.address = reinterpret_cast<std::uintptr_t>(&host_key_parts);
  ::dl_iterate_phdr(find_own_object, &s);
  if (!s.found) return "unknown:not found among the loaded objects";
  if (!s.build_id.empty()) return "gnu-build-id:" + s.build_id;
  // No build id (linked with --build-id=none): the binary's content.
  const std::string file = s.path.empty() ? "/proc/self/exe" : s.path;
  const std::string d = digest_of(file);
  return d.empty() ? "unknown:" + file + " unreadable" : "sha256:" + d;
}

std::string read_line(const char* path) {
  unique_fd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd) return {};
  char buf[128];
  ssize_t n = ::read(fd.get(), buf, sizeof buf);
  if (n <= 0) return {};
  std::string s(buf, static_cast<std::size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

std::map<std::string, std::string> host_key_parts() {
  std::map<std::string, std::string> parts;
  const std::string boot = read_line("/proc/sys/kernel/random/boot_id");
  parts["boot_id"] = boot.empty() ? "unknown:/proc/sys/kernel/random/boot_id unreadable" : boot;
  struct utsname u {};
  parts["host_kernel"] = ::uname(&u) == 0
                             ? std::string(u.release) + " " + u.version + " " + u.machine
                             : std::string("unknown:uname failed");
  static const std::string build = own_build();  // fixed for the life of the process
  parts["build"] = build;
  return parts;
}

self_test_cache::self_test_cache(fs::path dir, std::string level, uid_t owner)
    : dir_(std::move(dir)), level_(std::move(level)), owner_(owner) {}

std::optional<std::string> self_test_cache::open_trusted_dir(bool create, unique_fd* out) const {
  // The directory holding it (the level's state directory): ours or root's, and writable by
  // nobody else, or whoever may write there could put another directory in place of ours.
  const fs::path parent = dir_.has_parent_path() ? dir_.parent_path() : fs::path(".");
  unique_fd pfd(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!pfd) {
    return errno == ENOENT ? std::string("no record")
                           : fmt::format("record unreadable: {}: errno {}", parent.string(), errno);
  }
  struct stat st {};
  if (::fstat(pfd.get(), &st) != 0) {
    return fmt::format("record unreadable: fstat {}: errno {}", parent.string(), errno);
  }
  if (st.st_uid != owner_ && st.st_uid != 0) {
    return fmt::format("record not trusted: {} belongs to uid {}, not {} or root", parent.string(),
                       st.st_uid, owner_);
  }
  if ((st.st_mode & 022) != 0) {
    return fmt::format("record not trusted: {} is writable by group or others (mode {:04o})",
                       parent.string(), st.st_mode & 07777);
  }
  // The records' own directory: ours, and private (0700), never through a symbolic link.
  const std::string name = dir_.filename().string();
  if (create && ::mkdirat(pfd.get(), name.c_str(), 0700) != 0 && errno != EEXIST) {
    return fmt::format("cannot create {}: errno {}", dir_.string(), errno);
  }
  unique_fd dfd(::openat(pfd.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dfd) {
    if (errno == ENOENT) return std::string("no record");
    if (errno == ELOOP || errno == ENOTDIR) {
      return "record not trusted: " + dir_.string() + " is not a directory";
    }
    return fmt::format("record unreadable: {}: errno {}", dir_.string(), errno);
  }
  if (::fstat(dfd.get(), &st) != 0) {
    return fmt::format("record unreadable: fstat {}: errno {}", dir_.string(), errno);
  }
  if (st.st_uid != owner_) {
    return fmt::format("record not trusted: {} belongs to uid {}, not {}", dir_.string(), st.st_uid,
                       owner_);
  }
  if ((st.st_mode & 077) != 0) {
    return fmt::format("record not trusted: {} is open to group or others (mode {:04o}, not 0700)",
                       dir_.string(), st.st_mode & 07777);
  }
  *out = std::move(dfd);
  return std::nullopt;
}

self_test_lookup self_test_cache::lookup(const self_test_key& key) const {
  self_test_lookup out;
  unique_fd dfd;
  if (auto bad = open_trusted_dir(/*create=*/false, &dfd)) return out.why_not = *bad, out;
  const std::string file = level_ + ".json";
  unique_fd fd(::openat(dfd.get(), file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd) {
    out.why_not = errno == ENOENT  ? "no record"
                  : errno == ELOOP ? "record not trusted: a symbolic link"
                                   : fmt::format("record unreadable: errno {}", errno);
    return out;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return out.why_not = "record not trusted: not a regular file", out;
  }
  if (st.st_uid != owner_) {
    out.why_not =
        fmt::format("record not trusted: it belongs to uid {}, not {}", st.st_uid, owner_);
    return out;
  }
  if ((st.st_mode & 022) != 0) {
    return out.why_not = "record not trusted: writable by group or others", out;
  }
  if (static_cast<std::uint64_t>(st.st_size) > max_record_bytes) {
    return out.why_not = "record not trusted: larger than a record can be", out;
  }
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  auto got = read_full(fd.get(), text.data(), text.size());
  if (!got || *got != text.size()) return out.why_not = "record unreadable", out;
  json r = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!r.is_object() || r.value("v", 0) != 1 || !r.contains("parts") || !r["parts"].is_object() ||
      !r.contains("files") || !r["files"].is_object()) {
    return out.why_not = "record malformed", out;
  }
  if (r.value("level", std::string()) != level_ || r.value("verdict", std::string()) != "pass") {
    return out.why_not = "record malformed: not a pass of this level", out;
  }
  // Every part as recorded, and no other.
  const json& parts = r["parts"];
  for (const auto& [name, value] : key.parts) {
    if (!parts.contains(name) || !parts[name].is_string()) {
      return out.why_not = "the record lacks " + name, out;
    }
    if (parts[name].get<std::string>() != value) {
      static const std::map<std::string, std::string> says = {
          {"boot_id", "the host rebooted since"},
          {"host_kernel", "the host kernel changed"},
          {"build", "this library's build changed"}};
      auto s = says.find(name);
      out.why_not = (s != says.end() ? s->second : name + " changed") + " (" + name + ")";
      return out;
    }
  }
  if (parts.size() != key.parts.size()) return out.why_not = "the record's key differs", out;
  const json& files = r["files"];
  if (files.size() != key.files.size()) return out.why_not = "the files depended on differ", out;
  for (const auto& f : key.files) {
    const std::string name = f.string();
    if (!files.contains(name) || !files[name].is_object()) {
      return out.why_not = "the record does not cover " + name, out;
    }
    const json& rec = files[name];
    auto now = identity_of(f);
    if (!now) return out.why_not = name + " is missing", out;
    auto then = identity_from(rec);
    if (then && *then == *now) continue;  // untouched since it was hashed
    const std::string d = digest_of(f);
    if (d.empty() || !rec.contains("sha256") || !rec["sha256"].is_string() ||
        rec["sha256"].get<std::string>() != d) {
      return out.why_not = name + " changed", out;
    }
  }
  out.reusable = true;
  out.recorded_at = r.value("recorded_at", std::string());
  return out;
}

bool self_test_cache::record_pass(const self_test_key& key, std::string* why) const {
  unique_fd dir;
  if (auto bad = open_trusted_dir(/*create=*/true, &dir)) return *why = *bad, false;
  json files = json::object();
  for (const auto& f : key.files) {
    auto id = identity_of(f);
    std::string d = digest_of(f);
    if (!id || d.empty()) return *why = f.string() + " cannot be read", false;
    json j = identity_json(*id);
    j["sha256"] = d;
    files[f.string()] = std::move(j);
  }
  json parts = json::object();
  for (const auto& [name, value] : key.parts) parts[name] = value;
  const json record = {{"v", 1},
                       {"level", level_},
                       {"verdict", "pass"},
                       {"recorded_at", rfc3339_now()},
                       {"parts", std::move(parts)},
                       {"files", std::move(files)}};
  // A new file renamed over the old one: a reader sees either whole.
  auto written = replace_file_at(dir.get(), level_ + ".json", record.dump(2) + "\n", 0600);
  if (!written) {
    return *why = "cannot write " + path().string() + ": " + written.error().message(), false;
  }
  return true;
}

}  // namespace sandbox::detail
