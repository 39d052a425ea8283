// The deployment audit (sandbox/audit.hpp): evidence from real runs, verdicts computed on
// the host. The probe is untrusted: its report is parsed strictly (one JSON object, known
// keys of known types, bounded sizes) and a malformed report fails the `probe` check and
// every check that needs it, never passes one.
#include "sandbox/audit.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <fmt/format.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string_view>

#include "protocol/json_strict.hpp"
#include "sandbox/json.hpp"
#include "sandbox/ticket.hpp"

namespace sandbox {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr std::size_t max_probe_report_bytes = 1 << 20;
constexpr std::size_t max_list_entries = 4096;
constexpr std::size_t max_host_targets = 64;

/// The only variables a run without the network and without request `env` may see
/// (core/run/machine.cpp writes these; docs/protocol.md "Environment").
const std::set<std::string, std::less<>>& protocol_env_names() {
  static const std::set<std::string, std::less<>> names{"PATH", "HOME", "LANG", "SANDBOX_INPUT_DIR",
                                                        "SANDBOX_OUTPUT_DIR"};
  return names;
}

// A printable, bounded form of a value the probe reported (it may be anything).
std::string shown(std::string_view s, std::size_t max = 80) {
  std::string out;
  for (char c : s.substr(0, max)) {
    auto u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f) ? std::string(1, c) : fmt::format("\\x{:02x}", u);
  }
  if (s.size() > max) out += "...";
  return out;
}

std::string join_shown(const std::vector<std::string>& v, std::size_t max_items = 8) {
  std::string out;
  for (std::size_t i = 0; i < v.size() && i < max_items; ++i) {
    if (i > 0) out += ", ";
    out += shown(v[i]);
  }
  if (v.size() > max_items) out += fmt::format(" (+{} more)", v.size() - max_items);
  return out;
}

/// The probe's report, after strict parsing.
struct probe_report {
  std::vector<std::string> env_names;
  std::map<std::string, std::string> status;  ///< /proc/self/status lines the probe read
  std::optional<std::int64_t> seccomp_mode;   ///< prctl(PR_GET_SECCOMP)
  std::optional<std::int64_t> no_new_privs;   ///< prctl(PR_GET_NO_NEW_PRIVS)
  std::vector<std::string> socket_files;
  std::vector<std::string> unix_connected;
  std::vector<std::string> interfaces;
  std::vector<std::string> reachable;  ///< addresses a connect reached (or was refused by)
  std::int64_t forks = 0;
  std::optional<std::string> fork_error;
  std::string proof;  ///< what the probe computed from the audit's nonce
};

