// Reading /proc and cgroupfs, and signalling a process by pid and start time
// (private to the core library; process_scope.cc and cgroups.cc share it).
//
//   for (const ProcStat& p : living_processes()) ...
//   signal_process({pid, start_ticks}, SIGTERM);   // never a reused pid
#ifndef MINERU_HEALTH_SRC_PROCFS_H_
#define MINERU_HEALTH_SRC_PROCFS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mineru_health/process_scope.h"

namespace mineru_health::internal {

// The whole file, or nullopt when it cannot be read.
std::optional<std::string> read_file(const std::string& path);

// Writes `text` to an existing file (a cgroupfs control file): "" or why not.
std::string write_file(const std::string& path, const std::string& text);

// The fields of /proc/<pid>/stat this library reads.
struct ProcStat {
  int pid = 0;
  int ppid = 0;
  int pgrp = 0;
  int session = 0;
  char state = '?';  // 'Z': a zombie
  std::uint64_t start_ticks = 0;

  ProcessId id() const { return {pid, start_ticks}; }
};

// /proc/<pid>/stat parsed, or nullopt when the process is gone.
std::optional<ProcStat> read_stat(int pid);

// Every process now but zombies (and the caller when `but_self`).
std::vector<ProcStat> living_processes(bool but_self = true);

// The pids listed in `dir`/cgroup.procs (none when it cannot be read).
std::vector<int> cgroup_pids(const std::string& dir);

// Sends `signal` to `process` if it still is that process (pid and start
// time), through a pidfd where the kernel has them: true if it was sent.
bool signal_process(const ProcessId& process, int signal);

}  // namespace mineru_health::internal

#endif  // MINERU_HEALTH_SRC_PROCFS_H_
