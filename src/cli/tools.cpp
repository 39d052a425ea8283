// `sandboxctl tools`: the registered tools of the host configuration.
#include <iostream>

#include "cli/cli_util.hpp"
#include "cli/verbs.hpp"

namespace sandboxctl {

// `tools`: the registry as the configuration gives it (name, image, program, level, profile).
int cmd_tools(const std::vector<std::string>& args) {
  common_flags c;
  auto d = common_options(c);
  po::positional_options_description pos;
  parse(args, d, pos);
  auto opts = options_from(c);
  if (opts.tools.empty()) {
    std::cerr << "sandboxctl: no registered tools (the configuration's \"tools\" section)\n";
    return exit_ok;
  }
  for (const auto& t : opts.tools) {
    std::string argv = t.binary;
    for (const auto& a : t.args) argv += " " + quote_name(a);
    std::cout << fmt::format("{:<16} {:<10} {:<10} {:<10} {}\n", t.name, t.image,
                             sandbox::to_string(t.isolation), t.profile.empty() ? "-" : t.profile,
                             escape_format_chars(argv));
  }
  return exit_ok;
}

}  // namespace sandboxctl
