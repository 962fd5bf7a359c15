// Reading a file whose size is checked first: its size from the file
// system without opening it (so a FIFO is never waited on), then exactly
// that many bytes, so that no file is read, nor memory taken for it, before
// its reader knows it is the size it expects. For every file that is input
// (checkpoints, the coordinator's state, configs).
//
// Thread safety: free functions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace gridsync {

// What a file of this st_mode is, for a refusal that names it: "a folder",
// "a FIFO", "a character device", "a block device", "a socket", "a regular
// file" or "no regular file".
const char* FileKindName(unsigned int st_mode);

// The size of regular file `path`, taken without reading it: NotFound when
// it does not exist, IOError naming it when it is no regular file or cannot
// be looked at.
Result<uint64_t> FileSize(const std::string& path);

// Exactly `size` bytes of `path`: the size FileSize returned and the caller
// checked, so that no file is read, nor memory taken for it, before it is
// known to be the size its reader expects. IOError naming the file when it
// holds fewer or more bytes by then (it changed meanwhile; never a silently
// short string), cannot be read, or `size` bytes do not fit in memory.
Result<std::string> ReadFileOfSize(const std::string& path, uint64_t size);
// The same bytes with the same checks, handed to `piece` in order a few MiB
// at a time: for a reader that only hashes them (a checkpoint's intact
// check), whose memory then stays a few MiB whatever the file's size. On
// an error `piece` may have seen part of the file.
Status ReadFileInPieces(const std::string& path, uint64_t size,
                        const std::function<void(std::string_view)>& piece);

// Creates `folder` if needed and proves a file can be written in it (a
// temporary one, removed again): the check every process makes at its
// start for the folders it will write (task.output, checkpoint.dir), so a
// folder it cannot use is refused then rather than at its first write.
// With `create` false (check-config, --check-only: checks that must leave
// nothing behind; a hostile probe found the folders of a typo made) a
// folder that does not exist is not made: the nearest of its parents that
// exists must take a new folder (one made and removed there). A symbolic
// link to nothing on the way (the folder, or a parent not there) is
// refused, naming it and its target.
Status CheckWritableFolder(const std::string& folder, bool create = true);
// CheckWritableFolder for task.output, and its kReconstructionFile must not
// be a folder (it was refused only after the whole run).
Status CheckTaskOutput(const std::string& folder, bool create = true);
// A file the process writes later (--dump-params, --timeline, a bench's
// --json): not a folder, its folder writable (CheckWritableFolder), and the
// file itself, when there, open for writing (opened to append, never
// created: the check neither truncates a file nor makes one, through a
// link to nothing either). A start with it
// failed only once it came to write (after the whole run, for
// --dump-params), and --check-only passed it. InvalidArgument "<path>:
// why; allowed: ...", for the caller to put its flag before.
// With `create` false its folder is not made (CheckWritableFolder).
Status CheckOutputFile(const std::string& path, bool create = true);

}  // namespace gridsync
