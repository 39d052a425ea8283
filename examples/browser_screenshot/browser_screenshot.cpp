// browser_screenshot: a headless browser under the same rules as model-written code.
//
// An agent wants to look at a web page. The host:
//
//   1. serves the page from a local test server (127.0.0.1, an ephemeral port) and pins the
//      name "pages.test" to it in the runtime's egress settings (resolved names never reach
//      loopback; a pinned name is the operator's decision),
//   2. creates a runtime with the container backend (crun) and a runtime "browser" whose
//      image ("chromium": Debian's chromium and python3, `sandboxctl image build chromium
//      --package chromium --package fonts-dejavu-core --package python3`) runs a Python
//      snippet,
//   3. mints a ticket for tenant "acme": container isolation, `code.network` for exactly
//      "pages.test", and the host's workload profile "browser" (more pids, memory and
//      /dev/shm than a snippet gets),
//   4. runs a snippet that starts Debian's Chromium headless with a fresh --user-data-dir in
//      the sandbox's own /tmp (no host profile, no cookies), the run's egress proxy as its
//      only way out, and asks it for the page's DOM after scripts ran and for a PNG
//      screenshot written to $SANDBOX_OUTPUT_DIR,
//   5. fetches page.png back from the blob store by its blob id, checks it is a PNG of the
//      window's size, and that the page came through the proxy (the run's egress attempts,
//      the server's request count).
//
// Chromium runs with --no-sandbox: its own sandbox needs user namespaces and setuid helpers
// that the run does not get; the run's sandbox (namespaces, cgroup, seccomp filter, no
// network but the proxy) is the boundary, as for any other program.
//
// Exit status: 0 when all checks pass; 1 otherwise; 2 for bad options; with
// --skip-unavailable, 77 when the container backend or the chromium image is unavailable
// (unless CI=true or SANDBOX_MUST_WORK=1).
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include "sandbox/sandbox.hpp"

namespace asio = boost::asio;
namespace po = boost::program_options;
using namespace std::chrono_literals;

namespace {

constexpr int exit_ok = 0;
constexpr int exit_fail = 1;
constexpr int exit_usage = 2;
constexpr int exit_skip = 77;

constexpr const char* tenant = "acme";
constexpr const char* page_host = "pages.test";
constexpr int window_width = 800;
constexpr int window_height = 600;

// The page: its text is written by a script, so the DOM the browser returns proves scripts
// ran on the page the server sent.
constexpr const char* page_html =
    "<!doctype html><html><head><title>Quote board</title>"
    "<style>body{margin:0;background:#0b5394;color:#fff;font:48px sans-serif}</style></head>"
    "<body><p id=\"msg\">loading</p><script>document.getElementById('msg').textContent="
    "'rendered ' + (6 * 7);</script></body></html>";

// The agent's snippet. {url} becomes the page's address under the pinned name.
constexpr const char* browser_snippet = R"py(import os, subprocess, sys

proxy = os.environ["HTTP_PROXY"]          # the run's egress proxy: its only way out
out = os.environ["SANDBOX_OUTPUT_DIR"]
profile = "/tmp/chromium-profile"         # fresh, in the sandbox's own tmpfs
base = ["/usr/bin/chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
        "--no-first-run", "--no-default-browser-check", "--disable-extensions",
        "--user-data-dir=" + profile,
        "--proxy-server=" + proxy, "--proxy-bypass-list=<-loopback>",
        "--window-size={width},{height}"]
dom = subprocess.run(base + ["--dump-dom", "{url}"], capture_output=True, text=True, timeout=60)
print(dom.stdout.strip())
shot = subprocess.run(base + ["--screenshot=" + os.path.join(out, "page.png"), "{url}"],
                      capture_output=True, text=True, timeout=60)
if dom.returncode or shot.returncode:
    sys.stderr.write(dom.stderr[-2000:] + shot.stderr[-2000:])
    sys.exit(1)
print("profile:", sorted(os.listdir(profile))[:3], "...")
# The same name on another port (the host's own port 80 under the pinned loopback name) is
# not the page's server: the proxy refuses it.
import urllib.request, urllib.error
try:
    urllib.request.urlopen("http://{host}:80/", timeout=10)
    print("port 80: reached")
except urllib.error.HTTPError as e:
    print("port 80: refused", e.code)
)py";

