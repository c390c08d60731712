// /proc and cgroupfs reads, and signals that never reach a reused pid.
#include "procfs.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>

#include "unique_fd.h"

namespace mineru_health::internal {
namespace {

// Fields of /proc/<pid>/stat after the command name, counted from 0: the
// name may hold spaces and parentheses, the fields after its last ')' never.
constexpr std::size_t kState = 0, kPpid = 1, kPgrp = 2, kSession = 3,
                      kStartTime = 19;

template <typename T>
bool parse_number(std::string_view text, T& out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end;
}

std::vector<std::string_view> split_spaces(std::string_view text) {
  std::vector<std::string_view> fields;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\n')) ++i;
    const std::size_t start = i;
    while (i < text.size() && text[i] != ' ' && text[i] != '\n') ++i;
    if (i > start) fields.push_back(text.substr(start, i - start));
  }
  return fields;
}

}  // namespace

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return std::move(text).str();
}

std::string write_file(const std::string& path, const std::string& text) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) return fmt::format("{}: {}", path, std::strerror(errno));
  const ssize_t written = ::write(fd.get(), text.data(), text.size());
  if (written < 0) return fmt::format("{}: {}", path, std::strerror(errno));
  if (static_cast<std::size_t>(written) != text.size()) {
    return fmt::format("{}: short write", path);
  }
  return "";
}

std::optional<ProcStat> read_stat(int pid) {
  if (pid <= 0) return std::nullopt;
  const auto text = read_file(fmt::format("/proc/{}/stat", pid));
  if (!text) return std::nullopt;
  const std::size_t close = text->rfind(')');
  if (close == std::string::npos) return std::nullopt;
  const auto fields = split_spaces(std::string_view(*text).substr(close + 1));
  ProcStat stat;
  stat.pid = pid;
  if (fields.size() <= kStartTime || fields[kState].empty() ||
      !parse_number(fields[kPpid], stat.ppid) ||
      !parse_number(fields[kPgrp], stat.pgrp) ||
      !parse_number(fields[kSession], stat.session) ||
      !parse_number(fields[kStartTime], stat.start_ticks)) {
    return std::nullopt;
  }
  stat.state = fields[kState][0];
  return stat;
}

std::vector<ProcStat> living_processes(bool but_self) {
  std::vector<ProcStat> found;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return found;
  const int self = static_cast<int>(::getpid());
  while (const dirent* entry = ::readdir(proc)) {
    int pid = 0;
    if (!parse_number(std::string_view(entry->d_name), pid)) continue;
    if (but_self && pid == self) continue;
    const auto stat = read_stat(pid);
    if (stat && stat->state != 'Z') found.push_back(*stat);
  }
  ::closedir(proc);
  return found;
}

std::vector<int> cgroup_pids(const std::string& dir) {
  std::vector<int> pids;
  const auto text = read_file(dir + "/cgroup.procs");
  if (!text) return pids;
  for (std::string_view field : split_spaces(*text)) {
    int pid = 0;
    if (parse_number(field, pid) && pid > 0) pids.push_back(pid);
  }
  return pids;
}

bool signal_process(const ProcessId& process, int signal) {
  if (process.pid <= 1) return false;  // never init, never "every process"
  auto same = [&] {
    const auto now = read_stat(process.pid);
    return now && now->start_ticks == process.start_ticks;
  };
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_send_signal)
  // The pidfd holds on to the process it was opened for: once the start time
  // confirms it is ours, the signal cannot reach a process that reused the pid.
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, process.pid, 0)));
  if (pidfd.valid()) {
    return same() && ::syscall(SYS_pidfd_send_signal, pidfd.get(), signal,
                               nullptr, 0) == 0;
  }
  if (errno != ENOSYS) return false;  // gone (ESRCH), or not ours (EPERM)
#endif
  return same() && ::kill(process.pid, signal) == 0;
}

}  // namespace mineru_health::internal
