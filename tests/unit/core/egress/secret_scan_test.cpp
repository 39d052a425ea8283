// Finding a run's secret placeholders (core/egress/secret_scan.hpp): by their random mark,
// whatever the case, the prefix, dots between DNS labels or where a stream was cut.
#include "core/egress/secret_scan.hpp"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

using namespace sandbox::detail;

namespace {
const std::string placeholder = "sbx-secret-00112233445566778899aabbccddeeff";
const std::string mark = "00112233445566778899aabbccddeeff";
}  // namespace

TEST_CASE("secret scan: marks are the placeholders' random parts, lower case", "[secrets]") {
  const auto marks = placeholder_marks(std::vector<std::string>{placeholder, "SHORT"});
  CHECK(marks == std::vector<std::string>{mark, "short"});
  CHECK(holds_placeholder("x=" + placeholder, marks));
  CHECK(holds_placeholder("X=00112233445566778899AABBCCDDEEFF;", marks));
  CHECK_FALSE(holds_placeholder("00112233445566778899aabbccddeef", marks));  // one short
  CHECK_FALSE(holds_placeholder("", marks));
  CHECK_FALSE(holds_placeholder(placeholder, std::vector<std::string>{}));
}

TEST_CASE("secret scan: DNS names are judged without their dots", "[secrets]") {
  const auto marks = placeholder_marks(std::vector<std::string>{placeholder});
  CHECK(dns_name_holds_placeholder(mark + ".evil.example", marks));
  CHECK(dns_name_holds_placeholder("0011223344556677.8899AABBCCDDEEFF.evil.example", marks));
  CHECK(dns_name_holds_placeholder(
      "0.0.1.1.2.2.3.3.4.4.5.5.6.6.7.7.8.8.9.9.a.a.b.b.c.c.d.d.e.e.f.f", marks));
  CHECK_FALSE(dns_name_holds_placeholder("api.example.com", marks));
}

TEST_CASE("secret scan: a stream finds a mark cut at any point, and stays found", "[secrets]") {
  const std::string text = "prefix " + placeholder + " suffix";
  for (std::size_t cut = 0; cut <= text.size(); ++cut) {
    CAPTURE(cut);
    placeholder_scanner s(placeholder_marks(std::vector<std::string>{placeholder}));
    const bool first = s.feed(std::string_view(text).substr(0, cut));
    const bool second = s.feed(std::string_view(text).substr(cut));
    CHECK((first || second));
    CHECK(s.found());
    CHECK(s.feed("clean"));
  }
  // Byte by byte, too.
  placeholder_scanner s(placeholder_marks(std::vector<std::string>{placeholder}));
  bool found = false;
  for (char c : text) found = s.feed(std::string_view(&c, 1)) || found;
  CHECK(found);
  placeholder_scanner clean(placeholder_marks(std::vector<std::string>{placeholder}));
  CHECK_FALSE(clean.feed(std::string(100000, 'a')));
  CHECK_FALSE(clean.feed(mark.substr(0, 31)));
  CHECK_FALSE(clean.found());
  CHECK(placeholder_scanner({}).empty());
}