std::optional<std::vector<std::string>> string_list(const json& v) {
  if (!v.is_array() || v.size() > max_list_entries) return std::nullopt;
  std::vector<std::string> out;
  for (const auto& e : v) {
    if (!e.is_string()) return std::nullopt;
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::optional<std::int64_t> opt_int(const json& v, bool* ok) {
  if (v.is_null()) return std::nullopt;
  if (!v.is_number_integer()) {
    *ok = false;
    return std::nullopt;
  }
  return v.get<std::int64_t>();
}

/// Parses the probe's stdout: exactly one JSON object (one line) with exactly these keys.
/// Empty optional plus `why` on anything else.
std::optional<probe_report> parse_probe(std::string_view text, std::string* why) {
  if (text.size() > max_probe_report_bytes) {
    *why = "probe report over 1 MiB";
    return std::nullopt;
  }
  while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  if (text.find('\n') != std::string_view::npos) {
    *why = "probe printed more than one line";
    return std::nullopt;
  }
  // The project's strict reader: duplicate keys (which parsers resolve differently), invalid
  // UTF-8 and deep nesting are refused, not guessed at.
  json j;
  decode_options strict;
  strict.max_document_bytes = max_probe_report_bytes;
  strict.max_depth = 4;
  if (!text.empty()) {
    if (auto bad = detail::parse_strict(text, strict, j)) {
      *why = "probe report is not strict JSON: " + shown(*bad, 160);
      return std::nullopt;
    }
  }
  if (!j.is_object()) {
    *why = text.empty() ? "probe printed nothing" : "probe report is not a JSON object";
    return std::nullopt;
  }
  static const std::set<std::string> keys{"v",
                                          "env_names",
                                          "status",
                                          "seccomp_mode",
                                          "no_new_privs",
                                          "socket_files",
                                          "unix_connected",
                                          "interfaces",
                                          "reachable",
                                          "forks",
                                          "fork_error",
                                          "proof"};
  for (const auto& [k, _] : j.items()) {
    if (keys.count(k) == 0) {
      *why = "probe report has an unknown field " + shown(k);
      return std::nullopt;
    }
  }
  for (const auto& k : keys) {
    if (!j.contains(k)) {
      *why = "probe report lacks field " + k;
      return std::nullopt;
    }
  }
  if (j["v"] != 1) {
    *why = "probe report version is not 1";
    return std::nullopt;
  }
  probe_report r;
  auto list = [&](const char* k, std::vector<std::string>& into) {
    auto l = string_list(j[k]);
    if (!l) {
      *why = fmt::format("probe report field {} is not a list of strings", k);
      return false;
    }
    into = std::move(*l);
    return true;
  };
  if (!list("env_names", r.env_names) || !list("socket_files", r.socket_files) ||
      !list("unix_connected", r.unix_connected) || !list("interfaces", r.interfaces) ||
      !list("reachable", r.reachable)) {
    return std::nullopt;
  }
  if (!j["status"].is_object() || j["status"].size() > 64) {
    *why = "probe report field status is not an object";
    return std::nullopt;
  }
  for (const auto& [k, v] : j["status"].items()) {
    if (!v.is_string()) {
      *why = "probe report field status." + shown(k) + " is not a string";
      return std::nullopt;
    }
    r.status[k] = v.get<std::string>();
  }
  bool ok = true;
  r.seccomp_mode = opt_int(j["seccomp_mode"], &ok);
  r.no_new_privs = opt_int(j["no_new_privs"], &ok);
  if (!ok || !j["forks"].is_number_integer() || !j["proof"].is_string() ||
      !(j["fork_error"].is_null() || j["fork_error"].is_string())) {
    *why = "probe report has a field of the wrong type";
    return std::nullopt;
  }
  r.forks = j["forks"].get<std::int64_t>();
  if (j["fork_error"].is_string()) r.fork_error = j["fork_error"].get<std::string>();
  r.proof = j["proof"].get<std::string>();
  return r;
}

/// A run result's code and, when it ran, its exit status: "ok (exit 0)".
std::string describe(const run_result& r) {
  std::string s(to_string(r.code));
  if (r.exit_code) s += fmt::format(" (exit {})", *r.exit_code);
  if (r.signal) s += fmt::format(" (signal {})", *r.signal);
  if (!r.message.empty() && r.code != code::ok) s += ": " + shown(r.message, 160);
  return s;
}

/// A numeric address in one spelling (inet_ntop of inet_pton), so "::ffff:1.2.3.4",
/// "0:0::1" and the like compare equal to the backend's form; anything else unchanged.
std::string canonical_address(const std::string& a) {
  unsigned char buf[sizeof(in6_addr)] = {};
  char text[INET6_ADDRSTRLEN] = {};
  if (::inet_pton(AF_INET, a.c_str(), buf) == 1) {
    ::inet_ntop(AF_INET, buf, text, sizeof text);
    return text;
  }
  if (::inet_pton(AF_INET6, a.c_str(), buf) == 1) {
    auto* a6 = reinterpret_cast<in6_addr*>(buf);
    if (IN6_IS_ADDR_V4MAPPED(a6)) {
      ::inet_ntop(AF_INET, buf + 12, text, sizeof text);
    } else {
      ::inet_ntop(AF_INET6, buf, text, sizeof text);
    }
    return text;
  }
  return a;
}

bool ran(const run_result& r) { return !r.backend.empty() || r.exit_code || r.signal; }

// --- host discovery ----------------------------------------------------------------------

void scan_sockets(const fs::path& dir, int depth, std::vector<std::string>& out) {
  std::error_code ec;
  fs::directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::directory_iterator() && out.size() < max_host_targets; it.increment(ec)) {
    auto st = it->symlink_status(ec);
    if (ec) break;
    if (st.type() == fs::file_type::socket) {
      out.push_back(it->path().string());
    } else if (st.type() == fs::file_type::directory && depth > 0) {
      scan_sockets(it->path(), depth - 1, out);
    }
  }
}

std::vector<std::string> discover_host_sockets() {
  std::vector<std::string> out;
  for (const char* d : {"/run", "/var/run", "/tmp"}) scan_sockets(d, 3, out);
  // Abstract sockets of the host's network namespace (the run's namespace has its own).
  std::ifstream unix_table("/proc/net/unix");
  std::string line;
  while (std::getline(unix_table, line) && out.size() < max_host_targets) {
    auto at = line.find(" @");
    if (at == std::string::npos) continue;
    std::string name = line.substr(at + 1);
    if (name.size() > 1 && std::find(out.begin(), out.end(), name) == out.end()) {
      out.push_back(name);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<std::string> discover_host_addresses() {
  std::vector<std::string> out;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) == 0) {
    for (auto* i = ifs; i != nullptr && out.size() < max_host_targets; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
      char buf[INET6_ADDRSTRLEN] = {};
      if (i->ifa_addr->sa_family == AF_INET) {
        ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf,
                    sizeof buf);
      } else if (i->ifa_addr->sa_family == AF_INET6) {
        auto* a6 = reinterpret_cast<sockaddr_in6*>(i->ifa_addr);
        if (IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr)) continue;  // needs a scope id
        ::inet_ntop(AF_INET6, &a6->sin6_addr, buf, sizeof buf);
      } else {
        continue;
      }
      out.emplace_back(buf);
    }
    ::freeifaddrs(ifs);
  }
  out.emplace_back("1.1.1.1");  // one public address: a route out at all
  return out;
}

// --- the snippets ------------------------------------------------------------------------

