// Host configuration documents: applied whole or not at all; every fault names its field.
#include <catch2/catch.hpp>

#include "sandbox/runtime.hpp"

using namespace std::chrono_literals;

TEST_CASE("config: scheduler classes, warm pools and policy are applied", "[config]") {
  sandbox::runtime_options o;
  auto r = sandbox::apply_config(R"({"v":1,
    "scheduler": {"max_running": 12, "max_queued": 500, "max_session_slots": 5,
                  "default_class": {"max_running": 2, "queue_deadline_ms": 3000,
                                    "max_session_slots": 1},
                  "classes": {"gold": {"max_running": 8, "weight": 3, "max_queued": 100}},
                  "tenant_classes": {"acme": "gold"}},
    "warm_pool": [{"runtime": "python3", "size": 4, "memory_limit_bytes": 134217728,
                   "files_out": {"max_files": 4}}],
    "policy": {"max_timeout_ms": 5000, "allowed_env": ["TZ", "LC_ALL"], "max_pids": 32}})",
                                 o);
  REQUIRE(r.has_value());
  CHECK(o.scheduler.max_running == 12);
  CHECK(o.scheduler.max_queued == 500);
  CHECK(o.scheduler.default_class.max_running == 2);
  CHECK(o.scheduler.default_class.queue_deadline == 3000ms);
  CHECK(o.scheduler.max_session_slots == 5);
  CHECK(o.scheduler.default_class.max_session_slots == 1);
  CHECK(o.scheduler.classes.at("gold").max_session_slots == 0);  // absent: half of max_running
  CHECK(o.scheduler.classes.at("gold").weight == 3);
  CHECK(o.scheduler.classes.at("gold").max_running == 8);
  CHECK(o.scheduler.tenant_classes.at("acme") == "gold");
  REQUIRE(o.process.warm_pool.size() == 1);
  CHECK(o.process.warm_pool[0].size == 4);
  CHECK(o.process.warm_pool[0].memory_limit_bytes == 134217728);
  CHECK(o.process.warm_pool[0].files_out.max_files == 4);
  CHECK(o.process.warm_pool[0].files_out.max_bytes == 8ULL << 20);
  CHECK(o.policy.max_timeout == 5000ms);
  CHECK(o.policy.allowed_env == std::set<std::string>{"LC_ALL", "TZ"});
  CHECK(o.policy.max_pids == 32);
}

