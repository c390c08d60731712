// process_scope tests with real processes: a "worker" that leads its group,
// a child in that group, and a daemon that started its own session and was
// orphaned (double fork); each exec'ed with a tag in its environment. Bounded
// waits only; every process started here is ended by pid.
#include "mineru_health/process_scope.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace mineru_health {
namespace {

using std::chrono::milliseconds;

const std::string kTag =
    "MINERU_HEALTH_TEST_TAG=scope-test-" + std::to_string(getpid()) + "/";

// Execs `sleep 60` with the tag (and, when `deaf`, SIGTERM ignored, which
// exec keeps), from a process that already is the one to become it.
[[noreturn]] void become_sleeper(const std::string& tag, bool deaf) {
  if (deaf) signal(SIGTERM, SIG_IGN);
  std::string entry = tag + "x";
  char* const argv[] = {const_cast<char*>("sleep"), const_cast<char*>("60"),
                        nullptr};
  char* const envp[] = {entry.data(), nullptr};
  execve("/bin/sleep", argv, envp);
  _exit(127);
}

struct Family {
  pid_t worker = 0;  // leads its own process group; our child (we reap it)
  pid_t group_child = 0;
  pid_t daemon = 0;  // own session, orphaned: reparented away from the worker
};

// Starts the family; pids come back through a pipe.
Family start_family(const std::string& tag, bool deaf_daemon) {
  int report[2];
  EXPECT_EQ(pipe(report), 0);
  const pid_t worker = fork();
  if (worker == 0) {
    setpgid(0, 0);
    close(report[0]);
    pid_t pids[2] = {0, 0};
    pids[0] = fork();
    if (pids[0] == 0) become_sleeper(tag, false);
    int inner[2];
    if (pipe(inner) != 0) _exit(2);
    const pid_t middle = fork();
    if (middle == 0) {
      setsid();
      const pid_t daemon = fork();
      if (daemon == 0) become_sleeper(tag, deaf_daemon);
      if (write(inner[1], &daemon, sizeof daemon) != sizeof daemon) _exit(2);
      _exit(0);  // the daemon is orphaned
    }
    if (read(inner[0], &pids[1], sizeof pids[1]) != sizeof pids[1]) _exit(2);
    waitpid(middle, nullptr, 0);
    if (write(report[1], pids, sizeof pids) != sizeof pids) _exit(2);
    for (int i = 0; i < 600; ++i) pause();  // until killed (bounded)
    _exit(0);
  }
  close(report[1]);
  Family family;
  family.worker = worker;
  pid_t pids[2] = {0, 0};
  EXPECT_EQ(read(report[0], pids, sizeof pids),
            static_cast<ssize_t>(sizeof pids));
  close(report[0]);
  family.group_child = pids[0];
  family.daemon = pids[1];
  // Until both children run sleep (the tag is in their environment).
  for (int i = 0; i < 200; ++i) {
    const auto tagged = tagged_processes(tag);
    if (tagged.size() >= 2) break;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return family;
}

bool alive(pid_t pid) { return process_id(pid).has_value(); }

void reap(pid_t worker) {
  for (int i = 0; i < 500 && waitpid(worker, nullptr, WNOHANG) == 0; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
}

// Whatever a failed test left: the pids this test started, by pid.
void end_leftovers(const Family& f) {
  for (pid_t pid : {f.group_child, f.daemon, f.worker}) {
    if (pid > 1 && alive(pid)) kill(pid, SIGKILL);
  }
  if (f.worker > 0) reap(f.worker);
}

std::vector<int> pids_of(const std::vector<ProcessId>& members) {
  std::vector<int> pids;
  for (const auto& m : members) pids.push_back(m.pid);
  return pids;
}

TEST(ProcessScope, ProcessIdHasAStartTimeAndIsGoneForAZombie) {
  const auto self = process_id(getpid());
  ASSERT_TRUE(self.has_value());
  EXPECT_GT(self->start_ticks, 0u);
  const pid_t child = fork();
  if (child == 0) _exit(0);
  for (int i = 0; i < 500 && process_id(child).has_value(); ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_FALSE(process_id(child).has_value());  // a zombie until reaped
  waitpid(child, nullptr, 0);
  EXPECT_FALSE(process_id(0).has_value());
}

TEST(ProcessScope, MembersAreTheGroupTheDescendantsAndTheTagged) {
  const Family f = start_family(kTag, false);
  ProcessScope scope;
  scope.leader = f.worker;
  auto pids = pids_of(scope_members(scope));
  EXPECT_NE(std::find(pids.begin(), pids.end(), f.worker), pids.end());
  EXPECT_NE(std::find(pids.begin(), pids.end(), f.group_child), pids.end());
  // Its own session, and no longer a descendant: only the tag finds it.
  EXPECT_EQ(std::find(pids.begin(), pids.end(), f.daemon), pids.end());
  scope.tag = kTag;
  pids = pids_of(scope_members(scope));
  EXPECT_NE(std::find(pids.begin(), pids.end(), f.daemon), pids.end());
  EXPECT_EQ(std::find(pids.begin(), pids.end(), static_cast<int>(getpid())),
            pids.end());

  const auto tagged = tagged_processes(kTag);
  ASSERT_EQ(tagged.size(), 2u);
  EXPECT_EQ(tagged[0].second, "x");
  end_leftovers(f);
}

TEST(ProcessScope, EndScopeEndsEveryMemberWithSigterm) {
  const Family f = start_family(kTag, false);
  ProcessScope scope;
  scope.leader = f.worker;
  scope.tag = kTag;
  const EndReport report = end_scope(scope, milliseconds(5000));
  reap(f.worker);
  EXPECT_EQ(report.terminated, 3);
  EXPECT_EQ(report.killed, 0);
  EXPECT_EQ(report.survivors, 0);
  EXPECT_FALSE(alive(f.group_child));
  EXPECT_FALSE(alive(f.daemon));
  EXPECT_TRUE(scope_members(scope).empty());
  end_leftovers(f);
}

TEST(ProcessScope, WhatIgnoresSigtermIsKilledAfterTheGrace) {
  const Family f = start_family(kTag, true);
  ProcessScope scope;
  scope.leader = f.worker;
  scope.tag = kTag;
  const EndReport report = end_scope(scope, milliseconds(300));
  reap(f.worker);
  EXPECT_EQ(report.terminated, 3);
  EXPECT_EQ(report.killed, 1);  // the deaf daemon
  EXPECT_EQ(report.survivors, 0);
  EXPECT_FALSE(alive(f.daemon));
  end_leftovers(f);
}

// A worker killed first (kill -9): its group child and its daemon are
// orphans now, found by the group id and the tag.
TEST(ProcessScope, AKilledLeadersProcessesAreStillFound) {
  const Family f = start_family(kTag, false);
  ASSERT_EQ(kill(f.worker, SIGKILL), 0);
  reap(f.worker);
  ProcessScope scope;
  scope.leader = f.worker;
  scope.tag = kTag;
  const auto pids = pids_of(scope_members(scope));
  EXPECT_EQ(pids, (std::vector<int>{std::min(f.group_child, f.daemon),
                                    std::max(f.group_child, f.daemon)}));
  const EndReport report = end_scope(scope, milliseconds(5000));
  EXPECT_EQ(report.terminated, 2);
  EXPECT_EQ(report.survivors, 0);
  EXPECT_FALSE(alive(f.group_child));
  EXPECT_FALSE(alive(f.daemon));
  end_leftovers(f);
}

TEST(ProcessScope, AnEmptyScopeHasNoMember) {
  EXPECT_TRUE(scope_members(ProcessScope{}).empty());
  const EndReport report = end_scope(ProcessScope{}, milliseconds(100));
  EXPECT_EQ(report.terminated, 0);
  EXPECT_EQ(report.killed, 0);
  EXPECT_TRUE(tagged_processes("").empty());
}

TEST(ProcessScope, KillScopeKillsAtOnceAndWaitsForTheExit) {
  const Family f = start_family(kTag, true);
  ProcessScope scope;
  scope.leader = f.worker;
  scope.tag = kTag;
  const EndReport report = kill_scope(scope, milliseconds(10000));
  reap(f.worker);
  EXPECT_EQ(report.terminated, 0);  // no SIGTERM: nothing waits out a grace
  EXPECT_EQ(report.killed, 3);
  EXPECT_EQ(report.survivors, 0);
  EXPECT_FALSE(alive(f.group_child));
  EXPECT_FALSE(alive(f.daemon));
  end_leftovers(f);
}

// A worker that leads a session: what left its group but stayed in its
// session (setpgid, environment cleared) is still found.
TEST(ProcessScope, TheLeadersSessionIsPartOfTheScope) {
  int report[2];
  ASSERT_EQ(pipe(report), 0);
  const pid_t worker = fork();
  if (worker == 0) {
    setsid();
    close(report[0]);
    const pid_t stray = fork();
    if (stray == 0) {
      setpgid(0, 0);
      char* const argv[] = {const_cast<char*>("sleep"), const_cast<char*>("60"),
                            nullptr};
      char* const envp[] = {nullptr};
      execve("/bin/sleep", argv, envp);
      _exit(127);
    }
    if (write(report[1], &stray, sizeof stray) != sizeof stray) _exit(2);
    for (int i = 0; i < 600; ++i) pause();
    _exit(0);
  }
  close(report[1]);
  pid_t stray = 0;
  ASSERT_EQ(read(report[0], &stray, sizeof stray),
            static_cast<ssize_t>(sizeof stray));
  close(report[0]);
  for (int i = 0; i < 200; ++i) {  // until it left the group
    const auto stat = process_id(stray);
    if (stat && getpgid(stray) == stray) break;
    std::this_thread::sleep_for(milliseconds(10));
  }
  ProcessScope scope;
  scope.leader = worker;
  const auto pids = pids_of(scope_members(scope));
  EXPECT_NE(std::find(pids.begin(), pids.end(), stray), pids.end());
  const EndReport ended = kill_scope(scope, milliseconds(10000));
  reap(worker);
  EXPECT_EQ(ended.survivors, 0);
  EXPECT_FALSE(alive(stray));
  if (alive(stray)) kill(stray, SIGKILL);
}

}  // namespace
}  // namespace mineru_health
