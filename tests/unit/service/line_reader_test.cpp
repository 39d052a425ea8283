// Unit tests of the daemon's line framing (service/line_reader.hpp): lines split across
// reads, over-long lines dropped as they stream in (never buffered) and reported once with
// their leading id, the end of input.
#include "service/line_reader.hpp"

#include <catch2/catch.hpp>
#include <optional>
#include <string>
#include <vector>

using sandbox::service::line_event;
using sandbox::service::line_reader;

namespace {

constexpr std::size_t max_line = 32;

/// Every event `next` gives until `none`, as text: "L:<line>" or "T:<id or ->".
std::vector<std::string> drain(line_reader& r) {
  std::vector<std::string> out;
  for (;;) {
    auto e = r.next();
    if (e.what == line_event::kind::none) break;
    if (e.what == line_event::kind::line) {
      out.push_back("L:" + std::string(e.text));
    } else {
      out.push_back("T:" + e.id.value_or("-"));
    }
  }
  r.compact();
  return out;
}

}  // namespace

TEST_CASE("line_reader: lines split across reads come out whole, in order",
          "[service][line_reader]") {
  line_reader r(max_line, 128, 16);
  r.append("{\"id\":\"a\"}\n{\"id\"");
  CHECK(drain(r) == std::vector<std::string>{"L:{\"id\":\"a\"}"});
  CHECK(r.has_pending());  // the start of the second line
  r.append(":\"b\"}\n\n");
  CHECK(drain(r) == std::vector<std::string>{"L:{\"id\":\"b\"}", "L:"});
  CHECK_FALSE(r.has_pending());
}

TEST_CASE("line_reader: a line over the limit is reported once, with its leading id",
          "[service][line_reader]") {
  line_reader r(max_line, 128, 16);
  SECTION("whole in one read") {
    r.append(R"({"id":"big","x":")" + std::string(40, 'x') + "\"}\nnext\n");
    CHECK(drain(r) == std::vector<std::string>{"T:big", "L:next"});
  }
  SECTION("exactly at the limit is still a line") {
    const std::string line(max_line, 'y');
    r.append(line + "\n");
    CHECK(drain(r) == std::vector<std::string>{"L:" + line});
  }
  SECTION("streamed: its bytes are dropped as they come, never buffered") {
    r.append(R"({"id":"s1","data":")");
    CHECK(drain(r).empty());
    r.append(std::string(100, 'z'));  // now over the limit without a newline
    CHECK(drain(r).empty());
    CHECK_FALSE(r.has_pending());      // nothing of it is kept
    r.append(std::string(1000, 'z'));  // dropped at the next look, up to a newline
    CHECK(drain(r).empty());
    CHECK_FALSE(r.has_pending());
    r.append("\"}\n{\"id\":\"s2\"}\n");
    CHECK(drain(r) == std::vector<std::string>{"T:s1", "L:{\"id\":\"s2\"}"});
  }
  SECTION("without a readable id") {
    r.append(std::string(50, 'q') + "\n");
    CHECK(drain(r) == std::vector<std::string>{"T:-"});
  }
}

TEST_CASE("line_reader: the end of input ends the last line and an over-long one",
          "[service][line_reader]") {
  line_reader r(max_line, 128, 16);
  SECTION("a last line without its newline counts") {
    r.append("last");
    CHECK(drain(r).empty());
    r.end_input();
    CHECK(drain(r) == std::vector<std::string>{"L:last"});
  }
  SECTION("an over-long line being dropped is reported") {
    r.append(R"({"id":"cut",)" + std::string(64, ' '));
    CHECK(drain(r).empty());
    r.end_input();
    CHECK(drain(r) == std::vector<std::string>{"T:cut"});
  }
  SECTION("nothing buffered: nothing comes") {
    r.end_input();
    CHECK(drain(r).empty());
  }
}

TEST_CASE("line_reader: compaction and clear keep positions right", "[service][line_reader]") {
  line_reader r(max_line, 128, 4);
  for (int i = 0; i < 20; ++i) r.append("l" + std::to_string(i) + "\n");
  r.append("tail");
  auto lines = drain(r);
  REQUIRE(lines.size() == 20);
  CHECK(lines.front() == "L:l0");
  CHECK(lines.back() == "L:l19");
  r.append("-end\n");
  CHECK(drain(r) == std::vector<std::string>{"L:tail-end"});
  r.append("dropped");
  r.clear();
  CHECK_FALSE(r.has_pending());
  r.append("after\n");
  CHECK(drain(r) == std::vector<std::string>{"L:after"});
}
