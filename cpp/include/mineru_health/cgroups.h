// cgroup v2 directories for a router's local workers: where this process may
// make them, making one, moving a process into it, and removing a tree of
// them with every process inside ended.
//
//   mineru_health::CgroupHome home = mineru_health::find_cgroup_home();
//   if (home.error.empty()) {
//     std::string dir = home.path + "/mineru-health-router.1234.99";
//     if (make_cgroup(dir).empty() && make_cgroup(dir + "/local-0.1").empty())
//       std::string why = move_to_cgroup(dir + "/local-0.1", worker_pid);
//   }
//   remove_cgroup_tree(dir, std::chrono::seconds(2));  // kills, waits, rmdirs
//
// The home is this process's own cgroup on the cgroup2 mount (a hybrid
// system's /sys/fs/cgroup/unified included). Children may be made there when
// the directory and its cgroup.procs are writable by this process: a
// delegated subtree (systemd's Delegate=yes), root on a read-write mount; a
// container's read-only /sys/fs/cgroup is not. A child cgroup with no
// controllers enabled is allowed next to the router's own process (the
// no-internal-process rule binds only controllers).
//
// Expected failures are values: "" or why not, in words. Linux only.
// Thread-safety: no state is kept; call from any thread.
#ifndef MINERU_HEALTH_CGROUPS_H_
#define MINERU_HEALTH_CGROUPS_H_

#include <chrono>
#include <string>
#include <string_view>

namespace mineru_health {

struct CgroupHome {
  std::string path;   // the directory of this process's cgroup
  std::string error;  // "" when children can be made there; else why not
};

// The home from the text of /proc/self/mountinfo and /proc/self/cgroup, with
// no check of the file system: path "" and an error when there is no cgroup2
// mount or no v2 line ("0::/path"). Pure.
CgroupHome cgroup_home_from(std::string_view mountinfo,
                            std::string_view self_cgroup);

// This process's home, checked: cgroup_home_from() of its own files, and the
// directory and its cgroup.procs writable.
CgroupHome find_cgroup_home();

// Makes `dir` (an existing one is fine): "" or why not.
[[nodiscard]] std::string make_cgroup(const std::string& dir);

// Moves process `pid` (with all its threads) into `dir`: "" or why not.
[[nodiscard]] std::string move_to_cgroup(const std::string& dir, int pid);

struct CgroupRemoval {
  int killed = 0;     // processes that were inside and were sent SIGKILL
  std::string error;  // "" when every directory is gone; else why not
};

// Kills every process in `dir` and in the cgroups below it (cgroup.kill where
// the kernel has it, 5.14+; SIGKILL to each listed process otherwise), waits
// up to `wait` for them to leave, then removes the directories, deepest
// first. A `dir` that does not exist is removed already. Blocks.
CgroupRemoval remove_cgroup_tree(const std::string& dir,
                                 std::chrono::milliseconds wait);

}  // namespace mineru_health

#endif  // MINERU_HEALTH_CGROUPS_H_
