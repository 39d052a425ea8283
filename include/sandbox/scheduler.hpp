// Multi-tenant scheduling policy: how many runs may start or run at once (globally and per
// tenant), how long a run may wait in the queue, and how queued work is shared between
// tenants. Part of `runtime_options`; the scheduler itself is internal.
//
// Two levels: a global cap for the host, and a bulkhead per tenant, both counting runs that
// are *starting* as well as running (no over-admission under a burst). Queued runs are
// dispatched fairly across tenants (weighted round robin, a deficit round robin with unit
// cost), so a tenant that floods the queue only delays itself. A run that waits past its
// queue deadline ends with `queue_timeout`; a full queue rejects at once with `capacity`,
// with a retry-after hint. No host thread ever blocks waiting for a slot.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace sandbox {

/// Limits of one class of tenants (e.g. "free", "paid", "internal").
struct tenant_class_limits {
  std::uint32_t max_running = 4;   ///< bulkhead: runs of one tenant starting or running at once
  std::uint32_t max_queued = 256;  ///< queued runs of one tenant at most; beyond → `capacity`
  std::uint32_t weight = 1;        ///< share of dispatches when tenants compete (≥ 1)
  /// Longest a run of this class waits for a slot; beyond → `queue_timeout`.
  std::chrono::milliseconds queue_deadline{10000};
  /// Slots that live sessions of one tenant may hold at once (a session holds its slot for
  /// its whole life). 0 (default): half of `max_running`, at least 1. A session open beyond
  /// it is refused at once with `capacity` (it does not queue: a session is held for
  /// minutes, and waiting for one to end would only hold the queue).
  std::uint32_t max_session_slots = 0;
  bool operator==(const tenant_class_limits&) const = default;
};

/// Host-wide scheduling policy.
struct scheduler_options {
  /// Runs starting or running at once on this host (all tenants). 0: no scheduling at all
  /// (every admitted run starts at once).
  std::uint32_t max_running = 16;
  std::uint32_t max_queued = 1024;    ///< queued runs in all; beyond → `capacity`
  tenant_class_limits default_class;  ///< for tenants not listed in `tenant_classes`
  std::map<std::string, tenant_class_limits> classes;  ///< class name → limits
  std::map<std::string, std::string> tenant_classes;   ///< tenant → class name
  /// Slots that live sessions (of all tenants) may hold at once, so that idle sessions can
  /// never take every slot from runs. 0 (default): half of `max_running`, at least 1. A
  /// session open beyond it is refused at once with `capacity`. Not applied when
  /// `max_running` is 0 (no scheduling).
  std::uint32_t max_session_slots = 0;
  bool operator==(const scheduler_options&) const = default;
};

/// A snapshot of the scheduler's state.
struct scheduler_stats {
  std::uint32_t running = 0;         ///< slots held (starting or running)
  std::uint32_t queued = 0;          ///< runs waiting
  std::uint64_t dispatched = 0;      ///< slots granted so far
  std::uint64_t queue_timeouts = 0;  ///< runs that waited past their deadline
  std::uint64_t rejected = 0;        ///< runs refused with `capacity`
  std::uint32_t session_slots = 0;   ///< slots held by live sessions (part of `running`)
  bool operator==(const scheduler_stats&) const = default;
};

}  // namespace sandbox