constexpr std::string_view probe_template = R"PY(# agent-sandbox audit probe
import errno, hashlib, json, os, signal, socket, stat, sys
NONCE = "@NONCE@"
HOST_SOCKETS = json.loads(r'''@SOCKETS@''')
HOST_ADDRESSES = json.loads(r'''@ADDRESSES@''')
MAX_FORKS = @MAX_FORKS@
out = {"v": 1}
out["env_names"] = sorted(os.environ.keys())
status = {}
try:
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("Seccomp", "NoNewPrivs", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
                status[k] = v.strip()
except OSError:
    pass
out["status"] = status
def prctl(op):
    try:
        import ctypes
        return int(ctypes.CDLL(None, use_errno=True).prctl(op, 0, 0, 0, 0))
    except Exception:
        return None
out["seccomp_mode"] = prctl(21)   # PR_GET_SECCOMP
out["no_new_privs"] = prctl(39)   # PR_GET_NO_NEW_PRIVS
found, seen = [], 0
for root, dirs, files in os.walk("/", followlinks=False):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys")]
    for name in files:
        seen += 1
        if seen > 200000 or len(found) >= 256:
            break
        p = os.path.join(root, name)
        try:
            if stat.S_ISSOCK(os.lstat(p).st_mode):
                found.append(p)
        except OSError:
            pass
out["socket_files"] = found
WELL_KNOWN = ["/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock",
              "/run/crio/crio.sock", "/run/podman/podman.sock", "/run/dbus/system_bus_socket",
              "/run/systemd/private", "/run/systemd/journal/socket", "/run/systemd/notify",
              "/dev/log", "/run/user/0/bus", "/tmp/.X11-unix/X0", "@/tmp/.X11-unix/X0",
              "@/org/freedesktop/systemd1/notify"]
connected = []
for p in WELL_KNOWN + HOST_SOCKETS:
    addr = "\0" + p[1:] if p.startswith("@") else p
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET):
        try:
            s = socket.socket(socket.AF_UNIX, kind)
        except OSError:
            continue
        s.settimeout(1)
        try:
            s.connect(addr)
            connected.append(p)
            break
        except OSError:
            pass
        finally:
            s.close()
out["unix_connected"] = connected
try:
    out["interfaces"] = sorted(n for _, n in socket.if_nameindex())
except OSError:
    names = []
    try:
        with open("/proc/net/dev") as f:
            for line in f.readlines()[2:]:
                names.append(line.split(":")[0].strip())
    except OSError:
        pass
    out["interfaces"] = sorted(names)
reachable = []
for a in HOST_ADDRESSES:
    fam = socket.AF_INET6 if ":" in a else socket.AF_INET
    # UDP connect succeeds exactly when there is a route; TCP sees a listener or a reset.
    try:
        s = socket.socket(fam, socket.SOCK_DGRAM)
        try:
            s.connect((a, 53))
            reachable.append(a)
            continue
        except OSError:
            pass
        finally:
            s.close()
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect((a, 22))
            reachable.append(a)
        except ConnectionRefusedError:
            reachable.append(a)
        except OSError:
            pass
        finally:
            s.close()
    except OSError:
        pass
out["reachable"] = reachable
pids, err = [], None
import gc
gc.collect()
gc.freeze()  # children share the parent's pages instead of copying them
try:
    while len(pids) < MAX_FORKS:
        pid = os.fork()
        if pid == 0:
            try:
                signal.pause()
            finally:
                os._exit(0)
        pids.append(pid)
except OSError as e:
    err = errno.errorcode.get(e.errno, str(e.errno))
for p in pids:
    try:
        os.kill(p, signal.SIGKILL)
    except OSError:
        pass
for p in pids:
    try:
        os.waitpid(p, 0)
    except OSError:
        pass
out["forks"] = len(pids)
out["fork_error"] = err
out["proof"] = hashlib.sha256(("agent-sandbox-audit:%s:%d" % (NONCE, len(NONCE))).encode()).hexdigest()
sys.stdout.write(json.dumps(out) + "\n")
)PY";

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (auto at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
  return s;
}

/// As JSON text safe inside a Python r''' string: no quote, no backslash sequences that end
/// it (json::dump escapes control characters; ''' cannot appear since ' is escaped).
std::string py_json(const std::vector<std::string>& v) {
  std::vector<std::string> kept(v.begin(), v.begin() + std::min(v.size(), max_host_targets));
  std::string s = json(kept).dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
  return replace_all(s, "'", "\\u0027");
}

constexpr std::string_view memory_template = R"PY(# agent-sandbox audit: memory
chunks, total = [], 0
while total < @CAP@:
    chunks.append(b"\x01" * (8 << 20))
    total += 8 << 20
print("allocated", total)
)PY";

constexpr std::string_view timeout_source =
    "# agent-sandbox audit: timeout\nimport time\ntime.sleep(60)\n";

audit_check check(std::string name, bool passed, std::string detail) {
  return {.name = std::move(name), .passed = passed, .detail = std::move(detail)};
}

/// The policy's own per-run values ("policy") and each workload profile's effective ones
/// ("policy.profiles.NAME"), for the configuration checks; an unresolvable profile is left out
/// (the `profiles` check names it).
std::vector<std::pair<std::string, policy>> run_limit_sets(const policy& p) {
  std::vector<std::pair<std::string, policy>> out{{"policy", p}};
  for (const auto& [name, _] : p.profiles) {
    if (auto eff = effective_limits(p, name))
      out.emplace_back("policy.profiles." + name, eff->limits);
  }
  return out;
}

