package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// clockTicks is Linux's USER_HZ, the unit of utime and stime in
// /proc/<pid>/stat; it is 100 on every mainstream architecture.
const clockTicks = 100

// child is one process under test. Its owner must call stop, which is
// idempotent and waits for the process to exit.
type child struct {
	cmd     *exec.Cmd
	started time.Time
	exited  chan struct{} // closed once the process has been waited for
	err     error         // Wait's result; read only after exited is closed

	stopOnce sync.Once
	stopErr  error
}

// startChild starts path with exactly env; its stderr goes to stderr (nil:
// /dev/null). The child gets SIGKILL if the benchmark dies, and its own
// process group so that a Ctrl-C reaches only the benchmark, which then
// stops it in order.
func startChild(path string, env []string, stderr *os.File) (*child, error) {
	cmd := exec.Command(path)
	cmd.Env = env
	if stderr != nil {
		cmd.Stderr = stderr
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	c := &child{cmd: cmd, exited: make(chan struct{})}
	c.started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", path, err)
	}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

// Exited is closed when the process has ended, whoever ended it.
func (c *child) Exited() <-chan struct{} { return c.exited }

// stop sends SIGTERM, waits up to grace for the process to exit, then kills
// its process group. It returns the process's exit error (nil for status 0),
// or an error saying it had to be killed.
func (c *child) stop(grace time.Duration) error {
	c.stopOnce.Do(func() {
		select {
		case <-c.exited:
			c.stopErr = c.exitErr("exited early")
			return
		default:
		}
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-c.exited:
			c.stopErr = c.exitErr("on SIGTERM")
		case <-t.C:
			_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
			<-c.exited
			c.stopErr = fmt.Errorf("did not exit within %s of SIGTERM: killed", grace)
		}
	})
	return c.stopErr
}

// kill ends the process with SIGKILL and waits for it; stop is a no-op
// after.
func (c *child) kill() {
	c.stopOnce.Do(func() {
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.exited
	})
}

func (c *child) exitErr(when string) error {
	if c.err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", when, c.err)
}

// procStatusKiB reads one "<field>: <n> kB" line of /proc/<pid>/status.
func (c *child) procStatusKiB(field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for line := range bytes.Lines(b) {
		rest, ok := bytes.CutPrefix(line, []byte(field+":"))
		if !ok {
			continue
		}
		f := strings.Fields(string(rest))
		if len(f) == 0 {
			break
		}
		return strconv.ParseInt(f[0], 10, 64)
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, c.cmd.Process.Pid)
}

// hwm is the process's peak resident set size so far, in bytes.
func (c *child) hwm() (int64, error) {
	kib, err := c.procStatusKiB("VmHWM")
	return kib << 10, err
}

// cpu is the CPU time (user + system) the process has used so far.
func (c *child) cpu() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, may hold spaces: count from its ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc/<pid>/stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc/<pid>/stat")
	}
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// memory is one reading of a process's resident memory, in bytes: the
// whole, and its anonymous (heap, stacks, Badger's memtables) and
// file-backed (the binary, Badger's memory-mapped tables) parts.
type memory struct{ rss, anon, file int64 }

// memory reads the process's resident memory now, from one read of
// /proc/<pid>/status.
func (c *child) memory() (memory, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.cmd.Process.Pid))
	if err != nil {
		return memory{}, err
	}
	var m memory
	for line := range bytes.Lines(b) {
		var dst *int64
		switch {
		case bytes.HasPrefix(line, []byte("VmRSS:")):
			dst = &m.rss
		case bytes.HasPrefix(line, []byte("RssAnon:")):
			dst = &m.anon
		case bytes.HasPrefix(line, []byte("RssFile:")):
			dst = &m.file
		default:
			continue
		}
		_, rest, _ := bytes.Cut(line, []byte(":"))
		if f := strings.Fields(string(rest)); len(f) > 0 {
			kib, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return memory{}, err
			}
			*dst = kib << 10
		}
	}
	return m, nil
}

// rssSampler reads a child's resident memory every interval and keeps the
// peak of each part (each its own maximum: the peaks of anon and file need
// not come at the same moment). Its owner must call stop.
type rssSampler struct {
	peak memory // written by the sampling goroutine until done is closed
	quit chan struct{}
	done chan struct{}
}

func sampleRSS(c *child, every time.Duration) *rssSampler {
	s := &rssSampler{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if m, err := c.memory(); err == nil {
				s.peak.rss = max(s.peak.rss, m.rss)
				s.peak.anon = max(s.peak.anon, m.anon)
				s.peak.file = max(s.peak.file, m.file)
			}
			select {
			case <-t.C:
			case <-s.quit:
				return
			}
		}
	}()
	return s
}

// stop ends sampling and returns the peaks seen.
func (s *rssSampler) stop() memory {
	close(s.quit)
	<-s.done
	return s.peak
}
