// A runtime the host defines (runtime_options::runtimes, the configuration's `runtimes`
// section) on the data-analysis image `python3-data` (tools/setup.sh): the README's CSV →
// chart workload, end to end at the process level. Tagged [data]: the cgroup v2 test bed
// leaves it out (its disk holds the python3, node, tools and mcp images only).
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <string>

#include "integration/harness.hpp"
#include "sandbox/runtime.hpp"

namespace {

/// A 5,000-row CSV of shipments: lane, weight.
std::string shipments_csv() {
  std::string csv = "lane,weight_kg\n";
  const char* lanes[] = {"SHA-RTM", "SIN-LAX", "HAM-NYC", "BOM-DXB"};
  for (int i = 0; i < 5000; ++i) {
    csv += std::string(lanes[i % 4]) + "," + std::to_string(100 + (i * 37) % 900) + "\n";
  }
  return csv;
}

}  // namespace

TEST_CASE("data runtime: a configured runtime runs pandas and matplotlib, a chart comes back",
          "[data]") {
  std::string state;
  auto opts = itest::private_runtime_options(&state);
  // The policy admits the run's 60 s (pandas and matplotlib take 1.5 s to import on an idle
  // host, over 8 s beside other test tiers).
  auto applied = sandbox::apply_config(R"({"v":1, "policy": {"max_timeout_ms": 60000},
      "runtimes": [
      {"name": "python3-data", "image": "python3-data",
       "argv": ["/usr/bin/python3", "-I", "{source}"], "source_name": "main.py"}]})",
                                       opts);
  REQUIRE(applied.has_value());
  auto rt = sandbox::runtime::create(opts);
  REQUIRE(rt.has_value());
  const auto cat = rt->catalog();
  const auto it = cat.runtimes.find("python3-data");
  REQUIRE(it != cat.runtimes.end());
  if (!it->second) {
    if (itest::must_work()) FAIL("the python3-data image is not installed (tools/setup.sh)");
    WARN("skipped: the python3-data image is not installed (tools/setup.sh)");
    return;
  }
  auto csv = rt->blobs()->put("itest", shipments_csv());
  REQUIRE(csv.has_value());
  sandbox::run_request req{.runtime = "python3-data",
                           .source = R"(import os, pandas as pd, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
df = pd.read_csv(os.path.join(os.environ["SANDBOX_INPUT_DIR"], "shipments.csv"))
totals = df.groupby("lane")["weight_kg"].sum().sort_index()
print(totals.to_csv(header=False), end="")
ax = totals.plot.bar()
ax.set_ylabel("kg")
plt.tight_layout()
plt.savefig(os.path.join(os.environ["SANDBOX_OUTPUT_DIR"], "chart.png"))
)",
                           .timeout = std::chrono::milliseconds(60000),
                           .files_in = {{.name = "shipments.csv", .blob = *csv}},
                           .memory_limit_bytes = 512ULL << 20};
  auto r = rt->run(req, itest::ticket("itest", std::chrono::milliseconds(60000), 512ULL << 20));
  INFO("code=" << to_string(r.code) << " message=" << r.message << "\nstdout: " << r.std_out.summary
               << "\nstderr: " << r.std_err.summary);
  REQUIRE(r.code == sandbox::code::ok);
  REQUIRE(r.exit_code == 0);
  // The sums, from pandas, match the CSV's (each lane gets every fourth row).
  std::map<std::string, long> want;
  const char* lanes[] = {"SHA-RTM", "SIN-LAX", "HAM-NYC", "BOM-DXB"};
  for (int i = 0; i < 5000; ++i) want[lanes[i % 4]] += 100 + (i * 37) % 900;
  std::string expect;
  for (const auto& [lane, kg] : want) expect += lane + "," + std::to_string(kg) + "\n";
  CHECK(r.std_out.summary == expect);
  REQUIRE(r.files_out.size() == 1);
  CHECK(r.files_out[0].name == "chart.png");
  auto png_blob = rt->blobs()->get("itest", r.files_out[0].blob);
  REQUIRE(png_blob.has_value());
  const std::string& png = *png_blob;
  CHECK(png.size() > 1000);
  CHECK(png.substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  std::filesystem::remove_all(state);
}
