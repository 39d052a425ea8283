// The in-memory blob store: same contract as the filesystem store (tenant isolation without an
// existence oracle, exact per-tenant quota, `too_large` for oversized fd input, `copy_to`
// with O_EXCL|O_NOFOLLOW), kept in maps behind one mutex. Content is immutable once stored
// and shared by pointer, so reads copy outside the lock.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

#include "core/sha256.hpp"
#include "core/store_io.hpp"
#include "sandbox/blob_store.hpp"
#include "sandbox/protocol.hpp"
#include "sandbox/ticket.hpp"

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
      if (auto w = detail::write_all(out, bytes.data(), bytes.size()); !w) {
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
      t->second.used -= b->second->size();
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
      for (const auto& [hex, content] : t->second.blobs) ids.push_back("sha256:" + hex);
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

 private:
  struct tenant_blobs {
    std::unordered_map<std::string, std::shared_ptr<const std::string>> blobs;  // hex → bytes
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
    auto it = t.blobs.find(hex);
    if (it != t.blobs.end()) return "sha256:" + hex;  // same content: a no-op
    if (t.used + content->size() > quota_) return store_error(errc::quota_exceeded);
    t.used += content->size();
    t.blobs.emplace(hex, std::move(content));
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
    return b->second;
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
