// NCCL behind Group (collective/nccl_group.h): the module lib/libtandem-nccl.so, linked with
// CUDA's runtime and NCCL; its calls into core land in the loading binary's (which exports
// tandem's symbols, as for the cuda module).
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "collective/nccl_group.h"
#include "core/error.h"

#if NCCL_VERSION_CODE < 21400
#error "NCCL 2.14 or newer is needed (non-blocking communicators, ncclConfig_t)"
#endif

#ifndef TANDEM_BUILD_STAMP
#error "TANDEM_BUILD_STAMP is set by the build (CMakeLists.txt)"
#endif

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("nccl group", cat(what, ": ", cudaGetErrorString(e)));
}

class Nccl final : public NcclGroup {
 public:
  Nccl(int rank, int size, const NcclOptions& o) : rank_(rank), size_(size), timeout_(o.timeout) {
    name_ = cat("nccl group '", o.prefix, "' (member ", rank, " of ", size, ")");
    try {
      start(o);
    } catch (...) {
      release();
      throw;
    }
  }
  ~Nccl() override { release(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }

  void all_sum(std::span<float> values) override {
    if (values.empty()) return;
    through_device(values, [&](float* d) { return ncclAllReduce(d, d, values.size(), ncclFloat, ncclSum, comm_, stream_); },
                   "all-sum");
  }
  void broadcast(std::span<float> values, int root) override {
    if (root < 0 || root >= size_) fail(name_, cat("broadcast from member ", root, " of a group of ", size_));
    if (values.empty()) return;
    through_device(values, [&](float* d) { return ncclBroadcast(d, d, values.size(), ncclFloat, root, comm_, stream_); },
                   "broadcast");
  }
  void barrier() override {
    float one = 1.0f;
    all_sum(std::span<float>(&one, 1));
  }
  void all_sum_device(float* device_values, std::size_t count) override {
    if (count == 0) return;
    begin();
    const auto t0 = Clock::now();
    call(ncclAllReduce(device_values, device_values, count, ncclFloat, ncclSum, comm_, stream_), "all-sum");
    finish("all-sum", Clock::now() + timeout_);
    count_one(count * sizeof(float), t0);
  }

 private:
  void start(const NcclOptions& o) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
      fail(name_, "this machine has no usable CUDA device (a GPU and its driver): NCCL's group needs one a member; "
                  "use Gloo's on CPUs");
    // The process's device unless told: pin a replica to a GPU with CUDA_VISIBLE_DEVICES (as
    // torchrun's LOCAL_RANK does), so its rank, which changes between epochs, never moves it.
    if (o.device >= 0) {
      device_ = o.device;
    } else {
      check_cuda(cudaGetDevice(&device_), "cudaGetDevice");
    }
    if (device_ >= devices) fail(name_, cat("device ", device_, " of a machine with ", devices, " GPUs"));
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    ncclUniqueId id{};
    const std::string path = cat(o.store_dir, "/", o.prefix, ".nccl-id");
    const auto deadline = Clock::now() + timeout_;
    if (rank_ == 0) {
      if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
        fail(name_, cat("ncclGetUniqueId: ", ncclGetErrorString(r)));
      std::error_code ec;
      std::filesystem::create_directories(o.store_dir, ec);
      const std::string tmp = cat(path, ".tmp", ::getpid());
      {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out.write(id.internal, sizeof id.internal);
        if (!out.flush()) fail(name_, cat("cannot write ", tmp));
      }
      std::filesystem::rename(tmp, path, ec);
      if (ec) fail(name_, cat("cannot write ", path, ": ", ec.message()));
    } else {
      for (;;) {
        std::ifstream in(path, std::ios::binary);
        if (in.read(id.internal, sizeof id.internal)) break;
        if (Clock::now() >= deadline)
          throw GroupLost(cat("[", name_, "] member 0 wrote no id at ", path, " within ", timeout_.count(), " ms"));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    // Non-blocking: every wait below has a deadline, and a member gone aborts the communicator.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    call(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "meeting the others");
    settle("meeting the others", deadline);
  }
  // Frees what it holds: the communicator finalized within the timeout (its pending work
  // flushed), else aborted.
  void release() {
    if (comm_ && !lost_) {
      ncclResult_t r = ncclCommFinalize(comm_);
      const auto deadline = Clock::now() + timeout_;
      ncclResult_t state = r;
      while (r == ncclSuccess || r == ncclInProgress) {
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || state != ncclInProgress) break;
        if (Clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      state == ncclSuccess ? ncclCommDestroy(comm_) : ncclCommAbort(comm_);
    } else if (comm_) {
      ncclCommAbort(comm_);
    }
    comm_ = nullptr;
    if (buffer_) cudaFree(buffer_);
    buffer_ = nullptr;
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
  void begin() {
    if (lost_) throw GroupLost(cat("[", name_, "] a collective on a group an earlier one lost: build a new one"));
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");  // this thread's calls go to the member's device
  }
  template <typename F>
  void through_device(std::span<float> values, F&& op, const char* what) {
    begin();
    const auto t0 = Clock::now();
    const std::size_t bytes = values.size_bytes();
    if (bytes > capacity_) {
      if (buffer_) cudaFree(buffer_);
      buffer_ = nullptr;
      check_cuda(cudaMalloc(reinterpret_cast<void**>(&buffer_), bytes), "cudaMalloc");
      capacity_ = bytes;
    }
    check_cuda(cudaMemcpyAsync(buffer_, values.data(), bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
    call(op(buffer_), what);
    // The result comes back once the collective is done (finish has a deadline); a copy into
    // pageable memory queued behind it would wait for it without one.
    finish(what, Clock::now() + timeout_);
    check_cuda(cudaMemcpy(values.data(), buffer_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    count_one(bytes, t0);
  }
  void call(ncclResult_t r, const char* what) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    // A peer's or the network's failure loses the group; a misuse here is a plain Error.
    if (r == ncclRemoteError || r == ncclSystemError) lose(what, ncclGetErrorString(r));
    lost_ = true;
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    fail(name_, cat(what, ": ", ncclGetErrorString(r)));
  }
  // Until the communicator's pending work is enqueued (non-blocking calls) or it failed.
  void settle(const char* what, Clock::time_point deadline) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      if (const ncclResult_t r = ncclCommGetAsyncError(comm_, &state); r != ncclSuccess) state = r;
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) lose(what, ncclGetErrorString(state));
      if (Clock::now() >= deadline) lose(what, cat("no answer within ", timeout_.count(), " ms").c_str());
      std::this_thread::yield();
    }
  }
  // Until the stream's work is done, watching the communicator for errors.
  void finish(const char* what, Clock::time_point deadline) {
    settle(what, deadline);
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) fail(name_, cat(what, ": ", cudaGetErrorString(e)));
      ncclResult_t state = ncclSuccess;
      if (const ncclResult_t r = ncclCommGetAsyncError(comm_, &state); r != ncclSuccess) state = r;
      if (state != ncclSuccess && state != ncclInProgress) lose(what, ncclGetErrorString(state));
      if (Clock::now() >= deadline) lose(what, cat("not done within ", timeout_.count(), " ms").c_str());
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  [[noreturn]] void lose(const char* what, const char* why) {
    lost_ = true;
    if (comm_) ncclCommAbort(comm_);  // wakes this member's kernels waiting on the gone one
    comm_ = nullptr;
    throw GroupLost(cat("[", name_, "] the ", what, " did not complete (a member died or stayed silent): ", why));
  }
  void count_one(std::size_t bytes, Clock::time_point t0) {
    ++stats_.collectives;
    stats_.bytes += bytes;
    stats_.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  }

  std::string name_;
  int rank_, size_, device_ = 0;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* buffer_ = nullptr;
  std::size_t capacity_ = 0;
  bool lost_ = false;
};

std::unique_ptr<NcclGroup> make(int rank, int size, const NcclOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) fail("nccl group", cat("member ", rank, " of a group of ", size));
  return std::make_unique<Nccl>(rank, size, options);
}

}  // namespace
}  // namespace tandem

extern "C" [[gnu::visibility("default")]] const tandem::NcclModule* tandem_nccl_module() {
  static const tandem::NcclModule module{TANDEM_BUILD_STAMP, tandem::make};
  return &module;
}
