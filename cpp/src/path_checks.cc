// The file-system checks of path variables: stat, open and access, each
// failure a ConfigError naming the variable.
#include "path_checks.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "mineru_health/config.h"

namespace mineru_health::internal {
namespace {

[[noreturn]] void refuse(const std::string& variable,
                         const std::string& message) {
  throw ConfigError(variable, message);
}

std::string errno_text(int error) {
  return std::error_code(error, std::generic_category()).message();
}

void check_readable_file(const std::string& name, const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    refuse(name, fmt::format("{}={} cannot be read: {}", name, path,
                             errno_text(errno)));
  }
  // A directory, FIFO or device would fail later, hang start-up, or be read
  // without end (/dev/zero).
  if (!S_ISREG(info.st_mode)) {
    refuse(name, fmt::format("{}={} is not a regular file", name, path));
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    refuse(name, fmt::format("{}={} cannot be read: {}", name, path,
                             errno_text(errno)));
  }
  ::close(fd);
}

void check_writable_file(const std::string& name, const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0) {
    // A FIFO without a reader would block the first write, and so start-up.
    if (!S_ISREG(info.st_mode) && !S_ISCHR(info.st_mode)) {
      refuse(name, fmt::format("{}={} is not a regular file (leave it empty "
                               "for stderr)",
                               name, path));
    }
    if (::access(path.c_str(), W_OK) != 0) {
      refuse(name, fmt::format("{}={} is not writable: {}", name, path,
                               errno_text(errno)));
    }
    return;
  }
  if (errno != ENOENT) {
    refuse(name, fmt::format("{}={} cannot be used: {}", name, path,
                             errno_text(errno)));
  }
  const std::size_t slash = path.find_last_of('/');
  const std::string parent = slash == std::string::npos ? "."
                             : slash == 0               ? "/"
                                                        : path.substr(0, slash);
  if (::stat(parent.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    refuse(name, fmt::format("{}={} cannot be created: directory {} does not "
                             "exist",
                             name, path, parent));
  }
  if (::access(parent.c_str(), W_OK | X_OK) != 0) {
    refuse(name, fmt::format("{}={} cannot be created in {}: {}", name, path,
                             parent, errno_text(errno)));
  }
}

}  // namespace

void check_path(PathCheck check, const std::string& variable,
                const std::string& path) {
  if (path.empty()) return;
  switch (check) {
    case PathCheck::kNone:
      return;
    case PathCheck::kReadableFile:
      check_readable_file(variable, path);
      return;
    case PathCheck::kWritableFile:
      check_writable_file(variable, path);
      return;
  }
}

}  // namespace mineru_health::internal
