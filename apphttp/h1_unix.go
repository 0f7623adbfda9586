//go:build unix

package apphttp

import (
	"net"
	"syscall"
)

// connAlive reports whether an idle connection is still open: a peek that
// does not wait finds nothing to read (EAGAIN). The app's end closed, or
// anything it sent unasked, makes the connection unfit for the next request.
func connAlive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, rerr := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		alive = rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK
		return true
	})
	return err == nil && alive
}
