// Clang thread-safety annotations and an annotated mutex (private to the
// core library).
//
//   class Counter {
//    public:
//     void add() EXCLUDES(mu_) { MutexLock lock(mu_); ++n_; }
//    private:
//     mutable Mutex mu_;
//     int n_ GUARDED_BY(mu_) = 0;
//   };
//
// clang++ -Wthread-safety (the "thread-safety" CMake preset) then proves
// that every access to a GUARDED_BY member holds its mutex; other compilers
// see empty macros. libstdc++'s std::mutex carries no annotations, hence
// the thin Mutex/MutexLock wrappers. Mutex is as thread-safe as std::mutex.
#ifndef MINERU_HEALTH_SRC_THREAD_ANNOTATIONS_H_
#define MINERU_HEALTH_SRC_THREAD_ANNOTATIONS_H_

#include <mutex>

#if defined(__clang__)
#define MINERU_HEALTH_TSA(x) __attribute__((x))
#else
#define MINERU_HEALTH_TSA(x)
#endif

#define CAPABILITY(x) MINERU_HEALTH_TSA(capability(x))
#define SCOPED_CAPABILITY MINERU_HEALTH_TSA(scoped_lockable)
#define GUARDED_BY(x) MINERU_HEALTH_TSA(guarded_by(x))
#define PT_GUARDED_BY(x) MINERU_HEALTH_TSA(pt_guarded_by(x))
#define REQUIRES(...) MINERU_HEALTH_TSA(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) MINERU_HEALTH_TSA(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) MINERU_HEALTH_TSA(acquire_capability(__VA_ARGS__))
#define RELEASE(...) MINERU_HEALTH_TSA(release_capability(__VA_ARGS__))
#define NO_THREAD_SAFETY_ANALYSIS MINERU_HEALTH_TSA(no_thread_safety_analysis)

namespace mineru_health::internal {

class CAPABILITY("mutex") Mutex {
 public:
  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

// Holds a Mutex for its scope, like std::lock_guard.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() RELEASE() { mu_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

}  // namespace mineru_health::internal

#endif  // MINERU_HEALTH_SRC_THREAD_ANNOTATIONS_H_