/// The host-side configuration checks: no run at all, only the effective policy.
void evaluate_configuration(const audit_evidence& ev, std::vector<audit_check>& out) {
  const auto sets = run_limit_sets(ev.policy);
  auto verdict = [&](const char* name, const std::vector<std::string>& bad, std::string good) {
    // Each finding in full (they are the host's own words, bounded by the policy's size).
    std::string all;
    for (std::size_t i = 0; i < bad.size() && i < 8; ++i) {
      all += (i == 0 ? "" : "; ") + shown(bad[i], 400);
    }
    if (bad.size() > 8) all += fmt::format(" (+{} more)", bad.size() - 8);
    out.push_back(bad.empty() ? check(name, true, std::move(good)) : check(name, false, all));
  };
  const std::string scope =
      ev.policy.profiles.empty()
          ? std::string("the policy")
          : fmt::format("the policy and {} workload profiles", ev.policy.profiles.size());

  // cpu_limit: 0 millicores means no CPU bandwidth limit at all.
  {
    std::vector<std::string> bad;
    for (const auto& [where, l] : sets) {
      if (l.cpu_quota_millicores == 0) {
        bad.push_back(where + ".cpu_quota_millicores is 0 (no CPU limit)");
      }
    }
    verdict("cpu_limit", bad, "a CPU quota for " + scope);
  }
  // exit_grace
  if (ev.policy.exit_grace > audit_max_exit_grace || ev.policy.exit_grace.count() < 0) {
    out.push_back(check("exit_grace", false,
                        fmt::format("policy.exit_grace_ms is {} (at most {} ms)",
                                    ev.policy.exit_grace.count(), audit_max_exit_grace.count())));
  } else {
    out.push_back(check("exit_grace", true,
                        fmt::format("{} ms (at most {} ms)", ev.policy.exit_grace.count(),
                                    audit_max_exit_grace.count())));
  }
  // tmpfs_sizes: a tmpfs larger than the most memory any run may have is a misconfiguration
  // (writes there are charged to the run's memory).
  {
    std::vector<std::string> bad;
    for (const auto& [where, l] : sets) {
      for (auto [field, v] :
           {std::pair{"tmp_bytes", l.tmp_bytes}, std::pair{"home_bytes", l.home_bytes},
            std::pair{"shm_bytes", l.shm_bytes}}) {
        if (v > ev.policy.max_memory_bytes) {
          bad.push_back(fmt::format("{}.{} is {} (above policy.max_memory_bytes {})", where, field,
                                    v, ev.policy.max_memory_bytes));
        }
      }
    }
    verdict("tmpfs_sizes", bad,
            fmt::format("tmp, home and shm within policy.max_memory_bytes ({}) for {}",
                        ev.policy.max_memory_bytes, scope));
  }
  // open_files: a run's RLIMIT_NOFILE cannot be raised above the host's hard limit (every
  // such run would fail to start).
  {
    std::vector<std::string> bad;
    for (const auto& [where, l] : sets) {
      if (l.max_open_files == 0) {
        bad.push_back(where + ".max_open_files is 0");
      } else if (ev.host_max_open_files && l.max_open_files > *ev.host_max_open_files) {
        bad.push_back(
            fmt::format("{}.max_open_files is {} (above the host's hard RLIMIT_NOFILE {})", where,
                        l.max_open_files, *ev.host_max_open_files));
      }
    }
    verdict("open_files", bad,
            ev.host_max_open_files ? fmt::format("within the host's hard RLIMIT_NOFILE ({}) for {}",
                                                 *ev.host_max_open_files, scope)
                                   : "non-zero for " + scope + " (no host hard limit)");
  }
  // profiles: each resolves to limits a run can have.
  {
    std::vector<std::string> bad;
    const auto& pol = ev.policy;
    for (const auto& [name, prof] : pol.profiles) {
      const std::string where = "policy.profiles." + name;
      auto eff = effective_limits(pol, name);
      if (!eff) {
        bad.push_back(where + " does not resolve");
        continue;
      }
      if (eff->limits.max_pids == 0) bad.push_back(where + ".max_pids is 0");
      if (eff->limits.tmpfs_inodes == 0) bad.push_back(where + ".tmpfs_inodes is 0");
      if (prof.memory_limit_bytes && (*prof.memory_limit_bytes < pol.min_memory_bytes ||
                                      *prof.memory_limit_bytes > pol.max_memory_bytes)) {
        bad.push_back(fmt::format("{}.memory_limit_bytes is {} (outside {}..{})", where,
                                  *prof.memory_limit_bytes, pol.min_memory_bytes,
                                  pol.max_memory_bytes));
      }
      if (prof.timeout && (prof.timeout->count() <= 0 || *prof.timeout > pol.max_timeout)) {
        bad.push_back(fmt::format("{}.timeout_ms is {} (outside 1..{})", where,
                                  prof.timeout->count(), pol.max_timeout.count()));
      }
    }
    verdict("profiles", bad,
            pol.profiles.empty() ? std::string("no workload profiles")
                                 : fmt::format("{} workload profiles resolve to usable limits",
                                               pol.profiles.size()));
  }
  // tools: every registered entry is one the policy accepts (level, profile, binary, env,
  // egress).
  {
    std::vector<std::string> bad;
    for (std::size_t i = 0; i < ev.tools.size(); ++i) {
      if (auto problem = check_tool_entry(ev.tools[i], ev.policy)) {
        bad.push_back(fmt::format("tools[{}] ({}).{}", i, ev.tools[i].name, *problem));
      }
    }
    verdict("tools", bad,
            ev.tools.empty()
                ? std::string("no registered tools")
                : fmt::format("{} registered tools are valid under the policy", ev.tools.size()));
  }
}

}  // namespace

