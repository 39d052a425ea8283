// What sandboxctl's verbs share (one file per verb, src/cli/<verb>.cpp): exit statuses and
// usage errors, strict parsing of numeric options, reading the files the operator names,
// the store options every verb takes, tickets from files, and the display form of names
// printed on the operator's terminal (protocol/display_text.hpp).
//
// The CLI trusts its caller: it reads tickets from files the local operator controls (see
// docs/protocol.md).
#pragma once

#include <fmt/format.h>

#include <boost/program_options.hpp>
#include <boost/system/result.hpp>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "protocol/display_text.hpp"
#include "sandbox/blob_store.hpp"
#include "sandbox/image_store.hpp"
#include "sandbox/protocol.hpp"
#include "sandbox/runtime.hpp"
#include "sandbox/signed_ticket.hpp"
#include "sandbox/ticket.hpp"

namespace sandboxctl {

namespace po = boost::program_options;

using sandbox::detail::display_name;
using sandbox::detail::escape_format_chars;
using sandbox::detail::quote_name;

constexpr int exit_ok = 0;     ///< success (`run`: the result's code is `ok`)
constexpr int exit_fail = 1;   ///< failure (`run`: any other code)
constexpr int exit_usage = 2;  ///< usage errors: bad options, unreadable files

/// A bad option value or argument: `main` prints it with a pointer to `--help` and exits 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The longest duration any option accepts, in ms: a week, as the host configuration file
/// (anything longer is a typo, and would overflow the scheduler's clock arithmetic).
constexpr std::int64_t max_duration_ms = 7LL * 24 * 3600 * 1000;

/// Largest plain ticket file read (a signed document may be up to
/// `sandbox::max_signed_ticket_bytes`).
constexpr std::size_t max_ticket_file = 64 * 1024;
/// Largest request file read (decode_options' default).
constexpr std::size_t max_request_file = 8ULL << 20;

/**
 * Parses the value of the numeric option `--option`: decimal digits only (no sign, no
 * space), between `min` and `max`. Throws `usage_error` naming the option otherwise, so that
 * "-1" never wraps to 2^64-1 and a huge value never overflows later arithmetic.
 */
template <class T>
T parse_number(std::string_view option, std::string_view text, T min, T max) {
  auto range = [&] {
    return usage_error(fmt::format("--{}: expected an integer from {} to {}, got {}", option, min,
                                   max, quote_name(text)));
  };
  if (text.empty() || text.front() < '0' || text.front() > '9') throw range();
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (end != text.data() + text.size() ||
      (ec != std::errc{} && ec != std::errc::result_out_of_range)) {
    throw range();
  }
  if (ec == std::errc::result_out_of_range || v > static_cast<std::uint64_t>(max) ||
      v < static_cast<std::uint64_t>(min)) {
    throw range();
  }
  return static_cast<T>(v);
}

/// Reads at most `max_bytes + 1` bytes of `path` ('-' = stdin): enough for the caller to
/// tell "too large" without ever holding more (a request naming /dev/zero must not eat the
/// host). Throws `usage_error` when it cannot be read.
std::string read_file(const std::string& path, std::size_t max_bytes);

/// Opens an input file the caller named (`--file NAME=PATH`, `blob put FILE`) for blocking
/// reads; a FIFO waits for its writer. A directory, or a path that cannot be opened, is a
/// `usage_error` with a plain reason — never the blob store's own complaint about a failed
/// read. The caller closes the descriptor.
int open_input(const std::string& path);

/// Reads the host configuration file at `path` (a regular file of at most 1 MiB) into
/// `text`; returns why not ("cannot read '...': No such file or directory"), or "".
std::string read_config(const std::string& path, std::string& text);

/// Reads the host configuration file at `path` and applies it to `options`; returns why not
/// ("--config: '...' is a directory", "--config: scheduler.max_running: ..."), or "".
std::string load_config(const std::string& path, sandbox::runtime_options& options);

/// Loads every `--trusted-keys` path (a `<kid>.pub.pem` file or a directory of them) into
/// `keys`; returns why not ("--trusted-keys '...': ..."), or "".
std::string load_trusted_keys(const std::vector<std::string>& paths,
                              sandbox::ticket_verifier& keys);

/// The options every verb takes (the store options), and those several take.
struct common_flags {
  std::string state_dir, image_dir, blob_dir, cgroup_parent, config_path;
  std::string tenant, ticket_path;        ///< `--tenant`, `--ticket` where the verb has them
  std::vector<std::string> trusted_keys;  ///< `--trusted-keys`: verify signed ticket files
  bool verbose = false;
};

/// The store options (`--state-dir`, `--image-dir`, `--blob-dir`, `--cgroup-parent`,
/// `--config`, `-v`) bound to `c`.
po::options_description common_options(common_flags& c);

/// The default runtime options with the store options of `c` applied (paths made
/// absolute), and a stderr log sink at `quiet` (debug with `-v`). Not the configuration.
sandbox::runtime_options store_options_of(const common_flags& c, sandbox::log_level quiet);

/// `store_options_of(c, error)` with `--config` applied. Throws `usage_error`.
sandbox::runtime_options options_from(const common_flags& c);

/// Parses a verb's arguments. `--help` (or `-h`) prints the options and exits 0; anything
/// the parser refuses is a `usage_error`.
po::variables_map parse(const std::vector<std::string>& args, const po::options_description& d,
                        const po::positional_options_description& pos);

/// The verifier of `--trusted-keys` (empty when none were given). Throws `usage_error`.
sandbox::ticket_verifier trusted_keys_of(const std::vector<std::string>& paths);

/// A ticket file. A plain ticket is decoded by the local issuer (the CLI trusts its caller);
/// a signed document is verified against `trusted_keys`, which it needs; with trusted keys,
/// only signed documents are accepted (as the daemon does). A refused ticket is a rejection
/// ("ticket: ..."); an unreadable, oversized or unverifiable file a `usage_error`.
boost::system::result<sandbox::ticket, sandbox::rejection> load_ticket(
    const std::string& path, const std::vector<std::string>& trusted_keys = {});

/// The ticket of a `run` or `interp` without `--ticket` (the CLI acts for the user who runs
/// it): tenant "default", code.execute (or tool.run for `tool` when not empty) at `level` or
/// stronger, the policy's ceilings, never the network. `invalid_request` when the issuer
/// refuses the spec.
boost::system::result<sandbox::ticket, sandbox::rejection> local_ticket(const sandbox::policy& p,
                                                                        const std::string& tool,
                                                                        sandbox::isolation level);

/// `--isolation TEXT` of `verb` as a level (process when `given` is false). Throws
/// `usage_error` for an unknown level, or when `has_ticket` (the ticket's level decides).
sandbox::isolation isolation_flag(const std::string& verb, bool given, const std::string& text,
                                  bool has_ticket);

/// The tenant of `--tenant` or `--ticket` (not both; "default" when neither). Throws
/// `usage_error`.
std::string tenant_of(const common_flags& c);

/// The blob store and image store the store options name. Throw `std::runtime_error` when
/// they cannot be opened.
std::shared_ptr<sandbox::blob_store> open_blobs(const common_flags& c);
std::shared_ptr<sandbox::image_store> open_images(const common_flags& c, bool read_only = false);

}  // namespace sandboxctl
