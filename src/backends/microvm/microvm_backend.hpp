// The microvm level (private to src/): one QEMU `-M microvm` VM per run. The guest agent
// (helpers/guest, PID 1 of the guest) plays the part runsc plays for the gvisor level: it
// starts sandbox-init in stream mode and relays its control channel over a virtio-serial
// port, so the run's life is the shared run machine's (core/run/machine.hpp) with this
// level's `launcher`. See docs/architecture.md ("microvm level").
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <variant>

#include "core/run/machine.hpp"
#include "sandbox/backend_options.hpp"

namespace sandbox::detail {

/**
 * Checks the host (root, the VMM binary, `mkfs.erofs`, the kernel store's `vmlinuz`,
 * `modules/order` and each module it names), builds or reuses the initramfs (cached under
 * `<state>/microvm/initramfs/` by the hash of its content), then runs the start-up
 * self-test (one VM boots and runs sandbox-init's probe) and returns the backend, or a
 * one-line reason naming what is missing.
 */
std::variant<std::shared_ptr<backend>, std::string> make_microvm_backend(
    const run_machine_context& ctx, const microvm_backend_options& options);

/// Caps the host applies to what a guest sends back (the run's `files_out`).
struct guest_output_limits {
  std::uint32_t max_files = 16;
  std::uint64_t max_bytes = 8ULL << 20;
};

/**
 * The host's side of one run's guest agent: checks and applies the agent's frames (types
 * from 100, wire/guest_protocol.hpp). Output files are written into the directory open at
 * `out_dir_fd` (the caller keeps ownership; the host output dir `<ws>/out`), each name one
 * path component, created exclusively, never following a link, within `limits` (count and
 * total bytes) and exactly the declared size; anything else is refused with a reason and
 * nothing more is written. Exposed for unit tests of hostile frames.
 */
std::unique_ptr<agent_channel> make_guest_channel(int out_dir_fd, guest_output_limits limits,
                                                  std::string setup_payload);

}  // namespace sandbox::detail
