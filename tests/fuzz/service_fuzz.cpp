// Fuzz target for the daemon's line protocol (service/line_reader.hpp, line_protocol.hpp;
// libFuzzer interface, replayed and mutated under g++ by tests/fuzz/replay_main.cpp).
//
// An input is a client's byte stream. Its first byte picks how the stream arrives (chunk
// sizes, and a small line limit so over-long lines are common); the rest is split into lines
// by `line_reader` and every line goes through `read_request_line` and the operation's own
// reader, exactly as a connection does. Checked for every input:
//   - framing: the lines and over-long events are exactly those of a plain split of the
//     stream on '\n' (a last line without newline counts at end of input), whatever the
//     chunking; no line holds a newline or exceeds the limit; an over-long line's id is the
//     one `leading_id` reads from its first bytes;
//   - answers: every refusal is one JSON line (valid UTF-8, one newline at its end) with an
//     `id` that is null or a string, and an `error` whose code is one of the protocol's
//     codes and whose message is short display text — or a `result` answer; an id in flight
//     is never echoed;
//   - reads: a `blob_put`'s data is within its cap, base64 decoding is canonical (what
//     decodes re-encodes to the same text), a session name is returned as sent.
// A failure prints what broke and aborts (replay_main saves the input).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "protocol/base64url.hpp"
#include "sandbox/code.hpp"
#include "sandbox/json.hpp"
#include "sandbox/signed_ticket.hpp"
#include "service/line_protocol.hpp"
#include "service/line_reader.hpp"

namespace svc = sandbox::service;
using nlohmann::json;

namespace {

[[noreturn]] void fail(const char* what, std::string_view detail = {}) {
  std::fprintf(stderr, "service_fuzz: %s: %.*s\n", what,
               static_cast<int>(detail.size() > 600 ? 600 : detail.size()), detail.data());
  std::abort();
}

/// A code an answer may carry: the run codes (sandbox/code.hpp) and the daemon's own error
/// codes (docs/protocol.md, "Service mode": errors).
bool known_code(const std::string& c) {
  static const std::set<std::string> service_codes = {"too_large", "quota_exceeded",
                                                      "session_not_found", "session_ended"};
  return sandbox::code_from_string(c).has_value() || service_codes.count(c) != 0;
}

void check_text(const std::string& message) {
  if (message.empty() || message.size() > 1024) fail("message size", message);
  if (!sandbox::is_valid_utf8(message)) fail("message is not UTF-8", message);
  for (char c : message) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x20 || b == 0x7F) fail("control character in message", message);
  }
}

/// One answer line: JSON, one newline at the end, an id that is null or a string (never
/// one of `in_flight`), and an error with a known code and clean message, or a result.
void check_answer(const svc::answer& a, const std::set<std::string>& in_flight) {
  const std::string& line = a.line;
  if (line.empty() || line.back() != '\n' || line.find('\n') != line.size() - 1)
    fail("an answer is not exactly one line", line);
  if (!sandbox::is_valid_utf8(line)) fail("an answer is not UTF-8", line);
  json doc;
  try {
    doc = json::parse(line);
  } catch (const json::exception&) {
    fail("an answer is not JSON", line);
  }
  if (!doc.is_object() || !doc.contains("id")) fail("an answer without an id", line);
  const json& id = doc["id"];
  if (!id.is_null() && !id.is_string()) fail("an answer's id is neither null nor a string", line);
  if (id.is_string() && in_flight.count(id.get<std::string>()) != 0)
    fail("an answer echoes an id in flight", line);
  if (doc.contains("error")) {
    const json& e = doc["error"];
    if (!e.is_object() || !e.contains("code") || !e["code"].is_string() || !e.contains("message") ||
        !e["message"].is_string())
      fail("an error answer's shape", line);
    if (!known_code(e["code"].get<std::string>())) fail("an unknown code", line);
    check_text(e["message"].get<std::string>());
  } else if (doc.contains("result")) {
    auto r = sandbox::decode_run_result(doc["result"].dump());
    if (!r) fail("a result answer does not decode", line);
    if (r->code == sandbox::code::ok) fail("a refusal answered ok", line);
    check_text(r->message);
  } else {
    fail("an answer with neither error nor result", line);
  }
}

void check_base64(std::string_view text) {
  if (auto decoded = sandbox::detail::base64_decode(text)) {
    if (sandbox::detail::base64_encode(*decoded) != text) fail("base64 is not canonical", text);
  }
}

const sandbox::ticket_verifier& no_keys() {
  static const sandbox::ticket_verifier v;
  return v;
}

