// Parent watch: a worker that a router launched dies with that router, however
// the router dies (SIGKILL included), so no worker keeps its GPU memory as an
// orphan.
//
//   if (!mineru_health::exit_with_parent(SIGTERM, router_pid)) {
//     // the router is already gone: exit now
//   }
//
// Linux only (prctl PR_SET_PDEATHSIG); elsewhere it reports `kUnsupported`.
// The kernel sends the signal when the thread that started this process
// exits, so the router must launch workers from a thread that lives as long
// as it does (MinerU's router launches them from its event loop thread).
//
// Thread-safety: call once, from any thread; it changes process-wide state.
#ifndef MINERU_HEALTH_PARENT_WATCH_H_
#define MINERU_HEALTH_PARENT_WATCH_H_

namespace mineru_health {

enum class ParentWatch {
  kArmed,        // the signal comes when the parent exits
  kParentGone,   // the parent is not `expected_parent` any more: exit now
  kUnsupported,  // not Linux, or prctl refused
};

const char* to_string(ParentWatch watch);

// Asks the kernel to send `signal` to this process when its parent exits,
// then checks that the parent is still `expected_parent` (it may have died
// before the request: the kernel would then never send the signal).
[[nodiscard]] ParentWatch exit_with_parent(int signal, long expected_parent);

}  // namespace mineru_health

#endif  // MINERU_HEALTH_PARENT_WATCH_H_
