// Move-only owners of libcurl handles (private to the core library).
//
//   MultiHandle multi(curl_multi_init());
//   EasyHandle easy(curl_easy_init());
//   MultiAttachment attached(multi.get(), easy.get());  //
//   curl_multi_add_handle
//
// Teardown follows curl's documented order: every easy handle is removed
// from its multi handle (MultiAttachment's destructor) before it is cleaned
// up, and the multi handle is cleaned up last. Owners get that order by
// declaring the MultiHandle (inside TransferDriver) before the transfers
// that use it and, inside a transfer, the EasyHandle before its
// MultiAttachment. Not thread-safe: a handle belongs to one thread at a time.
#ifndef MINERU_HEALTH_SRC_CURL_HANDLES_H_
#define MINERU_HEALTH_SRC_CURL_HANDLES_H_

#include <curl/curl.h>

#include <memory>
#include <utility>

namespace mineru_health::internal {

// curl_global_init must run before any other curl call and, on old curl
// versions, not concurrently with other threads; this runs it exactly once.
void ensure_curl_global_init();

struct EasyCleanup {
  void operator()(CURL* handle) const noexcept { curl_easy_cleanup(handle); }
};
using EasyHandle = std::unique_ptr<CURL, EasyCleanup>;

struct MultiCleanup {
  void operator()(CURLM* handle) const noexcept { curl_multi_cleanup(handle); }
};
using MultiHandle = std::unique_ptr<CURLM, MultiCleanup>;

struct SlistCleanup {
  void operator()(curl_slist* list) const noexcept {
    curl_slist_free_all(list);
  }
};
using Slist = std::unique_ptr<curl_slist, SlistCleanup>;

// An easy handle added to a multi handle; removed again on destruction.
class MultiAttachment {
 public:
  MultiAttachment() = default;
  // Check ok(): curl_multi_add_handle can fail (e.g. out of memory).
  MultiAttachment(CURLM* multi, CURL* easy)
      : code_(curl_multi_add_handle(multi, easy)) {
    if (code_ == CURLM_OK) {
      multi_ = multi;
      easy_ = easy;
    }
  }
  ~MultiAttachment() { reset(); }
  MultiAttachment(const MultiAttachment&) = delete;
  MultiAttachment& operator=(const MultiAttachment&) = delete;
  MultiAttachment(MultiAttachment&& other) noexcept
      : multi_(std::exchange(other.multi_, nullptr)),
        easy_(std::exchange(other.easy_, nullptr)),
        code_(other.code_) {}
  MultiAttachment& operator=(MultiAttachment&& other) noexcept {
    if (this != &other) {
      reset();
      multi_ = std::exchange(other.multi_, nullptr);
      easy_ = std::exchange(other.easy_, nullptr);
      code_ = other.code_;
    }
    return *this;
  }

  bool ok() const { return multi_ != nullptr; }
  // What curl_multi_add_handle returned.
  CURLMcode code() const { return code_; }
  // Removing a handle only fails for handles curl does not know, which
  // the ownership here rules out; there is nothing to do about it anyway.
  void reset() noexcept {
    if (multi_ != nullptr) curl_multi_remove_handle(multi_, easy_);
    multi_ = nullptr;
    easy_ = nullptr;
  }

 private:
  CURLM* multi_ = nullptr;
  CURL* easy_ = nullptr;
  CURLMcode code_ = CURLM_OK;
};

}  // namespace mineru_health::internal

#endif  // MINERU_HEALTH_SRC_CURL_HANDLES_H_
