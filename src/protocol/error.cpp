// The "sandbox" error category (sandbox/error.hpp).
#include "sandbox/error.hpp"

#include <cstdio>
#include <string>

namespace sandbox {
namespace {

const char* describe(int ev) noexcept {
  switch (static_cast<errc>(ev)) {
    case errc::success:
      return "success";
    case errc::invalid_argument:
      return "invalid argument";
    case errc::not_found:
      return "not found";
    case errc::already_exists:
      return "already exists";
    case errc::quota_exceeded:
      return "quota exceeded";
    case errc::too_large:
      return "too large";
    case errc::digest_mismatch:
      return "content does not match its digest";
    case errc::corrupt:
      return "stored data is corrupt";
    case errc::io_error:
      return "input/output error";
    case errc::unsupported:
      return "not supported on this host";
    case errc::permission_denied:
      return "permission denied";
    case errc::backend_unavailable:
      return "no backend available";
    case errc::shutting_down:
      return "shutting down";
    case errc::busy:
      return "busy";
  }
  return nullptr;
}

class sandbox_category final : public boost::system::error_category {
 public:
  // A fixed id makes categories from different copies of the library compare equal.
  constexpr sandbox_category() noexcept : error_category(0x8b1f'5a3c'0e47'd291ULL) {}

  const char* name() const noexcept override { return "sandbox"; }

  std::string message(int ev) const override {
    const char* text = describe(ev);
    return text != nullptr ? text : "unknown sandbox error " + std::to_string(ev);
  }

  const char* message(int ev, char* buffer, std::size_t len) const noexcept override {
    const char* text = describe(ev);
    if (text != nullptr) return text;
    if (buffer == nullptr || len == 0) return "unknown sandbox error";
    std::snprintf(buffer, len, "unknown sandbox error %d", ev);
    return buffer;
  }
};

}  // namespace

const boost::system::error_category& error_category() noexcept {
  static const sandbox_category instance;
  return instance;
}

}  // namespace sandbox