// --- report --------------------------------------------------------------------------------

bool audit_report::passed() const noexcept {
  return !checks.empty() &&
         std::all_of(checks.begin(), checks.end(), [](const audit_check& c) { return c.passed; });
}

std::vector<std::string> audit_report::failed() const {
  std::vector<std::string> out;
  for (const auto& c : checks) {
    if (!c.passed) out.push_back(c.name);
  }
  return out;
}

std::string audit_probe_proof(const std::string& nonce) {
  const std::string text = "agent-sandbox-audit:" + nonce + ":" + std::to_string(nonce.size());
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(text.data(), text.size(), md, &len, EVP_sha256(), nullptr) != 1) return {};
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

std::string audit_probe_source(const std::vector<std::string>& host_sockets,
                               const std::vector<std::string>& host_addresses,
                               std::uint32_t max_forks, const std::string& nonce) {
  std::string s(probe_template);
  // The nonce is embedded in a Python string literal: only hex digits are kept.
  std::string safe_nonce;
  for (char c : nonce) {
    if (std::isxdigit(static_cast<unsigned char>(c)) != 0) safe_nonce += c;
  }
  s = replace_all(s, "@NONCE@", safe_nonce);
  s = replace_all(s, "@MAX_FORKS@", std::to_string(max_forks));
  s = replace_all(s, "@SOCKETS@", py_json(host_sockets));
  s = replace_all(s, "@ADDRESSES@", py_json(host_addresses));
  return s;
}

// --- gathering -----------------------------------------------------------------------------

audit_evidence gather_audit_evidence(runtime& rt, const audit_options& o) {
  audit_evidence ev;
  ev.isolation = o.isolation;
  ev.runtime = o.runtime;
  ev.max_pids = rt.policy().max_pids;
  ev.policy = rt.policy();
  for (const auto& [name, t] : rt.catalog().tools) ev.tools.push_back(t.entry);
  if (rlimit rl{}; ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != RLIM_INFINITY) {
    ev.host_max_open_files = static_cast<std::uint64_t>(rl.rlim_max);
  }
  {
    unsigned char raw[16];
    if (RAND_bytes(raw, sizeof raw) == 1) {
      for (unsigned char b : raw) ev.nonce += fmt::format("{:02x}", b);
    }
  }
  ev.memory_limit_bytes = o.memory_limit_bytes;
  ev.timeout = o.timeout;
  ev.timeout_slack = o.timeout_slack;
  for (const auto& st : rt.backends()) {
    if (st.isolation == o.isolation) ev.backend = st;
  }
  if (auto img = rt.images()) {
    if (auto d = img->current_digest(o.runtime)) ev.current_digest = *d;
  } else {
    auto cat = rt.catalog();
    if (auto it = cat.runtimes.find(o.runtime); it != cat.runtimes.end() && it->second) {
      ev.current_digest = *it->second;
    }
  }

  // The probe and the memory check must end by themselves; their deadline bounds a failure,
  // not the host's speed: 8 s, or the host's own ceiling where it lets runs take longer (an
  // emulated guest: real Python under TCG on a loaded host needs more).
  const auto must_finish = std::max(std::chrono::milliseconds(8000), rt.policy().max_timeout);
  ticket_issuer issuer;
  auto mint = [&](std::string id, bool execute, std::optional<std::string> pin) {
    return issuer.issue(ticket_spec{.id = std::move(id),
                                    .tenant = o.tenant,
                                    .execute = execute,
                                    .isolation = o.isolation,
                                    .max_timeout = must_finish,
                                    .max_memory_bytes = 512ULL << 20,
                                    .runtime_digest = std::move(pin),
                                    .egress = {},
                                    .expires_at = std::nullopt,
                                    .tools = {},
                                    .profile = {}});
  };
  auto unavailable = [](std::string why) {
    run_result r;
    r.code = code::internal;
    r.message = std::move(why);
    return r;
  };
  auto request = [&](std::string src, std::chrono::milliseconds timeout,
                     std::uint64_t memory = 256ULL << 20) {
    run_request r;
    r.runtime = o.runtime;
    r.source = std::move(src);
    r.timeout = timeout;
    r.memory_limit_bytes = memory;
    return r;
  };
  auto run = [&](const result<ticket>& t, run_request req) {
    if (!t) return unavailable("audit ticket could not be issued: " + t.error().message());
    return rt.run(std::move(req), *t);
  };
  std::optional<std::string> pin;
  if (!ev.current_digest.empty()) pin = ev.current_digest;

  // 1. The probe, under a ticket pinning the current image.
  auto sockets = o.host_sockets.empty() ? discover_host_sockets() : o.host_sockets;
  auto addresses = o.host_addresses.empty() ? discover_host_addresses() : o.host_addresses;
  addresses.resize(std::min(addresses.size(), max_host_targets));  // as the probe embeds them
  ev.probe_addresses = addresses;
  std::string source = audit_probe_source(sockets, addresses, ev.max_pids * 2 + 64, ev.nonce);
  ev.probe = run(mint("audit-probe", true, pin), request(source, must_finish, 512ULL << 20));
  ev.probe_stdout = ev.probe.std_out.summary;
  if (!ev.probe.std_out.blob.empty() && rt.blobs()) {
    if (auto bytes = rt.blobs()->get(o.tenant, ev.probe.std_out.blob)) ev.probe_stdout = *bytes;
  }

  // 2. Memory: allocate four times the limit (plus gVisor's allowance).
  std::string mem = replace_all(std::string(memory_template), "@CAP@",
                                std::to_string(o.memory_limit_bytes * 4 + (512ULL << 20)));
  ev.memory = run(mint("audit-memory", true, std::nullopt),
                  request(mem, must_finish, o.memory_limit_bytes));

  // 3. Timeout.
  ev.timeout_run = run(mint("audit-timeout", true, std::nullopt),
                       request(std::string(timeout_source), o.timeout));

  // 4. A ticket that does not grant code.execute.
  ev.denied = run(mint("audit-denied", false, std::nullopt),
                  request("print('ran')\n", std::chrono::milliseconds(2000)));

  // 5. A ticket pinning an image that is not the current one.
  std::string other = "sha256:" + std::string(64, '0');
  if (ev.current_digest == other) other.back() = '1';
  ev.pin_mismatch = run(mint("audit-pin", true, other),
                        request("print('ran')\n", std::chrono::milliseconds(2000)));

  // 6. The protocol decoder.
  auto unknown = decode_run_request(
      R"J({"v":1,"runtime":"python3","source":"print(1)","audit_unknown_field":true})J");
  if (!unknown) ev.unknown_field_rejection = unknown.error().message;
  auto version = decode_run_request(R"J({"v":99,"runtime":"python3","source":"print(1)"})J");
  if (!version) ev.bad_version_rejection = version.error().message;
  return ev;
}

