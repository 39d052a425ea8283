// `sandboxctl audit`: proves one level's guarantees on this host (sandbox/audit.hpp).
#include "sandbox/audit.hpp"

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "cli/cli_util.hpp"
#include "cli/verbs.hpp"

namespace sandboxctl {

// `sandboxctl audit`: the audited level's backend alone (so no other level can serve its
// runs), the audit's runs, the verdict as a table or one line of JSON. Exit 0 only when
// every check passed; 1 otherwise (the failing checks named), 2 for usage errors.
int cmd_audit(const std::vector<std::string>& args) {
  common_flags c;
  std::string level_name = "process", runtime = "python3";
  bool json = false;
  auto d = common_options(c);
  d.add_options()("isolation", po::value(&level_name),
                  "level to audit: process (default), container, gvisor or microvm")(
      "runtime", po::value(&runtime), "a Python 3 runtime to run the probe with (python3)")(
      "json", po::bool_switch(&json), "print the report as one line of JSON");
  parse(args, d, {});
  auto level = sandbox::isolation_from_string(level_name);
  if (!level) {
    throw usage_error(fmt::format("--isolation {}: expected process, container, gvisor or microvm",
                                  quote_name(level_name)));
  }
  auto o = options_from(c);
  // The probe is Python: a runtime that is not configured, or whose interpreter is not a
  // Python (argv[0]'s file name "python", "python3", "python3.11", ...), is a usage error,
  // not a failed audit.
  {
    auto spec = std::find_if(o.runtimes.begin(), o.runtimes.end(),
                             [&](const sandbox::runtime_spec& r) { return r.name == runtime; });
    if (spec == o.runtimes.end()) {
      std::string known;
      for (const auto& r : o.runtimes) known += (known.empty() ? "" : ", ") + r.name;
      throw usage_error(fmt::format("--runtime {}: unknown runtime (configured: {})",
                                    quote_name(runtime), known.empty() ? "none" : known));
    }
    std::string base = spec->argv.empty()
                           ? std::string()
                           : std::filesystem::path(spec->argv.front()).filename().string();
    const bool python =
        base.starts_with("python") && base.find_first_not_of("0123456789.", 6) == std::string::npos;
    if (!python) {
      throw usage_error(fmt::format(
          "--runtime {}: its interpreter {} is not Python (the audit's probe is Python)",
          quote_name(runtime), quote_name(spec->argv.empty() ? "(none)" : spec->argv.front())));
    }
  }
  o.process_backend = *level == sandbox::isolation::process;
  o.container.enabled = *level == sandbox::isolation::container;
  o.gvisor.enabled = *level == sandbox::isolation::gvisor;
  o.microvm.enabled = *level == sandbox::isolation::microvm;  // the config's settings kept
  o.microvm.warm_pool.clear();
  auto rt = sandbox::runtime::create(o);
  if (!rt) {
    std::cerr << "sandboxctl: audit: the runtime cannot be created: " << rt.error().message()
              << "\n";
    return exit_fail;
  }
  sandbox::audit_options ao;
  ao.isolation = *level;
  ao.runtime = runtime;
  auto report = sandbox::evaluate_audit(sandbox::gather_audit_evidence(*rt, ao));
  if (json) {
    std::cout << sandbox::encode_audit_report(report) << "\n";
  } else {
    std::cout << sandbox::format_audit_table(report);
  }
  return report.passed() ? exit_ok : exit_fail;
}

}  // namespace sandboxctl
