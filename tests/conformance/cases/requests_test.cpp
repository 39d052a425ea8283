// Kind 13 — request-level attacks: path traversal and odd bytes in `files_in` names,
// malformed, percent-encoded and relative blob ids, 100,000 entries, 4 KiB names, names equal
// under Unicode normalisation. Each is refused with `invalid_request` naming the field,
// through the backend's own runtime, before anything is created: no run cgroup, work dir,
// process or mount (the case's host snapshot), no blob. The wire forms go through
// `sandbox::decode_run_request` first, as a model's tool call would.
//
// Names that are odd but harmless on every backend's file system (percent signs,
// backslashes, a leading dash, names equal only under compatibility normalisation or case
// folding) are accepted — and then placed exactly as named, each with its own content, and
// nothing else.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "conformance/suite.hpp"
#include "sandbox/json.hpp"

using namespace std::string_literals;
using conformance::py;
using sandbox::code;

namespace {

const std::string hex64(64, 'e');

/// The blobs of `tenant`, sorted (to show that a refused request stored nothing).
std::vector<std::string> blob_list(conformance::backend& b, const std::string& tenant) {
  auto l = b.rt().blobs()->list(tenant);
  REQUIRE(l.has_value());
  std::vector<std::string> v = *l;
  std::sort(v.begin(), v.end());
  return v;
}

/// Checks a refusal: `invalid_request`, the message starts with `field` + ": ", is short,
/// valid UTF-8 without control characters, names no host path, and nothing ran.
void check_refused(const sandbox::run_result& r, const std::string& field) {
  CHECK(r.code == code::invalid_request);
  CHECK(r.message.rfind(field + ": ", 0) == 0);
  CHECK(r.message.size() <= 512);
  CHECK(sandbox::is_valid_utf8(r.message));
  CHECK(std::none_of(r.message.begin(), r.message.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }));
  CHECK(r.message.find(conformance::state_root().string()) == std::string::npos);
  CHECK(r.message.find("/var/lib") == std::string::npos);
  // Nothing ran: no streams, no outputs, no usage, no exit status.
  CHECK(r.std_out.blob.empty());
  CHECK(r.std_err.blob.empty());
  CHECK(r.files_out.empty());
  CHECK(r.files_dropped.empty());
  CHECK(!r.exit_code.has_value());
  CHECK(r.usage.wall.count() == 0);
  CHECK(r.usage.peak_memory_bytes == 0);
  CHECK(r.egress_attempts.empty());
}

sandbox::run_request with_files(std::vector<sandbox::input_file> files) {
  auto req = py("print('must not run')");
  req.files_in = std::move(files);
  return req;
}

