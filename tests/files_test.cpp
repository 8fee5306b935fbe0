// write_file_atomic, sync_directory and FileDescriptor (src/io/files.hpp): a write that fails anywhere
// leaves the old file as it was and no temporary file behind; links are written through; what rename
// would destroy is refused; new files get new_file_mode whatever the umask.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "src/error.hpp"
#include "src/io/files.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

namespace fs = std::filesystem;

class FilesTest : public testing::Test {
 protected:
  // The directory's entries, sorted: a temporary file left behind shows up here.
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const fs::directory_entry& e : fs::directory_iterator(dir_.path()))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  ScratchDir dir_;
};

TEST_F(FilesTest, WriteReplacesTheWholeFile) {
  const fs::path p = dir_ / "out.json";
  write_file_atomic(p, std::string(10000, 'x'));
  write_file_atomic(p, "short\n");
  EXPECT_EQ(read_file(p), "short\n");
  EXPECT_EQ(listing(), std::vector<std::string>{"out.json"});
}

// The writer fails halfway, after bytes reached the temporary file: the old file is untouched.
TEST_F(FilesTest, AFailedWriteLeavesTheOldFileAndNoTemporary) {
  const fs::path p = dir_ / "out.json";
  write_file_atomic(p, "old\n");
  std::string temporary;
  const std::string msg = message_of<Error>([&] {
    write_file_atomic(p, [&](int fd) {
      write_all(fd, "new, half", 9, p);
      temporary = fs::read_symlink("/proc/self/fd/" + std::to_string(fd)).filename().string();
      throw Error("disk on fire");
    });
  });
  EXPECT_EQ(msg, "disk on fire");
  // The temporary file did exist beside the target, under a hidden name; now it is gone.
  EXPECT_EQ(temporary.rfind(".out.json.tmp.", 0), 0u) << temporary;
  EXPECT_EQ(read_file(p), "old\n");
  EXPECT_EQ(listing(), std::vector<std::string>{"out.json"});
}

TEST_F(FilesTest, AFailedWriteToANewFileLeavesNothing) {
  EXPECT_THROW(write_file_atomic(dir_ / "new.json", [](int) { throw Error("no"); }), Error);
  EXPECT_TRUE(listing().empty());
}

// rename(2) refuses to put a file where a directory is; the temporary file goes again.
TEST_F(FilesTest, ADirectoryTargetFailsAtTheRenameAndLeavesNoTemporary) {
  fs::create_directory(dir_ / "d");
  const std::string msg = message_of<Error>([&] { write_file_atomic(dir_ / "d", "x"); });
  EXPECT_NE(msg.find((dir_ / "d").string() + ": cannot replace it"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::strerror(EISDIR)), std::string::npos) << msg;
  EXPECT_EQ(listing(), std::vector<std::string>{"d"});
  EXPECT_TRUE(fs::is_directory(dir_ / "d"));
}

TEST_F(FilesTest, AMissingDirectoryIsAnErrorNamingThePath) {
  const fs::path p = dir_ / "missing" / "out.json";
  const std::string msg = message_of<Error>([&] { write_file_atomic(p, "x"); });
  EXPECT_EQ(msg.rfind(p.string() + ": cannot create a file beside it", 0), 0u) << msg;
  EXPECT_NE(msg.find(std::strerror(ENOENT)), std::string::npos) << msg;
  EXPECT_TRUE(listing().empty());
}

TEST_F(FilesTest, AReadOnlyDirectoryLeavesTheOldFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  const fs::path p = dir_ / "out.json";
  write_file_atomic(p, "old\n");
  fs::permissions(dir_.path(), fs::perms::owner_write, fs::perm_options::remove);
  const std::string msg = message_of<Error>([&] { write_file_atomic(p, "new\n"); });
  fs::permissions(dir_.path(), fs::perms::owner_write, fs::perm_options::add);
  EXPECT_NE(msg.find(std::strerror(EACCES)), std::string::npos) << msg;
  EXPECT_EQ(read_file(p), "old\n");
  EXPECT_EQ(listing(), std::vector<std::string>{"out.json"});
}

