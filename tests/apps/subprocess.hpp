#pragma once
// Runs the built `cocodiff` binary as a child process for end-to-end CLI tests: stdout and stderr
// go to files (no pipe can fill up and block the child), the exit status is decoded.
//
//   Child c = Child::start({"validate", "good.toml"}, dir);
//   ChildResult r = c.wait();           // r.exit_code == 0, r.err == ""

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace cocodiff::test {

struct ChildResult {
  int exit_code = -1;    // when the child exited
  int term_signal = 0;   // when a signal killed it
  std::string out, err;  // everything it printed
};

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

class Child {
 public:
  /// Starts COCODIFF_BIN with `args`; its stdout/stderr go to files in `dir`. A nonzero
  /// `file_size_limit` (bytes) caps every file the child writes (RLIMIT_FSIZE, SIGXFSZ ignored):
  /// a write past it fails with EFBIG, as on a full disk.
  static Child start(const std::vector<std::string>& args, const std::filesystem::path& dir,
                     std::uint64_t file_size_limit = 0) {
    Child c;
    std::filesystem::create_directories(dir);
    c.out_ = dir / "child.stdout";
    c.err_ = dir / "child.stderr";
    std::vector<std::string> argv_s{COCODIFF_BIN};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    const int out_fd = ::open(c.out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int err_fd = ::open(c.err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out_fd < 0 || err_fd < 0) throw std::runtime_error("cannot create " + c.out_.string());
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {  // only async-signal-safe calls until exec
      if (::dup2(out_fd, 1) < 0 || ::dup2(err_fd, 2) < 0) ::_exit(126);
      if (file_size_limit > 0) {
        ::signal(SIGXFSZ, SIG_IGN);
        const struct rlimit lim = {file_size_limit, file_size_limit};
        if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(126);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(out_fd);
    ::close(err_fd);
    c.pid_ = pid;
    return c;
  }

  pid_t pid() const { return pid_; }
  /// What the child printed on stdout so far.
  std::string out_so_far() const { return read_text(out_); }
  void signal(int sig) const { ::kill(pid_, sig); }

  /// Waits at most `timeout` times the build's COCODIFF_TEST_TIME_SCALE (then kills the child
  /// and reports SIGKILL).
  ChildResult wait(std::chrono::seconds timeout = std::chrono::seconds(120)) {
    ChildResult r;
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + timeout * kTimeScale;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.term_signal = WTERMSIG(status);
    r.out = read_text(out_);
    r.err = read_text(err_);
    return r;
  }

 private:
#ifdef COCODIFF_TEST_TIME_SCALE
  static constexpr int kTimeScale = COCODIFF_TEST_TIME_SCALE;
#else
  static constexpr int kTimeScale = 1;
#endif
  pid_t pid_ = -1;
  std::filesystem::path out_, err_;
};

/// Runs `cocodiff args...` to completion.
inline ChildResult run_cocodiff(const std::vector<std::string>& args,
                                const std::filesystem::path& dir,
                                std::uint64_t file_size_limit = 0) {
  return Child::start(args, dir, file_size_limit).wait();
}

}  // namespace cocodiff::test
