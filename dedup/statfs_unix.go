//go:build linux || darwin || freebsd

package dedup

import "syscall"

// diskFree returns the bytes of dir's file system available to an
// unprivileged user (statfs's f_bavail).
func diskFree(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(uint64(st.Bavail) * uint64(st.Bsize)), nil
}
