// Pieces shared by the oneDNN kernels: the engine and stream of a backend, the thread count
// scope, primitives whose arguments are bound once (Step), and tensors that live in tandem's
// layout on the caller's side and in the primitive's layout inside the kernel (Port).
#pragma once

#include <cstdint>
#include <dnnl.hpp>
#include <initializer_list>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace tandem::onednn {

struct Context {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  int threads = 1;
};

// Sets the calling thread's OpenMP thread count (oneDNN's CPU runtime in this build) for one
// scope and restores the previous value after, so primitives are created and run with
// BackendOptions.threads whatever the caller's OpenMP setting is.
class ThreadScope {
 public:
  explicit ThreadScope(int threads);
  ~ThreadScope();
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int previous_ = 0;
};

// Runs f() with the backend's thread count; a dnnl::error becomes a tandem::Error
// "[onednn] <what> failed: <oneDNN's message> for <shape.str()>" (the string is made only
// on failure, so a call allocates nothing).
template <typename Shape, typename F>
void guarded(const Context& ctx, std::string_view what, const Shape& shape, F&& f) {
  ThreadScope threads(ctx.threads);
  try {
    f();
  } catch (const dnnl::error& e) {
    fail("onednn", cat(what, " failed: ", e.what(), " for ", shape.str()));
  }
}

// Binds `memory` to a caller's buffer (no copy, no allocation).
void bind(const dnnl::memory& memory, const void* data);

// A memory object that wraps a caller's buffer (bound per call with bind()).
dnnl::memory wrapper(const Context& ctx, const dnnl::memory::desc& md);

// One primitive with its arguments fixed at creation; memories are rebound with bind(), and
// run() calls dnnl_primitive_execute on a prebuilt argument array. A primitive that needs
// scratch gets it here, once (the primitive descriptors use scratchpad_mode::user).
class Step {
 public:
  Step() = default;
  Step(const Context& ctx, const dnnl::primitive_desc_base& pd,
       std::initializer_list<std::pair<int, dnnl::memory>> args);
  explicit operator bool() const { return static_cast<bool>(primitive_); }
  void run(const Context& ctx) const;

 private:
  dnnl::primitive primitive_;
  dnnl::memory scratch_;
  std::vector<dnnl::memory> memories_;  // keeps the argument handles alive
  std::vector<dnnl_exec_arg_t> args_;
};

dnnl::primitive_attr user_scratchpad();

// Whether oneDNN picked its reference (plain C++) implementation for `pd`.
bool is_reference(const dnnl::primitive_desc_base& pd);

// A tensor argument of a primitive. `user` wraps the caller's buffer in tandem's layout
// (NHWC, OHWI, [out, in]); when the primitive asked for another layout, `inner` is a buffer
// of the kernel in that layout and `convert` reorders user -> inner (inputs) or inner -> user
// (outputs). When the layouts agree, inner is user and nothing is copied.
struct Port {
  dnnl::memory user, inner;
  Step convert;

  static Port input(const Context& ctx, const dnnl::memory::desc& user_md, const dnnl::memory::desc& want);
  static Port output(const Context& ctx, const dnnl::memory::desc& user_md, const dnnl::memory::desc& want);

  // Inputs: bind the caller's buffer and bring it into the primitive's layout.
  void load(const Context& ctx, const void* data) const {
    bind(user, data);
    if (convert) convert.run(ctx);
  }
  // Outputs: bind before the primitive runs, store after it.
  void bind_output(void* data) const { bind(user, data); }
  void store(const Context& ctx) const {
    if (convert) convert.run(ctx);
  }
};

// Weights in the primitive's layout, reordered from the caller's only when the pointer or
// WeightsView.version changed since the last call (once per optimizer step).
struct WeightsPort {
  Port port;
  const float* loaded = nullptr;
  uint64_t version = 0;

  void load(const Context& ctx, const float* data, uint64_t v) {
    if (!port.convert) {
      bind(port.user, data);
      return;
    }
    if (data == loaded && v == version) return;
    port.load(ctx, data);
    loaded = data;
    version = v;
  }
};

}  // namespace tandem::onednn
