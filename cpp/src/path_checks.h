// The file-system checks of path variables (CA_FILE, AUDIT_PATH, RULES),
// kept apart from config.cc's pure value checks so that validate() never
// touches the disk (private to the core library).
//
//   check_path(PathCheck::kReadableFile, "MINERU_HEALTH_RULES", path);
#ifndef MINERU_HEALTH_SRC_PATH_CHECKS_H_
#define MINERU_HEALTH_SRC_PATH_CHECKS_H_

#include <string>

namespace mineru_health::internal {

enum class PathCheck { kNone, kReadableFile, kWritableFile };

// Throws ConfigError naming `variable` when `path` fails `check`: not a
// readable regular file, or not a file that can be created and appended to.
// A no-op for "" and for PathCheck::kNone.
void check_path(PathCheck check, const std::string& variable,
                const std::string& path);

}  // namespace mineru_health::internal

#endif  // MINERU_HEALTH_SRC_PATH_CHECKS_H_
