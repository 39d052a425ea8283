// Finding a run's secret placeholders in what it sends (private to src/; sandbox/secrets.hpp).
//
// A placeholder (`run_secret::placeholder`: "sbx-secret-" and 32 random hex digits) may go
// only where the host puts the value instead. Seen anywhere else — a name looked up, a proxy
// request's target or header, a request body — it is refused and recorded `secret_misuse`.
// What identifies a placeholder is its random part (the mark: its last 32 characters), so
// dropping the prefix, changing case or spreading it over DNS labels does not hide it.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sandbox::detail {

/// The egress attempt reason for a placeholder seen where its value may not go.
inline constexpr std::string_view secret_misuse_reason = "secret_misuse";

/// Bytes of a placeholder's mark (its random hex digits).
inline constexpr std::size_t placeholder_mark_bytes = 32;

/// The marks of `placeholders` (each one's last `placeholder_mark_bytes` characters, lower
/// case; shorter ones whole).
std::vector<std::string> placeholder_marks(std::span<const std::string> placeholders);

/// True when `text` holds one of `marks`, ignoring ASCII case.
bool holds_placeholder(std::string_view text, std::span<const std::string> marks) noexcept;

/// True when DNS name `name` (as recorded: labels joined by dots) holds one of `marks` once
/// its dots are removed, ignoring ASCII case.
bool dns_name_holds_placeholder(std::string_view name, std::span<const std::string> marks);

/**
 * Looks for marks in a stream given piece by piece (a request body): a mark split between
 * pieces is still found. Keeps at most the longest mark's length minus one byte of the
 * stream. Once found, stays found.
 */
class placeholder_scanner {
 public:
  explicit placeholder_scanner(std::vector<std::string> marks);
  /// Scans the next `piece`; true once a mark was seen (in it, or earlier).
  bool feed(std::string_view piece);
  bool found() const noexcept { return found_; }
  bool empty() const noexcept { return marks_.empty(); }

 private:
  std::vector<std::string> marks_;
  std::size_t keep_ = 0;  ///< bytes of tail kept between pieces
  std::string tail_;
  bool found_ = false;
};

}  // namespace sandbox::detail