// The link stays a link, and the file it names gets the contents (a dangling link's target is created).
TEST_F(FilesTest, ALinkIsWrittenThroughToItsTarget) {
  fs::create_directory(dir_ / "real");
  fs::create_symlink("real/target.json", dir_ / "link.json");
  write_file_atomic(dir_ / "link.json", "through\n");
  EXPECT_TRUE(fs::is_symlink(dir_ / "link.json"));
  EXPECT_EQ(read_file(dir_ / "real" / "target.json"), "through\n");
  EXPECT_EQ(fs::read_symlink(dir_ / "link.json"), "real/target.json");
  EXPECT_EQ(listing(), (std::vector<std::string>{"link.json", "real"}));
}

// rename would replace a FIFO (or a device) with a regular file: refused before anything is created.
TEST_F(FilesTest, AFifoIsRefusedAndKept) {
  ASSERT_EQ(::mkfifo((dir_ / "fifo").c_str(), 0600), 0) << std::strerror(errno);
  fs::create_symlink("fifo", dir_ / "link");
  for (const char* name : {"fifo", "link"}) {
    const std::string msg = message_of<UsageError>([&] { write_file_atomic(dir_ / name, "x"); });
    EXPECT_NE(msg.find("a FIFO, not a regular file"), std::string::npos) << msg;
  }
  EXPECT_TRUE(fs::is_fifo(dir_ / "fifo"));
  EXPECT_EQ(listing(), (std::vector<std::string>{"fifo", "link"}));
}

TEST_F(FilesTest, APathWithoutAFileNameIsRefused) {
  for (const fs::path& p : {dir_.path() / "", dir_.path() / ".", dir_.path() / ".."}) {
    const std::string msg = message_of<UsageError>([&] { write_file_atomic(p, "x"); });
    EXPECT_NE(msg.find("not a file name"), std::string::npos) << msg;
  }
  EXPECT_TRUE(listing().empty());
}

// 0644 before the umask: with no umask at all, still not writable by group or others.
TEST_F(FilesTest, NewFilesHaveTheProjectsMode) {
  const mode_t old_mask = ::umask(0);
  write_file_atomic(dir_ / "open.json", "x");
  ::umask(077);
  write_file_atomic(dir_ / "private.json", "x");
  ::umask(old_mask);
  struct stat st {};
  ASSERT_EQ(::stat((dir_ / "open.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, new_file_mode);
  ASSERT_EQ(::stat((dir_ / "private.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST_F(FilesTest, SyncDirectoryNamesTheDirectoryItCannotOpen) {
  sync_directory(dir_.path());
  const std::string msg = message_of<Error>([&] { sync_directory(dir_ / "missing"); });
  EXPECT_NE(msg.find("cannot open directory " + (dir_ / "missing").string()), std::string::npos) << msg;
  std::ofstream(dir_ / "file") << "x";
  EXPECT_THROW(sync_directory(dir_ / "file"), Error);  // O_DIRECTORY: not a directory
}

TEST(FileDescriptor, ClosesOnceWhenItGoesOutOfScopeOrIsMovedFrom) {
  int raw = -1;
  {
    FileDescriptor a(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    raw = a.get();
    ASSERT_GE(raw, 0);
    FileDescriptor b(std::move(a));
    EXPECT_FALSE(a.is_open());  // a moved-from descriptor owns nothing
    EXPECT_EQ(b.get(), raw);
    EXPECT_NE(::fcntl(raw, F_GETFD), -1);
  }
  EXPECT_EQ(::fcntl(raw, F_GETFD), -1);
  EXPECT_EQ(errno, EBADF);

  FileDescriptor c(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  EXPECT_EQ(c.close(), 0);
  EXPECT_FALSE(c.is_open());
}

}  // namespace
}  // namespace dpcheck
