// `sandboxctl ticket`: signed tickets (keygen, sign, verify, derive).
#include <filesystem>
#include <iostream>
#include <optional>

#include "cli/cli_util.hpp"
#include "cli/verbs.hpp"
#include "sandbox/approval.hpp"
#include "sandbox/json.hpp"

namespace sandboxctl {
namespace {

// True when `flag` was given (also as `flag=value`), even with an empty value.
bool vm_has(const std::vector<std::string>& args, const std::string& flag) {
  for (const auto& a : args) {
    if (a == flag || a.rfind(flag + "=", 0) == 0) return true;
  }
  return false;
}

}  // namespace

// `ticket keygen --kid K --out DIR`, `ticket sign --key FILE [--kid K] [--parent DOC] T.json`,
// `ticket verify --trusted-keys PATH... DOC`, `ticket derive --ticket T --approval A [...]`.
int cmd_ticket(const std::vector<std::string>& args) {
  std::string verb, file, kid, out_dir, key_path, parent_path, ticket_path, approval_path, id;
  std::string ttl_text;
  std::vector<std::string> trusted, domains;
  po::options_description d("ticket options");
  d.add_options()("verb", po::value(&verb))("file", po::value(&file))(
      "kid", po::value(&kid), "key id (keygen: required; sign: default from the key file)")(
      "out", po::value(&out_dir), "keygen: directory for <kid>.pem and <kid>.pub.pem")(
      "key", po::value(&key_path), "sign: the private key file (<kid>.pem)")(
      "parent", po::value(&parent_path), "sign: the parent's signed document (derived ticket)")(
      "trusted-keys", po::value(&trusted), "verify: public key file or directory (repeatable)")(
      "ticket", po::value(&ticket_path),
      "derive: the parent ticket (plain, or signed with "
      "--trusted-keys)")("approval", po::value(&approval_path),
                         "derive: the approval request (or a run result carrying one)")(
      "domain", po::value(&domains), "derive: approve only this domain (repeatable)")(
      "ttl-s", po::value(&ttl_text), "derive: lifetime in seconds (1-3600, default 600)")(
      "id", po::value(&id), "derive: the derived ticket's id (default: random)");
  po::positional_options_description pos;
  pos.add("verb", 1).add("file", 1);
  parse(args, d, pos);
  if (verb == "keygen") {
    if (kid.empty() || out_dir.empty()) throw usage_error("ticket keygen: --kid and --out needed");
    if (!sandbox::is_valid_key_id(kid)) {
      throw usage_error(fmt::format("ticket keygen: invalid key id {} (1-64 of [A-Za-z0-9._-])",
                                    quote_name(kid)));
    }
    auto r = sandbox::write_ed25519_key_files(std::filesystem::absolute(out_dir), kid);
    if (!r) {
      std::cerr << fmt::format("sandboxctl: ticket keygen: {}: {}\n", quote_name(out_dir),
                               r.error().message());
      return exit_fail;
    }
    std::cout << (std::filesystem::path(out_dir) / (kid + ".pem")).string() << "\n"
              << (std::filesystem::path(out_dir) / (kid + ".pub.pem")).string() << "\n";
    return exit_ok;
  }
  if (verb == "sign") {
    if (key_path.empty() || file.empty())
      throw usage_error("ticket sign: --key FILE and TICKET.json needed");
    auto signer = sandbox::ticket_signer::load(std::filesystem::absolute(key_path), kid);
    if (!signer) {
      std::cerr << fmt::format("sandboxctl: ticket sign: --key {}: {}\n", quote_name(key_path),
                               signer.error().message());
      return exit_fail;
    }
    auto text = read_file(file, max_ticket_file);
    if (text.size() > max_ticket_file)
      throw usage_error(fmt::format("ticket file {} is too large", quote_name(file)));
    auto t = sandbox::ticket_issuer{}.decode(text);
    if (!t) {
      std::cerr << "sandboxctl: ticket sign: ticket: " << t.error().message << "\n";
      return exit_fail;
    }
    sandbox::result<std::string> doc = sandbox::make_error_code(sandbox::errc::invalid_argument);
    if (t->is_derived()) {
      if (parent_path.empty()) {
        throw usage_error(
            "ticket sign: a derived ticket needs --parent (its parent's signed document)");
      }
      auto parent = read_file(parent_path, sandbox::max_signed_ticket_bytes);
      doc = signer->sign(*t, parent);
    } else {
      if (!parent_path.empty())
        throw usage_error("ticket sign: --parent is for derived tickets only");
      doc = signer->sign(*t);
    }
    if (!doc) {
      std::cerr << "sandboxctl: ticket sign: " << doc.error().message()
                << (t->is_derived() ? " (is --parent the signed parent of this ticket?)" : "")
                << "\n";
      return exit_fail;
    }
    std::cout << *doc << "\n";
    return exit_ok;
  }
  if (verb == "verify") {
    if (trusted.empty() || file.empty()) {
      throw usage_error("ticket verify: --trusted-keys PATH and a signed ticket document needed");
    }
    auto keys = trusted_keys_of(trusted);
    auto text = read_file(file, sandbox::max_signed_ticket_bytes);
    auto t = keys.verify(text, std::chrono::system_clock::now());
    if (!t) {
      std::cerr << "sandboxctl: ticket verify: " << t.error().message << "\n";
      return exit_fail;
    }
    std::cout << sandbox::encode(*t) << "\n";
    return exit_ok;
  }
  if (verb == "derive") {
    if (ticket_path.empty() || approval_path.empty()) {
      throw usage_error("ticket derive: --ticket PARENT and --approval FILE needed");
    }
    auto parent = load_ticket(ticket_path, trusted);
    if (!parent) {
      std::cerr << "sandboxctl: ticket derive: " << parent.error().message << "\n";
      return exit_fail;
    }
    // An approval request, or the approval_required result that carries one.
    const auto text = read_file(approval_path, max_request_file);
    std::optional<sandbox::approval_request> approval;
    if (auto q = sandbox::decode_approval_request(text)) {
      approval = std::move(*q);
    } else if (auto r = sandbox::decode_run_result(text); r && r->approval) {
      approval = std::move(*r->approval);
    } else {
      std::cerr << "sandboxctl: ticket derive: --approval: " << q.error().message << "\n";
      return exit_fail;
    }
    sandbox::derive_options o;
    o.id = id;
    if (!ttl_text.empty() || vm_has(args, "--ttl-s")) {
      o.ttl = std::chrono::seconds(
          parse_number<std::int64_t>("ttl-s", ttl_text, 1, sandbox::max_derived_ttl.count()));
    }
    if (!domains.empty()) o.domains = domains;
    auto d = sandbox::ticket_issuer{}.derive(*parent, *approval, o);
    if (!d) {
      std::cerr << "sandboxctl: ticket derive: the approval is not for this ticket, or the "
                   "options are out of range (domains must be among the requested ones)\n";
      return exit_fail;
    }
    std::cout << sandbox::encode(*d) << "\n";
    return exit_ok;
  }
  throw usage_error("ticket: expected keygen, sign, verify or derive");
}

}  // namespace sandboxctl
