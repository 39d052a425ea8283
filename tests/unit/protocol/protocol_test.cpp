// Unit tests of the protocol value helpers: UTF-8 checks, file-name rules (including the NFC
// table), display escaping, drop-reason strings, the error category and rejection throwing.
#include "sandbox/protocol.hpp"

#include <boost/system/result.hpp>
#include <catch2/catch.hpp>
#include <set>
#include <stdexcept>
#include <string>

#include "protocol/text_util.hpp"
#include "sandbox/error.hpp"

using namespace std::string_literals;
using sandbox::check_file_name;
using sandbox::escape_for_display;
using sandbox::is_valid_utf8;

namespace {

/// UTF-8 encoding of `cp` (no validity checks: lets tests build surrogates and the like).
std::string utf8(char32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

}  // namespace

TEST_CASE("is_valid_utf8 accepts well-formed UTF-8", "[protocol][utf8]") {
  CHECK(is_valid_utf8(""));
  CHECK(is_valid_utf8("plain ascii"));
  CHECK(is_valid_utf8("\x7f"));
  CHECK(is_valid_utf8(utf8(0x80)));
  CHECK(is_valid_utf8(utf8(0x7FF)));
  CHECK(is_valid_utf8(utf8(0x800)));
  CHECK(is_valid_utf8(utf8(0xD7FF)));
  CHECK(is_valid_utf8(utf8(0xE000)));
  CHECK(is_valid_utf8(utf8(0xFFFF)));
  CHECK(is_valid_utf8(utf8(0x10000)));
  CHECK(is_valid_utf8(utf8(0x10FFFF)));
  CHECK(is_valid_utf8("a\0b"s));  // NUL is well-formed UTF-8 (file names refuse it)
}

TEST_CASE("is_valid_utf8 refuses every kind of ill-formed sequence", "[protocol][utf8]") {
  const char* bad[] = {
      "\x80",                      // lone continuation
      "\xbf",                      // lone continuation
      "\xc0\xaf",                  // overlong '/'
      "\xc1\xbf",                  // overlong
      "\xe0\x80\xaf",              // overlong '/' (3 bytes)
      "\xe0\x9f\xbf",              // overlong (3 bytes, top)
      "\xf0\x80\x80\xaf",          // overlong '/' (4 bytes)
      "\xf0\x8f\xbf\xbf",          // overlong (4 bytes, top)
      "\xed\xa0\x80",              // U+D800, high surrogate
      "\xed\xbf\xbf",              // U+DFFF, low surrogate
      "\xed\xa0\xbd\xed\xb8\x80",  // CESU-8 surrogate pair
      "\xf4\x90\x80\x80",          // U+110000
      "\xf5\x80\x80\x80",          // lead byte F5
      "\xff",                      // never valid
      "\xfe",                      // never valid
      "\xc3",                      // truncated 2-byte
      "\xe2\x82",                  // truncated 3-byte
      "\xf0\x9f\x98",              // truncated 4-byte
      "\xe2\x28\xa1",              // bad continuation
      "a\xc3(",                    // continuation replaced by ASCII
  };
  for (const char* b : bad) {
    INFO("bytes: " << escape_for_display(b));
    CHECK_FALSE(is_valid_utf8(b));
    CHECK(check_file_name(b) == "is not valid UTF-8");
  }
}

TEST_CASE("escape_for_display passes valid text and escapes the rest", "[protocol][escape]") {
  CHECK(escape_for_display("report.csv") == "report.csv");
  CHECK(escape_for_display("h\xc3\xa9llo") == "h\xc3\xa9llo");
  CHECK(escape_for_display("a\\x41") == "a\\x41");  // backslash passes unchanged
  CHECK(escape_for_display(utf8(0x202E) + "txt") == utf8(0x202E) + "txt");  // Cf, not Cc
  CHECK(escape_for_display("a\nb") == "a\\x0ab");
  CHECK(escape_for_display("a\0b"s) == "a\\x00b");
  CHECK(escape_for_display("\x1b[31m") == "\\x1b[31m");
  CHECK(escape_for_display("\x7f") == "\\x7f");
  CHECK(escape_for_display(utf8(0x85)) == "\\xc2\\x85");  // C1 control: both bytes
  CHECK(escape_for_display(utf8(0x9F)) == "\\xc2\\x9f");
  CHECK(escape_for_display(utf8(0xA0)) == utf8(0xA0));  // first non-control
  CHECK(escape_for_display("\xff\xfe") == "\\xff\\xfe");
  CHECK(escape_for_display("\xc0\xaf") == "\\xc0\\xaf");           // overlong: byte by byte
  CHECK(escape_for_display("\xed\xa0\x80") == "\\xed\\xa0\\x80");  // surrogate
  CHECK(escape_for_display("\xe2\x82") == "\\xe2\\x82");           // truncated at the end
  CHECK(escape_for_display("ok\xe2\x82"
                           "ok") == "ok\\xe2\\x82ok");
  // The output is always valid UTF-8 without control characters.
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const std::string shown = escape_for_display(all);
  CHECK(is_valid_utf8(shown));
  for (char c : shown) CHECK(static_cast<unsigned char>(c) >= 0x20);
}

TEST_CASE("check_file_name accepts plain names", "[protocol][names]") {
  const std::string good[] = {
      "a",
      "data.csv",
      ".hidden",
      "...",
      "a..b",
      "name with spaces",
      "back\\slash",
      "-rf",
      "h\xc3\xa9llo.txt",                      // é precomposed (NFC)
      "\xf0\x9f\x98\x80.png",                  // emoji
      "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4",  // 한국어 (precomposed Hangul)
      "\xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\xa8\xe0\xa5\x8d\xe0\xa4\xa6\xe0\xa5\x80",  // हिन्दी
      "\xd7\x90\xd6\xb0\xd6\xb1",  // alef + sheva (ccc 10) + hataf segol (ccc 11)
      utf8(0xE000),                // private use
      std::string(255, 'x'),
  };
  for (std::size_t i = 0; i < std::size(good); ++i) {
    INFO("name: " << escape_for_display(good[i]));
    CHECK(check_file_name(good[i]).empty());
  }
  // 85 three-byte characters = 255 bytes: the limit counts bytes, not characters.
  std::string cjk;
  for (int i = 0; i < 85; ++i) cjk += "\xe6\x97\xa5";  // 日
  CHECK(cjk.size() == 255);
  CHECK(check_file_name(cjk).empty());
  CHECK(check_file_name(cjk + "x") == "is longer than 255 bytes");
}

TEST_CASE("check_file_name refuses each kind of bad name with its reason", "[protocol][names]") {
  struct bad_case {
    std::string name;
    std::string reason;
  };
  const bad_case cases[] = {
      {"", "is empty"},
      {std::string(256, 'x'), "is longer than 255 bytes"},
      {std::string(4096, 'x'), "is longer than 255 bytes"},
      {std::string(4096, '/'), "is longer than 255 bytes"},
      {".", "is '.' or '..'"},
      {"..", "is '.' or '..'"},
      {"/", "contains '/'"},
      {"a/b", "contains '/'"},
      {"../etc/passwd", "contains '/'"},
      {"/etc/passwd", "contains '/'"},
      {"dir/", "contains '/'"},
      {"\xc0\xaf", "is not valid UTF-8"},  // overlong '/' must not slip through
      {"..\xc0\xaf"
       "etc",
       "is not valid UTF-8"},
      {"\xed\xa0\x80.txt", "is not valid UTF-8"},  // surrogate
      {"\xff", "is not valid UTF-8"},
      {"a\0b"s, "contains a control character (U+0000)"},
      {"\0"s, "contains a control character (U+0000)"},
      {"a\nb", "contains a control character (U+000A)"},
      // Invisible formatting characters that make a name read as another ("Trojan Source").
      {utf8(0x202E) + "fdp.exe", "contains an invisible formatting character (U+202E)"},
      {"a" + utf8(0x200B) + "b", "contains an invisible formatting character (U+200B)"},
      {utf8(0xFEFF) + "bom", "contains an invisible formatting character (U+FEFF)"},
      {"x" + utf8(0x2066), "contains an invisible formatting character (U+2066)"},
      {"soft" + utf8(0x00AD) + "hyphen", "contains an invisible formatting character (U+00AD)"},
      {"tag" + utf8(0xE0041), "contains an invisible formatting character (U+E0041)"},
      {"a\rb", "contains a control character (U+000D)"},
      {"tab\t", "contains a control character (U+0009)"},
      {"\x1b[2J", "contains a control character (U+001B)"},
      {"del\x7f", "contains a control character (U+007F)"},
      {"nel" + utf8(0x85), "contains a control character (U+0085)"},
      {"c1" + utf8(0x9F), "contains a control character (U+009F)"},
      // Not in NFC: e + COMBINING ACUTE is the decomposed twin of "é".
      {"e\xcc\x81", "is not (provably) in Unicode normalization form C: contains U+0301"},
      {utf8(0x212B), "is not (provably) in Unicode normalization form C: contains U+212B"},
      {utf8(0xF900), "is not (provably) in Unicode normalization form C: contains U+F900"},
      {utf8(0x0340), "is not (provably) in Unicode normalization form C: contains U+0340"},
      // Decomposed Hangul (L + V jamo).
      {utf8(0x1100) + utf8(0x1161),
       "is not (provably) in Unicode normalization form C: contains U+1161"},
      // Conservative: q + U+0301 is NFC (no precomposed form) but NFC_QC is Maybe.
      {"q\xcc\x81", "is not (provably) in Unicode normalization form C: contains U+0301"},
      // Combining marks out of canonical order (ccc 11 before ccc 10).
      {"\xd7\x90\xd6\xb1\xd6\xb0",
       "is not in Unicode normalization form C: combining marks out of canonical order at "
       "U+05B0"},
      {utf8(0x0378), "contains U+0378, which is unassigned in Unicode 14.0.0"},
      {"x" + utf8(0xFFFF), "contains U+FFFF, which is unassigned in Unicode 14.0.0"},
      {utf8(0x10FFFF), "contains U+10FFFF, which is unassigned in Unicode 14.0.0"},
  };
  for (const auto& c : cases) {
    INFO("name: " << escape_for_display(c.name));
    CHECK(check_file_name(c.name) == c.reason);
  }
}

TEST_CASE("check_file_name reports the same reason wherever the fault is", "[protocol][names]") {
  // A fault found at one position must be found at every position.
  for (std::size_t pos = 0; pos <= 10; ++pos) {
    std::string base(10, 'a');
    CHECK(check_file_name(std::string(base).insert(pos, "/")) == "contains '/'");
    CHECK(check_file_name(std::string(base).insert(pos, "\n")) ==
          "contains a control character (U+000A)");
    CHECK(check_file_name(std::string(base).insert(pos, "\xff")) == "is not valid UTF-8");
  }
  // Every C0 and C1 control character, alone and inside a name.
  for (char32_t cp = 0; cp <= 0x9F; ++cp) {
    if (cp >= 0x20 && cp < 0x7F) continue;
    INFO("cp " << static_cast<std::uint32_t>(cp));
    const std::string reason =
        "contains a control character (" + sandbox::detail::code_point_name(cp) + ")";
    CHECK(check_file_name(utf8(cp)) == reason);
    CHECK(check_file_name("x" + utf8(cp) + "y") == reason);
  }
}

TEST_CASE("the NFC check agrees with Python's unicodedata on sample code points",
          "[protocol][names][nfc]") {
  // Expected values from Python 3.11 (Unicode 14.0.0): NFC_Quick_Check Yes and assigned.
  const char32_t yes[] = {0x41,   0xC5,   0xE9,    0x1EBF,  0x03B1, 0x4E00, 0xAC00, 0xD7A3, 0x1100,
                          0x0E01, 0x0627, 0x1F600, 0x20000, 0x05B0, 0x094D, 0x0316, 0xFB1E};
  // NFC_Quick_Check No (Full_Composition_Exclusion) or Maybe.
  const char32_t not_yes[] = {0x0300, 0x0301, 0x0304, 0x0340,  0x0341,  0x0343, 0x0344,
                              0x0374, 0x037E, 0x0387, 0x0958,  0x1161,  0x1175, 0x11A8,
                              0x11C2, 0x1F71, 0x2000, 0x2126,  0x212A,  0x212B, 0x2329,
                              0xF900, 0xFA6D, 0xFB1D, 0x2F800, 0x2FA1D, 0x0CD5, 0x0B3E};
  for (char32_t cp : yes) {
    INFO("U+" << std::hex << static_cast<std::uint32_t>(cp));
    CHECK(check_file_name("x" + utf8(cp)).empty());
  }
  for (char32_t cp : not_yes) {
    INFO("U+" << std::hex << static_cast<std::uint32_t>(cp));
    CHECK(check_file_name("x" + utf8(cp)) ==
          "is not (provably) in Unicode normalization form C: contains " +
              sandbox::detail::code_point_name(cp));
  }
}

TEST_CASE("quote_for_message escapes and shortens caller bytes", "[protocol][escape]") {
  using sandbox::detail::quote_for_message;
  CHECK(quote_for_message("foo") == "'foo'");
  CHECK(quote_for_message("a\nb") == "'a\\x0ab'");
  CHECK(quote_for_message(std::string(4096, 'x')) == "'" + std::string(64, 'x') + "...'");
  // Cutting never splits a character.
  std::string e;
  for (int i = 0; i < 40; ++i) e += "\xc3\xa9";
  const std::string q = quote_for_message(e);
  CHECK(is_valid_utf8(q));
  CHECK(q == "'" + e.substr(0, 64) + "...'");
  CHECK(quote_for_message(std::string(100, '\xff')).size() < 100);
}

TEST_CASE("drop reasons have stable wire strings", "[protocol]") {
  using sandbox::drop_reason;
  CHECK(sandbox::to_string(drop_reason::count_limit) == "count_limit");
  CHECK(sandbox::to_string(drop_reason::bytes_limit) == "bytes_limit");
  CHECK(sandbox::to_string(drop_reason::not_regular_file) == "not_regular_file");
  CHECK(sandbox::to_string(drop_reason::bad_name) == "bad_name");
  CHECK(sandbox::to_string(drop_reason::quota_exceeded) == "quota_exceeded");
  CHECK(sandbox::to_string(drop_reason::store_error) == "store_error");
}

TEST_CASE("a rejection thrown from result::value() is std::invalid_argument", "[protocol][error]") {
  boost::system::result<int, sandbox::rejection> r =
      sandbox::rejection{sandbox::code::invalid_request, "runtime: must not be empty"};
  REQUIRE_FALSE(r.has_value());
  try {
    (void)r.value();
    FAIL("value() did not throw");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) == "runtime: must not be empty");
  }
}