TEST_CASE("config: a pre-started pool class is applied", "[config]") {
  sandbox::runtime_options o;
  auto r = sandbox::apply_config(
      R"({"warm_pool": [{"runtime": "python3", "prestart": true,
                         "preload": ["json", "xml.etree.ElementTree", "_csv"]}]})",
      o);
  REQUIRE(r.has_value());
  REQUIRE(o.process.warm_pool.size() == 1);
  CHECK(o.process.warm_pool[0].prestart);
  CHECK(o.process.warm_pool[0].preload ==
        std::vector<std::string>{"json", "xml.etree.ElementTree", "_csv"});
  // Node classes: package names as `require` takes them, never paths.
  auto r2 = sandbox::apply_config(
      R"({"warm_pool": [{"runtime": "node", "prestart": true,
                         "preload": ["lodash", "@scope/pkg/sub", "node:fs/promises", "child_process"]}]})",
      o);
  REQUIRE(r2.has_value());
  CHECK(o.process.warm_pool[0].preload.size() == 4);
  CHECK(sandbox::prestart_kind_of(sandbox::default_runtimes()[1]) == sandbox::prestart_kind::node);
  CHECK(sandbox::prestart_kind_of(sandbox::default_runtimes()[0]) ==
        sandbox::prestart_kind::python);
  using sandbox::prestart_kind;
  for (const char* good : {"lodash", "@scope/pkg", "@scope/pkg/sub/x.js", "left-pad", "a.b",
                           "node:fs", "node:fs/promises", "Upper", "x~y"}) {
    INFO(good);
    CHECK(sandbox::is_valid_preload_module(prestart_kind::node, good));
  }
  for (const char* bad :
       {"",       "./x",  "../x",         "/x",    "x/",       "x//y",    "x/./y", "x/../y",
        "@scope", "@/x",  "@s/",          ".x",    "_x",       "-x",      "~x",    "a b",
        "a;b",    "a\nb", "require('x')", "node:", "node:/fs", "node:Fs", "é"}) {
    INFO(bad);
    CHECK(!sandbox::is_valid_preload_module(prestart_kind::node, bad));
  }
  CHECK(!sandbox::is_valid_preload_module(prestart_kind::node, std::string(215, 'a')));
  CHECK(sandbox::is_valid_preload_module(prestart_kind::node, std::string(214, 'a')));
  CHECK(!sandbox::is_valid_preload_module(prestart_kind::none, "json"));
  CHECK(sandbox::is_valid_preload_module(prestart_kind::python, "json"));
  CHECK(!sandbox::is_valid_preload_module(prestart_kind::python, "node:fs"));
  CHECK(!sandbox::supports_prestart({.name = "n", .argv = {"/usr/bin/node", "-e", "{source}"}}));
  CHECK(!sandbox::supports_prestart({.name = "n", .argv = {"node", "{source}"}}));
  CHECK(sandbox::supports_prestart({.name = "n", .argv = {"/opt/bin/nodejs", "{source}"}}));
  CHECK(sandbox::is_valid_preload_module("a.b_c.D9"));
  CHECK(!sandbox::is_valid_preload_module(""));
  CHECK(!sandbox::is_valid_preload_module("a."));
  CHECK(!sandbox::is_valid_preload_module(".a"));
  CHECK(!sandbox::is_valid_preload_module("a b"));
  CHECK(!sandbox::is_valid_preload_module("é"));
  CHECK(!sandbox::is_valid_preload_module(std::string(129, 'a')));
  CHECK(sandbox::supports_prestart(sandbox::default_runtimes()[0]));
  CHECK(!sandbox::supports_prestart(
      {.name = "p", .argv = {"/usr/bin/python3", "-I", "-S", "{source}"}}));
  CHECK(!sandbox::supports_prestart({.name = "p", .argv = {"python3", "-I", "{source}"}}));
}

TEST_CASE("config: the container, gvisor and microvm levels' pool classes can be pre-started",
          "[config]") {
  sandbox::runtime_options o;
  auto r = sandbox::apply_config(
      R"({"backends": {"container": {"runtime": "crun", "warm_pool": [
            {"runtime": "python3", "size": 2, "prestart": true, "preload": ["json"]},
            {"runtime": "node", "prestart": true, "preload": ["node:util"]}]},
          "gvisor": {"runtime": "runsc", "warm_pool": [
            {"runtime": "python3", "prestart": true}]},
          "microvm": {"warm_pool": [
            {"runtime": "python3", "prestart": true, "preload": ["json", "csv"]}]}}})",
      o);
  INFO((r ? std::string() : r.error().message));
  REQUIRE(r.has_value());
  REQUIRE(o.container.warm_pool.size() == 2);
  CHECK(o.container.warm_pool[0].prestart);
  CHECK(o.container.warm_pool[0].size == 2);
  CHECK(o.container.warm_pool[0].preload == std::vector<std::string>{"json"});
  CHECK(o.container.warm_pool[1].prestart);
  CHECK(o.container.warm_pool[1].preload == std::vector<std::string>{"node:util"});
  REQUIRE(o.gvisor.warm_pool.size() == 1);
  CHECK(o.gvisor.warm_pool[0].prestart);
  CHECK(o.gvisor.warm_pool[0].preload.empty());
  REQUIRE(o.microvm.warm_pool.size() == 1);
  CHECK(o.microvm.warm_pool[0].prestart);
  CHECK(o.microvm.warm_pool[0].preload == std::vector<std::string>{"json", "csv"});
  CHECK(o.process.warm_pool.empty());
}

