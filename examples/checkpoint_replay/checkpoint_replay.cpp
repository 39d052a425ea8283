// checkpoint_replay: an agent framework that checkpoints and restarts must read a run's
// stored result, never run the code again. This program shows the whole cycle with a real
// sandbox:
//
//   1. creates a runtime (process backend, the image and blob stores) that signs an
//      execution receipt for each run with a fresh Ed25519 key,
//   2. runs a Python snippet whose output is random (a second execution would print
//      something else) and that writes an output file,
//   3. makes the run's record, pins its blobs (so garbage collection keeps them), and writes
//      the record to a file: the checkpoint,
//   4. destroys the runtime — the "restart",
//   5. creates a new runtime on the same stores, reads the checkpoint back (strictly
//      decoded), and replays it: the same result, byte for byte, with nothing executed; the
//      receipt still verifies and describes it; the output file is read back by its blob id,
//   6. unpins the record and collects the tenant's unpinned blobs: replaying again answers
//      `blob_not_found`, naming the blob that is gone.
//
// Exit status: 0 when every step behaved as described; 1 otherwise, or when this host cannot
// run the process backend with the python3 image; 2 for bad options. With
// --skip-unavailable an unavailable backend or image exits 77 (CTest's "skipped") unless
// CI=true or SANDBOX_MUST_WORK=1.
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "sandbox/sandbox.hpp"

namespace po = boost::program_options;
using namespace std::chrono_literals;

namespace {

constexpr int exit_ok = 0;
constexpr int exit_fail = 1;
constexpr int exit_usage = 2;
constexpr int exit_skip = 77;
constexpr const char* tenant = "replay-demo";

constexpr const char* snippet = R"py(import os, secrets
token = secrets.token_hex(8)
print("token", token)
with open(os.path.join(os.environ["SANDBOX_OUTPUT_DIR"], "token.txt"), "w") as f:
    f.write(token + "\n")
)py";

bool must_work() {
  const char* ci = std::getenv("CI");
  const char* mw = std::getenv("SANDBOX_MUST_WORK");
  return (ci != nullptr && std::string(ci) == "true") || (mw != nullptr && std::string(mw) == "1");
}

/// Fails the example with a message.
struct failed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void expect(bool ok, const std::string& what) {
  if (!ok) throw failed(what);
}

sandbox::runtime make_runtime(const sandbox::runtime_options& options) {
  auto rt = sandbox::runtime::create(options);
  if (!rt) throw failed("cannot create the runtime: " + rt.error().message());
  return std::move(*rt);
}

/// True when the process backend and the python3 image are there (prints why not).
bool host_can_run(const sandbox::runtime& rt) {
  bool backend = false;
  for (const auto& b : rt.backends()) {
    if (b.isolation == sandbox::isolation::process && b.registered) backend = true;
  }
  auto catalog = rt.catalog();
  auto python = catalog.runtimes.find("python3");
  const bool image = python != catalog.runtimes.end() && python->second.has_value();
  if (backend && image) return true;
  std::cout << "this host cannot run the example:\n";
  for (const auto& b : rt.backends()) {
    std::cout << "  backend " << sandbox::to_string(b.isolation) << " (" << b.name
              << "): " << (b.registered ? "registered" : "refused: " + b.reason) << "\n";
  }
  if (!image) std::cout << "  runtime image python3: not installed (sudo tools/setup.sh)\n";
  return false;
}

void print_result(const char* label, const sandbox::run_result& r) {
  std::cout << label << ": code " << sandbox::to_string(r.code) << ", run " << r.run_id
            << ", stdout " << r.std_out.blob << " (" << r.std_out.bytes << " bytes) "
            << sandbox::escape_for_display(r.std_out.summary) << "\n";
  for (const auto& f : r.files_out) std::cout << "    file " << f.name << " " << f.blob << "\n";
}

