// HTTP/1.1 inside a terminated tunnel (core/egress/terminated_http.hpp): the value goes only
// into its header to its domains, a placeholder anywhere else is refused, ambiguous framing is
// refused, and an echoed value never reaches the client, however the stream is cut.
#include "core/egress/terminated_http.hpp"

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

using namespace sandbox::detail;

namespace {

const std::string placeholder = "sbx-secret-00112233445566778899aabbccddeeff";
const std::string value = "real-VALUE-0123456789";

std::vector<secret_injection> secrets() {
  return {secret_injection{.placeholder = placeholder,
                           .value = std::make_shared<const std::string>(value),
                           .domains = {"api.example.com"},
                           .header_name = "Authorization",
                           .header_template = "Bearer {value}"}};
}

struct fed {
  std::optional<http_refusal> refusal;
  std::string out;
};

fed client(terminated_http& t, std::string_view bytes) {
  fed f;
  f.refusal = t.from_client(bytes, f.out);
  return f;
}

std::string get(std::string_view host, std::string_view extra = "") {
  return "GET /v1/rates HTTP/1.1\r\nHost: " + std::string(host) + "\r\n" + std::string(extra) +
         "\r\n";
}

}  // namespace

TEST_CASE("terminated http: the value goes into its header, to its domain only", "[secrets]") {
  terminated_http t("api.example.com", secrets());
  auto f = client(t, get("api.example.com", "Authorization: Bearer " + placeholder + "\r\n"));
  REQUIRE_FALSE(f.refusal);
  CHECK(f.out.find("Authorization: Bearer " + value + "\r\n") != std::string::npos);
  CHECK(f.out.find(placeholder) == std::string::npos);
  CHECK(t.awaiting_response());

  // The same header to another name (the tunnel's host) is misuse.
  terminated_http other("other.example.com", secrets());
  f = client(other, get("other.example.com", "Authorization: Bearer " + placeholder + "\r\n"));
  REQUIRE(f.refusal);
  CHECK(f.refusal->status == 403);
  CHECK(f.refusal->reason == "secret_misuse");
  CHECK(f.out.empty());
}

TEST_CASE("terminated http: a placeholder anywhere else is refused", "[secrets]") {
  const std::vector<std::string> requests = {
      "GET /x?k=" + placeholder + " HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
      "GET /" + placeholder.substr(11) + " HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
      get("api.example.com", "X-Key: " + placeholder + "\r\n"),
      get("api.example.com", "Authorization: Basic " + placeholder + "\r\n"),
      get("api.example.com", "Authorization: Bearer " + placeholder + "x\r\n"),
      "POST / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 43\r\n\r\n" + placeholder,
      "POST / HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n"
      "10\r\n" +
          placeholder.substr(0, 16) + "\r\n1b\r\n" + placeholder.substr(16) + "\r\n0\r\n\r\n",
  };
  for (const auto& r : requests) {
    CAPTURE(r);
    terminated_http t("api.example.com", secrets());
    const auto f = client(t, r);
    REQUIRE(f.refusal);
    CHECK(f.refusal->reason == "secret_misuse");
    CHECK(f.out.find(value) == std::string::npos);
  }
}

TEST_CASE("terminated http: ambiguous or unsupported requests are refused", "[secrets]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"POST / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 1\r\n"
       "Transfer-Encoding: chunked\r\n\r\n",
       "malformed request"},
      {"GET / HTTP/1.1\r\nHost: api.example.com\r\nX: a\r\n b\r\n\r\n", "malformed request"},
      {"POST / HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
       "malformed request"},
      {"POST / HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n"
       "1;ext=1\r\n",
       "malformed request"},
      {"POST / HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n"
       "1\r\nab\r\n",
       "malformed request"},
      {"POST / HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: gzip\r\n\r\n",
       "unsupported request"},
      {"GET / HTTP/1.1\r\nHost: other.example.com\r\n\r\n", "malformed request"},
      {"GET / HTTP/1.0\r\nHost: api.example.com\r\n\r\n", "unsupported request"},
      {"GET http://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
       "malformed request"},
      {"GET / HTTP/1.1\r\nHost: api.example.com\r\nUpgrade: websocket\r\n\r\n",
       "unsupported request"},
      {"GET / HTTP/1.1\r\nHost: api.example.com\r\n" + std::string(20000, 'a'),
       "malformed request"},
  };
  for (const auto& [request, reason] : cases) {
    CAPTURE(request.substr(0, 200));
    terminated_http t("api.example.com", secrets());
    const auto f = client(t, request);
    REQUIRE(f.refusal);
    CHECK(f.refusal->reason == reason);
    // Refused stays refused.
    std::string out;
    CHECK(t.from_client(get("api.example.com"), out));
  }
}

TEST_CASE("terminated http: kept-alive requests, bodies framed both ways, cut anywhere",
          "[secrets]") {
  const std::string stream =
      get("api.example.com", "Authorization: Bearer " + placeholder + "\r\n") +
      "POST /a HTTP/1.1\r\nHost: api.example.com:443\r\nContent-Length: 5\r\n\r\nhello" +
      "POST /b HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n"
      "3\r\nabc\r\nA\r\n0123456789\r\n0\r\n\r\n" +
      get("api.example.com");
  std::string whole;
  {
    terminated_http t("api.example.com", secrets());
    REQUIRE_FALSE(t.from_client(stream, whole));
  }
  CHECK(whole.find("Authorization: Bearer " + value) != std::string::npos);
  CHECK(whole.find("hello") != std::string::npos);
  CHECK(whole.find("3\r\nabc\r\nA\r\n0123456789\r\n0\r\n\r\n") != std::string::npos);
  for (std::size_t cut = 0; cut <= stream.size(); ++cut) {
    CAPTURE(cut);
    terminated_http t("api.example.com", secrets());
    std::string out;
    REQUIRE_FALSE(t.from_client(std::string_view(stream).substr(0, cut), out));
    REQUIRE_FALSE(t.from_client(std::string_view(stream).substr(cut), out));
    CHECK(out == whole);
  }
}