/// One line through the envelope and its operation's reader.
void read_line(std::string_view text, const svc::service_limits& limits,
               const std::set<std::string>& in_flight) {
  auto envelope = svc::read_request_line(text, limits, in_flight);
  if (std::holds_alternative<svc::blank_line>(envelope)) {
    if (text.find_first_not_of(" \t\r") != std::string_view::npos)
      fail("a line with content read as blank", text);
    return;
  }
  if (const auto* a = std::get_if<svc::answer>(&envelope)) return check_answer(*a, in_flight);
  const auto& line = std::get<svc::request_line>(envelope);
  if (line.id.empty() || line.id.size() > limits.max_id_bytes || in_flight.count(line.id) != 0)
    fail("an envelope's id", line.id);
  auto check = [&](const auto& outcome) {
    if (const auto* a = std::get_if<svc::answer>(&outcome)) check_answer(*a, in_flight);
  };
  switch (line.kind) {
    case svc::request_kind::run:
      check(svc::read_run(line, no_keys()));
      break;
    case svc::request_kind::blob_put: {
      auto r = svc::read_blob_put(line, limits);
      check(r);
      if (const auto* put = std::get_if<svc::blob_put_line>(&r)) {
        if (put->data.size() > limits.max_blob_put_bytes) fail("blob_put over its cap");
      }
      break;
    }
    case svc::request_kind::blob_get: {
      auto r = svc::read_blob_get(line);
      check(r);
      if (const auto* get = std::get_if<svc::blob_get_line>(&r)) {
        if (!sandbox::is_valid_blob_id(get->blob)) fail("blob_get accepted a bad id", get->blob);
      }
      break;
    }
    case svc::request_kind::replay:
      check(svc::read_replay(line, no_keys()));
      break;
    case svc::request_kind::session_open:
      check(svc::read_session_open(line, no_keys()));
      break;
    case svc::request_kind::session_write: {
      auto r = svc::read_session_write(line);
      check(r);
      if (line.body.is_object() && line.body.contains("data_b64") &&
          line.body["data_b64"].is_string()) {
        check_base64(line.body["data_b64"].get<std::string>());
      }
      if (const auto* w = std::get_if<svc::session_write_line>(&r)) {
        if (line.body["session"].get<std::string>() != w->session) fail("session name changed");
      }
      break;
    }
    case svc::request_kind::session_close_stdin:
    case svc::request_kind::session_close:
      check(svc::read_session_ref(line));
      break;
    case svc::request_kind::service_stats:
      if (auto a = svc::read_service_stats(line)) check_answer(*a, in_flight);
      break;
  }
}

struct expected_line {
  bool too_long = false;
  std::string text;  // the line (too_long: its first bytes, for the id)
};

/// The stream split on '\n' the plain way: what the reader must produce.
std::vector<expected_line> plain_split(std::string_view stream, std::size_t max_line) {
  std::vector<expected_line> out;
  std::size_t at = 0;
  while (at < stream.size()) {
    std::size_t nl = stream.find('\n', at);
    const std::size_t end = nl == std::string_view::npos ? stream.size() : nl;
    std::string_view line = stream.substr(at, end - at);
    if (line.size() > max_line) {
      out.push_back({true, std::string(line)});
    } else {
      out.push_back({false, std::string(line)});
    }
    at = end + 1;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  const std::string_view stream(reinterpret_cast<const char*>(data + 1), size - 1);

  // The stream arrives in chunks of 1..16 bytes, or whole; lines over a small limit (mode's
  // high bit) or the daemon's default are dropped.
  svc::service_limits limits;
  if ((mode & 0x80) != 0) limits.max_line_bytes = 64 + (mode & 0x3F);
  const std::size_t chunk = (mode & 0x40) != 0 ? 1 + (mode & 0x0F) : stream.size() + 1;
  // Ids "busy" and "x" are in flight, as on a connection with runs going.
  const std::set<std::string> in_flight = {"busy", "x"};

  svc::line_reader reader(limits.max_line_bytes, limits.max_id_bytes, 4096);
  std::vector<expected_line> got;
  auto drain = [&] {
    for (;;) {
      auto ev = reader.next();
      if (ev.what == svc::line_event::kind::none) return;
      if (ev.what == svc::line_event::kind::too_long) {
        got.push_back({true, ev.id.value_or("")});
        continue;
      }
      if (ev.text.find('\n') != std::string_view::npos) fail("a line holds a newline");
      if (ev.text.size() > limits.max_line_bytes) fail("a line over the limit");
      got.push_back({false, std::string(ev.text)});
      read_line(ev.text, limits, in_flight);
      reader.compact();
    }
  };
  for (std::size_t at = 0; at < stream.size(); at += chunk) {
    reader.append(stream.substr(at, chunk));
    drain();
  }
  reader.end_input();
  drain();
  if (reader.has_pending()) fail("bytes left after the end of input");

  const auto want = plain_split(stream, limits.max_line_bytes);
  if (got.size() != want.size()) {
    fail("the reader's lines differ from a plain split",
         std::to_string(got.size()) + " vs " + std::to_string(want.size()));
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i].too_long != want[i].too_long) fail("over-long flag differs", want[i].text);
    if (!want[i].too_long && got[i].text != want[i].text) fail("a line differs", want[i].text);
    if (want[i].too_long) {
      // The reader read the id from what it held when the line crossed the limit: at least
      // the limit and one byte, at most the whole line. An id readable from the shortest
      // prefix must be the one; else none, or the id of the whole line.
      const std::string_view whole = want[i].text;
      const auto least =
          svc::leading_id(whole.substr(0, limits.max_line_bytes + 1), limits.max_id_bytes);
      const auto most = svc::leading_id(whole, limits.max_id_bytes);
      if (least ? got[i].text != *least : !got[i].text.empty() && got[i].text != most.value_or(""))
        fail("an over-long line's id", whole.substr(0, 200));
    }
  }
  // Whatever the stream, base64 decoding of it is canonical.
  check_base64(stream);
  return 0;
}