int run_example(sandbox::runtime_options options, const std::filesystem::path& record_path,
                bool skip_unavailable) {
  // 1. A receipt key for this demonstration (a host keeps its key in a file:
  //    `sandboxctl ticket keygen`, then `sandboxctl serve --receipt-key`).
  auto pem = sandbox::generate_ed25519_key();
  expect(pem.has_value(), "cannot generate a key");
  auto signer = sandbox::receipt_signer::from_pem("demo", pem->private_pem);
  expect(signer.has_value(), "cannot load the key");
  options.receipt_signer = std::make_shared<const sandbox::receipt_signer>(*signer);
  sandbox::receipt_verifier verifier;
  expect(verifier.add_key("demo", pem->public_pem).has_value(), "cannot trust the key");

  auto ticket = sandbox::ticket_issuer{}.issue(
      {.id = "replay-demo-1", .tenant = tenant, .max_timeout = 8000ms});
  expect(ticket.has_value(), "cannot issue the ticket");
  const sandbox::run_request request{.runtime = "python3", .source = snippet, .timeout = 8000ms};

  std::string original_json;
  {
    auto rt = make_runtime(options);
    if (!host_can_run(rt)) {
      if (skip_unavailable && !must_work()) {
        std::cout << "skipped (exit 77)\n";
        return exit_skip;
      }
      return exit_fail;
    }
    // 2. Run it once.
    auto result = rt.run(request, *ticket);
    print_result("ran", result);
    expect(result.code == sandbox::code::ok, "the snippet did not end ok: " + result.message);
    expect(result.files_out.size() == 1, "the snippet's output file is missing");
    expect(result.receipt.has_value(), "the result carries no receipt");

    // 3. Record, pin, checkpoint.
    auto record = sandbox::make_run_record(request, *ticket, result);
    auto pinned = sandbox::pin_record(*rt.blobs(), record);
    expect(pinned.has_value(),
           "cannot pin the record's blobs: " + (pinned ? std::string() : pinned.error().message()));
    const std::string checkpoint = sandbox::encode(record);
    std::ofstream out(record_path, std::ios::binary | std::ios::trunc);
    out << checkpoint << "\n";
    out.close();
    expect(static_cast<bool>(out), "cannot write " + record_path.string());
    std::cout << "checkpoint: " << record_path.string() << " (" << checkpoint.size()
              << " bytes, request digest " << record.request_sha256 << ")\n";
    original_json = sandbox::encode(result);
  }  // 4. The runtime is destroyed: the process could exit here and start again.
  std::cout << "restart: the first runtime is gone\n";

  // 5. A new runtime replays the checkpoint.
  auto rt = make_runtime(options);
  std::ifstream in(record_path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  std::string checkpoint = text.str();
  if (!checkpoint.empty() && checkpoint.back() == '\n') checkpoint.pop_back();
  auto record = sandbox::decode_run_record(checkpoint);
  expect(record.has_value(),
         "the checkpoint does not decode: " + (record ? std::string() : record.error().message));
  auto replayed = rt.replay(*record, *ticket);
  expect(replayed.has_value(),
         "replay failed: " + (replayed ? std::string() : replayed.error().message));
  print_result("replayed", *replayed);
  expect(sandbox::encode(*replayed) == original_json,
         "the replayed result differs from the one the run returned");
  auto claims = verifier.verify(*replayed->receipt);
  expect(claims.has_value(),
         "the receipt does not verify: " + (claims ? std::string() : claims.error().message));
  expect(!sandbox::receipt_mismatch(*claims, *replayed), "the receipt does not describe it");
  std::cout << "receipt: verified (key demo), ticket " << claims->ticket_id << ", backend "
            << claims->backend << "\n";
  auto file = rt.blobs()->get(tenant, replayed->files_out[0].blob);
  expect(file.has_value(), "cannot read the output file back");
  std::cout << "token.txt from the blob store: " << sandbox::escape_for_display(*file) << "\n";
  expect(replayed->std_out.summary == "token " + *file, "stdout and token.txt disagree");

  // 6. Unpinned and collected: replay names the missing blob instead of running again.
  expect(sandbox::unpin_record(*rt.blobs(), *record).has_value(), "cannot unpin");
  sandbox::gc_options gc{.older_than = 0s, .tenants = {tenant}};
  auto report = rt.blobs()->collect_garbage(gc);
  expect(report.has_value(), "garbage collection failed");
  std::cout << "gc: removed " << report->removed.size() << " unpinned blobs of " << tenant << "\n";
  auto gone = rt.replay(*record, *ticket);
  expect(gone.has_error() && gone.error().code == sandbox::code::blob_not_found,
         "replay after GC did not answer blob_not_found");
  std::cout << "replay after gc: " << sandbox::to_string(gone.error().code) << ": "
            << gone.error().message << "\n";
  expect(gone.error().message.find(record->result.std_out.blob) != std::string::npos,
         "the message does not name the missing blob");
  std::cout << "ok\n";
  return exit_ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::string state_dir, image_dir, blob_dir, cgroup_parent, record = "checkpoint-record.json";
  bool skip_unavailable = false;
  po::options_description desc(
      "Runs a snippet, checkpoints its run record, restarts the runtime and replays the "
      "record\n(see the comment at the top of examples/checkpoint_replay/"
      "checkpoint_replay.cpp).\n\noptions");
  desc.add_options()("help,h", "print this help")("state-dir", po::value(&state_dir),
                                                  "per-host state directory")(
      "image-dir", po::value(&image_dir), "image store (default: $SANDBOX_IMAGE_DIR)")(
      "blob-dir", po::value(&blob_dir), "blob store directory")(
      "cgroup-parent", po::value(&cgroup_parent),
      "parent cgroup of runs (default: $SANDBOX_CGROUP_PARENT)")(
      "record", po::value(&record), "where the checkpoint (run record JSON) is written")(
      "skip-unavailable", po::bool_switch(&skip_unavailable),
      "exit 77 instead of 1 when the process backend or the python3 image is unavailable "
      "(ignored when CI=true or SANDBOX_MUST_WORK=1)");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "checkpoint_replay: " << e.what() << "\n(see checkpoint_replay --help)\n";
    return exit_usage;
  }
  if (vm.count("help") != 0) {
    std::cout << desc << "\n";
    return exit_ok;
  }
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return v == nullptr ? std::string() : std::string(v);
  };
  if (image_dir.empty()) image_dir = env("SANDBOX_IMAGE_DIR");
  if (cgroup_parent.empty()) cgroup_parent = env("SANDBOX_CGROUP_PARENT");
  auto options = sandbox::default_runtime_options();
  try {
    if (!state_dir.empty()) options.state_dir = std::filesystem::absolute(state_dir);
    if (!image_dir.empty()) options.image_dir = std::filesystem::absolute(image_dir);
    if (!blob_dir.empty()) options.blob_dir = std::filesystem::absolute(blob_dir);
  } catch (const std::filesystem::filesystem_error& e) {
    std::cerr << "checkpoint_replay: " << e.what() << "\n";
    return exit_usage;
  }
  if (!cgroup_parent.empty()) options.process.cgroup_parent = cgroup_parent;
  options.log = sandbox::make_stderr_log_sink(sandbox::log_level::warning);
  try {
    return run_example(options, std::filesystem::absolute(record), skip_unavailable);
  } catch (const std::exception& e) {
    std::cout << "checkpoint_replay: failed: " << e.what() << "\n";
    return exit_fail;
  }
}
