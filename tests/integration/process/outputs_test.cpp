// Output collection on sandbox-controlled paths: links, FIFOs, odd names and caps.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
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
  CHECK(bytes_dropped == 1);  // "big" does not fit in 1000 bytes
  CHECK(count_dropped == 3);
}

TEST_CASE("outputs: a full quota drops output files, never the program's own streams",
          "[outputs][quota]") {
  std::string state;
  auto opts = itest::private_runtime_options(&state);
  opts.blobs = sandbox::make_memory_blob_store(2ULL << 20);  // 2 MiB per tenant
  auto rt = sandbox::runtime::create(opts);
  REQUIRE(rt.has_value());
  sandbox::run_request req{.runtime = "python3", .source = R"PY(
import os
d = os.environ['SANDBOX_OUTPUT_DIR']
for i in range(3): open(f'{d}/big{i}', 'wb').write(bytes([65 + i]) * (900 << 10))
print('hello')
)PY"};
  auto r = rt->run(req, itest::ticket());
  CHECK(r.code == code::ok);
  CHECK(r.std_out.summary == "hello\n");
  CHECK_FALSE(r.std_out.blob.empty());
  CHECK(r.message.empty());
  std::size_t quota_drops = 0;
  for (auto& d : r.files_dropped) quota_drops += d.reason == drop_reason::quota_exceeded;
  INFO(sandbox::encode(r));
  CHECK(quota_drops >= 1);
  CHECK(r.files_out.size() + quota_drops == 3);

  // A quota that is already full: the result says what could not be stored, never pretends.
  auto used = rt->blobs()->usage("itest");
  REQUIRE(used.has_value());
  REQUIRE(rt->blobs()->put("itest", std::string((2ULL << 20) - *used - 4, 'f')).has_value());
  auto full =
      rt->run({.runtime = "python3", .source = "print('more than four bytes')"}, itest::ticket());
  CHECK(full.code == code::ok);
  CHECK(full.std_out.blob.empty());
  CHECK(full.std_out.bytes == 0);
  CHECK(full.std_out.total_bytes == 21);
  CHECK(full.std_out.summary == "more than four bytes\n");
  CHECK(full.message.find("stdout could not be stored") != std::string::npos);
  std::filesystem::remove_all(state);
}
