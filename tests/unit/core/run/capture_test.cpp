// stream_capture_buffer: byte-exact head, counting, bounded memory, and a summary that is
// always valid UTF-8, escaped, and never longer than its bound.
#include "core/run/capture.hpp"

#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/text_util.hpp"
#include "sandbox/protocol.hpp"

using sandbox::detail::stream_capture_buffer;

namespace {

const std::string ellipsis = "\xE2\x80\xA6";

void feed(stream_capture_buffer& b, std::string_view s) { b.append({s.data(), s.size()}); }

/// Feeds `s` in pieces of random sizes (1..max_piece, including empty appends).
void feed_chunked(stream_capture_buffer& b, std::string_view s, std::mt19937_64& rng,
                  std::size_t max_piece) {
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t n = std::uniform_int_distribution<std::size_t>(0, max_piece)(rng);
    n = std::min(n, s.size() - i);
    b.append({s.data() + i, n});
    i += n;
  }
}

/// No control character other than \n, \r, \t (the summary's promise).
bool has_forbidden_control(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    std::size_t n = sandbox::detail::decode_utf8(s, i, cp);
    if (n == 0) return true;  // not even UTF-8
    if (sandbox::detail::is_control(cp) && cp != '\n' && cp != '\r' && cp != '\t') return true;
    i += n;
  }
  return false;
}

struct parsed_summary {
  bool cut = false;
  std::string head;
  std::string tail;
  std::uint64_t omitted = 0;
};

/// Splits "head\n…[N bytes omitted]…\ntail" (data must not contain "…[").
parsed_summary parse(const std::string& s) {
  parsed_summary p;
  std::string open = "\n" + ellipsis + "[";
  std::size_t a = s.find(open);
  if (a == std::string::npos) {
    p.head = s;
    return p;
  }
  std::size_t num = a + open.size();
  std::size_t b = s.find(" bytes omitted]" + ellipsis + "\n", num);
  REQUIRE(b != std::string::npos);
  p.cut = true;
  p.head = s.substr(0, a);
  p.omitted = std::stoull(s.substr(num, b - num));
  p.tail = s.substr(b + std::string(" bytes omitted]" + ellipsis + "\n").size());
  return p;
}

}  // namespace

TEST_CASE("capture: empty stream", "[capture]") {
  stream_capture_buffer b(1024, 4096);
  CHECK(b.stored().empty());
  CHECK(b.total_bytes() == 0);
  CHECK_FALSE(b.truncated());
  CHECK(b.summary().empty());
  b.append({});
  CHECK(b.summary().empty());
}

TEST_CASE("capture: a short stream is its own summary", "[capture]") {
  stream_capture_buffer b(1024, 4096);
  feed(b, "hello\n");
  feed(b, "world\r\n\ttab");
  CHECK(b.stored() == "hello\nworld\r\n\ttab");
  CHECK(b.summary() == "hello\nworld\r\n\ttab");
  CHECK(b.total_bytes() == 17);
}

TEST_CASE("capture: exact cap and cap + 1", "[capture]") {
  const std::string data = "0123456789abcdef";
  SECTION("exact") {
    stream_capture_buffer b(16, 4096);
    feed(b, data);
    CHECK(b.stored() == data);
    CHECK_FALSE(b.truncated());
    CHECK(b.summary() == data);
  }
  SECTION("cap + 1, in one append") {
    stream_capture_buffer b(16, 4096);
    feed(b, data + "X");
    CHECK(b.stored() == data);
    CHECK(b.truncated());
    CHECK(b.total_bytes() == 17);
    CHECK(b.summary() == data + "X");  // the summary still shows the whole (short) stream
  }
  SECTION("cap + 1, byte by byte") {
    stream_capture_buffer b(16, 4096);
    for (char c : data + "X") feed(b, std::string_view(&c, 1));
    CHECK(b.stored() == data);
    CHECK(b.truncated());
    CHECK(b.total_bytes() == 17);
  }
  SECTION("cap 0 keeps nothing but still summarizes") {
    stream_capture_buffer b(0, 4096);
    feed(b, data);
    CHECK(b.stored().empty());
    CHECK(b.truncated());
    CHECK(b.summary() == data);
  }
}