// --- verdicts ------------------------------------------------------------------------------

audit_report evaluate_audit(const audit_evidence& ev) {
  audit_report rep;
  rep.isolation = ev.isolation;
  auto& out = rep.checks;
  const std::string level(to_string(ev.isolation));

  // backend
  if (!ev.backend) {
    out.push_back(check("backend", false, level + " backend not enabled on this runtime"));
  } else if (!ev.backend->registered) {
    out.push_back(
        check("backend", false,
              fmt::format("{} backend refused: {}", level, shown(ev.backend->reason, 400))));
  } else {
    out.push_back(
        check("backend", true,
              fmt::format("{} ({}) passed its self-test", level, shown(ev.backend->name))));
  }

  // probe
  // The probe's report counts only where the host's own evidence of the same run agrees
  // with it: the levels whose backend records direct egress (process, container) must have
  // recorded the probe's connects to every address it was given, and so ended
  // network_disabled; and the report must answer this audit's nonce.
  const bool records_egress =
      ev.isolation == isolation::process || ev.isolation == isolation::container;
  std::string why;
  std::optional<probe_report> p;
  const bool probe_ran_ok =
      (ev.probe.code == code::ok || ev.probe.code == code::network_disabled) &&
      ev.probe.exit_code == 0;
  if (!probe_ran_ok) {
    why = "probe run ended " + describe(ev.probe);
    if (!ev.probe.std_err.summary.empty())
      why += "; stderr: " + shown(ev.probe.std_err.summary, 300);
  } else if (ev.probe.isolation != ev.isolation) {
    why = fmt::format("probe ran at {}, not {}", to_string(ev.probe.isolation), level);
  } else {
    p = parse_probe(ev.probe_stdout, &why);
  }
  if (p && (ev.nonce.empty() || p->proof != audit_probe_proof(ev.nonce))) {
    why = ev.nonce.empty() ? "no audit nonce: the probe's report cannot be bound to this audit"
                           : "the probe's proof " + shown(p->proof, 72) +
                                 " does not answer this audit's nonce (a canned or replayed "
                                 "report, or not the audit's probe)";
    p.reset();
  }
  if (p && records_egress) {
    std::set<std::string> recorded;
    for (const auto& a : ev.probe.egress_attempts) recorded.insert(canonical_address(a.address));
    std::vector<std::string> missing;
    for (const auto& a : ev.probe_addresses) {
      if (recorded.count(canonical_address(a)) == 0) missing.push_back(a);
    }
    if (ev.probe_addresses.empty()) {
      why = "the probe was given no address to try, so the host has no egress evidence";
      p.reset();
    } else if (ev.probe.code != code::network_disabled) {
      why = fmt::format(
          "the probe's run ended {} with {} egress attempts recorded by the host, but it tried "
          "{} addresses: at {} a real probe ends network_disabled",
          to_string(ev.probe.code), ev.probe.egress_attempts.size(), ev.probe_addresses.size(),
          level);
      p.reset();
    } else if (missing.size() > ev.probe.egress_attempts_dropped) {
      why = "the host recorded no egress attempt to " + join_shown(missing) +
            ", which the probe must have tried";
      p.reset();
    }
  }
  if (p) {
    out.push_back(
        check("probe", true,
              fmt::format("ran at {} on {} ({}); nonce answered{}", level, shown(ev.probe.backend),
                          to_string(ev.probe.code),
                          records_egress ? fmt::format("; {} egress attempts recorded by the host",
                                                       ev.probe.egress_attempts.size() +
                                                           ev.probe.egress_attempts_dropped)
                                         : std::string("; this level records no direct egress"))));
  } else {
    out.push_back(check("probe", false, why));
  }
  const std::string no_report = "no probe report (see check probe)";

  // environment
  if (!p) {
    out.push_back(check("environment", false, no_report));
  } else {
    std::vector<std::string> extra;
    for (const auto& n : p->env_names) {
      if (protocol_env_names().count(n) == 0) extra.push_back(n);
    }
    out.push_back(extra.empty()
                      ? check("environment", true, "only " + join_shown(p->env_names))
                      : check("environment", false,
                              "variables outside the protocol's set: " + join_shown(extra)));
  }

  auto status_is = [&](const char* k, std::string_view v) {
    auto it = p->status.find(k);
    return it != p->status.end() && it->second == v;
  };
  // seccomp: the kernel's answer (prctl), or /proc/self/status when prctl was unavailable.
  if (!p) {
    out.push_back(check("seccomp", false, no_report));
  } else if (p->seccomp_mode ? *p->seccomp_mode == 2 : status_is("Seccomp", "2")) {
    out.push_back(check("seccomp", true, "Seccomp: 2 (filter mode)"));
  } else {
    auto it = p->status.find("Seccomp");
    out.push_back(check("seccomp", false,
                        fmt::format("seccomp mode {} (expected 2: filter)",
                                    p->seccomp_mode         ? std::to_string(*p->seccomp_mode)
                                    : it != p->status.end() ? shown(it->second)
                                                            : "unknown")));
  }
  if (!p) {
    out.push_back(check("no_new_privs", false, no_report));
  } else if (p->no_new_privs ? *p->no_new_privs == 1 : status_is("NoNewPrivs", "1")) {
    out.push_back(check("no_new_privs", true, "NoNewPrivs: 1"));
  } else {
    auto it = p->status.find("NoNewPrivs");
    out.push_back(check("no_new_privs", false,
                        fmt::format("NoNewPrivs is {} (expected 1)",
                                    p->no_new_privs         ? std::to_string(*p->no_new_privs)
                                    : it != p->status.end() ? shown(it->second)
                                                            : "unknown")));
  }

  // capabilities: every set zero; gVisor shows no CapAmb line (no ambient set), which passes.
  if (!p) {
    out.push_back(check("capabilities", false, no_report));
  } else {
    std::vector<std::string> bad;
    for (const char* k : {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}) {
      auto it = p->status.find(k);
      if (it == p->status.end()) {
        if (std::string_view(k) != "CapAmb") bad.push_back(std::string(k) + " unknown");
        continue;
      }
      if (it->second.find_first_not_of('0') != std::string::npos || it->second.empty()) {
        bad.push_back(std::string(k) + "=" + shown(it->second, 20));
      }
    }
    out.push_back(bad.empty()
                      ? check("capabilities", true, "CapInh/Prm/Eff/Bnd/Amb all 0")
                      : check("capabilities", false, "capabilities held: " + join_shown(bad)));
  }

  // no_host_socket
  if (!p) {
    out.push_back(check("no_host_socket", false, no_report));
  } else if (!p->unix_connected.empty()) {
    out.push_back(
        check("no_host_socket", false, "host sockets reachable: " + join_shown(p->unix_connected)));
  } else if (!p->socket_files.empty()) {
    out.push_back(check("no_host_socket", false,
                        "socket files in the sandbox's view: " + join_shown(p->socket_files)));
  } else {
    out.push_back(check("no_host_socket", true,
                        "no socket file in view; no host unix or abstract socket connects"));
  }

  // no_route_out
  if (!p) {
    out.push_back(check("no_route_out", false, no_report));
  } else {
    std::vector<std::string> other_ifs;
    for (const auto& i : p->interfaces) {
      if (i != "lo") other_ifs.push_back(i);
    }
    if (!other_ifs.empty()) {
      out.push_back(
          check("no_route_out", false, "interfaces besides lo: " + join_shown(other_ifs)));
    } else if (!p->reachable.empty()) {
      out.push_back(
          check("no_route_out", false, "addresses reachable: " + join_shown(p->reachable)));
    } else {
      out.push_back(check("no_route_out", true, "only lo; no address reachable"));
    }
  }

  // pids_limit: fork refused, within the limit (the run's other processes count too).
  if (!p) {
    out.push_back(check("pids_limit", false, no_report));
  } else if (!p->fork_error) {
    out.push_back(check("pids_limit", false,
                        fmt::format("{} forks, never refused (limit {})", p->forks, ev.max_pids)));
  } else if (p->forks < 0 || p->forks > static_cast<std::int64_t>(ev.max_pids)) {
    out.push_back(check("pids_limit", false,
                        fmt::format("{} forks before {} (limit {})", p->forks,
                                    shown(*p->fork_error), ev.max_pids)));
  } else {
    out.push_back(check("pids_limit", true,
                        fmt::format("fork refused ({}) after {} (limit {})", shown(*p->fork_error),
                                    p->forks, ev.max_pids)));
  }

  // memory_limit
  if (ev.memory.code == code::oom) {
    out.push_back(
        check("memory_limit", true,
              fmt::format("oom at a limit of {} bytes (peak {} bytes)",
                          ev.memory.memory_limit_bytes, ev.memory.usage.peak_memory_bytes)));
  } else {
    out.push_back(check("memory_limit", false,
                        fmt::format("allocating 4x past {} bytes ended {}", ev.memory_limit_bytes,
                                    describe(ev.memory))));
  }

  // timeout
  if (ev.timeout_run.code != code::timeout) {
    out.push_back(check("timeout", false,
                        fmt::format("a {} ms run sleeping 60 s ended {}", ev.timeout.count(),
                                    describe(ev.timeout_run))));
  } else if (ev.timeout_run.usage.wall < ev.timeout ||
             ev.timeout_run.usage.wall > ev.timeout + ev.timeout_slack) {
    out.push_back(check("timeout", false,
                        fmt::format("timeout after {} ms of wall time for a limit of {} ms",
                                    ev.timeout_run.usage.wall.count(), ev.timeout.count())));
  } else {
    out.push_back(check("timeout", true,
                        fmt::format("killed at {} ms (limit {} ms)",
                                    ev.timeout_run.usage.wall.count(), ev.timeout.count())));
  }

  // ticket
  if (ev.denied.code == code::action_denied && !ran(ev.denied)) {
    out.push_back(check("ticket", true, "a ticket without code.execute is action_denied"));
  } else {
    out.push_back(check("ticket", false,
                        "a run under a ticket without code.execute ended " + describe(ev.denied) +
                            (ran(ev.denied) ? " after it ran" : "")));
  }

  // protocol
  {
    std::vector<std::string> bad;
    if (!ev.unknown_field_rejection) {
      bad.push_back("a request with an unknown field was accepted");
    } else if (ev.unknown_field_rejection->find("audit_unknown_field") == std::string::npos) {
      bad.push_back("the unknown field's rejection does not name it: " +
                    shown(*ev.unknown_field_rejection, 160));
    }
    if (!ev.bad_version_rejection) bad.push_back("a request of protocol version 99 was accepted");
    out.push_back(bad.empty()
                      ? check("protocol", true, "unknown field and version refused, field named")
                      : check("protocol", false, join_shown(bad)));
  }

  // image_pinned
  {
    const bool digest_syntax =
        ev.current_digest.size() == 71 && ev.current_digest.starts_with("sha256:") &&
        ev.current_digest.find_first_not_of("0123456789abcdef", 7) == std::string::npos;
    if (!digest_syntax) {
      out.push_back(
          check("image_pinned", false, "no current image digest for runtime " + shown(ev.runtime)));
    } else if (ev.probe.runtime.digest != ev.current_digest) {
      out.push_back(
          check("image_pinned", false,
                fmt::format("the probe ran image {} but the store's current one is {}",
                            ev.probe.runtime.digest.empty() ? std::string("(none)")
                                                            : shown(ev.probe.runtime.digest),
                            ev.current_digest)));
    } else if (ev.pin_mismatch.code != code::digest_mismatch || ran(ev.pin_mismatch)) {
      out.push_back(check("image_pinned", false,
                          "a ticket pinning another image ended " + describe(ev.pin_mismatch)));
    } else {
      out.push_back(check("image_pinned", true, ev.current_digest + "; other pins refused"));
    }
  }
  rep.image_digest = ev.probe.runtime.digest;
  rep.image_current = !rep.image_digest.empty() && rep.image_digest == ev.current_digest;

  evaluate_configuration(ev, out);
  return rep;
}

