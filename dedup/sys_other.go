//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package dedup

import "io/fs"

// locked cannot tell on this platform; Badger still refuses a locked
// directory, and Open reports it as a store it cannot open.
func locked(string) bool { return false }

// diskUsage falls back to the file's size.
func diskUsage(info fs.FileInfo) int64 { return info.Size() }

// fileOwner cannot tell on this platform, whose permissions are not Unix's:
// the directory's mode is not checked.
func fileOwner(fs.FileInfo) (uid int, ok bool) { return 0, false }
