//go:build !(linux || darwin || freebsd)

package dedup

// diskFree cannot measure on this platform: the disk watch is off.
func diskFree(string) (int64, error) { return 0, errDiskUnsupported }