// A tiny HTTP/1.1 server on 127.0.0.1: the page for every request, one per connection.
asio::awaitable<void> serve_page(asio::ip::tcp::acceptor& acceptor, int& requests) {
  for (;;) {
    auto [ec, sock] = co_await acceptor.async_accept(asio::as_tuple(asio::use_awaitable));
    if (ec) co_return;  // closed
    std::string head;
    char buf[1024];
    while (head.find("\r\n\r\n") == std::string::npos && head.size() < 16384) {
      auto [rec, n] =
          co_await sock.async_read_some(asio::buffer(buf), asio::as_tuple(asio::use_awaitable));
      if (rec) break;
      head.append(buf, n);
    }
    if (head.empty()) continue;
    ++requests;
    const bool favicon = head.rfind("GET /favicon.ico", 0) == 0;
    std::string body = favicon ? "" : page_html;
    std::string resp = std::string(favicon ? "HTTP/1.1 404 Not Found" : "HTTP/1.1 200 OK") +
                       "\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    co_await asio::async_write(sock, asio::buffer(resp), asio::as_tuple(asio::use_awaitable));
  }
}

bool must_work() {
  const char* ci = std::getenv("CI");
  const char* mw = std::getenv("SANDBOX_MUST_WORK");
  return (ci != nullptr && std::string(ci) == "true") || (mw != nullptr && std::string(mw) == "1");
}

struct checker {
  int failures = 0;
  void expect(bool ok, const std::string& what) {
    std::cout << (ok ? "  ok:     " : "  FAILED: ") << what << "\n";
    if (!ok) ++failures;
  }
};