TEST_CASE("the sandbox error category names every errc", "[protocol][error]") {
  using sandbox::errc;
  const auto& cat = sandbox::error_category();
  CHECK(std::string(cat.name()) == "sandbox");
  CHECK(&cat == &sandbox::error_category());
  boost::system::error_code ec = errc::not_found;  // is_error_code_enum
  CHECK(ec.category() == cat);
  CHECK(ec.message() == "not found");
  CHECK(sandbox::make_error_code(errc::invalid_argument).message() == "invalid argument");
  CHECK(sandbox::make_error_code(errc::quota_exceeded).message() == "quota exceeded");
  CHECK(sandbox::make_error_code(errc::busy).message() == "busy");
  std::set<std::string> messages;
  for (int e = 0; e <= static_cast<int>(errc::busy); ++e) {
    const std::string m = cat.message(e);
    CHECK_FALSE(m.empty());
    CHECK(m.find("unknown") == std::string::npos);
    messages.insert(m);
  }
  CHECK(messages.size() == static_cast<std::size_t>(errc::busy) + 1);  // all distinct
  CHECK(cat.message(999) == "unknown sandbox error 999");
  char buffer[64];
  CHECK(std::string(cat.message(999, buffer, sizeof buffer)) == "unknown sandbox error 999");
  CHECK(std::string(cat.message(2, buffer, sizeof buffer)) == "not found");
  CHECK_FALSE(sandbox::make_error_code(errc::success).failed());
}

