#include "util/mmap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace sy {

Result<MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int error = errno;
    return Status::error(error == ENOENT ? ErrorCode::kNotFound : ErrorCode::kInvalidArgument,
                         fmt::format("{}: cannot open: {}", path, std::strerror(error)));
  }
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    int error = errno;
    ::close(fd);
    return Status::errorf("{}: cannot stat: {}", path, std::strerror(error));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return Status::errorf("{}: not a regular file", path);
  }
  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<size_t>(info.st_size);
  if (file.size_ > 0) {
    void* address = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (address == MAP_FAILED) {
      int error = errno;
      ::close(fd);
      return Status::errorf("{}: cannot mmap {} bytes: {}", path, file.size_, std::strerror(error));
    }
    file.data_ = static_cast<const uint8_t*>(address);
  }
  ::close(fd);  // the mapping keeps the file alive
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(other.data_), size_(other.size_), path_(std::move(other.path_)) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    size_ = other.size_;
    path_ = std::move(other.path_);
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() { release(); }

void MappedFile::release() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace sy