// Width and height from a PNG's IHDR chunk (PNG spec, 11.2.2); nullopt when `png` is not a
// PNG.
std::optional<std::pair<std::uint32_t, std::uint32_t>> png_size(const std::string& png) {
  static const std::string signature("\x89PNG\r\n\x1a\n", 8);
  if (png.size() < 24 || png.compare(0, 8, signature) != 0 || png.compare(12, 4, "IHDR") != 0) {
    return std::nullopt;
  }
  auto be32 = [&](std::size_t at) {
    std::uint32_t v = 0;
    for (std::size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(png[at + i]);
    return v;
  };
  return std::pair{be32(16), be32(20)};
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (auto at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
}

int run_example(sandbox::runtime_options options, bool skip_unavailable,
                const std::string& png_out) {
  asio::io_context io;
  asio::ip::tcp::acceptor server(io, {asio::ip::make_address("127.0.0.1"), 0});
  const std::uint16_t port = server.local_endpoint().port();
  int requests = 0;

  // 2. The runtime: container level, the "browser" runtime, the pinned page host, and the
  //    workload profile for browsers.
  options.container.enabled = true;
  options.runtimes.push_back({.name = "browser",
                              .argv = {"/usr/bin/python3", "{source}"},
                              .source_name = "main.py",
                              .image = "chromium"});
  options.egress.pinned_hosts[page_host] = {"127.0.0.1"};
  // Only the test server's port: with the name pinned to 127.0.0.1, any other plain-HTTP
  // port would open the host's own loopback services (port 80, …) to the page.
  options.egress.http_ports = {port};
  options.egress.connect_ports = {};
  options.policy.max_timeout = 60s;
  options.policy.max_memory_bytes = 2ULL << 30;
  // The workload profile for browsers: Chromium starts a few processes with dozens of
  // threads each, keeps a profile directory and shares its rendered frames through
  // /dev/shm. A snippet's run keeps the policy's smaller defaults (64 pids, 16 MiB
  // /dev/shm); the ticket below names this one. (Each tmpfs is also capped at an eighth of
  // the memory limit: 2 GiB gives /dev/shm its 256 MiB.)
  options.policy.profiles["browser"] = {.max_pids = 512,
                                        .max_open_files = 4096,
                                        .tmp_bytes = 256ULL << 20,
                                        .home_bytes = 64ULL << 20,
                                        .shm_bytes = 256ULL << 20,
                                        .tmpfs_inodes = 16384,
                                        .memory_limit_bytes = 2ULL << 30,
                                        .timeout = 45s};

  auto rt = sandbox::runtime::create(io.get_executor(), options);
  if (!rt) {
    std::cout << "cannot create the runtime: " << rt.error().message() << "\n";
    return exit_fail;
  }
  bool backend_ok = false;
  for (const auto& b : rt->backends()) {
    if (b.isolation == sandbox::isolation::container && b.registered) backend_ok = true;
  }
  auto catalog = rt->catalog();
  auto image = catalog.runtimes.find("browser");
  const bool image_ok = image != catalog.runtimes.end() && image->second.has_value();
  if (!backend_ok || !image_ok) {
    std::cout << "this host cannot run the browser example:\n";
    for (const auto& b : rt->backends()) {
      std::cout << "  backend " << sandbox::to_string(b.isolation) << " (" << b.name
                << "): " << (b.registered ? "registered" : "refused: " + b.reason) << "\n";
    }
    if (!image_ok) {
      std::cout << "  image chromium: not installed (sudo tools/setup.sh, or sandboxctl image "
                   "build chromium --package chromium --package fonts-dejavu-core --package "
                   "python3)\n";
    }
    if (skip_unavailable && !must_work()) {
      std::cout << "skipped (exit 77)\n";
      return exit_skip;
    }
    return exit_fail;
  }
  std::cout << "runtime: container backend registered; chromium image " << *image->second << "\n";

  // 3. The ticket: the one host name, container isolation.
  sandbox::ticket_issuer issuer;
  auto ticket = issuer.issue({.id = "browser-1",
                              .tenant = tenant,
                              .isolation = sandbox::isolation::container,
                              .max_timeout = 60s,
                              .max_memory_bytes = 2ULL << 30,
                              .egress = {page_host},
                              .profile = "browser"},
                             sandbox::network_grant{});
  if (!ticket) {
    std::cout << "cannot issue the ticket: " << ticket.error().message() << "\n";
    return exit_fail;
  }

  // 4. The run.
  const std::string url = "http://" + std::string(page_host) + ":" + std::to_string(port) + "/";
  std::string source = browser_snippet;
  replace_all(source, "{url}", url);
  replace_all(source, "{host}", page_host);
  replace_all(source, "{width}", std::to_string(window_width));
  replace_all(source, "{height}", std::to_string(window_height));
  // Timeout and memory limit are left to the profile.
  sandbox::run_request request{.runtime = "browser",
                               .source = source,
                               .network = true,
                               .egress = {page_host},
                               .files_out = {.max_files = 2, .max_bytes = 8ULL << 20}};
  sandbox::run_result result;
  asio::co_spawn(io, serve_page(server, requests), asio::detached);
  rt->async_run(request, *ticket, [&](boost::system::error_code ec, sandbox::run_result r) {
    if (ec) r.message += " (operation: " + ec.message() + ")";
    result = std::move(r);
    boost::system::error_code ignored;
    server.close(ignored);  // lets io.run() return
  });
  io.run();

  std::cout << "\n== the browser run\n"
            << "  code:      " << sandbox::to_string(result.code)
            << (result.message.empty() ? "" : " (" + result.message + ")") << "\n"
            << "  backend:   " << result.backend << ", isolation "
            << sandbox::to_string(result.isolation) << "\n"
            << "  stdout:\n    " << result.std_out.summary << "\n";
  if (!result.std_err.summary.empty()) {
    std::cout << "  stderr (" << result.std_err.total_bytes << " bytes):\n    "
              << result.std_err.summary << "\n";
  }
  bool proxied = false;
  for (const auto& e : result.egress_attempts) {
    std::cout << "  egress:    " << e.protocol << " " << (e.host.empty() ? e.address : e.host)
              << " port " << e.port << ", " << (e.allowed ? "allowed" : "refused") << " ("
              << e.reason << "), " << e.bytes_down << " bytes down\n";
    if (e.protocol == "http" && e.host == page_host && e.allowed && e.bytes_down > 0) {
      proxied = true;
    }
  }
  std::cout << "  limits:    timeout " << result.timeout.count() << " ms, memory "
            << result.memory_limit_bytes << " bytes (the browser profile's)\n";
  std::cout << "  usage:     wall " << result.usage.wall.count() << " ms, cpu "
            << result.usage.cpu.count() << " ms, peak memory " << result.usage.peak_memory_bytes
            << " bytes\n";

  // 5. The screenshot, by blob id.
  checker check;
  check.expect(result.code == sandbox::code::ok, "the run ended ok");
  check.expect(result.timeout == 45s && result.memory_limit_bytes == (2ULL << 30),
               "the run got the browser profile's timeout and memory limit");
  check.expect(result.std_out.summary.find("rendered 42") != std::string::npos,
               "the DOM shows the page's script ran (\"rendered 42\")");
  check.expect(proxied, "the page came through the run's egress proxy");
  bool port80_refused = false;
  for (const auto& e : result.egress_attempts) {
    if (e.protocol == "http" && e.host == page_host && e.port == 80 && !e.allowed) {
      port80_refused = true;
    }
  }
  check.expect(
      port80_refused && result.std_out.summary.find("port 80: refused 403") != std::string::npos,
      "the page's name on the host's port 80 was refused by the proxy");
  check.expect(requests >= 2,
               "the test server answered the browser (" + std::to_string(requests) + " requests)");
  std::optional<std::string> png;
  for (const auto& f : result.files_out) {
    if (f.name != "page.png") continue;
    auto bytes = rt->blobs()->get(tenant, f.blob);
    if (bytes) png = std::move(*bytes);
    std::cout << "  output:    page.png " << f.blob << " (" << f.bytes << " bytes)\n";
  }
  check.expect(png.has_value(), "page.png came back as an output blob");
  if (png) {
    auto size = png_size(*png);
    check.expect(size.has_value(), "page.png is a PNG");
    if (size) {
      check.expect(size->first == window_width && size->second == window_height,
                   "page.png is " + std::to_string(size->first) + "x" +
                       std::to_string(size->second) + " (the window's size)");
    }
    if (!png_out.empty()) {
      std::ofstream(png_out, std::ios::binary) << *png;
      std::cout << "  written:   " << png_out << "\n";
    }
  }
  std::cout << "\n"
            << (check.failures == 0
                    ? "browser_screenshot: ok"
                    : "browser_screenshot: " + std::to_string(check.failures) + " check(s) failed")
            << "\n";
  return check.failures == 0 ? exit_ok : exit_fail;
}

}  // namespace

int main(int argc, char** argv) {
  std::string state_dir, image_dir, blob_dir, png_out;
  bool skip_unavailable = false;
  po::options_description desc(
      "usage: browser_screenshot [options]\n\n"
      "Renders a page from a local test server with Debian's Chromium inside the container\n"
      "sandbox and gets the screenshot back as a blob (see the comment at the top of\n"
      "examples/browser_screenshot/browser_screenshot.cpp). Needs root, crun and the\n"
      "chromium image.\n\noptions");
  desc.add_options()("help,h", "print this help")("state-dir", po::value(&state_dir),
                                                  "per-host state directory")(
      "image-dir", po::value(&image_dir),
      "image store (default: $SANDBOX_IMAGE_DIR, else the library's default)")(
      "blob-dir", po::value(&blob_dir), "blob store directory")(
      "png", po::value(&png_out), "also write the screenshot to this file")(
      "skip-unavailable", po::bool_switch(&skip_unavailable),
      "exit 77 instead of 1 when the container backend or the chromium image is unavailable "
      "(ignored when CI=true or SANDBOX_MUST_WORK=1)");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "browser_screenshot: " << e.what() << "\n(see browser_screenshot --help)\n";
    return exit_usage;
  }
  if (vm.count("help") != 0) {
    std::cout << desc << "\n";
    return exit_ok;
  }
  if (image_dir.empty() && std::getenv("SANDBOX_IMAGE_DIR") != nullptr) {
    image_dir = std::getenv("SANDBOX_IMAGE_DIR");
  }
  auto options = sandbox::default_runtime_options();
  try {
    if (!state_dir.empty()) options.state_dir = std::filesystem::absolute(state_dir);
    if (!image_dir.empty()) options.image_dir = std::filesystem::absolute(image_dir);
    if (!blob_dir.empty()) options.blob_dir = std::filesystem::absolute(blob_dir);
  } catch (const std::filesystem::filesystem_error& e) {
    std::cerr << "browser_screenshot: " << e.what() << "\n";
    return exit_usage;
  }
  try {
    return run_example(options, skip_unavailable, png_out);
  } catch (const std::exception& e) {
    std::cout << "browser_screenshot: failed: " << e.what() << "\n";
    return exit_fail;
  }
}