TEST_CASE("config: at most 64 preload modules", "[config]") {
  std::string list;
  for (int i = 0; i < 65; ++i) list += (i ? ", \"m" : "\"m") + std::to_string(i) + "\"";
  sandbox::runtime_options o;
  auto r = sandbox::apply_config(
      R"({"warm_pool": [{"runtime": "python3", "prestart": true, "preload": [)" + list + "]}]}", o);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message == "warm_pool[0].preload: at most 64 modules");
  CHECK(o.process.warm_pool == sandbox::runtime_options{}.process.warm_pool);  // nothing applied
  list = list.substr(0, list.rfind(','));                                      // 64: accepted
  r = sandbox::apply_config(
      R"({"warm_pool": [{"runtime": "python3", "prestart": true, "preload": [)" + list + "]}]}", o);
  REQUIRE(r.has_value());
  CHECK(o.process.warm_pool.at(0).preload.size() == 64);
}

TEST_CASE("config: faults name their field and nothing is applied", "[config]") {
  const std::pair<const char*, const char*> bad[] = {
      {R"({"scheduler": {"max_runing": 3}})", "scheduler: unknown field 'max_runing'"},
      {R"({"scheduler": {"tenant_classes": {"acme": "gold"}}})",
       "scheduler.tenant_classes.acme: unknown class 'gold'"},
      {R"({"scheduler": {"classes": {"g": {"weight": 0}}}})",
       "scheduler.classes.g.weight: must be at least 1"},
      {R"({"scheduler": {"max_session_slots": -1}})", "scheduler.max_session_slots"},
      {R"({"scheduler": {"default_class": {"max_session_slots": "2"}}})",
       "scheduler.default_class.max_session_slots"},
      {R"({"scheduler": {"default_class": {"queue_deadline_ms": 0}}})",
       "scheduler.default_class.queue_deadline_ms: must be positive"},
      {R"({"warm_pool": [{"runtime": "python3", "size": "2"}]})", "warm_pool[0].size"},
      {R"({"policy": {"max_pids": 1}})", "policy.max_pids: must be at least 8"},
      {R"({"policy": {"tmp_bytes": 0}})", "policy.tmp_bytes"},
      {R"({"policy": {"min_memory_bytes": 2147483648, "max_memory_bytes": 1073741824}})",
       "policy.min_memory_bytes"},
      // A pool class no request could match, or one whose instances could never be made.
      {R"({"warm_pool": [{"size": 1}]})", "warm_pool[0].runtime: required"},
      {R"({"warm_pool": [{"runtime": "python3", "memory_limit_bytes": 0}]})",
       "warm_pool[0].memory_limit_bytes: below"},
      {R"({"warm_pool": [{"runtime": "python3", "memory_limit_bytes": 33554431}]})",
       "warm_pool[0].memory_limit_bytes: below"},
      {R"({"warm_pool": [{"runtime": "python3", "memory_limit_bytes": 18446744073709551615}]})",
       "warm_pool[0].memory_limit_bytes: above"},
      // ... judged against the policy of the same document, wherever it appears in it.
      {R"({"warm_pool": [{"runtime": "python3", "memory_limit_bytes": 536870912}], "policy": {"max_memory_bytes": 268435456}})",
       "warm_pool[0].memory_limit_bytes: above"},
      {R"({"warm_pool": [{"runtime": "python3", "files_out": {"max_files": 257}}]})",
       "warm_pool[0].files_out.max_files: above"},
      // Pre-started classes: strict fields, Python module names, runtimes that can.
      {R"({"warm_pool": [{"runtime": "python3", "prestart": 1}]})", "warm_pool[0].prestart"},
      {R"({"warm_pool": [{"runtime": "python3", "prestart": true, "preload": "json"}]})",
       "warm_pool[0].preload"},
      {R"({"warm_pool": [{"runtime": "python3", "prestart": true, "preload": ["os..path"]}]})",
       "warm_pool[0].preload[0]: not a dotted Python module name"},
      {R"({"warm_pool": [{"runtime": "python3", "prestart": true, "preload": ["../x"]}]})",
       "warm_pool[0].preload[0]: not a dotted Python module name"},
      {R"({"warm_pool": [{"runtime": "python3", "prestart": true, "preload": ["1json"]}]})",
       "warm_pool[0].preload[0]: not a dotted Python module name"},
      {R"({"warm_pool": [{"runtime": "python3", "prestart": true, "preload": ["json", "json"]}]})",
       "warm_pool[0].preload[1]: listed twice"},
      {R"({"warm_pool": [{"runtime": "python3", "preload": ["json"]}]})",
       "warm_pool[0].preload: needs \"prestart\": true"},
      {R"({"runtimes": [{"name": "node", "argv": ["/usr/bin/node", "--no-warnings", "{source}"]}],
           "warm_pool": [{"runtime": "node", "prestart": true}]})",
       "warm_pool[0].prestart: runtime 'node' cannot be pre-started"},
      {R"({"warm_pool": [{"runtime": "python3", "prestart": true, "preload": [""]}]})",
       "warm_pool[0].preload[0]: not a module name (1 to 214 printable ASCII characters)"},
      {R"({"warm_pool": [{"runtime": "python3", "prestart": true, "preload": ["os; rm"]}]})",
       "warm_pool[0].preload[0]: not a module name"},
      {R"({"warm_pool": [{"runtime": "python3", "prestart": true, "preload": ["json\n"]}]})",
       "warm_pool[0].preload[0]: not a module name"},
      {R"({"warm_pool": [{"runtime": "python3", "prestart": true, "preload": [7]}]})",
       "warm_pool[0].preload[0]"},
      {R"({"warm_pool": [{"runtime": "python3", "prestart": true,
                          "preload": ["__import__('os').system('id');x"]}]})",
       "warm_pool[0].preload[0]: not a dotted Python module name"},
      {R"({"warm_pool": [{"runtime": "python3", "prestart": true, "preload": ["os;x"]}]})",
       "warm_pool[0].preload[0]: not a dotted Python module name"},
      {R"({"warm_pool": [{"runtime": "python3", "prestart": true, "preload": ["@s/p"]}]})",
       "warm_pool[0].preload[0]: not a dotted Python module name"},
      {R"({"warm_pool": [{"runtime": "node", "prestart": true, "preload": ["./x"]}]})",
       "warm_pool[0].preload[0]: not a Node package name"},
      {R"({"warm_pool": [{"runtime": "node", "prestart": true, "preload": ["/usr/lib/x"]}]})",
       "warm_pool[0].preload[0]: not a Node package name"},
      {R"({"warm_pool": [{"runtime": "node", "prestart": true, "preload": ["a/../../etc"]}]})",
       "warm_pool[0].preload[0]: not a Node package name"},
      {R"({"warm_pool": [{"runtime": "node", "prestart": true, "preload": ["lodash", "lodash"]}]})",
       "warm_pool[0].preload[1]: listed twice"},
      {R"({"warm_pool": [{"runtime": "other", "prestart": true, "preload": ["a;b"]}]})",
       "warm_pool[0].preload[0]: not a module name"},
      {R"({"warm_pool": [{"runtime": "python3", "prestart": true, "preloads": []}]})",
       "warm_pool[0]: unknown field 'preloads'"},
      // The container and gvisor levels' classes are checked as the process level's are.
      {R"({"backends": {"container": {"warm_pool": [{"runtime": "python3", "prestart": true,
             "preload": ["os..path"]}]}}})",
       "backends.container.warm_pool[0].preload[0]: not a dotted Python module name"},
      {R"({"backends": {"gvisor": {"warm_pool": [{"runtime": "node", "prestart": true,
             "preload": ["../x"]}]}}})",
       "backends.gvisor.warm_pool[0].preload[0]: not a Node package name"},
      {R"({"runtimes": [{"name": "node", "argv": ["/usr/bin/node", "--no-warnings", "{source}"]}],
           "backends": {"gvisor": {"warm_pool": [{"runtime": "node", "prestart": true}]}}})",
       "backends.gvisor.warm_pool[0].prestart: runtime 'node' cannot be pre-started"},
      {R"({"backends": {"container": {"warm_pool": [{"runtime": "python3",
             "preload": ["json"]}]}}})",
       "backends.container.warm_pool[0].preload: needs \"prestart\": true"},
      {R"({"backends": {"container": {"warm_pool": [{"runtime": "python3", "prestart": "yes"}]}}})",
       "backends.container.warm_pool[0].prestart"},
      // The microvm level's classes get the same checks.
      {R"({"runtimes": [{"name": "node", "argv": ["/usr/bin/node", "--no-warnings", "{source}"]}],
           "backends": {"microvm": {"warm_pool": [{"runtime": "node", "prestart": true}]}}})",
       "backends.microvm.warm_pool[0].prestart: runtime 'node' cannot be pre-started"},
      {R"({"backends": {"microvm": {"warm_pool": [{"runtime": "python3",
             "preload": ["json"]}]}}})",
       "backends.microvm.warm_pool[0].preload: needs \"prestart\": true"},
      // Names admission would refuse anyway are refused here, where the operator sees them.
      {R"({"policy": {"allowed_env": [""]}})",
       "policy.allowed_env[0]: not a portable variable name"},
      {R"({"policy": {"allowed_env": ["TZ", "A-B"]}})", "policy.allowed_env[1]: not a portable"},
      {R"({"policy": {"allowed_env": ["LD_PRELOAD"]}})", "policy.allowed_env[0]: reserved"},
      {R"({"policy": {"allowed_env": ["PATH"]}})", "policy.allowed_env[0]: reserved"},
      {R"({"policy": {"allowed_env": ["SANDBOX_X"]}})", "policy.allowed_env[0]: reserved"},
      // Network runs' egress proxy: names, addresses and ports are checked here.
      {R"({"egress": {"pinned_hosts": {"*.example.com": ["10.0.0.1"]}}})",
       "egress.pinned_hosts['*.example.com']: not a host name"},
      {R"({"egress": {"pinned_hosts": {"10.0.0.1": ["10.0.0.1"]}}})",
       "egress.pinned_hosts['10.0.0.1']: not a host name"},
      {R"({"egress": {"pinned_hosts": {"api.example.com": []}}})",
       "egress.pinned_hosts['api.example.com']: needs at least one address"},
      {R"({"egress": {"pinned_hosts": {"api.example.com": ["localhost"]}}})",
       "egress.pinned_hosts['api.example.com'][0]: not a numeric"},
      {R"({"egress": {"pinned_hosts": {"api.example.com": ["10.0.0.1:80"]}}})",
       "egress.pinned_hosts['api.example.com'][0]: not a numeric"},
      {R"({"egress": {"connect_ports": [0]}})", "egress.connect_ports[0]: must be 1..65535"},
      {R"({"egress": {"http_ports": [65536]}})", "egress.http_ports[0]"},
      {R"({"egress": {"max_connections": -1}})", "egress.max_connections"},
      {R"({"egress": {"proxy": 1}})", "egress: unknown field 'proxy'"},
      {R"({"egress": {"origin_ca_file": "ca.pem"}})",
       "egress.origin_ca_file: must be an absolute path"},
      {R"({"egress": {"origin_ca_file": 1}})", "egress.origin_ca_file"},
      {R"({"v": 2})", "unsupported protocol version"},
      {R"({"scheduler": {}, "scheduler": {}})", "duplicate"},
      {R"({"extra": 1})", "unknown field 'extra'"},
      {"not json", "malformed JSON"},
  };
  for (const auto& [doc, msg] : bad) {
    INFO(doc);
    sandbox::runtime_options o;
    const auto before = o.scheduler;
    auto r = sandbox::apply_config(doc, o);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == sandbox::code::invalid_request);
    CHECK(r.error().message.find(msg) != std::string::npos);
    CHECK(o.scheduler == before);
    CHECK(o.process.warm_pool.empty());
    CHECK(o.policy.allowed_env.empty());
    CHECK(o.egress.pinned_hosts.empty());
    CHECK(o.egress.connect_ports == std::vector<std::uint16_t>{443});
  }
}

