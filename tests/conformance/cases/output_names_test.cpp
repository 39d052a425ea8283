// Kind 14 — odd output file names: newline, tab, other C0 and C1 controls, DEL, non-UTF-8
// bytes (invalid, overlong, surrogates, past U+10FFFF), the right-to-left override, combining
// characters (and the same text precomposed), zero-width and other format characters,
// 255-byte names (ASCII and multi-byte), names starting with `-`, spaces, dots.
// Properties: a name that is valid UTF-8 without control characters comes back exactly as
// written, with exactly its own content; every other name is dropped as `bad_name` with an
// escaped display form (valid UTF-8, no control characters, `\xNN` per offending byte, and a
// backslash as `\x5c`, so that it reads back as exactly that name and no two differ only in
// how they were escaped);
// nothing is merged (names equal under Unicode normalisation stay two files), split, renamed
// or invented: returned + dropped are exactly the names the program wrote.
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "conformance/suite.hpp"

using sandbox::code;
using sandbox::drop_reason;
using namespace std::chrono_literals;

namespace {

struct odd_name {
  std::string bytes;    ///< the name as written
  std::string display;  ///< expected display form when dropped; empty: must come back as is
};

std::string hex(const std::string& bytes) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}

std::vector<odd_name> odd_names() {
  using namespace std::string_literals;
  std::string long_multibyte;
  for (int i = 0; i < 127; ++i) long_multibyte += "\xc3\xa9";  // 254 bytes of "é"
  long_multibyte += "z";                                       // 255 bytes
  std::string long_bad = std::string(254, 'b') + "\x01";
  return {
      // Valid UTF-8, no control characters: returned exactly.
      {"-rf", ""},
      {"--help", ""},
      {"-", ""},
      {" leading space", ""},
      {"trailing space ", ""},
      {"name.", ""},
      {"...", ""},
      {"cafe\xcc\x81", ""},      // e + U+0301 COMBINING ACUTE
      {"caf\xc3\xa9", ""},       // U+00E9, the same text precomposed
      {"nbsp\xc2\xa0", ""},      // U+00A0
      {"\xf0\x9f\x98\x80", ""},  // U+1F600
      {"\xf4\x8f\xbf\xbf", ""},  // U+10FFFF (a noncharacter, but valid)
      {std::string(255, 'a'), ""},
      {long_multibyte, ""},
      {"back\\slash", ""},
      {"A.txt", ""},  // differs from the next only in case
      {"a.txt", ""},
      {"para\xe2\x80\xa8sep", ""},  // U+2028 LINE SEPARATOR (Zl, not Cc)
      // Control characters, invisible formatting characters that make a name read as
      // another, or invalid UTF-8: dropped as bad_name, escaped per byte.
      {"\xe2\x80\xae"
       "fdp.exe",
       "\\xe2\\x80\\xaefdp.exe"},  // U+202E RIGHT-TO-LEFT OVERRIDE
      {"a\xe2\x80\x8b"
       "b",
       "a\\xe2\\x80\\x8bb"},  // U+200B ZERO WIDTH SPACE
      {"\xef\xbb\xbf"
       "bom",
       "\\xef\\xbb\\xbfbom"},  // U+FEFF
      {"iso\xe2\x81\xa6"
       "late",
       "iso\\xe2\\x81\\xa6late"},  // U+2066 LEFT-TO-RIGHT ISOLATE
      {"line\nbreak", "line\\x0abreak"},
      {"tab\there", "tab\\x09here"},
      {"cr\r", "cr\\x0d"},
      {"\x1b[31mred", "\\x1b[31mred"},
      {"del\x7f", "del\\x7f"},
      {"nel\xc2\x85", "nel\\xc2\\x85"},  // U+0085, a C1 control
      {"latin1-\xe9t\xe9", "latin1-\\xe9t\\xe9"},
      {"\xff\xfe", "\\xff\\xfe"},
      {"overlong-\xc0\xaf", "overlong-\\xc0\\xaf"},
      {"surrogate-\xed\xa0\x80", "surrogate-\\xed\\xa0\\x80"},
      {"too-big-\xf4\x90\x80\x80", "too-big-\\xf4\\x90\\x80\\x80"},
      {"cut-\xe2\x82", "cut-\\xe2\\x82"},
      {"-\x01", "-\\x01"},
      {"csi\xc2\x9b"
       "31m",
       "csi\\xc2\\x9b31m"},  // U+009B, the 8-bit CSI
      // A backslash in a name that is escaped anyway is escaped too, so that the display
      // form reads back as exactly one name: each pair below would otherwise show alike, as
      // "\x01\x02" or "tab\x09\x09".
      {"\x01\x02", "\\x01\\x02"},
      {"\\x01\x02", "\\x5cx01\\x02"},
      {"tab\\x09\t", "tab\\x5cx09\\x09"},
      {"tab\t\\x09", "tab\\x09\\x5cx09"},
      {long_bad, std::string(254, 'b') + "\\x01"},
  };
}

