// Blob retention shared by every store: pin holder syntax, the defaults of stores without
// pins or collection (`unsupported`), and the choice of what a collection removes.
#include "store/blob_retention.hpp"

#include <algorithm>

#include "sandbox/blob_store.hpp"

namespace sandbox {

bool is_valid_pin_holder(std::string_view holder) noexcept {
  if (holder.empty() || holder.size() > 128) return false;
  auto alnum = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  };
  if (!alnum(holder.front())) return false;
  return std::all_of(holder.begin(), holder.end(), [&](char c) {
    return alnum(c) || c == '.' || c == '_' || c == ':' || c == '-';
  });
}

result<void> blob_store::pin(std::string_view, std::string_view, std::string_view) {
  return make_error_code(errc::unsupported);
}
result<void> blob_store::unpin(std::string_view, std::string_view, std::string_view) {
  return make_error_code(errc::unsupported);
}
result<std::vector<std::string>> blob_store::pins(std::string_view, std::string_view) const {
  return make_error_code(errc::unsupported);
}
result<gc_report> blob_store::collect_garbage(const gc_options&) {
  return make_error_code(errc::unsupported);
}
result<std::vector<std::string>> blob_store::tenants() const {
  return make_error_code(errc::unsupported);
}

namespace detail {

std::vector<std::size_t> select_garbage(std::vector<gc_candidate>& blobs, const gc_options& options,
                                        std::chrono::system_clock::time_point now,
                                        gc_report& report) {
  std::uint64_t usage = 0;
  for (const auto& b : blobs) usage += b.bytes;
  std::vector<std::size_t> eligible;
  for (std::size_t i = 0; i < blobs.size(); ++i) {
    if (blobs[i].pinned) {
      ++report.kept_pinned;
    } else if (now - blobs[i].stored_at < options.older_than) {
      ++report.kept_recent;
    } else {
      eligible.push_back(i);
    }
  }
  // Oldest first; ties by id, so a dry run and the real one agree.
  std::sort(eligible.begin(), eligible.end(), [&](std::size_t a, std::size_t b) {
    if (blobs[a].stored_at != blobs[b].stored_at) return blobs[a].stored_at < blobs[b].stored_at;
    return blobs[a].hex < blobs[b].hex;
  });
  std::vector<std::size_t> chosen;
  for (std::size_t i : eligible) {
    if (options.target_tenant_bytes && usage <= *options.target_tenant_bytes) {
      ++report.kept_by_size;
      continue;
    }
    chosen.push_back(i);
    usage -= blobs[i].bytes;
  }
  return chosen;
}

}  // namespace detail
}  // namespace sandbox
