// exit_with_parent: prctl(PR_SET_PDEATHSIG) followed by the getppid() check
// that closes the race with a parent dying first.
#include "mineru_health/parent_watch.h"

#if defined(__linux__)
#include <sys/prctl.h>
#include <unistd.h>
#endif

namespace mineru_health {

const char* to_string(ParentWatch watch) {
  switch (watch) {
    case ParentWatch::kArmed:
      return "armed";
    case ParentWatch::kParentGone:
      return "parent_gone";
    case ParentWatch::kUnsupported:
      return "unsupported";
  }
  return "unknown";
}

ParentWatch exit_with_parent(int signal, long expected_parent) {
#if defined(__linux__)
  if (prctl(PR_SET_PDEATHSIG, static_cast<unsigned long>(signal)) != 0) {
    return ParentWatch::kUnsupported;
  }
  return static_cast<long>(getppid()) == expected_parent
             ? ParentWatch::kArmed
             : ParentWatch::kParentGone;
#else
  (void)signal;
  (void)expected_parent;
  return ParentWatch::kUnsupported;
#endif
}

}  // namespace mineru_health