TEST_CASE("capture: 1 GiB streamed in 64 KiB chunks stays bounded", "[capture]") {
  constexpr std::uint64_t cap = 1 << 20;
  constexpr std::uint32_t summary_bytes = 4096;
  stream_capture_buffer b(cap, summary_bytes);
  std::string chunk(64 * 1024, 'x');
  for (std::size_t i = 0; i < chunk.size(); i += 64) chunk[i] = '\n';
  constexpr std::uint64_t chunks = (1ULL << 30) / (64 * 1024);
  for (std::uint64_t n = 0; n < chunks; ++n) {
    // Mark each chunk with its number so head and tail can be checked.
    std::string tag = "<" + std::to_string(n) + ">";
    std::copy(tag.begin(), tag.end(), chunk.begin() + 1);
    std::copy(tag.begin(), tag.end(), chunk.end() - 16);
    b.append(chunk);
    if (n == 0) REQUIRE(b.stored().size() == 64 * 1024);
  }
  CHECK(b.total_bytes() == 1ULL << 30);
  CHECK(b.truncated());
  REQUIRE(b.stored().size() == cap);
  CHECK(b.stored().capacity() <= cap + 64);  // never grown past the cap
  CHECK(b.stored().substr(0, 4) == "\n<0>");
  CHECK(b.stored().substr(cap - 64 * 1024, 5) == "\n<15>");
  std::string s = b.summary();
  CHECK(s.size() <= summary_bytes);
  CHECK(s.size() >= summary_bytes - 64);  // the room is used
  CHECK(sandbox::is_valid_utf8(s));
  auto p = parse(s);
  REQUIRE(p.cut);
  CHECK(p.head.substr(0, 4) == "\n<0>");
  CHECK(p.tail.find("<16383>") != std::string::npos);
  CHECK(p.head.size() + p.omitted + p.tail.size() == 1ULL << 30);
}

TEST_CASE("capture: a flood without newlines", "[capture]") {
  stream_capture_buffer b(1 << 20, 4096);
  std::string a(1 << 20, 'A');
  for (int i = 0; i < 10; ++i) b.append(a);
  std::string s = b.summary();
  CHECK(s.size() <= 4096);
  auto p = parse(s);
  REQUIRE(p.cut);
  CHECK(p.head == std::string(p.head.size(), 'A'));
  CHECK(p.tail == std::string(p.tail.size(), 'A'));
  CHECK(p.head.size() + p.omitted + p.tail.size() == 10ULL << 20);
}

TEST_CASE("capture: multibyte characters are never split at the cut points", "[capture]") {
  // 2-, 3- and 4-byte characters, with cap and summary sizes that fall inside them.
  for (std::string ch : {"\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"}) {
    for (std::uint32_t summary_bytes : {61u, 62u, 63u, 64u, 100u, 101u}) {
      for (std::uint64_t cap : {0u, 1u, 7u, 33u, 1000u}) {
        CAPTURE(ch, summary_bytes, cap);
        stream_capture_buffer b(cap, summary_bytes);
        std::string data;
        for (int i = 0; i < 500; ++i) data += ch;
        std::mt19937_64 rng(summary_bytes * 1000 + cap);
        feed_chunked(b, data, rng, 5);
        CHECK(b.stored() == data.substr(0, std::min<std::size_t>(cap, data.size())));
        std::string s = b.summary();
        CHECK(s.size() <= summary_bytes);
        CHECK(sandbox::is_valid_utf8(s));
        CHECK(s.find("\\x") == std::string::npos);  // nothing valid was escaped
        auto p = parse(s);
        CHECK(p.cut);
        CHECK(p.head.size() % ch.size() == 0);
        CHECK(p.tail.size() % ch.size() == 0);
        CHECK(p.head.size() + p.omitted + p.tail.size() == data.size());
      }
    }
  }
}

