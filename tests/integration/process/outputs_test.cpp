// Output collection on sandbox-controlled paths: links, FIFOs, odd names and caps.
#include <catch2/catch.hpp>
#include <map>

#include "integration/harness.hpp"

using sandbox::code;
using sandbox::drop_reason;

TEST_CASE("outputs: only regular files come back; links and FIFOs are dropped, never read",
          "[outputs]") {
  auto r = itest::run(R"PY(
import os
d = os.environ['SANDBOX_OUTPUT_DIR']
open(f'{d}/ok.txt', 'w').write('fine')
os.symlink('/etc/passwd', f'{d}/abs-link')
os.symlink('../main.py', f'{d}/rel-link')
os.symlink('/', f'{d}/root-link')
os.mkfifo(f'{d}/fifo')
os.mkdir(f'{d}/subdir')
os.link(f'{d}/ok.txt', f'{d}/hard.txt')
open(f'{d}/bad\nname', 'w').write('x')
with open(f'{d}/sparse', 'wb') as f: f.truncate((1 << 30) - 1)  # RLIMIT_FSIZE is 1 GiB
)PY");
  REQUIRE(r.code == code::ok);
  std::map<std::string, std::string> got;
  for (auto& f : r.files_out) got[f.name] = itest::blob(f.blob);
  CHECK(got == std::map<std::string, std::string>{{"hard.txt", "fine"}, {"ok.txt", "fine"}});
  std::map<std::string, drop_reason> dropped;
  for (auto& d : r.files_dropped) dropped[d.name_display] = d.reason;
  CHECK(dropped["abs-link"] == drop_reason::not_regular_file);
  CHECK(dropped["rel-link"] == drop_reason::not_regular_file);
  CHECK(dropped["root-link"] == drop_reason::not_regular_file);
  CHECK(dropped["fifo"] == drop_reason::not_regular_file);
  CHECK(dropped["subdir"] == drop_reason::not_regular_file);
  CHECK(dropped["sparse"] == drop_reason::bytes_limit);
  CHECK(dropped.count("bad\\x0aname") == 1);
}

TEST_CASE("outputs: count and byte caps drop the rest, flagged", "[outputs]") {
  sandbox::run_request req;
  req.files_out = {.max_files = 3, .max_bytes = 1000};
  auto r = itest::run(R"PY(
import os
d = os.environ['SANDBOX_OUTPUT_DIR']
for i in range(6): open(f'{d}/f{i}', 'w').write('x' * 100)
open(f'{d}/big', 'w').write('y' * 5000)
)PY",
                      req);
  REQUIRE(r.code == code::ok);
  CHECK(r.files_out.size() == 3);
  int count_dropped = 0, bytes_dropped = 0;
  for (auto& d : r.files_dropped) {
    if (d.reason == drop_reason::count_limit) ++count_dropped;
    if (d.reason == drop_reason::bytes_limit) ++bytes_dropped;
  }
  CHECK(bytes_dropped == 1);   // "big" does not fit in 1000 bytes
  CHECK(count_dropped == 3);
}