/// A JSON string literal for raw bytes, escaping only '"' and '\' (so raw control and
/// invalid bytes stay raw, as a hostile client would send them).
std::string raw_json_string(const std::string& bytes) {
  std::string out = "\"";
  for (char c : bytes) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

TEST_CASE("requests: traversal and odd bytes in files_in names are refused, naming the entry",
          "[requests][core]") {
  CONFORMANCE_BACKEND(b);
  const std::string tenant = "conformance-requests";
  const std::string id = b.put("input bytes", tenant);
  const auto blobs_before = blob_list(b, tenant);
  const std::string bad_names[] = {
      "",
      ".",
      "..",
      "../../etc/passwd",
      "/etc/passwd",
      "a/b",
      "./x",
      "x/",
      "a\0b"s,
      "\0"s,
      "a\nb",
      "\r",
      "\t",
      "\x1b[31mred",  // terminal escape
      "a\x7f",        // DEL
      "a\xc2\x85"
      "b",  // U+0085 NEXT LINE (C1)
      "\xff",
      "\xfe\xff",
      "..\xc0\xaf"
      "etc",               // overlong '/'
      "\xc0\xae\xc0\xae",  // overlong ".."
      "\xe0\x80\xaf",      // overlong '/', 3 bytes
      "\xed\xa0\x80",      // a surrogate
      "\xf4\x90\x80\x80",  // above U+10FFFF
      "\xe2\x82",          // truncated sequence
      "\xcd\xb8",          // U+0378, unassigned
      std::string(256, 'n'),
      std::string(4096, 'n'),
      std::string(4096, '/'),
      std::string(1 << 20, 'n'),  // 1 MiB
  };
  for (const auto& name : bad_names) {
    INFO("name: " << sandbox::escape_for_display(name.substr(0, 80)));
    // At the third position: the message must name that entry, not the first one.
    auto r = b.run(with_files({{.name = "a.txt", .blob = id},
                               {.name = "b.txt", .blob = id},
                               {.name = name, .blob = id}}),
                   tenant);
    check_refused(r, "files_in[2].name");
    // And first, alone.
    check_refused(b.run(with_files({{.name = name, .blob = id}}), tenant), "files_in[0].name");
  }
  CHECK(blob_list(b, tenant) == blobs_before);
}

TEST_CASE("requests: malformed, percent-encoded and relative blob ids are refused",
          "[requests][core]") {
  CONFORMANCE_BACKEND(b);
  const std::string tenant = "conformance-requests";
  const std::string id = b.put("input bytes", tenant);
  const auto blobs_before = blob_list(b, tenant);
  const std::string bad_ids[] = {
      "",
      "sha256:",
      "sha256:" + hex64.substr(1),
      "sha256:" + hex64 + "e",
      "sha256:" + std::string(64, 'E'),
      "SHA256:" + hex64,
      "sha512:" + hex64 + hex64,
      "sha256-" + hex64,
      " sha256:" + hex64,
      "sha256:" + hex64 + "\n",
      "sha256:" + hex64 + "\0"s,
      "sha256%3a" + hex64,
      "sha256%3A" + hex64,
      "sha256:" + hex64.substr(3) + "%65",
      "sha256:" + hex64.substr(1) + "g",
      "sha256:" + std::string(64, '.'),
      "sha256:../../../../../etc/passwd",
      "sha256:" + hex64.substr(10) + "/../../../..",
      "../blobs/" + id,
      "./" + id,
      id + "/",
      "/var/lib/agent-sandbox/blobs/tenants/" + tenant + "/" + id.substr(7),
      "file:///etc/passwd",
      "blob:" + id,
      id.substr(7),                             // the hex alone
      "sha256:\xef\xbc\x91" + hex64.substr(3),  // a full-width digit
  };
  for (const auto& bad : bad_ids) {
    INFO("blob: " << sandbox::escape_for_display(bad));
    auto r =
        b.run(with_files({{.name = "ok.txt", .blob = id}, {.name = "x", .blob = bad}}), tenant);
    check_refused(r, "files_in[1].blob");
  }
  CHECK(blob_list(b, tenant) == blobs_before);
}

TEST_CASE("requests: 100,000 entries and over-long names are refused at once, briefly",
          "[requests][core]") {
  CONFORMANCE_BACKEND(b);
  const std::string tenant = "conformance-requests";
  const std::string id = b.put("input bytes", tenant);
  const auto blobs_before = blob_list(b, tenant);
  const std::string limit = std::to_string(b.rt().policy().max_input_files);
  {
    // 100,000 well-formed, distinct entries: the count alone refuses them.
    std::vector<sandbox::input_file> files;
    for (int i = 0; i < 100000; ++i) files.push_back({.name = fmt::format("f{}", i), .blob = id});
    auto r = b.run(with_files(files), tenant);
    check_refused(r, "files_in");
    CHECK(r.message == "files_in: 100000 entries, more than the limit of " + limit);
  }
  {
    // 100,000 hostile entries: still the count, and no per-entry message.
    std::vector<sandbox::input_file> files(100000,
                                           sandbox::input_file{.name = "../../x", .blob = "../y"});
    auto r = b.run(with_files(files), tenant);
    check_refused(r, "files_in");
  }
  {
    // One over the limit.
    std::vector<sandbox::input_file> files;
    for (std::uint32_t i = 0; i <= b.rt().policy().max_input_files; ++i) {
      files.push_back({.name = fmt::format("f{}", i), .blob = id});
    }
    check_refused(b.run(with_files(files), tenant), "files_in");
  }
  {
    // 4 KiB names: refused, and never echoed.
    auto r = b.run(with_files({{.name = std::string(4096, 'x'), .blob = id}}), tenant);
    check_refused(r, "files_in[0].name");
    CHECK(r.message.find("xxxxxxxxxxxxxxxx") == std::string::npos);
  }
  CHECK(blob_list(b, tenant) == blobs_before);
}

TEST_CASE("requests: names equal under Unicode normalisation never both reach the sandbox",
          "[requests][core]") {
  CONFORMANCE_BACKEND(b);
  const std::string tenant = "conformance-requests";
  const std::string id = b.put("input bytes", tenant);
  struct pair_case {
    std::string first, second;
    std::string field;  // the entry the message must name
  };
  const pair_case pairs[] = {
      {"caf\xc3\xa9", "cafe\xcc\x81", "files_in[1].name"},  // é precomposed, decomposed
      {"cafe\xcc\x81", "caf\xc3\xa9", "files_in[0].name"},  // the other order
      {"caf\xc3\xa9", "caf\xc3\xa9", "files_in[1].name"},   // byte-identical
      {"\xc3\x85", "\xe2\x84\xab", "files_in[1].name"},     // Å and U+212B ANGSTROM SIGN
      {"\xe2\x84\xab", "\xc3\x85", "files_in[0].name"},
      {"\xea\xb0\x80", "\xe1\x84\x80\xe1\x85\xa1", "files_in[1].name"},  // 가 and its jamo
      {"\xe2\x84\xa6", "\xce\xa9", "files_in[0].name"},                  // U+2126 OHM SIGN and Ω
      // Combining marks in canonical order (ccc 220, 230) vs the same marks reordered.
      {"x\xcc\x96\xd2\x83", "x\xd2\x83\xcc\x96", "files_in[1].name"},
  };
  for (const auto& p : pairs) {
    INFO(sandbox::escape_for_display(p.first) << " / " << sandbox::escape_for_display(p.second));
    auto r =
        b.run(with_files({{.name = p.first, .blob = id}, {.name = p.second, .blob = id}}), tenant);
    check_refused(r, p.field);
  }
}

TEST_CASE("requests: odd but harmless names are placed exactly as named, nothing else",
          "[requests][core]") {
  CONFORMANCE_BACKEND(b);
  const std::string tenant = "conformance-requests";
  // Each name gets its own content, so a merge or a mix-up shows.
  const std::vector<std::string> names = {
      "%2e%2e%2fetc%2fpasswd",  // percent signs are ordinary characters
      "..\\..\\evil",           // so are backslashes
      "-rf",
      "~",
      "...",
      " lead and trail ",
      "A",
      "a",               // differs only in case from "A"
      "\xef\xac\x81le",  // "ﬁle": equal to "file" only under NFKC
      "file",
      "caf\xc3\xa9",
      std::string(255, 'n'),
  };
  sandbox::run_request req = py(R"PY(
import os, json
d = os.environb[b'SANDBOX_INPUT_DIR']
out = {}
for n in sorted(os.listdir(d)):
    p = os.path.join(d, n)
    out[n.hex()] = [open(p, 'rb').read().hex(), os.path.islink(p), os.path.isfile(p)]
try:
    parent = [n.hex() for n in os.listdir(os.path.dirname(d))]
except PermissionError:
    parent = 'unlistable'
print(json.dumps({'files': out, 'parent': parent, 'self': os.path.basename(d).hex()}))
)PY");
  std::map<std::string, std::string> expect;  // hex name → hex content
  auto to_hex = [](const std::string& s) {
    std::string h;
    for (unsigned char c : s) h += fmt::format("{:02x}", c);
    return h;
  };
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string content = fmt::format("content of input {}", i);
    req.files_in.push_back({.name = names[i], .blob = b.put(content, tenant)});
    expect[to_hex(names[i])] = to_hex(content);
  }
  auto r = b.run(req, tenant);
  REQUIRE(r.code == code::ok);
  auto j = nlohmann::json::parse(b.blob(r.std_out.blob, tenant));
  std::map<std::string, std::string> seen;
  for (auto& [name, v] : j["files"].items()) {
    seen[name] = v[0].get<std::string>();
    CHECK(v[1] == false);  // never a link
    CHECK(v[2] == true);   // a regular file
  }
  CHECK(seen == expect);
  // Nothing beside the input directory either (where its parent can be listed at all).
  if (j["parent"] != "unlistable") CHECK(j["parent"] == nlohmann::json::array({j["self"]}));
}

