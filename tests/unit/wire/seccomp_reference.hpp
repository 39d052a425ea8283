// Test support: what the seccomp table (wire/seccomp_policy.hpp) means, evaluated independently
// of both things generated from it, so tests can hold each of them to it.
//
//  - `reference_action`: the table's meaning for one call at one enforcer, straight from the
//    rows (a call matches a rule when every check holds; a row's rules that match must agree);
//  - `probes`: calls around every rule of a row (each rule satisfied, each check broken, the
//    upper half of a compared argument set), so a filter that drops, adds or mistranslates a
//    condition answers one of them differently;
//  - `run_bpf`: a classic-BPF interpreter for the program libseccomp exports
//    (`export_seccomp_filter`), the way the kernel runs it over `struct seccomp_data`;
//  - `oci_action`: how a runtime applies a config.json `linux.seccomp` section to a call.
#pragma once

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "wire/seccomp_policy.hpp"

namespace seccomp_reference {

using sandbox::detail::seccomp_action;
using sandbox::detail::seccomp_action_kind;
using sandbox::detail::seccomp_arg_check;
using sandbox::detail::seccomp_enforcer;
using sandbox::detail::seccomp_op;
using sandbox::detail::seccomp_row;
using sandbox::detail::seccomp_rule;

/// Actions compare by kind, and by errno when they refuse.
inline bool same(seccomp_action a, seccomp_action b) {
  return a.kind == b.kind &&
         (a.kind != seccomp_action_kind::errno_value || a.errno_value == b.errno_value);
}

/// For messages.
inline std::string describe(seccomp_action a) {
  switch (a.kind) {
    case seccomp_action_kind::none:
      return "none";
    case seccomp_action_kind::notify:
      return "notify";
    case seccomp_action_kind::errno_value:
      return "errno " + std::to_string(a.errno_value);
  }
  return "?";
}

/// One call as a filter sees it.
struct call {
  int nr = 0;
  std::uint32_t arch = AUDIT_ARCH_X86_64;
  std::uint64_t args[6] = {};
};

inline bool holds(const seccomp_arg_check& c, std::uint64_t v) {
  switch (c.op) {
    case seccomp_op::ne:
      return v != c.value;
    case seccomp_op::eq:
      return v == c.value;
    case seccomp_op::gt:
      return v > c.value;
    case seccomp_op::masked_eq:
      return (v & c.value) == c.value_two;
  }
  return false;
}

inline bool holds(const seccomp_rule& r, const call& c) {
  for (const auto& check : r.args()) {
    if (!holds(check, c.args[check.index])) return false;
  }
  return true;
}

/// The table's meaning for `c`, a call of `row`'s syscall, at `e`. Throws when two matching
/// rules of the row ask for different actions (the table would be ambiguous).
inline seccomp_action reference_action(const seccomp_row& row, const call& c, seccomp_enforcer e) {
  std::optional<seccomp_action> found;
  for (const auto& rule : row.rules) {
    if (!holds(rule, c)) continue;
    const auto a = sandbox::detail::seccomp_action_for(row, rule, e);
    if (a.kind == seccomp_action_kind::none) continue;
    if (found && !same(*found, a)) {
      throw std::logic_error(std::string("ambiguous rules for ") + row.syscall);
    }
    found = a;
  }
  return found.value_or(seccomp_action{});
}

/// A value for which `check` fails.
inline std::uint64_t breaking(const seccomp_arg_check& check) {
  switch (check.op) {
    case seccomp_op::ne:
      return check.value;
    case seccomp_op::eq:
      return check.value + 1;
    case seccomp_op::gt:
      return check.value;
    case seccomp_op::masked_eq:
      return check.value_two ^ (check.value & (~check.value + 1));
  }
  return 0;
}

/// A value for which `check` holds.
inline std::uint64_t satisfying(const seccomp_arg_check& check) {
  switch (check.op) {
    case seccomp_op::ne:
      return check.value + 1;
    case seccomp_op::eq:
      return check.value;
    case seccomp_op::gt:
      return check.value + 1;
    case seccomp_op::masked_eq:
      return check.value_two;
  }
  return 0;
}

/// Calls of syscall `nr` around every rule of `row`: all arguments zero; each rule satisfied
/// (other arguments zero); each rule with one check broken; each rule satisfied with the
/// upper 32 bits of each compared argument set.
inline std::vector<call> probes(const seccomp_row& row, int nr) {
  std::vector<call> out;
  out.push_back(call{.nr = nr});
  for (const auto& rule : row.rules) {
    call base{.nr = nr};
    for (const auto& check : rule.args()) base.args[check.index] = satisfying(check);
    out.push_back(base);
    for (const auto& check : rule.args()) {
      call broken = base;
      broken.args[check.index] = breaking(check);
      out.push_back(broken);
      call high = base;
      high.args[check.index] |= 0xFFFFFFFF00000000ULL;
      out.push_back(high);
    }
  }
  return out;
}

/// What a seccomp return value means, in the table's terms; nullopt for any other action
/// (kill, trap, log, trace), which no filter of ours uses.
inline std::optional<seccomp_action> action_of_return(std::uint32_t ret) {
  switch (ret & SECCOMP_RET_ACTION_FULL) {
    case SECCOMP_RET_ALLOW:
      return seccomp_action{};
    case SECCOMP_RET_USER_NOTIF:
      return seccomp_action{seccomp_action_kind::notify, 0};
    case SECCOMP_RET_ERRNO:
      return seccomp_action{seccomp_action_kind::errno_value,
                            static_cast<int>(ret & SECCOMP_RET_DATA)};
    default:
      return std::nullopt;
  }
}

/// Runs a classic-BPF seccomp program over `c` as the kernel does; throws on an instruction a
/// seccomp program may not hold or a program that runs off its end.
inline std::uint32_t run_bpf(const std::vector<sock_filter>& prog, const call& c) {
  seccomp_data d{};
  d.nr = c.nr;
  d.arch = c.arch;
  for (int i = 0; i < 6; ++i) d.args[i] = c.args[i];
  std::uint32_t a = 0, x = 0, mem[BPF_MEMWORDS] = {};
  for (std::size_t pc = 0; pc < prog.size(); ++pc) {
    const sock_filter& f = prog[pc];
    const std::uint32_t src = BPF_SRC(f.code) == BPF_X ? x : f.k;
    switch (BPF_CLASS(f.code)) {
      case BPF_LD:
        if (f.code == (BPF_LD | BPF_W | BPF_ABS)) {
          if (f.k % 4 != 0 || f.k + 4 > sizeof d) throw std::logic_error("bpf: load out of range");
          std::memcpy(&a, reinterpret_cast<const char*>(&d) + f.k, 4);
        } else if (f.code == (BPF_LD | BPF_IMM)) {
          a = f.k;
        } else if (f.code == (BPF_LD | BPF_MEM) && f.k < BPF_MEMWORDS) {
          a = mem[f.k];
        } else {
          throw std::logic_error("bpf: unexpected load");
        }
        break;
      case BPF_LDX:
        if (f.code == (BPF_LDX | BPF_IMM)) {
          x = f.k;
        } else if (f.code == (BPF_LDX | BPF_MEM) && f.k < BPF_MEMWORDS) {
          x = mem[f.k];
        } else {
          throw std::logic_error("bpf: unexpected ldx");
        }
        break;
      case BPF_ST:
      case BPF_STX:
        if (f.k >= BPF_MEMWORDS) throw std::logic_error("bpf: store out of range");
        mem[f.k] = BPF_CLASS(f.code) == BPF_ST ? a : x;
        break;
      case BPF_ALU:
        switch (BPF_OP(f.code)) {
          case BPF_ADD:
            a += src;
            break;
          case BPF_SUB:
            a -= src;
            break;
          case BPF_MUL:
            a *= src;
            break;
          case BPF_AND:
            a &= src;
            break;
          case BPF_OR:
            a |= src;
            break;
          case BPF_XOR:
            a ^= src;
            break;
          case BPF_LSH:
            a = src < 32 ? a << src : 0;
            break;
          case BPF_RSH:
            a = src < 32 ? a >> src : 0;
            break;
          case BPF_NEG:
            a = ~a + 1;
            break;
          default:
            throw std::logic_error("bpf: unexpected alu op");
        }
        break;
      case BPF_JMP:
        if (BPF_OP(f.code) == BPF_JA) {
          pc += f.k;
        } else {
          bool taken = false;
          switch (BPF_OP(f.code)) {
            case BPF_JEQ:
              taken = a == src;
              break;
            case BPF_JGT:
              taken = a > src;
              break;
            case BPF_JGE:
              taken = a >= src;
              break;
            case BPF_JSET:
              taken = (a & src) != 0;
              break;
            default:
              throw std::logic_error("bpf: unexpected jump");
          }
          pc += taken ? f.jt : f.jf;
        }
        break;
      case BPF_RET:
        return BPF_RVAL(f.code) == BPF_K ? f.k : a;
      case BPF_MISC:
        if (BPF_MISCOP(f.code) == BPF_TAX) {
          x = a;
        } else {
          a = x;
        }
        break;
      default:
        throw std::logic_error("bpf: unexpected instruction class");
    }
  }
  throw std::logic_error("bpf: the program ran off its end");
}

/// sandbox-init's filter for `e`, as the kernel would get it.
inline std::vector<sock_filter> exported_filter(seccomp_enforcer e) {
  int fds[2];
  if (pipe(fds) < 0) throw std::runtime_error("pipe");
  const char* failed = nullptr;
  // The program is a few KiB: it fits in the pipe's buffer.
  const int rc = sandbox::detail::export_seccomp_filter(e, fds[1], &failed);
  close(fds[1]);
  std::string bytes;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;)
    bytes.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  if (rc < 0) throw std::runtime_error(std::string("export failed at ") + (failed ? failed : "?"));
  if (bytes.empty() || bytes.size() % sizeof(sock_filter) != 0) {
    throw std::runtime_error("export wrote no whole program");
  }
  std::vector<sock_filter> prog(bytes.size() / sizeof(sock_filter));
  std::memcpy(prog.data(), bytes.data(), bytes.size());
  return prog;
}

