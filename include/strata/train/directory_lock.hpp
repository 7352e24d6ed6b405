// strata/train/directory_lock.hpp - one process at a time in a checkpoint directory.
//
// An exclusive flock(2) on DIR/run.lock, held while the lock object lives. The kernel drops it
// when the holder exits however it exits (SIGKILL, a lost node's processes reaped), so a crash
// never leaves the directory locked, and nothing has to guess whether a lock is stale. The file
// itself stays. Its holder writes its host and process id into it just after locking and
// empties it when done, and a process that finds the directory locked reads them to say who
// holds it. (On Linux, flock on NFS is a whole-file POSIX lock on the server, so it holds across
// machines too.)
//
// flock refuses a second open description even within one process, so the locks a process holds
// are kept in a table: two checkpointers of one program in one directory share the lock.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "strata/core/error.hpp"

namespace strata {

class directory_lock {
 public:
  static constexpr const char* file_name = "run.lock";

  // This host's name, as the lock file and file names carry it (anything but [A-Za-z0-9.-] as '_').
  static std::string host_name() {
    char name[256] = {};
    if (::gethostname(name, sizeof name - 1) != 0) return "unknown-host";
    std::string h(name);
    for (char& c : h)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-')) c = '_';
    return h.empty() ? "unknown-host" : h;
  }

  // The lock on `dir` (which must exist) for this process, or null when another process holds
  // it; then `holder` says who ("process 4242 on host node7"). A file that cannot be opened is an
  // error naming it.
  static std::shared_ptr<directory_lock> take(const std::string& dir, std::string& holder) {
    const std::string path = (std::filesystem::path(dir) / file_name).string();
    std::lock_guard<std::mutex> guard(table_mutex());
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    STRATA_CHECK(fd >= 0, "cannot open the lock file '", path, "': ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      fail("the lock file '", path, "' is not a regular file");
    }
    const key k{st.st_dev, st.st_ino};
    if (const auto it = table().find(k); it != table().end())
      if (auto mine = it->second.lock()) {
        ::close(fd);
        return mine;
      }
    // Tried again after reading who holds it: a holder that let go meanwhile is no reason to refuse.
    for (int attempt = 0;; ++attempt) {
      int rc = 0;
      do rc = ::flock(fd, LOCK_EX | LOCK_NB);
      while (rc != 0 && errno == EINTR);
      if (rc == 0) break;
      const int err = errno;
      if (err != EWOULDBLOCK) {
        ::close(fd);
        fail("cannot lock '", path, "': ", std::strerror(err));
      }
      if (attempt == 1) {
        ::close(fd);
        return nullptr;
      }
      holder = read_holder(fd);
    }
    // Who holds it, for the message another process gets. Not fsynced: the lock lives in the
    // kernel, and the words only need to outlive this process's run. Failing to write them (a
    // full disk) leaves the lock held all the same.
    const std::string me = "host " + host_name() + "\npid " + std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd, 0) == 0) { [[maybe_unused]] const ssize_t w = ::pwrite(fd, me.data(), me.size(), 0); }
    auto lock = std::shared_ptr<directory_lock>(new directory_lock(fd, k, path));
    table()[k] = lock;
    return lock;
  }

  directory_lock(const directory_lock&) = delete;
  directory_lock& operator=(const directory_lock&) = delete;
  ~directory_lock() {
    std::lock_guard<std::mutex> guard(table_mutex());
    table().erase(key_);
    // Emptied first: words left by a holder that is gone would name the wrong process to the
    // next one refused. (A crash leaves them; read_holder() sees through that.)
    [[maybe_unused]] const int rc = ::ftruncate(fd_, 0);
    ::close(fd_);  // releases the lock
  }

  const std::string& path() const { return path_; }

 private:
  using key = std::pair<dev_t, ino_t>;
  directory_lock(int fd, key k, std::string path) : fd_(fd), key_(k), path_(std::move(path)) {}

  static std::map<key, std::weak_ptr<directory_lock>>& table() {
    static std::map<key, std::weak_ptr<directory_lock>> held;
    return held;
  }
  static std::mutex& table_mutex() {
    static std::mutex m;
    return m;
  }

  // "process P on host H" from the holder's lock file. The holder writes it just after locking,
  // so until then the file is empty, or names a holder that crashed; on this host, a process that
  // no longer exists is one. Either is read again, for up to a second.
  static std::string read_holder(int fd) {
    std::string pid, host;
    const std::string here = host_name();
    for (int attempt = 0; attempt < 50; ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      char buf[512];
      const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
      const std::string text(buf, n > 0 ? std::size_t(n) : 0);
      pid = field(text, "pid");
      host = field(text, "host");
      if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos || pid.size() > 9) continue;
      if (host != here || ::kill(static_cast<pid_t>(std::stol(pid)), 0) == 0 || errno == EPERM) break;
    }
    if (pid.empty()) return "a process that has not written its host and id into the lock file";
    return "process " + pid + " on host " + (host.empty() ? "?" : host);
  }
  // The value of the line "NAME value" in the lock file's text, anything odd in it shown as '?'.
  static std::string field(const std::string& text, const std::string& name) {
    const std::string line = name + " ";
    std::size_t at = 0;
    while (at < text.size() && text.compare(at, line.size(), line) != 0) {
      at = text.find('\n', at);
      at = at == std::string::npos ? text.size() : at + 1;
    }
    const auto begin = at + line.size();
    if (begin > text.size()) return {};
    const auto end = text.find('\n', begin);
    if (end == std::string::npos) return {};  // not written whole yet
    std::string v = text.substr(begin, std::min<std::size_t>(end - begin, 64));
    for (char& c : v)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) c = '?';
    return v;
  }

  int fd_ = -1;
  key key_{};
  std::string path_;
};

}  // namespace strata
