// Helpers for the blob- and image-store tests: temp dirs, a tiny tar writer that can emit
// hostile members GNU tar would refuse to write, and an OCI layout builder.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "protocol/sha256.hpp"
#include "store/store_io.hpp"
#include "sys/tool_process.hpp"

namespace store_test {

namespace fs = std::filesystem;

/// A fresh directory under $TMPDIR (or /tmp), removed with everything below it at the end.
class temp_dir {
 public:
  temp_dir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/sandbox-store-test-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~temp_dir() {
    std::error_code ec;
    // Make read-only directories from images removable, then delete without following links.
    for (auto it = fs::recursive_directory_iterator(path_, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_directory(ec) && !it->is_symlink(ec)) {
        ::chmod(it->path().c_str(), 0700);
      }
    }
    fs::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& s) const { return path_ / s; }

 private:
  fs::path path_;
};

inline std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const fs::path& p, const std::string& data) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << data;
}

inline std::string sha256_id(const std::string& bytes) {
  return "sha256:" + sandbox::detail::sha256_hex(bytes);
}

/// Names of the entries in a directory (empty if it does not exist).
inline std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path().filename());
  return out;
}

/// Writes tar archives member by member (POSIX ustar, PAX records for long names).
class tar_builder {
 public:
  struct member {
    std::string name;
    char type = '0';
    std::string content;
    unsigned mode = 0644;
    std::string link;
    unsigned devmajor = 0, devminor = 0;
    unsigned uid = 0, gid = 0;
    long mtime = 1700000000;
  };

  tar_builder& add(member m) {
    if (m.name.size() > 100 || m.link.size() > 100) {
      std::string records;
      if (m.name.size() > 100) records += pax_record("path", m.name);
      if (m.link.size() > 100) records += pax_record("linkpath", m.link);
      header("PaxHeaders/x", 'x', records.size(), 0644, "", 0, 0, 0, 0, 0);
      data(records);
    }
    header(m.name.substr(0, 100), m.type, m.type == '0' ? m.content.size() : 0, m.mode,
           m.link.substr(0, 100), m.devmajor, m.devminor, m.uid, m.gid, m.mtime);
    if (m.type == '0') data(m.content);
    return *this;
  }
  tar_builder& file(const std::string& name, const std::string& content, unsigned mode = 0644) {
    return add({.name = name, .type = '0', .content = content, .mode = mode});
  }
  tar_builder& dir(const std::string& name, unsigned mode = 0755) {
    return add({.name = name, .type = '5', .mode = mode});
  }
  tar_builder& symlink(const std::string& name, const std::string& target) {
    return add({.name = name, .type = '2', .mode = 0777, .link = target});
  }
  tar_builder& hardlink(const std::string& name, const std::string& target) {
    return add({.name = name, .type = '1', .link = target});
  }
  /// The archive with its two zero end blocks.
  std::string finish() const { return out_ + std::string(1024, '\0'); }
  /// The archive without end blocks (to build truncated/garbage cases).
  const std::string& raw() const { return out_; }

 private:
  static std::string pax_record(const std::string& key, const std::string& value) {
    std::string body = " " + key + "=" + value + "\n";
    std::size_t len = body.size() + 1;
    while (std::to_string(len).size() + body.size() != len) ++len;
    return std::to_string(len) + body;
  }
  static void octal(char* dst, std::size_t width, unsigned long long v) {
    std::snprintf(dst, width, "%0*llo", static_cast<int>(width - 1), v);
  }
  void header(const std::string& name, char type, std::size_t size, unsigned mode,
              const std::string& link, unsigned devmajor, unsigned devminor, unsigned uid,
              unsigned gid, long mtime) {
    char h[512] = {};
    std::memcpy(h, name.data(), std::min<std::size_t>(name.size(), 100));
    octal(h + 100, 8, mode);
    octal(h + 108, 8, uid);
    octal(h + 116, 8, gid);
    octal(h + 124, 12, size);
    octal(h + 136, 12, static_cast<unsigned long long>(mtime));
    std::memset(h + 148, ' ', 8);
    h[156] = type;
    std::memcpy(h + 157, link.data(), std::min<std::size_t>(link.size(), 100));
    std::memcpy(h + 257,
                "ustar\0"
                "00",
                8);
    octal(h + 329, 8, devmajor);
    octal(h + 337, 8, devminor);
    unsigned sum = 0;
    for (unsigned char c : h) sum += c;
    std::snprintf(h + 148, 8, "%06o", sum);
    h[155] = ' ';
    out_.append(h, 512);
  }
  void data(const std::string& d) {
    out_ += d;
    out_.append((512 - d.size() % 512) % 512, '\0');
  }
  std::string out_;
};

