#include "core/dns_sink.hpp"

#include <cstdio>

namespace sandbox::detail {
namespace {

constexpr std::size_t header_size = 12;

// Walks the first question; returns the offset just past QTYPE/QCLASS, or 0 when malformed.
std::size_t parse_question(std::span<const std::uint8_t> p, std::string* name) {
  if (p.size() < header_size) return 0;
  bool is_response = (p[2] & 0x80) != 0;
  unsigned opcode = (p[2] >> 3) & 0x0F;
  unsigned qdcount = (p[4] << 8) | p[5];
  if (is_response || opcode != 0 || qdcount == 0) return 0;
  std::size_t i = header_size;
  std::size_t name_len = 0;
  for (;;) {
    if (i >= p.size()) return 0;
    std::uint8_t len = p[i++];
    if (len == 0) break;
    if ((len & 0xC0) != 0) return 0;  // pointer or reserved label type
    if (i + len > p.size()) return 0;
    name_len += len + 1;
    if (name_len > 255) return 0;
    if (name != nullptr) {
      if (!name->empty()) name->push_back('.');
      for (std::size_t k = 0; k < len; ++k) {
        unsigned char c = p[i + k];
        bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                     (c >= '0' && c <= '9') || c == '-' || c == '_';
        if (plain) {
          name->push_back(static_cast<char>(c));
        } else {
          char esc[5];
          std::snprintf(esc, sizeof esc, "\\x%02x", c);
          name->append(esc);
        }
      }
    }
    i += len;
  }
  if (i + 4 > p.size()) return 0;  // QTYPE + QCLASS
  return i + 4;
}

}  // namespace

std::optional<std::string> dns_query_name(std::span<const std::uint8_t> packet) {
  std::string name;
  if (parse_question(packet, &name) == 0) return std::nullopt;
  if (name.empty()) name = ".";
  return name;
}

std::vector<std::uint8_t> dns_refused_response(std::span<const std::uint8_t> query) {
  std::size_t end = parse_question(query, nullptr);
  if (end == 0) return {};
  std::vector<std::uint8_t> r(query.begin(), query.begin() + static_cast<std::ptrdiff_t>(end));
  r[2] = static_cast<std::uint8_t>(0x80 | (query[2] & 0x79));  // QR=1, keep opcode(0) and RD
  r[3] = 0x05;                                                // RA=0, RCODE=REFUSED
  r[4] = 0;
  r[5] = 1;  // one question
  for (std::size_t k = 6; k < header_size; ++k) r[k] = 0;  // no answer/authority/additional
  return r;
}

}  // namespace sandbox::detail
