// `sandboxctl receipt verify`: checks an execution receipt (sandbox/receipt.hpp).
#include "sandbox/receipt.hpp"

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/cli_util.hpp"
#include "cli/verbs.hpp"
#include "sandbox/json.hpp"
#include "sandbox/record.hpp"

namespace sandboxctl {

// `receipt verify --trusted-keys PATH FILE`: FILE is a receipt document, a run result with a
// "receipt", or a run record whose result has one. The signature is checked, and for a
// result or record the receipt must also describe that result (`receipt_mismatch`). Prints
// the verified claims; exit 1 naming what failed.
int cmd_receipt(const std::vector<std::string>& args) {
  std::string verb, file;
  std::vector<std::string> keys;
  po::options_description d("options");
  d.add_options()("verb", po::value(&verb))("file", po::value(&file))(
      "trusted-keys", po::value(&keys), "public key file or directory of <kid>.pub.pem");
  po::positional_options_description pos;
  pos.add("verb", 1).add("file", 1);
  parse(args, d, pos);
  if (verb != "verify") throw usage_error("receipt: expected verify");
  if (file.empty() || keys.empty())
    throw usage_error("receipt verify: --trusted-keys and FILE needed");
  sandbox::receipt_verifier v;
  for (const auto& k : keys) {
    auto loaded = v.load_keys(std::filesystem::absolute(k));
    if (!loaded) {
      throw usage_error(
          fmt::format("--trusted-keys {}: {}", quote_name(k), loaded.error().message()));
    }
  }
  const std::size_t max_bytes = max_request_file * 2;
  auto text = read_file(file, max_bytes);
  if (text.size() > max_bytes) throw usage_error(fmt::format("{} is too large", quote_name(file)));
  auto fail = [](const std::string& why) {
    std::cerr << "sandboxctl: receipt verify: " << why << "\n";
    return exit_fail;
  };
  // Which kind of document: judged by its top-level members only; each is then decoded
  // strictly by its own decoder.
  std::optional<sandbox::run_result> result;
  std::string receipt_doc = text;
  nlohmann::json probe = nlohmann::json::parse(text, nullptr, false);
  if (probe.is_object() && probe.contains("result") && probe.contains("record_id")) {
    auto rec = sandbox::decode_run_record(text);
    if (!rec) return fail(rec.error().message);
    result = rec->result;
  } else if (probe.is_object() && probe.contains("code")) {
    auto r = sandbox::decode_run_result(text);
    if (!r) return fail("result: " + r.error().message);
    result = *r;
  }
  if (result) {
    if (!result->receipt) return fail("the result carries no receipt");
    receipt_doc = *result->receipt;
  }
  auto claims = v.verify(receipt_doc);
  if (!claims) return fail(claims.error().message);
  if (result) {
    if (auto field = sandbox::receipt_mismatch(*claims, *result)) {
      return fail("the receipt does not describe this result: " + *field + " differs");
    }
  }
  std::cout << sandbox::encode(*claims) << "\n";
  return exit_ok;
}

}  // namespace sandboxctl