TEST_CASE("requests: the wire forms are refused by the decoder or admission, naming the field",
          "[requests][core]") {
  CONFORMANCE_BACKEND(b);
  const std::string tenant = "conformance-requests";
  const std::string id = b.put("input bytes", tenant);
  const auto blobs_before = blob_list(b, tenant);
  // A request whose files_in is `entries` (raw JSON text).
  auto doc = [](const std::string& entries) {
    return R"J({"v":1,"runtime":"python3","source":"print(1)","files_in":)J" + entries + "}";
  };
  auto entry = [&](const std::string& name_json, const std::string& blob_json) {
    return R"({"name":)" + name_json + R"(,"blob":)" + blob_json + "}";
  };
  const std::string good = entry(R"("ok.txt")", "\"" + id + "\"");
  struct wire_case {
    std::string label;
    std::string json;
    std::string field;
  };
  std::vector<wire_case> cases = {
      {"escaped traversal",
       doc("[" +
           entry(R"("\u002e\u002e\u002f\u002e\u002e\u002fetc\u002fpasswd")", "\"" + id + "\"") +
           "]"),
       "files_in[0].name"},
      {"escaped NUL", doc("[" + good + "," + entry(R"("a\u0000b")", "\"" + id + "\"") + "]"),
       "files_in[1].name"},
      {"escaped newline", doc("[" + entry(R"("a\nb")", "\"" + id + "\"") + "]"),
       "files_in[0].name"},
      {"escaped ESC", doc("[" + entry(R"("\u001b[2J")", "\"" + id + "\"") + "]"),
       "files_in[0].name"},
      {"escaped C1", doc("[" + entry(R"("a\u0085")", "\"" + id + "\"") + "]"), "files_in[0].name"},
      {"escaped decomposed é",
       doc("[" + entry(R"("caf\u00e9")", "\"" + id + "\"") + "," +
           entry(R"("cafe\u0301")", "\"" + id + "\"") + "]"),
       "files_in[1].name"},
      {"escaped Angstrom sign", doc("[" + entry(R"("\u212b")", "\"" + id + "\"") + "]"),
       "files_in[0].name"},
      {"raw invalid byte",
       doc("[" + good + "," + entry(raw_json_string("a\xff"), "\"" + id + "\"") + "]"),
       "files_in[1].name"},
      {"raw overlong slash",
       doc("[" +
           entry(raw_json_string("..\xc0\xaf"
                                 "etc"),
                 "\"" + id + "\"") +
           "]"),
       "files_in[0].name"},
      {"raw surrogate", doc("[" + entry(raw_json_string("\xed\xa0\x80"), "\"" + id + "\"") + "]"),
       "files_in[0].name"},
      {"raw NUL byte", doc("[" + entry(raw_json_string("a\0b"s), "\"" + id + "\"") + "]"),
       "files_in[0].name"},
      {"raw newline", doc("[" + entry(raw_json_string("a\nb"), "\"" + id + "\"") + "]"),
       "files_in[0].name"},
      {"lone surrogate escape", doc("[" + entry(R"("\ud800")", "\"" + id + "\"") + "]"),
       "files_in[0].name"},
      {"bad escape", doc("[" + good + "," + entry(R"("\x2e\x2e")", "\"" + id + "\"") + "]"),
       "files_in[1].name"},
      {"name not a string", doc("[" + entry("123", "\"" + id + "\"") + "]"), "files_in[0].name"},
      {"name an array", doc("[" + entry(R"(["..","etc"])", "\"" + id + "\"") + "]"),
       "files_in[0].name"},
      {"name missing", doc(R"([{"blob":")" + id + R"("}])"), "files_in[0].name"},
      {"extra path field", doc(R"([{"name":"x","blob":")" + id + R"(","path":"/etc/passwd"}])"),
       "files_in[0]"},
      {"duplicate name key", doc(R"([{"name":"x","name":"../x","blob":")" + id + R"("}])"),
       "files_in[0]"},
      {"files_in a string", doc(R"("/etc/passwd")"), "files_in"},
      {"files_in an object", doc(R"({"name":"x","blob":")" + id + R"("})"), "files_in"},
      {"percent-encoded blob id", doc("[" + entry(R"("x")", "\"sha256%3A" + hex64 + "\"") + "]"),
       "files_in[0].blob"},
      {"percent-encoded digit",
       doc("[" + entry(R"("x")", "\"sha256:" + hex64.substr(3) + "%65\"") + "]"),
       "files_in[0].blob"},
      {"relative blob id",
       doc("[" + good + "," + entry(R"("x")", R"("..\/blobs\/)" + id + "\"") + "]"),
       "files_in[1].blob"},
      {"absolute blob path",
       doc("[" + entry(R"("x")", R"("/var/lib/agent-sandbox/blobs/)" + hex64 + "\"") + "]"),
       "files_in[0].blob"},
      {"blob with escaped NUL", doc("[" + entry(R"("x")", "\"" + id + R"(\u0000")") + "]"),
       "files_in[0].blob"},
      {"blob not a string", doc("[" + entry(R"("x")", "{}") + "]"), "files_in[0].blob"},
      {"4 KiB name", doc("[" + entry("\"" + std::string(4096, 'n') + "\"", "\"" + id + "\"") + "]"),
       "files_in[0].name"},
  };
  {
    // 100,000 entries on the wire (2.4 MB: within the decoder's document cap, so the count
    // rule is what refuses it).
    std::string entries = "[";
    for (int i = 0; i < 100000; ++i) entries += (i ? "," : "") + entry(R"("a")", R"("b")");
    cases.push_back({"100,000 entries", doc(entries + "]"), "files_in"});
  }
  for (const auto& c : cases) {
    INFO(c.label);
    auto decoded = sandbox::decode_run_request(c.json);
    if (!decoded.has_value()) {
      // Refused on the wire.
      const auto& rej = decoded.error();
      INFO("decoder: " << rej.message);
      CHECK(rej.code == code::invalid_request);
      CHECK(rej.message.rfind(c.field + ": ", 0) == 0);
      CHECK(rej.message.size() <= 512);
      CHECK(sandbox::is_valid_utf8(rej.message));
      continue;
    }
    // Decoded: the runtime must refuse it, as for a C++ caller.
    auto r = b.run(*decoded, tenant);
    check_refused(r, c.field);
  }
  CHECK(blob_list(b, tenant) == blobs_before);
}