/// What a runtime does with `c` (a native call named `syscall`) under an OCI seccomp section:
/// the rules naming the call whose `args` all hold; their actions must agree (throws if not,
/// or on a rule this translation never writes).
inline seccomp_action oci_action(const nlohmann::json& section, const std::string& syscall,
                                 const call& c) {
  std::optional<seccomp_action> found;
  for (const auto& r : section.at("syscalls")) {
    const auto& names = r.at("names");
    if (std::find(names.begin(), names.end(), syscall) == names.end()) continue;
    bool all = true;
    for (const auto& a : r.value("args", nlohmann::json::array())) {
      seccomp_arg_check check;
      check.index = a.at("index").get<std::uint8_t>();
      check.value = a.at("value").get<std::uint64_t>();
      check.value_two = a.at("valueTwo").get<std::uint64_t>();
      const std::string op = a.at("op").get<std::string>();
      if (op == "SCMP_CMP_NE")
        check.op = seccomp_op::ne;
      else if (op == "SCMP_CMP_EQ")
        check.op = seccomp_op::eq;
      else if (op == "SCMP_CMP_GT")
        check.op = seccomp_op::gt;
      else if (op == "SCMP_CMP_MASKED_EQ")
        check.op = seccomp_op::masked_eq;
      else
        throw std::logic_error("oci: unexpected op " + op);
      all = all && holds(check, c.args[check.index]);
    }
    if (!all) continue;
    if (r.at("action") != "SCMP_ACT_ERRNO") throw std::logic_error("oci: unexpected action");
    const seccomp_action a{seccomp_action_kind::errno_value, r.at("errnoRet").get<int>()};
    if (found && !same(*found, a)) throw std::logic_error("oci: ambiguous rules for " + syscall);
    found = a;
  }
  return found.value_or(seccomp_action{});
}

}  // namespace seccomp_reference