TEST_CASE("config: the egress section sets network runs' proxy options", "[config]") {
  sandbox::runtime_options o;
  auto r = sandbox::apply_config(R"({"v":1, "egress": {
      "pinned_hosts": {"Rates.Internal.Example.": ["10.20.0.7", "fd00::7"]},
      "connect_ports": [443, 8443], "http_ports": [8080], "max_connections": 5,
      "max_bytes_up": 1000, "max_bytes_down": 2000}})",
                                 o);
  REQUIRE(r.has_value());
  // Names are kept canonical (lower case, no trailing dot): the form the proxy looks up.
  CHECK(o.egress.pinned_hosts == std::map<std::string, std::vector<std::string>>{
                                     {"rates.internal.example", {"10.20.0.7", "fd00::7"}}});
  CHECK(o.egress.connect_ports == std::vector<std::uint16_t>{443, 8443});
  CHECK(o.egress.http_ports == std::vector<std::uint16_t>{8080});
  CHECK(o.egress.max_connections == 5);
  CHECK(o.egress.max_bytes_up == 1000);
  CHECK(o.egress.max_bytes_down == 2000);
}

TEST_CASE("config: the microvm section enables the level and names its faults",
          "[config][microvm]") {
  sandbox::runtime_options o;
  auto r = sandbox::apply_config(
      R"({"v": 1, "backends": {"microvm": {"kernel_dir": "/srv/kernel", "accel": "tcg",
          "guest_overhead_mib": 128, "vmm_overhead_mib": 256,
          "warm_pool": [{"runtime": "python3", "size": 2, "memory_limit_bytes": 134217728}]}}})",
      o);
  REQUIRE(r.has_value());
  CHECK(o.microvm.enabled);
  REQUIRE(o.microvm.warm_pool.size() == 1);
  CHECK(o.microvm.warm_pool[0].size == 2);
  CHECK(o.microvm.warm_pool[0].memory_limit_bytes == 134217728);
  CHECK(o.process.warm_pool.empty());  // the level's own pools, not the process level's
  CHECK(o.microvm.kernel_dir == "/srv/kernel");
  CHECK(o.microvm.accel == "tcg");
  CHECK(o.microvm.guest_overhead_mib == 128);
  CHECK(o.microvm.vmm_overhead_mib == 256);
  const std::pair<const char*, const char*> bad[] = {
      {R"({"backends": {"microvm": {"accel": "hvf"}}})",
       "backends.microvm.accel: must be one of: auto, kvm, tcg"},
      {R"({"backends": {"microvm": {"kernel_dir": "relative"}}})",
       "backends.microvm.kernel_dir: must be an absolute path"},
      {R"({"backends": {"microvm": {"guest_overhead_mib": 8}}})",
       "backends.microvm.guest_overhead_mib: must be at least 32"},
      {R"({"backends": {"microvm": {"vmm_overhead_mib": "big"}}})",
       "backends.microvm.vmm_overhead_mib"},
      {R"({"backends": {"microvm": {"kernel": "/x"}}})",
       "backends.microvm: unknown field 'kernel'"},
      {R"({"backends": {"microvm": {"warm_pool": [{"runtime": "python3", "size": -1}]}}})",
       "backends.microvm.warm_pool[0].size"},
      {R"({"backends": {"microvm": {"warm_pool": {"runtime": "python3"}}}})",
       "backends.microvm.warm_pool"},
  };
  for (const auto& [doc, msg] : bad) {
    INFO(doc);
    sandbox::runtime_options p;
    auto e = sandbox::apply_config(doc, p);
    REQUIRE_FALSE(e.has_value());
    CHECK(e.error().message.find(msg) != std::string::npos);
    CHECK_FALSE(p.microvm.enabled);
  }
}

