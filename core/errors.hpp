#pragma once
// Typed errors. Bad input from a user (config, checkpoint, command line) throws a UserError
// subclass; the CLI prints its message and exits 2. A broken invariant is COCO_CHECK: it prints
// file:line and aborts, in every build type.
//
//   if (heads % degree != 0)
//     throw ConfigError(cfg.file(), "run.degree", "a divisor of 24 heads", std::to_string(degree));

#include <stdexcept>
#include <string>
#include <string_view>

namespace cocodiff {

/// Base of every error the project throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad input from the user: the command line exits 2 with what().
class UserError : public Error {
 public:
  using Error::Error;
};

/// A config value that is missing, of the wrong type, out of range or inconsistent.
class ConfigError : public UserError {
 public:
  /// `where` is "file" or "file:line"; key is the dotted key.
  ConfigError(std::string_view where, std::string_view key, std::string_view expected,
              std::string_view found);
  /// Free-form message, for errors that involve several keys.
  explicit ConfigError(const std::string& message) : UserError(message) {}
};

/// A file that cannot be read, or whose contents are malformed (checkpoints, inputs).
class InputError : public UserError {
 public:
  using UserError::UserError;
};

/// A run whose virtual time leaves the representable horizon (2^63 ns): some quantity (a
/// bandwidth, a peak, a latency) is far outside the plausible range. The message names it.
class TimeOverflowError : public UserError {
 public:
  using UserError::UserError;
};

/// A run that would need more of a machine resource (memory) than it may use, or an allocation
/// that failed; the message names what was being built.
class ResourceError : public UserError {
 public:
  using UserError::UserError;
};

/// A real-math run whose values stopped being finite (NaN or infinity): weights or inputs that
/// overflow float32. The message names the first layer whose output was not finite.
class NumericError : public UserError {
 public:
  using UserError::UserError;
};

/// Ranks that disagree: mismatched collectives, wrong sizes, deadlocks. Message names ranks.
class CommError : public UserError {
 public:
  using UserError::UserError;
};

/// An exception raised inside one rank, carried out of the run with the rank that threw.
class RankError : public Error {
 public:
  RankError(int rank, const std::string& what, bool user_error);
  int rank() const { return rank_; }
  /// True when the original exception was a UserError (the CLI then exits 2).
  bool user_error() const { return user_error_; }

 private:
  int rank_;
  bool user_error_;
};

[[noreturn]] void check_failed(const char* file, int line, const char* cond,
                               const std::string& msg);

}  // namespace cocodiff

/// Always-on invariant check: aborts with file:line and the message on failure.
#define COCO_CHECK(cond, msg)                                              \
  do {                                                                     \
    if (!(cond)) ::cocodiff::check_failed(__FILE__, __LINE__, #cond, msg); \
  } while (0)
