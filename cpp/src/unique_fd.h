// UniqueFd, a file descriptor closed on destruction, and the eventfd that
// the poller and the event queue wake their readers with (private to the
// core library).
//
//   UniqueFd wake = make_eventfd();  // throws std::runtime_error
//   write(wake.get(), &one, sizeof one);
#ifndef MINERU_HEALTH_SRC_UNIQUE_FD_H_
#define MINERU_HEALTH_SRC_UNIQUE_FD_H_

#include <fmt/format.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace mineru_health::internal {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  // close() errors are not actionable for the descriptors held here (epoll
  // sets, eventfds): the descriptor is released either way.
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Nonblocking, so that neither a writer nor a reader ever waits on it.
inline UniqueFd make_eventfd() {
  UniqueFd fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!fd.valid()) {
    throw std::runtime_error(fmt::format("eventfd: {}", std::strerror(errno)));
  }
  return fd;
}

}  // namespace mineru_health::internal

#endif  // MINERU_HEALTH_SRC_UNIQUE_FD_H_
