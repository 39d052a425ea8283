// Random bytes from the kernel (getrandom(2)), the one source of the library's unpredictable
// and unique names (private to src/). Every function fails cleanly: getrandom is tried a
// bounded number of times and a failure is reported, never spun on. Header-only, free of
// exceptions and Boost, so the static helpers use it too.
#pragma once

#include <sys/random.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace sandbox::detail {

/// Fills `out` with `n` bytes from getrandom(2) (flags 0: blocks only until the pool is
/// initialized at boot). Retries EINTR and short reads at most 64 times in all. True on
/// success; false with `errno` set (ENOSYS under a seccomp filter that hides the call,
/// EAGAIN when the retries ran out) and `out` unspecified.
inline bool random_bytes(void* out, std::size_t n) noexcept {
  auto* p = static_cast<unsigned char*>(out);
  std::size_t got = 0;
  for (int attempt = 0; got < n; ++attempt) {
    if (attempt == 64) {
      errno = EAGAIN;
      return false;
    }
    const ssize_t r = ::getrandom(p + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    got += static_cast<std::size_t>(r);
  }
  return true;
}

/// `bytes` random bytes as 2 × `bytes` lowercase hex digits; nullopt when getrandom failed
/// (`errno` says why). For names that must be unpredictable (a run's input directory) or
/// unique across processes (instance ids, temporary files).
inline std::optional<std::string> random_hex(std::size_t bytes) {
  std::string raw(bytes, '\0');
  if (!random_bytes(raw.data(), bytes)) return std::nullopt;
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(2 * bytes, '0');
  for (std::size_t i = 0; i < bytes; ++i) {
    const auto b = static_cast<unsigned char>(raw[i]);
    out[2 * i] = digits[b >> 4];
    out[2 * i + 1] = digits[b & 15];
  }
  return out;
}

/// `bytes` hex-encoded bytes that are unique on this host but need not be secret (run ids):
/// random_hex when getrandom works, else a mix of the monotonic clock, the pid and a
/// process-wide counter, so an id is never missing. Never fails.
inline std::string unique_hex(std::size_t bytes) {
  if (auto r = random_hex(bytes)) return *std::move(r);
  static std::atomic<std::uint64_t> counter{0};
  std::uint64_t x =
      static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
      (counter.fetch_add(1) * 0x9E3779B97F4A7C15ULL) ^
      (static_cast<std::uint64_t>(::getpid()) << 32);
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < bytes; ++i) {
    if (i % 8 == 0) {  // splitmix64 finalizer: every output byte depends on every input bit
      x += 0x9E3779B97F4A7C15ULL;
      x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
      x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
      x ^= x >> 31;
    }
    const auto b = static_cast<unsigned char>(x >> (8 * (i % 8)));
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

/// A random UUID (RFC 9562 version 4) in its 36-character text form, as Linux's
/// /proc/sys/kernel/random/boot_id shows one; nullopt when getrandom failed.
inline std::optional<std::string> random_uuid() {
  unsigned char b[16];
  if (!random_bytes(b, sizeof b)) return std::nullopt;
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);  // variant 1 (RFC 9562)
  static constexpr char digits[] = "0123456789abcdef";
  std::string id;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) id += '-';
    id += digits[b[i] >> 4];
    id += digits[b[i] & 15];
  }
  return id;
}

}  // namespace sandbox::detail
