// Host configuration documents (docs/operations.md, "Configuration"): scheduler caps and
// tenant classes, warm pools, policy. Strict like the protocol: unknown fields, wrong types
// and out-of-range values are refused with a message naming the field, and nothing is applied.
#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <string>

#include "protocol/env_rules.hpp"
#include "protocol/json_strict.hpp"
#include "protocol/text_util.hpp"
#include "sandbox/egress.hpp"
#include "sandbox/runtime.hpp"
#include "sandbox/session.hpp"

namespace sandbox {
namespace {

using detail::as_array;
using detail::as_bool;
using detail::as_object;
using detail::as_string;
using detail::as_unsigned;
using detail::check_known_fields;
using detail::fail;
using detail::find_member;
using detail::index_path;
using detail::member_path;
using json = nlohmann::json;

constexpr std::uint64_t u32_max = 0xFFFFFFFFu;
constexpr std::uint64_t ms_max = 7ULL * 24 * 3600 * 1000;  // a week: anything longer is a typo

template <class F>
void optional_field(const json& o, const std::string& path, std::string_view key, F f) {
  if (const json* v = find_member(o, key)) f(*v, member_path(path, key));
}

tenant_class_limits decode_class(const json& v, const std::string& path, tenant_class_limits c) {
  const json& o = as_object(v, path);
  check_known_fields(
      o, path, {"max_running", "max_queued", "weight", "queue_deadline_ms", "max_session_slots"});
  optional_field(o, path, "max_session_slots", [&](const json& x, const std::string& p) {
    c.max_session_slots = static_cast<std::uint32_t>(as_unsigned(x, p, u32_max));
  });
  optional_field(o, path, "max_running", [&](const json& x, const std::string& p) {
    c.max_running = static_cast<std::uint32_t>(as_unsigned(x, p, u32_max));
    if (c.max_running == 0) fail(p, "must be at least 1");
  });
  optional_field(o, path, "max_queued", [&](const json& x, const std::string& p) {
    c.max_queued = static_cast<std::uint32_t>(as_unsigned(x, p, u32_max));
  });
  optional_field(o, path, "weight", [&](const json& x, const std::string& p) {
    c.weight = static_cast<std::uint32_t>(as_unsigned(x, p, 1000));
    if (c.weight == 0) fail(p, "must be at least 1");
  });
  optional_field(o, path, "queue_deadline_ms", [&](const json& x, const std::string& p) {
    auto ms = as_unsigned(x, p, ms_max);
    if (ms == 0) fail(p, "must be positive");
    c.queue_deadline = std::chrono::milliseconds(ms);
  });
  return c;
}

void decode_scheduler(const json& v, const std::string& path, scheduler_options& s) {
  const json& o = as_object(v, path);
  check_known_fields(o, path,
                     {"max_running", "max_queued", "default_class", "classes", "tenant_classes",
                      "max_session_slots"});
  optional_field(o, path, "max_session_slots", [&](const json& x, const std::string& p) {
    s.max_session_slots = static_cast<std::uint32_t>(as_unsigned(x, p, u32_max));
  });
  optional_field(o, path, "max_running", [&](const json& x, const std::string& p) {
    s.max_running = static_cast<std::uint32_t>(as_unsigned(x, p, u32_max));
  });
  optional_field(o, path, "max_queued", [&](const json& x, const std::string& p) {
    s.max_queued = static_cast<std::uint32_t>(as_unsigned(x, p, u32_max));
  });
  optional_field(o, path, "default_class", [&](const json& x, const std::string& p) {
    s.default_class = decode_class(x, p, s.default_class);
  });
  optional_field(o, path, "classes", [&](const json& x, const std::string& p) {
    for (const auto& [name, c] : as_object(x, p).items()) {
      if (name.empty() || name.size() > 64) fail(p, "class names are 1..64 bytes");
      s.classes[name] = decode_class(c, member_path(p, name), tenant_class_limits{});
    }
  });
  optional_field(o, path, "tenant_classes", [&](const json& x, const std::string& p) {
    for (const auto& [tenant, c] : as_object(x, p).items()) {
      std::string q = member_path(p, tenant);
      if (!is_valid_tenant(tenant)) fail(q, "not a valid tenant name");
      std::string cls = as_string(c, q);
      if (!s.classes.contains(cls)) fail(q, "unknown class '" + cls + "'");
      s.tenant_classes[tenant] = cls;
    }
  });
}

// Every level's pools can be pre-started (process, container, gvisor, microvm).
void decode_pool(const json& v, const std::string& path, std::vector<warm_pool_class>& out) {
  const json& a = as_array(v, path);
  if (a.size() > 64) fail(path, "at most 64 pool classes");
  out.clear();
  for (std::size_t i = 0; i < a.size(); ++i) {
    std::string p = index_path(path, i);
    const json& o = as_object(a[i], p);
    check_known_fields(
        o, p, {"runtime", "size", "memory_limit_bytes", "files_out", "prestart", "preload"});
    warm_pool_class c;
    const json* rt = find_member(o, "runtime");
    if (rt == nullptr) fail(member_path(p, "runtime"), "required");
    c.runtime = as_string(*rt, member_path(p, "runtime"));
    if (c.runtime.empty()) fail(member_path(p, "runtime"), "must not be empty");
    optional_field(o, p, "size", [&](const json& x, const std::string& q) {
      c.size = static_cast<std::uint32_t>(as_unsigned(x, q, 1024));
    });
    optional_field(o, p, "memory_limit_bytes", [&](const json& x, const std::string& q) {
      c.memory_limit_bytes = as_unsigned(x, q);
    });
    optional_field(o, p, "files_out", [&](const json& x, const std::string& q) {
      const json& f = as_object(x, q);
      check_known_fields(f, q, {"max_files", "max_bytes"});
      optional_field(f, q, "max_files", [&](const json& y, const std::string& r) {
        c.files_out.max_files = static_cast<std::uint32_t>(as_unsigned(y, r, u32_max));
      });
      optional_field(f, q, "max_bytes", [&](const json& y, const std::string& r) {
        c.files_out.max_bytes = as_unsigned(y, r);
      });
    });
    optional_field(o, p, "prestart",
                   [&](const json& x, const std::string& q) { c.prestart = as_bool(x, q); });
    optional_field(o, p, "preload", [&](const json& x, const std::string& q) {
      const json& l = as_array(x, q);
      if (l.size() > 64) fail(q, "at most 64 modules");
      for (std::size_t k = 0; k < l.size(); ++k) {
        const std::string r = index_path(q, k);
        std::string name = as_string(l[k], r);
        // What a name may be depends on the runtime (checked below, once it is known); none
        // is empty, longer than 214 bytes or more than printable ASCII.
        if (name.empty() || name.size() > 214 ||
            !std::all_of(name.begin(), name.end(), [](char ch) { return ch > ' ' && ch < 127; })) {
          fail(r, "not a module name (1 to 214 printable ASCII characters)");
        }
        if (std::find(c.preload.begin(), c.preload.end(), name) != c.preload.end()) {
          fail(r, "listed twice");
        }
        c.preload.push_back(std::move(name));
      }
    });
    if (!c.preload.empty() && !c.prestart)
      fail(member_path(p, "preload"), "needs \"prestart\": true");
    out.push_back(c);
  }
}

// "container": {"runtime": "crun"|"runc", "path": "/usr/bin/crun", "warm_pool": [...]}
// "gvisor":    {"runtime": "runsc", "path": ..., "platform": "ptrace"|"kvm"|"systrap", ...}
// Present means enabled.
void decode_oci(const json& v, const std::string& path, oci_backend_options& out,
                std::initializer_list<std::string_view> runtimes) {
  const json& o = as_object(v, path);
  check_known_fields(o, path, {"runtime", "path", "platform", "warm_pool"});
  out.enabled = true;
  optional_field(o, path, "runtime", [&](const json& x, const std::string& q) {
    out.runtime = as_string(x, q);
    if (std::find(runtimes.begin(), runtimes.end(), out.runtime) == runtimes.end()) {
      std::string list;
      for (auto r : runtimes) list += (list.empty() ? "" : ", ") + std::string(r);
      fail(q, "must be one of: " + list);
    }
  });
  optional_field(o, path, "path", [&](const json& x, const std::string& q) {
    std::string p = as_string(x, q);
    if (p.empty() || p[0] != '/' || p.find('\0') != std::string::npos)
      fail(q, "must be an absolute path");
    out.path = p;
  });
  optional_field(o, path, "platform", [&](const json& x, const std::string& q) {
    out.platform = as_string(x, q);
    if (out.platform != "ptrace" && out.platform != "kvm" && out.platform != "systrap") {
      fail(q, "must be one of: ptrace, kvm, systrap");
    }
    if (out.runtime != "runsc") fail(q, "only for runsc");
  });
  optional_field(o, path, "warm_pool",
                 [&](const json& x, const std::string& q) { decode_pool(x, q, out.warm_pool); });
}

// "microvm": {"kernel_dir": "/var/lib/agent-sandbox/microvm/kernel/current",
//             "accel": "auto"|"kvm"|"tcg", "guest_overhead_mib": 96, "vmm_overhead_mib": 192,
//             "qemu_path": ..., "mkfs_erofs_path": ..., "warm_pool": [...]}. Present means enabled.
void decode_microvm(const json& v, const std::string& path, microvm_backend_options& out) {
  const json& o = as_object(v, path);
  check_known_fields(o, path,
                     {"kernel_dir", "accel", "guest_overhead_mib", "vmm_overhead_mib", "qemu_path",
                      "mkfs_erofs_path", "warm_pool"});
  out.enabled = true;
  auto abs_path = [](const json& x, const std::string& q) {
    std::string p = as_string(x, q);
    if (p.empty() || p[0] != '/' || p.find('\0') != std::string::npos)
      fail(q, "must be an absolute path");
    return std::filesystem::path(p);
  };
  optional_field(o, path, "kernel_dir",
                 [&](const json& x, const std::string& q) { out.kernel_dir = abs_path(x, q); });
  optional_field(o, path, "qemu_path",
                 [&](const json& x, const std::string& q) { out.qemu_path = abs_path(x, q); });
  optional_field(o, path, "mkfs_erofs_path", [&](const json& x, const std::string& q) {
    out.mkfs_erofs_path = abs_path(x, q);
  });
  optional_field(o, path, "accel", [&](const json& x, const std::string& q) {
    out.accel = as_string(x, q);
    if (out.accel != "auto" && out.accel != "kvm" && out.accel != "tcg")
      fail(q, "must be one of: auto, kvm, tcg");
  });
  optional_field(o, path, "guest_overhead_mib", [&](const json& x, const std::string& q) {
    out.guest_overhead_mib = as_unsigned(x, q, 4096);
    if (out.guest_overhead_mib < 32) fail(q, "must be at least 32");
  });
  optional_field(o, path, "vmm_overhead_mib", [&](const json& x, const std::string& q) {
    out.vmm_overhead_mib = as_unsigned(x, q, 4096);
    if (out.vmm_overhead_mib < 64) fail(q, "must be at least 64");
  });
  optional_field(o, path, "warm_pool",
                 [&](const json& x, const std::string& q) { decode_pool(x, q, out.warm_pool); });
}

void decode_backends(const json& v, const std::string& path, runtime_options& opts) {
  const json& o = as_object(v, path);
  check_known_fields(o, path, {"container", "gvisor", "microvm"});
  optional_field(o, path, "microvm",
                 [&](const json& x, const std::string& q) { decode_microvm(x, q, opts.microvm); });
  optional_field(o, path, "container", [&](const json& x, const std::string& q) {
    decode_oci(x, q, opts.container, {"crun", "runc"});
  });
  optional_field(o, path, "gvisor", [&](const json& x, const std::string& q) {
    decode_oci(x, q, opts.gvisor, {"runsc"});
  });
}

/// One workload profile: the per-run fields it raises or lowers (sandbox/registry.hpp), with
/// the policy's own lower bounds; above a ceiling is allowed here and clamped at run time.
workload_profile decode_profile(const json& v, const std::string& path) {
  const json& o = as_object(v, path);
  check_known_fields(
      o, path,
      {"max_pids", "cpu_quota_millicores", "max_open_files", "tmp_bytes", "home_bytes", "shm_bytes",
       "tmpfs_inodes", "memory_limit_bytes", "timeout_ms"});
  workload_profile w;
  auto f = [&](std::string_view key, auto& out, std::uint64_t min, std::uint64_t max) {
    optional_field(o, path, key, [&](const json& x, const std::string& q) {
      const std::uint64_t n = as_unsigned(x, q, max);
      if (n < min) fail(q, "must be at least " + std::to_string(min));
      out = static_cast<typename std::remove_reference_t<decltype(out)>::value_type>(n);
    });
  };
  constexpr auto u64_max = std::numeric_limits<std::uint64_t>::max();
  f("max_pids", w.max_pids, 8, u32_max);
  f("cpu_quota_millicores", w.cpu_quota_millicores, 0, u32_max);
  f("max_open_files", w.max_open_files, 16, u32_max);
  f("tmp_bytes", w.tmp_bytes, 64 * 1024, u64_max);
  f("home_bytes", w.home_bytes, 64 * 1024, u64_max);
  f("shm_bytes", w.shm_bytes, 64 * 1024, u64_max);
  f("tmpfs_inodes", w.tmpfs_inodes, 64, u32_max);
  f("memory_limit_bytes", w.memory_limit_bytes, 16ULL << 20, u64_max);
  optional_field(o, path, "timeout_ms", [&](const json& x, const std::string& q) {
    const std::uint64_t n = as_unsigned(x, q, ms_max);
    if (n == 0) fail(q, "must be at least 1");
    w.timeout = std::chrono::milliseconds(n);
  });
  return w;
}

/// The registry (`tools`): an array of entries, each checked like `check_tool_entry` against
/// the policy in force (so a profile must exist), names unique.
/// The `runtimes` section: language runtimes the host defines, each checked by
/// `check_runtime_spec`. An entry named like a runtime already in `runtimes` (python3, node)
/// replaces it; the others are added.
void decode_runtimes(const json& v, const std::string& path, std::vector<runtime_spec>& runtimes) {
  const json& a = as_array(v, path);
  std::vector<runtime_spec> seen;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string p = index_path(path, i);
    const json& o = as_object(a[i], p);
    check_known_fields(o, p, {"name", "image", "argv", "source_name"});
    runtime_spec r;
    r.name = as_string(detail::require_member(o, p, "name"), member_path(p, "name"));
    optional_field(o, p, "image",
                   [&](const json& x, const std::string& q) { r.image = as_string(x, q); });
    const std::string ap = member_path(p, "argv");
    const json& args = as_array(detail::require_member(o, p, "argv"), ap);
    for (std::size_t j = 0; j < args.size(); ++j)
      r.argv.push_back(as_string(args[j], index_path(ap, j)));
    optional_field(o, p, "source_name",
                   [&](const json& x, const std::string& q) { r.source_name = as_string(x, q); });
    if (auto problem = check_runtime_spec(r)) {
      const auto colon = problem->find(": ");
      fail(p + "." + problem->substr(0, colon), problem->substr(colon + 2));
    }
    for (std::size_t j = 0; j < seen.size(); ++j) {
      if (seen[j].name == r.name)
        fail(member_path(p, "name"), "duplicate of " + index_path(path, j) + ".name");
    }
    seen.push_back(r);
  }
  for (auto& r : seen) {
    auto same = std::find_if(runtimes.begin(), runtimes.end(),
                             [&](const runtime_spec& x) { return x.name == r.name; });
    if (same != runtimes.end()) {
      *same = std::move(r);
    } else {
      runtimes.push_back(std::move(r));
    }
  }
}

std::vector<tool_entry> decode_tools(const json& v, const std::string& path, const policy& pol) {
  const json& a = as_array(v, path);
  std::vector<tool_entry> out;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string p = index_path(path, i);
    const json& o = as_object(a[i], p);
    check_known_fields(o, p,
                       {"name", "image", "image_digest", "binary", "args", "input", "isolation",
                        "profile", "egress", "env"});
    tool_entry e;
    e.name = as_string(detail::require_member(o, p, "name"), member_path(p, "name"));
    e.image = as_string(detail::require_member(o, p, "image"), member_path(p, "image"));
    e.binary = as_string(detail::require_member(o, p, "binary"), member_path(p, "binary"));
    optional_field(o, p, "image_digest",
                   [&](const json& x, const std::string& q) { e.image_digest = as_string(x, q); });
    optional_field(o, p, "args", [&](const json& x, const std::string& q) {
      const json& args = as_array(x, q);
      for (std::size_t j = 0; j < args.size(); ++j) {
        e.args.push_back(as_string(args[j], index_path(q, j)));
      }
    });
    optional_field(o, p, "input", [&](const json& x, const std::string& q) {
      const std::string in = as_string(x, q);
      if (in == "stdin")
        e.input = tool_input::stdin_bytes;
      else if (in == "files")
        e.input = tool_input::files_only;
      else
        fail(q, "expected \"stdin\" or \"files\", got " + detail::quote_for_message(in));
    });
    optional_field(o, p, "isolation", [&](const json& x, const std::string& q) {
      const std::string name = as_string(x, q);
      const auto level = isolation_from_string(name);
      if (!level) fail(q, "unknown isolation level " + detail::quote_for_message(name));
      e.isolation = *level;
    });
    optional_field(o, p, "profile",
                   [&](const json& x, const std::string& q) { e.profile = as_string(x, q); });
    optional_field(o, p, "egress", [&](const json& x, const std::string& q) {
      const json& eg = as_array(x, q);
      for (std::size_t j = 0; j < eg.size(); ++j) {
        e.egress.push_back(as_string(eg[j], index_path(q, j)));
      }
    });
    optional_field(o, p, "env", [&](const json& x, const std::string& q) {
      for (const auto& [name, value] : as_object(x, q).items()) {
        e.env.emplace_back(name, as_string(value, q + "[" + detail::quote_for_message(name) + "]"));
      }
    });
    if (auto problem = check_tool_entry(e, pol)) {
      // "<field>: <reason>" → "tools[i].<field>: <reason>"
      const auto colon = problem->find(": ");
      // (The field part is already a path: "env['X']" is not re-quoted.)
      fail(p + "." + problem->substr(0, colon), problem->substr(colon + 2));
    }
    for (std::size_t j = 0; j < out.size(); ++j) {
      if (out[j].name == e.name) {
        fail(member_path(p, "name"), "duplicate of " + index_path(path, j) + ".name");
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

void decode_sessions(const json& v, const std::string& path, session_options& s) {
  const json& o = as_object(v, path);
  check_known_fields(
      o, path, {"default_lifetime_ms", "max_lifetime_ms", "idle_timeout_ms", "stdin_buffer_bytes"});
  auto ms = [&](std::string_view key, std::chrono::milliseconds& out) {
    optional_field(o, path, key, [&](const json& x, const std::string& q) {
      const auto n = as_unsigned(x, q, ms_max);
      if (n == 0) fail(q, "must be positive");
      out = std::chrono::milliseconds(n);
    });
  };
  ms("default_lifetime_ms", s.default_lifetime);
  ms("max_lifetime_ms", s.max_lifetime);
  ms("idle_timeout_ms", s.idle_timeout);
  optional_field(o, path, "stdin_buffer_bytes", [&](const json& x, const std::string& q) {
    const auto n = as_unsigned(x, q, 64ULL << 20);
    if (n == 0) fail(q, "must be at least 1");
    s.stdin_buffer_bytes = static_cast<std::uint32_t>(n);
  });
  if (s.default_lifetime > s.max_lifetime) {
    fail(member_path(path, "default_lifetime_ms"), "above max_lifetime_ms");
  }
}

void decode_policy(const json& v, const std::string& path, policy& p) {
  const json& o = as_object(v, path);
  check_known_fields(o, path, {"max_source_bytes", "max_timeout_ms",
                               "max_memory_bytes", "min_memory_bytes",
                               "max_input_files",  "max_input_bytes",
                               "max_output_files", "max_output_bytes",
                               "allowed_env",      "stream_capture_bytes",
                               "max_pids",         "cpu_quota_millicores",
                               "max_open_files",   "tmp_bytes",
                               "home_bytes",       "shm_bytes",
                               "exit_grace_ms",    "max_stdin_bytes",
                               "profiles",         "ceilings"});
  auto u64 = [&](std::string_view key, std::uint64_t& out, std::uint64_t min = 0,
                 std::uint64_t max = std::numeric_limits<std::uint64_t>::max()) {
    optional_field(o, path, key, [&](const json& x, const std::string& q) {
      out = as_unsigned(x, q, max);
      if (out < min) fail(q, "must be at least " + std::to_string(min));
    });
  };
  auto u32 = [&](std::string_view key, std::uint32_t& out, std::uint32_t min) {
    std::uint64_t t = out;
    u64(key, t, min, u32_max);
    out = static_cast<std::uint32_t>(t);
  };
  auto ms = [&](std::string_view key, std::chrono::milliseconds& out, std::uint64_t min) {
    std::uint64_t t = static_cast<std::uint64_t>(out.count());
    u64(key, t, min, ms_max);
    out = std::chrono::milliseconds(t);
  };
  u64("max_source_bytes", p.max_source_bytes, 1);
  ms("max_timeout_ms", p.max_timeout, 1);
  u64("max_memory_bytes", p.max_memory_bytes, 16ULL << 20);
  u64("min_memory_bytes", p.min_memory_bytes, 16ULL << 20);
  u32("max_input_files", p.max_input_files, 0);
  u64("max_input_bytes", p.max_input_bytes, 0);
  u32("max_output_files", p.max_output_files, 0);
  u64("max_output_bytes", p.max_output_bytes, 0);
  u64("stream_capture_bytes", p.stream_capture_bytes, 0);
  u32("max_pids", p.max_pids, 8);
  u32("cpu_quota_millicores", p.cpu_quota_millicores, 0);
  u32("max_open_files", p.max_open_files, 16);
  u64("tmp_bytes", p.tmp_bytes, 64 * 1024);
  u64("home_bytes", p.home_bytes, 64 * 1024);
  u64("shm_bytes", p.shm_bytes, 64 * 1024);
  ms("exit_grace_ms", p.exit_grace, 0);
  // Descendants of an exited program may hold a run (and its uid, cgroup) this long: a
  // bounded courtesy, not a second timeout.
  if (p.exit_grace > std::chrono::seconds(10)) {
    fail(member_path(path, "exit_grace_ms"), "at most 10000 (ms)");
  }
  u64("max_stdin_bytes", p.max_stdin_bytes, 0);
  optional_field(o, path, "ceilings", [&](const json& x, const std::string& q) {
    const json& c = as_object(x, q);
    check_known_fields(c, q,
                       {"max_pids", "cpu_quota_millicores", "max_open_files", "tmp_bytes",
                        "home_bytes", "shm_bytes", "tmpfs_inodes"});
    auto& ce = p.ceilings;
    auto f = [&](std::string_view key, auto& out, std::uint64_t min, std::uint64_t max) {
      optional_field(c, q, key, [&](const json& y, const std::string& r) {
        const std::uint64_t n = as_unsigned(y, r, max);
        if (n < min) fail(r, "must be at least " + std::to_string(min));
        out = static_cast<std::remove_reference_t<decltype(out)>>(n);
      });
    };
    f("max_pids", ce.max_pids, 8, u32_max);
    f("cpu_quota_millicores", ce.cpu_quota_millicores, 0, u32_max);
    f("max_open_files", ce.max_open_files, 16, u32_max);
    f("tmp_bytes", ce.tmp_bytes, 64 * 1024, std::numeric_limits<std::uint64_t>::max());
    f("home_bytes", ce.home_bytes, 64 * 1024, std::numeric_limits<std::uint64_t>::max());
    f("shm_bytes", ce.shm_bytes, 64 * 1024, std::numeric_limits<std::uint64_t>::max());
    f("tmpfs_inodes", ce.tmpfs_inodes, 64, u32_max);
  });
  optional_field(o, path, "profiles", [&](const json& x, const std::string& q) {
    p.profiles.clear();
    for (const auto& [name, body] : as_object(x, q).items()) {
      const std::string r = member_path(q, name);
      if (!is_valid_registry_name(name)) {
        fail(r,
             "not a profile name (1 to 64 characters of [a-z0-9._-], starting with a letter "
             "or digit)");
      }
      p.profiles[name] = decode_profile(body, r);
    }
  });
  optional_field(o, path, "allowed_env", [&](const json& x, const std::string& q) {
    p.allowed_env.clear();
    const json& a = as_array(x, q);
    for (std::size_t i = 0; i < a.size(); ++i) {
      const std::string r = index_path(q, i);
      std::string name = as_string(a[i], r);
      if (!detail::is_env_name(name))
        fail(r, "not a portable variable name ([A-Za-z_][A-Za-z0-9_]*, at most 128 bytes)");
      if (detail::is_reserved_env(name))
        fail(r, "reserved name, set by the sandbox or steering the loader or proxies");
      p.allowed_env.insert(std::move(name));
    }
  });
  if (p.min_memory_bytes > p.max_memory_bytes) {
    fail(member_path(path, "min_memory_bytes"), "above max_memory_bytes");
  }
}

void decode_egress(const json& v, const std::string& path, egress_proxy_options& e) {
  const json& o = as_object(v, path);
  check_known_fields(o, path,
                     {"pinned_hosts", "connect_ports", "http_ports", "max_connections",
                      "max_bytes_up", "max_bytes_down", "origin_ca_file"});
  optional_field(o, path, "pinned_hosts", [&](const json& x, const std::string& q) {
    e.pinned_hosts.clear();
    const json& m = as_object(x, q);
    for (const auto& [name, addresses] : m.items()) {
      const std::string r = q + "[" + detail::quote_for_message(name) + "]";
      auto canonical = canonical_egress_pattern(name);
      if (!canonical || canonical->starts_with("*.")) fail(r, "not a host name");
      const json& a = as_array(addresses, r);
      if (a.empty()) fail(r, "needs at least one address");
      std::vector<std::string> out;
      for (std::size_t i = 0; i < a.size(); ++i) {
        const std::string ri = index_path(r, i);
        std::string addr = as_string(a[i], ri);
        boost::system::error_code ec;
        boost::asio::ip::make_address(addr, ec);
        if (ec) fail(ri, "not a numeric IPv4 or IPv6 address");
        out.push_back(std::move(addr));
      }
      e.pinned_hosts[*canonical] = std::move(out);
    }
  });
  auto ports = [&](std::string_view key, std::vector<std::uint16_t>& out) {
    optional_field(o, path, key, [&](const json& x, const std::string& q) {
      out.clear();
      const json& a = as_array(x, q);
      for (std::size_t i = 0; i < a.size(); ++i) {
        const auto port = as_unsigned(a[i], index_path(q, i), 65535);
        if (port == 0) fail(index_path(q, i), "must be 1..65535");
        out.push_back(static_cast<std::uint16_t>(port));
      }
    });
  };
  ports("connect_ports", e.connect_ports);
  ports("http_ports", e.http_ports);
  optional_field(o, path, "max_connections", [&](const json& x, const std::string& q) {
    e.max_connections = static_cast<std::uint32_t>(as_unsigned(x, q, u32_max));
  });
  optional_field(o, path, "max_bytes_up",
                 [&](const json& x, const std::string& q) { e.max_bytes_up = as_unsigned(x, q); });
  optional_field(o, path, "max_bytes_down", [&](const json& x, const std::string& q) {
    e.max_bytes_down = as_unsigned(x, q);
  });
  optional_field(o, path, "origin_ca_file", [&](const json& x, const std::string& q) {
    std::string file = as_string(x, q);
    if (!file.starts_with("/")) fail(q, "must be an absolute path");
    e.origin_ca_file = std::move(file);
  });
}

/// The `secrets` section: name → {file, domains, header}; replaces the whole map.
void decode_secrets(const json& v, const std::string& path,
                    std::map<std::string, secret_definition>& out) {
  const json& o = as_object(v, path);
  if (o.size() > max_secrets) {
    fail(path, std::to_string(o.size()) + " secrets, more than the limit of " +
                   std::to_string(max_secrets));
  }
  std::map<std::string, secret_definition> next;
  for (const auto& [name, entry] : o.items()) {
    const std::string p = path + "[" + detail::quote_for_message(name) + "]";
    if (!is_valid_secret_name(name)) {
      fail(p, "not a secret name (1 to 64 characters of [a-z0-9-], starting with a letter)");
    }
    const json& e = as_object(entry, p);
    // The one mistake worth its own message: a value written into the document.
    if (e.contains("value")) {
      fail(member_path(p, "value"),
           "a secret's value is never inline: put it in a root-only file (mode 0600) and name "
           "that file in 'file'");
    }
    check_known_fields(e, p, {"file", "domains", "header"});
    secret_definition d;
    d.file = as_string(detail::require_member(e, p, "file"), member_path(p, "file"));
    const std::string dp = member_path(p, "domains");
    const json& domains = as_array(detail::require_member(e, p, "domains"), dp);
    if (domains.size() > 4 * max_egress_patterns) fail(dp, "too many patterns");
    for (std::size_t i = 0; i < domains.size(); ++i)
      d.domains.push_back(as_string(domains[i], index_path(dp, i)));
    d.header = as_string(detail::require_member(e, p, "header"), member_path(p, "header"));
    if (auto problem = check_secret_definition(d)) {
      throw detail::decode_error(p + "." + *problem);
    }
    next.emplace(name, std::move(d));
  }
  out = std::move(next);
}

}  // namespace

boost::system::result<void, rejection> apply_config(std::string_view text,
                                                    runtime_options& options) {
  try {
    json doc;
    if (auto err = detail::parse_strict(text, decode_options{.max_document_bytes = 1 << 20}, doc)) {
      return rejection{code::invalid_request, *err};
    }
    const json& o = as_object(doc, "");
    detail::check_version(o);
    check_known_fields(o, "",
                       {"v", "scheduler", "warm_pool", "policy", "backends", "egress", "runtimes",
                        "tools", "sessions", "secrets"});
    runtime_options next = options;  // applied only when everything decodes
    optional_field(o, "", "scheduler", [&](const json& x, const std::string& p) {
      decode_scheduler(x, p, next.scheduler);
    });
    optional_field(o, "", "warm_pool", [&](const json& x, const std::string& p) {
      decode_pool(x, p, next.process.warm_pool);
    });
    optional_field(o, "", "policy",
                   [&](const json& x, const std::string& p) { decode_policy(x, p, next.policy); });
    optional_field(o, "", "backends",
                   [&](const json& x, const std::string& p) { decode_backends(x, p, next); });
    optional_field(o, "", "egress",
                   [&](const json& x, const std::string& p) { decode_egress(x, p, next.egress); });
    optional_field(o, "", "runtimes", [&](const json& x, const std::string& p) {
      decode_runtimes(x, p, next.runtimes);
    });
    // After the policy: entries name its profiles and its allowed variables.
    optional_field(o, "", "tools", [&](const json& x, const std::string& p) {
      next.tools = decode_tools(x, p, next.policy);
    });
    optional_field(o, "", "sessions", [&](const json& x, const std::string& p) {
      decode_sessions(x, p, next.sessions);
    });
    optional_field(o, "", "secrets", [&](const json& x, const std::string& p) {
      decode_secrets(x, p, next.secrets);
    });
    // A pool class must be one a request can be: its limits within the policy in force.
    auto check_pool = [&](const std::vector<warm_pool_class>& pool, const std::string& where) {
      for (std::size_t i = 0; i < pool.size(); ++i) {
        const auto& c = pool[i];
        const std::string p = member_path(index_path(where, i), "memory_limit_bytes");
        if (c.memory_limit_bytes < next.policy.min_memory_bytes) {
          fail(p, "below the policy's min_memory_bytes (" +
                      std::to_string(next.policy.min_memory_bytes) + ")");
        }
        if (c.memory_limit_bytes > next.policy.max_memory_bytes) {
          fail(p, "above the policy's max_memory_bytes (" +
                      std::to_string(next.policy.max_memory_bytes) + ")");
        }
        const std::string f = member_path(index_path(where, i), "files_out");
        if (c.files_out.max_files > next.policy.max_output_files) {
          fail(member_path(f, "max_files"), "above the policy's max_output_files");
        }
        if (c.files_out.max_bytes > next.policy.max_output_bytes) {
          fail(member_path(f, "max_bytes"), "above the policy's max_output_bytes");
        }
      }
    };
    check_pool(next.process.warm_pool, "warm_pool");
    // Pre-started classes (every level): of a runtime that
    // supports it, with a preload list of module names as that runtime names them.
    auto check_prestart = [&](const std::vector<warm_pool_class>& pool, const std::string& where) {
      for (std::size_t i = 0; i < pool.size(); ++i) {
        const auto& c = pool[i];
        if (!c.prestart) continue;
        const runtime_spec* spec = nullptr;
        for (const auto& r : next.runtimes) {
          if (r.name == c.runtime) spec = &r;
        }
        const auto defaults = default_runtimes();
        for (const auto& r : defaults) {
          if (spec == nullptr && r.name == c.runtime) spec = &r;
        }
        const std::string p = index_path(where, i);
        if (spec != nullptr && !supports_prestart(*spec)) {
          fail(member_path(p, "prestart"),
               "runtime '" + c.runtime +
                   "' cannot be pre-started (a Python runtime whose argv is " +
                   "[<path>, \"-I\", \"{source}\"] or a Node runtime whose argv is [<path to " +
                   "node>, \"{source}\"] can)");
        }
        // Each preload entry as its runtime names modules (a runtime the document does not
        // define is checked by runtime::create, which skips the class if one is not).
        const prestart_kind kind = spec != nullptr ? prestart_kind_of(*spec) : prestart_kind::none;
        for (std::size_t k = 0; k < c.preload.size(); ++k) {
          const auto& m = c.preload[k];
          const std::string r = index_path(member_path(p, "preload"), k);
          if (kind == prestart_kind::python && !is_valid_preload_module(kind, m)) {
            fail(r, "not a dotted Python module name");
          }
          if (kind == prestart_kind::node && !is_valid_preload_module(kind, m)) {
            fail(r,
                 "not a Node package name (as `require` takes one: 'lodash', '@scope/pkg/sub'; "
                 "never a path) or built-in ('node:fs')");
          }
          if (kind == prestart_kind::none && !is_valid_preload_module(prestart_kind::python, m) &&
              !is_valid_preload_module(prestart_kind::node, m)) {
            fail(r, "not a module name");
          }
        }
      }
    };
    check_prestart(next.process.warm_pool, "warm_pool");
    check_pool(next.container.warm_pool, "backends.container.warm_pool");
    check_prestart(next.container.warm_pool, "backends.container.warm_pool");
    check_pool(next.gvisor.warm_pool, "backends.gvisor.warm_pool");
    check_prestart(next.gvisor.warm_pool, "backends.gvisor.warm_pool");
    check_pool(next.microvm.warm_pool, "backends.microvm.warm_pool");
    check_prestart(next.microvm.warm_pool, "backends.microvm.warm_pool");
    options = std::move(next);
    return {};
  } catch (const detail::decode_error& e) {
    return rejection{code::invalid_request, e.what()};
  } catch (const std::exception&) {
    return rejection{code::invalid_request, "configuration could not be decoded"};
  }
}

}  // namespace sandbox
