#include "store/tar_reader.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <limits>
#include <map>
#include <optional>

#include "store/store_io.hpp"

namespace sandbox::detail {

result<std::size_t> fd_source::read(void* buf, std::size_t n) { return read_full(fd_, buf, n); }

result<std::size_t> hashing_source::read(void* buf, std::size_t n) {
  auto r = inner_.read(buf, n);
  if (r && *r > 0) {
    hash_.update(buf, *r);
    bytes_ += *r;
  }
  return r;
}

result<std::string> hashing_source::finish() {
  char buf[65536];
  for (;;) {
    auto r = read(buf, sizeof buf);
    if (!r) return r.error();
    if (*r == 0) break;
  }
  std::string hex = hash_.hex_digest();
  if (hex.empty()) return store_error(errc::io_error);
  return hex;
}

namespace {

constexpr std::size_t block_size = 512;

// A fixed-size header field up to its first NUL.
std::string_view field(const char* block, std::size_t off, std::size_t len) {
  const char* p = block + off;
  const void* nul = std::memchr(p, '\0', len);
  return {p, nul ? static_cast<std::size_t>(static_cast<const char*>(nul) - p) : len};
}

// A numeric header field: octal (optionally space/NUL padded) or GNU base-256.
std::optional<std::uint64_t> parse_number(const char* block, std::size_t off, std::size_t len) {
  const auto* p = reinterpret_cast<const unsigned char*>(block + off);
  if (p[0] & 0x80) {
    if (p[0] == 0xff) return std::nullopt;  // negative base-256: never valid here
    std::uint64_t v = p[0] & 0x7f;
    for (std::size_t i = 1; i < len; ++i) {
      if (v > (std::numeric_limits<std::uint64_t>::max() >> 8)) return std::nullopt;
      v = (v << 8) | p[i];
    }
    return v;
  }
  std::size_t i = 0;
  while (i < len && p[i] == ' ') ++i;  // leading spaces; an all-NUL field reads as 0 below
  std::uint64_t v = 0;
  bool any = false;
  for (; i < len; ++i) {
    unsigned char c = p[i];
    if (c == ' ' || c == '\0') break;
    if (c < '0' || c > '7') return std::nullopt;
    if (v > (std::numeric_limits<std::uint64_t>::max() >> 3)) return std::nullopt;
    v = (v << 3) | (c - '0');
    any = true;
  }
  for (; i < len; ++i) {
    if (p[i] != ' ' && p[i] != '\0') return std::nullopt;  // junk after the number
  }
  if (!any) return 0;
  return v;
}

bool checksum_ok(const char* block) {
  auto stored = parse_number(block, 148, 8);
  if (!stored) return false;
  std::uint64_t unsigned_sum = 0;
  std::int64_t signed_sum = 0;
  for (std::size_t i = 0; i < block_size; ++i) {
    const bool in_field = i >= 148 && i < 156;
    unsigned char u = in_field ? ' ' : static_cast<unsigned char>(block[i]);
    signed char s = in_field ? ' ' : static_cast<signed char>(block[i]);
    unsigned_sum += u;
    signed_sum += s;
  }
  // Some old writers summed signed chars; accept either, as GNU tar does.
  return *stored == unsigned_sum || static_cast<std::int64_t>(*stored) == signed_sum;
}

std::optional<std::uint64_t> parse_decimal(std::string_view s) {
  std::uint64_t v = 0;
  if (s.empty()) return std::nullopt;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace

boost::system::error_code tar_reader::corrupt(std::string why) {
  detail_ = std::move(why);
  return store_error(errc::corrupt);
}

result<tar_step> tar_reader::read_block(char* block) {
  std::size_t got = 0;
  while (got < block_size) {
    auto r = src_.read(block + got, block_size - got);
    if (!r) return r.error();
    if (*r == 0) break;
    got += *r;
  }
  if (got == 0) return tar_step::end;
  if (got < block_size) return corrupt("truncated tar header");
  return tar_step::entry;
}

result<void> tar_reader::skip(std::uint64_t n) {
  char buf[8192];
  while (n > 0) {
    auto r = src_.read(buf, static_cast<std::size_t>(std::min<std::uint64_t>(n, sizeof buf)));
    if (!r) return r.error();
    if (*r == 0) return corrupt("truncated tar member data");
    n -= *r;
  }
  return {};
}

result<std::string> tar_reader::read_payload(std::uint64_t size, std::size_t limit) {
  if (size > limit) return corrupt("tar extended header too large");
  std::string out(static_cast<std::size_t>(size), '\0');
  std::size_t got = 0;
  while (got < out.size()) {
    auto r = src_.read(out.data() + got, out.size() - got);
    if (!r) return r.error();
    if (*r == 0) return corrupt("truncated tar extended header");
    got += *r;
  }
  if (auto s = skip((block_size - size % block_size) % block_size); !s) return s.error();
  return out;
}

result<std::size_t> tar_reader::read_data(void* buf, std::size_t n) {
  if (remaining_ == 0) return std::size_t{0};
  const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(n, remaining_));
  std::size_t got = 0;
  while (got < want) {
    auto r = src_.read(static_cast<char*>(buf) + got, want - got);
    if (!r) return r.error();
    if (*r == 0) return corrupt("truncated tar member data");
    got += *r;
  }
  remaining_ -= got;
  return got;
}

result<tar_step> tar_reader::next(tar_entry& e) {
  if (done_) return tar_step::end;
  if (auto s = skip(remaining_ + padding_); !s) return s.error();
  remaining_ = padding_ = 0;

  std::map<std::string, std::string> pax;  // per-member PAX records
  std::optional<std::string> long_name, long_link;
  char block[block_size];
  for (;;) {
    auto got = read_block(block);
    if (!got) return got.error();
    if (*got == tar_step::end) {
      // The stream ended without the two zero blocks. Accept it at a member boundary (some
      // writers omit them) but not in the middle of extended headers.
      if (!pax.empty() || long_name || long_link) return corrupt("tar ends after a header");
      done_ = true;
      return tar_step::end;
    }
    if (std::all_of(block, block + block_size, [](char c) { return c == 0; })) {
      if (!pax.empty() || long_name || long_link) return corrupt("tar ends after a header");
      done_ = true;  // end of archive; the caller may still drain the source
      return tar_step::end;
    }
    if (!checksum_ok(block)) return corrupt("tar header checksum mismatch");

    const char type = block[156];
    auto size = parse_number(block, 124, 12);
    if (!size) return corrupt("bad tar size field");

    if (type == 'x' || type == 'g') {
      auto payload = read_payload(*size, limits_.max_pax_bytes);
      if (!payload) return payload.error();
      if (type == 'g') continue;  // global records: nothing we use
      std::string_view rest = *payload;
      while (!rest.empty()) {
        // "<len> <key>=<value>\n", where len counts the whole record.
        auto sp = rest.find(' ');
        if (sp == std::string_view::npos) return corrupt("bad PAX record");
        auto len = parse_decimal(rest.substr(0, sp));
        if (!len || *len <= sp + 1 || *len > rest.size()) return corrupt("bad PAX record length");
        std::string_view rec = rest.substr(sp + 1, *len - sp - 1);
        rest.remove_prefix(*len);
        if (rec.empty() || rec.back() != '\n') return corrupt("bad PAX record end");
        rec.remove_suffix(1);
        auto eq = rec.find('=');
        if (eq == std::string_view::npos) return corrupt("bad PAX record key");
        std::string key(rec.substr(0, eq));
        if (key.rfind("GNU.sparse.", 0) == 0) return corrupt("GNU sparse files are unsupported");
        pax[key] = std::string(rec.substr(eq + 1));
      }
      continue;
    }
    if (type == 'L' || type == 'K') {
      auto payload = read_payload(*size, limits_.max_name_bytes + 1);
      if (!payload) return payload.error();
      auto nul = payload->find('\0');
      if (nul != std::string::npos) payload->resize(nul);
      (type == 'L' ? long_name : long_link) = std::move(*payload);
      continue;
    }
    if (type == 'S') return corrupt("GNU sparse files are unsupported");

    e = tar_entry{};
    const std::string_view magic(block + 257, 6);
    const bool posix_ustar = magic == std::string_view("ustar\0", 6);
    if (long_name) {
      e.path = std::move(*long_name);
    } else {
      std::string_view name = field(block, 0, 100);
      std::string_view prefix = posix_ustar ? field(block, 345, 155) : std::string_view{};
      e.path = prefix.empty() ? std::string(name) : std::string(prefix) + "/" + std::string(name);
    }
    e.link = long_link ? std::move(*long_link) : std::string(field(block, 157, 100));

    auto mode = parse_number(block, 100, 8);
    auto uid = parse_number(block, 108, 8);
    auto gid = parse_number(block, 116, 8);
    auto mtime = parse_number(block, 136, 12);
    if (!mode || !uid || !gid || !mtime) return corrupt("bad tar numeric field");
    e.mode = static_cast<std::uint32_t>(*mode & 07777);
    e.uid = *uid;
    e.gid = *gid;
    e.mtime = static_cast<std::int64_t>(std::min<std::uint64_t>(
        *mtime, static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())));
    e.size = *size;

    for (const auto& [key, value] : pax) {
      if (key == "path") {
        e.path = value;
      } else if (key == "linkpath") {
        e.link = value;
      } else if (key == "size" || key == "uid" || key == "gid") {
        auto v = parse_decimal(value);
        if (!v) return corrupt("bad PAX " + key);
        (key == "size" ? e.size : key == "uid" ? e.uid : e.gid) = *v;
      } else if (key == "mtime") {
        std::string_view v = value;
        bool negative = !v.empty() && v.front() == '-';
        if (negative) v.remove_prefix(1);
        auto secs = parse_decimal(v.substr(0, v.find('.')));
        if (!secs) return corrupt("bad PAX mtime");
        e.mtime = negative ? -static_cast<std::int64_t>(std::min<std::uint64_t>(*secs, 1ULL << 62))
                           : static_cast<std::int64_t>(std::min<std::uint64_t>(*secs, 1ULL << 62));
      }
    }
    if (e.path.size() > limits_.max_name_bytes || e.link.size() > limits_.max_name_bytes) {
      return corrupt("tar member name too long");
    }
    if (e.path.find('\0') != std::string::npos || e.link.find('\0') != std::string::npos) {
      return corrupt("NUL in tar member name");
    }

    switch (type) {
      case '\0':
      case '7':
        // Old (v7) archives mark directories only by a trailing slash.
        e.type = (type == '\0' && !e.path.empty() && e.path.back() == '/') ? '5' : '0';
        break;
      case 'D':  // GNU dump directory: a directory whose data lists names
        e.type = '5';
        break;
      default:
        e.type = type;
    }
    remaining_ = e.size;
    padding_ = (block_size - e.size % block_size) % block_size;
    return tar_step::entry;
  }
}

}  // namespace sandbox::detail
