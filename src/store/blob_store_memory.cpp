// The in-memory blob store: same contract as the filesystem store (tenant isolation without an
// existence oracle, exact per-tenant quota, `too_large` for oversized fd input, `copy_to`
// with O_EXCL|O_NOFOLLOW), kept in maps behind one mutex. Content is immutable once stored
// and shared by pointer, so reads copy outside the lock.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <unordered_map>

#include "protocol/sha256.hpp"
#include "sandbox/blob_store.hpp"
#include "sandbox/protocol.hpp"
#include "sandbox/ticket.hpp"
#include "store/blob_retention.hpp"
#include "store/store_io.hpp"

namespace sandbox {
namespace {

using detail::store_error;

class memory_blob_store final : public blob_store {
 public:
  explicit memory_blob_store(std::uint64_t quota) : quota_(quota) {}

  result<std::string> put(std::string_view tenant, std::string_view bytes) override {
    return guard([&]() -> result<std::string> {
      if (!is_valid_tenant(tenant)) return store_error(errc::invalid_argument);
      if (bytes.size() > quota_) return store_error(errc::quota_exceeded);
      std::string hex = detail::sha256_hex(bytes);
      if (hex.empty()) return store_error(errc::io_error);
      auto content = std::make_shared<const std::string>(bytes);
      return insert(tenant, std::move(hex), std::move(content));
    });
  }

  result<std::string> put_fd(std::string_view tenant, int fd, std::uint64_t max_bytes) override {
    return guard([&]() -> result<std::string> {
      if (!is_valid_tenant(tenant) || fd < 0) return store_error(errc::invalid_argument);
      std::string data;
      char buf[65536];
      for (;;) {
        auto r = detail::read_full(fd, buf, sizeof buf);
        if (!r) {
          return store_error(r.error().value() == EBADF ? errc::invalid_argument : errc::io_error);
        }
        if (*r == 0) break;
        if (data.size() + *r > max_bytes) return store_error(errc::too_large);
        if (data.size() + *r > quota_) return store_error(errc::quota_exceeded);
        data.append(buf, *r);
      }
      std::string hex = detail::sha256_hex(data);
      if (hex.empty()) return store_error(errc::io_error);
      return insert(tenant, std::move(hex), std::make_shared<const std::string>(std::move(data)));
    });
  }

  result<std::string> get(std::string_view tenant, std::string_view id) const override {
    return guard([&]() -> result<std::string> {
      auto content = find(tenant, id);
      if (!content) return content.error();
      return std::string(**content);
    });
  }