/// gzip -c -n of `bytes`, via the host's gzip.
inline std::string gzip(const std::string& bytes, const fs::path& scratch) {
  const fs::path in = scratch / ".gz-in";
  const fs::path out = scratch / ".gz-out";
  write_file(in, bytes);
  int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("open gz-out");
  auto r =
      sandbox::detail::run_tool({"/usr/bin/gzip", "-c", "-n", in.string()},
                                sandbox::detail::minimal_tool_env(), std::chrono::seconds(30), fd);
  ::close(fd);
  if (!r || !r->ok()) throw std::runtime_error("gzip failed");
  std::string z = read_file(out);
  fs::remove(in);
  fs::remove(out);
  return z;
}

/// Builds an OCI image layout in a directory.
class layout_builder {
 public:
  using json = nlohmann::json;
  struct layer {
    std::string tar;  ///< uncompressed tar
    bool gzip = false;
    std::string media_type;  ///< override (unknown types)
  };

  explicit layout_builder(fs::path dir) : dir_(std::move(dir)) {
    fs::create_directories(dir_ / "blobs" / "sha256");
    write_file(dir_ / "oci-layout", R"({"imageLayoutVersion":"1.0.0"})");
  }

  /// Stores `bytes` as a blob; returns its descriptor.
  json blob(const std::string& bytes, const std::string& media_type) {
    const std::string hex = sandbox::detail::sha256_hex(bytes);
    write_file(dir_ / "blobs" / "sha256" / hex, bytes);
    return {{"mediaType", media_type}, {"digest", "sha256:" + hex}, {"size", bytes.size()}};
  }

  /// Adds an image of `layers`; returns the manifest descriptor (not yet in index.json).
  json image(const std::vector<layer>& layers,
             const std::string& created = "2025-01-02T03:04:05Z") {
    json diff_ids = json::array();
    json layer_descs = json::array();
    for (const auto& l : layers) {
      diff_ids.push_back(sha256_id(l.tar));
      std::string stored = l.gzip ? gzip(l.tar, dir_) : l.tar;
      std::string mt = !l.media_type.empty() ? l.media_type
                       : l.gzip              ? "application/vnd.oci.image.layer.v1.tar+gzip"
                                             : "application/vnd.oci.image.layer.v1.tar";
      layer_descs.push_back(blob(stored, mt));
    }
    json config = {{"architecture", "amd64"},
                   {"os", "linux"},
                   {"created", created},
                   {"rootfs", {{"type", "layers"}, {"diff_ids", diff_ids}}}};
    json cdesc = blob(config.dump(), "application/vnd.oci.image.config.v1+json");
    json manifest = {{"schemaVersion", 2},
                     {"mediaType", "application/vnd.oci.image.manifest.v1+json"},
                     {"config", cdesc},
                     {"layers", layer_descs}};
    return blob(manifest.dump(), "application/vnd.oci.image.manifest.v1+json");
  }

  /// Writes index.json listing `manifests`.
  void index(const std::vector<json>& manifests) {
    json idx = {{"schemaVersion", 2},
                {"mediaType", "application/vnd.oci.image.index.v1+json"},
                {"manifests", manifests}};
    write_file(dir_ / "index.json", idx.dump());
  }

  /// Convenience: one image, indexed; returns its manifest digest.
  std::string single(const std::vector<layer>& layers) {
    json d = image(layers);
    index({d});
    return d["digest"];
  }

  fs::path blob_path(const std::string& digest) const {
    return dir_ / "blobs" / "sha256" / digest.substr(7);
  }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
};

}  // namespace store_test
