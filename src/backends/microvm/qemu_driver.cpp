// QEMU's `-M microvm` machine: no PCI, no firmware option ROMs, virtio-mmio devices only.
//   - no network device at all (`-nodefaults`, none added);
//   - the image disk read-only (virtio-blk over mmio);
//   - three virtio-serial ports (four in a network run: the egress tunnel), named as
//     wire/guest_protocol.hpp says, on the stream sockets the host passed
//     (`-chardev socket,fd=`);
//   - `-sandbox on` (QEMU's own seccomp filter) with elevateprivileges, spawn and
//     resourcecontrol denied;
//   - TCG's translation cache bounded (`tb-size`): the VMM runs under the run's cgroup.
// Note: `rtc=off` must not be given to `-M microvm`: the guest then hangs at boot.
#include <fmt/format.h>

#include "backends/microvm/vmm.hpp"
#include "wire/guest_protocol.hpp"

namespace sandbox::detail {
namespace {

class qemu_driver final : public vmm_driver {
 public:
  explicit qemu_driver(std::filesystem::path binary) : binary_(std::move(binary)) {}

  std::string_view name() const noexcept override { return "qemu"; }
  const std::filesystem::path& binary() const noexcept override { return binary_; }

  std::vector<std::string> argv(const vm_spec& vm) const override {
    auto fdpath = [](int fd) { return fmt::format("/proc/self/fd/{}", fd); };
    std::vector<std::string> a = {
        "qemu-system-x86_64",
        "-M",
        "microvm,x-option-roms=off,isa-serial=on",
        "-accel",
        vm.kvm ? "kvm" : "tcg,tb-size=64",
        "-m",
        fmt::format("{}M", vm.memory_mib),
        "-smp",
        std::to_string(vm.vcpus),
        "-nodefaults",
        "-no-user-config",
        "-nographic",
        "-no-reboot",
        "-kernel",
        fdpath(vmm_fd::kernel),
        "-initrd",
        fdpath(vmm_fd::initramfs),
        "-append",
        vm.kernel_cmdline,
        "-drive",
        fmt::format("file={},format=raw,if=none,readonly=on,id=d0", fdpath(vmm_fd::disk)),
        "-device",
        "virtio-blk-device,drive=d0",
        "-device",
        "virtio-serial-device",
    };
    // One virtio-serial port per stream socket the host passed, named as the guest agent
    // looks them up. Stream sockets (launcher::stdio_sockets): a socket chardev that the host
    // does not drain fast enough throttles the port, so the guest's writes wait. (A file
    // chardev on a pipe was seen losing most of a 24 MiB flood.)
    const struct {
      const char* id;
      int fd;
      const char* name;
    } ports[] = {{"ctl", vmm_fd::ctl, guest_protocol::ctl_port},
                 {"out", vmm_fd::out, guest_protocol::stdout_port},
                 {"err", vmm_fd::err, guest_protocol::stderr_port},
                 {"net", vmm_fd::net, guest_protocol::net_port}};
    for (const auto& p : ports) {
      if (p.fd == vmm_fd::net && !vm.net_port) continue;  // network runs only
      a.insert(a.end(), {"-chardev", fmt::format("socket,id={},fd={}", p.id, p.fd), "-device",
                         fmt::format("virtserialport,chardev={},name={}", p.id, p.name)});
    }
    a.insert(a.end(), {
                          // The guest's console goes to the VMM's log (host log only).
                          "-add-fd",
                          fmt::format("fd={},set=3", vmm_fd::console),
                          "-chardev",
                          "file,id=con,path=/dev/fdset/3,append=on",
                          "-serial",
                          "chardev:con",
                          "-sandbox",
                          "on,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
                      });
    return a;
  }

 private:
  std::filesystem::path binary_;
};

}  // namespace

std::unique_ptr<vmm_driver> make_qemu_driver(std::filesystem::path binary) {
  return std::make_unique<qemu_driver>(std::move(binary));
}

}  // namespace sandbox::detail
