// strata/train/durable_file.hpp - files that are either whole or absent, and their checksums.
//
// A crash (power loss, SIGKILL, a node taken away) can stop a write anywhere. So a file is
// written under "<path>.tmp", flushed and fsynced, renamed over <path> (atomic on POSIX), and
// the directory fsynced so the rename itself survives. A reader never sees half a file under
// the real name; what it may see is a stale .tmp left by a crash mid-write (a write that fails
// removes its own), which nothing reads.
#pragma once
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "strata/core/error.hpp"

namespace strata {

// CRC-32 (the zlib/PNG polynomial) of a byte range: it catches every single-bit flip and every
// burst up to 32 bits, which is what a checkpoint's checksum is for.
inline std::uint32_t crc32_of(std::span<const unsigned char> bytes) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  std::size_t at = 0;
  while (at < bytes.size()) {  // zlib takes uInt lengths
    const auto n = static_cast<uInt>(std::min<std::size_t>(bytes.size() - at, 1u << 30));
    crc = ::crc32(crc, bytes.data() + at, n);
    at += n;
  }
  return static_cast<std::uint32_t>(crc);
}

namespace detail {
inline void fsync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  STRATA_CHECK(fd >= 0, "cannot open directory '", dir.string(), "' to sync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  STRATA_CHECK(rc == 0, "cannot sync directory '", dir.string(), "': ", std::strerror(err));
}

// Writes all of `bytes` to fd, retrying short writes.
inline bool write_all(int fd, const unsigned char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}
}  // namespace detail

// Writes the first `keep` bytes to "<path>.tmp" and syncs them, without renaming: what a writer
// leaves behind when it dies mid-file (used by fault injection, train/fault.hpp).
inline void write_partial_file(const std::string& path, std::span<const unsigned char> bytes, std::size_t keep) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  detail::write_all(fd, bytes.data(), std::min(keep, bytes.size()));
  ::fsync(fd);
  ::close(fd);
}

// The whole of `bytes` under `path`, or (after a crash) the old file or none: tmp, fsync, rename,
// fsync the directory. A write that fails removes its tmp file: on a full disk that file holds
// the very space a restart would need. `room` is for fault injection (train/fault.hpp): past that
// many bytes the write fails with ENOSPC, as on a full disk.
inline void write_file_durably(const std::string& path, std::span<const unsigned char> bytes,
                               std::size_t room = SIZE_MAX) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  STRATA_CHECK(fd >= 0, "cannot create '", tmp, "': ", std::strerror(errno));
  bool written = detail::write_all(fd, bytes.data(), std::min(room, bytes.size()));
  int write_err = errno;
  if (written && room < bytes.size()) {
    written = false;
    write_err = ENOSPC;
  }
  const bool synced = written && ::fsync(fd) == 0;
  const int sync_err = errno;
  const bool closed = ::close(fd) == 0;  // some network filesystems report a failed write only here
  const int close_err = errno;
  const auto give_up = [&](const char* what, int err) {
    ::unlink(tmp.c_str());
    fail(what, " '", tmp, "' failed: ", std::strerror(err));
  };
  if (!written) give_up("writing", write_err);
  if (!synced) give_up("syncing", sync_err);
  if (!closed) give_up("closing", close_err);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail("cannot rename '", tmp, "' to '", path, "': ", std::strerror(err));
  }
  detail::fsync_directory(std::filesystem::path(path).parent_path());
}
inline void write_file_durably(const std::string& path, const std::string& text, std::size_t room = SIZE_MAX) {
  write_file_durably(
      path, std::span<const unsigned char>(reinterpret_cast<const unsigned char*>(text.data()), text.size()), room);
}

// A file opened for reading that is a regular file, and its size when opened. Anything else is
// refused by name: a FIFO would block the reader forever, /dev/zero would fill memory, a
// directory reads as nothing. The check is fstat on the opened descriptor (what was checked is
// what is read, even if the name is swapped meanwhile), and the open is non-blocking, which a
// FIFO without a writer would otherwise never return from. `what` names the file's role in
// messages ("token shard", ...; empty: none).
class regular_file {
 public:
  explicit regular_file(const std::string& path, const std::string& what = "")
      : path_(path), what_(what.empty() ? std::string() : what + " ") {
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    STRATA_CHECK(fd_ >= 0, "cannot open ", what_, "'", path, "': ", std::strerror(errno));
    struct stat st {};
    const int rc = ::fstat(fd_, &st);
    const int err = errno;
    const char* kind = rc != 0                ? nullptr
                       : S_ISREG(st.st_mode)  ? ""
                       : S_ISDIR(st.st_mode)  ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a plain file";
    if (kind == nullptr || *kind != 0 || st.st_size < 0) {
      ::close(fd_);
      STRATA_CHECK(kind != nullptr, "cannot stat ", what_, "'", path, "': ", std::strerror(err));
      fail(what_, "'", path, "' is not a readable file: it is ", kind, ", not a regular file");
    }
    size_ = static_cast<std::uint64_t>(st.st_size);
    // Ordinary blocking reads from here on (a regular file ignores the flag; some network
    // filesystems may not).
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  }
  regular_file(const regular_file&) = delete;
  regular_file& operator=(const regular_file&) = delete;
  ~regular_file() { ::close(fd_); }

  std::uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Exactly n bytes at `offset`; a short read (the file shrank since it was opened) is an error.
  void read_at(std::uint64_t offset, unsigned char* out, std::size_t n) const {
    std::size_t done = 0;
    while (done < n) {
      const std::size_t chunk = std::min<std::size_t>(n - done, std::size_t(1) << 30);
      const ssize_t got = ::pread(fd_, out + done, chunk, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      STRATA_CHECK(got >= 0, "reading ", what_, "'", path_, "' at byte ", offset + done,
                   " failed: ", std::strerror(errno));
      STRATA_CHECK(got > 0, "reading ", what_, "'", path_, "': it ends at byte ", offset + done, ", before the ",
                   offset + n, " it had when opened (was it cut short meanwhile?)");
      done += static_cast<std::size_t>(got);
    }
  }

 private:
  std::string path_, what_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// A whole regular file's bytes (its size known before anything is allocated); a missing,
// unreadable or special file is an error naming it.
inline std::vector<unsigned char> read_whole_file(const std::string& path) {
  const regular_file f(path);
  STRATA_CHECK(f.size() <= std::uint64_t(PTRDIFF_MAX), "'", path, "' has ", f.size(), " bytes, too many to read");
  std::vector<unsigned char> all(static_cast<std::size_t>(f.size()));
  f.read_at(0, all.data(), all.size());
  return all;
}

}  // namespace strata
