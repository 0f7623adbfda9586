//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package dedup

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
)

// locked reports whether another open file description holds an flock on dir:
// the lock Badger takes on its directory. It takes the lock and releases it at
// once; any error other than "would block" counts as not locked, and Badger
// will report it.
func locked(dir string) bool {
	f, err := os.Open(dir)
	if err != nil {
		return false
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if err == nil {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	}
	return errors.Is(err, syscall.EWOULDBLOCK)
}

// diskUsage is the space a file's blocks take, which for a sparse file is
// less than its size.
func diskUsage(info fs.FileInfo) int64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return int64(st.Blocks) * 512
	}
	return info.Size()
}

// fileOwner is the user id that owns a file.
func fileOwner(info fs.FileInfo) (uid int, ok bool) {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid), true
	}
	return 0, false
}