TEST_CASE("capture: invalid bytes and control characters are escaped", "[capture]") {
  auto summary_of = [](std::string_view data) {
    stream_capture_buffer b(1024, 4096);
    feed(b, data);
    return b.summary();
  };
  CHECK(summary_of(std::string("a\0b", 3)) == "a\\x00b");
  CHECK(summary_of("\xFF\xFE") == "\\xff\\xfe");
  CHECK(summary_of("\x80"
                   "abc") == "\\x80abc");                  // a lone continuation byte
  CHECK(summary_of("x\xE2\x82") == "x\\xe2\\x82");         // cut by the end of the stream
  CHECK(summary_of("\xC0\xAF") == "\\xc0\\xaf");           // overlong '/'
  CHECK(summary_of("\xED\xA0\x80") == "\\xed\\xa0\\x80");  // a surrogate
  CHECK(summary_of("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m");
  CHECK(summary_of("del\x7f") == "del\\x7f");
  CHECK(summary_of("nel\xC2\x85") == "nel\\xc2\\x85");          // C1 control, one character
  CHECK(summary_of("\xE2\x80\xAE rtl") == "\xE2\x80\xAE rtl");  // not Cc: kept
  // The stored bytes stay exact.
  stream_capture_buffer b(1024, 4096);
  feed(b, std::string("\0\xFF\n", 3));
  CHECK(b.stored() == std::string("\0\xFF\n", 3));
}

TEST_CASE("capture: output imitating protocol framing is plain data", "[capture]") {
  stream_capture_buffer b(1024, 4096);
  feed(b, "result\n__EXIT__:1\n");
  feed(b, "\n\xE2\x80\xA6[999 bytes omitted]\xE2\x80\xA6\n");
  CHECK(b.stored() == "result\n__EXIT__:1\n\n\xE2\x80\xA6[999 bytes omitted]\xE2\x80\xA6\n");
  CHECK(b.summary() == b.stored());
  CHECK(b.total_bytes() == b.stored().size());
  CHECK_FALSE(b.truncated());
}

TEST_CASE("capture: invalid bytes at the cut points", "[capture]") {
  // Every byte escapes to 4: the head/tail budgets fall mid-escape unless whole tokens.
  std::string data(3000, '\xFF');
  for (std::uint32_t summary_bytes : {40u, 41u, 42u, 43u, 97u, 4096u}) {
    CAPTURE(summary_bytes);
    stream_capture_buffer b(100, summary_bytes);
    feed(b, data);
    std::string s = b.summary();
    CHECK(s.size() <= summary_bytes);
    CHECK(sandbox::is_valid_utf8(s));
    auto p = parse(s);
    REQUIRE(p.cut);
    CHECK(p.head.size() % 4 == 0);
    CHECK(p.tail.size() % 4 == 0);
    CHECK(p.head.size() / 4 + p.omitted + p.tail.size() / 4 == data.size());
  }
}

TEST_CASE("capture: tiny summary bounds", "[capture]") {
  for (std::uint32_t summary_bytes = 0; summary_bytes < 40; ++summary_bytes) {
    CAPTURE(summary_bytes);
    stream_capture_buffer b(10, summary_bytes);
    feed(b, std::string(1000, 'z') + "\xF0\x9F\x98\x80\xFF");
    std::string s = b.summary();
    CHECK(s.size() <= summary_bytes);
    CHECK(sandbox::is_valid_utf8(s));
  }
}

TEST_CASE("capture: property: bounds, validity and structure for random input", "[capture]") {
  std::mt19937_64 rng(20240601);
  const std::vector<std::string> alphabet = {"a",
                                             "b",
                                             "\n",
                                             "\r",
                                             "\t",
                                             " ",
                                             "\xC3\xA9",
                                             "\xE2\x82\xAC",
                                             "\xF0\x9F\x98\x80",
                                             "\xFF",
                                             "\x80",
                                             "\xC0",
                                             "\xE2\x82",
                                             "\x00",
                                             "\x1b",
                                             "\x7f",
                                             "\xC2\x85",
                                             "\xED\xA0\x80"};
  for (int iter = 0; iter < 3000; ++iter) {
    const int kind = iter % 3;  // 0: random bytes, 1: mixed tokens, 2: printable ASCII
    const std::size_t len = std::uniform_int_distribution<std::size_t>(0, 12000)(rng);
    std::string data;
    while (data.size() < len) {
      if (kind == 0) {
        data += static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));
      } else if (kind == 1) {
        std::string tok =
            alphabet[std::uniform_int_distribution<std::size_t>(0, alphabet.size() - 1)(rng)];
        if (tok.empty()) tok = std::string(1, '\0');
        data += tok;
      } else {
        data += static_cast<char>(std::uniform_int_distribution<int>(0x20, 0x7e)(rng));
      }
    }
    const std::uint64_t cap = std::uniform_int_distribution<std::uint64_t>(0, 6000)(rng);
    const std::uint32_t summary_bytes =
        iter % 5 == 0 ? std::uniform_int_distribution<std::uint32_t>(0, 64)(rng)
                      : std::uniform_int_distribution<std::uint32_t>(0, 5000)(rng);
    CAPTURE(iter, kind, data.size(), cap, summary_bytes);
    stream_capture_buffer b(cap, summary_bytes);
    feed_chunked(b, data, rng, std::uniform_int_distribution<std::size_t>(1, 9000)(rng));
    REQUIRE(b.total_bytes() == data.size());
    REQUIRE(b.stored() == data.substr(0, std::min<std::size_t>(cap, data.size())));
    REQUIRE(b.truncated() == (data.size() > cap));
    const std::string s = b.summary();
    REQUIRE(s.size() <= summary_bytes);
    REQUIRE(sandbox::is_valid_utf8(s));
    REQUIRE_FALSE(has_forbidden_control(s));
    if (kind == 2 && summary_bytes >= 64) {
      // Printable ASCII escapes to itself: the summary is exactly head + marker + tail.
      auto p = parse(s);
      if (!p.cut) {
        REQUIRE(s == data);
      } else {
        REQUIRE(data.compare(0, p.head.size(), p.head) == 0);
        REQUIRE(data.compare(data.size() - p.tail.size(), p.tail.size(), p.tail) == 0);
        REQUIRE(p.head.size() + p.omitted + p.tail.size() == data.size());
        REQUIRE(p.omitted > 0);
      }
      if (data.size() + 0 <= summary_bytes / 2 * 2) REQUIRE(s == data);
    }
  }
}
