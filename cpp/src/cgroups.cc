// cgroup v2: finding this process's cgroup from /proc/self, making and
// removing the router's directories below it.
#include "mineru_health/cgroups.h"

#include <dirent.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "procfs.h"

namespace mineru_health {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kPoll{20};

std::vector<std::string_view> fields_of(std::string_view line) {
  std::vector<std::string_view> fields;
  std::size_t start = 0;
  while (start <= line.size()) {
    const std::size_t end = std::min(line.find(' ', start), line.size());
    fields.push_back(line.substr(start, end - start));
    start = end + 1;
  }
  return fields;
}

// mountinfo writes space, tab, newline and backslash in paths as \ooo.
std::string unescape(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const bool octal = text[i] == '\\' && i + 3 < text.size() &&
                       text.substr(i + 1, 3).find_first_not_of("01234567") ==
                           std::string_view::npos;
    if (!octal) {
      out.push_back(text[i]);
      continue;
    }
    out.push_back(static_cast<char>((text[i + 1] - '0') * 64 +
                                    (text[i + 2] - '0') * 8 +
                                    (text[i + 3] - '0')));
    i += 3;
  }
  return out;
}

template <typename Each>
void for_each_line(std::string_view text, Each each) {
  while (!text.empty()) {
    const std::size_t end = std::min(text.find('\n'), text.size());
    each(text.substr(0, end));
    text.remove_prefix(std::min(end + 1, text.size()));
  }
}

bool exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

// `dir` and every cgroup below it, deepest first.
void collect_tree(const std::string& dir, std::vector<std::string>& out) {
  if (DIR* handle = ::opendir(dir.c_str())) {
    std::vector<std::string> children;
    while (const dirent* entry = ::readdir(handle)) {
      const std::string_view name(entry->d_name);
      if (entry->d_type != DT_DIR || name == "." || name == "..") continue;
      children.push_back(dir + "/" + std::string(name));
    }
    ::closedir(handle);
    for (const std::string& child : children) collect_tree(child, out);
  }
  out.push_back(dir);
}

}  // namespace

CgroupHome cgroup_home_from(std::string_view mountinfo,
                            std::string_view self_cgroup) {
  std::string path;
  bool has_v2_line = false;
  for_each_line(self_cgroup, [&](std::string_view line) {
    if (!has_v2_line && line.substr(0, 3) == "0::") {
      has_v2_line = true;
      path = std::string(line.substr(3));
    }
  });
  if (!has_v2_line) {
    return {"",
            "this process is in no cgroup v2 hierarchy (/proc/self/cgroup "
            "has no 0:: line)"};
  }
  std::string root, mount_point;
  for_each_line(mountinfo, [&](std::string_view line) {
    if (!mount_point.empty()) return;
    const auto fields = fields_of(line);
    for (std::size_t i = 6; i + 1 < fields.size(); ++i) {
      if (fields[i] == "-") {
        if (fields[i + 1] == "cgroup2") {
          root = unescape(fields[3]);
          mount_point = unescape(fields[4]);
        }
        return;
      }
    }
  });
  if (mount_point.empty()) return {"", "no cgroup2 file system is mounted"};
  if (root != "/") {
    const bool inside =
        path.compare(0, root.size(), root) == 0 &&
        (path.size() == root.size() || path[root.size()] == '/');
    if (!inside) {
      return {"", fmt::format("this process's cgroup {} is outside the cgroup2 "
                              "mount of {} at {}",
                              path, root, mount_point)};
    }
    path.erase(0, root.size());
  }
  if (path == "/" || path.empty()) return {mount_point, ""};
  return {mount_point + (path.front() == '/' ? "" : "/") + path, ""};
}

CgroupHome find_cgroup_home() {
  const auto mountinfo = internal::read_file("/proc/self/mountinfo");
  const auto self_cgroup = internal::read_file("/proc/self/cgroup");
  if (!mountinfo || !self_cgroup) {
    return {"", "cannot read /proc/self/mountinfo and /proc/self/cgroup"};
  }
  CgroupHome home = cgroup_home_from(*mountinfo, *self_cgroup);
  if (!home.error.empty()) return home;
  const std::string procs = home.path + "/cgroup.procs";
  if (::access(home.path.c_str(), W_OK) != 0 ||
      ::access(procs.c_str(), W_OK) != 0) {
    home.error = fmt::format(
        "{} is not writable by this process ({}): a read-only mount, or a "
        "cgroup not delegated to it",
        home.path, std::strerror(errno));
  }
  return home;
}

std::string make_cgroup(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST) return "";
  return fmt::format("mkdir {}: {}", dir, std::strerror(errno));
}

std::string move_to_cgroup(const std::string& dir, int pid) {
  return internal::write_file(dir + "/cgroup.procs", std::to_string(pid));
}

CgroupRemoval remove_cgroup_tree(const std::string& dir,
                                 std::chrono::milliseconds wait) {
  CgroupRemoval removal;
  if (!exists(dir)) return removal;
  std::vector<std::string> tree;
  collect_tree(dir, tree);
  const bool kill_file = exists(dir + "/cgroup.kill");
  std::set<ProcessId> killed;
  const Clock::time_point deadline = Clock::now() + wait;
  for (;;) {
    std::vector<ProcessId> inside;
    for (const std::string& node : tree) {
      for (int pid : internal::cgroup_pids(node)) {
        if (auto id = process_id(pid)) inside.push_back(*id);
      }
    }
    if (inside.empty() || Clock::now() >= deadline) break;
    if (kill_file) (void)internal::write_file(dir + "/cgroup.kill", "1");
    for (const ProcessId& process : inside) {
      killed.insert(process);
      if (!kill_file) (void)internal::signal_process(process, SIGKILL);
    }
    std::this_thread::sleep_for(kPoll);
  }
  removal.killed = static_cast<int>(killed.size());
  for (const std::string& node : tree) {  // deepest first
    if (::rmdir(node.c_str()) != 0 && errno != ENOENT &&
        removal.error.empty()) {
      removal.error = fmt::format("rmdir {}: {}", node, std::strerror(errno));
    }
  }
  return removal;
}

}  // namespace mineru_health
