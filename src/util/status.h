// Errors as values: Status for operations without a result, Result<T> for ones with one.
// Every path user input can reach returns these; messages name the offending thing.
#pragma once

#include <fmt/format.h>

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace sy {

// What kind of failure: lets the server pick an HTTP status without parsing messages.
enum class ErrorCode {
  kOk,
  kInvalidArgument,    // bad user input (400)
  kNotFound,           // 404
  kResourceExhausted,  // queue full (429)
  kUnavailable,        // loading / draining (503)
  kUnsupported,        // valid but not implemented here (400 "not supported")
  kInternal,           // our bug or a failed invariant such as an unwritten route (500)
};

class Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(std::string message) {
    return Status(ErrorCode::kInvalidArgument, std::move(message));
  }
  static Status error(ErrorCode code, std::string message) {
    return Status(code, std::move(message));
  }
  template <typename... Args>
  static Status errorf(fmt::format_string<Args...> format, Args&&... args) {
    return error(fmt::format(format, std::forward<Args>(args)...));
  }

  bool is_ok() const { return code_ == ErrorCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // Prefixes context ("model/config.json: ") to an error; no-op on success.
  Status with_context(const std::string& context) const {
    return is_ok() ? *this : Status(code_, context + message_);
  }

 private:
  Status(ErrorCode code, std::string message) : message_(std::move(message)), code_(code) {}
  std::string message_;
  ErrorCode code_ = ErrorCode::kOk;
};

template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) { assert(!status_.is_ok()); }  // NOLINT

  bool is_ok() const { return value_.has_value(); }
  explicit operator bool() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  const std::string& message() const { return status_.message(); }

  T& value() & { assert(value_); return *value_; }
  const T& value() const& { assert(value_); return *value_; }
  T&& value() && { assert(value_); return std::move(*value_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace sy

// Early-return helpers: SY_TRY(status_expr); SY_ASSIGN(auto x, result_expr);
#define SY_CONCAT_INNER(a, b) a##b
#define SY_CONCAT(a, b) SY_CONCAT_INNER(a, b)
#define SY_TRY(expr)                         \
  do {                                       \
    ::sy::Status sy_status_ = (expr);        \
    if (!sy_status_.is_ok()) return sy_status_; \
  } while (0)
#define SY_ASSIGN_IMPL(tmp, decl, expr) \
  auto tmp = (expr);                    \
  if (!tmp.is_ok()) return tmp.status(); \
  decl = std::move(tmp).value()
#define SY_ASSIGN(decl, expr) SY_ASSIGN_IMPL(SY_CONCAT(sy_result_, __COUNTER__), decl, expr)
