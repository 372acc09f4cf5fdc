// Loads NCCL's module (collective/nccl_group.h) when a group on it is asked for. The module is
// looked for at TANDEM_NCCL_MODULE, else at lib/libtandem-nccl.so beside the binary's folder
// (the build tree's and an installed tree's layout, as the cuda module's).
#include <arpa/inet.h>
#include <dlfcn.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "collective/gloo_group.h"
#include "collective/nccl_group.h"
#include "core/error.h"

namespace tandem {
namespace {

struct Loaded {
  const NcclModule* module = nullptr;
  std::string problem;
};

#if TANDEM_NCCL_BUILT
std::string module_path() {
  if (const char* path = std::getenv("TANDEM_NCCL_MODULE"); path != nullptr && *path != '\0') return path;
  std::string exe(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  if (n <= 0) return kNcclModuleFile;
  exe.resize(static_cast<std::size_t>(n));
  const auto slash = exe.rfind('/');
  return cat(exe.substr(0, slash == std::string::npos ? 0 : slash), "/../lib/", kNcclModuleFile);
}

Loaded load() {
  Loaded l;
  const std::string path = module_path();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    l.problem = access(path.c_str(), R_OK) == 0
                    ? cat("NCCL's module ", path, " could not be loaded: ", why ? why : "(no reason)",
                          "; install NCCL (libnccl.so.2) or add its folder to LD_LIBRARY_PATH")
                    : cat("NCCL's module could not be loaded: ", why ? why : path.c_str(),
                          "; it is built beside tandem where the CUDA toolkit and NCCL were found (build/<preset>/lib/), "
                          "or set TANDEM_NCCL_MODULE to its path");
    return l;
  }
  using Entry = const NcclModule* (*)();
  const auto entry = reinterpret_cast<Entry>(dlsym(handle, kNcclModuleEntry));
  const NcclModule* m = entry ? entry() : nullptr;
  if (m == nullptr || m->build_stamp == nullptr || std::strcmp(m->build_stamp, TANDEM_BUILD_STAMP) != 0) {
    l.problem = cat("NCCL's module ", path, " has no entry point ", kNcclModuleEntry, " of this build (stamp ",
                    TANDEM_BUILD_STAMP, "): rebuild both, or point TANDEM_NCCL_MODULE at this build's");
    return l;
  }
  l.module = m;
  return l;
}
#else
Loaded load() {
  return {nullptr, "this build of tandem has no NCCL: build it where the CUDA toolkit (nvcc) and NCCL are found"};
}
#endif

}  // namespace

bool nccl_built() { return TANDEM_NCCL_BUILT != 0; }

// The name of the interface that holds `address` (numeric IPv4 or IPv6), or "".
std::string interface_of(const std::string& address) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string name;
  for (ifaddrs* i = list; i != nullptr && name.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    char text[INET6_ADDRSTRLEN] = {};
    if (i->ifa_addr->sa_family == AF_INET)
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    else if (i->ifa_addr->sa_family == AF_INET6)
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, text, sizeof text);
    if (address == text) name = i->ifa_name;
  }
  freeifaddrs(list);
  return name;
}

std::unique_ptr<NcclGroup> make_nccl_group(int rank, int size, const NcclOptions& options) {
  static const Loaded loaded = load();  // once, thread-safe
  if (loaded.module == nullptr) fail("nccl group", loaded.problem);
  if (!options.address.empty()) {
    if (!options.allow_public && !private_address(options.address))
      fail("nccl group", cat("'", options.address, "' is not a private address, and NCCL's sockets are neither "
                             "encrypted nor authenticated: use a private interface, or allow a public one only behind "
                             "a VPN or a private interconnect"));
    const std::string name = options.address == "localhost" ? "lo" : interface_of(options.address);
    if (name.empty()) fail("nccl group", cat("no interface of this machine holds '", options.address, "'"));
    if (std::getenv("NCCL_SOCKET_IFNAME") == nullptr)  // the operator's choice stands
      setenv("NCCL_SOCKET_IFNAME", cat("=", name).c_str(), 0);
  }
  return loaded.module->make_group(rank, size, options);
}

}  // namespace tandem
