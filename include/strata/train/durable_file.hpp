// strata/train/durable_file.hpp - files that are either whole or absent, and their checksums.
//
// A crash (power loss, SIGKILL, a node taken away) can stop a write anywhere. So a file is
// written under "<path>.tmp", flushed and fsynced, renamed over <path> (atomic on POSIX), and
// the directory fsynced so the rename itself survives. A reader never sees half a file under
// the real name; what it may see is a stale .tmp, which nothing reads.
#pragma once
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

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
// fsync the directory.
inline void write_file_durably(const std::string& path, std::span<const unsigned char> bytes) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  STRATA_CHECK(fd >= 0, "cannot create '", tmp, "': ", std::strerror(errno));
  const bool written = detail::write_all(fd, bytes.data(), bytes.size());
  const int write_err = errno;
  const bool synced = written && ::fsync(fd) == 0;
  const int sync_err = errno;
  ::close(fd);
  STRATA_CHECK(written, "writing '", tmp, "' failed: ", std::strerror(write_err));
  STRATA_CHECK(synced, "syncing '", tmp, "' failed: ", std::strerror(sync_err));
  STRATA_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '", tmp, "' to '", path,
               "': ", std::strerror(errno));
  detail::fsync_directory(std::filesystem::path(path).parent_path());
}
inline void write_file_durably(const std::string& path, const std::string& text) {
  write_file_durably(path, std::span<const unsigned char>(reinterpret_cast<const unsigned char*>(text.data()), text.size()));
}

// A whole file's bytes; a missing or unreadable file is an error naming it.
inline std::vector<unsigned char> read_whole_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  STRATA_CHECK(f != nullptr, "cannot open '", path, "': ", std::strerror(errno));
  std::vector<unsigned char> all;
  unsigned char buf[1 << 16];
  for (std::size_t got; (got = std::fread(buf, 1, sizeof buf, f)) > 0;) all.insert(all.end(), buf, buf + got);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  STRATA_CHECK(!failed, "reading '", path, "' failed");
  return all;
}

}  // namespace strata
