#include "wire/dns_sink.hpp"

#include <algorithm>
#include <cstdio>
#include <string_view>

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
        bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                     c == '-' || c == '_';
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

// A reverse name of a loopback address: "d.c.b.127.in-addr.arpa" (127.0.0.0/8, each label a
// decimal 0..255 without leading zeros) or the 32 nibbles of ::1 under ip6.arpa (RFC 1035
// §3.5, RFC 3596 §2.5). Lower-cased names.
bool is_loopback_reverse(const std::string& name) {
  static const std::string v6 = [] {
    std::string n = "1";
    for (int i = 0; i < 31; ++i) n += ".0";
    return n + ".ip6.arpa";
  }();
  if (name == v6) return true;
  constexpr std::string_view suffix = ".127.in-addr.arpa";
  if (name.size() <= suffix.size() ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return false;
  }
  const std::string_view octets(name.data(), name.size() - suffix.size());
  int labels = 0;
  std::size_t at = 0;
  while (at <= octets.size()) {
    const std::size_t dot = std::min(octets.find('.', at), octets.size());
    const std::string_view label = octets.substr(at, dot - at);
    if (label.empty() || label.size() > 3 || (label.size() > 1 && label[0] == '0')) return false;
    unsigned v = 0;
    for (char c : label) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + static_cast<unsigned>(c - '0');
    }
    if (v > 255) return false;
    ++labels;
    at = dot + 1;
  }
  return labels == 3;
}

}  // namespace

std::optional<std::string> dns_query_name(std::span<const std::uint8_t> packet) {
  std::string name;
  if (parse_question(packet, &name) == 0) return std::nullopt;
  if (name.empty()) name.push_back('.');  // (not `= "."`: g++ 12 warns -Wrestrict, PR 105329)
  return name;
}

std::vector<std::uint8_t> dns_refused_response(std::span<const std::uint8_t> query) {
  std::size_t end = parse_question(query, nullptr);
  if (end == 0) return {};
  std::vector<std::uint8_t> r(query.begin(), query.begin() + static_cast<std::ptrdiff_t>(end));
  r[2] = static_cast<std::uint8_t>(0x80 | (query[2] & 0x79));  // QR=1, keep opcode(0) and RD
  r[3] = 0x05;                                                 // RA=0, RCODE=REFUSED
  r[4] = 0;
  r[5] = 1;                                                // one question
  for (std::size_t k = 6; k < header_size; ++k) r[k] = 0;  // no answer/authority/additional
  return r;
}

std::vector<std::uint8_t> dns_local_response(std::span<const std::uint8_t> query) {
  std::string name;
  std::size_t end = parse_question(query, &name);
  if (end == 0) return {};
  for (auto& c : name) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  constexpr std::string_view suffix = ".localhost";
  const bool localhost = name == "localhost" ||
                         (name.size() > suffix.size() &&
                          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0);
  const bool ip6_only = name == "ip6-localhost";
  const bool ip4_only = name == "sandbox";  // the run's hostname (sandbox-init's sethostname)
  const bool reverse = is_loopback_reverse(name);  // 127.x.y.z or ::1 → localhost
  if (!localhost && !ip6_only && !ip4_only && !reverse) return {};
  const unsigned qtype = (query[end - 4] << 8) | query[end - 3];
  const unsigned qclass = (query[end - 2] << 8) | query[end - 1];
  std::vector<std::uint8_t> r(query.begin(), query.begin() + static_cast<std::ptrdiff_t>(end));
  r[2] = static_cast<std::uint8_t>(0x84 | (query[2] & 0x01));  // QR, AA; opcode 0; keep RD
  r[3] = 0x00;                                                 // RA=0, RCODE=NOERROR
  r[4] = 0;
  r[5] = 1;  // one question
  for (std::size_t k = 6; k < header_size; ++k) r[k] = 0;
  std::vector<std::uint8_t> rdata;
  if (reverse) {
    // PTR: the name "localhost" (as a run's /etc/hosts would give it); no other type.
    if (qclass == 1 && qtype == 12) rdata = {9, 'l', 'o', 'c', 'a', 'l', 'h', 'o', 's', 't', 0};
  } else {
    if (qclass == 1 && qtype == 1 && !ip6_only) rdata = {127, 0, 0, 1};
    if (qclass == 1 && qtype == 28 && !ip4_only) {
      rdata = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    }
  }
  if (!rdata.empty()) {
    r[7] = 1;  // one answer
    // clang-format off
    const std::uint8_t rr[] = {0xC0, 0x0C,  // the question's name
                               static_cast<std::uint8_t>(qtype >> 8), static_cast<std::uint8_t>(qtype),
                               0, 1,        // IN
                               0, 0, 0, 0,  // TTL 0
                               0, static_cast<std::uint8_t>(rdata.size())};
    // clang-format on
    r.insert(r.end(), std::begin(rr), std::end(rr));
    r.insert(r.end(), rdata.begin(), rdata.end());
  }
  return r;
}

}  // namespace sandbox::detail
