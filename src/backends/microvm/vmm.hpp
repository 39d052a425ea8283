// The microvm level's VMM drivers (private to src/): what differs between VMMs is how one VM
// is described to them. The first driver is QEMU's `-M microvm` machine (qemu_driver.cpp); an
// API-driven VMM (Firecracker, Cloud Hypervisor) would be one more file implementing
// `vmm_driver` — written only together with a way to test it.
//
// The VMM process is started by the launcher (microvm_backend.cpp) with these descriptors,
// whatever the driver:
//   0 /dev/null · 1, 2 the VMM's log (<ws>/vmm.log, for the host log only)
//   3 the control channel (a stream socket: the guest's "sandbox.ctl" port)
//   4 the program's stdout pipe ("sandbox.stdout") · 5 its stderr pipe ("sandbox.stderr")
//   6 the kernel · 7 the initramfs · 8 the image disk (all opened read-only by the host)
//   9 the guest's console (the same log)
//  10 network runs only: the egress tunnel (a stream socket: the guest's "sandbox.net" port)
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sandbox::detail {

/// Descriptor numbers inside the VMM process (see above).
namespace vmm_fd {
inline constexpr int log = 2, ctl = 3, out = 4, err = 5, kernel = 6, initramfs = 7, disk = 8,
                     console = 9, net = 10;
}

/// One VM.
struct vm_spec {
  std::uint64_t memory_mib = 0;  ///< guest RAM
  std::uint32_t vcpus = 1;
  bool kvm = false;  ///< hardware virtualization; false: emulation (TCG)
  std::string kernel_cmdline;
  /// A network run: the "sandbox.net" port on `vmm_fd::net` (the egress tunnel). Without it
  /// the VM has no such port at all.
  bool net_port = false;
};

class vmm_driver {
 public:
  virtual ~vmm_driver() = default;
  /// Short name for results and logs ("qemu").
  virtual std::string_view name() const noexcept = 0;
  /// The executable.
  virtual const std::filesystem::path& binary() const noexcept = 0;
  /// argv of a VMM process that boots `vm` with the descriptors above and exits when the
  /// guest powers off (or panics).
  virtual std::vector<std::string> argv(const vm_spec& vm) const = 0;
};

/// QEMU's microvm machine (`qemu-system-x86_64`, 7.2 or later) at `binary`.
std::unique_ptr<vmm_driver> make_qemu_driver(std::filesystem::path binary);

}  // namespace sandbox::detail
