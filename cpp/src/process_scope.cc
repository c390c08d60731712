// scope_members: one pass over /proc joined with the cgroup's list and, for
// the processes not found otherwise, their initial environments. end_scope:
// SIGTERM, the grace, SIGKILL, each round re-reading the scope.
#include "mineru_health/process_scope.h"

#include <signal.h>

#include <algorithm>
#include <set>
#include <thread>
#include <unordered_map>

#include "procfs.h"

namespace mineru_health {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How often end_scope looks again: each look reads /proc once (and the
// environment of processes the other links do not place).
constexpr milliseconds kPoll{50};
// SIGKILL rounds after the grace: a process the kernel is still tearing down
// (large mappings, a device driver's release) may take a few.
constexpr int kKillRounds = 20;
constexpr int kKernelThreads = 2;  // kthreadd: the parent of kernel threads

// The rest of the first entry of `pid`'s initial environment that begins
// with `prefix`, or nullopt (none, or the environment cannot be read).
std::optional<std::string> environment_entry(int pid, std::string_view prefix) {
  const auto environ =
      internal::read_file("/proc/" + std::to_string(pid) + "/environ");
  if (!environ) return std::nullopt;
  std::string_view rest(*environ);
  while (!rest.empty()) {
    const std::size_t end = std::min(rest.find('\0'), rest.size());
    const std::string_view entry = rest.substr(0, end);
    if (entry.substr(0, prefix.size()) == prefix) {
      return std::string(entry.substr(prefix.size()));
    }
    rest.remove_prefix(std::min(end + 1, rest.size()));
  }
  return std::nullopt;
}

bool kernel_thread(const internal::ProcStat& p) {
  return p.pid == kKernelThreads || p.ppid == kKernelThreads;
}

}  // namespace

std::optional<ProcessId> process_id(int pid) {
  const auto stat = internal::read_stat(pid);
  if (!stat || stat->state == 'Z') return std::nullopt;
  return stat->id();
}

std::vector<ProcessId> scope_members(const ProcessScope& scope) {
  const std::vector<internal::ProcStat> all = internal::living_processes();
  std::set<int> linked;
  if (!scope.cgroup.empty()) {
    for (int pid : internal::cgroup_pids(scope.cgroup)) linked.insert(pid);
  }
  if (scope.leader > 1) {
    std::unordered_map<int, std::vector<int>> children;
    for (const auto& p : all) {
      children[p.ppid].push_back(p.pid);
      // The leader's group, and its session when it started one (a sid is
      // the pid of the process that called setsid, never reused meanwhile).
      if (p.pgrp == scope.leader || p.session == scope.leader) {
        linked.insert(p.pid);
      }
    }
    std::set<int> walked;
    std::vector<int> pending{scope.leader};
    while (!pending.empty()) {
      const int pid = pending.back();
      pending.pop_back();
      if (!walked.insert(pid).second) continue;
      linked.insert(pid);
      const auto found = children.find(pid);
      if (found != children.end()) {
        pending.insert(pending.end(), found->second.begin(),
                       found->second.end());
      }
    }
  }
  std::vector<ProcessId> members;
  for (const auto& p : all) {
    if (p.pid <= 1 || kernel_thread(p)) continue;
    if (linked.count(p.pid) != 0 ||
        (!scope.tag.empty() && environment_entry(p.pid, scope.tag))) {
      members.push_back(p.id());
    }
  }
  return members;  // living_processes() lists /proc in pid order
}

std::vector<std::pair<ProcessId, std::string>> tagged_processes(
    std::string_view prefix) {
  std::vector<std::pair<ProcessId, std::string>> found;
  if (prefix.empty()) return found;
  for (const auto& p : internal::living_processes()) {
    if (p.pid <= 1 || kernel_thread(p)) continue;
    if (auto value = environment_entry(p.pid, prefix)) {
      found.emplace_back(p.id(), std::move(*value));
    }
  }
  return found;
}

namespace {

// SIGKILL to every member until none is left or `deadline` passes; what is
// left then is counted in `report.survivors`.
EndReport kill_until(const ProcessScope& scope, Clock::time_point deadline,
                     EndReport report) {
  std::set<ProcessId> killed;
  for (;;) {
    const std::vector<ProcessId> members = scope_members(scope);
    if (members.empty()) return report;
    if (Clock::now() >= deadline) {
      report.survivors = static_cast<int>(members.size());
      return report;
    }
    // cgroup.kill reaches members that fork meanwhile; the signals, the rest.
    if (!scope.cgroup.empty()) {
      (void)internal::write_file(scope.cgroup + "/cgroup.kill", "1");
    }
    for (const ProcessId& member : members) {
      if (killed.insert(member).second) ++report.killed;
      (void)internal::signal_process(member, SIGKILL);
    }
    std::this_thread::sleep_for(kPoll);
  }
}

}  // namespace

EndReport end_scope(const ProcessScope& scope, milliseconds grace) {
  EndReport report;
  std::set<ProcessId> terminated;
  const Clock::time_point deadline = Clock::now() + grace;
  for (;;) {
    const std::vector<ProcessId> members = scope_members(scope);
    if (members.empty()) return report;
    for (const ProcessId& member : members) {
      if (terminated.insert(member).second &&
          internal::signal_process(member, SIGTERM)) {
        ++report.terminated;
        (void)internal::signal_process(member, SIGCONT);
      }
    }
    const Clock::time_point now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(
        std::min<Clock::duration>(kPoll, deadline - now));
  }
  return kill_until(scope, Clock::now() + kKillRounds * kPoll, report);
}

EndReport kill_scope(const ProcessScope& scope, milliseconds wait) {
  EndReport report;
  return kill_until(scope, Clock::now() + wait, report);
}

}  // namespace mineru_health
