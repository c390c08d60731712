// Process scope: every process of one local worker, found and ended as one,
// so that no engine process of a replaced, lost or orphaned worker keeps its
// GPU (vLLM's EngineCore outlives a SIGKILLed API server: vLLM #55510).
//
//   mineru_health::ProcessScope scope;
//   scope.leader = worker_pid;                      // also its process group
//   scope.cgroup = home + "/mineru-health-router.1234.99/local-0.1";  // or ""
//   scope.tag = "MINERU_HEALTH_WORKER_TAG=1234.99/local-0/1/";
//   mineru_health::EndReport ended =
//       mineru_health::end_scope(scope, std::chrono::seconds(10));
//   // SIGTERM (and SIGCONT) to every member, up to 10 s for them to go,
//   // then SIGKILL to the rest; ended.survivors: what even that left.
//
// A living process is a member when any of these holds: it is the leader, or
// in the leader's process group, or in the session the leader started; it
// descends from the leader through parent links now; it is in the cgroup; an
// entry of its initial environment begins with the tag. The cgroup holds
// everything the kernel put there, whatever the process did; without one,
// the session and the tag are what a child that made its own group,
// double-forked or was reparented to init still carries. Without a cgroup, a
// process that started a session of its own AND was exec'ed with a cleared
// environment is not found (nothing links it to the worker any more). Zombies
// are never members: they hold nothing but a pid, and their parent reaps
// them. The calling process is never a member.
//
// Every signal goes to a process identified by pid AND start time, through a
// pidfd where the kernel has them (5.3+), so a pid reused meanwhile is never
// hit.
//
// Linux only (reads /proc and cgroupfs); elsewhere nothing is a member.
// Thread-safety: no state is kept; call from any thread. end_scope blocks for
// up to grace + about a second: never on an event loop.
#ifndef MINERU_HEALTH_PROCESS_SCOPE_H_
#define MINERU_HEALTH_PROCESS_SCOPE_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mineru_health {

// A process as the kernel knows it: its pid and its start time (clock ticks
// after boot), which together never name another process.
struct ProcessId {
  int pid = 0;
  std::uint64_t start_ticks = 0;

  friend bool operator==(const ProcessId& a, const ProcessId& b) {
    return a.pid == b.pid && a.start_ticks == b.start_ticks;
  }
  friend bool operator<(const ProcessId& a, const ProcessId& b) {
    return std::pair(a.pid, a.start_ticks) < std::pair(b.pid, b.start_ticks);
  }
};

// Where one worker's processes are. An empty field adds nothing.
struct ProcessScope {
  int leader = 0;      // the worker's pid, which is also its process group id
  std::string cgroup;  // its cgroup v2 directory
  std::string tag;     // "NAME=value" prefix of an initial environment entry
};

// What end_scope did. `terminated` and `killed` count distinct processes.
struct EndReport {
  int terminated = 0;  // sent SIGTERM
  int killed = 0;      // still there after the grace: sent SIGKILL
  int survivors = 0;   // still there after SIGKILL (a process stuck in the
                       // kernel, or one that is not ours to signal)
};

// `pid` now, or nullopt when it is gone or a zombie.
std::optional<ProcessId> process_id(int pid);

// The scope's living members now, in pid order.
std::vector<ProcessId> scope_members(const ProcessScope& scope);

// Every living process (but the caller) with an initial environment entry
// that begins with `prefix` ("MINERU_HEALTH_WORKER_TAG="), and the rest of
// that entry; in pid order. Processes whose environment cannot be read (other
// users') are skipped.
std::vector<std::pair<ProcessId, std::string>> tagged_processes(
    std::string_view prefix);

// Ends every member: SIGTERM and SIGCONT (a stopped process must run to act
// on SIGTERM) to each, repeated for members that appear meanwhile, until none
// is left or `grace` passes; then the cgroup's cgroup.kill and SIGKILL to each
// member, for up to a second more. Blocks; a scope with no member returns at
// once.
EndReport end_scope(const ProcessScope& scope, std::chrono::milliseconds grace);

// Ends every member at once, for a worker that has nothing left to drain (its
// engine is dead): the cgroup's cgroup.kill and SIGKILL to each member,
// repeated for members that appear meanwhile, until none is left (an exiting
// process still holding device memory counts until it is gone) or `wait`
// passes; `wait` bounds a process stuck in the kernel, it is not a delay.
// Nothing is sent SIGTERM (`terminated` is 0). Blocks.
EndReport kill_scope(const ProcessScope& scope, std::chrono::milliseconds wait);

}  // namespace mineru_health

#endif  // MINERU_HEALTH_PROCESS_SCOPE_H_
