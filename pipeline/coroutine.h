// The coroutine types pipeline/task.h builds on: the standard's <coroutine>, or where a
// library has only the Coroutines TS's <experimental/coroutine> (Debian's Emscripten 3.1.6,
// whose libc++ predates the standard header; its clang takes either) the same names from there.
#pragma once

#if __has_include(<coroutine>)
#include <coroutine>
namespace tandem::co {
using std::coroutine_handle;
using std::suspend_always;
}  // namespace tandem::co
#else
#include <experimental/coroutine>
namespace tandem::co {
using std::experimental::coroutine_handle;
using std::experimental::suspend_always;
}  // namespace tandem::co
#endif