TEST_CASE("redaction: the value is replaced wherever the stream is cut", "[secrets]") {
  const std::string text = "a" + value + "bb" + value + value + "c" + value.substr(0, 5);
  std::string expected =
      "a" + placeholder + "bb" + placeholder + placeholder + "c" + value.substr(0, 5);
  for (std::size_t cut = 0; cut <= text.size(); ++cut) {
    for (std::size_t cut2 = cut; cut2 <= text.size(); cut2 += 3) {
      echo_redactor r(secrets());
      std::string out;
      r.feed(std::string_view(text).substr(0, cut), out);
      r.feed(std::string_view(text).substr(cut, cut2 - cut), out);
      r.feed(std::string_view(text).substr(cut2), out);
      r.finish(out);
      REQUIRE(out == expected);
    }
  }
  // Byte by byte.
  echo_redactor r(secrets());
  std::string out;
  for (const char c : text) r.feed(std::string_view(&c, 1), out);
  r.finish(out);
  CHECK(out == expected);
}

TEST_CASE("terminated http: responses are redacted in head and body, re-framed chunked",
          "[secrets]") {
  const std::vector<std::string> responses = {
      "HTTP/1.1 200 OK\r\nX-Echo: " + value +
          "\r\nContent-Length: " + std::to_string(value.size() + 4) + "\r\n\r\nabc" + value + "d",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n" + value.substr(0, 5) +
          "\r\n10\r\n" + value.substr(5) + "\r\n0\r\nTrailer: x\r\n\r\n",
      "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + value,
  };
  for (const auto& response : responses) {
    CAPTURE(response);
    for (std::size_t cut = 0; cut <= response.size(); ++cut) {
      CAPTURE(cut);
      terminated_http t("api.example.com", secrets());
      std::string up;
      REQUIRE_FALSE(t.from_client(get("api.example.com"), up));
      std::string out;
      auto r1 = t.from_origin(std::string_view(response).substr(0, cut), out);
      REQUIRE_FALSE(r1);
      auto r2 = t.from_origin(std::string_view(response).substr(cut), out);
      REQUIRE_FALSE(r2);
      REQUIRE(t.origin_closed(out));
      CHECK(out.find(value) == std::string::npos);
      CHECK(out.find(placeholder) != std::string::npos);
      CHECK(out.find("Transfer-Encoding: chunked\r\n") != std::string::npos);
      CHECK(out.ends_with("0\r\n\r\n"));
      CHECK_FALSE(t.awaiting_response());
    }
  }
}

TEST_CASE("terminated http: HEAD and 204 have no body; unsolicited or broken responses fail",
          "[secrets]") {
  terminated_http t("api.example.com", secrets());
  std::string up;
  REQUIRE_FALSE(t.from_client("HEAD / HTTP/1.1\r\nHost: api.example.com\r\n\r\n", up));
  std::string out;
  REQUIRE_FALSE(t.from_origin("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", out));
  CHECK(out == "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n");
  CHECK_FALSE(t.awaiting_response());
  CHECK(t.from_origin("HTTP/1.1 200 OK\r\n\r\n", out));  // nothing was asked

  for (const std::string bad :
       {"HTTP/2 200 OK\r\n\r\n", "HTTP/1.1 20 OK\r\n\r\n", "HTTP/1.1 200 OK\r\nA: b\r\n c\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nxyz\r\n",
        "HTTP/1.1 101 Switching\r\n\r\n"}) {
    terminated_http u("api.example.com", secrets());
    REQUIRE_FALSE(u.from_client(get("api.example.com"), up));
    std::string o;
    CHECK(u.from_origin(bad, o));
  }
}

TEST_CASE("terminated http: random bytes neither crash nor grow without bound", "[secrets]") {
  std::mt19937 rng(19);
  const std::string alphabet =
      "GET /HTTP1.\r\n:chunkedTransfer-EncodingContent-Length0123456789aZ ";
  for (int round = 0; round < 2000; ++round) {
    terminated_http t("api.example.com", secrets());
    std::string up;
    std::string down;
    for (int piece = 0; piece < 8; ++piece) {
      std::string bytes(rng() % 512, '\0');
      for (auto& c : bytes) {
        c = rng() % 4 == 0 ? static_cast<char>(rng() % 256) : alphabet[rng() % alphabet.size()];
      }
      if (t.from_client(bytes, up)) break;
      (void)t.from_origin(bytes, down);
    }
    CHECK(up.size() < 8 * 512 + 64);
    CHECK(down.size() < 8 * 2 * 512 + 256);
  }
}

TEST_CASE("terminated http: a small request leaves only once judged whole", "[secrets]") {
  terminated_http t("api.example.com", secrets());
  std::string out;
  REQUIRE_FALSE(
      t.from_client("POST / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 45\r\n\r\n", out));
  CHECK(out.empty());  // the head waits for its body
  const auto refusal = t.from_client("k=" + placeholder, out);
  REQUIRE(refusal);
  CHECK(refusal->reason == "secret_misuse");
  CHECK(out.empty());  // nothing of it went upstream
  CHECK(t.can_answer_refusal());

  terminated_http ok("api.example.com", secrets());
  REQUIRE_FALSE(ok.from_client(
      "POST / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 3\r\n\r\nab", out));
  CHECK(out.empty());
  REQUIRE_FALSE(ok.from_client("c", out));
  CHECK(out == "POST / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 3\r\n\r\nabc");
}
