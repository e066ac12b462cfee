#include "core/errors.hpp"

#include <cstdio>
#include <cstdlib>

namespace cocodiff {

ConfigError::ConfigError(std::string_view where, std::string_view key, std::string_view expected,
                         std::string_view found)
    : UserError(std::string(where) + ": key '" + std::string(key) + "': expected " +
                std::string(expected) + ", found " + std::string(found)) {}

RankError::RankError(int rank, const std::string& what, bool user_error)
    : Error("rank " + std::to_string(rank) + ": " + what), rank_(rank), user_error_(user_error) {}

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "%s:%d: CHECK failed: %s: %s\n", file, line, cond, msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace cocodiff
