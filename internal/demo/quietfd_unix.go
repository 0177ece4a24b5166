//go:build unix

package demo

import (
	"os"

	"golang.org/x/sys/unix"
)

// withoutStderr runs f with file descriptor 2 pointed at /dev/null. The
// mock cluster's librdkafka handle warns on stderr, from C, that it has no
// bootstrap.servers (it needs none); this keeps that line out of the
// demo's first screen. Only for start-up, before anything else logs.
func withoutStderr(f func()) {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		f()
		return
	}
	defer null.Close()
	saved, err := unix.Dup(2)
	if err != nil {
		f()
		return
	}
	defer unix.Close(saved)
	if unix.Dup2(int(null.Fd()), 2) != nil {
		f()
		return
	}
	defer func() { _ = unix.Dup2(saved, 2) }()
	f()
}
