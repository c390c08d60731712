// cgroups tests: the home parsed from /proc text (table-driven), and, where
// this machine lets the test make cgroups, a real one made, a process moved
// in and the tree removed with it. Bounded waits only.
#include "mineru_health/cgroups.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "mineru_health/process_scope.h"

namespace mineru_health {
namespace {

using std::chrono::milliseconds;

constexpr const char* kUnified =
    "25 30 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - "
    "cgroup2 cgroup2 rw,nsdelegate\n";
constexpr const char* kHybrid =
    "35 25 0:30 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    "42 31 0:39 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n";

struct HomeCase {
  const char* name;
  const char* mountinfo;
  const char* self_cgroup;
  const char* path;
  bool error;
};

TEST(Cgroups, HomeFromProcText) {
  const HomeCase cases[] = {
      {"service", kUnified, "0::/system.slice/router.service\n",
       "/sys/fs/cgroup/system.slice/router.service", false},
      {"root", kUnified, "0::/\n", "/sys/fs/cgroup", false},
      {"hybrid", kHybrid, "4:cpu:/x\n0::/user.slice\n",
       "/sys/fs/cgroup/unified/user.slice", false},
      {"bind-mounted subtree",
       "50 1 0:23 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
       "0::/kubepods/pod1/c2\n", "/sys/fs/cgroup/c2", false},
      {"escaped mount point",
       "50 1 0:23 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n", "0::/a\n",
       "/mnt/cg two/a", false},
      {"v1 only", "42 31 0:39 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw\n",
       "4:cpu:/\n", "", true},
      {"no cgroup2 mount", "42 31 0:39 / /x rw - cgroup cgroup rw,cpu\n",
       "0::/a\n", "", true},
      {"outside the mount",
       "50 1 0:23 /other /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
       "0::/mine\n", "", true},
  };
  for (const HomeCase& c : cases) {
    SCOPED_TRACE(c.name);
    const CgroupHome home = cgroup_home_from(c.mountinfo, c.self_cgroup);
    EXPECT_EQ(home.path, c.path);
    EXPECT_EQ(!home.error.empty(), c.error) << home.error;
  }
}

TEST(Cgroups, MissingDirectoriesAreRemovedAlready) {
  const CgroupRemoval removal =
      remove_cgroup_tree("/nonexistent/mineru-health-test", milliseconds(10));
  EXPECT_EQ(removal.killed, 0);
  EXPECT_EQ(removal.error, "");
  EXPECT_NE(make_cgroup("/nonexistent/mineru-health-test/x"), "");
}

TEST(Cgroups, AWorkersCgroupIsMadeJoinedAndRemovedWithItsProcesses) {
  const CgroupHome home = find_cgroup_home();
  if (!home.error.empty()) GTEST_SKIP() << "no cgroup here: " << home.error;
  const std::string router =
      home.path + "/mineru-health-test." + std::to_string(getpid());
  const std::string worker = router + "/w.1";
  ASSERT_EQ(make_cgroup(router), "");
  ASSERT_EQ(make_cgroup(worker), "");
  EXPECT_EQ(make_cgroup(worker), "");  // made already: fine
  int moved_pipe[2];
  ASSERT_EQ(pipe(moved_pipe), 0);
  const pid_t child = fork();
  if (child == 0) {
    close(moved_pipe[1]);
    char go = 0;
    if (read(moved_pipe[0], &go, 1) != 1 || go != 'M') _exit(0);
    // Forked once its parent is in the cgroup: a grandchild in a session of
    // its own is in the cgroup all the same.
    if (fork() == 0) {
      setsid();
      for (int i = 0; i < 600; ++i) pause();
      _exit(0);
    }
    for (int i = 0; i < 600; ++i) pause();
    _exit(0);
  }
  close(moved_pipe[0]);
  const std::string moved = move_to_cgroup(worker, child);
  const char go = moved.empty() ? 'M' : 'X';
  EXPECT_EQ(write(moved_pipe[1], &go, 1), 1);
  close(moved_pipe[1]);
  if (!moved.empty()) {  // e.g. the no-internal-process rule of this home
    waitpid(child, nullptr, 0);
    (void)remove_cgroup_tree(router, milliseconds(1000));
    GTEST_SKIP() << "cannot move a process here: " << moved;
  }
  for (int i = 0; i < 200; ++i) {
    ProcessScope scope;
    scope.cgroup = worker;
    if (scope_members(scope).size() == 2) break;
    std::this_thread::sleep_for(milliseconds(10));
  }
  const CgroupRemoval removal = remove_cgroup_tree(router, milliseconds(5000));
  int status = 0;
  EXPECT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(removal.killed, 2);
  EXPECT_EQ(removal.error, "");
  struct stat info {};
  EXPECT_NE(stat(router.c_str(), &info), 0);
}

}  // namespace
}  // namespace mineru_health