// --- output --------------------------------------------------------------------------------

std::string format_audit_table(const audit_report& r) {
  std::size_t w = 5;
  for (const auto& c : r.checks) w = std::max(w, c.name.size());
  std::string s = fmt::format("{:<{}}  {:<6} {}\n", "check", w, "status", "detail");
  for (const auto& c : r.checks) {
    s += fmt::format("{:<{}}  {:<6} {}\n", c.name, w, c.passed ? "PASS" : "FAIL", c.detail);
  }
  auto failed = r.failed();
  if (r.passed()) {
    s += fmt::format("audit of the {} level: all {} checks passed\n", to_string(r.isolation),
                     r.checks.size());
  } else {
    std::string names;
    for (const auto& n : failed) names += (names.empty() ? "" : ", ") + n;
    s += fmt::format("audit of the {} level FAILED: {}\n", to_string(r.isolation),
                     names.empty() ? std::string("no checks") : names);
  }
  // The verdict is about this image only (docs/security.md, "What an audit proves").
  s += fmt::format("image audited: {} ({})\n",
                   r.image_digest.empty() ? std::string("none") : r.image_digest,
                   r.image_current ? "the store's current one" : "not the store's current one");
  return s;
}

std::string encode_audit_report(const audit_report& r) {
  nlohmann::ordered_json checks = nlohmann::ordered_json::array();
  for (const auto& c : r.checks) {
    checks.push_back(
        nlohmann::ordered_json{{"name", c.name}, {"passed", c.passed}, {"detail", c.detail}});
  }
  nlohmann::ordered_json j = {{"v", 1},
                              {"isolation", std::string(to_string(r.isolation))},
                              {"passed", r.passed()},
                              {"image_digest", r.image_digest},
                              {"image_current", r.image_current},
                              {"failed", r.failed()},
                              {"checks", checks}};
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace sandbox