TEST_CASE("escape_name_for_display: good names unchanged, bad ones read back as exactly one name",
          "[protocol][escape]") {
  using sandbox::escape_name_for_display;
  CHECK(escape_name_for_display("report.csv") == "report.csv");
  CHECK(escape_name_for_display("a\\x01") == "a\\x01");  // a good name: shown as written
  CHECK(escape_name_for_display("a\nb") == "a\\x0ab");
  CHECK(escape_name_for_display("\\x01\x02") == "\\x5cx01\\x02");
  CHECK(escape_name_for_display("\x01\x02") == "\\x01\\x02");
  CHECK(escape_name_for_display("\\\xff\\") == "\\x5c\\xff\\x5c");
  CHECK(escape_name_for_display("\xc3\\") == "\\xc3\\x5c");  // a cut sequence, then '\'
  // Reading a display form back (\xNN is byte NN, anything else itself) gives the name, so
  // no two names share a form: every pair of bytes from a small alphabet, and more.
  auto undisplay = [](const std::string& d) {
    std::string out;
    for (std::size_t i = 0; i < d.size(); ++i) {
      if (d[i] == '\\' && i + 3 < d.size() && d[i + 1] == 'x') {
        out.push_back(static_cast<char>(std::stoi(d.substr(i + 2, 2), nullptr, 16)));
        i += 3;
      } else {
        out.push_back(d[i]);
      }
    }
    return out;
  };
  const std::string alphabet = "\\x0a1\n\x01\xc3\xa9\xff";
  std::set<std::string> forms;
  std::size_t bad = 0;
  for (char a : alphabet) {
    for (char b : alphabet) {
      for (char c : alphabet) {
        for (char d : alphabet) {
          const std::string name{a, b, c, d};
          const std::string shown = escape_name_for_display(name);
          CHECK(is_valid_utf8(shown));
          if (shown == name) continue;  // good names are unique as they are
          ++bad;
          CHECK(undisplay(shown) == name);
          forms.insert(shown);
        }
      }
    }
  }
  CHECK(forms.size() == bad);
}