  result<std::uint64_t> copy_to(std::string_view tenant, std::string_view id, int dirfd,
                                const std::string& name) const override {
    return guard([&]() -> result<std::uint64_t> {
      if (dirfd < 0 || !detail::is_plain_name(name)) return store_error(errc::invalid_argument);
      auto content = find(tenant, id);
      if (!content) return content.error();
      int out =
          ::openat(dirfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
      if (out < 0) {
        int e = errno;
        if (e == EEXIST) return store_error(errc::already_exists);
        if (e == EBADF || e == ENOTDIR) return store_error(errc::invalid_argument);
        return detail::to_store_error(detail::sys_error(e)) == store_error(errc::permission_denied)
                   ? store_error(errc::permission_denied)
                   : store_error(errc::io_error);
      }
      detail::unique_fd out_fd(out);
      (void)::fchmod(out, 0444);
      const std::string& bytes = **content;
      if (!detail::write_all(out, bytes.data(), bytes.size())) {
        (void)::unlinkat(dirfd, name.c_str(), 0);
        return store_error(errc::io_error);
      }
      return static_cast<std::uint64_t>(bytes.size());
    });
  }

  result<std::uint64_t> size(std::string_view tenant, std::string_view id) const override {
    return guard([&]() -> result<std::uint64_t> {
      auto content = find(tenant, id);
      if (!content) return content.error();
      return static_cast<std::uint64_t>((*content)->size());
    });
  }

  result<void> remove(std::string_view tenant, std::string_view id) override {
    return guard([&]() -> result<void> {
      if (!is_valid_tenant(tenant) || !is_valid_blob_id(id)) {
        return store_error(errc::invalid_argument);
      }
      std::lock_guard lock(mu_);
      auto t = tenants_.find(std::string(tenant));
      if (t == tenants_.end()) return store_error(errc::not_found);
      auto b = t->second.blobs.find(std::string(id.substr(7)));
      if (b == t->second.blobs.end()) return store_error(errc::not_found);
      t->second.used -= b->second.content->size();
      t->second.pins.erase(b->first);
      t->second.blobs.erase(b);
      return {};
    });
  }

  result<std::vector<std::string>> list(std::string_view tenant) const override {
    return guard([&]() -> result<std::vector<std::string>> {
      if (!is_valid_tenant(tenant)) return store_error(errc::invalid_argument);
      std::vector<std::string> ids;
      std::lock_guard lock(mu_);
      auto t = tenants_.find(std::string(tenant));
      if (t == tenants_.end()) return ids;
      ids.reserve(t->second.blobs.size());
      for (const auto& [hex, b] : t->second.blobs) ids.push_back("sha256:" + hex);
      return ids;
    });
  }

  result<std::uint64_t> usage(std::string_view tenant) const override {
    return guard([&]() -> result<std::uint64_t> {
      if (!is_valid_tenant(tenant)) return store_error(errc::invalid_argument);
      std::lock_guard lock(mu_);
      auto t = tenants_.find(std::string(tenant));
      return t == tenants_.end() ? std::uint64_t{0} : t->second.used;
    });
  }

  result<void> pin(std::string_view tenant, std::string_view id, std::string_view holder) override {
    return guard([&]() -> result<void> {
      if (!is_valid_tenant(tenant) || !is_valid_blob_id(id) || !is_valid_pin_holder(holder)) {
        return store_error(errc::invalid_argument);
      }
      std::lock_guard lock(mu_);
      auto t = tenants_.find(std::string(tenant));
      if (t == tenants_.end()) return store_error(errc::not_found);
      const std::string hex(id.substr(7));
      if (t->second.blobs.count(hex) == 0) return store_error(errc::not_found);
      t->second.pins[hex].emplace(holder);
      return {};
    });
  }

  result<void> unpin(std::string_view tenant, std::string_view id,
                     std::string_view holder) override {
    return guard([&]() -> result<void> {
      if (!is_valid_tenant(tenant) || !is_valid_blob_id(id) || !is_valid_pin_holder(holder)) {
        return store_error(errc::invalid_argument);
      }
      std::lock_guard lock(mu_);
      auto t = tenants_.find(std::string(tenant));
      if (t == tenants_.end()) return {};
      auto p = t->second.pins.find(std::string(id.substr(7)));
      if (p == t->second.pins.end()) return {};
      p->second.erase(std::string(holder));
      if (p->second.empty()) t->second.pins.erase(p);
      return {};
    });
  }

  result<std::vector<std::string>> pins(std::string_view tenant,
                                        std::string_view id) const override {
    return guard([&]() -> result<std::vector<std::string>> {
      if (!is_valid_tenant(tenant) || !is_valid_blob_id(id)) {
        return store_error(errc::invalid_argument);
      }
      std::vector<std::string> out;
      std::lock_guard lock(mu_);
      auto t = tenants_.find(std::string(tenant));
      if (t == tenants_.end()) return out;
      auto p = t->second.pins.find(std::string(id.substr(7)));
      if (p != t->second.pins.end()) out.assign(p->second.begin(), p->second.end());
      return out;
    });
  }

  result<gc_report> collect_garbage(const gc_options& options) override {
    return guard([&]() -> result<gc_report> {
      for (const auto& t : options.tenants) {
        if (!is_valid_tenant(t)) return store_error(errc::invalid_argument);
      }
      gc_report report;
      const auto now = std::chrono::system_clock::now();
      // One lock for the whole collection: puts and pins wait, so none can interleave with
      // the decision to remove a blob.
      std::lock_guard lock(mu_);
      for (auto& [name, t] : tenants_) {
        if (!options.tenants.empty() && std::find(options.tenants.begin(), options.tenants.end(),
                                                  name) == options.tenants.end()) {
          continue;
        }
        std::vector<detail::gc_candidate> blobs;
        for (const auto& [hex, b] : t.blobs) {
          blobs.push_back({hex, b.content->size(), b.stored_at, t.pins.count(hex) != 0});
        }
        for (std::size_t i : detail::select_garbage(blobs, options, now, report)) {
          report.removed.push_back({name, "sha256:" + blobs[i].hex, blobs[i].bytes});
          report.bytes_removed += blobs[i].bytes;
          if (options.dry_run) continue;
          t.used -= blobs[i].bytes;
          t.blobs.erase(blobs[i].hex);
        }
      }
      return report;
    });
  }

  result<std::vector<std::string>> tenants() const override {
    return guard([&]() -> result<std::vector<std::string>> {
      std::vector<std::string> out;
      std::lock_guard lock(mu_);
      for (const auto& [name, t] : tenants_) out.push_back(name);
      return out;
    });
  }

 private:
  struct stored_blob {
    std::shared_ptr<const std::string> content;
    std::chrono::system_clock::time_point stored_at;  // last put: the GC grace period
  };
  struct tenant_blobs {
    std::unordered_map<std::string, stored_blob> blobs;  // hex → bytes
    std::map<std::string, std::set<std::string>> pins;   // hex → holders
    std::uint64_t used = 0;
  };

  template <class Fn>
  auto guard(Fn&& fn) const -> decltype(fn()) {
    try {
      return fn();
    } catch (...) {
      return store_error(errc::io_error);  // allocation failure: report, never throw
    }
  }

  result<std::string> insert(std::string_view tenant, std::string hex,
                             std::shared_ptr<const std::string> content) {
    std::lock_guard lock(mu_);
    auto& t = tenants_[std::string(tenant)];
    const auto now = std::chrono::system_clock::now();
    auto it = t.blobs.find(hex);
    if (it != t.blobs.end()) {
      it->second.stored_at = now;  // same content: a no-op, but fresh again for the GC
      return "sha256:" + hex;
    }
    if (t.used + content->size() > quota_) return store_error(errc::quota_exceeded);
    t.used += content->size();
    t.blobs.emplace(hex, stored_blob{std::move(content), now});
    return "sha256:" + hex;
  }

  result<std::shared_ptr<const std::string>> find(std::string_view tenant,
                                                  std::string_view id) const {
    if (!is_valid_tenant(tenant) || !is_valid_blob_id(id)) {
      return store_error(errc::invalid_argument);
    }
    std::lock_guard lock(mu_);
    auto t = tenants_.find(std::string(tenant));
    if (t == tenants_.end()) return store_error(errc::not_found);
    auto b = t->second.blobs.find(std::string(id.substr(7)));
    if (b == t->second.blobs.end()) return store_error(errc::not_found);
    return b->second.content;
  }

  std::uint64_t quota_;
  mutable std::mutex mu_;
  std::map<std::string, tenant_blobs> tenants_;
};

}  // namespace

std::shared_ptr<blob_store> make_memory_blob_store(std::uint64_t quota_bytes_per_tenant) {
  return std::make_shared<memory_blob_store>(quota_bytes_per_tenant);
}

}  // namespace sandbox
