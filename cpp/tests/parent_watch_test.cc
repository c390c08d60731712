// parent_watch tests: a real child process, its parent killed, the child's
// fate observed through a pipe. Bounded waits only.
#include "mineru_health/parent_watch.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

namespace mineru_health {
namespace {

TEST(ParentWatch, Names) {
  EXPECT_STREQ(to_string(ParentWatch::kArmed), "armed");
  EXPECT_STREQ(to_string(ParentWatch::kParentGone), "parent_gone");
  EXPECT_STREQ(to_string(ParentWatch::kUnsupported), "unsupported");
}

TEST(ParentWatch, WrongParentIsReportedGone) {
  // Our parent is not pid 1 under the test runner... unless it is; either
  // way a pid that is surely not our parent must be reported as gone.
  const long not_parent = static_cast<long>(getppid()) + 1;
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const ParentWatch watch = exit_with_parent(SIGTERM, not_parent);
    _exit(watch == ParentWatch::kParentGone ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// middle (the "router") forks grandchild (the "worker"), which arms the
// watch and reports it; middle is then SIGKILLed; the grandchild must die of
// the signal, which the test sees as the pipe's write end closing.
TEST(ParentWatch, WorkerDiesWithItsKilledParent) {
  int report[2];
  ASSERT_EQ(pipe(report), 0);
  pid_t middle = fork();
  ASSERT_GE(middle, 0);
  if (middle == 0) {
    const long me = static_cast<long>(getpid());
    pid_t worker = fork();
    if (worker == 0) {
      close(report[0]);
      const ParentWatch watch = exit_with_parent(SIGKILL, me);
      const char armed = watch == ParentWatch::kArmed ? 'A' : 'X';
      if (write(report[1], &armed, 1) != 1) _exit(2);
      for (int i = 0; i < 600; ++i) pause();  // until killed (bounded)
      _exit(3);
    }
    close(report[1]);
    for (int i = 0; i < 600; ++i) pause();  // until the test kills it
    _exit(0);
  }
  close(report[1]);
  char armed = 0;
  ASSERT_EQ(read(report[0], &armed, 1), 1);
  EXPECT_EQ(armed, 'A');
  ASSERT_EQ(kill(middle, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(middle, &status, 0), middle);
  // EOF on the pipe: the worker (the last writer) is gone.
  pollfd fd{report[0], POLLIN, 0};
  ASSERT_EQ(poll(&fd, 1, 10000), 1);
  char byte;
  EXPECT_EQ(read(report[0], &byte, 1), 0);
  close(report[0]);
}

}  // namespace
}  // namespace mineru_health