TEST_CASE("config: the runtimes section defines runtimes a host names", "[config]") {
  auto o = sandbox::default_runtime_options();
  const auto defaults = sandbox::default_runtimes();
  auto r = sandbox::apply_config(R"({"v":1, "runtimes": [
      {"name": "python3-data", "image": "python3-data",
       "argv": ["/usr/bin/python3", "-I", "{source}"], "source_name": "main.py"},
      {"name": "node", "argv": ["/usr/bin/node", "--max-old-space-size=64", "{source}"],
       "source_name": "main.mjs"}]})",
                                 o);
  REQUIRE(r.has_value());
  REQUIRE(o.runtimes.size() == 3);
  CHECK(o.runtimes[0] == defaults[0]);  // python3 kept
  CHECK(o.runtimes[1].name == "node");  // replaced in place
  CHECK(o.runtimes[1].argv ==
        std::vector<std::string>{"/usr/bin/node", "--max-old-space-size=64", "{source}"});
  CHECK(o.runtimes[1].source_name == "main.mjs");
  CHECK(o.runtimes[2] == sandbox::runtime_spec{.name = "python3-data",
                                               .argv = {"/usr/bin/python3", "-I", "{source}"},
                                               .source_name = "main.py",
                                               .image = "python3-data"});
}

TEST_CASE("config: a runtime definition's faults name their field", "[config]") {
  const std::pair<const char*, const char*> bad[] = {
      {R"([{"name": "Data", "argv": ["/usr/bin/python3", "{source}"]}])", "runtimes[0].name:"},
      {R"([{"name": "d", "argv": ["python3", "{source}"]}])", "runtimes[0].argv[0]: must be an"},
      {R"([{"name": "d", "argv": ["/bin/../bin/sh", "{source}"]}])", "runtimes[0].argv[0]"},
      {R"([{"name": "d", "argv": ["/usr/bin/python3"]}])", "runtimes[0].argv: exactly one"},
      {R"([{"name": "d", "argv": ["/usr/bin/python3", "{source}", "{source}"]}])",
       "runtimes[0].argv: exactly one"},
      {R"([{"name": "d", "argv": ["{source}", "{source}"]}])", "runtimes[0].argv[0]"},
      {R"([{"name": "d", "argv": []}])", "runtimes[0].argv: 1 to 256"},
      {R"([{"name": "d", "argv": ["/usr/bin/python3", 1]}])", "runtimes[0].argv[1]"},
      {R"([{"name": "d", "argv": ["/usr/bin/python3", "{source}"], "source_name": "a/b"}])",
       "runtimes[0].source_name: must be"},
      {R"([{"name": "d", "argv": ["/usr/bin/python3", "{source}"], "source_name": "out"}])",
       "runtimes[0].source_name: 'out' collides"},
      {R"([{"name": "d", "argv": ["/usr/bin/python3", "{source}"], "source_name": ".."}])",
       "runtimes[0].source_name"},
      {R"([{"name": "d", "argv": ["/usr/bin/python3", "{source}"], "image": "A"}])",
       "runtimes[0].image"},
      {R"([{"name": "d", "argv": ["/usr/bin/python3", "{source}"], "shell": true}])",
       "runtimes[0]: unknown field 'shell'"},
      {R"([{"argv": ["/usr/bin/python3", "{source}"]}])", "runtimes[0].name"},
      {R"([{"name": "d", "argv": ["/usr/bin/python3", "{source}"]},
           {"name": "d", "argv": ["/usr/bin/python3", "{source}"]}])",
       "runtimes[1].name: duplicate of runtimes[0].name"},
      {R"({"name": "d"})", "runtimes: expected an array"},
  };
  for (const auto& [section, msg] : bad) {
    const std::string doc = std::string(R"({"v":1,"runtimes":)") + section + "}";
    INFO(doc);
    auto o = sandbox::default_runtime_options();
    const auto before = o.runtimes;
    auto r = sandbox::apply_config(doc, o);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == sandbox::code::invalid_request);
    CHECK_THAT(r.error().message, Catch::Contains(msg));
    CHECK(o.runtimes == before);
  }
}
