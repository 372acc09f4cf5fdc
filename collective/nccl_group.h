// The GPU engine behind Group: NCCL (in the CUDA toolkit), one member a GPU. Like the cuda
// backend it lives in a module, lib/libtandem-nccl.so, that a binary loads when a group on
// NCCL is asked for: a CPU cloud neither needs nor maps CUDA's or NCCL's libraries
// (collective/nccl/nccl_group.cpp; built where the toolkit and NCCL are found).
//
// Each member binds its thread to one device (NcclOptions::device; by default the process's,
// so a machine with several GPUs runs one process a GPU, each started with its own
// CUDA_VISIBLE_DEVICES, as torchrun's LOCAL_RANK pins them). The members meet by NCCL's unique id, which
// member 0 draws and writes into the rendezvous folder under the group's prefix (one prefix
// a group, as Gloo's); NCCL itself then links them over NVLink, PCIe or the network.
//
// Group's calls take host memory: each copies it to the device, reduces there and copies the
// result back on the group's stream, one wait a call. all_sum_device() reduces memory that
// is already on the member's device (the cuda backend's tensors) with no copy and no host
// wait but the call's end. A member that dies or stays silent makes the call time out: the
// communicator is aborted and GroupLost thrown, as Gloo's group does.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "collective/group.h"

namespace tandem {

struct NcclOptions {
  std::string store_dir;  // the rendezvous folder: member 0 writes the group's id there
  std::string prefix;     // this group's: "<prefix>.nccl-id"
  int device = -1;        // the CUDA device this member uses (-1: the process's, as CUDA_VISIBLE_DEVICES leaves it)
  std::chrono::milliseconds timeout{30000};  // meeting the others, and each collective
  // The interface NCCL's sockets (its bootstrap, and its transport between machines without
  // InfiniBand) use: the one holding this address, which must be private unless allowed, as
  // Gloo's (NCCL's sockets are neither encrypted nor authenticated). Empty: NCCL's choice,
  // or NCCL_SOCKET_IFNAME as the operator set it.
  std::string address;
  bool allow_public = false;
};

class NcclGroup : public Group {
 public:
  // Sums `count` floats at `device_values` (memory on this member's device) across the
  // members, in place.
  virtual void all_sum_device(float* device_values, std::size_t count) = 0;
  virtual int device() const = 0;
};

// Joins the group as `rank` of `size` (returns once NCCL's communicator is up). An Error
// saying what is missing when this build has no NCCL, the module cannot be loaded, or the
// machine has no usable GPU; GroupLost when the others do not all arrive within the timeout.
std::unique_ptr<NcclGroup> make_nccl_group(int rank, int size, const NcclOptions& options);

// Whether this build has the NCCL module at all (the toolkit and NCCL were found).
bool nccl_built();

// The module's table (what lib/libtandem-nccl.so's entry point gives).
struct NcclModule {
  const char* build_stamp;  // as the cuda module's: another build's module is refused
  std::unique_ptr<NcclGroup> (*make_group)(int rank, int size, const NcclOptions& options);
};
inline constexpr const char* kNcclModuleFile = "libtandem-nccl.so";
inline constexpr const char* kNcclModuleEntry = "tandem_nccl_module";

}  // namespace tandem
