#include "backends/onednn/onednn_common.h"

#include <string_view>

#if DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP
#include <omp.h>
#endif

namespace tandem::onednn {

#if DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP
ThreadScope::ThreadScope(int threads) : previous_(omp_get_max_threads()) {
  if (previous_ != threads) omp_set_num_threads(threads);
}
ThreadScope::~ThreadScope() {
  if (omp_get_max_threads() != previous_) omp_set_num_threads(previous_);
}
#else
// Other CPU runtimes (TBB, threadpool, sequential) take their thread count elsewhere.
ThreadScope::ThreadScope(int) {}
ThreadScope::~ThreadScope() {}
#endif

void bind(const dnnl::memory& memory, const void* data) {
  const dnnl_status_t s = dnnl_memory_set_data_handle_v2(memory.get(), const_cast<void*>(data), nullptr);
  if (s != dnnl_success) throw dnnl::error(s, "could not bind a buffer");
}

dnnl::memory wrapper(const Context& ctx, const dnnl::memory::desc& md) {
  return dnnl::memory(md, ctx.engine, DNNL_MEMORY_NONE);
}

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

bool is_reference(const dnnl::primitive_desc_base& pd) {
  return std::string_view(pd.impl_info_str()).starts_with("ref");
}

Step::Step(const Context& ctx, const dnnl::primitive_desc_base& pd,
           std::initializer_list<std::pair<int, dnnl::memory>> args)
    : primitive_(pd.get()) {
  for (const auto& [arg, memory] : args) {
    memories_.push_back(memory);
    args_.push_back({arg, memory.get()});
  }
  const dnnl::memory::desc scratch_md = pd.scratchpad_desc();
  if (scratch_md.get_size() > 0) {
    scratch_ = dnnl::memory(scratch_md, ctx.engine);  // allocated once, here
    args_.push_back({DNNL_ARG_SCRATCHPAD, scratch_.get()});
  }
}

void Step::run(const Context& ctx) const {
  const dnnl_status_t s =
      dnnl_primitive_execute(primitive_.get(), ctx.stream.get(), static_cast<int>(args_.size()), args_.data());
  if (s != dnnl_success) throw dnnl::error(s, "could not execute a primitive");
}

Port Port::input(const Context& ctx, const dnnl::memory::desc& user_md, const dnnl::memory::desc& want) {
  Port p;
  p.user = wrapper(ctx, user_md);
  if (want == user_md) {
    p.inner = p.user;
  } else {
    p.inner = dnnl::memory(want, ctx.engine);
    dnnl::reorder::primitive_desc pd(ctx.engine, user_md, ctx.engine, want, user_scratchpad());
    p.convert = Step(ctx, pd, {{DNNL_ARG_FROM, p.user}, {DNNL_ARG_TO, p.inner}});
  }
  return p;
}

Port Port::output(const Context& ctx, const dnnl::memory::desc& user_md, const dnnl::memory::desc& want) {
  Port p;
  p.user = wrapper(ctx, user_md);
  if (want == user_md) {
    p.inner = p.user;
  } else {
    p.inner = dnnl::memory(want, ctx.engine);
    dnnl::reorder::primitive_desc pd(ctx.engine, want, ctx.engine, user_md, user_scratchpad());
    p.convert = Step(ctx, pd, {{DNNL_ARG_FROM, p.inner}, {DNNL_ARG_TO, p.user}});
  }
  return p;
}

}  // namespace tandem::onednn
