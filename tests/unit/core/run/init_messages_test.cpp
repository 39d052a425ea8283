// The messages the run machine sends sandbox-init (core/run/init_messages.hpp): what each
// entry of `config` and `go` is for every kind of run, and the sizes they carry.
#include "core/run/init_messages.hpp"

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "sandbox/backend_options.hpp"

namespace {

namespace ip = sandbox::detail::init_protocol;
using entries = std::vector<std::pair<std::string, std::string>>;

entries parse(const std::string& payload) {
  entries out;
  for (auto [k, v] : ip::parse_config(payload)) out.emplace_back(std::string(k), std::string(v));
  return out;
}

std::vector<std::string> all(const entries& e, const std::string& key) {
  std::vector<std::string> out;
  for (const auto& [k, v] : e) {
    if (k == key) out.push_back(v);
  }
  return out;
}

sandbox::run_job python_job() {
  sandbox::run_job j;
  j.run_id = "r1";
  j.admitted.request.memory_limit_bytes = 256ULL << 20;
  j.admitted.request.files_out = {.max_files = 8, .max_bytes = 4 << 20};
  j.admitted.request.env = {{"A", "1"}, {"NODE_OPTIONS", "--inspect"}};
  j.runtime = {.name = "python3",
               .argv = {"/usr/bin/python3", "-I", "{source}"},
               .source_name = "main.py",
               .image = {}};
  j.policy = sandbox::policy{};
  return j;
}

const std::vector<std::string> fixed_env = {
    "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/home/sandbox", "LANG=C.UTF-8",
    "SANDBOX_INPUT_DIR=/sandbox/in-0123456789abcdef", "SANDBOX_OUTPUT_DIR=/sandbox/out"};

const std::vector<std::string> proxy_env = {
    "HTTP_PROXY=http://127.0.0.1:3128", "HTTPS_PROXY=http://127.0.0.1:3128",
    "http_proxy=http://127.0.0.1:3128", "https_proxy=http://127.0.0.1:3128",
    "NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1"};

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST_CASE("init messages: config carries names, identity, sizes, then the launcher's entries",
          "[init_messages]") {
  auto job = python_job();
  ip::config_writer launcher;
  launcher.add("launch", "oci");
  launcher.add("notify", "0");
  auto e = parse(sandbox::detail::config_payload(job, {.selftest = false,
                                                       .input_name = "in-0123456789abcdef",
                                                       .uid = 1234,
                                                       .userns = true,
                                                       .launcher_entries = launcher.bytes()}));
  const auto sizes = sandbox::detail::sandbox_sizes(job);
  const entries want = {{"mode", "run"},
                        {"input_name", "in-0123456789abcdef"},
                        {"source_name", "main.py"},
                        {"uid", "1234"},
                        {"gid", "1234"},
                        {"userns", "1"},
                        {"tmp_bytes", std::to_string(sizes.tmp_bytes)},
                        {"home_bytes", std::to_string(sizes.home_bytes)},
                        {"shm_bytes", std::to_string(sizes.shm_bytes)},
                        {"out_bytes", std::to_string(sizes.out_bytes)},
                        {"tmpfs_inodes", std::to_string(sizes.tmpfs_inodes)},
                        {"out_inodes", std::to_string(sizes.out_inodes)},
                        {"nofile", std::to_string(sizes.nofile)},
                        {"fsize_bytes", std::to_string(std::uint64_t{1} << 30)},
                        {"launch", "oci"},
                        {"notify", "0"}};
  CHECK(e == want);
  // The self-test's probe: its own mode and source name.
  e = parse(sandbox::detail::config_payload(job, {.selftest = true, .input_name = "in-x"}));
  CHECK(all(e, "mode") == std::vector<std::string>{"selftest"});
  CHECK(all(e, "source_name") == std::vector<std::string>{"probe"});
  CHECK(all(e, "userns") == std::vector<std::string>{"0"});
}

TEST_CASE("init messages: sizes are capped by the memory limit and never below 64 KiB",
          "[init_messages]") {
  auto job = python_job();
  job.policy.tmp_bytes = 1ULL << 40;
  job.policy.home_bytes = 0;
  auto s = sandbox::detail::sandbox_sizes(job);
  CHECK(s.tmp_bytes == (256ULL << 20) / 8);  // an eighth of the memory limit
  CHECK(s.home_bytes == 64 * 1024);          // tmpfs reads 0 as unlimited: the floor
  CHECK(s.out_bytes == (4ULL << 20) + (1 << 20));
  CHECK(s.out_inodes == 64 + 16);  // max(8 × 2, 64) + 16
  job.admitted.request.files_out.max_bytes = 1ULL << 30;
  CHECK(sandbox::detail::sandbox_sizes(job).out_bytes == (256ULL << 20) / 4);
}

TEST_CASE("init messages: go for a run substitutes the source and sets the fixed environment",
          "[init_messages]") {
  auto job = python_job();
  auto e = parse(sandbox::detail::go_payload(job, {.input_name = "in-0123456789abcdef"}));
  CHECK(all(e, "argv") == std::vector<std::string>{"/usr/bin/python3", "-I", "/sandbox/main.py"});
  CHECK(all(e, "stdin").empty());
  CHECK(all(e, "egress_proxy").empty());
  // No network: the request's NODE_OPTIONS is the program's own.
  CHECK(all(e, "env") == concat(fixed_env, {"A=1", "NODE_OPTIONS=--inspect"}));
}

TEST_CASE("init messages: go for a tool opens its staged stdin; a session's argv is as is",
          "[init_messages]") {
  auto job = python_job();
  job.stdin_bytes = "input";
  auto e = parse(sandbox::detail::go_payload(job, {.input_name = "in-0123456789abcdef"}));
  CHECK(all(e, "stdin") == std::vector<std::string>{"/sandbox/main.py"});
  e = parse(sandbox::detail::go_payload(job, {.session = true, .input_name = "in-x"}));
  CHECK(all(e, "argv") == std::vector<std::string>{"/usr/bin/python3", "-I", "{source}"});
  CHECK(all(e, "stdin").empty());
}

TEST_CASE("init messages: go for the probe", "[init_messages]") {
  auto job = python_job();
  auto e = parse(sandbox::detail::go_payload(
      job, {.selftest = true, .input_name = "in-x", .uid = 1000, .probe_path = "/.sandbox-init"}));
  CHECK(all(e, "argv") == std::vector<std::string>{"/.sandbox-init", "--probe", "1000"});
  e = parse(sandbox::detail::go_payload(job, {.selftest = true,
                                              .input_name = "in-x",
                                              .uid = 7,
                                              .probe_path = "/.sandbox-init",
                                              .probe_in_gvisor = true}));
  CHECK(all(e, "argv") == std::vector<std::string>{"/.sandbox-init", "--probe", "7", "gvisor"});
}

TEST_CASE("init messages: a network run gets the proxy variables and the Node preload",
          "[init_messages]") {
  auto job = python_job();
  auto e =
      parse(sandbox::detail::go_payload(job, {.input_name = "in-0123456789abcdef",
                                              .network = true,
                                              .node_proxy_preload_path = "/.sandbox-proxy.js"}));
  CHECK(all(e, "egress_proxy") == std::vector<std::string>{"3128"});  // sandbox-init listens
  // Ours first; the request's NODE_OPTIONS is dropped (the preload is ours).
  CHECK(all(e, "env") ==
        concat(concat(fixed_env, proxy_env), {"NODE_OPTIONS=--require /.sandbox-proxy.js", "A=1"}));
  // A launcher that made the namespace serves the proxy already; no preload: no NODE_OPTIONS.
  e = parse(sandbox::detail::go_payload(
      job, {.input_name = "in-0123456789abcdef", .network = true, .proxy_served = true}));
  CHECK(all(e, "egress_proxy").empty());
  CHECK(all(e, "env") == concat(concat(fixed_env, proxy_env), {"A=1"}));
  CHECK(all(e, "node_proxy_preload").empty());  // a file of the launcher's, or none
}

TEST_CASE("init messages: a launcher without a file of the Node preload sends it in go",
          "[init_messages]") {
  // The microvm level: the guest has nothing of the host, so sandbox-init writes the preload
  // (to init_protocol::node_proxy_path) before the program starts; only for network runs.
  auto job = python_job();
  const std::string js = "module.exports = 1; // the preload";
  auto e = parse(sandbox::detail::go_payload(job, {.input_name = "in-0123456789abcdef",
                                                   .network = true,
                                                   .proxy_served = true,
                                                   .node_proxy_preload_path = ip::node_proxy_path,
                                                   .node_proxy_preload = js}));
  CHECK(all(e, "node_proxy_preload") == std::vector<std::string>{js});
  CHECK(all(e, "env") ==
        concat(concat(fixed_env, proxy_env),
               {std::string("NODE_OPTIONS=--require ") + ip::node_proxy_path, "A=1"}));
  // No network: neither the preload nor NODE_OPTIONS of ours.
  e = parse(sandbox::detail::go_payload(job, {.input_name = "in-0123456789abcdef",
                                              .node_proxy_preload_path = ip::node_proxy_path,
                                              .node_proxy_preload = js}));
  CHECK(all(e, "node_proxy_preload").empty());
  CHECK(std::string(sandbox::detail::describe_step(ip::step::node_proxy)) ==
        "writing the Node proxy preload");
}

TEST_CASE("init messages: network only when granted, never for the self-test", "[init_messages]") {
  auto job = python_job();
  CHECK(!sandbox::detail::is_network_granted(job, false));
  job.admitted.request.network = true;
  CHECK(!sandbox::detail::is_network_granted(job, false));  // no domains: nothing granted
  job.admitted.request.egress = {"example.com"};
  CHECK(sandbox::detail::is_network_granted(job, false));
  CHECK(!sandbox::detail::is_network_granted(job, true));
}

TEST_CASE("init messages: a packet is the header then the payload", "[init_messages]") {
  auto p = sandbox::detail::init_packet(ip::msg::go, 1, "argv=x");
  REQUIRE(p.size() == sizeof(ip::init_header) + 6);
  ip::init_header h;
  std::memcpy(&h, p.data(), sizeof h);
  CHECK(h.type == ip::msg::go);
  CHECK(h.a == 1);
  CHECK(h.b == 0);
  CHECK(p.substr(sizeof h) == "argv=x");
  CHECK(std::string(sandbox::detail::describe_step(ip::step::pivot_root)) ==
        "pivot_root into the new root");
}

TEST_CASE("init messages: a network run's secrets are placeholders only, never values",
          "[init_messages][secrets]") {
  auto job = python_job();
  const std::string value = "sk-live-VALUE-THAT-STAYS-ON-THE-HOST";
  job.secrets.push_back(sandbox::run_secret{
      .name = "rates-api",
      .placeholder = "sbx-secret-0123456789abcdef0123456789abcdef",
      .definition = {.file = "/etc/s", .domains = {"api.example.com"}, .header = "X-Key: {value}"},
      .value = std::make_shared<const std::string>(value)});
  auto payload =
      sandbox::detail::go_payload(job, {.input_name = "in-0123456789abcdef", .network = true});
  CHECK(all(parse(payload), "env") ==
        concat(concat(fixed_env, proxy_env),
               {"SANDBOX_SECRET_RATES_API=sbx-secret-0123456789abcdef0123456789abcdef", "A=1"}));
  CHECK(payload.find(value) == std::string::npos);
  CHECK(sandbox::detail::config_payload(job, {.input_name = "in-0123456789abcdef"}).find(value) ==
        std::string::npos);
  CHECK(all(parse(payload), "run_ca_pem").empty());
  // With the run's CA (the proxy terminates its HTTPS): the certificate for sandbox-init to
  // write, and the trust-store variables naming where it goes.
  const std::string pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  payload = sandbox::detail::go_payload(
      job, {.input_name = "in-0123456789abcdef", .network = true, .run_ca_pem = pem});
  CHECK(all(parse(payload), "run_ca_pem") == std::vector<std::string>{pem});
  CHECK(
      all(parse(payload), "env") ==
      concat(concat(fixed_env, proxy_env),
             {"SANDBOX_SECRET_RATES_API=sbx-secret-0123456789abcdef0123456789abcdef",
              "SSL_CERT_FILE=/tmp/sandbox-run-ca.pem", "REQUESTS_CA_BUNDLE=/tmp/sandbox-run-ca.pem",
              "CURL_CA_BUNDLE=/tmp/sandbox-run-ca.pem",
              "NODE_EXTRA_CA_CERTS=/tmp/sandbox-run-ca.pem", "A=1"}));
  CHECK(payload.find(value) == std::string::npos);
  // Without the network (never admitted with secrets, but never leaked either): nothing.
  payload =
      sandbox::detail::go_payload(job, {.input_name = "in-0123456789abcdef", .run_ca_pem = pem});
  CHECK(payload.find("SANDBOX_SECRET_") == std::string::npos);
  CHECK(payload.find("CERTIFICATE") == std::string::npos);
}

TEST_CASE(
    "init messages: a pre-started instance's config names the interpreter, its start "
    "environment and the preload list",
    "[init_messages]") {
  auto job = python_job();
  const sandbox::detail::config_params p{.selftest = false, .input_name = "in-0123456789abcdef"};
  auto e = parse(sandbox::detail::config_payload(job, p));
  CHECK(all(e, "prestart").empty());  // not pre-started: nothing of it
  job.prestart = std::vector<std::string>{"json", "xml.dom"};
  e = parse(sandbox::detail::config_payload(job, p));
  CHECK(all(e, "prestart") == std::vector<std::string>{"/usr/bin/python3"});
  // The environment every run starts with, as `go` sends it (the request's own come there).
  CHECK(all(e, "prestart_env") == fixed_env);
  CHECK(all(parse(sandbox::detail::go_payload(job, {.input_name = "in-0123456789abcdef"})), "env")
            .front() == fixed_env.front());
  CHECK(all(e, "preload") == std::vector<std::string>{"json", "xml.dom"});
  CHECK(all(e, "prestart_kind") == std::vector<std::string>{"python"});
  // A Node runtime's: its loader.
  auto node = job;
  node.runtime = sandbox::default_runtimes()[1];
  node.prestart = std::vector<std::string>{"lodash"};
  auto n = parse(sandbox::detail::config_payload(node, p));
  CHECK(all(n, "prestart") == std::vector<std::string>{"/usr/bin/node"});
  CHECK(all(n, "prestart_kind") == std::vector<std::string>{"node"});
  CHECK(all(n, "preload") == std::vector<std::string>{"lodash"});
  // Never for the self-test's probe.
  e = parse(sandbox::detail::config_payload(job, {.selftest = true, .input_name = "in-x"}));
  CHECK(all(e, "prestart").empty());
  CHECK(all(e, "preload").empty());
}
