// ThreadSanitizer builds only (COHORT_SANITIZE=thread, CMakeLists.txt): tells
// TSan what absl::Mutex and absl::CondVar do.
//
// Why: Debian's Abseil is compiled without TSan, so its Mutex carries none of
// the annotations Abseil has for TSan, and TSan, which sees no pthread mutex
// in it, takes every field that two threads touch under one absl::Mutex for
// a data race. This file defines the public locking entry points of
// absl::Mutex and absl::CondVar in the program itself, which the dynamic
// linker then binds for the program and for every shared library (gRPC's
// calls included), and each one annotates the lock operation for TSan around
// a call to Abseil's own function (found with dlsym(RTLD_NEXT)), as Abseil's
// TSan build does. A wait on a condition or a CondVar releases the mutex and
// takes it back, and is annotated so.
//
// Abseil evaluates absl::Condition functions inside its own code, with the
// mutex held but at points these wrappers cannot annotate (the waiter after
// waking, the unlocking thread for every waiter): reads made inside Abseil's
// lock, unlock and wait functions are ignored, so a Condition's reads are
// not checked (its writes, which it should not make, still are). Abseil's
// functions call one another (WaitWithTimeout calls WaitWithDeadline); a
// call made inside a wrapper goes straight to Abseil's.
//
// Only the functions below are wrapped; a program that used another
// absl::Mutex entry point would be blind there (TSan then reports a race
// whose stacks show that function, not a silent miss).

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"

extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);

namespace {

// Whether this thread is inside a wrapper below.
thread_local int wrapper_depth = 0;

// Runs Abseil's function: annotated by the caller at the outermost wrapper
// only, with reads ignored.
class Inside {
 public:
  Inside() : outermost_(wrapper_depth++ == 0) {
    if (outermost_) AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
  }
  ~Inside() {
    if (outermost_) AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
    --wrapper_depth;
  }
  Inside(const Inside&) = delete;
  Inside& operator=(const Inside&) = delete;
  bool outermost() const { return outermost_; }

 private:
  const bool outermost_;
};

// Abseil's definition of the function whose mangled name is `name`.
template <typename Fn>
Fn Real(const char* name) {
  void* symbol = dlsym(RTLD_NEXT, name);
  if (symbol == nullptr) {
    std::fprintf(stderr, "tsan absl annotations: %s not found in Abseil\n", name);
    std::abort();
  }
  return reinterpret_cast<Fn>(symbol);
}

constexpr unsigned kRead = __tsan_mutex_read_lock;

// `call` takes the mutex `mu`.
template <typename Call>
auto Locking(void* mu, unsigned flags, Call call) {
  Inside inside;
  if (inside.outermost()) __tsan_mutex_pre_lock(mu, flags);
  auto result = call();
  if (inside.outermost()) __tsan_mutex_post_lock(mu, flags, 0);
  return result;
}

// `call` releases the mutex `mu`.
template <typename Call>
void Unlocking(void* mu, unsigned flags, Call call) {
  Inside inside;
  if (inside.outermost()) __tsan_mutex_pre_unlock(mu, flags);
  call();
  if (inside.outermost()) __tsan_mutex_post_unlock(mu, flags);
}

// The mutex `mu` is released, waited on and taken back inside `call`.
template <typename Call>
auto ReleasedWhile(void* mu, unsigned flags, Call call) {
  Inside inside;
  if (inside.outermost()) {
    __tsan_mutex_pre_unlock(mu, flags);
    __tsan_mutex_post_unlock(mu, flags);
  }
  auto result = call();
  if (inside.outermost()) {
    __tsan_mutex_pre_lock(mu, flags);
    __tsan_mutex_post_lock(mu, flags, 0);
  }
  return result;
}

// A value for the wrappers of functions that return none.
struct Void {};

}  // namespace

// The mangled names are the Itanium ABI's for Debian's inline namespace
// (absl::debian3); a mismatch aborts at the first call, saying which.
#define COHORT_REAL(type, mangled) static const auto real = Real<type>(mangled);

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  COHORT_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  Locking(this, 0, [&] { return real(this), Void{}; });
}

void Mutex::ReaderLock() {
  COHORT_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  Locking(this, kRead, [&] { return real(this), Void{}; });
}

bool Mutex::TryLock() {
  COHORT_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  Inside inside;
  if (inside.outermost()) __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
  const bool locked = real(this);
  if (inside.outermost()) {
    __tsan_mutex_post_lock(this,
                           __tsan_mutex_try_lock | (locked ? 0 : __tsan_mutex_try_lock_failed), 0);
  }
  return locked;
}

bool Mutex::ReaderTryLock() {
  COHORT_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  Inside inside;
  if (inside.outermost()) __tsan_mutex_pre_lock(this, __tsan_mutex_try_read_lock);
  const bool locked = real(this);
  if (inside.outermost()) {
    __tsan_mutex_post_lock(
        this, __tsan_mutex_try_read_lock | (locked ? 0 : __tsan_mutex_try_lock_failed), 0);
  }
  return locked;
}

void Mutex::Unlock() {
  COHORT_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  Unlocking(this, 0, [&] { real(this); });
}

void Mutex::ReaderUnlock() {
  COHORT_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  Unlocking(this, kRead, [&] { real(this); });
}

// LockWhen*: a lock taken once the condition holds.
void Mutex::LockWhen(const Condition& cond) {
  COHORT_REAL(void (*)(Mutex*, const Condition&),
              "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  Locking(this, 0, [&] { return real(this, cond), Void{}; });
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  COHORT_REAL(void (*)(Mutex*, const Condition&),
              "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Locking(this, kRead, [&] { return real(this, cond), Void{}; });
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  COHORT_REAL(bool (*)(Mutex*, const Condition&, Duration),
              "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking(this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  COHORT_REAL(bool (*)(Mutex*, const Condition&, Time),
              "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(this, 0, [&] { return real(this, cond, deadline); });
}

// Await*: called with the lock held, which is released while waiting.
void Mutex::Await(const Condition& cond) {
  COHORT_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  ReleasedWhile(this, 0, [&] { return real(this, cond), Void{}; });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  COHORT_REAL(bool (*)(Mutex*, const Condition&, Duration),
              "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return ReleasedWhile(this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  COHORT_REAL(bool (*)(Mutex*, const Condition&, Time),
              "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return ReleasedWhile(this, 0, [&] { return real(this, cond, deadline); });
}

// CondVar waits release `mu` (held by the caller, as a writer) meanwhile.
void CondVar::Wait(Mutex* mu) {
  COHORT_REAL(void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  ReleasedWhile(mu, 0, [&] { return real(this, mu), Void{}; });
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  COHORT_REAL(bool (*)(CondVar*, Mutex*, Duration),
              "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return ReleasedWhile(mu, 0, [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  COHORT_REAL(bool (*)(CondVar*, Mutex*, Time),
              "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return ReleasedWhile(mu, 0, [&] { return real(this, mu, deadline); });
}

ABSL_NAMESPACE_END
}  // namespace absl