/// The Python program writing each name (by bytes) with content "content-<index>" and
/// printing how many entries its output directory holds.
std::string python_writer(const std::vector<odd_name>& names) {
  std::string list = "[";
  for (const auto& n : names) list += "bytes.fromhex('" + hex(n.bytes) + "'),";
  list += "]";
  return R"PY(
import os
d = os.environ['SANDBOX_OUTPUT_DIR'].encode()
names = )PY" +
         list + R"PY(
for i, n in enumerate(names):
    with open(d + b'/' + n, 'wb') as f:
        f.write(b'content-%d' % i)
print(len(os.listdir(d)))
)PY";
}

std::string node_writer(const std::vector<odd_name>& names) {
  std::string list = "[";
  for (const auto& n : names) list += "'" + hex(n.bytes) + "',";
  list += "]";
  return R"JS(
const fs = require('fs');
const d = process.env.SANDBOX_OUTPUT_DIR;
const names = )JS" +
         list + R"JS(;
names.forEach((h, i) => {
  const p = Buffer.concat([Buffer.from(d + '/'), Buffer.from(h, 'hex')]);
  fs.writeFileSync(p, 'content-' + i);
});
console.log(fs.readdirSync(Buffer.from(d)).length);
)JS";
}

/// Reads a display form back: `\xNN` is the byte NN, anything else stands for itself.
std::string undisplay(const std::string& d) {
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
}

void check_names(conformance::backend& b, const sandbox::run_result& r,
                 const std::vector<odd_name>& names) {
  INFO(sandbox::encode(r));
  REQUIRE(r.code == code::ok);
  // The program wrote every name (none was refused by the file system).
  CHECK(r.std_out.summary == std::to_string(names.size()) + "\n");
  std::map<std::string, std::string> got;
  for (const auto& f : r.files_out) {
    CHECK(got.count(f.name) == 0);
    got[f.name] = b.blob(f.blob);
  }
  std::map<std::string, drop_reason> drops;
  for (const auto& d : r.files_dropped) {
    CHECK(drops.count(d.name_display) == 0);
    drops[d.name_display] = d.reason;
    CHECK(sandbox::is_valid_utf8(d.name_display));
    for (unsigned char c : d.name_display) CHECK((c >= 0x20 && c != 0x7f));
  }
  std::size_t want_back = 0;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto& n = names[i];
    INFO("name #" << i << ": " << sandbox::escape_for_display(n.bytes));
    if (n.display.empty()) {
      ++want_back;
      REQUIRE(got.count(n.bytes) == 1);
      CHECK(got[n.bytes] == "content-" + std::to_string(i));
    } else {
      CHECK(got.count(n.bytes) == 0);
      REQUIRE(drops.count(n.display) == 1);
      CHECK(drops[n.display] == drop_reason::bad_name);
      CHECK(undisplay(n.display) == n.bytes);  // the display form names exactly this entry
    }
  }
  // Nothing invented, merged or split.
  CHECK(got.size() == want_back);
  CHECK(drops.size() == names.size() - want_back);
  // The result's wire form carries every returned name unchanged.
  auto back = sandbox::decode_run_result(sandbox::encode(r));
  REQUIRE(back.has_value());
  CHECK(back->files_out == r.files_out);
  CHECK(back->files_dropped == r.files_dropped);
}

}  // namespace

TEST_CASE("names: odd output names come back exactly or are dropped as bad_name, escaped",
          "[names][outputs][core]") {
  CONFORMANCE_BACKEND(b);
  const auto names = odd_names();
  auto req = conformance::py(python_writer(names));
  req.files_out.max_files = 64;  // every good name fits the count cap
  auto r = b.run(req);
  check_names(b, r, names);
}

TEST_CASE("names: node writes the same names by bytes", "[names][outputs][core][node]") {
  CONFORMANCE_BACKEND(b);
  const auto names = odd_names();
  auto req = conformance::js(node_writer(names));
  req.files_out.max_files = 64;
  auto r = b.run(req);
  check_names(b, r, names);
}

TEST_CASE("names: bad names do not use up the count cap; good ones past it are counted",
          "[names][outputs][core]") {
  CONFORMANCE_BACKEND(b);
  // 40 bad names first in byte order, then 20 good ones, under a cap of 16 files: the 16
  // smallest good names come back, the other 4 are count_limit; every bad one is bad_name.
  auto req = conformance::py(R"PY(
import os
d = os.environ['SANDBOX_OUTPUT_DIR'].encode()
for i in range(40):
    open(d + b'/\x01bad-%02d' % i, 'w').write('bad')
for i in range(20):
    open(d + b'/good-%02d' % i, 'w').write('good-%02d' % i)
)PY");
  req.files_out.max_files = 16;
  auto r = b.run(req);
  REQUIRE(r.code == code::ok);
  std::size_t bad = 0, count = 0;
  for (const auto& d : r.files_dropped) {
    if (d.reason == drop_reason::bad_name) {
      ++bad;
      CHECK(d.name_display.rfind("\\x01bad-", 0) == 0);
    } else {
      CHECK(d.reason == drop_reason::count_limit);
      CHECK(d.name_display.rfind("good-", 0) == 0);
      ++count;
    }
  }
  CHECK(bad == 40);
  CHECK(count == 4);
  REQUIRE(r.files_out.size() == 16);
  for (const auto& f : r.files_out) CHECK(b.blob(f.blob) == f.name);
}
