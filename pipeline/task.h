// Task<T>: a coroutine that computes a T, so one stage's protocol (pipeline/stage_peer.h) runs
// either on a thread that blocks in its links' receive, or driven by events on one thread (a
// browser's event loop, a server's executor holding many sessions), from the same code. A task
// starts when awaited (or start()ed at the top) and runs until it needs a message its link
// does not have yet: then it and every task awaiting it suspend, and the link resumes them when
// the message is delivered. A task that never waits runs to its end within start(), with no
// suspension: on a blocking link that is every task. Single-threaded: a task is resumed by the
// thread that delivers to its link. Errors thrown inside travel to the awaiting task.
#pragma once

#include "pipeline/coroutine.h"
#include <exception>
#include <optional>
#include <utility>

namespace tandem {

template <typename T = void>
class Task;

namespace detail {

struct TaskPromiseBase {
  co::coroutine_handle<> awaiting;  // the task awaiting this one, once that one has suspended
  std::exception_ptr error;
  co::suspend_always initial_suspend() noexcept { return {}; }
  // At its end a task resumes the one awaiting it only if that one suspended; a task that ends
  // within its awaiter's await_suspend lets that one go on without suspending, so a long run of
  // tasks that never wait uses no more stack than one. The resumption is a plain call, not a
  // handle returned for a tail call (that needs WebAssembly's tail calls, which browsers
  // before 2023 lack): nested only as deep as tasks await tasks. The awaiting task may destroy
  // this one's frame inside it; nothing here touches the frame after.
  struct Final {
    bool await_ready() noexcept { return false; }
    template <class P>
    void await_suspend(co::coroutine_handle<P> h) noexcept {
      co::coroutine_handle<> next = h.promise().awaiting;
      if (next) next.resume();
    }
    void await_resume() noexcept {}
  };
  Final final_suspend() noexcept { return {}; }
  void unhandled_exception() noexcept { error = std::current_exception(); }
  void rethrow() const {
    if (error) std::rethrow_exception(error);
  }
};

template <class T>
struct TaskPromise : TaskPromiseBase {
  std::optional<T> value;
  Task<T> get_return_object() noexcept;
  template <class U>
  void return_value(U&& v) {
    value.emplace(std::forward<U>(v));
  }
  T take() {
    rethrow();
    return std::move(*value);
  }
};

template <>
struct TaskPromise<void> : TaskPromiseBase {
  Task<void> get_return_object() noexcept;
  void return_void() noexcept {}
  void take() const { rethrow(); }
};

}  // namespace detail

template <typename T>
class [[nodiscard]] Task {
 public:
  using promise_type = detail::TaskPromise<T>;
  using Handle = co::coroutine_handle<promise_type>;

  Task() = default;
  explicit Task(Handle h) : h_(h) {}
  Task(Task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  Task& operator=(Task&& o) noexcept {
    if (this != &o) {
      if (h_) h_.destroy();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  // Destroying a suspended task destroys the tasks it awaits (they live in its frame).
  ~Task() {
    if (h_) h_.destroy();
  }

  // co_await task: runs it; when it ends without waiting, the awaiting task goes on at once.
  bool await_ready() const noexcept { return false; }
  bool await_suspend(co::coroutine_handle<> awaiting) {
    h_.resume();
    if (h_.done()) return false;
    h_.promise().awaiting = awaiting;  // it waits on a link: resume `awaiting` at its end
    return true;
  }
  T await_resume() { return h_.promise().take(); }

  // At the top (no task awaits it): runs it until it waits on a link or ends.
  void start() { h_.resume(); }
  bool valid() const { return static_cast<bool>(h_); }
  bool done() const { return h_ && h_.done(); }
  // Once done(): its value, or the Error it ended with, thrown.
  T result() { return h_.promise().take(); }

 private:
  Handle h_;
};

namespace detail {
template <class T>
Task<T> TaskPromise<T>::get_return_object() noexcept {
  return Task<T>(co::coroutine_handle<TaskPromise<T>>::from_promise(*this));
}
inline Task<void> TaskPromise<void>::get_return_object() noexcept {
  return Task<void>(co::coroutine_handle<TaskPromise<void>>::from_promise(*this));
}
}  // namespace detail

}  // namespace tandem
